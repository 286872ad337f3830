package roled

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// The I/O around standbyReady and the stuck-leader tracking: the poll
// goroutine reads pg_stat_wal_receiver after each poll, evaluates both
// decisions and publishes them for /role, the heartbeat and /metrics.

// readyState is what the poll goroutine publishes.
type readyState struct {
	ready Readiness
	stuck *StuckLeader
}

// readinessLoopState is owned by the poll goroutine.
type readinessLoopState struct {
	last     Readiness
	stuck    stuckTracker
	recovery recoveryTracker
}

// walReceiverQuery reads the replica's own replication state in one round
// trip. pg_stat_wal_receiver has at most one row; none while no receiver
// runs (rewinding, timeline diverged, no source). sender_host needs
// pg_read_all_stats (the default postgres user has it).
const walReceiverQuery = `SELECT COALESCE(r.status, ''), COALESCE(r.sender_host, ''), COALESCE(r.received_tli, 0)::bigint,
  COALESCE(pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0'), 0)::bigint,
  COALESCE(pg_wal_lsn_diff(pg_last_wal_receive_lsn(), '0/0'), 0)::bigint,
  (CASE WHEN pg_last_wal_receive_lsn() IS NULL OR pg_last_wal_receive_lsn() <= pg_last_wal_replay_lsn() THEN 0
        ELSE COALESCE(EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()), -1) END)::float8
  FROM (SELECT 1) AS one LEFT JOIN pg_stat_wal_receiver r ON true`

// WALReceiver reads pg_stat_wal_receiver and the replay position.
func (p *pgChecker) WALReceiver(ctx context.Context) (WALReceiverView, error) {
	w := WALReceiverView{Checked: true}
	err := p.query(ctx, func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, walReceiverQuery).Scan(&w.Status, &w.SenderHost, &w.Timeline,
			&w.ReplayLSN, &w.ReceiveLSN, &w.ReplayAge)
	})
	if err != nil {
		return WALReceiverView{Err: err.Error()}, err
	}
	return w, nil
}

// sqlState is the SQLSTATE of a PostgreSQL refusal, "" for other errors.
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// checkWAL reads the replication state when PostgreSQL answered and is in
// recovery (a replica, or a leader stuck in standby mode).
func (d *Daemon) checkWAL(ctx context.Context, pv PostgresView) WALReceiverView {
	if d.pg == nil || pv.Err != "" || !pv.InRecovery {
		return WALReceiverView{}
	}
	w, err := d.pg.WALReceiver(ctx)
	if err != nil {
		d.m.postgresErrors.Inc()
	}
	return w
}

