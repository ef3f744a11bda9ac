package web

import (
	"errors"
	"net/http"
	"os"
	"slices"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/rule"
)

// requireText refuses a dashboard request whose path parameters, query
// values or form fields cannot be stored as text (a NUL, or not UTF-8):
// Postgres would refuse them, and the admin would see a server error for
// a typing (or pasting) mistake. The answer is a 400 naming the field: the
// login form again with the message for /login, the error page elsewhere.
// Nothing is changed. It also answers a form body that could not be read:
// 413 past the body limit, 408 past the body read deadline.
func (d *Dashboard) requireText(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		field, why, err := requestTextProblem(c)
		switch {
		case err != nil:
			return err
		case why == "":
			return next(c)
		}
		message := "The field “" + field + "” " + why + ". Nothing was changed."
		if c.Path() == "/login" && c.Request().Method == http.MethodPost {
			v := &loginView{layout: layout{Title: "Log in"}, Next: "/", Message: message}
			return d.render(c, http.StatusBadRequest, "login.html", v)
		}
		return pageErr(http.StatusBadRequest, message)
	}
}

// requestTextProblem is the first text of the request that cannot be
// stored: its field and why.
func requestTextProblem(c *echo.Context) (string, string, error) {
	for _, p := range c.PathValues() {
		if why := rule.TextProblem(p.Value); why != "" {
			return p.Name, why, nil
		}
	}
	r := c.Request()
	if err := r.ParseForm(); err != nil {
		var mb *http.MaxBytesError
		switch {
		case echo.StatusCode(err) == http.StatusRequestEntityTooLarge, errors.As(err, &mb):
			return "", "", pageErr(http.StatusRequestEntityTooLarge, "The form is larger than the server accepts. Nothing was changed.")
		case errors.Is(err, os.ErrDeadlineExceeded):
			c.Response().Header().Set("Connection", "close")
			return "", "", pageErr(http.StatusRequestTimeout, "The form did not arrive in time. Nothing was changed.")
		}
		// A malformed query or field is dropped, as the handlers always
		// read forms; what parsed is checked below.
	}
	// r.Form holds the query's values and the body's fields.
	names := make([]string, 0, len(r.Form))
	for k := range r.Form {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if why := rule.TextProblem(k); why != "" {
			return "name", "a field name " + why, nil
		}
		for _, v := range r.Form[k] {
			if why := rule.TextProblem(v); why != "" {
				return k, why, nil
			}
		}
	}
	return "", "", nil
}
