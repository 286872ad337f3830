package lb

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// echoBackend reports what it received and offers streaming and upgrade.
func echoBackend(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{}, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Got-Host", r.Host)
		w.Header().Set("X-Got-XFF", r.Header.Get("X-Forwarded-For"))
		w.Header().Set("X-Got-Real-IP", r.Header.Get("X-Real-IP"))
		w.Header().Set("X-Got-Proto", r.Header.Get("X-Forwarded-Proto"))
		w.Header().Set("X-Got-Fwd-Host", r.Header.Get("X-Forwarded-Host"))
		w.Header().Set("X-Got-Foo", r.Header.Get("X-Foo"))
		w.Header().Set("X-Got-Keep-Alive", r.Header.Get("Keep-Alive"))
		w.Header().Set("X-Got-Len", r.Header.Get("Content-Length"))
		w.Header().Set("Keep-Alive", "timeout=5") // hop-by-hop: must not reach the client
		_, _ = w.Write(body)
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		select { // the second part only after the client saw the first
		case <-release:
		case <-time.After(5 * time.Second):
		}
		_, _ = io.WriteString(w, "second\n")
	})
	mux.HandleFunc("/release", func(w http.ResponseWriter, r *http.Request) {
		release <- struct{}{}
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "no upgrade", 400)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		_, _ = io.Copy(c, brw) // echo
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// TestProxyCorrectness covers forwarding headers, hop-by-hop removal,
// bodies of known and unknown length, streaming and Upgrade, on both engines.
func TestProxyCorrectness(t *testing.T) {
	be := echoBackend(t)
	for _, v := range engines() {
		t.Run(v.String(), func(t *testing.T) {
			cfg := poolConfig(be)
			v.set(t, &cfg)
			l := startLB(t, cfg, nil)
			url := v.url(l, "web")
			c := v.client()

			req, _ := http.NewRequest("POST", url+"/echo", strings.NewReader("hello body"))
			req.Host = "app.example"
			req.Header.Set("X-Forwarded-For", "10.9.8.7")
			req.Header.Set("Connection", "X-Foo")
			req.Header.Set("X-Foo", "secret")
			req.Header.Set("Keep-Alive", "timeout=9")
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			proto := map[bool]string{false: "http", true: "https"}[v.tls]
			want := map[string]string{"X-Got-Host": "app.example", "X-Got-XFF": "10.9.8.7, 127.0.0.1",
				"X-Got-Real-IP": "127.0.0.1", "X-Got-Proto": proto, "X-Got-Fwd-Host": "app.example",
				"X-Got-Foo": "", "X-Got-Keep-Alive": "", "X-Got-Len": "10", "Keep-Alive": ""}
			for k, v := range want {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			if string(body) != "hello body" {
				t.Errorf("body %q", body)
			}

			// Unknown-length upload (chunked).
			pr, pw := io.Pipe()
			go func() {
				for range 3 {
					_, _ = pw.Write([]byte("chunk."))
				}
				pw.Close()
			}()
			req, _ = http.NewRequest("PUT", url+"/echo", pr)
			resp, err = c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != "chunk.chunk.chunk." {
				t.Errorf("chunked upload echoed %q", body)
			}

			// Streaming: the first part arrives before the backend finishes.
			resp, err = c.Get(url + "/stream")
			if err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(resp.Body)
			line, err := br.ReadString('\n')
			if err != nil || line != "first\n" {
				t.Fatalf("stream first part: %q %v", line, err)
			}
			r2, err := c.Get(url + "/release")
			if err != nil {
				t.Fatal(err)
			}
			r2.Body.Close()
			rest, _ := io.ReadAll(br)
			resp.Body.Close()
			if string(rest) != "second\n" {
				t.Errorf("stream rest %q", rest)
			}

			// Upgrade (WebSocket handshake, then raw bytes both ways).
			conn := v.dial(t, l.ListenerAddr("web").String())
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
			cr := bufio.NewReader(conn)
			status, _ := cr.ReadString('\n')
			if !strings.HasPrefix(status, "HTTP/1.1 101") {
				t.Fatalf("upgrade status %q", status)
			}
			for {
				l, _ := cr.ReadString('\n')
				if l == "\r\n" || l == "" {
					break
				}
			}
			_, _ = io.WriteString(conn, "ping")
			got := make([]byte, 4)
			if _, err := io.ReadFull(cr, got); err != nil || string(got) != "ping" {
				t.Errorf("upgraded echo %q %v", got, err)
			}
		})
	}
}

// TestTLSListener: a TLS listener offers HTTP/2 and HTTP/1.1 by ALPN. On
// engine fast, HTTP/2 goes to net/http and HTTP/1.1 (or no ALPN) to the
// fast engine (seen by its refusal of a bare-LF head, which net/http
// accepts); both tell the backend X-Forwarded-Proto: https. Plain HTTP sent
// to it gets a readable 400. The fast engine also with fifo-reads off
// (its socket then waits on Go's poller alone).
func TestTLSListener(t *testing.T) {
	be := echoBackend(t)
	for _, mode := range []struct{ engine, fifo string }{{"fast", "on"}, {"fast", "off"}, {"std", "on"}} {
		engine := mode.engine
		t.Run(engine+"/fifo-reads-"+mode.fifo, func(t *testing.T) {
			cfg := poolConfig(be)
			cfg.FIFOReads = mode.fifo
			v := variant{engine: engine, tls: true}
			v.set(t, &cfg)
			l := startLB(t, cfg, nil)
			addr := l.ListenerAddr("web").String()
			for _, alpn := range [][]string{{"h2", "http/1.1"}, {"http/1.1"}, nil} {
				tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, NextProtos: alpn},
					ForceAttemptHTTP2: len(alpn) == 2}
				c := &http.Client{Timeout: 5 * time.Second, Transport: tr}
				resp, err := c.Get("https://" + addr + "/echo")
				if err != nil {
					t.Fatalf("ALPN %q: %v", alpn, err)
				}
				resp.Body.Close()
				tr.CloseIdleConnections()
				if want := map[bool]int{true: 2, false: 1}[len(alpn) == 2]; resp.ProtoMajor != want {
					t.Errorf("ALPN %q: protocol %s, want HTTP/%d", alpn, resp.Proto, want)
				}
				if got := resp.Header.Get("X-Got-Proto"); got != "https" {
					t.Errorf("ALPN %q: X-Forwarded-Proto %q, want https", alpn, got)
				}
			}
			st, _, _ := rawExchange(t, variant{engine: engine, tls: true}, addr, "GET /echo HTTP/1.1\nHost: x\nConnection: close\n\n", -1, false)
			if want := map[string]int{"fast": 400, "std": 200}[engine]; len(st) != 1 || st[0] != want {
				t.Errorf("bare-LF head over TLS: %v, want [%d] (the %s engine)", st, want, engine)
			}
			st, bodies, _ := rawExchange(t, variant{engine: engine}, addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", -1, false)
			if len(st) != 1 || st[0] != 400 || !strings.Contains(bodies[0], "HTTPS") {
				t.Errorf("plain HTTP to the TLS port: %v %q, want a 400 that says so", st, bodies)
			}
		})
	}
}

// TestTLSSessionTickets: tls-session-tickets false makes every connection
// a full handshake (as the benchmark sets every peer); by default a client
// resumes.
func TestTLSSessionTickets(t *testing.T) {
	be := echoBackend(t)
	for _, tickets := range []bool{true, false} {
		t.Run(strconv.FormatBool(tickets), func(t *testing.T) {
			cfg := poolConfig(be)
			variant{engine: "fast", tls: true}.set(t, &cfg)
			if !tickets {
				cfg.Listeners[0].TLSSessionTickets = &tickets
			}
			l := startLB(t, cfg, nil)
			tc := &tls.Config{InsecureSkipVerify: true, ClientSessionCache: tls.NewLRUClientSessionCache(4)}
			var resumed []bool
			for range 2 {
				c, err := tls.Dial("tcp", l.ListenerAddr("web").String(), tc)
				if err != nil {
					t.Fatal(err)
				}
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				// A request and its answer: TLS 1.3 tickets come after the
				// handshake, read with the first response.
				_, _ = io.WriteString(c, "GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
				_, _ = io.Copy(io.Discard, c)
				resumed = append(resumed, c.ConnectionState().DidResume)
				_ = c.Close()
			}
			if resumed[0] || resumed[1] != tickets {
				t.Errorf("resumed %v, want [false %v]", resumed, tickets)
			}
		})
	}
}

func selfSigned(t testing.TB) (certFile, keyFile string) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	_ = os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	_ = os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	return certFile, keyFile
}

// TestTLSReloadAndShutdown: a reload's certificate is what new handshakes
// get, on HTTP/1.1 and HTTP/2 alike; at shutdown idle TLS connections of
// both kinds are closed at once, not after shutdown-timeout.
func TestTLSReloadAndShutdown(t *testing.T) {
	be := echoBackend(t)
	cfg := poolConfig(be)
	cfg.ShutdownTimeout = 20 * time.Second
	variant{engine: "fast", tls: true}.set(t, &cfg)
	l, err := New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	<-l.Ready()
	addr := l.ListenerAddr("web").String()
	leaf := func(alpn string) []byte {
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{alpn}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Raw
	}
	before := leaf("http/1.1")
	cfg2 := cfg
	cfg2.Listeners = slices.Clone(cfg.Listeners)
	variant{engine: "fast", tls: true}.set(t, &cfg2)
	if err := l.Reload(cfg2); err != nil {
		t.Fatal(err)
	}
	for _, alpn := range []string{"http/1.1", "h2"} {
		if bytes.Equal(leaf(alpn), before) {
			t.Errorf("ALPN %s: the old certificate after reload", alpn)
		}
	}
	// Idle connections of both kinds, then shutdown.
	var clients []*http.Client
	for _, alpn := range [][]string{{"http/1.1"}, {"h2", "http/1.1"}} {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true, NextProtos: alpn}, ForceAttemptHTTP2: len(alpn) == 2}}
		resp, err := c.Get("https://" + addr + "/echo")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		clients = append(clients, c)
	}
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("lb did not stop")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("shutdown took %v with idle TLS connections (shutdown-timeout 20s)", d)
	}
	for _, c := range clients {
		c.CloseIdleConnections()
	}
}
