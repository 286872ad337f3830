package roled

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// HistoryKind says how the ACTIVE role moved to a new node.
type HistoryKind string

const (
	// KindSwitchover: the old ACTIVE released the key itself, asked to step
	// down (hapairctl switchover).
	KindSwitchover HistoryKind = "switchover"
	// KindDemotion: the old ACTIVE released the key itself without being
	// asked (its Patroni or PostgreSQL stopped being primary: a switchover by
	// other means, a Patroni failover it lived through).
	KindDemotion HistoryKind = "demotion"
	// KindFailover: the old ACTIVE never released the key; it went with its
	// lease (node dead, cut off, paused).
	KindFailover HistoryKind = "failover"
	// KindFirst: no ACTIVE node was seen before this one.
	KindFirst HistoryKind = "first"
)

// HistoryEvent is one role change, written by the new ACTIVE's roled under
// <prefix>history/<epoch> once it serves 200, and updated by it as the
// figures come in: WAL lost once the new primary's Patroni has written its
// timeline history, files quarantined and time to redundancy once the
// standby is ready (hapairctl history prints them).
type HistoryEvent struct {
	Kind      HistoryKind `json:"kind"`
	From      string      `json:"from,omitempty"`
	FromEpoch int64       `json:"from_epoch,omitempty"`
	To        string      `json:"to"`
	Epoch     int64       `json:"epoch"`
	// OldStopped: the old ACTIVE's own release time (switchover, demotion),
	// or when this node saw its key go (failover: it had stopped serving by
	// then, at its local deadline at the latest).
	OldStopped time.Time `json:"old_stopped,omitzero"`
	Served     time.Time `json:"served"`
	// GapSeconds is Served − OldStopped: how long no node was ACTIVE.
	GapSeconds float64 `json:"gap_seconds,omitempty"`
	Reason     string  `json:"old_reason,omitempty"` // why the old ACTIVE let go, as it said

	// WALLostBytes: WAL the old ACTIVE had beyond the point where its
	// timeline ends on the new primary (a lower bound, see WALPosition);
	// nil while not known. WAL says how it was found.
	WALLostBytes *int64  `json:"wal_lost_bytes,omitempty"`
	WAL          WALLoss `json:"wal_loss,omitzero"`
	// QuarantinedFiles: files the returning node's sync moved to its
	// quarantine under this epoch (written there in the old term and never
	// delivered), as its heartbeat lists them (at most the newest 100);
	// nil until the standby's heartbeat was read.
	QuarantinedFiles *int64 `json:"quarantined_files,omitempty"`

	// Time to redundancy: when the standby first reported ready after
	// Served (its own readiness time), and its recovery split by phase.
	Redundancy        RedundancyOutcome `json:"redundancy,omitempty"`
	RedundantAt       time.Time         `json:"redundant_at,omitzero"`
	RedundancySeconds float64           `json:"redundancy_seconds,omitempty"` // RedundantAt − Served
	Standby           string            `json:"standby,omitempty"`
	StandbyRecovery   *StandbyRecovery  `json:"standby_recovery,omitempty"`
	RedundancyNote    string            `json:"redundancy_note,omitempty"`
}

// RedundancyOutcome says how the wait for a ready standby after a role
// change ended.
type RedundancyOutcome string

// The outcomes.
const (
	RedundancyWaiting    RedundancyOutcome = "waiting"       // no standby ready yet
	RedundancyReached    RedundancyOutcome = "redundant"     // RedundantAt is set
	RedundancyNotReached RedundancyOutcome = "not_redundant" // none ready within history.redundancy-timeout
	RedundancySuperseded RedundancyOutcome = "superseded"    // a newer role change came first
)

// releaseRecord is what an ACTIVE node leaves when it gives the key back,
// in the same transaction as the delete, for the next ACTIVE's history.
type releaseRecord struct {
	Node     string    `json:"node"`
	Epoch    int64     `json:"epoch"`
	At       time.Time `json:"at"`
	Reason   string    `json:"reason"`
	StepDown bool      `json:"step_down"`
}

// activeSeen is the last ACTIVE holder this node saw, and when its key went.
type activeSeen struct {
	node   string
	epoch  int64
	goneAt time.Time    // zero while the key exists
	wal    *WALPosition // its last published WAL end (heartbeat), nil if none seen
}

// HistoryPrefix is where the failover history lives.
func HistoryPrefix(prefix string) string { return prefix + "history/" }

func releasedKey(prefix string) string { return prefix + "released" }

