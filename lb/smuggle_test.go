package lb

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The end-to-end smuggling suite (issue 15): raw bytes from a client,
// through the running balancer, to a backend that records what it receives
// and parses it either strictly (CR LF only, exact chunk framing) or
// leniently (bare LF as a line end, whatever follows chunk data skipped, a
// trailer line of CRs taken as the end), as backends in the wild do. For
// every case, on both engines and both backend parsers: the backend
// receives exactly the messages the client sent (or none of a refused
// one), never a framing error in what the balancer wrote, and a fresh
// client afterwards gets its own answer.

// rawBackend records the requests it parses from raw bytes.
type rawBackend struct {
	ln     net.Listener
	strict bool

	mu     sync.Mutex
	msgs   []string // "METHOD target body=%q[ host=h][ hdr=...]"
	hdrs   []map[string]string
	errs   []string // framing errors (strict parser) in what the balancer sent
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

var (
	errIncomplete = errors.New("incomplete message")
	errBadFrame   = errors.New("bad framing")
)

func newRawBackend(t *testing.T, strict bool) *rawBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &rawBackend{ln: ln, strict: strict, conns: map[net.Conn]struct{}{}}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			if b.closed {
				b.mu.Unlock()
				_ = c.Close()
				return
			}
			b.conns[c] = struct{}{}
			b.wg.Add(1)
			b.mu.Unlock()
			go b.serve(c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		b.mu.Lock()
		b.closed = true
		for c := range b.conns {
			_ = c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	return b
}

func (b *rawBackend) addr() string { return b.ln.Addr().String() }

func (b *rawBackend) reset() {
	b.mu.Lock()
	b.msgs, b.hdrs, b.errs = nil, nil, nil
	b.mu.Unlock()
}

func (b *rawBackend) got() (msgs, errs []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.msgs), slices.Clone(b.errs)
}

func (b *rawBackend) serve(c net.Conn) {
	defer b.wg.Done()
	defer func() {
		b.mu.Lock()
		delete(b.conns, c)
		b.mu.Unlock()
		_ = c.Close()
	}()
	br := bufio.NewReader(c)
	for {
		method, target, hdr, body, err := b.readRequest(br)
		if err != nil {
			if errors.Is(err, errBadFrame) {
				b.mu.Lock()
				b.errs = append(b.errs, err.Error())
				b.mu.Unlock()
				_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			}
			return
		}
		m := fmt.Sprintf("%s %s body=%q", method, target, body)
		if h := hdr["host"]; h != "x" && h != "" {
			m += " host=" + h
		}
		b.mu.Lock()
		b.msgs = append(b.msgs, m)
		b.hdrs = append(b.hdrs, hdr)
		b.mu.Unlock()
		var resp string
		switch target {
		case "/chunked-resp":
			resp = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"
		case "/hop":
			resp = "HTTP/1.1 200 OK\r\nConnection: " + strings.Join(hopNames("x-r"), ", ") + "\r\n"
			for _, n := range hopNames("x-r") {
				resp += n + ": 1\r\n"
			}
			resp += "Content-Length: 2\r\n\r\nok"
		default:
			resp = "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(target)) + "\r\n\r\n" + target
		}
		if _, err := io.WriteString(c, resp); err != nil {
			return
		}
	}
}

// line reads one line without its end, by the parser's rules.
func (b *rawBackend) line(br *bufio.Reader) (string, error) {
	l, err := br.ReadString('\n')
	if err != nil {
		if l == "" && err == io.EOF {
			return "", io.EOF
		}
		return "", errIncomplete
	}
	if b.strict {
		if !strings.HasSuffix(l, "\r\n") || strings.Count(l, "\r") != 1 {
			return "", fmt.Errorf("%w: line %q", errBadFrame, l)
		}
		return l[:len(l)-2], nil
	}
	return strings.TrimSuffix(strings.TrimSuffix(l, "\n"), "\r"), nil
}

func (b *rawBackend) readRequest(br *bufio.Reader) (method, target string, hdr map[string]string, body string, err error) {
	first := true
	var l string
	for {
		if l, err = b.line(br); err != nil {
			if !first && err == io.EOF {
				err = errIncomplete
			}
			return
		}
		if l != "" {
			break
		}
		first = false
	}
	parts := strings.Split(l, " ")
	if len(parts) != 3 || !strings.HasPrefix(parts[2], "HTTP/1.") {
		err = fmt.Errorf("%w: request line %q", errBadFrame, l)
		return
	}
	method, target = parts[0], parts[1]
	hdr = map[string]string{}
	for {
		if l, err = b.line(br); err != nil {
			err = incomplete(err)
			return
		}
		if l == "" {
			break
		}
		k, v, ok := strings.Cut(l, ":")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			err = fmt.Errorf("%w: field %q", errBadFrame, l)
			return
		}
		k = strings.ToLower(k)
		if _, dup := hdr[k]; dup && b.strict && (k == "content-length" || k == "transfer-encoding" || k == "host") {
			err = fmt.Errorf("%w: duplicate %s", errBadFrame, k)
			return
		}
		hdr[k] = strings.TrimSpace(v)
	}
	switch {
	case strings.EqualFold(hdr["transfer-encoding"], "chunked"):
		if _, ok := hdr["content-length"]; ok && b.strict {
			err = fmt.Errorf("%w: CL and TE", errBadFrame)
			return
		}
		body, err = b.chunked(br)
	case hdr["transfer-encoding"] != "":
		err = fmt.Errorf("%w: TE %q", errBadFrame, hdr["transfer-encoding"])
	case hdr["content-length"] != "":
		n, perr := strconv.Atoi(hdr["content-length"])
		if perr != nil || n < 0 {
			err = fmt.Errorf("%w: CL %q", errBadFrame, hdr["content-length"])
			return
		}
		buf := make([]byte, n)
		if _, rerr := io.ReadFull(br, buf); rerr != nil {
			err = errIncomplete
			return
		}
		body = string(buf)
	}
	return
}

