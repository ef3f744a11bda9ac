package replica_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/replica"
)

// unsetTracingEnv clears, besides unsetOTEL's, the variables the SDK and
// the exporters read on their own.
func unsetTracingEnv(t *testing.T) {
	t.Helper()
	unsetOTEL(t)
	for _, k := range []string{"OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
		"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
		"OTEL_SPAN_EVENT_COUNT_LIMIT", "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_LINK_COUNT_LIMIT", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT"} {
		t.Setenv(k, "")
	}
	for _, sig := range []string{"", "TRACES_"} {
		for _, k := range []string{"HEADERS", "COMPRESSION", "INSECURE", "TIMEOUT", "CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"} {
			t.Setenv("OTEL_EXPORTER_OTLP_"+sig+k, "")
		}
	}
}

// TestTracingRefusesBadEnvironment: every OTEL_ variable the SDK or the
// exporters would misread is a startup error naming it, and never a panic
// (a negative queue size made the batch processor's channel panic) nor an
// export to localhost (an endpoint without a scheme parses as a URL
// without a host, and the exporter falls back to its default).
func TestTracingRefusesBadEnvironment(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		name string // the variable the error must name
	}{
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "-5"}, "OTEL_BSP_MAX_QUEUE_SIZE"},
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "lots"}, "OTEL_BSP_MAX_QUEUE_SIZE"},
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "99999999999"}, "OTEL_BSP_MAX_QUEUE_SIZE"},
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": " 5"}, "OTEL_BSP_MAX_QUEUE_SIZE"}, // the SDK does not trim
		{map[string]string{"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4096"}, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"},
		{map[string]string{"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "0"}, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"},
		{map[string]string{"OTEL_BSP_SCHEDULE_DELAY": "-1"}, "OTEL_BSP_SCHEDULE_DELAY"},
		{map[string]string{"OTEL_BSP_SCHEDULE_DELAY": "5s"}, "OTEL_BSP_SCHEDULE_DELAY"},
		{map[string]string{"OTEL_BSP_EXPORT_TIMEOUT": "0"}, "OTEL_BSP_EXPORT_TIMEOUT"},
		{map[string]string{"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "-3"}, "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT"},
		{map[string]string{"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "1k"}, "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"},
		{map[string]string{"OTEL_LINK_ATTRIBUTE_COUNT_LIMIT": "x"}, "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "10.0.0.7:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://collector"}, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4317"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}, "OTEL_EXPORTER_OTLP_TIMEOUT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "-1"}, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "OTEL_EXPORTER_OTLP_COMPRESSION"},
		{map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "yes"}, "OTEL_EXPORTER_OTLP_INSECURE"},
		{map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "api-key"}, "OTEL_EXPORTER_OTLP_HEADERS"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "api key=s3cret"}, "OTEL_EXPORTER_OTLP_TRACES_HEADERS"},
		{map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cret%zz"}, "OTEL_EXPORTER_OTLP_HEADERS"},
		{map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"}, "OTEL_EXPORTER_OTLP_CERTIFICATE"},
		{map[string]string{"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/nonexistent/client.pem"}, "OTEL_EXPORTER_OTLP_CLIENT_KEY"},
		{map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "team"}, "OTEL_RESOURCE_ATTRIBUTES"},
		{map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "team=a%zz"}, "OTEL_RESOURCE_ATTRIBUTES"},
		{map[string]string{"OTEL_SDK_DISABLED": "yes"}, "OTEL_SDK_DISABLED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unsetTracingEnv(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			tr, err := replica.TracingFromEnv(context.Background())
			if tr != nil {
				_ = tr.Shutdown(context.Background())
			}
			if err == nil || !strings.Contains(err.Error(), tc.name) {
				t.Fatalf("with %v: err = %v, want one naming %s", tc.env, err, tc.name)
			}
			if tr != nil {
				t.Fatal("a Tracing came back with the error")
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("the error shows a header's value: %v", err)
			}
		})
	}
}

// TestTracingAcceptsGoodEnvironment: the checks refuse nothing the
// specification allows.
func TestTracingAcceptsGoodEnvironment(t *testing.T) {
	unsetTracingEnv(t)
	for k, v := range map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT":        "HTTPS://collector.example:4318/base/",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces",
		"OTEL_EXPORTER_OTLP_HEADERS":         "api-key=abc%20def, x-team = core",
		"OTEL_EXPORTER_OTLP_COMPRESSION":     "gzip",
		"OTEL_EXPORTER_OTLP_INSECURE":        "TRUE",
		"OTEL_EXPORTER_OTLP_TIMEOUT":         "5000",
		"OTEL_BSP_MAX_QUEUE_SIZE":            "4096",
		"OTEL_BSP_MAX_EXPORT_BATCH_SIZE":     "4096",
		"OTEL_BSP_SCHEDULE_DELAY":            "60000",
		"OTEL_SPAN_EVENT_COUNT_LIMIT":        "0",
		"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT":  "4096",
		"OTEL_RESOURCE_ATTRIBUTES":           "team=core, region=eu%2D1",
		"OTEL_SDK_DISABLED":                  "false",
	} {
		t.Setenv(k, v)
	}
	tr, err := replica.TracingFromEnv(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !tr.On() {
		t.Fatal("tracing is off")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = tr.Shutdown(ctx) // nothing listens: nothing was exported either
}
