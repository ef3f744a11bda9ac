package estimator_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/tokengate/tokengate/estimator"
)

// typicalChat is a 1-2 KB chat request: a system prompt, a few turns, and
// the usual sampling fields.
const typicalChat = `{"model":"gpt-4o-2024-08-06","temperature":0.3,"stream":true,"max_completion_tokens":800,
"messages":[
 {"role":"system","content":"You are a support assistant for Acme Cloud. Answer concisely, cite the relevant documentation section when you can, and never reveal internal ticket numbers. If the user asks about billing, remind them that invoices are issued on the first business day of each month."},
 {"role":"user","content":"Hi! Our deployment in eu-west-1 started returning 503 errors about twenty minutes ago. Nothing changed on our side as far as I know. Is there an ongoing incident?"},
 {"role":"assistant","content":"Thanks for reaching out. There is no declared incident for eu-west-1 right now, but I can help you narrow it down. Could you share the service name, the approximate request rate, and whether the errors affect all endpoints or only some of them?"},
 {"role":"user","content":"It's the checkout-api service, about 300 requests per second at peak. Only the /v2/orders endpoint fails; /v2/cart and /health are fine. The load balancer logs show 'upstream connect error or disconnect/reset before headers'. We autoscale between 4 and 12 instances."},
 {"role":"assistant","content":"That message usually means the load balancer could not open a connection to a healthy backend for that route. Since only /v2/orders fails, check whether its target group has healthy instances and whether a recent config push changed its health-check path or port."},
 {"role":"user","content":"The target group shows 0 healthy of 6. The health check path is /v2/orders/health and it times out after 5 seconds. What should I try first, and could this be related to the database migration we scheduled for tonight?"}
]}`

func BenchmarkEstimate(b *testing.B) {
	body := []byte(typicalChat)
	est := estimator.New(nil)
	if r, err := estimator.Parse(body); err != nil {
		b.Fatal(err)
	} else if _, err := est.Estimate(r); err != nil { // load the encoding outside the timer
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r, err := estimator.Parse(body)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := est.Estimate(r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEstimateParallel(b *testing.B) {
	body := []byte(typicalChat)
	est := estimator.New(nil)
	if _, err := estimator.CountText("o200k_base", "warm up"); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r, err := estimator.Parse(body)
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := est.Estimate(r); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkCountText measures each input class of [estimator.TextClasses]:
// prose and the shapes that make long pre-tokenizer pieces. Besides the
// wall-clock MB/s it reports cpu-MB/s, the bytes per second of CPU time the
// whole process spent (the counter and the garbage collector): on a shared
// machine, wall time also counts the time other processes held the cores.
//
//	go test -run '^$' -bench CountText -benchtime 300ms -count 3 ./estimator/
func BenchmarkCountText(b *testing.B) {
	for _, c := range estimator.TextClasses() {
		for _, enc := range []string{"o200k_base", "cl100k_base"} {
			if _, err := estimator.CountText(enc, "warm up"); err != nil {
				b.Fatal(err)
			}
			b.Run(c.Name+"/"+enc, func(b *testing.B) {
				b.SetBytes(int64(len(c.Text)))
				b.ReportAllocs()
				cpu0 := processCPU(b)
				for b.Loop() {
					if _, err := estimator.CountText(enc, c.Text); err != nil {
						b.Fatal(err)
					}
				}
				if cpu := processCPU(b) - cpu0; cpu > 0 {
					b.ReportMetric(float64(len(c.Text))*float64(b.N)/cpu.Seconds()/1e6, "cpu-MB/s")
				}
			})
		}
	}
}

// processCPU returns the CPU time (user and system) the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