func incomplete(err error) error {
	if err == io.EOF {
		return errIncomplete
	}
	return err
}

func (b *rawBackend) chunked(br *bufio.Reader) (string, error) {
	var body strings.Builder
	for {
		l, err := b.line(br)
		if err != nil {
			return "", incomplete(err)
		}
		hex := l
		if b.strict {
			hex, _, _ = strings.Cut(l, ";")
		} else {
			i := 0
			for i < len(l) && strings.IndexByte("0123456789abcdefABCDEF", l[i]) >= 0 {
				i++
			}
			hex = l[:i]
		}
		n, perr := strconv.ParseUint(hex, 16, 62)
		if perr != nil {
			return "", fmt.Errorf("%w: chunk size %q", errBadFrame, l)
		}
		if n == 0 {
			for { // trailers
				l, err := br.ReadString('\n')
				if err != nil {
					return "", errIncomplete
				}
				if b.strict && (!strings.HasSuffix(l, "\r\n") || strings.Count(l, "\r") != 1) {
					return "", fmt.Errorf("%w: trailer %q", errBadFrame, l)
				}
				if strings.Trim(l, "\r\n") == "" {
					return body.String(), nil
				}
			}
		}
		buf := make([]byte, n)
		if _, err := io.ReadFull(br, buf); err != nil {
			return "", errIncomplete
		}
		body.Write(buf)
		if b.strict {
			var crlf [2]byte
			if _, err := io.ReadFull(br, crlf[:]); err != nil {
				return "", errIncomplete
			}
			if string(crlf[:]) != "\r\n" {
				return "", fmt.Errorf("%w: after chunk data %q", errBadFrame, crlf[:])
			}
		} else { // whatever follows the data: CR LF, LF, or two bytes
			if p, err := br.Peek(1); err == nil && p[0] == '\n' {
				_, _ = br.Discard(1)
			} else {
				_, _ = br.Discard(2)
			}
		}
	}
}

// hopNames: one header name of every length from 2 to 19, with a prefix.
func hopNames(prefix string) []string {
	var out []string
	for n := 2; n <= 19; n++ {
		name := prefix + "-" + strings.Repeat("h", 20)
		if n < len(prefix)+1 {
			name = strings.Repeat("h", n)
		} else {
			name = name[:n]
		}
		out = append(out, name)
	}
	return out
}

