package roled

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/hapair/hapair/budget"
	"github.com/hapair/hapair/internal/config"
	"github.com/hapair/hapair/vip"
)

// Daemon is hapair-roled: it maps Patroni leadership to the ACTIVE/PASSIVE
// role of this node, fenced by an etcd lease.
//
// Goroutines (all started by Run, all stopped when its ctx is done):
//   - lease: grants the lease and sends keep-alives; publishes the local deadline;
//   - etcd: linearizable reads of the leader, active and alarm keys, on watch
//     events and every reread-interval; raises and clears takeover alarms;
//   - patroni: polls Patroni and PostgreSQL;
//   - canary: commits a heartbeat row on the local primary (canary.go);
//   - fence: sets the database fence after leaving ACTIVE (dbfence.go);
//   - rewind hold: locks Patroni's rewind user out while a takeover alarm
//     naming this node is held (rewindhold.go);
//   - state: the only goroutine that changes the role (see stateLoop);
//   - heartbeat, HTTP, agent-check listeners, optional replica agent and PHP-FPM.
//
// Producers publish through atomics and nudge the state loop; HTTP handlers
// read atomics only.
type Daemon struct {
	cfg   Config
	lg    *zap.Logger
	m     *Metrics
	start time.Time // monotonic base of now()

	patroni *patroniClient
	pg      *pgChecker  // nil when postgres.enabled is false
	canary  *canary     // nil when the commit canary is off (CanaryOn)
	fence   *dbFence    // nil without postgres.fence.roles
	rewind  *rewindHold // nil without postgres.fence.rewind-role
	cli     *clientv3.Client

	httpLn, agentLn, replicaLn net.Listener

	lease     atomic.Pointer[leaseState]
	etcdView  atomic.Pointer[etcdView]
	localView atomic.Pointer[localView]
	commits   atomic.Pointer[CommitView] // the canary's last verdict (canary.go)
	snap      atomic.Pointer[snapshot]
	replica   atomic.Pointer[replicaState]
	fpm       atomic.Pointer[fpmStatus]
	holding   atomic.Bool
	eager     atomic.Bool
	loopBeat  atomic.Int64 // now() of the state loop's last iteration
	etcdOK    atomic.Int64 // now() when the newest successful etcd call was sent (quorum.go)
	sync      SyncHooks
	vip       *vip.Guard // nil without a vip section
	ls        loopState  // owned by the state goroutine
	hist      history    // the last ACTIVE seen, for the failover history
	histq     chan historyJob

	// standby readiness and stuck leader (readiness.go), published by the
	// poll goroutine, which owns rls
	ready           atomic.Pointer[readyState]
	unwritableSince atomic.Int64
	rls             readinessLoopState

	// owned by the etcd goroutine
	readErr       bool
	reported      map[takeoverKey]bool
	takeoverCache map[takeoverKey]*TakeoverAlarm
	tracking      bool          // this node's last-active record exists (etcd goroutine)
	ttlChecked    time.Duration // Patroni ttl found at start
	patroniSeen   string        // the Patroni release last noted (pollLoop only)

	wake, pollNow, readNow, beatNow chan struct{}
}

// SyncHooks connect the file sync (package syncdir) to the role. The main
// wires a *syncdir.Syncer's methods in; all may be nil.
type SyncHooks struct {
	SetActive  func(epoch int64) // after 200 is served
	SetPassive func()            // after 503 is served; returns when the sender stopped
	Status     func() any        // shown under "sync" in /role
	// Quarantined counts the files waiting in quarantine now (all roots),
	// for the standby's readiness.
	Quarantined func() int64
}

// leaseState is published by the lease goroutine.
type leaseState struct {
	id       int64         // 0: no lease
	ttl      time.Duration // granted
	lastSent time.Duration // now() when the last successful keep-alive (or grant) was sent
	deadline time.Duration // lastSent + ttl - safety margin
}

// localView is the latest Patroni and PostgreSQL result.
type localView struct {
	patroni  PatroniView
	postgres PostgresView
	status   PatroniStatus
	wal      WALReceiverView // read only while PostgreSQL is in recovery
}

// snapshot is the role as published to handlers, agents and the fence.
type snapshot struct {
	role    Role
	epoch   int64
	leaseID int64 // lease the active key is bound to
	since   time.Time
	reason  Reason
}

