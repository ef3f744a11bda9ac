package api

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
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
	traced   bool // the latency carries exemplars
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
			observe(c.Request().Context(), m.traced, m.latency.WithLabelValues(route, c.Request().Method), time.Since(start).Seconds())
			return err
		}
	}
}

// metricsHandler serves the registry in the text format, or in OpenMetrics
// to a scraper that asks for it (Prometheus does), which is the format that
// carries the latency histograms' exemplars (the trace of a sampled
// request in a bucket).
func (s *Server) metricsHandler() http.Handler {
	return promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{Registry: s.registry, EnableOpenMetrics: true})
}

// traceContext puts the caller's W3C trace context (traceparent,
// tracestate) in the request's context: the decision spans the admission
// layer starts are then children of the caller's span. Used only while
// tracing is on.
func (s *Server) traceContext(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		r := c.Request()
		c.SetRequest(r.WithContext(s.tracing.Extract(r.Context(), propagation.HeaderCarrier(r.Header))))
		return next(c)
	}
}

// observe observes v, with the sampled trace of ctx as its exemplar when
// traced is true (Prometheus keeps one per bucket, served in OpenMetrics).
func observe(ctx context.Context, traced bool, o prometheus.Observer, v float64) {
	if traced {
		if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
			if eo, ok := o.(prometheus.ExemplarObserver); ok {
				eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()})
				return
			}
		}
	}
	o.Observe(v)
}
