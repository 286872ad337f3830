package lb

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHostileClients is Must-show 7: slowloris is cut at the header
// timeout, oversized or too many headers get 431, and a client that stops
// reading does not stall others; on the fast engine, plain and over TLS.
func TestHostileClients(t *testing.T) {
	for _, v := range []variant{{engine: "fast"}, {engine: "fast", tls: true}} {
		t.Run(v.String(), func(t *testing.T) { testHostileClients(t, v) })
	}
}

func testHostileClients(t *testing.T, v variant) {
	big := newFakeNode(t, "big")
	bigBody := strings.Repeat("x", 32<<20)
	bigSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			_, _ = io.WriteString(w, bigBody)
			return
		}
		big.ServeHTTP(w, r)
	})}
	bigLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = bigSrv.Serve(bigLn) }()
	t.Cleanup(func() { _ = bigSrv.Close() })

	cfg := poolConfig(bigLn.Addr().String())
	cfg.Listeners[0].MaxHeaderBytes = 8192
	cfg.Listeners[0].MaxHeaderCount = 50
	// Slowloris on a listener of its own with a short header timeout (over
	// TLS it bounds the handshake too, which a loaded machine may stretch
	// past it for the other cases' fresh connections).
	slow := cfg.Listeners[0]
	slow.Name, slow.ReadHeaderTimeout = "slow", 300*time.Millisecond
	cfg.Listeners = append(cfg.Listeners, slow)
	v.set(t, &cfg)
	l := startLB(t, cfg, nil)
	addr := l.ListenerAddr("web").String()

	t.Run("slowloris", func(t *testing.T) {
		c := v.dial(t, l.ListenerAddr("slow").String())
		defer c.Close()
		start := time.Now()
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n")
		closed := make(chan time.Duration, 1)
		go func() {
			_, _ = io.Copy(io.Discard, c) // returns when the proxy closes
			closed <- time.Since(start)
		}()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case d := <-closed:
				if d < 250*time.Millisecond || d > 3*time.Second {
					t.Errorf("slowloris cut after %v, want about the 300ms header timeout", d)
				}
				return
			case <-tick.C:
				if _, err := io.WriteString(c, "X-Slow-"+strconv.Itoa(i)+": y\r\n"); err != nil {
					t.Logf("write failed after %v: %v", time.Since(start), err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("slowloris connection still open after 5s")
			}
		}
	})

	t.Run("oversized-header", func(t *testing.T) {
		req, _ := http.NewRequest("GET", v.url(l, "web")+"/", nil)
		req.Header.Set("X-Big", strings.Repeat("a", 64<<10))
		resp, err := v.client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("oversized header: %s, want 431", resp.Status)
		}
	})

	t.Run("too-many-headers", func(t *testing.T) {
		req, _ := http.NewRequest("GET", v.url(l, "web")+"/", nil)
		for i := range 80 {
			req.Header.Set("X-H"+strconv.Itoa(i), "v")
		}
		resp, err := v.client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("80 header fields: %s, want 431", resp.Status)
		}
	})

	t.Run("stalled-reader", func(t *testing.T) {
		c := v.dial(t, addr)
		defer c.Close()
		_, _ = io.WriteString(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
		// Read only the status line, then stop reading.
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		cl := v.client()
		for i := range 20 {
			start := time.Now()
			resp, err := cl.Get(v.url(l, "web") + "/small")
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if d := time.Since(start); resp.StatusCode != 200 || d > time.Second {
				t.Fatalf("request %d beside a stalled reader: %s in %v", i, resp.Status, d)
			}
		}
	})
}
