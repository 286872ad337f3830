package lb

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// loopBackend serves the shapes the event loop must serve itself or hand
// over: small and large bodies, chunked, a POST echo and a slow answer.
func loopBackend(t *testing.T, idle time.Duration) (string, *atomic.Int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Got-XFF", r.Header.Get("X-Forwarded-For"))
		w.Header().Set("X-Got-Proto", r.Header.Get("X-Forwarded-Proto"))
		_, _ = io.WriteString(w, strings.Repeat("a", 99)+"\n")
	})
	mux.HandleFunc("/mid", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "24000") // relayed by the loop, in one write
		_, _ = io.WriteString(w, strings.Repeat("m", 24000))
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100000")
		_, _ = io.WriteString(w, strings.Repeat("b", 100000))
	})
	mux.HandleFunc("/chunked", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "one\n")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, "two\n")
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(w, r.Body)
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(2 * time.Second):
		case <-r.Context().Done():
		}
	})
	closed := new(atomic.Int64)
	srv := &http.Server{Handler: mux, IdleTimeout: idle, ConnState: func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			closed.Add(1)
		}
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String(), closed
}

// loopDial opens a client connection to l's "web" listener, closed at the
// end of the test.
func loopDial(t *testing.T, l *testLB) (net.Conn, *bufio.Reader) {
	return loopDialV(t, l, variant{engine: "fast"})
}

// loopVariants: the event loop hosts plain and TLS connections alike.
func loopVariants() []variant {
	return []variant{{engine: "fast"}, {engine: "fast", tls: true}}
}

// loopDialV is loopDial for the variant v (over TLS: handshake done).
func loopDialV(t *testing.T, l *testLB, v variant) (net.Conn, *bufio.Reader) {
	t.Helper()
	c := v.dial(t, l.ListenerAddr("web").String())
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return c, bufio.NewReader(c)
}

// getSmall asks for /small on c and fails the test unless it gets a 200.
func getSmall(t *testing.T, c net.Conn, br *bufio.Reader, what string) {
	t.Helper()
	if resp, _ := exchange1(t, c, br, "GET /small HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("%s: %d", what, resp.StatusCode)
	}
}

func loopConfig(backend string) Config {
	cfg := DefaultConfig()
	cfg.Admin.Listen = ""
	cfg.EventLoop = "on"
	cfg.ShutdownTimeout = 5 * time.Second
	cfg.Listeners = []ListenerConfig{{Name: "web", Listen: "127.0.0.1:0", Backend: "be", IdleTimeout: 400 * time.Millisecond}}
	cfg.Backends = []BackendConfig{{Name: "be", Kind: KindPool, Check: CheckConfig{Enabled: new(false)},
		ResponseHeaderTimeout: 200 * time.Millisecond, Retries: new(0),
		Servers: []ServerConfig{{Name: "s1", Address: backend}}}}
	return cfg
}

// exchange1 sends raw on c and reads one response.
func exchange1(t *testing.T, c net.Conn, br *bufio.Reader, raw string) (*http.Response, string) {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	return readResp(t, br)
}

func readResp(t *testing.T, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// TestEventLoop: on one keep-alive connection, common requests are served
// by the loop and every other shape is handed to the goroutine path and
// back, with the same answers; idle connections in the loop time out.
func TestEventLoop(t *testing.T) {
	for _, v := range loopVariants() {
		t.Run(v.String(), func(t *testing.T) { testEventLoop(t, v) })
	}
}

func testEventLoop(t *testing.T, v variant) {
	addr, _ := loopBackend(t, 0)
	cfg := loopConfig(addr)
	v.set(t, &cfg)
	l := startLB(t, cfg, nil)
	dial := func() (net.Conn, *bufio.Reader) { return loopDialV(t, l, v) }
	proto := "http"
	if v.tls {
		proto = "https"
	}
	// A response-header timeout met in the loop: 504 and the end of the
	// connection, as on the goroutine path.
	c, br := dial()
	if resp, _ := exchange1(t, c, br, "GET /small HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	if resp, _ := exchange1(t, c, br, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("slow: %d, want 504", resp.StatusCode)
	}
	c, br = dial()
	get := func(path string) (*http.Response, string) {
		return exchange1(t, c, br, "GET "+path+" HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n")
	}
	small := strings.Repeat("a", 99) + "\n"
	for i := 0; i < 20; i++ {
		resp, body := get("/small")
		if resp.StatusCode != 200 || body != small || resp.Header.Get("X-Got-XFF") != "10.0.0.1, 127.0.0.1" ||
			resp.Header.Get("X-Got-Proto") != proto {
			t.Fatalf("small %d: %d %q %q %q", i, resp.StatusCode, body, resp.Header.Get("X-Got-XFF"), resp.Header.Get("X-Got-Proto"))
		}
	}
	served, _ := l.poll.loopCounts()
	if served < 15 {
		t.Fatalf("event loop served %d of 20 requests", served)
	}
	if resp, body := get("/big"); resp.StatusCode != 200 || len(body) != 100000 {
		t.Fatalf("big: %d %d bytes", resp.StatusCode, len(body))
	}
	if resp, body := get("/chunked"); resp.StatusCode != 200 || body != "one\ntwo\n" {
		t.Fatalf("chunked: %d %q", resp.StatusCode, body)
	}
	if resp, body := exchange1(t, c, br, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"); resp.StatusCode != 200 || body != "hello" {
		t.Fatalf("post: %d %q", resp.StatusCode, body)
	}
	// Pipelined: both answered, in order.
	if _, err := io.WriteString(c, "GET /small HTTP/1.1\r\nHost: x\r\n\r\nGET /chunked HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if _, body := readResp(t, br); body != small {
		t.Fatalf("pipelined 1: %q", body)
	}
	if _, body := readResp(t, br); body != "one\ntwo\n" {
		t.Fatalf("pipelined 2: %q", body)
	}
	// A head in two parts waits in the goroutine path (header timeout).
	_, handedBefore := l.poll.loopCounts()
	if _, err := io.WriteString(c, "GET /small HTTP/1.1\r\nHo"); err != nil {
		t.Fatal(err)
	}
	waitHanded(t, l, handedBefore, "the partial head")
	if resp, body := exchange1(t, c, br, "st: x\r\n\r\n"); resp.StatusCode != 200 || body != small {
		t.Fatalf("split head: %d %q", resp.StatusCode, body)
	}
	before, handed := l.poll.loopCounts()
	if handed == 0 {
		t.Fatal("nothing was handed to the goroutine path")
	}
	for i := 0; i < 5; i++ {
		if _, body := get("/small"); body != small {
			t.Fatalf("after hand-overs: %q", body)
		}
	}
	if served, _ := l.poll.loopCounts(); served < before+4 {
		t.Fatalf("loop served %d of 5 requests after hand-overs", served-before)
	}
	// Idle in the loop: closed at idle-timeout.
	start := time.Now()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection: %v, want EOF", err)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("idle connection closed after %s (idle-timeout 400ms)", d)
	}
	h1 := l.listeners["web"].h1
	waitFor(t, 10*time.Second, "connection forgotten", func() bool {
		h1.mu.Lock()
		defer h1.mu.Unlock()
		return len(h1.conns) == 0
	})
}

