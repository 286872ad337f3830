package roled

import (
	"github.com/prometheus/client_golang/prometheus"
)

const ns, sub = "hapair", "roled"

// Metrics are roled's event metrics. State that lives in the Daemon (role,
// epoch, lease age, alarms, PHP-FPM pool) is read at scrape time by a
// collector the Daemon registers on the same registry.
type Metrics struct {
	reg *prometheus.Registry

	transitions          *prometheus.CounterVec
	failoverDuration     *prometheus.HistogramVec
	failoverWALLost      *prometheus.HistogramVec
	failoverRedundancy   *prometheus.HistogramVec
	failoverNotRedundant prometheus.Counter
	patroniDuration      prometheus.Histogram
	patroniErrors        *prometheus.CounterVec
	postgresErrors       prometheus.Counter
	keepaliveFailures    prometheus.Counter
	quorumCheckFailures  prometheus.Counter
	etcdLeaderMoves      prometheus.Counter
	leaseGrants          prometheus.Counter
	etcdReadErrors       prometheus.Counter
	hookRuns             *prometheus.CounterVec
	takeovers            prometheus.Counter
	takeoverAutoAcks     prometheus.Counter
	agentRequests        *prometheus.CounterVec
	fpmErrors            prometheus.Counter
	canaryLatency        prometheus.Histogram
	canaryFailures       prometheus.Counter
	fenceErrors          *prometheus.CounterVec
	fenceSetSeconds      prometheus.Gauge
	patroniTTL           *prometheus.GaugeVec
}

func name(n string) string { return prometheus.BuildFQName(ns, sub, n) }

