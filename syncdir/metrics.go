package syncdir

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the hapair_sync_* series.
type Metrics struct {
	queueDepth    prometheus.Gauge
	lag           prometheus.Gauge
	highestEpoch  prometheus.Gauge
	sending       prometheus.Gauge
	filesSent     prometheus.Counter
	bytesSent     prometheus.Counter
	filesReceived prometheus.Counter
	bytesReceived prometheus.Counter
	quarantined   prometheus.Counter
	inQuarantine  *prometheus.GaugeVec
	reconciles    prometheus.Counter
	staleTemps    prometheus.Counter
	staleDirs     prometheus.Counter
	errors        *prometheus.CounterVec
	rejected      *prometheus.CounterVec
}

// NewMetrics registers the sync metrics on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: "hapair_sync_" + name, Help: help})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "hapair_sync_" + name, Help: help})
	}
	m := &Metrics{
		queueDepth:    g("queue_depth", "Changed paths waiting to be sent or in flight."),
		lag:           g("lag_seconds", "Age of the oldest local change not yet confirmed by the peer."),
		highestEpoch:  g("highest_epoch", "Highest fencing epoch this node has recorded."),
		sending:       g("sending", "1 while the sender runs (node ACTIVE)."),
		filesSent:     c("sent_files_total", "Files, directories, links and deletes confirmed by the peer."),
		bytesSent:     c("sent_bytes_total", "File content bytes confirmed by the peer."),
		filesReceived: c("received_files_total", "Operations applied by the receiver."),
		bytesReceived: c("received_bytes_total", "File content bytes written by the receiver."),
		quarantined:   c("quarantined_files_total", "Local files moved to the quarantine before being overwritten or deleted."),
		reconciles:    c("reconciles_total", "Full compares with the peer completed."),
		staleTemps:    c("stale_temp_files_removed_total", "Temp files of an earlier run (a crashed or killed receiver) removed at start."),
		staleDirs:     c("stale_dirs_removed_total", "Empty directories an earlier run made for a change that never landed (a crashed or killed receiver, a change refused after them), removed at start."),
		inQuarantine: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hapair_sync_quarantine_files", Help: "Files present in the quarantine folder, by root (recounted every few seconds).",
		}, []string{"root"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hapair_sync_errors_total", Help: "Sender and receiver errors by kind.",
		}, []string{"kind"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hapair_sync_rejected_total", Help: "Requests refused by the receiver, by reason.",
		}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.queueDepth, m.lag, m.highestEpoch, m.sending, m.filesSent, m.bytesSent,
			m.filesReceived, m.bytesReceived, m.quarantined, m.inQuarantine, m.reconciles, m.staleTemps, m.staleDirs, m.errors, m.rejected)
	}
	return m
}

// stats mirrors the counters for Status(), which must not scrape Prometheus.
type stats struct {
	filesSent, bytesSent, filesReceived, bytesReceived atomic.Uint64
	quarantined, reconciles                            atomic.Uint64

	mu       sync.Mutex
	errors   map[string]uint64
	rejected map[string]uint64
}

func (s *Syncer) countError(kind string) {
	s.m.errors.WithLabelValues(kind).Inc()
	s.st.mu.Lock()
	s.st.errors[kind]++
	s.st.mu.Unlock()
}

func (s *Syncer) countRejected(reason Reason) {
	s.m.rejected.WithLabelValues(string(reason)).Inc()
	s.st.mu.Lock()
	s.st.rejected[string(reason)]++
	s.st.mu.Unlock()
}

func (s *Syncer) countSent(bytes int64) {
	s.m.filesSent.Inc()
	s.m.bytesSent.Add(float64(bytes))
	s.st.filesSent.Add(1)
	s.st.bytesSent.Add(uint64(bytes))
}

func (s *Syncer) countReceived(bytes int64) {
	s.m.filesReceived.Inc()
	s.m.bytesReceived.Add(float64(bytes))
	s.st.filesReceived.Add(1)
	s.st.bytesReceived.Add(uint64(bytes))
}

func copyCounts(mu *sync.Mutex, m map[string]uint64) map[string]uint64 {
	mu.Lock()
	defer mu.Unlock()
	out := make(map[string]uint64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