type smuggleCase struct {
	name string
	raw  string
	// n responses are read (-1: until the balancer closes); status lists
	// the acceptable status sequences, want the acceptable lists of
	// messages at the backend.
	n         int
	halfClose bool
	wantClose bool
	status    [][]int
	want      [][]string
	// Where net/http is deliberately more lenient than the fast engine
	// (it accepts and re-serialises, so nothing is smuggled either):
	// what it answers and forwards instead.
	std *smuggleCase
}

const (
	hx  = "Host: x\r\n"
	te  = "Transfer-Encoding: chunked\r\n"
	end = "\r\n"
)

// smuggledPad builds a chunk of 0xAB bytes whose content is a request.
func smuggledIn171() string {
	req := "0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\nX-Pad: "
	return req + strings.Repeat("a", 0xab-len(req)-4) + "\r\n\r\n"
}

func smuggleCases() []smuggleCase {
	refused := func(name, raw string) smuggleCase {
		return smuggleCase{name: name, raw: raw, n: -1, wantClose: true, status: [][]int{{400}}, want: [][]string{nil}}
	}
	post := func(path, body string) string {
		return "POST " + path + " HTTP/1.1\r\n" + hx + te + end + body
	}
	return []smuggleCase{
		{name: "valid-chunked", raw: post("/ok", "5;a=b\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"), n: 1,
			status: [][]int{{200}}, want: [][]string{{`POST /ok body="hello"`}}},
		{name: "zero-padded-size", raw: post("/pad", "0000000000000005\r\nhello\r\n0\r\n\r\n"), n: 1,
			status: [][]int{{200}}, want: [][]string{{`POST /pad body="hello"`}}},
		refused("size-17-digits", post("/c", "00000000000000005\r\nhello\r\n0\r\n\r\n")),
		refused("size-minus", post("/c", "-5\r\nhello\r\n0\r\n\r\n")),
		refused("size-plus", post("/c", "+5\r\nhello\r\n0\r\n\r\n")),
		refused("size-0x", post("/c", "0x5\r\nhello\r\n0\r\n\r\n")),
		refused("size-junk", post("/c", "5 junk\r\nhello\r\n0\r\n\r\n")),
		refused("data-not-crlf", post("/c", "5\r\nhelloXX0\r\n\r\n")),
		refused("data-bare-lf", post("/c", "5\r\nhello\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")),
		refused("size-bare-cr", post("/c", "5\r;x\r\nhello\r\n0\r\n\r\n")),
		refused("size-bare-lf", post("/c", "5\nhello\r\n0\r\n\r\n")),
		// A bare LF inside an extension: a CR-LF-only backend reads the
		// line to the CR LF and the 0xAB chunk's content as a request.
		refused("ext-bare-lf", post("/c", "2;\nxx\r\nAB\r\n"+smuggledIn171()+"\r\n0\r\n\r\n")),
		refused("trailer-bad-field", post("/c", "5\r\nhello\r\n0\r\nbad trailer\r\n\r\n")),
		refused("trailer-bare-lf", post("/c", "5\r\nhello\r\n0\r\nX: y\n\r\n")),
		// net/http's engine waits for a CR LF CR LF here and answers 408
		// after client-body-timeout (see README); ours 400 at once.
		{name: "trailer-cr-cr-lf", raw: post("/c", "5\r\nhello\r\n0\r\n\r\r\n"), n: -1, wantClose: true,
			status: [][]int{{400}, {408}}, want: [][]string{nil}},
		stdAccepts(refused("cl-and-te", "POST /c HTTP/1.1\r\n"+hx+"Content-Length: 4\r\n"+te+end+"5\r\nhello\r\n0\r\n\r\n"),
			`POST /c body="hello"`), // net/http: chunked wins, Content-Length dropped
		refused("dup-cl", "POST /c HTTP/1.1\r\n"+hx+"Content-Length: 4\r\nContent-Length: 5\r\n\r\nhello"),
		refused("te-space-colon", "POST /c HTTP/1.1\r\n"+hx+"Transfer-Encoding : chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
		stdAccepts(refused("obs-fold", "GET /c HTTP/1.1\r\n"+hx+"X-A: 1\r\n folded\r\n\r\n"), `GET /c body=""`), // net/http unfolds
		refused("dup-host", "GET /c HTTP/1.1\r\n"+hx+"Host: y\r\n\r\n"),
		stdAccepts(refused("head-bare-lf", "GET /c HTTP/1.1\nHost: x\n\n"), `GET /c body=""`), // net/http: LF ends a head line
		{name: "te-obfuscated", raw: "POST /c HTTP/1.1\r\n" + hx + "Transfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
			n: -1, wantClose: true, status: [][]int{{501}}, want: [][]string{nil}},
		// HTTP/1.0 cannot mean chunked: refused (fast); net/http ignores
		// the header (Go issue 12785), forwards a bodiless request and
		// refuses the rest as the next request.
		{name: "te-in-http10", raw: "POST /te10 HTTP/1.0\r\nConnection: keep-alive\r\n" + te + end + "5\r\nhello\r\n0\r\n\r\n",
			n: -1, wantClose: true, status: [][]int{{400}, {200, 400}}, want: [][]string{nil, {`POST /te10 body=""`}}},
		{name: "absolute-form", raw: "GET http://good.example/abs HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
			n: -1, wantClose: true, status: [][]int{{200}}, want: [][]string{{`GET /abs body="" host=good.example`}}},
		{name: "chunked-response-to-http10", raw: "GET /chunked-resp HTTP/1.0\r\n\r\n", n: -1, wantClose: true,
			status: [][]int{{200}}, want: [][]string{{`GET /chunked-resp body=""`}}},
		{name: "chunked-response-to-http10-keepalive", raw: "GET /chunked-resp HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
			n: -1, wantClose: true, status: [][]int{{200}}, want: [][]string{{`GET /chunked-resp body=""`}}},
		{name: "chunked-response-http11", raw: "GET /chunked-resp HTTP/1.1\r\n" + hx + end, n: 1,
			status: [][]int{{200}}, want: [][]string{{`GET /chunked-resp body=""`}}},
		{name: "pipelined", raw: "GET /p1 HTTP/1.1\r\n" + hx + end + "GET /p2 HTTP/1.1\r\n" + hx + end, n: 2,
			status: [][]int{{200, 200}}, want: [][]string{{`GET /p1 body=""`, `GET /p2 body=""`}}},
		{name: "cl-body-holds-a-request", raw: "POST /cl HTTP/1.1\r\n" + hx + "Content-Length: 35\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", n: 1,
			status: [][]int{{200}}, want: [][]string{{`POST /cl body="GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"`}}},
		{name: "half-close-after-request", raw: "GET /hc HTTP/1.1\r\n" + hx + end, n: -1, halfClose: true, wantClose: true,
			status: [][]int{{200}}, want: [][]string{{`GET /hc body=""`}}},
		{name: "half-close-mid-body", raw: "POST /hb HTTP/1.1\r\n" + hx + "Content-Length: 10\r\n\r\nabc", n: -1, halfClose: true,
			wantClose: true, status: [][]int{nil, {400}}, want: [][]string{nil}},
		{name: "stalled-cl-body", raw: "POST /st HTTP/1.1\r\n" + hx + "Content-Length: 10\r\n\r\nabc", n: -1, wantClose: true,
			status: [][]int{{408}}, want: [][]string{nil}},
		{name: "stalled-chunked-body", raw: post("/st", "5\r\nhel"), n: -1, wantClose: true,
			status: [][]int{{408}}, want: [][]string{nil}},
	}
}

// stdAccepts notes that net/http accepts tc's bytes as the one message
// msg (answered 200, the connection kept).
func stdAccepts(tc smuggleCase, msg string) smuggleCase {
	tc.std = &smuggleCase{n: 1, status: [][]int{{200}}, want: [][]string{{msg}}}
	return tc
}

// rawExchange sends raw on a new connection and reads n responses (-1:
// until the end); closed tells whether the balancer closed it (known only
// with -1).
func rawExchange(t *testing.T, v variant, addr, raw string, n int, shut bool) (statuses []int, bodies []string, closed bool) {
	t.Helper()
	c := v.dial(t, addr)
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	if shut {
		halfClose(c)
	}
	// Generous: every answer here comes at once or after the 300 ms body
	// timeout; the idle timeout (60 s) is far beyond it.
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for n < 0 || len(statuses) < n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("no response after %d: timed out", len(statuses))
				return statuses, bodies, false
			}
			return statuses, bodies, true // closed (EOF or reset)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		statuses = append(statuses, resp.StatusCode)
		bodies = append(bodies, string(b))
		if err != nil {
			return statuses, bodies, true
		}
	}
	return statuses, bodies, false // kept alive (not waited for: n answers were asked for)
}