// New checks cfg and binds the listeners, so an address in use fails here.
// It starts no goroutine; call Run (which closes the listeners) or Close.
func New(cfg Config, lg *zap.Logger, m *Metrics) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var patroniTLS *tls.Config
	if cfg.Patroni.TLS.Enabled() {
		tc, err := cfg.Patroni.TLS.ClientConfig()
		if err != nil {
			return nil, config.Errorf("patroni.tls", cfg.Patroni.TLS.CertFile, "%v", err)
		}
		patroniTLS = tc
	}
	d := &Daemon{
		cfg: cfg, lg: lg, m: m, start: time.Now(),
		patroni: newPatroniClient(cfg.Patroni.URL, cfg.Patroni.Timeout, patroniTLS),
		wake:    make(chan struct{}, 1), pollNow: make(chan struct{}, 1),
		readNow: make(chan struct{}, 1), beatNow: make(chan struct{}, 1),
		reported: map[takeoverKey]bool{}, takeoverCache: map[takeoverKey]*TakeoverAlarm{},
		histq: make(chan historyJob, 4),
	}
	if cfg.Postgres.Enabled {
		pg, err := newPGChecker(cfg.Postgres.DSN, cfg.Postgres.Timeout)
		if err != nil {
			return nil, config.Errorf("postgres.dsn", cfg.Postgres.DSN, "%v", err)
		}
		d.pg = pg
	}
	if cfg.CanaryOn() {
		k, err := newCanary(cfg.Postgres.DSN, cfg.Node, cfg.Postgres.Canary, cfg.Postgres.Timeout)
		if err != nil {
			return nil, config.Errorf("postgres.dsn", cfg.Postgres.DSN, "%v", err)
		}
		d.canary = k
	}
	if len(cfg.Postgres.Fence.Roles) > 0 {
		f, err := newDBFence(cfg.Postgres.DSN, cfg.Postgres.Fence, cfg.Postgres.Timeout, lg.Named("fence"), m)
		if err != nil {
			return nil, config.Errorf("postgres.dsn", cfg.Postgres.DSN, "%v", err)
		}
		d.fence = f
	}
	if r := cfg.Postgres.Fence.RewindRole; r != "" {
		h, err := newRewindHold(cfg.Postgres.DSN, r, cfg.Postgres.Fence.RetryInterval, cfg.Postgres.Timeout, lg.Named("rewind-hold"))
		if err != nil {
			return nil, config.Errorf("postgres.dsn", cfg.Postgres.DSN, "%v", err)
		}
		d.rewind = h
	}
	d.commits.Store(&CommitView{})
	d.lease.Store(&leaseState{})
	d.etcdView.Store(&etcdView{})
	d.localView.Store(&localView{})
	d.snap.Store(&snapshot{role: RolePassive, since: time.Now(), reason: ReasonStarting})
	d.replica.Store(&replicaState{})
	d.fpm.Store(&fpmStatus{})
	if err := d.listen(); err != nil {
		d.Close()
		return nil, err
	}
	if err := d.newVIP(); err != nil {
		d.Close()
		return nil, err
	}
	m.reg.MustRegister(newStateCollector(d))
	return d, nil
}

func (d *Daemon) listen() error {
	var err error
	if d.httpLn, err = net.Listen("tcp", d.cfg.Listen); err != nil {
		return fmt.Errorf("listen %s: %w", d.cfg.Listen, err)
	}
	if a := d.cfg.Agent.Listen; a != "" {
		if d.agentLn, err = net.Listen("tcp", a); err != nil {
			return fmt.Errorf("agent listen %s: %w", a, err)
		}
	}
	if a := d.cfg.ReplicaAgent.Listen; a != "" {
		if d.replicaLn, err = net.Listen("tcp", a); err != nil {
			return fmt.Errorf("replica agent listen %s: %w", a, err)
		}
	}
	return nil
}

// Close releases the listeners of a Daemon whose Run was never called.
func (d *Daemon) Close() {
	if d.vip != nil {
		_ = d.vip.Close()
	}
	for _, ln := range []net.Listener{d.httpLn, d.agentLn, d.replicaLn} {
		if ln != nil {
			_ = ln.Close()
		}
	}
}

// HTTPAddr is the bound address of /ha-health, /role and /metrics.
func (d *Daemon) HTTPAddr() string { return d.httpLn.Addr().String() }

