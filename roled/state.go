package roled

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

var (
	errFenced = errors.New("roled: lease gone or local deadline passed")
	errStale  = errors.New("roled: leader key or alarm changed since read")
	errHeld   = errors.New("roled: active key held by another lease")
)

// loopState is owned by the state goroutine alone.
type loopState struct {
	role        Role
	epoch       int64         // CreateRevision of our active key, 0 if none
	leaseID     int64         // lease our active key was created on
	retryAt     time.Duration // no ACTIVE attempt before this (hook or acquire failure)
	retryReason Reason
	backoff     time.Duration // current on-active failure backoff
	nextRelease time.Duration // rate limit of stale-key releases
	lastReason  Reason
	leaderRev   int64         // leader key ModRevision last seen
	eagerUntil  time.Duration // fast Patroni polling until then
}

// eagerWindow is how long after a leader key change that names this member
// Patroni is polled fast (PostgreSQL finishing its promotion).
const eagerWindow = 10 * time.Second

// stateLoop is the only goroutine that changes the role. It re-decides on
// every nudge (new lease, etcd view, Patroni answer) and at the instants the
// decision can change by itself (local deadline, staleness, retry). It stops
// when ctx is done, stepping down first; I/O for the step-down uses workCtx,
// which stays alive until the state loop has returned.
func (d *Daemon) stateLoop(ctx, workCtx context.Context) error {
	if err := removeMarker(d.cfg.Marker.Path); err != nil {
		d.lg.Warn("cannot remove stale marker at start", zap.Error(err))
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			d.stepDown(workCtx)
			return nil
		case <-d.wake:
		case <-t.C:
		}
		d.loopBeat.Store(int64(d.now()))
		d.step(ctx, workCtx)
		t.Stop()
		t.Reset(d.nextWake())
	}
}

// observe gathers the latest published results into an Observation.
func (d *Daemon) observe() Observation {
	l, ev, lv := d.lease.Load(), d.etcdView.Load(), d.localView.Load()
	o := Observation{
		LeaseID: l.id, Deadline: l.deadline,
		EtcdOKAt: time.Duration(d.etcdOK.Load()), QuorumLossAfter: d.cfg.QuorumLossAfter,
		EtcdAt: ev.at, Leader: ev.leader, Active: ev.active, ActiveNode: ev.activeNode,
		TakeoverFor:       ev.takeoverBlocks(d.cfg.member()),
		TakeoverUnchecked: ev.unchecked != "" && ev.unchecked == d.cfg.member(),
		StepDown:          ev.stepDown,
		Patroni:           lv.patroni, Postgres: lv.postgres,
		Commits: *d.commits.Load(), HoldOnHungCommits: d.cfg.Durability == DurabilitySyncStrict,
		Member: d.cfg.member(), Node: d.cfg.Node, Epoch: d.ls.epoch,
		HookBackoffUntil: d.ls.retryAt,
		MaxEtcdAge:       d.cfg.LeaseTTL - d.cfg.SafetyMargin,
		MaxPatroniAge:    d.cfg.Patroni.PollInterval + d.cfg.Patroni.Timeout + d.cfg.Postgres.Timeout + 500*time.Millisecond,
	}
	if d.ls.epoch != 0 && ev.rev < d.ls.epoch {
		// The view was read before our own key was created: it cannot show it.
		o.Active = KeyView{Exists: true, CreateRev: d.ls.epoch, ModRev: d.ls.epoch, Version: 1, Lease: d.ls.leaseID}
		o.ActiveNode = d.cfg.Node
	}
	return o
}

func (d *Daemon) step(ctx, workCtx context.Context) {
	o := d.observe()
	next, reason := decide(d.ls.role, o, d.now())
	now := d.now()
	if o.Leader.ModRev != d.ls.leaderRev {
		d.ls.leaderRev = o.Leader.ModRev
		d.ls.eagerUntil = now + eagerWindow
	}
	d.eager.Store(d.ls.role == RolePassive && o.Leader.Exists && o.Leader.Value == o.Member && now < d.ls.eagerUntil)
	switch {
	case d.ls.role == RolePassive && next == RoleActive:
		d.becomeActive(ctx, workCtx, o)
	case d.ls.role == RoleActive && next == RolePassive:
		d.becomePassive(workCtx, reason)
	case next == RolePassive:
		if reason == ReasonHookBackoff && d.ls.retryReason != "" {
			reason = d.ls.retryReason
		}
		d.tidyPassive(workCtx, o, reason)
	}
}