// historyKey sorts by epoch (zero-padded), so a prefix listing is in order.
func historyKey(prefix string, epoch int64) string {
	return fmt.Sprintf("%s%020d", HistoryPrefix(prefix), epoch)
}

// buildEvent is the pure part: the event for this node's new epoch from the
// last holder it saw and the release record (either may be missing).
func buildEvent(node string, epoch int64, served time.Time, prev *activeSeen, rel *releaseRecord) HistoryEvent {
	ev := HistoryEvent{Kind: KindFirst, To: node, Epoch: epoch, Served: served}
	switch {
	case rel != nil && rel.Epoch < epoch && (prev == nil || rel.Epoch >= prev.epoch):
		// The newest release is the last holder's own word.
		ev.From, ev.FromEpoch, ev.OldStopped, ev.Reason = rel.Node, rel.Epoch, rel.At, rel.Reason
		ev.Kind = KindDemotion
		if rel.StepDown {
			ev.Kind = KindSwitchover
		}
	case prev != nil && prev.epoch < epoch:
		ev.Kind, ev.From, ev.FromEpoch, ev.OldStopped = KindFailover, prev.node, prev.epoch, prev.goneAt
	}
	if !ev.OldStopped.IsZero() {
		ev.GapSeconds = served.Sub(ev.OldStopped).Seconds()
	}
	return ev
}

// history keeps what the etcd goroutine saw of the active key, for the state
// goroutine's next ACTIVE.
type history struct {
	mu   sync.Mutex
	seen *activeSeen
}

func (h *history) observe(v *etcdView, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case v.active.Exists:
		if h.seen == nil || h.seen.epoch != v.active.CreateRev {
			h.seen = &activeSeen{node: v.activeNode, epoch: v.active.CreateRev}
		}
		if v.peerWAL != nil && v.peerEpoch == v.active.CreateRev {
			s := *h.seen
			s.wal = v.peerWAL
			h.seen = &s
		}
	case h.seen != nil && h.seen.goneAt.IsZero():
		s := *h.seen
		s.goneAt = at
		h.seen = &s
	}
}

// last returns the holder seen before epoch (nil if none).
func (h *history) last() *activeSeen {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen == nil {
		return nil
	}
	s := *h.seen
	return &s
}

// walHistoryWait bounds the wait for the new primary's Patroni to write the
// timeline history a failover's wal_lost_bytes needs (one HA loop, loop_wait,
// after the promotion; a minute is generous).
const walHistoryWait = time.Minute

// followInterval is how often a pending event's figures are looked for: the
// figures carry their own timestamps (the standby's readiness time), so the
// poll only bounds how late the event is updated, not what it says.
const followInterval = time.Second

// pendingEvent is the newest event this node recorded, while its figures
// are still coming in; owned by historyLoop.
type pendingEvent struct {
	improved map[DivergedWAL]bool // diverged ranges already taken into older events
	key      string
	modRev   int64 // of our last write: an update never clobbers another writer's
	ev       HistoryEvent
	prev     *activeSeen
	walDue   bool // WAL loss not final yet
}

// peerBeat is the part of another node's heartbeat the history reads.
type peerBeat struct {
	Node      string    `json:"node"`
	Role      string    `json:"role"`
	Epoch     int64     `json:"epoch"`
	Updated   time.Time `json:"updated"`
	Readiness Readiness `json:"readiness"`
	Sync      *struct {
		Quarantined []struct {
			Epoch int64 `json:"epoch"`
		} `json:"quarantined"`
	} `json:"sync"`
}

// parsePeerWAL reads the epoch and WAL end of an ACTIVE peer's heartbeat.
func parsePeerWAL(b []byte) (int64, *WALPosition) {
	var hb struct {
		Epoch int64        `json:"epoch"`
		WAL   *WALPosition `json:"wal"`
	}
	if json.Unmarshal(b, &hb) != nil {
		return 0, nil
	}
	return hb.Epoch, hb.WAL
}

// walPosition is the WAL end to publish in the heartbeat: only while ACTIVE
// and the local Patroni reports the primary's xlog location.
func (d *Daemon) walPosition(st Status) *WALPosition {
	if st.Role != RoleActive.String() {
		return nil
	}
	lv := d.localView.Load()
	if !lv.patroni.Primary() || lv.status.Xlog.Location <= 0 {
		return nil
	}
	return &WALPosition{LSN: lv.status.Xlog.Location, Timeline: lv.status.Timeline,
		At: time.Now().UTC().Add(-(d.now() - lv.patroni.At))}
}

