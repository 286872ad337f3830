package lb

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// h1Server is the lean HTTP/1.1 server of engine-fast listeners, plain or
// TLS (h1tls.go): the common keep-alive request is served in the pollers'
// event loops (eventloop.go), anything else by a goroutine per connection;
// heads parsed in place, pooled backend connections, no per-request
// allocation on the common path. HTTP/2 (ALPN h2) goes to net/http and
// httpProxy.
type h1Server struct {
	route     atomic.Pointer[route]
	lg        *zap.Logger
	accessLog atomic.Bool
	shutting  atomic.Bool
	wg        sync.WaitGroup
	mu        sync.Mutex
	conns     map[*h1Conn]struct{}
	poll      *pollSet // nil: reads wait on Go's poller
	loop      bool     // idle connections go to the pollers' event loops (see eventloop.go)
	// TLS listeners only: the server side of every handshake, and where
	// connections whose client chose HTTP/2 go (net/http's server).
	tlsc *tls.Config
	h2   *connQueue
}

// Connection states for graceful shutdown.
const (
	connActive int32 = iota
	connIdle         // between requests: shutdown closes it
	connClosed
	// connNew: accepted, no request read yet. Shutdown does not close it
	// at once: its client has sent (or is about to send) a request on a
	// connection it never used, and would get an EOF it cannot retry.
	// Closing the listener and serving what was accepted is what makes a
	// restart under socket activation lose nothing. Like net/http's
	// StateNew, it is closed if it sends nothing within newConnGrace.
	connNew
)

// newConnGrace: how long shutdown waits for the first request of a
// connection accepted before it (net/http's rule for StateNew); a
// variable for the test.
var newConnGrace = 5 * time.Second

// h1Conn is one client connection with its reusable buffers.
type h1Conn struct {
	c    net.Conn // the client connection (a *tls.Conn on TLS listeners)
	sock *sockIO  // I/O and read deadlines of c
	tcp  *sockIO  // TLS only: the socket's raw I/O under c (see h1tls.go)
	ts   *tlsSock // TLS only: the net.Conn under c, over tcp
	// rs: the socket the poller watches (sock, or tcp under TLS), whose
	// readiness, deadline timer and kicks drive the event loop.
	rs    *sockIO
	br    *bufio.Reader
	bw    *wbuf
	state atomic.Int32
	born  time.Time // accepted (shutdown's newConnGrace)
	used  bool      // a request was read: waits between requests are connIdle
	ip    string
	req   head
	resp  head

	srv *h1Server
	// Event-loop state, owned by the poller's goroutine while lstate is
	// not loopOff (see eventloop.go).
	lstate uint8
	rt     *route  // of the request in progress
	at     attempt // the backend attempt in progress
	slow   int     // requests in a row the loop handed over by their kind
}

// h1WriterSize: client writers are large enough for a head plus a 16 KiB
// body in one write, and are only held while a request is in progress.
const h1WriterSize = 32 << 10

var h1WriterPool = sync.Pool{New: func() any { return newWbuf(nil, h1WriterSize) }}

// serve accepts client connections until ln is closed.
func (s *h1Server) serve(ln net.Listener) error {
	return acceptLoop(ln, func(c net.Conn) {
		hc := s.newConn(c)
		s.mu.Lock()
		if s.conns == nil {
			s.conns = map[*h1Conn]struct{}{}
		}
		s.conns[hc] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.handle(hc)
	})
}

// acceptLoop hands every accepted connection to accepted until ln is closed
// (then it returns nil). A temporary accept error (out of file descriptors)
// backs off briefly instead of spinning.
func acceptLoop(ln net.Listener, accepted func(net.Conn)) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond) // resource exhaustion: back off
				continue
			}
			return err
		}
		accepted(c)
	}
}

