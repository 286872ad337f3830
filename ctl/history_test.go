package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/etcdtest"
	"github.com/hapair/hapair/roled"
)

func TestHistory(t *testing.T) {
	etcd := etcdtest.New(t)
	cfg := DefaultConfig()
	cfg.Etcd.Endpoints = etcd.Endpoints()
	cli := etcd.Client(t)
	ctx := context.Background()
	t0 := time.Unix(1800000000, 0)
	for i, ev := range []roled.HistoryEvent{
		{Kind: roled.KindFailover, From: "a", FromEpoch: 9, To: "b", Epoch: 100, Served: t0.Add(time.Minute), GapSeconds: 9.1},
		{Kind: roled.KindFirst, To: "a", Epoch: 9, Served: t0},
	} {
		b, _ := json.Marshal(ev)
		if _, err := cli.Put(ctx, fmt.Sprintf("%s%020d", roled.HistoryPrefix(cfg.Prefix()), ev.Epoch), string(b)); err != nil {
			t.Fatal(i, err)
		}
	}
	evs, err := NewClient(cfg, nil, nil).History(ctx)
	if err != nil || len(evs) != 2 || evs[0].Epoch != 9 || evs[1].Kind != roled.KindFailover {
		t.Fatalf("history %+v, %v", evs, err)
	}
	var buf bytes.Buffer
	if err := WriteHistory(&buf, evs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "failover") || !strings.Contains(buf.String(), "a (9)") {
		t.Errorf("table:\n%s", buf.String())
	}
}

// Every figure of an event is printed with its unit.
func TestWriteHistoryFigures(t *testing.T) {
	t0 := time.Unix(1800000000, 0)
	lost, q := int64(160), int64(2)
	evs := []roled.HistoryEvent{
		{Kind: roled.KindFirst, To: "a", Epoch: 9, Served: t0},
		{Kind: roled.KindFailover, From: "a", FromEpoch: 9, To: "b", Epoch: 100, OldStopped: t0.Add(50 * time.Second),
			Served: t0.Add(time.Minute), GapSeconds: 10, WALLostBytes: &lost,
			WAL:              roled.WALLoss{Basis: roled.WALMeasured, Bytes: 160, OldLSN: "0/3000100", OldTimeline: 1, OldLSNAt: t0, SwitchLSN: "0/3000060", NewTimeline: 2},
			QuarantinedFiles: &q, Redundancy: roled.RedundancyReached, RedundantAt: t0.Add(90 * time.Second), RedundancySeconds: 30, Standby: "a",
			StandbyRecovery: &roled.StandbyRecovery{Started: t0.Add(65 * time.Second), ReadyAt: t0.Add(90 * time.Second), Seconds: 25,
				Phases: roled.PhaseSplit{Start: 12, Rewind: 8, WALCatchup: 4, FileSync: 1}}},
		{Kind: roled.KindSwitchover, From: "b", FromEpoch: 100, To: "a", Epoch: 200, Served: t0.Add(time.Hour),
			WAL: roled.WALLoss{Basis: roled.WALUnknown, Note: "timeline 2 not in the new primary's history yet"}, Redundancy: roled.RedundancyNotReached,
			RedundancyNote: "not redundant after 30m0s: b: not streaming from the leader"},
	}
	var buf bytes.Buffer
	if err := WriteHistory(&buf, evs); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"a (9) → b (100)", "10.00 s (old ACTIVE stopped", "160 B (at least: old ACTIVE at 0/3000100 on timeline 1",
		"timeline 1 ends at 0/3000060", "2 files", "30.0 s (a ready at", "25.0 s from", "start 12.0 s, rewind 8.0 s, WAL catch-up 4.0 s, file sync 1.0 s",
		"unknown: timeline 2 not in the new primary's history yet", "not_redundant: not redundant after 30m0s"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	t.Logf("\n%s", out)
}
