package lb

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// limitGroup is a one-server pool, up and eligible, with max-conns n.
func limitGroup(t *testing.T, n int, queue time.Duration) (*Group, *Server) {
	t.Helper()
	g, s := oneServerGroup(t, AdminReady, func(b *BackendConfig) { b.MaxConns, b.QueueTimeout = n, queue })
	if len(*g.eligible.Load()) != 1 {
		t.Fatal("server not eligible")
	}
	return g, s
}

// TestMaxConnsQueuesOldestFirst: with the server at max-conns, further
// requests queue and get the freed slots in arrival order, and a new
// request does not overtake the queue.
func TestMaxConnsQueuesOldestFirst(t *testing.T) {
	g, s := limitGroup(t, 2, 10*time.Second)
	ctx := context.Background()
	var held []*Server
	for range 2 {
		srv, err := g.acquire(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, srv)
	}
	const n = 5
	got := make(chan int, n)
	for i := range n {
		go func() {
			srv, err := g.acquire(ctx, nil)
			if err != nil {
				t.Errorf("queued request %d: %v", i, err)
				got <- -1
				return
			}
			got <- i
			_ = srv // kept: its slot is freed by the test, in order
		}()
		waitQueue(t, g, i+1)
	}
	if a := s.active.Load(); a != 2 {
		t.Fatalf("%d in flight, want 2 (max-conns)", a)
	}
	for i := range n {
		held[0].release() // one slot frees: the oldest waiter takes it
		select {
		case j := <-got:
			if j != i {
				t.Fatalf("slot %d went to request %d, want %d", i, j, i)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no queued request took slot %d", i)
		}
		if a := s.active.Load(); a != 2 {
			t.Fatalf("%d in flight after slot %d, want 2", a, i)
		}
	}
	if w := g.waiting.Load(); w != 0 {
		t.Fatalf("%d still waiting", w)
	}
}

// TestMaxConnsQueueTimeout: a request that finds the server full gives up
// after queue-timeout with the hold-timeout error (503 + Retry-After).
func TestMaxConnsQueueTimeout(t *testing.T) {
	g, s := limitGroup(t, 1, 50*time.Millisecond)
	srv, err := g.acquire(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := g.acquire(context.Background(), nil); !errors.Is(err, ErrHoldTimed) {
		t.Fatalf("acquire on a full server: %v, want %v", err, ErrHoldTimed)
	}
	if el := time.Since(start); el < 50*time.Millisecond {
		t.Fatalf("gave up after %v, before queue-timeout", el)
	}
	srv.release()
	if s.active.Load() != 0 {
		t.Fatalf("%d in flight, want 0", s.active.Load())
	}
	if _, err := g.acquire(context.Background(), nil); err != nil {
		t.Fatalf("acquire after the slot freed: %v", err)
	}
}

// TestMaxConnsServerGoneIsHeld: a request waiting for a slot whose server
// then goes away (a host's death: its slots stay taken until the checks
// mark it down) is held for hold-timeout, not refused at queue-timeout, and
// gets the server that comes next. Before, it got 503 at queue-timeout in
// the middle of the failover (lab 19-host-death-at-rto-6.5s: 16 of 159
// writes).
func TestMaxConnsServerGoneIsHeld(t *testing.T) {
	const queue = 50 * time.Millisecond
	g, s := oneServerGroup(t, AdminReady, func(b *BackendConfig) {
		b.MaxConns, b.QueueTimeout, b.HoldTimeout = 1, queue, durPtr(10*time.Second)
	})
	stuck, err := g.acquire(context.Background(), nil) // never ends while the server is gone
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		srv, err := g.acquire(context.Background(), nil)
		if err == nil {
			srv.release()
		}
		got <- err
	}()
	waitQueue(t, g, 1)
	s.admin.Store(uint32(AdminMaint)) // marked down: no server is eligible
	g.recompute("test")
	// Six queue-timeouts pass: the request must still be waiting.
	select {
	case err := <-got:
		t.Fatalf("request waiting for a slot of a server that went away: %v before hold-timeout", err)
	case <-time.After(6 * queue):
	}
	s.admin.Store(uint32(AdminReady)) // the next ACTIVE, with a free slot
	g.recompute("test")
	stuck.release()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("held request: %v, want the server", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("held request not served once a server was eligible")
	}
}

// TestMaxConnsConfig: a negative limit is refused naming the field.
func TestMaxConnsConfig(t *testing.T) {
	cfg := poolConfig("127.0.0.1:1")
	cfg.Backends[0].MaxConns = -1
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "max-conns") {
		t.Fatalf("validate: %v, want an error naming max-conns", err)
	}
}
