package lb

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestShutdownServesAcceptedConnections: a connection the balancer accepted
// before it stopped accepting gets its first request answered (with
// Connection: close), not an EOF: its client never used it, so it cannot
// tell a closed idle connection from a lost request and will not retry.
// That is what a restart under socket activation needs (the listening
// socket stays open in systemd; what the old process accepted, it serves).
// A connection that has served a request and waits for the next is closed
// at once; one that sends nothing is closed after newConnGrace.
func TestShutdownServesAcceptedConnections(t *testing.T) {
	defer func(g time.Duration) { newConnGrace = g }(newConnGrace)
	newConnGrace = 300 * time.Millisecond
	for _, tc := range []struct {
		name string
		loop string
		tls  bool
	}{{"fast-loop", "on", false}, {"fast-goroutines", "off", false}, {"fast-tls", "on", true}} {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := loopBackend(t, 0)
			cfg := loopConfig(addr)
			cfg.EventLoop = tc.loop
			cfg.Listeners[0].IdleTimeout = time.Minute
			cfg.ShutdownTimeout = 20 * time.Second
			variant{engine: "fast", tls: tc.tls}.set(t, &cfg)
			l := startLB(t, cfg, nil)
			dial := func() (net.Conn, *bufio.Reader) {
				c, br := loopDial(t, l)
				if tc.tls {
					tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true})
					t.Cleanup(func() { _ = tc.Close() })
					return tc, bufio.NewReader(tc)
				}
				return c, br
			}
			used, ubr := dial()
			getSmall(t, used, ubr, "before shutdown")
			var fresh []net.Conn
			var fbr []*bufio.Reader
			for range 4 {
				c, br := dial()
				if tlc, ok := c.(*tls.Conn); ok && len(fresh)%2 == 0 {
					// Half the TLS ones finish their handshake first.
					if err := tlc.Handshake(); err != nil {
						t.Fatal(err)
					}
				}
				fresh, fbr = append(fresh, c), append(fbr, br)
			}
			silent, _ := dial()
			ln := l.listeners["web"]
			waitFor(t, 5*time.Second, "six connections accepted", func() bool {
				ln.h1.mu.Lock()
				defer ln.h1.mu.Unlock()
				return len(ln.h1.conns) == 6
			})
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				ln.shutdown(context.Background(), l.lg)
			}()
			waitFor(t, 5*time.Second, "shutting down", ln.h1.shutting.Load)
			if _, err := used.Read(make([]byte, 1)); err == nil {
				t.Error("the used idle connection: read a byte at shutdown, want it closed")
			}
			for i, c := range fresh {
				resp, _ := exchange1(t, c, fbr[i], "GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
				if resp.StatusCode != http.StatusOK || !resp.Close {
					t.Errorf("connection %d accepted before shutdown: %d, close %v; want 200 with Connection: close", i, resp.StatusCode, resp.Close)
				}
				if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
					t.Errorf("connection %d after its answer: %d bytes, %v; want its end", i, n, err)
				}
			}
			start := time.Now()
			if _, err := silent.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && err == nil {
				t.Errorf("the silent connection: %v, want it closed", err)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("the silent connection closed after %v, want about newConnGrace", d)
			}
			select {
			case <-stopped:
			case <-time.After(15 * time.Second):
				t.Fatal("the drain did not end")
			}
		})
	}
}
