package roled

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hapair/hapair/internal/etcdtest"
)

func TestBuildEvent(t *testing.T) {
	t0 := time.Unix(1000, 0)
	served := t0.Add(1500 * time.Millisecond)
	cases := []struct {
		name string
		prev *activeSeen
		rel  *releaseRecord
		want HistoryEvent
	}{
		{"first ACTIVE", nil, nil, HistoryEvent{Kind: KindFirst, To: "B", Epoch: 20, Served: served}},
		{"key expired with its lease", &activeSeen{node: "A", epoch: 10, goneAt: t0}, nil,
			HistoryEvent{Kind: KindFailover, From: "A", FromEpoch: 10, To: "B", Epoch: 20, OldStopped: t0, Served: served, GapSeconds: 1.5}},
		{"released on a step-down request", &activeSeen{node: "A", epoch: 10, goneAt: t0.Add(time.Second)},
			&releaseRecord{Node: "A", Epoch: 10, At: t0, Reason: "step-down", StepDown: true},
			HistoryEvent{Kind: KindSwitchover, From: "A", FromEpoch: 10, To: "B", Epoch: 20, OldStopped: t0, Served: served, GapSeconds: 1.5, Reason: "step-down"}},
		{"released unasked", &activeSeen{node: "A", epoch: 10}, &releaseRecord{Node: "A", Epoch: 10, At: t0, Reason: "not-primary"},
			HistoryEvent{Kind: KindDemotion, From: "A", FromEpoch: 10, To: "B", Epoch: 20, OldStopped: t0, Served: served, GapSeconds: 1.5, Reason: "not-primary"}},
		// An old release record (epoch 5) from before the holder seen last
		// (epoch 10, which expired): the expiry is what happened.
		{"stale release record", &activeSeen{node: "A", epoch: 10, goneAt: t0}, &releaseRecord{Node: "B", Epoch: 5, At: t0.Add(-time.Hour)},
			HistoryEvent{Kind: KindFailover, From: "A", FromEpoch: 10, To: "B", Epoch: 20, OldStopped: t0, Served: served, GapSeconds: 1.5}},
		{"release record of our own later epoch ignored", nil, &releaseRecord{Node: "B", Epoch: 30, At: t0},
			HistoryEvent{Kind: KindFirst, To: "B", Epoch: 20, Served: served}},
	}
	for _, c := range cases {
		if got := buildEvent("B", 20, served, c.prev, c.rel); got != c.want {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
}

// readHistory lists the recorded events, oldest first.
func readHistory(t *testing.T, cli *clientv3.Client, prefix string) []HistoryEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := cli.Get(ctx, HistoryPrefix(prefix), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	var out []HistoryEvent
	for _, kv := range r.Kvs {
		var ev HistoryEvent
		if err := json.Unmarshal(kv.Value, &ev); err != nil {
			t.Fatalf("%s: %v", kv.Key, err)
		}
		out = append(out, ev)
	}
	return out
}

// Each role change is recorded by the new ACTIVE: the first one, a demotion
// seen by the old ACTIVE, a switchover it was asked to step down for; the
// history keeps history.keep events.
func TestHistory(t *testing.T) {
	c := etcdtest.New(t)
	keep := func(cfg *Config) { cfg.History.Keep = 3 }
	a := startNode(t, c, "A", keep)
	b := startNode(t, c, "B", keep)
	cli := c.Client(t)
	p := a.cfg.prefix()
	wantLast := func(n int, kind HistoryKind, from, to string) HistoryEvent {
		t.Helper()
		var evs []HistoryEvent
		waitFor(t, 10*time.Second, "history event "+string(kind), func() bool {
			evs = readHistory(t, cli, p)
			return len(evs) == n && evs[n-1].Kind == kind
		})
		ev := evs[n-1]
		if ev.From != from || ev.To != to || ev.Epoch == 0 || ev.Served.IsZero() {
			t.Fatalf("event %+v, want %s %s → %s", ev, kind, from, to)
		}
		return ev
	}
	a.pat.promote()
	a.waitCode(t, 200, 10*time.Second)
	wantLast(1, KindFirst, "", "A")

	a.pat.demote()
	b.pat.promote()
	b.waitCode(t, 200, 10*time.Second)
	ev := wantLast(2, KindDemotion, "A", "B")
	if ev.OldStopped.IsZero() || ev.GapSeconds <= 0 || ev.Reason == "" {
		t.Errorf("demotion without the old ACTIVE's own release: %+v", ev)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sd := StepDownKey(p, "B")
	if _, err := cli.Put(ctx, sd, "test"); err != nil {
		t.Fatal(err)
	}
	b.waitCode(t, 503, 10*time.Second)
	b.pat.demote()
	a.pat.promote()
	a.waitCode(t, 200, 10*time.Second)
	wantLast(3, KindSwitchover, "B", "A")
	if _, err := cli.Delete(ctx, sd); err != nil {
		t.Fatal(err)
	}

	a.pat.demote()
	b.pat.promote()
	b.waitCode(t, 200, 10*time.Second)
	evs := readHistory(t, cli, p)
	waitFor(t, 10*time.Second, "history trimmed to 3", func() bool { evs = readHistory(t, cli, p); return len(evs) == 3 && evs[2].To == "B" })
	if evs[0].Kind != KindDemotion {
		t.Errorf("oldest kept event %+v, want the demotion (the first one trimmed)", evs[0])
	}
}