// NewMetrics creates roled's metrics on reg (a custom registry, never the
// global one); reg also serves /metrics.
func NewMetrics(reg *prometheus.Registry) *Metrics {
	m := &Metrics{
		reg: reg,
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("transitions_total"),
			Help: "Role transitions, by new role and reason."}, []string{"to", "reason"}),
		patroniDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: name("patroni_check_duration_seconds"),
			Help:    "Latency of the local Patroni check (GET /primary).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}),
		patroniErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("patroni_check_errors_total"),
			Help: "Failed Patroni checks, by kind (unreachable, garbage)."}, []string{"kind"}),
		postgresErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: name("postgres_check_errors_total"),
			Help: "Failed PostgreSQL checks (connect or query)."}),
		keepaliveFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: name("lease_keepalive_failures_total"),
			Help: "Lease keep-alives that failed or timed out."}),
		quorumCheckFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: name("quorum_check_failures_total"),
			Help: "Linearizable quorum probes that failed or timed out (quorum-check-interval)."}),
		etcdLeaderMoves: prometheus.NewCounter(prometheus.CounterOpts{Name: name("etcd_leader_moves_total"),
			Help: "etcd raft leadership moved to this node's member while it was a ready standby (etcd-leader: standby)."}),
		leaseGrants: prometheus.NewCounter(prometheus.CounterOpts{Name: name("lease_grants_total"),
			Help: "Leases granted (1 at start, +1 for every lost lease)."}),
		etcdReadErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: name("etcd_read_errors_total"),
			Help: "Failed linearizable reads of the leader, active and alarm keys."}),
		hookRuns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("hook_runs_total"),
			Help: "Hook runs, by hook (on_active, on_passive) and result (ok, failed)."}, []string{"hook", "result"}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{Name: name("takeover_detected_total"),
			Help: "Patroni leader-key takeovers (value changed without delete and re-create) detected."}),
		takeoverAutoAcks: prometheus.NewCounter(prometheus.CounterOpts{Name: name("takeover_auto_acked_total"),
			Help: "Takeover alarms this node acknowledged itself, having proved no other node was ACTIVE since it last was."}),
		agentRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("agent_requests_total"),
			Help: "HAProxy agent-check connections answered, by agent (app, replica)."}, []string{"agent"}),
		fpmErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: name("fpm_scrape_errors_total"),
			Help: "Failed reads of the PHP-FPM status page."}),
	}
	m.canaryLatency = prometheus.NewHistogram(prometheus.HistogramOpts{Name: name("commit_canary_duration_seconds"),
		Help:    "Latency of the commit canary's completed commits on the local primary.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}})
	m.canaryFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: name("commit_canary_failures_total"),
		Help: "Canary commits that hung past postgres.canary.hang-after or failed."})
	m.fenceErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("db_fence_errors_total"),
		Help: "Failed attempts to set or lift the database fence, by op (set, lift)."}, []string{"op"})
	m.fenceSetSeconds = prometheus.NewGauge(prometheus.GaugeOpts{Name: name("db_fence_set_after_seconds"),
		Help: "Seconds from leaving ACTIVE to the database fence in place, last time it was set."})
	m.patroniTTL = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name("patroni_ttl_seconds"),
		Help: "Patroni's ttl: as its configuration said at roled's start (source=config), and as the local Patroni release runs it (source=release: 3.2.0 and later raise a ttl below 20 s to 20 s; 0 until the release is seen)."},
		[]string{"source"})
	reg.MustRegister(m.canaryLatency, m.canaryFailures, m.fenceErrors, m.fenceSetSeconds, m.patroniTTL)
	for _, op := range []string{"set", "lift"} {
		m.fenceErrors.WithLabelValues(op)
	}
	// Named for the pair, not roled: the new ACTIVE's roled observes the
	// whole role change (old ACTIVE gone → this node serving).
	m.failoverDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "hapair_failover_duration_seconds",
		Help:    "Time without an ACTIVE node in a role change, by kind (switchover, demotion, failover), as recorded in the history.",
		Buckets: []float64{.05, .1, .25, .5, 1, 2, 3, 5, 8, 13, 20, 30, 60}}, []string{"kind"})
	// One observation per role change whose WAL loss is known (history
	// wal_lost_bytes): buckets from nothing through one WAL page (8 KiB) and
	// one segment (16 MiB) to 1 GiB.
	m.failoverWALLost = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "hapair_failover_wal_lost_bytes",
		Help:    "WAL the old ACTIVE had beyond the new timeline's switch point (a lower bound), per role change, by kind, as recorded in the history.",
		Buckets: []float64{0, 8 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30}}, []string{"kind"})
	m.failoverRedundancy = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "hapair_failover_redundancy_seconds",
		Help:    "Time from serving after a role change until the standby reported ready, by kind, as recorded in the history.",
		Buckets: []float64{1, 2, 5, 10, 15, 20, 30, 45, 60, 120, 300, 600, 1800}}, []string{"kind"})
	m.failoverNotRedundant = prometheus.NewCounter(prometheus.CounterOpts{Name: "hapair_failover_not_redundant_total",
		Help: "Role changes after which no standby was ready within history.redundancy-timeout."})
	reg.MustRegister(m.failoverDuration, m.failoverWALLost, m.failoverRedundancy, m.failoverNotRedundant)
	for _, k := range []HistoryKind{KindSwitchover, KindDemotion, KindFailover} {
		m.failoverDuration.WithLabelValues(string(k))
		m.failoverWALLost.WithLabelValues(string(k))
		m.failoverRedundancy.WithLabelValues(string(k))
	}
	reg.MustRegister(m.transitions, m.patroniDuration, m.patroniErrors, m.postgresErrors,
		m.keepaliveFailures, m.quorumCheckFailures, m.etcdLeaderMoves, m.leaseGrants, m.etcdReadErrors, m.hookRuns, m.takeovers, m.takeoverAutoAcks,
		m.agentRequests, m.fpmErrors)
	for _, k := range []string{"unreachable", "garbage"} {
		m.patroniErrors.WithLabelValues(k)
	}
	for _, h := range []string{"on_active", "on_passive"} {
		for _, r := range []string{"ok", "failed"} {
			m.hookRuns.WithLabelValues(h, r)
		}
	}
	for _, a := range []string{"app", "replica"} {
		m.agentRequests.WithLabelValues(a)
	}
	return m
}