// syncListening dials the local sync receiver: a standby whose receiver is
// not accepting is missing files whatever the sender says.
func (d *Daemon) syncListening(ctx context.Context) bool {
	host, port, err := net.SplitHostPort(d.cfg.Sync.Listen)
	if err != nil {
		return false
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	dctx, cancel := context.WithTimeout(ctx, d.cfg.Postgres.Timeout)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(dctx, "tcp", net.JoinHostPort(host, port))
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// standbyObservation gathers the published views into standbyReady's input.
func (d *Daemon) standbyObservation(lv *localView, sync SyncStandby) StandbyObservation {
	ev := d.etcdView.Load()
	active, _ := d.activeNow()
	return StandbyObservation{
		Active: active, Patroni: lv.patroni, Status: lv.status, Postgres: lv.postgres, WAL: lv.wal,
		EtcdAt: ev.at, Leader: ev.leader, Member: d.cfg.member(), LeaderM: ev.leaderMember, Optime: ev.optime,
		Peer: ev.peerSync, Sync: sync,
		MaxEtcdAge:    d.cfg.LeaseTTL - d.cfg.SafetyMargin,
		MaxPatroniAge: d.cfg.Patroni.PollInterval + d.cfg.Patroni.Timeout + d.cfg.Postgres.Timeout + 500*time.Millisecond,
		Bounds:        d.cfg.Readiness,
	}
}

// evaluateReadiness runs after each poll, on the poll goroutine.
func (d *Daemon) evaluateReadiness(ctx context.Context, lv *localView) {
	var sync SyncStandby
	if d.cfg.SyncEnabled() {
		sync.Enabled = true
		if active, _ := d.activeNow(); !active {
			sync.Listening = d.syncListening(ctx)
		}
		if d.sync.Quarantined != nil {
			sync.Quarantined = d.sync.Quarantined()
		}
	}
	now, wall := d.now(), time.Now().UTC()
	r := standbyReady(d.standbyObservation(lv, sync), now)
	rs := &d.rls
	if r.Reason == rs.last.Reason && r.Ready == rs.last.Ready && !rs.last.Since.IsZero() {
		r.Since = rs.last.Since
	} else {
		r.Since = wall
		if rs.last.Reason != "" {
			d.lg.Info("standby readiness changed", zap.Bool("ready", r.Ready), zap.String("reason", string(r.Reason)),
				zap.String("detail", r.Detail), zap.String("was", string(rs.last.Reason)))
		}
	}
	if rs.recovery.wantHistory(now) {
		// The diverged range needs the cluster's timeline history; any
		// member's Patroni serves it from the DCS.
		if h, err := d.patroni.History(ctx); err == nil {
			rs.recovery.noteHistory(h, now)
		}
	}
	r.Recovery = rs.recovery.track(r, phaseSample{Reason: r.Reason, PatroniState: lv.patroni.State, Receiver: lv.wal.Status,
		ReplayLSN: lv.wal.ReplayLSN, Timeline: lv.status.Timeline}, now, wall)
	if dv := r.Recovery.divergedBytes(); dv > 0 && !r.Ready {
		dr := r.Recovery.Diverged
		more := fmt.Sprintf("diverged: %d bytes of its own WAL beyond %s on timeline %d (to %s), lost to the rewind", dv, dr.From, dr.Timeline, dr.To)
		if r.Detail == "" {
			r.Detail = more
		} else {
			r.Detail += "; " + more
		}
	}
	rs.last = r

	ev := d.etcdView.Load()
	holder := ev.leader.Exists && ev.leader.Value == d.cfg.member()
	writable, cause := leaderWritable(lv.patroni, lv.postgres, lv.wal)
	old := d.ready.Load()
	stuck := rs.stuck.track(holder, writable, cause, d.cfg.Readiness.StuckLeaderAfter, now, wall, d.cfg.Node, d.cfg.member())
	if stuck != nil && (old == nil || old.stuck == nil || old.stuck.Cause != stuck.Cause) {
		d.lg.Error("stuck leader: Patroni holds the leader key but PostgreSQL accepts no writes",
			zap.String("cause", string(stuck.Cause)), zap.Float64("seconds", stuck.Seconds), zap.String("remedy", stuck.Remedy))
	} else if stuck == nil && old != nil && old.stuck != nil {
		d.lg.Info("stuck leader resolved")
	}
	d.unwritableSince.Store(int64(rs.stuck.since))
	d.ready.Store(&readyState{ready: r, stuck: stuck})
	if old == nil || old.ready.Reason != r.Reason || (old.stuck == nil) != (stuck == nil) ||
		old.ready.Recovery.divergedBytes() != r.Recovery.divergedBytes() {
		nudge(d.beatNow)
	}
}

// readiness returns the last published readiness and stuck leader. A node
// that serves now is never a ready standby, even if the last poll predates
// its becoming ACTIVE.
func (d *Daemon) readiness() (Readiness, *StuckLeader) {
	rs := d.ready.Load()
	if rs == nil {
		rs = &readyState{ready: Readiness{Reason: StandbyPatroniDown, Detail: "not polled yet"}}
	}
	if active, _ := d.activeNow(); active && rs.ready.Reason != StandbyIsActive {
		return Readiness{Reason: StandbyIsActive, Since: d.snap.Load().since}, rs.stuck
	}
	return rs.ready, rs.stuck
}

// membersPrefix holds Patroni's member keys.
func (c Config) membersPrefix() string {
	return strings.TrimSuffix(c.Patroni.Namespace, "/") + "/" + c.Patroni.Scope + "/members/"
}

// readinessDescs are the readiness metrics, read at scrape time.
type readinessDescs struct {
	ready, reason, stuck, unwritable *prometheus.Desc
}

func newReadinessDescs() readinessDescs {
	return readinessDescs{
		ready: prometheus.NewDesc(name("standby_ready"),
			"1 when this node could take over now (streaming from the leader, same timeline, lag within bounds, files in sync).", nil, nil),
		reason: prometheus.NewDesc(name("standby_not_ready_reason"),
			"1 for the reason this node is not ready to take over (reason=\"ready\" when it is), 0 for the others.", []string{"reason"}, nil),
		stuck: prometheus.NewDesc(name("leader_stuck"),
			"1 while Patroni holds the leader key for this member and its PostgreSQL has accepted no writes for readiness.stuck-leader-after, by what PostgreSQL is doing.",
			[]string{"cause"}, nil),
		unwritable: prometheus.NewDesc(name("leader_unwritable_seconds"),
			"Seconds Patroni has held the leader key for this member while its PostgreSQL accepted no writes (0: not the holder, or writable).", nil, nil),
	}
}

func (rd readinessDescs) collect(ch chan<- prometheus.Metric, r Readiness, stuck *StuckLeader, unwritable float64) {
	g := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	g(rd.ready, b2f(r.Ready))
	for _, reason := range StandbyReasons {
		g(rd.reason, b2f(reason == r.Reason), string(reason))
	}
	for _, c := range StuckCauses {
		g(rd.stuck, b2f(stuck != nil && stuck.Cause == c), string(c))
	}
	g(rd.unwritable, unwritable)
}

// unwritableSeconds is how long the leader-key holder has been unwritable,
// from the poll goroutine's tracker (read racily as an int64 snapshot).
func (d *Daemon) unwritableSeconds() float64 {
	if s := d.unwritableSince.Load(); s > 0 {
		return (d.now() - time.Duration(s)).Seconds()
	}
	return 0
}
