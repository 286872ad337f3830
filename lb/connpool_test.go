package lb

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
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

// TestPoolSurplusAcrossWaves: through the balancer, a second wave of as many
// concurrent requests as the first reuses the backend connections the first
// one opened, though they are more than idle-conns; with
// idle-surplus-timeout 0 every connection beyond idle-conns is dialled again.
// (Before the surplus the pool closed them at once: the 1,000-connection
// cell's tail.)
func TestPoolSurplusAcrossWaves(t *testing.T) {
	const wave, idle = 8, 2
	for _, tc := range []struct {
		name    string
		surplus *time.Duration
		want    int // backend connections used by both waves
	}{
		{"default 5s", nil, wave},
		{"0 closes at once", durPtr(0), wave + wave - idle},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				mu     sync.Mutex
				conns  atomic.Int64 // accepted by the backend (checks are off: all the balancer's)
				closed atomic.Int64 // and closed again
				in     int
				all    = make(chan struct{})
			)
			// Each request waits until the whole wave is in, so the wave
			// needs wave backend connections at once.
			be := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				in++
				gate := all
				if in == wave {
					close(all)
				}
				mu.Unlock()
				select {
				case <-gate:
				case <-time.After(10 * time.Second):
				}
				_, _ = io.WriteString(w, "ok")
			}))
			be.Config.ConnState = func(_ net.Conn, st http.ConnState) {
				switch st {
				case http.StateNew:
					conns.Add(1)
				case http.StateClosed:
					closed.Add(1)
				}
			}
			be.Start()
			defer be.Close()
			cfg := poolConfig(be.Listener.Addr().String())
			cfg.Backends[0].IdleConns = idle
			cfg.Backends[0].IdleSurplusTimeout = tc.surplus
			l := startLB(t, cfg, nil)
			c := newClient()
			defer c.CloseIdleConnections()
			for round := range 2 {
				mu.Lock()
				in, all = 0, make(chan struct{})
				mu.Unlock()
				var wg sync.WaitGroup
				for range wave {
					wg.Add(1)
					go func() {
						defer wg.Done()
						resp, err := c.Get(l.url("web") + "/w")
						if err != nil {
							t.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != 200 {
							t.Errorf("round %d: status %d", round, resp.StatusCode)
						}
					}()
				}
				wg.Wait()
				// The clients have their answers; the balancer may still be
				// putting the connections back. The next wave starts once
				// every connection is in the pool or closed.
				p := l.Group("pool").servers[0].pool
				waitFor(t, 10*time.Second, "the wave's connections pooled or closed", func() bool {
					p.mu.Lock()
					defer p.mu.Unlock()
					return int64(len(p.idle))+closed.Load() == conns.Load()
				})
			}
			if got := int(conns.Load()); got != tc.want {
				t.Errorf("backend connections over two waves of %d with idle-conns %d: %d, want %d", wave, idle, got, tc.want)
			}
		})
	}
}