// stateCollector exports the Daemon's current state at scrape time.
type stateCollector struct {
	d *Daemon

	role, epoch, kaAge, remaining, alarm, primary, writable, leaderSelf, leaseTTL *prometheus.Desc
	commitHung, fenceState                                                        *prometheus.Desc
	fpm                                                                           fpmDescs
	ready                                                                         readinessDescs
}

func newStateCollector(d *Daemon) *stateCollector {
	g := func(n, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name(n), help, labels, nil)
	}
	return &stateCollector{
		d:          d,
		role:       g("role", "1 for the current role of this node (active or passive), 0 for the other.", "role"),
		epoch:      g("epoch", "Epoch (active key CreateRevision) held now; 0 when passive."),
		kaAge:      g("lease_keepalive_age_seconds", "Seconds since the last successful lease keep-alive was sent (-1: none yet)."),
		remaining:  g("lease_deadline_remaining_seconds", "Seconds until the local deadline (negative: passed)."),
		leaseTTL:   g("lease_ttl_seconds", "Granted TTL of the fencing lease."),
		alarm:      g("takeover_alarm", "1 while an unacknowledged leader-key takeover alarm exists, by Patroni member.", "member"),
		primary:    g("patroni_primary", "1 when the local Patroni claims the primary (GET /primary 200, role master/primary, running)."),
		writable:   g("postgres_writable", "1 when the local PostgreSQL answers and is not in recovery."),
		leaderSelf: g("leader_key_self", "1 when Patroni's leader key names this member."),
		commitHung: g("postgres_commits_hung", "1 while the commit canary's commits on the local primary hang past postgres.canary.hang-after (absent without the canary)."),
		fenceState: g("db_fence_state", "1 for the database fence's current state (off, pending, set, standby); absent without postgres.fence.roles.", "state"),
		fpm:        newFPMDescs(),
		ready:      newReadinessDescs(),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(c, ch)
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	g := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	active, epoch := d.activeNow()
	g(c.role, b2f(active), "active")
	g(c.role, b2f(!active), "passive")
	g(c.epoch, float64(epoch))
	l := d.lease.Load()
	now := d.now()
	if l.lastSent > 0 {
		g(c.kaAge, (now - l.lastSent).Seconds())
	} else {
		g(c.kaAge, -1)
	}
	g(c.remaining, (l.deadline - now).Seconds())
	g(c.leaseTTL, l.ttl.Seconds())
	ev := d.etcdView.Load()
	me := d.cfg.member()
	g(c.alarm, b2f(ev.takeoverBlocks(me)), me) // always present for this node
	for _, a := range ev.alarms {
		if a.Member != me {
			g(c.alarm, b2f(!a.Acked), a.Member)
		}
	}
	pv := d.localView.Load()
	g(c.primary, b2f(pv.patroni.Primary()))
	g(c.writable, b2f(!pv.postgres.Disabled && pv.postgres.Err == "" && !pv.postgres.InRecovery && pv.patroni.At > 0))
	g(c.leaderSelf, b2f(ev.leader.Exists && ev.leader.Value == d.cfg.member()))
	if d.canary != nil {
		g(c.commitHung, b2f(d.commits.Load().Hung))
	}
	if d.fence != nil {
		st := d.fence.Status().State
		for _, s := range FenceStates {
			g(c.fenceState, b2f(s == st), string(s))
		}
	}
	r, stuck := d.readiness()
	c.ready.collect(ch, r, stuck, d.unwritableSeconds())
	if d.cfg.PHPFPM.URL != "" {
		c.fpm.collect(ch, d.fpm.Load(), d.cfg.PHPFPM.MaxChildren)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