// tidyPassive keeps a PASSIVE node's etcd state clean: an active key still on
// our lease (a release that failed, or an acquire whose answer was lost) is
// deleted, so the peer is not kept waiting for a TTL.
func (d *Daemon) tidyPassive(ctx context.Context, o Observation, reason Reason) {
	if reason != d.ls.lastReason {
		d.ls.lastReason = reason
		s := *d.snap.Load()
		s.reason = reason
		d.snap.Store(&s)
		d.lg.Info("passive", zap.String("reason", string(reason)))
	}
	ours := o.LeaseID != 0 && o.Active.Exists && o.Active.Lease == o.LeaseID
	if !ours {
		d.holding.Store(false)
		return
	}
	now := d.now()
	if now < d.ls.nextRelease {
		return
	}
	d.ls.nextRelease = now + 500*time.Millisecond
	if err := d.release(ctx, o.Active.CreateRev, nil); err != nil {
		d.lg.Warn("cannot release leftover active key", zap.Int64("epoch", o.Active.CreateRev), zap.Error(err))
		return
	}
	d.holding.Store(false)
}

// becomeActive follows DESIGN.md's order: acquire key, on_active, marker,
// 200, sender. The deadline is checked before each ACTIVE-only step.
func (d *Daemon) becomeActive(ctx, workCtx context.Context, o Observation) {
	prev := d.hist.last() // the holder before us, before our own key shows
	wasReady, _ := d.readiness()
	readyAt := time.Now().UTC()
	d.holding.Store(true)
	// Each step's time goes in the "role changed" line: the failover's
	// share that is roled's, step by step (package budget counts it).
	took := stepTimes{last: time.Now()}
	epoch, err := d.acquire(ctx, o)
	took.lap("acquire")
	if err != nil {
		d.holding.Store(false)
		reason := ReasonAcquireFailed
		if errors.Is(err, errHeld) {
			reason = ReasonActiveHeld
		}
		d.retry(200*time.Millisecond, reason)
		d.lg.Info("cannot take the active key", zap.Error(err))
		nudge(d.readNow)
		return
	}
	d.ls.epoch, d.ls.leaseID = epoch, o.LeaseID
	d.lg.Info("active key taken", zap.Int64("epoch", epoch))
	// Lift the database fence with the new epoch held: whoever set it (this
	// node when it left ACTIVE, or the old primary whose setting replicated
	// here), the application's roles may write again.
	if d.fence != nil {
		if err := d.fence.Lift(ctx); err != nil {
			d.lg.Warn("cannot lift the database fence", zap.Error(err))
			d.failActive(workCtx, epoch, ReasonFenceLift)
			return
		}
		took.lap("fence_lift")
	}
	if !d.runHook(ctx, "on_active", d.cfg.Hooks.OnActive, RoleActive, epoch, ReasonPrimary) {
		d.failActive(workCtx, epoch, ReasonHookFailed)
		return
	}
	took.lap("on_active")
	// The hook may have taken a while: decide again on fresh observations.
	o2 := d.observe()
	if next, reason := decide(RoleActive, o2, d.now()); next != RoleActive {
		d.failActive(workCtx, epoch, reason)
		return
	}
	since := time.Now().UTC()
	if !d.beforeDeadline(o.LeaseID) {
		d.failActive(workCtx, epoch, ReasonDeadline)
		return
	}
	if err := writeMarker(d.cfg.Marker.Path, markerValue{Node: d.cfg.Node, Epoch: epoch, Since: since.Format(time.RFC3339Nano)}); err != nil {
		d.lg.Error("cannot write marker", zap.String("path", d.cfg.Marker.Path), zap.Error(err))
		d.failActive(workCtx, epoch, ReasonAcquireFailed)
		return
	}
	took.lap("marker")
	if !d.beforeDeadline(o.LeaseID) {
		d.failActive(workCtx, epoch, ReasonDeadline)
		return
	}
	d.snap.Store(&snapshot{role: RoleActive, epoch: epoch, leaseID: o.LeaseID, since: since, reason: ReasonPrimary})
	d.ls.role, d.ls.lastReason, d.ls.backoff, d.ls.retryReason = RoleActive, ReasonPrimary, 0, ""
	d.m.transitions.WithLabelValues("active", string(ReasonPrimary)).Inc()
	d.lg.Info("role changed", zap.String("from", "passive"), zap.String("to", "active"),
		zap.String("reason", string(ReasonPrimary)), zap.Int64("epoch", epoch), zap.Object("took", &took))
	d.vipSync() // serve 200 → add VIP + announce → start sender
	if d.sync.SetActive != nil {
		d.sync.SetActive(epoch)
	}
	d.queueHistory(historyJob{epoch: epoch, served: since, prev: prev, wasReady: wasReady, readyAt: readyAt})
	nudge(d.beatNow)
}

