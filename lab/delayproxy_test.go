package lab

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// echoServer echoes every connection until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveEcho(t, ln, nil)
	return ln.Addr().String()
}

// serveEcho accepts on ln until the test ends; each connection first gets
// greet's bytes (when greet is set), then an echo of what it sends. The
// cleanup closes ln and every connection and waits for their goroutines.
func serveEcho(t *testing.T, ln net.Listener, greet func(c net.Conn) []byte) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
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
				defer c.Close()
				if greet != nil {
					if _, err := c.Write(greet(c)); err != nil {
						return
					}
				}
				_, _ = io.Copy(c, c)
			}()
		}
	}()
}

func startProxy(t *testing.T, p *DelayProxy) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Serve did not return after cancel")
		}
	})
	return ln.Addr().String()
}

// TestDelayProxyDelays: a round trip through the proxy takes at least the
// two one-way delays (a lower bound only: load can only add to it).
func TestDelayProxyDelays(t *testing.T) {
	addr := startProxy(t, &DelayProxy{Target: echoServer(t), Delay: 50 * time.Millisecond})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 4)
	for range 3 {
		start := time.Now()
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		if rtt := time.Since(start); rtt < 100*time.Millisecond || string(buf) != "ping" {
			t.Fatalf("round trip %s with %q, want ≥ 100ms with ping", rtt, buf)
		}
	}
}

// TestDelayProxyKeepsOrder: with jitter larger than the gap between writes,
// a megabyte still arrives intact and in order, and EOF passes through.
func TestDelayProxyKeepsOrder(t *testing.T) {
	addr := startProxy(t, &DelayProxy{Target: echoServer(t), Delay: 5 * time.Millisecond, Jitter: 5 * time.Millisecond})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := make([]byte, 1<<20)
	_, _ = rand.Read(want)
	go func() {
		for off := 0; off < len(want); off += 7000 {
			if _, err := c.Write(want[off:min(off+7000, len(want))]); err != nil {
				return
			}
		}
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want the %d sent, in order", len(got), len(want))
	}
}

// TestDelayProxyStops: cancel closes open connections and Serve returns
// (checked in startProxy's cleanup).
func TestDelayProxyStops(t *testing.T) {
	addr := startProxy(t, &DelayProxy{Target: echoServer(t), Delay: time.Millisecond})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
}

func TestDelayProxyJitterRange(t *testing.T) {
	p := &DelayProxy{Delay: 20 * time.Millisecond, Jitter: 10 * time.Millisecond}
	for range 1000 {
		if d := p.delay(); d < 10*time.Millisecond || d > 30*time.Millisecond {
			t.Fatalf("delay %s outside 20ms ± 10ms", d)
		}
	}
}