// shutdown closes idle connections at once, lets active ones finish their
// request, serves the first request of connections accepted but not yet
// used (connNew), and force-closes what is left when ctx ends.
func (s *h1Server) shutdown(ctx context.Context) {
	s.shutting.Store(true)
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		now := time.Now()
		s.mu.Lock()
		for hc := range s.conns {
			if hc.state.CompareAndSwap(connIdle, connClosed) ||
				now.Sub(hc.born) >= newConnGrace && hc.state.CompareAndSwap(connNew, connClosed) {
				_ = hc.closeSocket()
			}
		}
		s.mu.Unlock()
		select {
		case <-done:
			return
		case <-t.C:
		case <-ctx.Done():
			s.mu.Lock()
			for hc := range s.conns {
				_ = hc.closeSocket()
			}
			s.mu.Unlock()
			<-done
			return
		}
	}
}

func (s *h1Server) handle(hc *h1Conn) {
	if a, ok := hc.c.RemoteAddr().(*net.TCPAddr); ok {
		hc.ip = a.IP.String()
	}
	lc := s.route.Load().lc
	if hc.tcp != nil && !s.handshake(hc, lc) {
		return
	}
	hc.br = bufio.NewReaderSize(hc.sock, lc.MaxHeaderBytes+1024)
	hc.req.raw = make([]byte, 0, 1024)
	hc.resp.raw = make([]byte, 0, 1024)
	s.serveConn(hc, nil)
}

// serveConn runs hc on this goroutine: cont first (when set: what the event
// loop handed over, reporting whether the connection stays), then request
// after request until the connection ends or the event loop takes it.
func (s *h1Server) serveConn(hc *h1Conn, cont func() bool) {
	adopted := false
	defer func() {
		if r := recover(); r != nil && r != http.ErrAbortHandler {
			s.lg.Error("connection handler panicked", zap.Any("panic", r))
		}
		if !adopted {
			s.finish(hc)
		}
	}()
	if hc.ts != nil && hc.ts.pending() && !s.flushTLS(hc) {
		return
	}
	if cont != nil && (!cont() || s.shutting.Load()) {
		return
	}
	for {
		if s.toLoop(hc) {
			adopted = true
			return
		}
		if !s.waitRequest(hc) {
			return
		}
		hc.bw = h1WriterPool.Get().(*wbuf)
		hc.bw.Reset(hc.sock)
		keep := s.serveOne(hc)
		hc.releaseWriter()
		if !keep || s.shutting.Load() {
			return
		}
	}
}

// toLoop hands an idle keep-alive connection to its poller's event loop;
// false keeps it here (no loop, a pipelined request, access logging, or
// requests the loop would only hand back).
func (s *h1Server) toLoop(hc *h1Conn) bool {
	if !s.loop || hc.rs == nil || hc.rs.pw == nil || hc.br.Buffered() > 0 || hc.slow >= 2 || s.accessLog.Load() {
		return false
	}
	lc := s.route.Load().lc
	hc.state.Store(hc.waitState())
	if s.shutting.Load() {
		return false // waitRequest serves a new connection's request
	}
	hc.sock.arm(lc.IdleTimeout)
	if lc.WriteTimeout > 0 {
		_ = hc.c.SetWriteDeadline(time.Time{}) // the loop never waits to write
	}
	return hc.rs.pw.adopt(hc)
}

// closeSocket closes hc's socket from a goroutine that does not serve hc
// (shutdown), waking whoever does. Under TLS it closes the TCP socket
// without a close_notify: the alert would be a write racing the server's
// own (and could wait on a full socket).
func (hc *h1Conn) closeSocket() error {
	if hc.tcp != nil {
		return hc.tcp.close()
	}
	return hc.sock.close()
}

// flushTLS (on a goroutine) writes what the event loop's TLS writes left
// in hc.ts.pend, under the write timeout; false: the connection is done.
func (s *h1Server) flushTLS(hc *h1Conn) bool {
	if wt := s.route.Load().lc.WriteTimeout; wt > 0 {
		_ = hc.c.SetWriteDeadline(time.Now().Add(wt))
	}
	return hc.ts.flush() == nil
}

// finish closes hc and forgets it.
func (s *h1Server) finish(hc *h1Conn) {
	_ = hc.c.Close()
	hc.sock.release()
	if hc.tcp != nil {
		hc.tcp.release()
	}
	hc.releaseWriter()
	s.forget(hc)
}

// forget drops hc from the connections shutdown waits for.
func (s *h1Server) forget(hc *h1Conn) {
	s.mu.Lock()
	delete(s.conns, hc)
	s.mu.Unlock()
	s.wg.Done()
}

