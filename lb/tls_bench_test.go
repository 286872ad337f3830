package lb

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
)

// BenchmarkRequest: one keep-alive HTTP/1.1 request with a 100-byte
// answer through the balancer, per variant (plain fast, TLS on the fast
// engine, TLS on net/http). The client and the backend reuse their buffers,
// so allocs/op is what a request costs the balancer: evidence that does not
// depend on the machine's load (the time per op does).
//
//	go test -run '^$' -bench BenchmarkRequest -benchmem ./lb/
func BenchmarkRequest(b *testing.B) {
	be := fixedBackend(b)
	for _, v := range []variant{{engine: "fast"}, {engine: "fast", tls: true}, {engine: "std", tls: true}} {
		b.Run(v.String(), func(b *testing.B) {
			cfg := poolConfig(be)
			v.set(b, &cfg)
			l := startLB(b, cfg, nil)
			c, err := net.Dial("tcp", l.ListenerAddr("web").String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			if v.tls {
				tc := tls.Client(c, v.clientTLS())
				if err := tc.Handshake(); err != nil {
					b.Fatal(err)
				}
				c = tc
			}
			req := []byte("GET /small HTTP/1.1\r\nHost: x\r\nUser-Agent: bench\r\n\r\n")
			br := bufio.NewReaderSize(c, 4096)
			for b.Loop() {
				if _, err := c.Write(req); err != nil {
					b.Fatal(err)
				}
				if err := readFixedResponse(br); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// readFixedResponse reads one response with a Content-Length, allocating
// nothing.
func readFixedResponse(br *bufio.Reader) error {
	n := -1
	for first := true; ; first = false {
		l, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if first && !bytes.HasPrefix(l, []byte("HTTP/1.1 200 ")) {
			return io.ErrUnexpectedEOF
		}
		if len(l) <= 2 {
			break
		}
		if k, v, ok := bytes.Cut(l, []byte(":")); ok && bytes.EqualFold(k, []byte("Content-Length")) {
			n, err = strconv.Atoi(string(bytes.TrimSpace(v)))
			if err != nil {
				return err
			}
		}
	}
	_, err := br.Discard(n)
	return err
}

// fixedBackend answers every request (bodiless, read up to its blank line)
// with the same 100-byte response.
func fixedBackend(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("a"), 99)
	resp := append([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n"), append(body, '\n')...)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
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
				br := bufio.NewReader(c)
				for {
					l, err := br.ReadSlice('\n')
					if err != nil {
						return
					}
					if len(l) <= 2 {
						if _, err := c.Write(resp); err != nil {
							return
						}
					}
				}
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
	return ln.Addr().String()
}

// TestTLSRequestAllocs: a keep-alive HTTP/1.1 request over TLS on the
// fast engine allocates next to nothing (crypto/tls's one per record read,
// on each side; net/http's path took 28): a guard for the common TLS path.
func TestTLSRequestAllocs(t *testing.T) {
	v := variant{engine: "fast", tls: true}
	cfg := poolConfig(fixedBackend(t))
	v.set(t, &cfg)
	l := startLB(t, cfg, nil)
	c := v.dial(t, l.ListenerAddr("web").String())
	defer c.Close()
	req := []byte("GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReaderSize(c, 4096)
	run := func() {
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		if err := readFixedResponse(br); err != nil {
			t.Fatal(err)
		}
	}
	run() // the backend connection and the buffers exist from here on
	// 2 measured (5 in race builds); the bound leaves room for the
	// runtime's noise and still tells the fast path from net/http's.
	if n := testing.AllocsPerRun(500, run); n > 8 {
		t.Errorf("%v allocations per request over TLS, want at most 8", n)
	}
}
