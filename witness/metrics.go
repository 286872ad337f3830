package witness

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the hapair_witness_* series. etcd's own metrics live on
// prometheus' default registry (the embedded server registers them there);
// Handler serves both together.
type Metrics struct {
	Ready                  prometheus.Gauge
	IsLeader               prometheus.Gauge
	LeaderTransfers        prometheus.Counter
	LeaderTransferFailures prometheus.Counter
	Members                prometheus.Gauge
	MembersHealthy         prometheus.Gauge
	DataMembersHealthy     prometheus.Gauge
	LeasesReaped           prometheus.Counter

	gatherer prometheus.Gatherer
}

// NewMetrics registers the witness metrics on reg. When reg is also a
// Gatherer (a *prometheus.Registry), the metrics listener serves it.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: prometheus.BuildFQName("hapair", "witness", name), Help: help})
		reg.MustRegister(g)
		return g
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: prometheus.BuildFQName("hapair", "witness", name), Help: help})
		reg.MustRegister(c)
		return c
	}
	m := &Metrics{
		Ready:                  gauge("ready", "1 once this member has joined the quorum and serves requests."),
		IsLeader:               gauge("is_leader", "1 while this member is the raft leader."),
		LeaderTransfers:        counter("leader_transfers_total", "Raft leadership hand-offs from this witness to a data member that succeeded."),
		LeaderTransferFailures: counter("leader_transfer_failures_total", "Raft leadership hand-offs from this witness that failed or timed out."),
		Members:                gauge("members", "Voting members in the cluster, as this member knows it."),
		MembersHealthy:         gauge("members_healthy", "Voting members that answered the last linearizable health probe."),
		DataMembersHealthy:     gauge("data_members_healthy", "Voting data (non-witness) members that answered the last health probe."),
		LeasesReaped:           counter("leases_reaped_total", "Expired leases this member revoked as raft leader before etcd's own 500 ms check did (lease-reap-interval)."),
	}
	if g, ok := reg.(prometheus.Gatherer); ok {
		m.gatherer = g
	}
	return m
}

// metricsHandler serves etcd's metrics (default registry) and ours in one
// exposition. The families do not overlap: ours are only hapair_witness_*.
func (m *Metrics) metricsHandler() http.Handler {
	gs := prometheus.Gatherers{prometheus.DefaultGatherer}
	if m.gatherer != nil {
		gs = append(gs, m.gatherer)
	}
	return promhttp.HandlerFor(gs, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}
