package admission_test

import (
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/otlptest"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// BenchmarkAdmitSettleTracing is one caller's admission and settle through
// the admission layer and the pipeline, on a real Postgres, with tracing
// off (no OTEL_ variables), on with a sampler at 0 (spans made, none
// recorded), and on with every decision sampled and exported by OTLP/gRPC
// to a receiver in the process: what tracing costs a decision, in time and
// allocations.
func BenchmarkAdmitSettleTracing(b *testing.B) {
	for _, mode := range []string{"off", "unsampled", "sampled"} {
		b.Run(mode, func(b *testing.B) {
			for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
				b.Setenv(k, "")
			}
			if mode != "off" {
				otlptest.Start(b).Setenv(b, "grpc")
				b.Setenv("OTEL_TRACES_SAMPLER", map[string]string{"unsampled": "always_off", "sampled": "always_on"}[mode])
			}
			tr, err := replica.TracingFromEnv(ctx)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = tr.Shutdown(ctx) })
			if tr.On() != (mode != "off") {
				b.Fatalf("tracing on: %v", tr.On())
			}
			pool := pgtest.New(b, nil)
			store := account.NewStore(pool)
			if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme",
				Limits: rule.Limits{TokensCapacity: 1_000_000_000_000, TokensRateMicro: rule.Micro}}); err != nil {
				b.Fatal(err)
			}
			a := admission.New(admission.Config{Store: store, Pool: pool, TracerProvider: tr.TracerProvider()})
			req := request("acme", 100, 0)
			req.Face = admission.FaceAPI
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				r, _, err := a.Reserve(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				if _, _, err := a.Settle(ctx, admission.FaceAPI, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID,
					InputTokens: 40, OutputTokens: 20}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