// releaseWriter returns the (flushed) client writer to the pool.
func (hc *h1Conn) releaseWriter() {
	if hc.bw != nil {
		hc.bw.Reset(nil)
		h1WriterPool.Put(hc.bw)
		hc.bw = nil
	}
}

// waitRequest waits (idle timeout) for the next request's first byte.
func (s *h1Server) waitRequest(hc *h1Conn) bool {
	if hc.br.Buffered() > 0 {
		return true // pipelined
	}
	hc.state.Store(hc.waitState())
	if s.shutting.Load() && hc.used {
		return false
	}
	hc.sock.arm(s.route.Load().lc.IdleTimeout)
	if _, err := hc.br.Peek(1); err != nil {
		return false
	}
	return hc.activate()
}

// waitState is the state of hc while it waits for a request.
func (hc *h1Conn) waitState() int32 {
	if hc.used {
		return connIdle
	}
	return connNew
}

// activate marks hc busy with a request; false: shutdown closed it first.
func (hc *h1Conn) activate() bool {
	if !hc.state.CompareAndSwap(connIdle, connActive) && !hc.state.CompareAndSwap(connNew, connActive) {
		return false
	}
	hc.used = true
	return true
}

// serveOne reads, forwards and answers one request; it reports whether the
// connection may carry another.
func (s *h1Server) serveOne(hc *h1Conn) bool {
	rt := s.route.Load()
	lc := rt.lc
	var start time.Time
	if s.accessLog.Load() {
		start = time.Now()
	}
	if !headBuffered(hc.br) {
		// The rest of the head must come within the header timeout
		// (slowloris); a head that arrived whole needs no deadline.
		hc.sock.setDeadline(time.Now().Add(lc.ReadHeaderTimeout))
	}
	req := &hc.req
	req.reset()
	raw, err := readHead(hc.br, lc.MaxHeaderBytes, req.raw)
	if err != nil {
		if errors.Is(err, errHeadTooLarge) {
			s.writeError(hc, 431, false, rt.g)
			lingerClose(hc.c)
		}
		return false // timeout (slowloris), EOF or reset: just close
	}
	req.raw = raw
	if code := req.parseRequest(lc.MaxHeaderCount); code != 0 {
		s.writeError(hc, code, false, rt.g)
		lingerClose(hc.c)
		return false
	}
	if req.length > 0 || req.chunked || req.upgrade {
		// Bodies and upgraded streams are not bound by the header timeout;
		// without them the next wait sets a new deadline anyway.
		hc.sock.setDeadline(time.Time{})
	}
	if lc.WriteTimeout > 0 {
		_ = hc.c.SetWriteDeadline(time.Now().Add(lc.WriteTimeout))
	}
	var status int
	var keep bool
	if req.upgrade && req.upgradeTo != nil && req.minor == 1 {
		status = s.upgrade(hc, rt.g)
	} else {
		status, keep = s.proxy(hc, rt.g, nil)
	}
	if s.accessLog.Load() {
		s.lg.Info("access", zap.String("client", hc.ip), zap.ByteString("method", req.method),
			zap.ByteString("host", req.host), zap.ByteString("uri", req.uri), zap.Int("proto_minor", req.minor),
			zap.Int("status", status), zap.Duration("duration", time.Since(start)), zap.String("backend", rt.g.cfg.Name))
	}
	return keep && !req.close && (req.minor == 1 || req.keepAlive)
}

