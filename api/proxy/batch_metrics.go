package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokengate/tokengate/budget/batch"
)

// batchMetrics exports a batch.Service's Stats (the domain counts, the
// face exports): batches created by provider and refused, batches ended
// by outcome, lines settled and refused. Every replica exports its own;
// a dashboard sums them.
type batchMetrics struct {
	svc                              *batch.Service
	created, refused, ended, settled *prometheus.Desc
	refunded                         *prometheus.Desc
}

func newBatchMetrics(svc *batch.Service) *batchMetrics {
	return &batchMetrics{svc: svc,
		created:  prometheus.NewDesc("tokengate_batches_created_total", "Batches reserved through this replica, by provider.", []string{"provider"}, nil),
		refused:  prometheus.NewDesc("tokengate_batches_refused_total", "Batch creations refused (allowance, money window, key or tenant).", nil, nil),
		ended:    prometheus.NewDesc("tokengate_batches_ended_total", "Batches ended by this replica, by outcome (completed, failed, expired, cancelled, refused, ended, other).", []string{"outcome"}, nil),
		settled:  prometheus.NewDesc("tokengate_batch_lines_settled_total", "Batch lines settled from the usage their output reported.", nil, nil),
		refunded: prometheus.NewDesc("tokengate_batch_lines_refunded_total", "Batch lines refunded (failed, expired, cancelled, or never reported).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *batchMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.created
	ch <- m.refused
	ch <- m.ended
	ch <- m.settled
	ch <- m.refunded
}

// Collect implements prometheus.Collector.
func (m *batchMetrics) Collect(ch chan<- prometheus.Metric) {
	st := m.svc.Stats()
	for _, p := range []string{batch.OpenAI, batch.Anthropic} {
		ch <- prometheus.MustNewConstMetric(m.created, prometheus.CounterValue, float64(st.Created[p]), p)
	}
	ch <- prometheus.MustNewConstMetric(m.refused, prometheus.CounterValue, float64(st.Refused))
	for outcome, n := range st.Ended {
		ch <- prometheus.MustNewConstMetric(m.ended, prometheus.CounterValue, float64(n), outcome)
	}
	ch <- prometheus.MustNewConstMetric(m.settled, prometheus.CounterValue, float64(st.LinesSettled))
	ch <- prometheus.MustNewConstMetric(m.refunded, prometheus.CounterValue, float64(st.LinesRefunded))
}
