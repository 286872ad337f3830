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
// <prefix>history/<epoch> once it serves 200 (hapairctl history prints them).
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
}

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
	goneAt time.Time // zero while the key exists
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

// recordHistory writes the event for epoch and keeps the newest
// history.keep events. It runs after 200 is served, off the state loop: a
// slow etcd must not delay anything that matters for the role.
func (d *Daemon) recordHistory(ctx context.Context, epoch int64, served time.Time, prev *activeSeen) {
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
	if prev != nil && prev.epoch == epoch {
		prev = nil
	}
	ev := buildEvent(d.cfg.Node, epoch, served, prev, rel)
	b, _ := json.Marshal(ev)
	if _, err := d.cli.Put(ctx, historyKey(p, epoch), string(b)); err != nil {
		d.lg.Warn("cannot record the role change in the history", zap.Error(err))
		return
	}
	if ev.Kind != KindFirst && ev.GapSeconds > 0 {
		d.m.failoverDuration.WithLabelValues(string(ev.Kind)).Observe(ev.GapSeconds)
	}
	d.lg.Info("role change recorded", zap.String("kind", string(ev.Kind)), zap.String("from", ev.From),
		zap.Float64("gap_seconds", ev.GapSeconds))
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

// historyJob is a role change for historyLoop to record.
type historyJob struct {
	epoch  int64
	served time.Time
	prev   *activeSeen
}

// historyLoop records the role changes the state loop hands it, until ctx
// ends. A full queue drops the event (logged): history is not worth a stall.
func (d *Daemon) historyLoop(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case j := <-d.histq:
			d.recordHistory(ctx, j.epoch, j.served, j.prev)
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
