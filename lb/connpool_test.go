package lb

import (
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// countingConn records its Close.
type countingConn struct {
	net.Conn
	closed atomic.Bool
}

func (c *countingConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// pooledConns makes n backend connections over pipes, for the pool alone.
func pooledConns(t *testing.T, n int) ([]*backendConn, []*countingConn) {
	t.Helper()
	var bcs []*backendConn
	var cs []*countingConn
	for range n {
		a, b := net.Pipe()
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		c := &countingConn{Conn: a}
		cs = append(cs, c)
		bcs = append(bcs, newBackendConn(c, time.Second, nil))
	}
	return bcs, cs
}

func closedCount(cs []*countingConn) (n int) {
	for _, c := range cs {
		if c.closed.Load() {
			n++
		}
	}
	return n
}

// TestConnPoolSurplus: connections beyond idle-conns that come back after a
// burst stay pooled for idle-surplus-timeout, then the oldest are closed
// down to idle-conns, and those at idle-conn-timeout; with no surplus time
// a connection beyond idle-conns is closed at once (nginx's keepalive N).
func TestConnPoolSurplus(t *testing.T) {
	t0 := time.Now()
	now := t0
	p := newConnPool(2, 30*time.Second, 5*time.Second)
	p.now = func() time.Time { return now }
	defer p.closeAll(true)
	bcs, cs := pooledConns(t, 5)
	for _, bc := range bcs {
		p.put(bc)
	}
	if len(p.idle) != 5 || closedCount(cs) != 0 {
		t.Fatalf("after a burst of 5 with idle-conns 2: %d idle, %d closed; want 5, 0", len(p.idle), closedCount(cs))
	}
	now = t0.Add(4 * time.Second)
	p.onTimer()
	if len(p.idle) != 5 {
		t.Fatalf("4 s after, under idle-surplus-timeout: %d idle, want 5", len(p.idle))
	}
	if got := p.get(); got != bcs[4] {
		t.Fatal("get did not return the newest connection")
	}
	now = t0.Add(5 * time.Second)
	p.onTimer()
	if len(p.idle) != 2 || !cs[0].closed.Load() || !cs[1].closed.Load() || cs[2].closed.Load() || cs[3].closed.Load() {
		t.Fatalf("at idle-surplus-timeout: %d idle, closed %v %v %v %v; want 2 idle, the two oldest closed",
			len(p.idle), cs[0].closed.Load(), cs[1].closed.Load(), cs[2].closed.Load(), cs[3].closed.Load())
	}
	now = t0.Add(30 * time.Second)
	p.onTimer()
	if len(p.idle) != 0 || closedCount(cs) != 4 {
		t.Fatalf("at idle-conn-timeout: %d idle, %d closed; want 0, 4 (the fifth is in use)", len(p.idle), closedCount(cs))
	}
	p.put(bcs[4])
	p.closeAll(true)
	if !cs[4].closed.Load() {
		t.Fatal("closeAll left a connection open")
	}

	q := newConnPool(2, 30*time.Second, 0)
	defer q.closeAll(true)
	bcs, cs = pooledConns(t, 3)
	for _, bc := range bcs {
		q.put(bc)
	}
	if len(q.idle) != 2 || !cs[2].closed.Load() {
		t.Fatalf("idle-surplus-timeout 0: %d idle, third closed %v; want 2, true", len(q.idle), cs[2].closed.Load())
	}
}

// TestConnPoolSurplusTimer: the pool's own timer closes the surplus with no
// further traffic.
func TestConnPoolSurplusTimer(t *testing.T) {
	p := newConnPool(1, 30*time.Second, 20*time.Millisecond)
	defer p.closeAll(true)
	bcs, cs := pooledConns(t, 3)
	for _, bc := range bcs {
		p.put(bc)
	}
	waitFor(t, 10*time.Second, "the surplus closed by the timer", func() bool { return closedCount(cs) == 2 })
	p.mu.Lock()
	n := len(p.idle)
	p.mu.Unlock()
	if n != 1 || cs[2].closed.Load() {
		t.Fatalf("%d idle, newest closed %v; want 1 idle, the newest kept", n, cs[2].closed.Load())
	}
}