// proxy runs attempts on servers; whether a failed one is tried again is
// decideRetry's answer, the same for both engines.
// at, when set, is an attempt the event loop started (see eventloop.go).
func (s *h1Server) proxy(hc *h1Conn, g *Group, at *attempt) (int, bool) {
	req := &hc.req
	idem := idempotent(string(req.method)) // no allocation: converted for the switch only
	hasBody := req.length > 0 || req.chunked
	var triedBuf [4]*Server
	tried := triedBuf[:0]
	for attempt := 0; ; attempt++ {
		var srv *Server
		var err error
		if at != nil {
			srv = at.srv
		} else {
			srv, err = hc.acquire(g, tried)
		}
		if errors.Is(err, context.Canceled) {
			return 499, false // the client went away while held
		}
		if err != nil && len(tried) > 0 {
			s.writeError(hc, http.StatusBadGateway, false, g) // every server we could try failed
			return http.StatusBadGateway, false
		}
		if err != nil {
			g.m.noServer.WithLabelValues(g.cfg.Name).Inc()
			s.writeError(hc, 503, !hasBody, g)
			return 503, !hasBody
		}
		out, code, keep := s.try(hc, srv, idem, hasBody, at)
		at = nil
		srv.release()
		act, _ := decideRetry(attemptResult{out: out, idem: idem, hasBody: hasBody, attempt: attempt, retries: *g.cfg.Retries})
		if act == retryStop {
			switch out {
			case outDone:
				return code, keep
			case outAborted:
				srv.noteFailure()
				return code, false
			case outBadRequest:
				// The client's body failed: its framing (400), a stall past
				// client-body-timeout (408), or the client went away (0).
				if code == 0 {
					return 499, false
				}
				s.writeError(hc, code, false, g)
				if code == http.StatusBadRequest {
					lingerClose(hc.c)
				}
				return code, false
			}
			srv.noteFailure()
			s.writeError(hc, code, false, g)
			return code, false
		}
		srv.noteFailure()
		g.m.retries.WithLabelValues(g.cfg.Name).Inc()
		tried = append(tried, srv)
	}
}

// acquire picks a server for the request. When it has to hold (no
// eligible server yet), it watches the client meanwhile: a client that goes
// away ends the wait (counted in hold_cancelled_total) instead of keeping a
// place in the hold queue until hold-timeout.
func (hc *h1Conn) acquire(g *Group, tried []*Server) (*Server, error) {
	if srv := g.tryPick(tried); srv != nil {
		return srv, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		hc.watchClose(cancel)
	}()
	srv, err := g.acquire(ctx, tried)
	hc.sock.setDeadline(time.Unix(1, 0)) // ends the watcher's read
	<-done
	hc.sock.setDeadline(time.Time{})
	return srv, err
}

// watchClose reads ahead on the client connection (keeping what arrives
// buffered for later) until it fails; an end or reset cancels the hold. It
// stops when the buffer is full, since it can then no longer tell.
func (hc *h1Conn) watchClose(cancel context.CancelFunc) {
	for hc.br.Buffered() < hc.br.Size() {
		if _, err := hc.br.Peek(hc.br.Buffered() + 1); err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				cancel()
			}
			return
		}
	}
}

// try makes one attempt; a stale pooled connection is replaced once by a
// fresh one on the same server when that is safe.
func (s *h1Server) try(hc *h1Conn, srv *Server, idem, hasBody bool, at *attempt) (outcome, int, bool) {
	for fresh := false; ; fresh = true {
		var bc *backendConn
		reused := true
		if at != nil && at.bc != nil {
			bc = at.bc // pooled, taken by the event loop
		} else {
			var err error
			if bc, reused, err = srv.conn(context.Background(), replayable(idem, hasBody), fresh); err != nil {
				return outNotSent, http.StatusBadGateway, false
			}
			at = nil
		}
		out, code, keep, err := s.exchange(hc, srv, bc, at)
		at = nil
		if act, _ := decideRetry(attemptResult{out: out, reused: reused, idem: idem, hasBody: hasBody}); act == retryFresh {
			continue
		}
		srv.logExchange(out, err)
		return out, code, keep
	}
}

