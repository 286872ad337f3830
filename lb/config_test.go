package lb

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/config"
)

// TestValidateNamesField: every config error names the dotted field.
func TestValidateNamesField(t *testing.T) {
	base := func() Config {
		c := poolConfig("127.0.0.1:9000")
		c.Admin.Listen = "127.0.0.1:7480"
		return c
	}
	cases := []struct {
		field string
		edit  func(*Config)
	}{
		{"log-level", func(c *Config) { c.LogLevel = "loud" }},
		{"event-loop", func(c *Config) { c.EventLoop = "yes" }},
		{"event-loop", func(c *Config) { c.EventLoop, c.FIFOReads = "on", "off" }},
		{"listeners[0].backend", func(c *Config) { c.Listeners[0].Backend = "nope" }},
		{"listeners[0].mode", func(c *Config) { c.Listeners[0].Mode = "udp" }},
		{"listeners[0].engine", func(c *Config) { c.Listeners[0].Engine = "turbo" }},
		{"listeners[0].tls-session-tickets", func(c *Config) { off := false; c.Listeners[0].TLSSessionTickets = &off }},
		{"backends[0].kind", func(c *Config) { c.Backends[0].Kind = "magic" }},
		{"backends[0].balance", func(c *Config) { c.Backends[0].Balance = "random" }},
		{"backends[0].servers[0].address", func(c *Config) { c.Backends[0].Servers[0].Address = "nohost" }},
		{"backends[0].servers[0].weight", func(c *Config) { c.Backends[0].Servers[0].Weight = 999 }},
		{"backends[0].check.timeout", func(c *Config) {
			on := true
			c.Backends[0].Check = CheckConfig{Enabled: &on, Interval: time.Second, Timeout: 2 * time.Second}
		}},
		{"backends[0].hold-timeout", func(c *Config) { c.Backends[0].HoldTimeout = durPtr(-time.Second) }},
		{"backends[0].idle-surplus-timeout", func(c *Config) { c.Backends[0].IdleSurplusTimeout = durPtr(-time.Second) }},
		{"backends[0].etcd-fast-path", func(c *Config) { c.Backends[0].EtcdFastPath = true }},
		{"etcd.endpoints[0]", func(c *Config) { c.Etcd.Endpoints = []string{"10.0.0.1:2379"} }},
		{"backends[0].check.enabled", func(c *Config) {
			off := false
			c.Backends[0].Kind = KindActivePassive
			c.Backends[0].Check.Enabled = &off
		}},
	}
	for _, tc := range cases {
		c := base()
		tc.edit(&c)
		err := c.Validate()
		var fe *config.FieldError
		if err == nil || !errorsAs(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: got %v", tc.field, err)
		}
	}
	c := base()
	if err := c.Validate(); err != nil {
		t.Fatalf("base config: %v", err)
	}
}

func errorsAs(err error, fe **config.FieldError) bool {
	e, ok := err.(*config.FieldError)
	if ok {
		*fe = e
	}
	return ok
}

// TestParseRequestStrict: the lean parser refuses what enables smuggling.
func TestParseRequestStrict(t *testing.T) {
	cases := []struct {
		raw  string
		code int
	}{
		{"GET / HTTP/1.1\r\nHost: a\r\n\r\n", 0},
		{"GET / HTTP/1.0\r\n\r\n", 0},
		{"GET / HTTP/1.1\r\n\r\n", 400}, // no Host
		{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
		{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400},
		{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
		{"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n folded\r\n\r\n", 400},
		{"GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400},
		{"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505},
		{"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", 400},
		{"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
		{"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400},
		{"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n", 405},
	}
	for _, tc := range cases {
		var h head
		h.reset()
		h.raw = []byte(tc.raw)
		if got := h.parseRequest(100); got != tc.code {
			t.Errorf("%q: %d, want %d", tc.raw, got, tc.code)
		}
	}
	var h head
	h.reset()
	h.raw = []byte("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n")
	if got := h.parseRequest(3); got != 431 {
		t.Errorf("header count limit: %d, want 431", got)
	}
}

// TestCopyChunked decodes chunked framing and writes it anew: extensions
// and trailers are dropped, sizes re-encoded, the reader left just after.
func TestCopyChunked(t *testing.T) {
	in := "05\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT"
	src := bufio.NewReader(strings.NewReader(in))
	var out bytes.Buffer
	dst := newWbuf(&out, 4096)
	if err := copyChunked(dst, src, true, false); err != nil {
		t.Fatal(err)
	}
	_ = dst.Flush()
	if want := "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"; out.String() != want {
		t.Errorf("re-encoded %q, want %q", out.String(), want)
	}
	if rest, _ := src.ReadString(0); rest != "NEXT" {
		t.Errorf("left %q in the reader", rest)
	}
	if err := copyChunked(dst, bufio.NewReader(strings.NewReader("zz\r\n")), true, false); err == nil {
		t.Error("bad chunk size accepted")
	}
}
