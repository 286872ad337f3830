package roled

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// The database fence. 503 keeps the balancer's users away from a node that
// left ACTIVE, but not a cron job or worker on that node writing to
// 127.0.0.1; on an isolated or frozen primary those writes are later rewound
// away. So when the node leaves ACTIVE, roled makes PostgreSQL refuse writes
// from the application's roles (postgres.fence.roles):
//
//	ALTER ROLE <r> SET default_transaction_read_only = on   -- new sessions
//	pg_terminate_backend(<their sessions>)                  -- old sessions
//
// and undoes it (ALTER ROLE <r> RESET default_transaction_read_only) when
// the node becomes ACTIVE again, with its new epoch, before on_active.
// Patroni's own roles (superuser, replication, rewind) and roled's are never
// in the list, so they keep working. The fence commits with
// synchronous_commit = local: on a primary whose synchronous standby is
// gone it must not hang like the writes it stops.
//
// The setting lives in pg_db_role_setting, so it replicates: the standby
// that is promoted next inherits a fence its old primary set (a switchover),
// which is why every transition to ACTIVE lifts it, whoever set it.
//
// Setting it runs in the fence goroutine, never in the state loop: 503 and
// PASSIVE never wait for PostgreSQL. If PostgreSQL cannot be reached, the
// goroutine retries every postgres.fence.retry-interval and /role and the
// metrics say "pending". Lifting runs in the state loop (the transition to
// ACTIVE waits for it, as DESIGN.md §10 orders).

// FenceState is the database fence's state.
type FenceState string

// The fence states.
const (
	FenceOff     FenceState = "off"     // not wanted (ACTIVE, or never left ACTIVE) and lifted
	FencePending FenceState = "pending" // wanted; not in place yet (PostgreSQL unreachable or refused: retrying)
	FenceSet     FenceState = "set"     // in place on the local primary
	FenceStandby FenceState = "standby" // wanted, but the local PostgreSQL is in recovery: it takes no writes anyway
)

// FenceStates lists every state (metrics labels).
var FenceStates = []FenceState{FenceOff, FencePending, FenceSet, FenceStandby}

// FenceStatus is the fence in /role.
type FenceStatus struct {
	State FenceState `json:"state"`
	Roles []string   `json:"roles"`
	Since time.Time  `json:"since"` // when the state began
	// SetAfterSeconds: from leaving ACTIVE to the fence in place (the
	// window in which a local writer could still write).
	SetAfterSeconds    float64 `json:"set_after_seconds,omitempty"`
	Attempts           int     `json:"attempts,omitempty"` // failed attempts since it was wanted
	Error              string  `json:"error,omitempty"`
	SessionsTerminated int64   `json:"sessions_terminated,omitempty"`
}

type dbFence struct {
	cfg   *pgx.ConnConfig
	roles []string
	retry time.Duration
	tout  time.Duration
	lg    *zap.Logger
	m     *Metrics

	want   atomic.Bool // set by the state loop: fence wanted (node not ACTIVE since it left ACTIVE)
	wantAt atomic.Int64
	kick   chan struct{}
	st     atomic.Pointer[FenceStatus]

	mu   sync.Mutex // serialises SQL on conn between the fence goroutine and Lift
	conn *pgx.Conn
}

func newDBFence(dsn string, c FenceConfig, timeout time.Duration, lg *zap.Logger, m *Metrics) (*dbFence, error) {
	cc, err := pgConnConfig(dsn, "hapair-roled-fence", timeout)
	if err != nil {
		return nil, err
	}
	f := &dbFence{cfg: cc, roles: append([]string(nil), c.Roles...), retry: c.RetryInterval, tout: timeout,
		lg: lg, m: m, kick: make(chan struct{}, 1)}
	f.st.Store(&FenceStatus{State: FenceOff, Roles: f.roles, Since: time.Now().UTC()})
	return f, nil
}

// Want asks for the fence (the node left ACTIVE at monotonic time at). It
// returns at once; the fence goroutine does the work.
func (f *dbFence) Want(at time.Duration) {
	f.wantAt.Store(int64(at))
	f.want.Store(true)
	nudge(f.kick)
}

