package roled

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"go.uber.org/zap"
)

// The commit canary tells "accepts writes" from "accepts connections but
// commits hang". pg_is_in_recovery() answers at once on a primary whose
// synchronous standby is gone, while every application COMMIT waits for
// that standby (synchronous_mode_strict, or the seconds before Patroni
// notices it left). So a separate goroutine commits one row of a small
// heartbeat table, at the application's synchronous_commit, and reports how
// long that took. It never blocks the state loop: the loop reads the last
// published CommitView only.

// CommitView is the canary's last word on the local primary's commits.
type CommitView struct {
	Checked bool // a canary commit ran on this primary since it was last seen as one
	// Hung: the last canary commit did not complete within
	// postgres.canary.hang-after (it was cancelled), or it failed on an
	// open connection: the primary takes connections but not commits.
	Hung      bool
	HungSince time.Duration // monotonic start of the first commit of the current hung run (0: not hung)
	LastOK    time.Duration // monotonic end of the last commit that completed in time (0: none)
	Latency   time.Duration // duration of the last canary commit (completed or cancelled)
	Err       string        // why the last commit was not usable ("" when it completed)
}

// canary owns its own connection (the poller's must stay quick) and is used
// by the canary goroutine alone.
type canary struct {
	cfg       *pgx.ConnConfig
	node      string
	table     string // quoted identifier
	syncMode  string // "" keeps the server's synchronous_commit
	hangAfter time.Duration
	conn      *pgx.Conn
	ready     bool // table created and session set up on conn
	beat      int64
	notice    atomic.Bool // a "canceling wait for synchronous replication" warning arrived
}

func newCanary(dsn, node string, c CanaryConfig, connectTimeout time.Duration) (*canary, error) {
	cc, err := pgConnConfig(dsn, "hapair-roled-canary", connectTimeout)
	if err != nil {
		return nil, err
	}
	cc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	k := &canary{cfg: cc, node: node, table: pgx.Identifier{c.Table}.Sanitize(),
		syncMode: c.SynchronousCommit, hangAfter: c.HangAfter}
	// A commit waiting for a synchronous standby ignores statement_timeout
	// (it is disabled before the commit record is written) and a closed
	// socket alike: only a cancel request ends the wait, with a WARNING that
	// the transaction committed locally. So on timeout pgx sends a cancel
	// request first and breaks the socket only if that was not enough,
	// rather than leaving one stuck backend behind per attempt.
	cc.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: connectTimeout}
	}
	cc.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if strings.Contains(n.Message, "synchronous replication") {
			k.notice.Store(true)
		}
	}
	return k, nil
}

// errCommitHung is a canary commit that was cancelled after hang-after.
var errCommitHung = errors.New("roled: canary commit did not complete within postgres.canary.hang-after")

// commit runs one canary commit; it returns how long the commit took and
// why it is not a completed commit (nil: completed in time; errCommitHung:
// cancelled after hang-after).
func (k *canary) commit(ctx context.Context) (took time.Duration, err error) {
	if k.conn == nil || k.conn.IsClosed() {
		cctx, cancel := context.WithTimeout(ctx, k.cfg.ConnectTimeout)
		c, err := pgx.ConnectConfig(cctx, k.cfg)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("postgres connect: %w", err)
		}
		k.conn, k.ready = c, false
	}
	if !k.ready {
		if err := k.setup(ctx); err != nil {
			k.Close()
			return 0, err
		}
		k.ready = true
	}
	k.beat++
	k.notice.Store(false)
	qctx, cancel := context.WithTimeout(ctx, k.hangAfter)
	defer cancel()
	start := time.Now()
	_, err = k.conn.Exec(qctx, "INSERT INTO "+k.table+" (node, beat, at) VALUES ($1, $2, now()) "+
		"ON CONFLICT (node) DO UPDATE SET beat = EXCLUDED.beat, at = EXCLUDED.at", k.node, k.beat)
	took = time.Since(start)
	switch {
	case ctx.Err() != nil:
		return took, ctx.Err()
	case err != nil && qctx.Err() != nil, err == nil && (k.notice.Load() || took >= k.hangAfter):
		err = errCommitHung
	case err != nil:
		err = fmt.Errorf("canary commit: %w", err)
	}
	if err != nil && k.conn.IsClosed() {
		k.conn = nil
	}
	return took, err
}