// AgentAddr is the bound agent-check address, "" when disabled.
func (d *Daemon) AgentAddr() string { return addrOf(d.agentLn) }

// ReplicaAgentAddr is the bound replica agent address, "" when disabled.
func (d *Daemon) ReplicaAgentAddr() string { return addrOf(d.replicaLn) }

func addrOf(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

// SetSync connects the file sync. Call before Run.
func (d *Daemon) SetSync(s SyncHooks) { d.sync = s }

// Alive reports whether the state loop iterated recently (for the systemd
// watchdog): a stuck loop must not be kept alive by a healthy side goroutine.
func (d *Daemon) Alive() bool {
	// A hook legitimately blocks the loop for up to its timeout (twice: the
	// failed on_active and the on_passive after it).
	return d.now()-time.Duration(d.loopBeat.Load()) < 3*d.cfg.LeaseTTL+2*d.cfg.Hooks.Timeout
}

// now is monotonic time since the Daemon was made. Go's monotonic clock is
// CLOCK_MONOTONIC, which keeps running while the process is stopped, so a
// process resumed after SIGSTOP sees its deadline as passed.
func (d *Daemon) now() time.Duration { return time.Since(d.start) }

// Run starts everything and blocks until ctx is done and cleanup is over: an
// ACTIVE node serves 503, removes its marker and releases the key before Run
// returns, and the lease is revoked.
func (d *Daemon) Run(ctx context.Context) error {
	defer d.Close()
	if d.pg != nil {
		defer d.pg.Close()
	}
	cli, err := d.cfg.Etcd.NewClient(d.lg.Named("etcd"))
	if err != nil {
		return err
	}
	d.cli = cli
	defer cli.Close()
	if err := d.checkTTL(ctx); err != nil {
		return err
	}
	d.lg.Info("starting", zap.String("node", d.cfg.Node), zap.String("member", d.cfg.member()),
		zap.String("prefix", d.cfg.prefix()), zap.String("leader_key", d.cfg.leaderKey()),
		zap.Duration("lease_ttl", d.cfg.LeaseTTL), zap.Duration("patroni_ttl", d.ttlChecked),
		zap.String("http", d.HTTPAddr()), zap.String("agent", d.AgentAddr()),
		zap.String("replica_agent", d.ReplicaAgentAddr()))

	// The state loop stops first (it steps down using the lease and the
	// client); the other goroutines stop after it, so the step-down still has
	// keep-alives, reads and an HTTP server answering 503.
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	g, gctx := errgroup.WithContext(workCtx)
	g.Go(func() error { return d.leaseLoop(gctx) })
	g.Go(func() error { return d.etcdLoop(gctx) })
	g.Go(func() error { return d.quorumLoop(gctx) })
	g.Go(func() error { return d.pollLoop(gctx) })
	g.Go(func() error { return d.heartbeatLoop(gctx) })
	g.Go(func() error { return d.historyLoop(gctx) })
	g.Go(func() error { return d.serveHTTP(gctx) })
	if d.vip != nil {
		g.Go(func() error { return d.vip.Run(gctx) })
	}
	if d.agentLn != nil {
		g.Go(func() error { return d.serveAgent(gctx, d.agentLn, "app", d.appAgentReply) })
	}
	if d.replicaLn != nil {
		g.Go(func() error { return d.replicaLoop(gctx) })
		g.Go(func() error { return d.serveAgent(gctx, d.replicaLn, "replica", d.replicaAgentReply) })
	}
	if d.cfg.PHPFPM.URL != "" {
		g.Go(func() error { return d.fpmLoop(gctx) })
	}
	if d.canary != nil {
		g.Go(func() error { return d.canaryLoop(gctx) })
	}
	if d.rewind != nil {
		g.Go(func() error { return d.rewind.Run(gctx) })
	}
	if d.fence != nil {
		g.Go(func() error { return d.fence.Run(gctx, d.now) })
	}
	stateErr := make(chan error, 1)
	go func() { stateErr <- d.stateLoop(ctx, gctx) }()
	err = <-stateErr
	stopWork()
	if gerr := g.Wait(); err == nil && gerr != nil && !errors.Is(gerr, context.Canceled) {
		err = gerr
	}
	d.revoke()
	return err
}

// checkTTL refuses to start with a lease TTL not below Patroni's ttl. The ttl
// comes from Patroni's /config, else from its config key in etcd, else from
// patroni.ttl.
func (d *Daemon) checkTTL(ctx context.Context) error {
	ttl, src := d.patroniTTL(ctx)
	d.ttlChecked = ttl
	if d.cfg.LeaseTTL >= ttl {
		return config.Errorf("lease-ttl", d.cfg.LeaseTTL,
			"must be below Patroni's ttl (%s, from %s): roled must give up before Patroni's leader key can move", ttl, src)
	}
	return nil
}

func (d *Daemon) patroniTTL(ctx context.Context) (time.Duration, string) {
	if ttl, err := d.patroni.TTL(ctx); err == nil {
		return ttl, "patroni /config"
	}
	tctx, cancel := context.WithTimeout(ctx, d.cfg.opTimeout())
	defer cancel()
	if resp, err := d.cli.Get(tctx, d.cfg.patroniConfigKey()); err == nil && len(resp.Kvs) == 1 {
		if ttl, err := parsePatroniTTL(resp.Kvs[0].Value); err == nil {
			return ttl, d.cfg.patroniConfigKey()
		}
	}
	return d.cfg.Patroni.TTL, "patroni.ttl"
}

// notePatroniRelease compares the ttl found at start with the one the
// local Patroni release runs (budget.FloorsFor): from 3.2.0 on Patroni runs
// a ttl below 20 s as 20 s, and its /config shows the lower value when it
// was set after the bootstrap (PATCH /config, patronictl edit-config), so
// every failover then waits 20 s whatever the timing budget says. Once
// per release seen: an error in the log and hapair_roled_patroni_ttl_seconds
// (alert HapairPatroniTTLRaised).
// Safety does not change (a longer ttl only keeps roled's lease further
// below it); the operator's figures do.
func (d *Daemon) notePatroniRelease(version string) {
	if version == "" || version == d.patroniSeen {
		return
	}
	d.patroniSeen = version
	f, err := budget.FloorsFor(version)
	if err != nil {
		d.lg.Warn("cannot read Patroni's version", zap.String("version", version), zap.Error(err))
		return
	}
	runs := budget.Timers{PatroniTTL: d.ttlChecked, PatroniVersion: f.Release}.Running().PatroniTTL
	d.m.patroniTTL.WithLabelValues("config").Set(d.ttlChecked.Seconds())
	d.m.patroniTTL.WithLabelValues("release").Set(runs.Seconds())
	if runs != d.ttlChecked {
		d.lg.Error("Patroni runs a longer ttl than its configuration says: failovers wait for the longer one",
			zap.String("patroni_version", f.Release), zap.Duration("configured_ttl", d.ttlChecked),
			zap.Duration("running_ttl", runs),
			zap.String("fix", "hapairctl plan --patroni "+f.Release+" --rto <target> derives timers this release keeps (ttl ≥ "+f.TTL.String()+")"))
	}
}

// revoke ends the lease at exit, so the heartbeat key goes at once.
func (d *Daemon) revoke() {
	l := d.lease.Load()
	if l.id == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := d.cli.Revoke(ctx, clientv3.LeaseID(l.id)); err != nil {
		d.lg.Warn("lease revoke failed", zap.Error(err))
	}
}

// activeNow is the role as served: ACTIVE only while the published snapshot
// says so, on the lease that still holds, and before the local deadline.
// Every ACTIVE-only answer goes through it, so a process that wakes from a
// pause answers PASSIVE before the state loop has run.
func (d *Daemon) activeNow() (bool, int64) {
	s := d.snap.Load()
	if s.role != RoleActive {
		return false, 0
	}
	l := d.lease.Load()
	now := d.now()
	if l.id == 0 || l.id != s.leaseID || now >= l.deadline || d.quorumLost(now) {
		return false, 0
	}
	return true, s.epoch
}

// Holding is syncdir's Fence: the node holds or is taking the active key, so
// its receiver refuses pushes.
func (d *Daemon) Holding() bool { return d.holding.Load() || d.snap.Load().role == RoleActive }

// ActiveEpoch is syncdir's Fence: the epoch, and true only while ACTIVE and
// before the local deadline.
func (d *Daemon) ActiveEpoch() (int64, bool) {
	ok, e := d.activeNow()
	return e, ok
}

func nudge(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
