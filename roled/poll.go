package roled

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
)

// pollLoop asks Patroni (GET /primary) and then PostgreSQL
// (pg_is_in_recovery()) every poll-interval, at once when the leader key
// changes, and every fast-poll-interval while the node is about to become
// ACTIVE. The two results are published together. While the node holds the
// active key, PostgreSQL alone is also re-checked every
// postgres.active-interval (see recheckPostgres).
func (d *Daemon) pollLoop(ctx context.Context) error {
	t := time.NewTimer(0)
	defer t.Stop()
	pg := time.NewTicker(d.cfg.Postgres.ActiveInterval)
	defer pg.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-pg.C:
			if d.holding.Load() {
				d.recheckPostgres(ctx)
			}
			continue
		case <-t.C:
		case <-d.pollNow:
		}
		d.pollOnce(ctx)
		t.Stop()
		next := d.cfg.Patroni.PollInterval
		if d.eager.Load() {
			next = d.cfg.Patroni.FastPollInterval
		}
		t.Reset(next)
	}
}

func (d *Daemon) pollOnce(ctx context.Context) {
	lv := &localView{}
	start := time.Now()
	code, st, err := d.patroni.Primary(ctx)
	d.m.patroniDuration.Observe(time.Since(start).Seconds())
	if ctx.Err() != nil {
		return
	}
	lv.status = st
	lv.patroni = PatroniView{Code: code, Role: st.Role, State: st.State}
	if err == nil {
		d.notePatroniRelease(st.Patroni.Version)
	}
	if err != nil {
		lv.patroni.Err = err.Error()
		lv.patroni.Garbage = errors.Is(err, errGarbage)
		kind := "unreachable"
		if lv.patroni.Garbage {
			kind = "garbage"
		}
		d.m.patroniErrors.WithLabelValues(kind).Inc()
	}
	lv.postgres = d.checkPostgres(ctx)
	lv.wal = d.checkWAL(ctx, lv.postgres)
	lv.patroni.At = d.now()
	old := d.localView.Swap(lv)
	d.logLocalChange(old, lv)
	nudge(d.wake)
	d.evaluateReadiness(ctx, lv)
}

// recheckPostgres publishes a fresh PostgreSQL result beside the last
// Patroni answer, and wakes the state loop only when the result changed: a
// primary that stops accepting connections, or enters recovery, must end
// ACTIVE now, not at the next Patroni poll.
func (d *Daemon) recheckPostgres(ctx context.Context) {
	if d.pg == nil {
		return
	}
	pv := d.checkPostgres(ctx)
	if ctx.Err() != nil {
		return
	}
	cur := d.localView.Load()
	if cur == nil || cur.postgres == pv {
		return
	}
	lv := *cur
	lv.postgres = pv
	d.localView.Store(&lv)
	d.logLocalChange(cur, &lv)
	nudge(d.wake)
}

func (d *Daemon) checkPostgres(ctx context.Context) PostgresView {
	if d.pg == nil {
		return PostgresView{Disabled: true}
	}
	rec, err := d.pg.InRecovery(ctx)
	if err != nil {
		d.m.postgresErrors.Inc()
		return PostgresView{Err: err.Error(), Code: sqlState(err)}
	}
	return PostgresView{InRecovery: rec}
}

// logLocalChange logs only changes, never every poll.
func (d *Daemon) logLocalChange(old, cur *localView) {
	o, c := old.patroni, cur.patroni
	if o.Primary() != c.Primary() || (o.Err == "") != (c.Err == "") || o.Role != c.Role {
		d.lg.Info("patroni view changed", zap.String("role", c.Role), zap.String("state", c.State),
			zap.Int("code", c.Code), zap.Bool("primary", c.Primary()), zap.String("error", c.Err))
	}
	op, cp := old.postgres, cur.postgres
	if (op.Err == "") != (cp.Err == "") || op.InRecovery != cp.InRecovery {
		d.lg.Info("postgres view changed", zap.Bool("in_recovery", cp.InRecovery), zap.String("error", cp.Err))
	}
}