// failActive undoes a half-made ACTIVE (the node never served 200): marker
// off, key released, on_passive, and a backoff before the next attempt.
func (d *Daemon) failActive(ctx context.Context, epoch int64, reason Reason) {
	d.lg.Warn("not becoming active", zap.String("reason", string(reason)), zap.Int64("epoch", epoch))
	if err := removeMarker(d.cfg.Marker.Path); err != nil {
		d.lg.Error("cannot remove marker", zap.Error(err))
	}
	d.ls.epoch = 0
	if d.fence != nil {
		d.fence.Want(d.now()) // it may have been lifted for this attempt
	}
	if err := d.release(ctx, epoch, nil); err != nil {
		d.lg.Warn("cannot release active key", zap.Int64("epoch", epoch), zap.Error(err))
	} else {
		d.holding.Store(false)
	}
	d.runHook(ctx, "on_passive", d.cfg.Hooks.OnPassive, RolePassive, 0, reason)
	if reason == ReasonHookFailed {
		b := d.ls.backoff * 2
		if b == 0 {
			b = d.cfg.Hooks.FailureBackoff
		}
		d.ls.backoff = min(b, d.cfg.Hooks.FailureBackoffMax)
		d.retry(d.ls.backoff, reason)
	} else {
		d.retry(200*time.Millisecond, reason)
	}
	d.m.transitions.WithLabelValues("passive", string(reason)).Inc()
}

func (d *Daemon) retry(after time.Duration, reason Reason) {
	d.ls.retryAt = d.now() + after
	d.ls.retryReason = reason
}

// becomePassive follows DESIGN.md's order: 503, stop sender, marker off,
// release key, on_passive.
func (d *Daemon) becomePassive(ctx context.Context, reason Reason) {
	epoch := d.ls.epoch
	d.snap.Store(&snapshot{role: RolePassive, since: time.Now().UTC(), reason: reason})
	d.ls.role, d.ls.epoch, d.ls.lastReason = RolePassive, 0, reason
	d.lg.Info("role changed", zap.String("from", "active"), zap.String("to", "passive"),
		zap.String("reason", string(reason)), zap.Int64("epoch", epoch))
	d.vipSync() // serve 503 → remove VIP, before the key is released
	if d.fence != nil {
		d.fence.Want(d.now()) // the fence goroutine sets it: never waits here
	}
	if d.sync.SetPassive != nil {
		d.sync.SetPassive()
	}
	if err := removeMarker(d.cfg.Marker.Path); err != nil {
		d.lg.Error("cannot remove marker", zap.String("path", d.cfg.Marker.Path), zap.Error(err))
	}
	if err := d.release(ctx, epoch, &releaseRecord{Node: d.cfg.Node, Epoch: epoch, At: time.Now().UTC(),
		Reason: string(reason), StepDown: d.etcdView.Load().stepDown}); err != nil {
		d.lg.Warn("cannot release active key (retrying while passive)", zap.Int64("epoch", epoch), zap.Error(err))
	} else {
		d.holding.Store(false)
	}
	d.runHook(ctx, "on_passive", d.cfg.Hooks.OnPassive, RolePassive, epoch, reason)
	d.m.transitions.WithLabelValues("passive", string(reason)).Inc()
	nudge(d.beatNow)
}

// stepDown is the graceful stop: an ACTIVE node serves 503 and releases the
// key before Run returns; a PASSIVE one drops a leftover key.
func (d *Daemon) stepDown(ctx context.Context) {
	if d.ls.role == RoleActive {
		d.becomePassive(ctx, ReasonStopping)
		return
	}
	d.ls.nextRelease = 0
	d.tidyPassive(ctx, d.observe(), ReasonStopping)
}