// TestEventLoopStaleBackend: a pooled connection the backend closed while
// idle is replaced (idempotent request) without an error to the client.
func TestEventLoopStaleBackend(t *testing.T) {
	for _, v := range loopVariants() {
		t.Run(v.String(), func(t *testing.T) {
			addr, closed := loopBackend(t, 50*time.Millisecond)
			cfg := loopConfig(addr)
			v.set(t, &cfg)
			l := startLB(t, cfg, nil)
			c, br := loopDialV(t, l, v)
			for i := 0; i < 4; i++ {
				getSmall(t, c, br, fmt.Sprintf("request %d", i))
				// The backend closes its idle connection before the next request.
				waitFor(t, 5*time.Second, "the backend closed its idle connection", func() bool { return closed.Load() > int64(i) })
			}
		})
	}
}

// TestEventLoopShutdown: connections idle in the loop close at shutdown,
// and Run returns (startLB's cleanup checks it).
func TestEventLoopShutdown(t *testing.T) {
	for _, v := range loopVariants() {
		t.Run(v.String(), func(t *testing.T) { testEventLoopShutdown(t, v) })
	}
}

func testEventLoopShutdown(t *testing.T, v variant) {
	addr, _ := loopBackend(t, 0)
	cfg := loopConfig(addr)
	cfg.Listeners[0].IdleTimeout = time.Minute
	v.set(t, &cfg)
	l := startLB(t, cfg, nil)
	var conns []net.Conn
	for i := 0; i < 8; i++ {
		c, br := loopDialV(t, l, v)
		for j := 0; j < 3; j++ {
			getSmall(t, c, br, fmt.Sprintf("conn %d", i))
		}
		conns = append(conns, c)
	}
	h1 := l.listeners["web"].h1
	go h1.shutdown(t.Context())
	for i, c := range conns {
		if _, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("conn %d: %v, want EOF at shutdown", i, err)
		}
	}
	waitFor(t, 5*time.Second, "connections forgotten", func() bool {
		h1.mu.Lock()
		defer h1.mu.Unlock()
		return len(h1.conns) == 0
	})
}

// TestEventLoopModes: the default (auto) serves through the loop wherever
// the fifo-reads pollers run; off, and auto without those pollers, never do.
func TestEventLoopModes(t *testing.T) {
	addr, _ := loopBackend(t, 0)
	for _, tc := range []struct {
		loop, fifo string
		want       bool
	}{{"", "", true}, {"off", "auto", false}, {"auto", "off", false}} {
		cfg := loopConfig(addr)
		cfg.EventLoop, cfg.FIFOReads = tc.loop, tc.fifo
		l := startLB(t, cfg, nil)
		c, br := loopDial(t, l)
		for i := 0; i < 5; i++ {
			getSmall(t, c, br, fmt.Sprintf("event-loop %q fifo-reads %q, GET %d", tc.loop, tc.fifo, i))
		}
		var served uint64
		if l.poll != nil {
			served, _ = l.poll.loopCounts()
		}
		if got := served > 0; got != tc.want {
			t.Errorf("event-loop %q fifo-reads %q: loop served %d of 5 requests, want loop %v", tc.loop, tc.fifo, served, tc.want)
		}
	}
}

// waitHanded waits until the loop has handed a connection to a goroutine
// since its handoff count was after.
func waitHanded(t *testing.T, l *testLB, after uint64, what string) {
	t.Helper()
	waitFor(t, 10*time.Second, what+" handed to a goroutine", func() bool {
		_, h := l.poll.loopCounts()
		return h > after
	})
}