// exchange sends the request on bc and relays the response to the client.
// With at (from the event loop), it resumes at the stage at reached.
func (s *h1Server) exchange(hc *h1Conn, srv *Server, bc *backendConn, at *attempt) (outcome, int, bool, error) {
	req := &hc.req
	stage := stageNew
	if at != nil {
		stage = at.stage
	}
	if stage == stageNew {
		writeRequestHead(bc.bw, req, hc.ip, s.tlsc != nil, false)
		if err := s.sendBody(hc, bc); err != nil {
			bc.close()
			if errors.Is(err, errClientBody) {
				return outBadRequest, bodyErrorStatus(err), false, err
			}
			return outNoResponse, http.StatusBadGateway, false, err
		}
	}
	resp := &hc.resp
	if stage != stageHead {
		out, code, err := outDone, 0, error(nil)
		if stage == stageSent && at.err != nil {
			out, code, err = at.out, at.code, at.err
		} else {
			out, code, err = readResponseHead(bc, resp, srv.group.cfg.ResponseHeaderTimeout, stage == stageNew)
		}
		if err != nil {
			bc.close()
			return out, code, false, err
		}
	}
	srv.countResponse(resp.status)
	keep := s.writeResponseHead(hc, req, resp)
	bodyErr := relayBody(hc.bw, bc.br, req, resp)
	if bodyErr == nil {
		bodyErr = hc.bw.Flush()
	}
	// Back to the pool only at the response's exact end: anything left
	// unread would be taken for the next request's answer.
	if bodyErr != nil || resp.close || resp.length < 0 && !resp.chunked && hasBody(req, resp) || bc.br.Buffered() > 0 {
		bc.close()
	} else {
		srv.pool.put(bc)
	}
	if bodyErr != nil {
		return outAborted, resp.status, false, bodyErr
	}
	return outDone, resp.status, keep, nil
}

// sendBody forwards the request body (Content-Length, or chunked decoded
// and re-encoded). Each read of the body waits at most the listener's
// client-body-timeout. A failure to read the client's body is marked
// errClientBody; one to write to the backend is not.
func (s *h1Server) sendBody(hc *h1Conn, bc *backendConn) error {
	req := &hc.req
	if req.length <= 0 && !req.chunked {
		return bc.bw.pend() // sent by the response read (see wbuf.pend)
	}
	hc.sock.idle = s.route.Load().lc.ClientBodyTimeout
	defer func() {
		hc.sock.idle = 0
		hc.sock.setDeadline(time.Time{})
	}()
	if req.expect100 {
		// We answer the client's Expect ourselves: the backend never saw it.
		_, _ = hc.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		if err := hc.bw.Flush(); err != nil {
			return errors.Join(errClientBody, err)
		}
	}
	var err error
	if req.chunked {
		err = copyChunked(bc.bw, hc.br, true, false)
	} else {
		err = copyN(bc.bw, hc.br, req.length)
	}
	if err != nil {
		if errors.Is(err, errDstWrite) {
			return err // the backend's side
		}
		return errors.Join(errClientBody, err)
	}
	return bc.bw.pend()
}

// readResponseHead waits (bounded) for the backend's head, skipping 1xx.
// The body that follows is read with the backend's read-timeout between
// reads (bc.bodyPhase).
// arm false keeps the deadline already set (the event loop's).
func readResponseHead(bc *backendConn, resp *head, timeout time.Duration, arm bool) (outcome, int, error) {
	if arm {
		bc.sock.idle = 0
		bc.sock.arm(timeout)
	}
	if _, err := bc.br.Peek(1); err != nil {
		return noResponse(err)
	}
	for {
		resp.reset()
		raw, err := readHead(bc.br, bc.br.Size(), resp.raw)
		if err != nil {
			return outFailed, http.StatusBadGateway, err
		}
		resp.raw = raw
		if err := resp.parseResponse(); err != nil {
			return outFailed, http.StatusBadGateway, err
		}
		if resp.status >= 200 || resp.status == http.StatusSwitchingProtocols {
			bc.bodyPhase()
			return outDone, resp.status, nil
		}
	}
}

// noResponse classifies a failure to get a response head.
func noResponse(err error) (outcome, int, error) {
	code := http.StatusBadGateway
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		code = http.StatusGatewayTimeout
	}
	return outNoResponse, code, err
}

// hasBody reports whether the response carries a body (RFC 9112 §6.3).
func hasBody(req, resp *head) bool {
	if string(req.method) == "HEAD" || resp.status == 204 || resp.status == 304 || resp.status < 200 {
		return false
	}
	return true
}

