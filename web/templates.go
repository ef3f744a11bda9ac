package web

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

// The pages and static files are embedded, so the binary is the whole
// dashboard and nothing is fetched at run time.
var (
	//go:embed templates/*.html
	templateFS embed.FS
	//go:embed static
	staticFS embed.FS
)

// layout is what every page's frame needs.
type layout struct {
	Title   string
	Nav     string // the active section: overview, models, prices, pools, alerts, ledger
	Session *credential.Session
	// Flash is a fixed message chosen by a ?done= code, never text from
	// the request.
	Flash string
	// Live is the JSON endpoint the page's script polls, "" for none.
	Live string
	// ReplaceURL, when set, is what the script puts in the address bar, so
	// that reloading a POST's result page (a new key's secret) is a plain GET.
	ReplaceURL string
}

// pageNames are the templates under templates/, each rendered inside
// layout.html.
var pageNames = []string{"login.html", "overview.html", "tenant.html", "models.html", "prices.html", "pools.html", "alerts.html", "ledger.html", "error.html"}

func (d *Dashboard) parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"static": d.staticURL,
		"num":    groupDigits,
		"tokens": func(micro int64) string { return groupDecimal(ledger.Tokens(micro)) },
		// bignum and bigtokens render a report's exact sums (account.Total),
		// which may exceed int64: a count, and micro-tokens as tokens.
		"bignum":    func(t account.Total) string { return groupDecimal(t.String()) },
		"bigtokens": func(t account.Total) string { return groupDecimal(t.Tokens()) },
		"rate":      rule.FormatRate,
		"weight":    rule.FormatRate, // model weights share the micro scale
		// price shows a money price (micro-units per million tokens), or of
		// an optional one; deref reads an optional number.
		"price": func(v any) string {
			switch x := v.(type) {
			case int64:
				return estimator.FormatPrice(x)
			case *int64:
				if x != nil {
					return estimator.FormatPrice(*x)
				}
			}
			return ""
		},
		"deref":      func(v *int64) int64 { return *v },
		"optnum":     optNum,
		"time":       fmtTime,
		"opttime":    fmtOptTime,
		"duration":   fmtDuration,
		"pathesc":    pathEscape,
		"modelscope": func(m []string) string { return strings.Join(m, ", ") },
		"field":      newField,
		"prefixed":   func(f *form, prefix string) prefixedForm { return prefixedForm{f, prefix} },
		"limits":     func() []rule.Limit { return rule.AllLimits },
		// wasfields are the limits form's hidden fields holding the values
		// shown, so that only the fields an admin edits are sent.
		"wasfields":   func() []string { return wasFields },
		"windowrows":  windowRows,
		"money":       fmtMoney,
		"windowunits": func() []rule.WindowUnit { return rule.WindowUnits },
		"weekdays": func() []string {
			return []string{"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"}
		},
		// modellimits are a model's shadowable limits; priorities a key's classes.
		"modellimits": func() []rule.Limit { return rule.ModelLimitNames },
		"priorities":  func() []rule.Priority { return priorities },
	}
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/partials.html", "templates/drift.html", "templates/"+name)
		if err != nil {
			return nil, fmt.Errorf("web: parse %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// staticFile is an embedded file with its content hash, which versions its
// URL so browsers may cache it for good.
type staticFile struct {
	body  []byte
	ctype string
	hash  string
}

func loadStatic() (map[string]staticFile, error) {
	files := map[string]staticFile{}
	err := fs.WalkDir(staticFS, "static", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		body, err := staticFS.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		ctype := mime.TypeByExtension(path.Ext(p))
		if ctype == "" {
			ctype = "application/octet-stream"
		}
		files[path.Base(p)] = staticFile{body: body, ctype: ctype, hash: hex.EncodeToString(sum[:6])}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("web: static files: %w", err)
	}
	return files, nil
}

// staticURL is the versioned URL of an embedded file.
func (d *Dashboard) staticURL(name string) (string, error) {
	f, ok := d.static[name]
	if !ok {
		return "", fmt.Errorf("web: no static file %q", name)
	}
	return "/static/" + name + "?v=" + f.hash, nil
}

func (d *Dashboard) serveStatic(c *echo.Context) error {
	f, ok := d.static[c.Param("name")]
	if !ok {
		return c.String(http.StatusNotFound, "not found")
	}
	h := c.Response().Header()
	if c.QueryParam("v") == f.hash {
		h.Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		h.Set("Cache-Control", "no-cache")
	}
	return c.Blob(http.StatusOK, f.ctype, f.body)
}

// groupDigits writes an integer with thousands separators: 1,234,567.
func groupDigits(n int64) string {
	return groupDecimal(strconv.FormatInt(n, 10))
}

// groupDecimal puts thousands separators in the integer part of a decimal
// string such as "-1234567.25".
func groupDecimal(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	whole, frac, hasFrac := strings.Cut(s, ".")
	var b strings.Builder
	for i, r := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if hasFrac {
		b.WriteString("." + frac)
	}
	return sign + b.String()
}

func optNum(n *int64) string {
	if n == nil {
		return ""
	}
	return groupDigits(*n)
}

// fmtTime shows times in UTC, the zone of the ledger and period budgets.
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05")
}

func fmtOptTime(t *time.Time) string {
	if t == nil {
		return ""
	}
	return fmtTime(*t)
}

// fmtDuration writes a duration the way time.ParseDuration reads it back,
// without trailing zero units: 10m rather than 10m0s.
func fmtDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// pathEscape makes a value safe as one segment of a URL path.
func pathEscape(s string) string { return url.PathEscape(s) }

// fieldArgs is what the "field" template needs to draw one input with its
// label, hint and error.
type fieldArgs struct {
	ID, Name, Label, Kind, Hint string
	Required                    bool
	Value, Err                  string
}

// newField describes an input of f; prefix keeps ids unique when a page
// has several forms with the same field names.
func newField(f *form, prefix, name, label, kind, hint string, required bool) fieldArgs {
	return fieldArgs{ID: prefix + "-" + name, Name: name, Label: label, Kind: kind, Hint: hint, Required: required,
		Value: f.Get(name), Err: f.Err(name)}
}

// prefixedForm passes a form and its id prefix to a shared fieldset.
type prefixedForm struct {
	F      *form
	Prefix string
}
