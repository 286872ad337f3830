package lb

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// stallingBackend answers every request with a head announcing a long body,
// sends a few bytes of it and then stalls; it records when the proxy closes
// its side.
type stallingBackend struct {
	ln     net.Listener
	closed chan time.Duration // time from the stall to the proxy's close
}

func newStallingBackend(t *testing.T) *stallingBackend {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &stallingBackend{ln: ln, closed: make(chan time.Duration, 16)}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\nfirst bytes")
				start := time.Now()
				_, _ = io.Copy(io.Discard, c) // ends when the proxy gives up (or at cleanup)
				b.closed <- time.Since(start)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return b
}

// TestBackendStallsMidBody: a backend that sends a head and part of the
// body and then stalls is cut after read-timeout, on both engines; the
// client gets a truncated response instead of waiting forever.
func TestBackendStallsMidBody(t *testing.T) {
	for _, v := range engines() {
		t.Run(v.String(), func(t *testing.T) {
			be := newStallingBackend(t)
			cfg := poolConfig(be.ln.Addr().String())
			v.set(t, &cfg)
			cfg.Backends[0].ReadTimeout = 300 * time.Millisecond
			l := startLB(t, cfg, nil)
			c := v.client()
			resp, err := c.Get(v.url(l, "web") + "/stall")
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			d := time.Since(start)
			if err == nil {
				t.Errorf("read %d bytes of a stalled body without an error", len(body))
			}
			if d < 200*time.Millisecond || d > 3*time.Second {
				t.Errorf("stalled body ended after %v, want about the 300ms read-timeout", d)
			}
			select {
			case d := <-be.closed:
				if d > 3*time.Second {
					t.Errorf("backend connection closed %v after the stall", d)
				}
			case <-time.After(5 * time.Second):
				t.Error("the proxy still holds the stalled backend connection")
			}
		})
	}
}

// TestHeldClientGoesAway: a request held (no eligible server) whose client
// disconnects leaves the hold queue at once and is counted, on both
// engines; it does not wait out hold-timeout.
func TestHeldClientGoesAway(t *testing.T) {
	for _, v := range engines() {
		t.Run(v.String(), func(t *testing.T) {
			cfg := poolConfig("127.0.0.1:1")
			v.set(t, &cfg)
			cfg.Backends[0].HoldTimeout = durPtr(30 * time.Second)
			l := startLB(t, cfg, func(l *LB) {
				g := l.Group("pool")
				g.servers[0].admin.Store(uint32(AdminMaint))
				g.recompute("test")
			})
			g := l.Group("pool")
			for i := range 3 {
				c := v.dial(t, l.ListenerAddr("web").String())
				if _, err := io.WriteString(c, "GET /held HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				waitFor(t, 5*time.Second, "the request held", func() bool { return g.waiting.Load() == 1 })
				start := time.Now()
				_ = c.Close()
				waitFor(t, 5*time.Second, "the hold released", func() bool { return g.waiting.Load() == 0 })
				if d := time.Since(start); d > 2*time.Second {
					t.Errorf("held request left the queue %v after its client closed", d)
				}
				if n := counterValue(g.m.holdCancelled.WithLabelValues("pool")); n != float64(i+1) {
					t.Errorf("hold_cancelled_total = %v, want %d", n, i+1)
				}
			}
		})
	}
}
