package roled

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// The rewind hold keeps the other node's data while a takeover alarm is held
// for a person. After Patroni 3.0.2's overwrite of the leader key, the node
// whose key was taken is demoted at once and, 2.6–3.6 s later (read in the
// soaks' Patroni logs), runs pg_rewind from the taker, which throws away
// what it wrote as ACTIVE: by the time a person looks at the alarm, that data
// is gone. So while an alarm naming this node is held (the guard could not
// prove that nothing is lost, takeover_proof.go), roled makes Patroni's
// rewind user unable to log in to this node's PostgreSQL:
//
//	ALTER ROLE <rewind-role> NOLOGIN; pg_terminate_backend(<its sessions>)
//
// Patroni on the other node then cannot check the taker's checkpoint before
// the rewind ("Can not use … for rewind"), leaves its PostgreSQL stopped
// with its data directory as it was, and retries every loop. When the alarm
// is acknowledged (the person keeps this node) or cleared (the leader key
// was re-created: the person gave it back to the other node), the role can
// log in again and the rewind goes ahead. Whenever no alarm holds this node,
// the goroutine makes sure the role can log in, so a roled restarted in the
// middle never leaves the rewind user locked out.

// RewindHoldState is the rewind hold's state.
type RewindHoldState string

// The rewind hold states.
const (
	RewindHoldOff     RewindHoldState = "off"     // not wanted; the rewind user can log in
	RewindHoldSet     RewindHoldState = "set"     // the rewind user cannot log in here
	RewindHoldPending RewindHoldState = "pending" // a change is wanted, not done yet (retrying)
	RewindHoldStandby RewindHoldState = "standby" // the local PostgreSQL is in recovery: nothing to change here
)

// RewindHoldStatus is the hold in /role.
type RewindHoldStatus struct {
	State RewindHoldState `json:"state"`
	Role  string          `json:"role"`
	Want  bool            `json:"want"`
	Since time.Time       `json:"since"`
	Error string          `json:"error,omitempty"`
}

type rewindHold struct {
	cfg   *pgx.ConnConfig
	role  string
	retry time.Duration
	tout  time.Duration
	lg    *zap.Logger

	want atomic.Bool
	kick chan struct{}
	st   atomic.Pointer[RewindHoldStatus]
	conn *pgx.Conn // owned by Run
}

func newRewindHold(dsn, role string, retry, timeout time.Duration, lg *zap.Logger) (*rewindHold, error) {
	cc, err := pgConnConfig(dsn, "hapair-roled-rewind-hold", timeout)
	if err != nil {
		return nil, err
	}
	h := &rewindHold{cfg: cc, role: role, retry: retry, tout: timeout, lg: lg, kick: make(chan struct{}, 1)}
	h.st.Store(&RewindHoldStatus{State: RewindHoldPending, Role: role, Since: time.Now().UTC()})
	return h, nil
}

// Set says whether the hold is wanted (a takeover alarm naming this node is
// held for a person). It returns at once.
func (h *rewindHold) Set(want bool) {
	if h.want.Swap(want) != want {
		nudge(h.kick)
	}
}

// Status is the hold as last known.
func (h *rewindHold) Status() RewindHoldStatus { return *h.st.Load() }

// Run applies the wanted state at once on a change and re-checks it every
// retry interval while the hold is wanted (a PostgreSQL promoted or
// restarted meanwhile) or a change could not be made yet.
func (h *rewindHold) Run(ctx context.Context) error {
	defer func() {
		if h.conn != nil {
			closeConn(h.conn)
		}
	}()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-h.kick:
		case <-t.C:
		}
		h.attempt(ctx)
		t.Stop()
		if s := h.st.Load(); s.Want || s.State == RewindHoldPending {
			t.Reset(h.retry)
		}
	}
}

func (h *rewindHold) attempt(ctx context.Context) {
	want := h.want.Load()
	state, err := h.apply(ctx, want)
	if err != nil {
		if h.conn != nil {
			closeConn(h.conn)
			h.conn = nil
		}
		state = RewindHoldPending
	}
	old := h.st.Load()
	s := RewindHoldStatus{State: state, Role: h.role, Want: want, Since: old.Since}
	if err != nil {
		s.Error = err.Error()
	}
	if old.State != s.State || old.Want != s.Want {
		s.Since = time.Now().UTC()
		switch {
		case state == RewindHoldSet:
			h.lg.Warn("rewind hold set: Patroni's rewind user cannot log in here while the takeover alarm is held, so the other node keeps its data",
				zap.String("role", h.role))
		case state == RewindHoldOff && old.State == RewindHoldSet:
			h.lg.Info("rewind hold lifted: the rewind user can log in again", zap.String("role", h.role))
		case err != nil:
			h.lg.Warn("rewind hold: cannot apply yet (retrying)", zap.Bool("want", want), zap.Error(err))
		}
	}
	h.st.Store(&s)
}

// apply makes the role's LOGIN match !want on a primary and, when holding,
// ends its sessions; on a standby there is nothing to change (and nothing
// to rewind from).
func (h *rewindHold) apply(ctx context.Context, want bool) (RewindHoldState, error) {
	ctx, cancel := context.WithTimeout(ctx, h.tout)
	defer cancel()
	if h.conn == nil || h.conn.IsClosed() {
		c, err := pgx.ConnectConfig(ctx, h.cfg)
		if err != nil {
			return "", fmt.Errorf("postgres connect: %w", err)
		}
		h.conn = c
	}
	var inRec bool
	var canLogin *bool
	if err := h.conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), (SELECT rolcanlogin FROM pg_roles WHERE rolname = $1)`,
		h.role).Scan(&inRec, &canLogin); err != nil {
		return "", fmt.Errorf("rewind hold check: %w", err)
	}
	switch {
	case canLogin == nil:
		return "", fmt.Errorf("role %q does not exist (postgres.fence.rewind-role)", h.role)
	case inRec:
		return RewindHoldStandby, nil
	case *canLogin == want:
		opt := "LOGIN"
		if want {
			opt = "NOLOGIN"
		}
		// synchronous_commit = local: this primary may have no standby.
		err := pgx.BeginFunc(ctx, h.conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = local"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "ALTER ROLE "+pgx.Identifier{h.role}.Sanitize()+" "+opt)
			return err
		})
		if err != nil {
			return "", fmt.Errorf("rewind hold: ALTER ROLE %s: %w", opt, err)
		}
	}
	if !want {
		return RewindHoldOff, nil
	}
	if _, err := h.conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
	  WHERE usename = $1 AND pid <> pg_backend_pid()`, h.role); err != nil {
		return "", fmt.Errorf("rewind hold: end the rewind user's sessions: %w", err)
	}
	return RewindHoldSet, nil
}
