package witness

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zaptest"
)

func TestDecideLease(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	const fine = 25 * time.Millisecond
	under := leaseTrack{Under1At: t0, NextLook: at(time.Second)}
	cases := []struct {
		name   string
		track  leaseTrack
		read   leaseReading
		want   leaseTrack
		revoke bool
		reason reapReason
	}{
		{"2 s lease: left to etcd", leaseTrack{}, leaseReading{At: t0, TTL: 1, Granted: 2}, leaseTrack{Never: true}, false, reapShortLease},
		{"5 s left: look when 1 s is left at the earliest", leaseTrack{}, leaseReading{At: t0, TTL: 5, Granted: 5}, leaseTrack{NextLook: at(4 * time.Second)}, false, reapAlive},
		{"renewed meanwhile: forget what was seen", under, leaseReading{At: at(time.Second), TTL: 4, Granted: 5}, leaseTrack{NextLook: at(4 * time.Second)}, false, reapAlive},
		{"1–2 s left: poll finely", leaseTrack{}, leaseReading{At: t0, TTL: 1, Granted: 5}, leaseTrack{NextLook: at(fine)}, false, reapLastSecond},
		{"under 1 s seen first", leaseTrack{}, leaseReading{At: t0, TTL: 0, Granted: 5}, under, false, reapUnderOne},
		{"under 1 s, looked again too early", under, leaseReading{At: at(500 * time.Millisecond), TTL: 0, Granted: 5}, under, false, reapUnderOne},
		{"still under 1 s a second later: expired", under, leaseReading{At: at(time.Second), TTL: 0, Granted: 5}, under, true, reapExpired},
		{"past the expiry reads negative", under, leaseReading{At: at(1500 * time.Millisecond), TTL: -1, Granted: 3}, under, true, reapExpired},
		{"3 s lease, look 2 s later: a renewal would still show", under, leaseReading{At: at(2 * time.Second), TTL: 0, Granted: 3}, under, true, reapExpired},
		{"3 s lease, look too late: a renewal could hide, start over", under, leaseReading{At: at(2001 * time.Millisecond), TTL: 0, Granted: 3},
			leaseTrack{Under1At: at(2001 * time.Millisecond), NextLook: at(3001 * time.Millisecond)}, false, reapRestart},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, revoke, reason := decideLease(c.track, c.read, fine)
			if got != c.want || revoke != c.revoke || reason != c.reason {
				t.Fatalf("decideLease = %+v, %v, %v; want %+v, %v, %v", got, revoke, reason, c.want, c.revoke, c.reason)
			}
		})
	}
}

// soloMember runs a single-member cluster with the given reap interval and
// returns a client and the member's metrics.
func soloMember(t *testing.T, reap time.Duration) (*clientv3.Client, *Metrics) {
	t.Helper()
	cfg := soloConfig(t)
	cfg.MetricsListen = ""
	cfg.LeaseReapInterval = reap
	met := NewMetrics(prometheus.NewRegistry())
	m, err := New(cfg, zaptest.NewLogger(t), met)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- m.Run(context.Background()) }()
	t.Cleanup(func() {
		m.Close()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-m.Ready():
	case err := <-errc:
		t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("not ready within 20s")
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: cfg.AdvertiseClientURLs, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, met
}

// leaseLateness grants n leases (TTL 3–5 s, each with a key), renews each
// once at a staggered moment, then lets them expire while one more lease is
// renewed every 500 ms throughout. For every expired lease it returns how
// long its key outlived the lease (from the renewal's answer + TTL to the
// key's deletion seen by a watch), and it fails the test if a key went
// before its lease could have expired (the renewal's request + TTL) or if
// the renewed lease lost its key.
func leaseLateness(t *testing.T, c *clientv3.Client, n int) []time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wch := c.Watch(ctx, "/reap/", clientv3.WithPrefix())

	live, err := c.Grant(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "/live", "x", clientv3.WithLease(live.ID)); err != nil {
		t.Fatal(err)
	}
	kctx, stopKeep := context.WithCancel(ctx)
	var keepWG sync.WaitGroup
	keepWG.Add(1)
	go func() {
		defer keepWG.Done()
		tk := time.NewTicker(500 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-kctx.Done():
				return
			case <-tk.C:
				c.KeepAliveOnce(kctx, live.ID)
			}
		}
	}()
	defer func() { stopKeep(); keepWG.Wait() }()

	type held struct{ sent, answered time.Time }
	renewed := map[string]held{}
	for i := range n {
		ttl := int64(3 + i%3)
		l, err := c.Grant(ctx, ttl)
		if err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("/reap/%d", i)
		if _, err := c.Put(ctx, key, "x", clientv3.WithLease(l.ID)); err != nil {
			t.Fatal(err)
		}
		// Stagger the renewals over etcd's 500 ms check.
		time.Sleep(70 * time.Millisecond) // spacing the leases, not synchronisation
		sent := time.Now()
		if _, err := c.KeepAliveOnce(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
		renewed[key] = held{sent.Add(time.Duration(ttl) * time.Second), time.Now().Add(time.Duration(ttl) * time.Second)}
	}
	var late []time.Duration
	for len(late) < n {
		select {
		case <-ctx.Done():
			t.Fatalf("only %d of %d keys deleted", len(late), n)
		case wr := <-wch:
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypeDelete {
					continue
				}
				now, h := time.Now(), renewed[string(ev.Kv.Key)]
				if now.Before(h.sent) {
					t.Errorf("%s deleted %v before its lease could expire", ev.Kv.Key, h.sent.Sub(now))
				}
				late = append(late, now.Sub(h.answered))
			}
		}
	}
	if r, err := c.Get(ctx, "/live"); err != nil || len(r.Kvs) != 1 {
		t.Errorf("the renewed lease's key: %v, %v; want it kept", r, err)
	}
	slices.Sort(late)
	return late
}

// The reaper revokes expired leases before etcd's own 500 ms check, never a
// lease before its expiry, never a renewed one. Without it (interval 0) the
// same leases are etcd's alone: both figures are logged side by side.
func TestLeaseReaper(t *testing.T) {
	const n = 8
	var lateOn, lateOff []time.Duration
	t.Run("on", func(t *testing.T) {
		c, met := soloMember(t, 25*time.Millisecond)
		lateOn = leaseLateness(t, c, n)
		// Each lease is revoked by whoever comes first; etcd's check wins
		// only when it falls in the reaper's few milliseconds, so at least
		// one of eight is the reaper's unless it does nothing.
		if got := testutil.ToFloat64(met.LeasesReaped); got < 1 {
			t.Errorf("hapair_witness_leases_reaped_total = %v, want ≥ 1 of %d", got, n)
		}
	})
	t.Run("off", func(t *testing.T) {
		c, met := soloMember(t, 0)
		lateOff = leaseLateness(t, c, n)
		if got := testutil.ToFloat64(met.LeasesReaped); got != 0 {
			t.Errorf("hapair_witness_leases_reaped_total = %v with the reaper off", got)
		}
	})
	if len(lateOn) == n && len(lateOff) == n {
		t.Logf("FIGURE key outlives its lease, median (range) of %d: reaper %v (%v … %v), etcd alone %v (%v … %v)",
			n, lateOn[n/2].Round(time.Millisecond), lateOn[0].Round(time.Millisecond), lateOn[n-1].Round(time.Millisecond),
			lateOff[n/2].Round(time.Millisecond), lateOff[0].Round(time.Millisecond), lateOff[n-1].Round(time.Millisecond))
	}
}
