package roled

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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

func TestFollowRedundancy(t *testing.T) {
	served := time.Unix(2000, 0)
	ev := HistoryEvent{Kind: KindFailover, From: "A", To: "B", Epoch: 50, Served: served, Redundancy: RedundancyWaiting}
	rec := &StandbyRecovery{Started: served.Add(time.Second), ReadyAt: served.Add(20 * time.Second), Seconds: 19,
		Phases: PhaseSplit{Start: 9, Rewind: 6, WALCatchup: 4}}
	q := func(epochs ...int64) *struct {
		Quarantined []struct {
			Epoch int64 `json:"epoch"`
		} `json:"quarantined"`
	} {
		s := &struct {
			Quarantined []struct {
				Epoch int64 `json:"epoch"`
			} `json:"quarantined"`
		}{}
		for _, e := range epochs {
			s.Quarantined = append(s.Quarantined, struct {
				Epoch int64 `json:"epoch"`
			}{e})
		}
		return s
	}
	self := peerBeat{Node: "B", Role: "active", Epoch: 50, Updated: served.Add(time.Minute), Readiness: Readiness{Reason: StandbyIsActive}}
	notReady := peerBeat{Node: "A", Role: "passive", Updated: served.Add(5 * time.Second),
		Readiness: Readiness{Reason: StandbyNotRunning, Detail: "stopped: rewind, restart or crash"}, Sync: q(50, 50, 12)}
	ready := peerBeat{Node: "A", Role: "passive", Updated: served.Add(21 * time.Second),
		Readiness: Readiness{Ready: true, Reason: StandbyReady, Since: served.Add(20 * time.Second), Recovery: rec}, Sync: q(50, 50, 12)}
	stale := ready
	stale.Updated = served.Add(-time.Second) // written before we served: not proof of anything after
	two := int64(2)

	cases := []struct {
		name  string
		beats []peerBeat
		now   time.Time
		want  HistoryEvent
		done  bool
	}{
		{"standby not ready yet", []peerBeat{self, notReady}, served.Add(10 * time.Second),
			func() HistoryEvent { e := ev; e.QuarantinedFiles = &two; return e }(), false},
		{"standby ready", []peerBeat{self, ready}, served.Add(22 * time.Second),
			func() HistoryEvent {
				e := ev
				e.QuarantinedFiles, e.Redundancy, e.RedundantAt, e.RedundancySeconds = &two, RedundancyReached, served.Add(20*time.Second), 20
				e.Standby, e.StandbyRecovery = "A", rec
				return e
			}(), true},
		{"a heartbeat from before the event does not count", []peerBeat{stale}, served.Add(10 * time.Second),
			func() HistoryEvent { e := ev; e.QuarantinedFiles = &two; return e }(), false},
		{"no standby past the bound", []peerBeat{self}, served.Add(31 * time.Minute),
			func() HistoryEvent {
				e := ev
				e.Redundancy, e.RedundancyNote = RedundancyNotReached, "not redundant after 30m0s: no standby heartbeat"
				return e
			}(), true},
		{"standby stuck past the bound", []peerBeat{self, notReady}, served.Add(31 * time.Minute),
			func() HistoryEvent {
				e := ev
				e.QuarantinedFiles, e.Redundancy = &two, RedundancyNotReached
				e.RedundancyNote = "not redundant after 30m0s: A: PostgreSQL not running under Patroni (stopped: rewind, restart or crash)"
				return e
			}(), true},
	}
	for _, c := range cases {
		got, done := followRedundancy(ev, "B", c.beats, c.now, 30*time.Minute)
		if !reflect.DeepEqual(got, c.want) || done != c.done {
			t.Errorf("%s:\n got %+v done %v\nwant %+v done %v", c.name, got, done, c.want, c.done)
		}
	}
	// The returning old ACTIVE's own diverged range makes the WAL loss
	// exact, even before it is ready.
	dv := notReady
	dv.Readiness.Recovery = &StandbyRecovery{Started: served, Diverged: &DivergedWAL{Timeline: 1, From: "0/3000060", To: "0/3000100", Bytes: 0xa0}}
	withWAL := ev
	withWAL.WAL = WALLoss{Basis: WALMeasured, Bytes: 0x10, OldLSN: "0/3000070", OldTimeline: 1, SwitchLSN: "0/3000060", NewTimeline: 2}
	if got, done := followRedundancy(withWAL, "B", []peerBeat{self, dv}, served.Add(5*time.Second), time.Minute); done ||
		got.WALLostBytes == nil || *got.WALLostBytes != 0xa0 || got.WAL.Basis != WALReturning || got.WAL.ReturningEnd != "0/3000100" {
		t.Errorf("diverged range: %+v (%v)", got.WAL, got.WALLostBytes)
	}
	// Ready all along (a roled restart on the ACTIVE): redundant at once.
	early := ready
	early.Readiness.Since = served.Add(-time.Hour)
	if got, done := followRedundancy(ev, "B", []peerBeat{early}, served.Add(time.Second), time.Minute); !done || got.RedundancySeconds != 0 || !got.RedundantAt.Equal(served) {
		t.Errorf("ready all along: %+v", got)
	}
}