// writeResponseHead writes the status line, end-to-end headers and our
// framing; it reports whether the client connection stays open.
func (s *h1Server) writeResponseHead(hc *h1Conn, req, resp *head) bool {
	bw := hc.bw
	keep := !req.close && (req.minor == 1 || req.keepAlive) && !s.shutting.Load()
	body := hasBody(req, resp)
	closeDelimited := body && resp.length < 0 && (!resp.chunked || req.minor == 0)
	if closeDelimited {
		keep = false
	}
	bw.WriteString("HTTP/1.1 ")
	bw.writeInt(int64(resp.status))
	bw.WriteByte(' ')
	bw.Write(resp.reason)
	bw.WriteString("\r\n")
	resp.writeHeaders(bw, false)
	switch {
	case resp.length >= 0 && (body || string(req.method) == "HEAD"):
		bw.WriteString("Content-Length: ")
		bw.writeInt(resp.length)
		bw.WriteString("\r\n")
	case body && resp.chunked && req.minor == 1:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	switch {
	case !keep:
		bw.WriteString("Connection: close\r\n\r\n")
	case req.minor == 0:
		bw.WriteString("Connection: keep-alive\r\n\r\n")
	default:
		bw.WriteString("\r\n")
	}
	return keep
}

// relayBody copies the response body with the framing chosen above.
func relayBody(dst *wbuf, src *bufio.Reader, req, resp *head) error {
	switch {
	case !hasBody(req, resp):
		return nil
	case resp.length >= 0:
		return copyN(dst, src, resp.length)
	case resp.chunked:
		// Decoded to its exact end (trailers included, so the connection
		// can be pooled), re-encoded for HTTP/1.1, plain for HTTP/1.0
		// (close-delimited, see writeResponseHead).
		return copyChunked(dst, src, req.minor == 1, true)
	default: // close-delimited
		return copyAll(dst, src)
	}
}

// copyAll moves src to dst until src ends, flushing before each wait.
func copyAll(dst *wbuf, src *bufio.Reader) error {
	for {
		if src.Buffered() == 0 {
			if err := dst.Flush(); err != nil {
				return err
			}
			if _, err := src.Peek(1); err == io.EOF {
				return nil
			} else if err != nil {
				return err
			}
		}
		b, _ := src.Peek(src.Buffered())
		w, err := dst.Write(b)
		_, _ = src.Discard(w)
		if err != nil {
			return err
		}
	}
}

// writeRequestHead writes the request line, end-to-end headers and the
// forwarding headers to the backend; tlsIn: the client came over TLS.
func writeRequestHead(bw *wbuf, req *head, ip string, tlsIn, upgrade bool) {
	bw.Write(req.method)
	bw.WriteByte(' ')
	bw.Write(req.uri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.Write(req.host)
	bw.WriteString("\r\n")
	req.writeHeaders(bw, true)
	bw.WriteString("X-Forwarded-For: ")
	for _, v := range req.xff {
		bw.Write(v)
		bw.WriteString(", ")
	}
	bw.WriteString(ip)
	bw.WriteString("\r\nX-Real-IP: ")
	bw.WriteString(ip)
	if tlsIn {
		bw.WriteString("\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: ")
	} else {
		bw.WriteString("\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: ")
	}
	bw.Write(req.host)
	bw.WriteString("\r\n")
	if upgrade {
		bw.WriteString("Connection: Upgrade\r\nUpgrade: ")
		bw.Write(req.upgradeTo)
		bw.WriteString("\r\n")
	}
	switch {
	case req.chunked:
		bw.WriteString("Transfer-Encoding: chunked\r\n\r\n")
	case req.length > 0 || req.length == 0 && (string(req.method) == "POST" || string(req.method) == "PUT" || string(req.method) == "PATCH"):
		bw.WriteString("Content-Length: ")
		bw.writeInt(max(req.length, 0))
		bw.WriteString("\r\n\r\n")
	default:
		bw.WriteString("\r\n")
	}
}

// lingerClose half-closes and drains briefly what the client is still
// sending, so it reads our error instead of a reset (as net/http does).
// Over TLS: close_notify, then the TCP half-close under it, then the
// drain of the raw bytes (their records need no decrypting).
func lingerClose(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		_ = tc.CloseWrite()
		c = tc.NetConn()
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 1<<20))
}

