package lb

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// holdGroup is a one-server pool whose server is out (maintenance), so that
// new requests are held.
func holdGroup(t *testing.T, hold time.Duration) (*Group, *Server) {
	t.Helper()
	return oneServerGroup(t, AdminMaint, func(b *BackendConfig) { b.HoldTimeout = &hold })
}

// oneServerGroup is a one-server pool group, edited by edit before
// validation, with its server in the admin state given.
func oneServerGroup(t *testing.T, admin AdminState, edit func(*BackendConfig)) (*Group, *Server) {
	t.Helper()
	cfg := poolConfig("127.0.0.1:1")
	edit(&cfg.Backends[0])
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	g := newGroup(cfg.Backends[0], zap.NewNop(), NewMetrics(prometheus.NewRegistry()))
	s := g.servers[0]
	s.admin.Store(uint32(admin))
	g.recompute("test")
	return g, s
}

// waitQueue waits until n requests are held.
func waitQueue(t *testing.T, g *Group, n int) []*holder {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		g.mu.Lock()
		q := append([]*holder(nil), g.queue...)
		g.mu.Unlock()
		if len(q) == n {
			return q
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests held, want %d", len(q), n)
		}
		time.Sleep(time.Millisecond) // polling a condition with a deadline
	}
}

// TestHoldReleasesInArrivalOrder: when a server becomes eligible, the held
// requests get it oldest first; one that gave up meanwhile does not block
// the others.
func TestHoldReleasesInArrivalOrder(t *testing.T) {
	g, s := holdGroup(t, 10*time.Second)
	var order []*holder
	g.onDequeue = func(h *holder) { order = append(order, h) } // under g.mu
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	var cancelOne context.CancelFunc
	for i := range n {
		ctx := context.Background()
		if i == 5 {
			ctx, cancelOne = context.WithCancel(ctx)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv, err := g.acquire(ctx, nil)
			if err == nil {
				srv.release()
			}
			errs <- err
		}()
		waitQueue(t, g, i+1)
	}
	held := waitQueue(t, g, n)
	cancelOne() // the client of the 6th request went away
	waitQueue(t, g, n-1)
	s.admin.Store(uint32(AdminReady))
	g.recompute("test")
	wg.Wait()
	close(errs)
	var served, gone int
	for err := range errs {
		switch {
		case err == nil:
			served++
		case errors.Is(err, context.Canceled):
			gone++
		default:
			t.Errorf("acquire: %v", err)
		}
	}
	if served != n-1 || gone != 1 {
		t.Fatalf("served %d, gone %d; want %d and 1", served, gone, n-1)
	}
	want := append(append([]*holder{held[5]}, held[:5]...), held[6:]...)
	if len(order) != len(want) {
		t.Fatalf("%d left the queue, want %d", len(order), len(want))
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("position %d left the queue out of order", i)
		}
	}
}

// TestHoldTimeoutFrontOfQueue: a held request times out at the front of
// the queue and the next one still gets the server when it comes.
func TestHoldTimeoutFrontOfQueue(t *testing.T) {
	g, s := holdGroup(t, 300*time.Millisecond)
	first := make(chan error, 1)
	go func() { _, err := g.acquire(context.Background(), nil); first <- err }()
	waitQueue(t, g, 1)
	if err := <-first; !errors.Is(err, ErrHoldTimed) {
		t.Fatalf("first: %v, want hold timeout", err)
	}
	second := make(chan error, 1)
	go func() {
		srv, err := g.acquire(context.Background(), nil)
		if err == nil {
			srv.release()
		}
		second <- err
	}()
	waitQueue(t, g, 1)
	s.admin.Store(uint32(AdminReady))
	g.recompute("test")
	if err := <-second; err != nil {
		t.Fatalf("second: %v", err)
	}
	waitQueue(t, g, 0)
}