// setup creates the heartbeat table if missing and sets the session's
// synchronous_commit. The DDL commits at synchronous_commit = local: on a
// primary whose standby is gone it must not hang itself.
func (k *canary) setup(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, k.hangAfter+k.cfg.ConnectTimeout)
	defer cancel()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL synchronous_commit = local")
	b.Queue("CREATE TABLE IF NOT EXISTS " + k.table + " (node text PRIMARY KEY, beat bigint NOT NULL, at timestamptz NOT NULL)")
	b.Queue("COMMIT")
	if k.syncMode != "" {
		b.Queue("SET synchronous_commit = " + k.syncMode)
	}
	if err := k.conn.SendBatch(sctx, b).Close(); err != nil {
		return fmt.Errorf("canary setup: %w", err)
	}
	return nil
}

// Close drops the connection.
func (k *canary) Close() {
	if k.conn != nil {
		closeConn(k.conn)
		k.conn = nil
	}
}

// nextCommitView folds one canary result into the view: pure, so the
// hung/not-hung rule is table-tested like decide. Only a commit cancelled
// after hang-after (errCommitHung) is a hang; a refused connection or a
// quick server error is the PostgreSQL check's business and leaves the
// verdict as it was.
func nextCommitView(prev CommitView, start, end time.Duration, err error) CommitView {
	v := CommitView{Checked: true, LastOK: prev.LastOK, Latency: end - start}
	switch {
	case err == nil:
		v.LastOK = end
	case errors.Is(err, errCommitHung):
		v.Err, v.Hung, v.HungSince = err.Error(), true, prev.HungSince
		if !prev.Hung {
			v.HungSince = start
		}
	default:
		v.Checked, v.Err, v.Hung, v.HungSince = prev.Checked, err.Error(), prev.Hung, prev.HungSince
	}
	return v
}

// canaryLoop commits every postgres.canary.interval while the local
// PostgreSQL is a primary (last poll: reachable, not in recovery); one
// commit at a time, so a hang holds one backend, not one per interval.
func (d *Daemon) canaryLoop(ctx context.Context) error {
	defer d.canary.Close()
	t := time.NewTicker(d.cfg.Postgres.Canary.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		lv := d.localView.Load()
		if lv.postgres.Disabled || lv.postgres.Err != "" || lv.postgres.InRecovery || lv.patroni.At == 0 {
			if d.commits.Load().Checked {
				d.publishCommits(CommitView{})
			}
			continue
		}
		start := d.now()
		took, err := d.canary.commit(ctx)
		if ctx.Err() != nil {
			return nil
		}
		end := start + took
		if err == nil {
			d.m.canaryLatency.Observe(took.Seconds())
		} else {
			d.m.canaryFailures.Inc()
		}
		d.publishCommits(nextCommitView(*d.commits.Load(), start, end, err))
	}
}

// publishCommits stores v and wakes the state loop when the verdict changed.
func (d *Daemon) publishCommits(v CommitView) {
	old := d.commits.Swap(&v)
	if old.Hung != v.Hung {
		if v.Hung {
			d.lg.Warn("commits hang on the local primary", zap.String("error", v.Err),
				zap.Duration("hang_after", d.cfg.Postgres.Canary.HangAfter))
		} else {
			d.lg.Info("commits complete again on the local primary", zap.Duration("latency", v.Latency))
		}
		nudge(d.wake)
	}
}

// CommitSummary is the canary in /role.
type CommitSummary struct {
	Checked        bool    `json:"checked"`
	Hung           bool    `json:"hung"`
	HungForSeconds float64 `json:"hung_for_seconds,omitempty"`
	LatencySeconds float64 `json:"latency_seconds"`
	LastOKAgo      float64 `json:"last_ok_seconds_ago,omitempty"`
	Error          string  `json:"error,omitempty"`
	// HoldsRole: with durability sync-strict, hung commits make the node
	// PASSIVE (503), so the balancer holds requests instead of piling them up.
	HoldsRole bool `json:"holds_role"`
}

func (d *Daemon) commitSummary(now time.Duration) *CommitSummary {
	if d.canary == nil {
		return nil
	}
	v := d.commits.Load()
	s := &CommitSummary{Checked: v.Checked, Hung: v.Hung, LatencySeconds: v.Latency.Seconds(), Error: v.Err,
		HoldsRole: d.cfg.Durability == DurabilitySyncStrict}
	if v.Hung {
		s.HungForSeconds = (now - v.HungSince).Seconds()
	}
	if v.LastOK > 0 {
		s.LastOKAgo = (now - v.LastOK).Seconds()
	}
	return s
}
