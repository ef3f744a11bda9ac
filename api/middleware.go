package api

import (
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tokengate/tokengate/budget"
)

// requestLogger writes one JSON line per request. It logs the path without
// the query string and no headers, so no credential can reach the logs.
func (s *Server) requestLogger() echo.MiddlewareFunc {
	return middleware.RequestLoggerWithConfig(middleware.RequestLoggerConfig{
		LogStatus:    true,
		LogMethod:    true,
		LogURIPath:   true,
		LogRoutePath: true,
		LogLatency:   true,
		LogRemoteIP:  true,
		LogRequestID: true,
		HandleError:  true,
		LogValuesFunc: func(c *echo.Context, v middleware.RequestLoggerValues) error {
			level := slog.LevelInfo
			if v.Status >= 500 {
				level = slog.LevelError
			}
			s.logger.LogAttrs(c.Request().Context(), level, "request",
				slog.String("request_id", v.RequestID),
				slog.String("method", v.Method),
				slog.String("path", v.URIPath),
				slog.String("route", v.RoutePath),
				slog.Int("status", v.Status),
				slog.Duration("latency", v.Latency),
				slog.String("remote_ip", v.RemoteIP),
			)
			return nil
		},
	})
}

type httpMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokengate_http_requests_total",
			Help: "HTTP requests by route, method and status code.",
		}, []string{"route", "method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tokengate_http_request_duration_seconds",
			Help:    "HTTP request latency by route.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route", "method"}),
	}
	reg.MustRegister(m.requests, m.latency)
	return m
}

func (m *httpMetrics) middleware() echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			start := time.Now()
			err := next(c)
			route := c.Path()
			if route == "" {
				route = "unmatched"
			}
			_, status := echo.ResolveResponseStatus(c.Response(), err)
			if err != nil {
				status = httpError(err).Status
			}
			m.requests.WithLabelValues(route, c.Request().Method, strconv.Itoa(status)).Inc()
			m.latency.WithLabelValues(route, c.Request().Method).Observe(time.Since(start).Seconds())
			return err
		}
	}
}

func (s *Server) metricsHandler() http.Handler {
	return promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{Registry: s.registry})
}

type admissionMetrics struct {
	admissions *prometheus.CounterVec
	latency    prometheus.Histogram
	deltas     *prometheus.HistogramVec
}

func newAdmissionMetrics(reg prometheus.Registerer) *admissionMetrics {
	m := &admissionMetrics{
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokengate_admissions_total",
			Help: "Admission decisions by outcome (admitted, rejected, too_large, replayed, invalid, cancelled, error) and the limit that refused.",
		}, []string{"outcome", "limit"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tokengate_admission_duration_seconds",
			Help:    "Time to decide an admission, estimation and waiting included.",
			Buckets: []float64{.0005, .001, .002, .004, .008, .016, .032, .064, .128, .256, .512, 1, 2, 4, 8, 16, 32},
		}),
		deltas: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tokengate_settle_delta_cost",
			Help:    "Estimate minus actual cost at settle (positive: over-estimated and refunded) or release.",
			Buckets: []float64{-10000, -1000, -100, -10, 0, 10, 100, 1000, 10000, 100000},
		}, []string{"kind"}),
	}
	reg.MustRegister(m.admissions, m.latency, m.deltas)
	return m
}

func (m *admissionMetrics) admission(outcome, limit string, start time.Time) {
	m.admissions.WithLabelValues(outcome, limit).Inc()
	m.latency.Observe(time.Since(start).Seconds())
}

func (m *admissionMetrics) settled(kind string, st *budget.Settlement) {
	if st.Admission.ActualCost != nil {
		m.deltas.WithLabelValues(kind).Observe(float64(st.Admission.Estimate.Cost - *st.Admission.ActualCost))
	}
}