// A failover recorded by the new ACTIVE's roled B is completed as the figures
// come in: WAL lost from the old ACTIVE's last heartbeat against B's Patroni
// history, then the returning node's readiness (its heartbeat, as its roled
// writes it) gives the time to redundancy, its phase split and the files it
// quarantined under B's epoch. The old ACTIVE A is played by the test in
// etcd (its key, its heartbeat, its lease), so it can die without releasing.
func TestHistoryRedundancy(t *testing.T) {
	c := etcdtest.New(t)
	cli := c.Client(t)
	patA := newFakePatroni(t, cli, "A", "hapair")
	b := startNode(t, c, "B", nil)
	p := b.cfg.prefix()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A: Patroni leader, ACTIVE key and heartbeat with its WAL end, all on
	// one lease the test controls.
	patA.promote()
	g, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	av, _ := json.Marshal(activeValue{Node: "A", Since: time.Now().UTC().Format(time.RFC3339Nano)})
	pr, err := cli.Put(ctx, p+"active", string(av), clientv3.WithLease(g.ID))
	if err != nil {
		t.Fatal(err)
	}
	ea := pr.Header.Revision
	hb, _ := json.Marshal(heartbeat{Node: "A", Role: "active", Epoch: ea, Updated: time.Now().UTC(),
		WAL: &WALPosition{LSN: 0x3000100, Timeline: 1, At: time.Now().UTC()}})
	if _, err := cli.Put(ctx, p+"nodes/A", string(hb), clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "B to see A's WAL end", func() bool {
		s := b.d.hist.last()
		return s != nil && s.epoch == ea && s.wal != nil
	})

	// A dies: its lease goes, B's Patroni is promoted onto timeline 2, which
	// branched at 0/3000060; Patroni writes the history a moment later.
	if _, err := cli.Revoke(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	patA.dropKey()
	b.pat.set(func(p *fakePatroni) { p.timeline, p.location = 2, 0x3000800 })
	b.pat.promote()
	eb := b.waitCode(t, 200, 15*time.Second)
	served := time.Now()
	last := func() HistoryEvent {
		evs := readHistory(t, cli, p)
		if len(evs) == 0 {
			return HistoryEvent{}
		}
		return evs[len(evs)-1]
	}
	waitFor(t, 10*time.Second, "the failover recorded", func() bool { return last().Epoch == eb })
	if ev := last(); ev.Kind != KindFailover || ev.From != "A" || ev.Redundancy != RedundancyWaiting || ev.WALLostBytes != nil {
		t.Fatalf("event before the figures: %+v", ev)
	}
	b.pat.set(func(p *fakePatroni) {
		p.history = `[[1, 50331744, "no recovery target specified", "2026-11-30T03:20:01+00:00", "B"]]`
	})
	waitFor(t, 10*time.Second, "WAL lost in the event", func() bool { return last().WALLostBytes != nil })
	if ev := last(); *ev.WALLostBytes != 0xa0 || ev.WAL.Basis != WALMeasured || ev.WAL.OldLSN != "0/3000100" || ev.WAL.SwitchLSN != "0/3000060" || ev.WAL.NewTimeline != 2 {
		t.Fatalf("WAL loss %+v (%d bytes), want 0xa0 from 0/3000100 against 0/3000060", ev.WAL, *ev.WALLostBytes)
	}

	// A comes back (a new lease, as a restarted roled has): not ready while
	// it rewinds, then ready, with its own recovery split and two files
	// quarantined under B's epoch.
	g2, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	beat := func(r Readiness, quarantined ...int64) {
		t.Helper()
		var qf []syncQuarantined
		for _, e := range quarantined {
			qf = append(qf, syncQuarantined{Epoch: e})
		}
		b, _ := json.Marshal(heartbeat{Node: "A", Role: "passive", Updated: time.Now().UTC(), Readiness: r,
			Sync: map[string]any{"quarantined": qf}})
		if _, err := cli.Put(ctx, p+"nodes/A", string(b), clientv3.WithLease(g2.ID)); err != nil {
			t.Fatal(err)
		}
	}
	beat(Readiness{Reason: StandbyNotStreaming, Since: time.Now().UTC()}, eb, eb, ea)
	waitFor(t, 10*time.Second, "files quarantined in the event", func() bool { q := last().QuarantinedFiles; return q != nil && *q == 2 })
	if ev := last(); ev.Redundancy != RedundancyWaiting {
		t.Fatalf("redundant while the standby is not ready: %+v", ev)
	}
	readyAt := time.Now().UTC()
	rec := &StandbyRecovery{Started: served.UTC(), ReadyAt: readyAt, Seconds: readyAt.Sub(served).Seconds(),
		Phases: PhaseSplit{Start: 1, Rewind: 2, WALCatchup: 0.5}}
	beat(Readiness{Ready: true, Reason: StandbyReady, Since: readyAt, Recovery: rec}, eb, eb, ea)
	waitFor(t, 10*time.Second, "time to redundancy in the event", func() bool { return last().Redundancy == RedundancyReached })
	ev := last()
	if ev.Standby != "A" || !ev.RedundantAt.Equal(readyAt) || ev.RedundancySeconds <= 0 ||
		ev.RedundancySeconds != readyAt.Sub(ev.Served).Seconds() || ev.StandbyRecovery == nil || ev.StandbyRecovery.Phases != rec.Phases {
		t.Fatalf("event after the standby is ready: %+v", ev)
	}
	if n := histogramCount(t, b.reg, "hapair_failover_redundancy_seconds", "failover"); n != 1 {
		t.Errorf("hapair_failover_redundancy_seconds{kind=failover} count %d, want 1", n)
	}
	if n := histogramCount(t, b.reg, "hapair_failover_wal_lost_bytes", "failover"); n != 1 {
		t.Errorf("hapair_failover_wal_lost_bytes{kind=failover} count %d, want 1", n)
	}
	t.Logf("event: %+v", ev)
}

// syncQuarantined is one entry of syncdir's Status.Quarantined, as the
// heartbeat carries it.
type syncQuarantined struct {
	Epoch int64 `json:"epoch"`
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name, kind string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}