// followRedundancy is the pure part of the wait for a standby: the event
// updated from the other nodes' heartbeats at now, and whether the wait is
// over. A standby counts once a heartbeat it wrote after Served says ready;
// its readiness time (not ours of reading it) is RedundantAt.
func followRedundancy(ev HistoryEvent, self string, beats []peerBeat, now time.Time, bound time.Duration) (HistoryEvent, bool) {
	var notes []string
	for _, b := range beats {
		if b.Node == self {
			continue
		}
		if rec := b.Readiness.Recovery; b.Node == ev.From && rec != nil && rec.Diverged != nil && ev.Kind != KindFirst {
			if w := withDiverged(ev.WAL, *rec.Diverged); w != ev.WAL {
				ev.WAL = w
				n := w.Bytes
				ev.WALLostBytes = &n
			}
		}
		if b.Sync != nil {
			var q int64
			for _, f := range b.Sync.Quarantined {
				if f.Epoch == ev.Epoch {
					q++
				}
			}
			if ev.QuarantinedFiles == nil || q > *ev.QuarantinedFiles {
				ev.QuarantinedFiles = &q
			}
		}
		if b.Readiness.Ready && !b.Updated.Before(ev.Served) {
			at := b.Readiness.Since
			if at.Before(ev.Served) {
				at = ev.Served // ready all along (first ACTIVE after a restart of roled)
			}
			ev.Redundancy, ev.RedundantAt, ev.Standby = RedundancyReached, at, b.Node
			ev.RedundancySeconds = at.Sub(ev.Served).Seconds()
			ev.StandbyRecovery, ev.RedundancyNote = b.Readiness.Recovery, ""
			return ev, true
		}
		notes = append(notes, b.Node+": "+b.Readiness.Text())
	}
	if now.Sub(ev.Served) > bound {
		ev.Redundancy = RedundancyNotReached
		ev.RedundancyNote = fmt.Sprintf("not redundant after %s", bound)
		if len(notes) == 0 {
			ev.RedundancyNote += ": no standby heartbeat"
		} else {
			ev.RedundancyNote += ": " + strings.Join(notes, "; ")
		}
		return ev, true
	}
	return ev, false
}

// recordHistory writes the event for epoch, marks the previous event
// superseded if it still waited, and keeps the newest history.keep events.
// It runs after 200 is served, off the state loop: a slow etcd must not
// delay anything that matters for the role. It returns the event to follow
// (nil if it could not be written).
func (d *Daemon) recordHistory(ctx context.Context, j historyJob) *pendingEvent {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	p := d.cfg.prefix()
	var rel *releaseRecord
	if r, err := d.cli.Get(ctx, releasedKey(p)); err == nil && len(r.Kvs) == 1 {
		var rr releaseRecord
		if json.Unmarshal(r.Kvs[0].Value, &rr) == nil {
			rel = &rr
		}
	}
	prev := j.prev
	if prev != nil && prev.epoch == j.epoch {
		prev = nil
	}
	pe := &pendingEvent{key: historyKey(p, j.epoch), prev: prev, walDue: true,
		ev: buildEvent(d.cfg.Node, j.epoch, j.served, prev, rel)}
	pe.ev.Redundancy = RedundancyWaiting
	if pe.ev.Kind == KindFirst {
		pe.walDue = false // nothing to compare with
	} else {
		d.followWAL(ctx, pe)
	}
	d.supersede(ctx, j)
	b, _ := json.Marshal(pe.ev)
	r, err := d.cli.Put(ctx, pe.key, string(b))
	if err != nil {
		d.lg.Warn("cannot record the role change in the history", zap.Error(err))
		return nil
	}
	pe.modRev = r.Header.Revision
	ev := pe.ev
	if ev.Kind != KindFirst && ev.GapSeconds > 0 {
		d.m.failoverDuration.WithLabelValues(string(ev.Kind)).Observe(ev.GapSeconds)
	}
	d.lg.Info("role change recorded", zap.String("kind", string(ev.Kind)), zap.String("from", ev.From),
		zap.Float64("gap_seconds", ev.GapSeconds))
	d.trimHistory(ctx)
	return pe
}