func (d *Daemon) beforeDeadline(leaseID int64) bool {
	l := d.lease.Load()
	return l.id != 0 && l.id == leaseID && d.now() < l.deadline
}

// acquire creates the active key on our lease in one transaction, only if
// Patroni's leader key still names this member at the revision we decided on
// and our takeover alarm is as we read it; or finds it already ours. It
// returns the epoch (the key's CreateRevision).
func (d *Daemon) acquire(ctx context.Context, o Observation) (int64, error) {
	l := d.lease.Load()
	now := d.now()
	if l.id == 0 || l.id != o.LeaseID || now >= l.deadline {
		return 0, errFenced
	}
	tctx, cancel := context.WithTimeout(ctx, min(time.Second, l.deadline-now))
	defer cancel()
	val, _ := json.Marshal(activeValue{Node: d.cfg.Node, Since: time.Now().UTC().Format(time.RFC3339Nano)})
	// The last-active record is written with the key, in the same
	// transaction: the takeover guard's proof (takeover_proof.go) relies on
	// no acquisition ever missing from it.
	rec, _ := json.Marshal(lastActiveValue{Node: d.cfg.Node, Member: d.cfg.member(), Kind: "acquired"})
	key, lk := d.activeKey(), d.cfg.leaderKey()
	alarm := d.alarmKey(d.cfg.member())
	resp, err := d.cli.Txn(tctx).If(
		clientv3.Compare(clientv3.Value(lk), "=", d.cfg.member()),
		clientv3.Compare(clientv3.ModRevision(lk), "=", o.Leader.ModRev),
		clientv3.Compare(clientv3.ModRevision(alarm), "=", d.etcdView.Load().alarmRev[d.cfg.member()]),
	).Then(
		clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(key, string(val), clientv3.WithLease(clientv3.LeaseID(l.id))),
				clientv3.OpPut(lastActiveKey(d.cfg.prefix(), d.cfg.Node), string(rec))}, nil),
		clientv3.OpGet(key),
	).Commit()
	if err != nil {
		return 0, fmt.Errorf("acquire txn: %w", err)
	}
	if !resp.Succeeded {
		return 0, errStale
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return 0, errors.New("roled: active key vanished inside the transaction")
	}
	if kvs[0].Lease != l.id {
		return 0, errHeld
	}
	return kvs[0].CreateRevision, nil
}

// release deletes the active key if it is still the one created at epoch. A
// planned demotion thus frees the key at once instead of after a TTL. An
// ACTIVE node that served leaves rec beside it, in the same transaction, for
// the next ACTIVE's history.
func (d *Daemon) release(ctx context.Context, epoch int64, rec *releaseRecord) error {
	if epoch == 0 {
		return nil
	}
	defer nudge(d.readNow)
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	key := d.activeKey()
	ops := []clientv3.Op{clientv3.OpDelete(key)}
	if rec != nil {
		b, _ := json.Marshal(rec)
		ops = append(ops, clientv3.OpPut(releasedKey(d.cfg.prefix()), string(b)))
	}
	_, err := d.cli.Txn(tctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", epoch)).
		Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("release txn: %w", err)
	}
	return nil
}

// nextWake is when the decision may change without any event: the local
// deadline and the staleness limits while ACTIVE, a retry time, else 1 s.
func (d *Daemon) nextWake() time.Duration {
	now := d.now()
	w := now + time.Second
	if d.ls.role == RoleActive {
		o := d.observe()
		w = min(w, o.Deadline, o.EtcdAt+o.MaxEtcdAge, o.Patroni.At+o.MaxPatroniAge)
		if o.QuorumLossAfter > 0 {
			w = min(w, o.EtcdOKAt+o.QuorumLossAfter)
		}
	}
	if d.ls.retryAt > now {
		w = min(w, d.ls.retryAt)
	}
	return max(w-now, time.Millisecond)
}

// stepTimes are the durations of becomeActive's steps, in order.
type stepTimes struct {
	last  time.Time
	steps []string
	durs  []time.Duration
}

// lap ends step name, begun at the previous lap (or at last's first value).
func (s *stepTimes) lap(name string) {
	now := time.Now()
	s.steps, s.durs = append(s.steps, name), append(s.durs, now.Sub(s.last))
	s.last = now
}

// MarshalLogObject logs each step's duration.
func (s *stepTimes) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	for i, n := range s.steps {
		enc.AddDuration(n, s.durs[i])
	}
	return nil
}