func smuggleLB(t *testing.T, v variant, backend string) string {
	cfg := poolConfig(backend)
	v.set(t, &cfg)
	cfg.Listeners[0].ClientBodyTimeout = 300 * time.Millisecond
	cfg.Backends[0].ResponseHeaderTimeout = 5 * time.Second
	l := startLB(t, cfg, nil)
	return l.ListenerAddr("web").String()
}

// TestSmuggling is the suite: every case on both engines, plain and over
// TLS, both backend parsers.
func TestSmuggling(t *testing.T) {
	for _, v := range engines() {
		for _, strict := range []bool{true, false} {
			parser := map[bool]string{true: "strict", false: "lenient"}[strict]
			t.Run(v.String()+"/"+parser, func(t *testing.T) {
				be := newRawBackend(t, strict)
				addr := smuggleLB(t, v, be.addr())
				for i, tc := range smuggleCases() {
					t.Run(tc.name, func(t *testing.T) {
						if v.engine == "std" && tc.std != nil {
							std := *tc.std
							std.name, std.raw, std.halfClose = tc.name, tc.raw, tc.halfClose
							tc = std
						}
						be.reset()
						statuses, _, closed := rawExchange(t, v, addr, tc.raw, tc.n, tc.halfClose)
						if !slices.ContainsFunc(tc.status, func(s []int) bool { return slices.Equal(s, statuses) }) {
							t.Errorf("statuses %v, want one of %v", statuses, tc.status)
						}
						if tc.wantClose && !closed {
							t.Errorf("connection left open")
						}
						fresh := "/fresh-" + strconv.Itoa(i)
						fs, fb, _ := rawExchange(t, v, addr, "GET "+fresh+" HTTP/1.1\r\n"+hx+"Connection: close\r\n\r\n", -1, false)
						if len(fs) != 1 || fs[0] != 200 || fb[0] != fresh {
							t.Errorf("fresh client got %v %q, want 200 %q", fs, fb, fresh)
						}
						msgs, errs := be.got()
						if len(errs) > 0 {
							t.Errorf("backend found framing errors in what the balancer sent: %v", errs)
						}
						if n := len(msgs); n > 0 && msgs[n-1] == `GET `+fresh+` body=""` {
							msgs = msgs[:n-1]
						}
						if !slices.ContainsFunc(tc.want, func(w []string) bool { return slices.Equal(w, msgs) }) {
							t.Errorf("backend received %q, want one of %q", msgs, tc.want)
						}
					})
				}
			})
		}
	}
}