// supersede ends the wait of an older event that still waits for a standby:
// this role change came first. When this node was that event's standby and
// was ready before it took over, that readiness completes the older event
// (the previous ACTIVE may have gone before it read it). Guarded by the
// ModRevision read, so the older event's own writer and this one never
// overwrite each other.
func (d *Daemon) supersede(ctx context.Context, j historyJob) {
	p, epoch := d.cfg.prefix(), j.epoch
	r, err := d.cli.Get(ctx, HistoryPrefix(p), clientv3.WithPrefix(), clientv3.WithLimit(2),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
	if err != nil {
		return
	}
	for _, kv := range r.Kvs {
		var ev HistoryEvent
		if string(kv.Key) >= historyKey(p, epoch) || json.Unmarshal(kv.Value, &ev) != nil || ev.Redundancy != RedundancyWaiting {
			continue
		}
		own := peerBeat{Node: d.cfg.Node, Updated: j.readyAt, Readiness: j.wasReady}
		if e, done := followRedundancy(ev, ev.To, []peerBeat{own}, j.served, d.cfg.History.RedundancyTimeout); done && e.Redundancy == RedundancyReached {
			ev = e
			d.redundancyDone(ev)
		} else {
			ev.Redundancy = RedundancySuperseded
			ev.RedundancyNote = fmt.Sprintf("no standby ready before the next role change (epoch %d)", epoch)
		}
		b, _ := json.Marshal(ev)
		_, _ = d.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).
			Then(clientv3.OpPut(string(kv.Key), string(b))).Commit()
	}
}

func (d *Daemon) trimHistory(ctx context.Context) {
	p := d.cfg.prefix()
	r, err := d.cli.Get(ctx, HistoryPrefix(p), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil || len(r.Kvs) <= d.cfg.History.Keep {
		return
	}
	for _, kv := range r.Kvs[:len(r.Kvs)-d.cfg.History.Keep] {
		if strings.HasPrefix(string(kv.Key), HistoryPrefix(p)) {
			_, _ = d.cli.Delete(ctx, string(kv.Key))
		}
	}
}

// followWAL tries once to settle the event's WAL loss from the local
// Patroni (the new primary): its timeline and GET /history.
func (d *Daemon) followWAL(ctx context.Context, pe *pendingEvent) {
	if pe.ev.WAL.Basis == WALReturning {
		pe.walDue = false // the returning node's own figure is better
		return
	}
	var hist []TimelineSwitch
	if h, err := d.patroni.History(ctx); err == nil {
		hist = h
	}
	tl := d.localView.Load().status.Timeline
	w, retry := walLoss(pe.ev.Kind, pe.ev.From == pe.ev.To, pe.prev.walOrNil(), tl, hist)
	if retry && time.Since(pe.ev.Served) < walHistoryWait {
		w.Basis = WALPending
		pe.ev.WAL = w
		return
	}
	if retry {
		w.Basis = WALUnknown
		w.Note += fmt.Sprintf("; gave up after %s", walHistoryWait)
	}
	pe.walDue, pe.ev.WAL = false, w
	if w.Known() {
		b := w.Bytes
		pe.ev.WALLostBytes = &b
	}
}

// improveOlder takes a node's diverged range into the newest older event
// that node was the old ACTIVE of, when the range is on that event's old
// timeline and the event has no better figure: its wait may have been
// superseded (a short role change right after the heal of a partition)
// before the returning node read its own WAL end.
func (d *Daemon) improveOlder(ctx context.Context, pe *pendingEvent, node string, dv DivergedWAL) {
	if pe.improved[dv] {
		return
	}
	if pe.improved == nil {
		pe.improved = map[DivergedWAL]bool{}
	}
	pe.improved[dv] = true
	r, err := d.cli.Get(ctx, HistoryPrefix(d.cfg.prefix()), clientv3.WithPrefix(), clientv3.WithLimit(10),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
	if err != nil {
		return
	}
	for _, kv := range r.Kvs {
		var ev HistoryEvent
		if string(kv.Key) == pe.key || json.Unmarshal(kv.Value, &ev) != nil || ev.From != node || ev.Kind == KindFirst || ev.From == ev.To {
			continue
		}
		w := withDiverged(ev.WAL, dv)
		if w == ev.WAL || ev.WAL.Basis == WALReturning {
			return
		}
		ev.WAL = w
		n := w.Bytes
		ev.WALLostBytes = &n
		b, _ := json.Marshal(ev)
		if _, err := d.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).
			Then(clientv3.OpPut(string(kv.Key), string(b))).Commit(); err == nil {
			d.lg.Info("older role change completed with the returning node's diverged WAL", zap.Int64("epoch", ev.Epoch),
				zap.String("node", node), zap.Int64("wal_lost_bytes", n))
		}
		return
	}
}

// finish observes the event's final WAL figure once its following ends.
func (d *Daemon) finish(pe *pendingEvent) {
	w := pe.ev.WAL
	if !w.Known() || pe.ev.Kind == KindFirst {
		return
	}
	d.m.failoverWALLost.WithLabelValues(string(pe.ev.Kind)).Observe(float64(w.Bytes))
	if w.Bytes > 0 {
		d.lg.Warn("role change lost WAL", zap.String("kind", string(pe.ev.Kind)), zap.Int64("wal_lost_bytes", w.Bytes),
			zap.String("basis", string(w.Basis)), zap.String("old_lsn", w.OldLSN), zap.String("switch_lsn", w.SwitchLSN),
			zap.String("returning_end", w.ReturningEnd))
	}
}

func (s *activeSeen) walOrNil() *WALPosition {
	if s == nil {
		return nil
	}
	return s.wal
}

// follow updates the pending event once; it returns false when the event
// needs no more following.
func (d *Daemon) follow(ctx context.Context, pe *pendingEvent) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	before := pe.ev
	if pe.walDue {
		d.followWAL(ctx, pe)
	}
	waiting := pe.ev.Redundancy == RedundancyWaiting
	if waiting {
		if active, epoch := d.activeNow(); !active || epoch != pe.ev.Epoch {
			// This node lost the role: the next ACTIVE records the next
			// event and marks this one superseded.
			d.write(ctx, pe, before)
			return false
		}
		r, err := d.cli.Get(ctx, d.cfg.prefix()+"nodes/", clientv3.WithPrefix())
		if err == nil {
			var beats []peerBeat
			for _, kv := range r.Kvs {
				var b peerBeat
				if json.Unmarshal(kv.Value, &b) == nil {
					beats = append(beats, b)
				}
			}
			for _, b := range beats {
				if rec := b.Readiness.Recovery; rec != nil && rec.Diverged != nil && b.Node != pe.ev.From && b.Node != d.cfg.Node {
					d.improveOlder(ctx, pe, b.Node, *rec.Diverged)
				}
			}
			var done bool
			pe.ev, done = followRedundancy(pe.ev, d.cfg.Node, beats, time.Now(), d.cfg.History.RedundancyTimeout)
			if done {
				d.redundancyDone(pe.ev)
			}
		}
	}
	ok := d.write(ctx, pe, before)
	return ok && (pe.walDue || pe.ev.Redundancy == RedundancyWaiting)
}

