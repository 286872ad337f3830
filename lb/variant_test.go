package lb

import (
	"crypto/tls"
	"net"
	"net/http"
	"testing"
	"time"
)

// variant is one way a listener serves HTTP/1.1: an engine, over plain
// TCP or TLS. The end-to-end tests run on every variant, so the TLS path
// meets the same smuggling cases, timeouts and forwarding rules as the
// plain one.
type variant struct {
	engine string // fast or std
	tls    bool
	// alpn is what the test client offers (nil: no ALPN, as wrk and curl
	// --http1.1 without ALPN do).
	alpn []string
}

func (v variant) String() string {
	if v.tls {
		return v.engine + "-tls"
	}
	return v.engine
}

// engines lists the variants: both engines, plain and TLS.
func engines() []variant {
	return []variant{
		{engine: "fast"}, {engine: "std"},
		{engine: "fast", tls: true}, {engine: "std", tls: true, alpn: []string{"http/1.1"}},
	}
}

// set makes cfg's listeners serve v (TLS: a fresh self-signed ECDSA
// P-256 certificate).
func (v variant) set(t testing.TB, cfg *Config) {
	t.Helper()
	var cert, key string
	if v.tls {
		cert, key = selfSigned(t)
	}
	for i := range cfg.Listeners {
		lc := &cfg.Listeners[i]
		lc.Engine = v.engine
		lc.TLS.CertFile, lc.TLS.KeyFile = cert, key
	}
}

func (v variant) clientTLS() *tls.Config {
	return &tls.Config{InsecureSkipVerify: true, NextProtos: v.alpn}
}

// dial opens a client connection to addr; over TLS the handshake is done.
func (v variant) dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !v.tls {
		return c
	}
	tc := tls.Client(c, v.clientTLS())
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		_ = c.Close()
		t.Fatalf("TLS handshake: %v", err)
	}
	_ = tc.SetDeadline(time.Time{})
	if p := tc.ConnectionState().NegotiatedProtocol; p == "h2" {
		t.Fatalf("ALPN chose %q for an HTTP/1.1 client", p)
	}
	return tc
}

// halfClose ends the client's sending side (over TLS: close_notify, then
// the TCP half-close).
func halfClose(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		_ = tc.CloseWrite()
		c = tc.NetConn()
	}
	_ = c.(*net.TCPConn).CloseWrite()
}

// client is an HTTP/1.1 client for v.
func (v variant) client() *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	if v.tls {
		tr.TLSClientConfig = v.clientTLS() // a custom config: no HTTP/2
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: tr}
}

// url is the base URL of listener name for v.
func (v variant) url(l *testLB, name string) string {
	if v.tls {
		return "https://" + l.ListenerAddr(name).String()
	}
	return "http://" + l.ListenerAddr(name).String()
}
