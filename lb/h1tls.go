package lb

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"
)

// TLS on the HTTP/1.1 engine. A TLS listener with engine fast runs the
// same h1Server as a plain one, with a crypto/tls server connection
// between the socket and the engine:
//
//	socket ─ sockIO (raw calls, FIFO poller) ─ tlsSock ─ tls.Conn ─ sockIO ─ h1Conn
//
// The engine parses, frames and forwards exactly as for plain HTTP (the
// smuggling suite and the fuzz targets cover both), only its reads and
// writes go through TLS. A client that chose HTTP/2 by ALPN is handed,
// once its handshake is done, to net/http's server (the std engine's
// handler), which speaks HTTP/2; HTTP/1.1 or no ALPN stays here.
//
// Why: with net/http for every TLS request, a 100-byte response cost
// 1.37x Nginx's CPU and the p99 was 3x HAProxy's (issue 15), most of it
// net/http's per-request work, not the cipher.
//
// An idle TLS keep-alive connection goes to the event loop like a plain
// one (eventloop.go): with a goroutine per TLS connection, woken twice per
// request, the p99 with 2 workers stayed 1.23-1.27x HAProxy's, the tail of
// the goroutine path (plain HTTP with event-loop off showed the same).
// Two properties of crypto/tls make that possible:
//   - a read error whose Temporary() is true leaves the connection usable
//     and keeps the partial record read so far, so the loop's would-block
//     (errWouldBlock) is such an error;
//   - every write error is permanent, so in the loop tlsSock never
//     refuses a write: it writes what the socket takes at once and keeps
//     the rest (pend), which a goroutine flushes before anything else is
//     written or read (h1Server.serveConn).
// crypto/tls reads ahead (a record left in its buffers brings no new
// edge), so the loop always tries a read before it waits.

// tlsSock is the net.Conn under a TLS server connection: the TCP
// connection's raw I/O. Reads and writes may run at once (sockIO keeps
// their state apart); read deadlines go through sockIO so a reader parked
// on the poller sees them.
type tlsSock struct {
	s *sockIO
	// pend: encrypted bytes written in the event loop that the socket did
	// not take; owned by whoever serves the connection (the loop, then the
	// goroutine it hands the connection to, which flushes them first).
	pend []byte
}

var _ net.Conn = (*tlsSock)(nil)

func (t *tlsSock) Read(p []byte) (int, error) { return t.s.Read(p) }

// Write writes p. In the event loop (the socket is non-blocking there) it
// never waits: what the socket does not take now is kept in pend and
// reported written, because crypto/tls would take a short write as the
// connection's end. Outside the loop, pend goes first.
func (t *tlsSock) Write(p []byte) (int, error) {
	if t.s.nb {
		n := 0
		if len(t.pend) == 0 {
			var err error
			if n, err = t.s.writeNB(p); err != nil {
				return n, err
			}
		}
		t.pend = append(t.pend, p[n:]...)
		return len(p), nil
	}
	if err := t.flush(); err != nil {
		return 0, err
	}
	return t.s.Write(p)
}

// pending reports whether bytes written in the loop wait in pend.
func (t *tlsSock) pending() bool { return len(t.pend) > 0 }

// flush writes pend (waiting while the socket is full, under the write
// deadline); outside the event loop only.
func (t *tlsSock) flush() error {
	if len(t.pend) == 0 {
		return nil
	}
	_, err := t.s.Write(t.pend)
	t.pend = t.pend[:0]
	if cap(t.pend) > 64<<10 {
		t.pend = nil // a rare big one is not kept per idle connection
	}
	return err
}

func (t *tlsSock) Close() error         { return t.s.close() }
func (t *tlsSock) LocalAddr() net.Addr  { return t.s.c.LocalAddr() }
func (t *tlsSock) RemoteAddr() net.Addr { return t.s.c.RemoteAddr() }

func (t *tlsSock) SetDeadline(d time.Time) error {
	t.s.setDeadline(d)
	return t.s.c.SetWriteDeadline(d)
}

func (t *tlsSock) SetReadDeadline(d time.Time) error {
	t.s.setDeadline(d)
	return nil
}

func (t *tlsSock) SetWriteDeadline(d time.Time) error { return t.s.c.SetWriteDeadline(d) }

// CloseWrite half-closes the TCP connection (after the TLS close_notify,
// see lingerClose).
func (t *tlsSock) CloseWrite() error {
	if cw, ok := t.s.c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// newConn wraps an accepted connection: plain, or a TLS server connection
// whose handshake runs later on the connection's goroutine (handshake).
func (s *h1Server) newConn(c net.Conn) *h1Conn {
	if s.tlsc == nil {
		sock := newSockIO(c, s.poll.pick())
		return &h1Conn{c: c, sock: sock, rs: sock, srv: s, born: time.Now()}
	}
	tcp := newSockIO(c, s.poll.pick())
	ts := &tlsSock{s: tcp}
	tc := tls.Server(ts, s.tlsc)
	return &h1Conn{c: tc, sock: newSockIO(tc, nil), tcp: tcp, rs: tcp, ts: ts, srv: s, born: time.Now()}
}

// handshake runs hc's TLS handshake, bounded by the header timeout (a
// client that stalls in it is cut like a slow head). It reports whether
// hc goes on here with HTTP/1.1; otherwise hc was closed, or handed to
// the HTTP/2 server because its client chose h2.
func (s *h1Server) handshake(hc *h1Conn, lc ListenerConfig) bool {
	tc := hc.c.(*tls.Conn)
	hc.state.Store(connNew) // shutdown lets it handshake and send its request
	_ = tc.SetDeadline(time.Now().Add(lc.ReadHeaderTimeout))
	err := tc.Handshake()
	_ = tc.SetDeadline(time.Time{})
	if err != nil {
		refusePlainHTTP(err)
		s.lg.Debug("TLS handshake failed", zap.String("client", hc.ip), zap.Error(err))
		s.finish(hc)
		return false
	}
	if !hc.state.CompareAndSwap(connNew, connActive) {
		s.finish(hc) // shutdown closed it first
		return false
	}
	if tc.ConnectionState().NegotiatedProtocol != "h2" {
		return true
	}
	// net/http's goroutines read it from now on, on Go's poller: a reader
	// of another goroutine must not be parked on ours when it is closed.
	hc.tcp.release()
	hc.tcp, hc.rs, hc.ts = nil, nil, nil
	s.forget(hc)
	if !s.h2.put(tc) {
		_ = tc.Close() // shutting down
	}
	return false
}

// refusePlainHTTP answers a plain HTTP request sent to a TLS listener with
// a readable 400, as net/http does, instead of a TLS alert.
func refusePlainHTTP(err error) {
	var re tls.RecordHeaderError
	if !errors.As(err, &re) || re.Conn == nil {
		return
	}
	switch string(re.RecordHeader[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO", "DELET", "PATCH":
		_, _ = io.WriteString(re.Conn, "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
	}
}

// connQueue is the listener net/http's HTTP/2 server accepts from: TLS
// connections the HTTP/1.1 engine accepted and handshook, whose client
// chose h2.
type connQueue struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

var _ net.Listener = (*connQueue)(nil)

func newConnQueue(addr net.Addr) *connQueue {
	return &connQueue{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case <-q.done:
		return nil, net.ErrClosed
	default:
	}
	select {
	case c := <-q.ch:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() { close(q.done) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return q.addr }

// put hands c to the server; false once the queue is closed.
func (q *connQueue) put(c net.Conn) bool {
	select {
	case q.ch <- c:
		return true
	case <-q.done:
		return false
	}
}