// writeError answers with a short plain-text error.
func (s *h1Server) writeError(hc *h1Conn, code int, keep bool, g *Group) {
	text := http.StatusText(code)
	bw := hc.bw
	bw.WriteString("HTTP/1.1 ")
	bw.WriteString(strconv.Itoa(code))
	bw.WriteByte(' ')
	bw.WriteString(text)
	bw.WriteString("\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ")
	bw.WriteString(strconv.Itoa(len(text) + 1))
	if code == http.StatusServiceUnavailable && g != nil {
		secs := int((g.cfg.RetryAfter + time.Second - 1) / time.Second)
		bw.WriteString("\r\nRetry-After: ")
		bw.WriteString(strconv.Itoa(max(secs, 1)))
	}
	if !keep {
		bw.WriteString("\r\nConnection: close")
	}
	bw.WriteString("\r\n\r\n")
	bw.WriteString(text)
	bw.WriteString("\n")
	_ = bw.Flush()
}

// upgrade relays an Upgrade (WebSocket) request on a fresh backend
// connection; after 101 it pipes raw bytes both ways. The client
// connection ends with it.
func (s *h1Server) upgrade(hc *h1Conn, g *Group) int {
	srv, err := hc.acquire(g, nil)
	if errors.Is(err, context.Canceled) {
		return 499
	}
	if err != nil {
		g.m.noServer.WithLabelValues(g.cfg.Name).Inc()
		s.writeError(hc, 503, false, g)
		return 503
	}
	defer srv.release()
	c, err := dialServer(context.Background(), srv)
	if err != nil {
		srv.noteFailure()
		s.writeError(hc, 502, false, g)
		return 502
	}
	bc := newBackendConn(c, g.cfg.ReadTimeout, g.poll.pick())
	defer bc.close()
	writeRequestHead(bc.bw, &hc.req, hc.ip, s.tlsc != nil, true)
	if err := s.sendBody(hc, bc); err != nil {
		code := 502
		if errors.Is(err, errClientBody) {
			if code = bodyErrorStatus(err); code == 0 {
				return 499
			}
		} else {
			srv.noteFailure()
		}
		s.writeError(hc, code, false, g)
		return code
	}
	resp := &hc.resp
	if _, code, err := readResponseHead(bc, resp, g.cfg.ResponseHeaderTimeout, true); err != nil {
		srv.noteFailure()
		s.writeError(hc, code, false, g)
		return code
	}
	srv.countResponse(resp.status)
	if resp.status != http.StatusSwitchingProtocols {
		hc.req.close = true
		s.writeResponseHead(hc, &hc.req, resp)
		_ = relayBody(hc.bw, bc.br, &hc.req, resp)
		_ = hc.bw.Flush()
		return resp.status
	}
	_, _ = hc.bw.Write(resp.raw) // the 101 head as the backend sent it
	if err := hc.bw.Flush(); err != nil {
		return 101
	}
	bc.sock.idle = 0 // an upgraded stream may idle as long as its ends like
	bc.sock.setDeadline(time.Time{})
	pipe(hc.c, hc.br, bc.c, bc.br)
	return 101
}

// copyN moves exactly n bytes between buffered ends without allocating
// (io.CopyN would allocate a LimitedReader per call). What dst holds is
// flushed before waiting for more of src, so a slow body streams.
func copyN(dst *wbuf, src *bufio.Reader, n int64) error {
	for n > 0 {
		if src.Buffered() == 0 {
			if err := dst.Flush(); err != nil {
				return errors.Join(errDstWrite, err)
			}
			if _, err := src.Peek(1); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return err
			}
		}
		b, _ := src.Peek(int(min(int64(src.Buffered()), n)))
		w, err := dst.Write(b)
		_, _ = src.Discard(w)
		n -= int64(w)
		if err != nil {
			return errors.Join(errDstWrite, err)
		}
	}
	return nil
}

// writeHeaders copies the message's headers to bw, less the hop-by-hop ones
// and those the proxy sets itself (dropOnForward).
func (h *head) writeHeaders(bw *wbuf, request bool) {
	for _, f := range h.hdrs {
		if h.dropOnForward(f.name, request) {
			continue
		}
		bw.Write(f.name)
		bw.WriteString(": ")
		bw.Write(f.value)
		bw.WriteString("\r\n")
	}
}