// Lift removes the fence before this node serves as ACTIVE. It waits for a
// fence attempt in progress (bounded by the PostgreSQL timeout), so a fence
// can never land after the lift.
func (f *dbFence) Lift(ctx context.Context) error {
	f.want.Store(false)
	f.mu.Lock()
	defer f.mu.Unlock()
	// Most transitions find no fence (a kill: the old primary was ACTIVE to
	// the end). A read says so without a write transaction (a catalog
	// change and its commit on a PostgreSQL promoted a moment before).
	// A failed read falls through to the write, which reports the error.
	fenced, err := f.anyFenced(ctx)
	if err != nil || fenced {
		err = f.exec(ctx, false)
	}
	if err != nil {
		f.m.fenceErrors.WithLabelValues("lift").Inc()
		f.setStatus(FenceStatus{State: FencePending, Error: "lift: " + err.Error()})
		return err
	}
	if s := f.st.Load(); s.State != FenceOff {
		f.lg.Info("database fence lifted", zap.Strings("roles", f.roles), zap.String("was", string(s.State)))
	}
	f.setStatus(FenceStatus{State: FenceOff})
	return nil
}

// Run is the fence goroutine: while the fence is wanted, it sets it, then
// re-checks every retry-interval that it is still in place (a pg_rewind
// takes it away with the rewound WAL; a standby promoted by Patroni while
// this node is still PASSIVE needs it anew). While no fence is wanted it
// keeps its connection warm at the same interval (warm).
func (f *dbFence) Run(ctx context.Context, now func() time.Duration) error {
	t := time.NewTimer(f.retry)
	defer t.Stop()
	defer func() {
		f.mu.Lock()
		f.close()
		f.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			// roled stopping: its step-down asked for the fence just before;
			// one last bounded attempt, so a stopped roled leaves the
			// application's roles fenced rather than racing its own exit.
			if f.want.Load() && f.st.Load().State != FenceSet {
				fctx, cancel := context.WithTimeout(context.Background(), 2*f.tout)
				f.attempt(fctx, now)
				cancel()
			}
			return nil
		case <-f.kick:
		case <-t.C:
		}
		f.attempt(ctx, now)
		t.Stop()
		t.Reset(f.retry)
	}
}

func (f *dbFence) attempt(ctx context.Context, now func() time.Duration) {
	if !f.want.Load() {
		f.warm(ctx)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.want.Load() { // lifted meanwhile: Lift stores want before taking mu
		return
	}
	cur := *f.st.Load()
	inRec, inPlace, err := f.check(ctx)
	switch {
	case err != nil:
	case inRec:
		if cur.State != FenceStandby {
			f.setStatus(FenceStatus{State: FenceStandby})
		}
		return
	case inPlace && cur.State == FenceSet:
		return
	default:
		var n int64
		if n, err = f.set(ctx); err == nil {
			took := now() - time.Duration(f.wantAt.Load())
			f.m.fenceSetSeconds.Set(took.Seconds())
			f.setStatus(FenceStatus{State: FenceSet, SetAfterSeconds: took.Seconds(), SessionsTerminated: n})
			f.lg.Warn("database fence set: the application's roles are read-only here",
				zap.Strings("roles", f.roles), zap.Duration("after", took), zap.Int64("sessions_terminated", n))
			return
		}
	}
	if ctx.Err() != nil {
		return
	}
	f.m.fenceErrors.WithLabelValues("set").Inc()
	cur.Attempts++
	if cur.State != FencePending {
		cur = FenceStatus{State: FencePending, Attempts: 1}
		f.lg.Warn("cannot set the database fence yet (retrying)", zap.Error(err))
	}
	cur.Error = err.Error()
	f.setStatus(cur)
}

// warm keeps the connection open and the lift's query prepared while no
// fence is wanted, so that the next Lift, which the transition to ACTIVE
// waits for, opens no connection: in the lab one to a PostgreSQL promoted a
// moment before took 60–70 ms of the failover. A failure closes the
// connection; the next tick opens a new one.
func (f *dbFence) warm(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.want.Load() {
		_, _ = f.anyFenced(ctx)
	}
}

func (f *dbFence) setStatus(s FenceStatus) {
	s.Roles = f.roles
	if old := f.st.Load(); old.State == s.State && !old.Since.IsZero() {
		s.Since = old.Since
	} else {
		s.Since = time.Now().UTC()
	}
	f.st.Store(&s)
}

// Status is the fence as last known.
func (f *dbFence) Status() FenceStatus { return *f.st.Load() }

func (f *dbFence) connect(ctx context.Context) error {
	if f.conn != nil && !f.conn.IsClosed() {
		return nil
	}
	c, err := pgx.ConnectConfig(ctx, f.cfg)
	if err != nil {
		return fmt.Errorf("postgres connect: %w", err)
	}
	f.conn = c
	return nil
}

// check says whether the local PostgreSQL is in recovery and whether every
// listed role that exists is already read-only by default.
func (f *dbFence) check(ctx context.Context) (inRec, inPlace bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, f.tout)
	defer cancel()
	if err = f.connect(ctx); err != nil {
		return
	}
	const q = `SELECT pg_is_in_recovery(),
	  (SELECT count(*) FROM pg_roles WHERE rolname = ANY($1)) =
	  (SELECT count(*) FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole
	    WHERE s.setdatabase = 0 AND r.rolname = ANY($1) AND 'default_transaction_read_only=on' = ANY(s.setconfig))`
	if err = f.conn.QueryRow(ctx, q, f.roles).Scan(&inRec, &inPlace); err != nil {
		f.close()
		err = fmt.Errorf("fence check: %w", err)
	}
	return
}