func (d *Daemon) redundancyDone(ev HistoryEvent) {
	if ev.Redundancy == RedundancyReached {
		d.m.failoverRedundancy.WithLabelValues(string(ev.Kind)).Observe(ev.RedundancySeconds)
		d.lg.Info("redundant again after the role change", zap.String("standby", ev.Standby),
			zap.Float64("redundancy_seconds", ev.RedundancySeconds), zap.Int64("epoch", ev.Epoch))
		return
	}
	d.m.failoverNotRedundant.Inc()
	d.lg.Warn("no standby ready after the role change", zap.String("note", ev.RedundancyNote), zap.Int64("epoch", ev.Epoch))
}

// write stores the event if it changed, only over our own last write; false
// when another writer (a newer ACTIVE marking it superseded, a trim) got
// there first.
func (d *Daemon) write(ctx context.Context, pe *pendingEvent, before HistoryEvent) bool {
	a, _ := json.Marshal(before)
	b, _ := json.Marshal(pe.ev)
	if string(a) == string(b) {
		return true
	}
	r, err := d.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(pe.key), "=", pe.modRev)).
		Then(clientv3.OpPut(pe.key, string(b))).Commit()
	if err != nil {
		pe.ev = before // try again next round
		return true
	}
	if !r.Succeeded {
		return false
	}
	pe.modRev = r.Header.Revision
	return true
}

// historyJob is a role change for historyLoop to record.
type historyJob struct {
	epoch  int64
	served time.Time
	prev   *activeSeen
	// this node's own readiness just before it took the role, and when
	// it was read (for the previous event's time to redundancy)
	wasReady Readiness
	readyAt  time.Time
}

// historyLoop records the role changes the state loop hands it and follows
// the newest until its figures are in, until ctx ends. A full queue drops
// the event (logged): history is not worth a stall.
func (d *Daemon) historyLoop(ctx context.Context) error {
	t := time.NewTicker(followInterval)
	defer t.Stop()
	var pe *pendingEvent
	for {
		select {
		case <-ctx.Done():
			return nil
		case j := <-d.histq:
			if pe != nil {
				d.finish(pe)
			}
			pe = d.recordHistory(ctx, j)
		case <-t.C:
			if pe != nil && !d.follow(ctx, pe) {
				d.finish(pe)
				pe = nil
			}
		}
	}
}

func (d *Daemon) queueHistory(j historyJob) {
	select {
	case d.histq <- j:
	default:
		d.lg.Warn("history queue full: role change not recorded", zap.Int64("epoch", j.epoch))
	}
}
