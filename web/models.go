package web

import (
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/estimator"
)

// modelRow is a model of the effective table and where it comes from:
// seeded (built in), overridden (a stored model replaces the seeded one)
// or added (stored, not seeded).
type modelRow struct {
	estimator.Model
	Origin    string
	UpdatedBy string
	UpdatedAt time.Time
}

type modelsView struct {
	layout
	Models    []modelRow
	Form      *form
	Editing   bool
	Encodings []string
	Drift     driftView
}

func (d *Dashboard) models(c *echo.Context) error {
	f := newForm()
	f.Set("encoding", estimator.EncodingO200K)
	f.Set("input_weight", "1")
	f.Set("output_weight", "1")
	editing := false
	if name := c.QueryParam("edit"); name != "" {
		for _, m := range d.admin.Models() {
			if m.Name == name {
				f, editing = modelForm(m), true
			}
		}
	}
	return d.renderModels(c, http.StatusOK, f, editing)
}

func (d *Dashboard) renderModels(c *echo.Context, status int, f *form, editing bool) error {
	stored, err := d.admin.ModelList(c.Request().Context())
	if err != nil {
		return err
	}
	byName := map[string]estimator.StoredModel{}
	for _, m := range stored {
		byName[m.Name] = m
	}
	seeded := map[string]bool{}
	for _, m := range estimator.DefaultTable().Models() {
		seeded[m.Name] = true
	}
	drift, err := d.drift(c.Request().Context(), "")
	if err != nil {
		return err
	}
	v := &modelsView{
		Drift:     drift,
		layout:    layout{Title: "Models", Nav: "models", Session: sessionOf(c), Flash: flash(c)},
		Form:      f,
		Editing:   editing,
		Encodings: []string{estimator.EncodingO200K, estimator.EncodingCL100K},
	}
	for _, m := range d.admin.Models() {
		r := modelRow{Model: m, Origin: "seeded"}
		if s, ok := byName[m.Name]; ok {
			r.UpdatedBy, r.UpdatedAt = s.UpdatedBy, s.UpdatedAt
			r.Origin = "added"
			if seeded[m.Name] {
				r.Origin = "overridden"
			}
		}
		v.Models = append(v.Models, r)
	}
	return d.render(c, status, "models.html", v)
}

// modelSave stores a model (new, or overriding one of the table) and
// reloads this replica's table at once.
func (d *Dashboard) modelSave(c *echo.Context) error {
	ctx := c.Request().Context()
	f := formFrom(postForm(c), modelFields...)
	m := f.model()
	if f.OK() {
		err := d.admin.ModelSave(ctx, m, actor(c))
		var inv *estimator.InvalidError
		switch {
		case errors.As(err, &inv):
			f.Fail(inv.Field, inv.Reason)
		case err != nil:
			return err
		}
	}
	if !f.OK() {
		return d.renderModels(c, http.StatusUnprocessableEntity, f, true)
	}
	return seeOther(c, "/models?done=saved")
}