// anyFenced says whether any listed role is read-only by default (fenced
// by this node or by the old primary whose setting replicated here).
func (f *dbFence) anyFenced(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, f.tout)
	defer cancel()
	if err := f.connect(ctx); err != nil {
		return false, err
	}
	const q = `SELECT EXISTS (SELECT 1 FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole
	  WHERE s.setdatabase = 0 AND r.rolname = ANY($1) AND 'default_transaction_read_only=on' = ANY(s.setconfig))`
	var fenced bool
	if err := f.conn.QueryRow(ctx, q, f.roles).Scan(&fenced); err != nil {
		f.close()
		return false, fmt.Errorf("fence check: %w", err)
	}
	return fenced, nil
}

// set fences the roles that exist and terminates their sessions.
func (f *dbFence) set(ctx context.Context) (int64, error) {
	if err := f.exec(ctx, true); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, f.tout)
	defer cancel()
	var n int64
	err := f.conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
	  WHERE usename = ANY($1) AND pid <> pg_backend_pid()`, f.roles).Scan(&n)
	if err != nil {
		f.close()
		return 0, fmt.Errorf("fence terminate sessions: %w", err)
	}
	return n, nil
}

// exec sets (on) or resets the roles' default_transaction_read_only in one
// transaction at synchronous_commit = local. Roles that do not exist are
// skipped: the list may name a role created later by the application.
func (f *dbFence) exec(ctx context.Context, on bool) error {
	ctx, cancel := context.WithTimeout(ctx, f.tout)
	defer cancel()
	if err := f.connect(ctx); err != nil {
		return err
	}
	stmt := "RESET default_transaction_read_only"
	if on {
		stmt = "SET default_transaction_read_only = on"
	}
	err := pgx.BeginFunc(ctx, f.conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = local"); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "SELECT rolname FROM pg_roles WHERE rolname = ANY($1)", f.roles)
		if err != nil {
			return err
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, r := range names {
			if _, err := tx.Exec(ctx, "ALTER ROLE "+pgx.Identifier{r}.Sanitize()+" "+stmt); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		f.close()
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("fence: postgres did not answer within postgres.timeout: %w", err)
		}
		return fmt.Errorf("fence: %w", err)
	}
	return nil
}

func (f *dbFence) close() {
	if f.conn != nil {
		closeConn(f.conn)
		f.conn = nil
	}
}