// TestHopByHopEveryLength: a header named in Connection is dropped,
// whatever the length of its name, in requests and responses (the fast
// engine used to keep names of 2, 4, 6, 7, 9, 10 and 14-19 characters).
func TestHopByHopEveryLength(t *testing.T) {
	for _, v := range engines() {
		t.Run(v.String(), func(t *testing.T) {
			be := newRawBackend(t, true)
			addr := smuggleLB(t, v, be.addr())
			names := hopNames("x-q")
			raw := "GET /hop HTTP/1.1\r\n" + hx + "Connection: close, " + strings.Join(names, ", ") + "\r\n"
			for _, n := range names {
				raw += n + ": 1\r\n"
			}
			c := v.dial(t, addr)
			defer c.Close()
			if _, err := io.WriteString(c, raw+"\r\n"); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			for _, n := range hopNames("x-r") {
				if _, ok := resp.Header[http.CanonicalHeaderKey(n)]; ok {
					t.Errorf("response header %q (%d chars) listed in Connection was forwarded", n, len(n))
				}
			}
			be.mu.Lock()
			defer be.mu.Unlock()
			if len(be.hdrs) != 1 {
				t.Fatalf("backend got %d requests, want 1", len(be.hdrs))
			}
			for _, n := range names {
				if _, ok := be.hdrs[0][strings.ToLower(n)]; ok {
					t.Errorf("request header %q (%d chars) listed in Connection was forwarded", n, len(n))
				}
			}
		})
	}
}
