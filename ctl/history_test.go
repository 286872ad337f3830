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
	if !strings.Contains(buf.String(), "failover") || !strings.Contains(buf.String(), "9.10 s") || !strings.Contains(buf.String(), "a (9)") {
		t.Errorf("table:\n%s", buf.String())
	}
}
