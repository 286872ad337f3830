package lb

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the balancer's Prometheus metrics (hapair_lb_*).
type Metrics struct {
	requests       *prometheus.CounterVec
	responses      *prometheus.CounterVec
	errors         *prometheus.CounterVec
	retries        *prometheus.CounterVec
	noServer       *prometheus.CounterVec
	checks         *prometheus.CounterVec
	stateChanges   *prometheus.CounterVec
	dualActive     *prometheus.CounterVec
	holdWait       *prometheus.HistogramVec
	holdTimeouts   *prometheus.CounterVec
	holdCancelled  *prometheus.CounterVec
	tcpSessions    *prometheus.CounterVec
	tcpKilled      *prometheus.CounterVec
	tcpRefused     *prometheus.CounterVec
	reloads        *prometheus.CounterVec
	etcdUp         prometheus.Gauge
	fastPathEvents prometheus.Counter

	state *stateCollector
}

// NewMetrics registers the balancer metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	bs := []string{"backend", "server"}
	b := []string{"backend"}
	m := &Metrics{
		requests: counterVec("requests_total", "Requests (HTTP) or sessions (TCP) sent to a server.", bs),
		responses: counterVec("responses_total", "HTTP responses from a server by status class.",
			append(bs, "code")),
		errors:       counterVec("server_errors_total", "Failed requests or connects to a server.", bs),
		retries:      counterVec("retries_total", "Requests retried on another server.", b),
		noServer:     counterVec("no_server_total", "Requests or connections refused because no server was eligible.", b),
		checks:       counterVec("checks_total", "Active health checks by result.", append(bs, "result")),
		stateChanges: counterVec("server_state_changes_total", "Check state transitions (up/down).", bs),
		dualActive: counterVec("dual_active_total",
			"Times two servers claimed the exclusive role (ACTIVE or primary) at once.", b),
		holdWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "hapair", Subsystem: "lb", Name: "hold_wait_seconds",
			Help:    "Time requests waited for an eligible server (switchover hold).",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, b),
		holdTimeouts: counterVec("hold_timeouts_total", "Requests that waited hold-timeout and got 503.", b),
		holdCancelled: counterVec("hold_cancelled_total",
			"Held requests given up because their client went away before a server was eligible.", b),
		tcpSessions: counterVec("tcp_sessions_total", "TCP sessions forwarded.", bs),
		tcpKilled:   counterVec("tcp_sessions_shutdown_total", "TCP sessions closed because their server was marked down.", b),
		tcpRefused:  counterVec("tcp_refused_total", "TCP connections refused because no server qualified.", b),
		reloads:     counterVec("reloads_total", "Configuration reloads by result.", []string{"result"}),
		etcdUp: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "hapair", Subsystem: "lb",
			Name: "etcd_watch_up", Help: "1 while the etcd active key is being followed."}),
		fastPathEvents: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "hapair", Subsystem: "lb",
			Name: "etcd_active_key_events_total", Help: "Active key observations from etcd naming a node."}),
		state: &stateCollector{},
	}
	reg.MustRegister(m.requests, m.responses, m.errors, m.retries, m.noServer, m.checks, m.stateChanges,
		m.dualActive, m.holdWait, m.holdTimeouts, m.holdCancelled, m.tcpSessions, m.tcpKilled, m.tcpRefused, m.reloads,
		m.etcdUp, m.fastPathEvents, m.state)
	return m
}

func counterVec(name, help string, labels []string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "hapair", Subsystem: "lb", Name: name, Help: help}, labels)
}

var (
	descUp = prometheus.NewDesc("hapair_lb_server_up",
		"1 when the server's checks pass.", []string{"backend", "server"}, nil)
	descEligible = prometheus.NewDesc("hapair_lb_server_eligible",
		"1 when the server receives new traffic.", []string{"backend", "server"}, nil)
	descActive = prometheus.NewDesc("hapair_lb_server_active_requests",
		"In-flight requests or TCP sessions on the server.", []string{"backend", "server"}, nil)
	descEpoch = prometheus.NewDesc("hapair_lb_server_epoch",
		"X-Hapair-Epoch of the server's last good check.", []string{"backend", "server"}, nil)
	descAdmin = prometheus.NewDesc("hapair_lb_server_admin_state",
		"Runtime admin state of the server (1 for the current one).", []string{"backend", "server", "state"}, nil)
	descWaiting = prometheus.NewDesc("hapair_lb_hold_waiting_requests",
		"Requests currently waiting for an eligible server.", []string{"backend"}, nil)
	descEligibleCount = prometheus.NewDesc("hapair_lb_backend_eligible_servers",
		"Servers currently receiving new traffic.", []string{"backend"}, nil)
	descLoopServed = prometheus.NewDesc("hapair_lb_event_loop_requests_total",
		"Plain HTTP/1.1 requests served wholly by the pollers' event loops (event-loop).", nil, nil)
	descLoopHanded = prometheus.NewDesc("hapair_lb_event_loop_handoffs_total",
		"Requests the event loops handed to the goroutine path (uncommon requests, waits, errors).", nil, nil)
)

// stateCollector reads server state at scrape time from the live groups.
type stateCollector struct {
	groups func() []*Group
	loop   func() (served, handed uint64) // nil without event loops
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descEligible, descActive, descEpoch, descAdmin,
		descWaiting, descEligibleCount, descLoopServed, descLoopHanded} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	if c.loop != nil {
		served, handed := c.loop()
		ch <- prometheus.MustNewConstMetric(descLoopServed, prometheus.CounterValue, float64(served))
		ch <- prometheus.MustNewConstMetric(descLoopHanded, prometheus.CounterValue, float64(handed))
	}
	if c.groups == nil {
		return
	}
	for _, g := range c.groups() {
		list := *g.eligible.Load()
		ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(g.waiting.Load()), g.cfg.Name)
		ch <- prometheus.MustNewConstMetric(descEligibleCount, prometheus.GaugeValue, float64(len(list)), g.cfg.Name)
		for _, s := range g.servers {
			l := []string{g.cfg.Name, s.name}
			ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, float64(b2i(s.up.Load())), l...)
			ch <- prometheus.MustNewConstMetric(descEligible, prometheus.GaugeValue, float64(b2i(contains(list, s))), l...)
			ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(s.active.Load()), l...)
			ch <- prometheus.MustNewConstMetric(descEpoch, prometheus.GaugeValue, float64(s.epoch.Load()), l...)
			for _, a := range []AdminState{AdminReady, AdminDrain, AdminMaint} {
				ch <- prometheus.MustNewConstMetric(descAdmin, prometheus.GaugeValue,
					float64(b2i(s.Admin() == a)), g.cfg.Name, s.name, a.String())
			}
		}
	}
}
