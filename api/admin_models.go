package api

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

type modelJSON struct {
	Name                string       `json:"name"`
	Encoding            string       `json:"encoding"`
	InputWeight         json.Number  `json:"input_weight"`
	OutputWeight        json.Number  `json:"output_weight"`
	DefaultOutputTokens int64        `json:"default_output_tokens"`
	ContextWindow       int64        `json:"context_window"`
	PartTokens          int64        `json:"part_tokens"`
	CachedInputWeight   *json.Number `json:"cached_input_weight"`   // null: as an input token
	CacheWriteWeight    *json.Number `json:"cache_write_weight"`    // null: as an input token
	CacheWrite1hWeight  *json.Number `json:"cache_write_1h_weight"` // null: as cache_write_weight
	OnStoreUnavailable  string       `json:"on_store_unavailable,omitempty"`
	Source              string       `json:"source"` // "seed" or "stored"
	UpdatedAt           *time.Time   `json:"updated_at,omitempty"`
	UpdatedBy           string       `json:"updated_by,omitempty"`
}

func (s *Server) adminModelList(c *echo.Context) error {
	stored, err := s.admin.ModelList(c.Request().Context())
	if err != nil {
		return err
	}
	byName := map[string]estimator.StoredModel{}
	for _, m := range stored {
		byName[m.Name] = m
	}
	table, err := s.admin.ModelTable(c.Request().Context())
	if err != nil {
		return err
	}
	var out []modelJSON
	for _, m := range table.Models() {
		j := modelOf(m)
		j.Source = "seed"
		if st, ok := byName[m.Name]; ok {
			j.Source, j.UpdatedAt, j.UpdatedBy = "stored", &st.UpdatedAt, st.UpdatedBy
		}
		out = append(out, j)
	}
	return c.JSON(http.StatusOK, map[string]any{"models": out})
}

type modelPatch struct {
	Name                *string         `json:"name"`
	Encoding            *string         `json:"encoding"`
	InputWeight         json.RawMessage `json:"input_weight"`
	OutputWeight        json.RawMessage `json:"output_weight"`
	DefaultOutputTokens *int64          `json:"default_output_tokens"`
	ContextWindow       *int64          `json:"context_window"`
	PartTokens          *int64          `json:"part_tokens"`
	CachedInputWeight   json.RawMessage `json:"cached_input_weight"`   // null clears it
	CacheWriteWeight    json.RawMessage `json:"cache_write_weight"`    // null clears it
	CacheWrite1hWeight  json.RawMessage `json:"cache_write_1h_weight"` // null clears it
	OnStoreUnavailable  *string         `json:"on_store_unavailable"`
}

func (p *modelPatch) apply(m *estimator.Model) error {
	if p.Encoding != nil {
		m.Encoding = *p.Encoding
	}
	if err := rateField(p.InputWeight, "input_weight", &m.InputWeightMicro); err != nil {
		return err
	}
	if err := rateField(p.OutputWeight, "output_weight", &m.OutputWeightMicro); err != nil {
		return err
	}
	for _, w := range []struct {
		raw   json.RawMessage
		field string
		dst   *int64
	}{
		{p.CachedInputWeight, "cached_input_weight", &m.CachedInputWeightMicro},
		{p.CacheWriteWeight, "cache_write_weight", &m.CacheWriteWeightMicro},
		{p.CacheWrite1hWeight, "cache_write_1h_weight", &m.CacheWrite1hWeightMicro},
	} {
		if isNull(w.raw) {
			*w.dst = 0
		} else if err := rateField(w.raw, w.field, w.dst); err != nil {
			return err
		}
	}
	if p.DefaultOutputTokens != nil {
		m.DefaultOutputTokens = *p.DefaultOutputTokens
	}
	if p.ContextWindow != nil {
		m.ContextWindow = *p.ContextWindow
	}
	if p.PartTokens != nil {
		m.PartTokens = *p.PartTokens
	}
	if p.OnStoreUnavailable != nil {
		m.OnStoreUnavailable = *p.OnStoreUnavailable
	}
	return nil
}

// saveModel stores m, as a new model (create: the database refuses a name
// taken, even by another replica a moment ago) or over the stored one, and
// reloads this replica's table at once.
func (s *Server) saveModel(c *echo.Context, m estimator.Model, create bool) error {
	ctx := c.Request().Context()
	save, status := s.admin.ModelSave, http.StatusOK
	if create {
		save, status = s.admin.ModelCreate, http.StatusCreated
	}
	if err := save(ctx, m, actorOf(c)); err != nil {
		return err
	}
	j := modelOf(m)
	j.Source, j.UpdatedBy = "stored", actorOf(c)
	return c.JSON(status, j)
}

func modelOf(m estimator.Model) modelJSON {
	j := modelJSON{Name: m.Name, Encoding: m.Encoding, InputWeight: json.Number(rule.FormatRate(m.InputWeightMicro)),
		OutputWeight: json.Number(rule.FormatRate(m.OutputWeightMicro)), DefaultOutputTokens: m.DefaultOutputTokens,
		ContextWindow: m.ContextWindow, PartTokens: m.PartTokens, OnStoreUnavailable: m.OnStoreUnavailable}
	optional := func(micro int64) *json.Number {
		if micro <= 0 {
			return nil
		}
		w := json.Number(rule.FormatRate(micro))
		return &w
	}
	j.CachedInputWeight = optional(m.CachedInputWeightMicro)
	j.CacheWriteWeight = optional(m.CacheWriteWeightMicro)
	j.CacheWrite1hWeight = optional(m.CacheWrite1hWeightMicro)
	return j
}

func (s *Server) adminModelCreate(c *echo.Context) error {
	var in modelPatch
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	if in.Name == nil {
		return invalid("name", "required")
	}
	if _, exists := s.admin.Model(*in.Name); exists {
		return &Error{Status: http.StatusConflict, Type: "conflict", Field: "name", Message: "a model with this name exists; PATCH /v1/admin/models/{name} changes it"}
	}
	m := estimator.Model{Name: *in.Name, Encoding: estimator.EncodingO200K, InputWeightMicro: estimator.WeightOne,
		OutputWeightMicro: estimator.WeightOne, DefaultOutputTokens: 16384, ContextWindow: 128000, PartTokens: 765}
	if err := in.apply(&m); err != nil {
		return err
	}
	return s.saveModel(c, m, true)
}

func (s *Server) adminModelUpdate(c *echo.Context) error {
	var in modelPatch
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	m, exists := s.admin.Model(c.Param("name"))
	if !exists {
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "no such model; POST /v1/admin/models creates one"}
	}
	if in.Name != nil && *in.Name != m.Name {
		return invalid("name", "a model cannot be renamed")
	}
	if err := in.apply(&m); err != nil {
		return err
	}
	return s.saveModel(c, m, false)
}
