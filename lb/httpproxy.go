package lb

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// route is what an HTTP listener serves; swapped atomically on reload.
type route struct {
	g  *Group
	lc ListenerConfig
}

// httpProxy is the reverse proxy handler of one HTTP listener.
type httpProxy struct {
	route     atomic.Pointer[route]
	lg        *zap.Logger
	accessLog bool
	tls       bool
}

// outcome classifies how far a forwarding attempt got, which decides
// whether it may be retried.
type outcome uint8

const (
	outDone       outcome = iota // response fully relayed
	outNotSent                   // nothing reached the backend (connect failed): always retryable
	outNoResponse                // request (maybe) sent, no response byte: retryable if idempotent
	outFailed                    // failed after response bytes: not retryable, 502 to the client
	outAborted                   // response already started to the client: abort the connection
	outBadRequest                // the client's own body failed
)

var (
	errClientBody = errors.New("lb: reading client body")
	errClientGone = errors.New("lb: writing to client")
)

var (
	bufPool     = sync.Pool{New: func() any { b := make([]byte, 32*1024); return &b }}
	readerPool  sync.Pool
	writerPool  sync.Pool
	skipRequest = map[string]bool{"Connection": true, "Proxy-Connection": true, "Keep-Alive": true,
		"Proxy-Authenticate": true, "Proxy-Authorization": true, "Te": true, "Trailer": true,
		"Transfer-Encoding": true, "Upgrade": true, "Content-Length": true, "Expect": true, "Host": true,
		"X-Forwarded-For": true, "X-Forwarded-Proto": true, "X-Forwarded-Host": true, "X-Real-Ip": true}
	skipResponse = map[string]bool{"Connection": true, "Proxy-Connection": true, "Keep-Alive": true,
		"Proxy-Authenticate": true, "Proxy-Authorization": true, "Te": true, "Trailer": true,
		"Transfer-Encoding": true, "Upgrade": true}
)

// backendConn is one connection to a backend with its buffers.
type backendConn struct {
	c    net.Conn
	sock *sockIO
	br   *bufio.Reader
	bw   *wbuf
	// readTimeout bounds each read of a response body (the backend's
	// read-timeout): a backend that sends a head and stalls is cut.
	readTimeout time.Duration
}

func newBackendConn(c net.Conn, readTimeout time.Duration, p *poller) *backendConn {
	bc := &backendConn{c: c, readTimeout: readTimeout}
	rw := newSockIO(c, p)
	bc.sock = rw
	if v, ok := readerPool.Get().(*bufio.Reader); ok {
		v.Reset(rw)
		bc.br = v
	} else {
		bc.br = bufio.NewReaderSize(rw, 32<<10) // a 16 KiB response in one read
	}
	if v, ok := writerPool.Get().(*wbuf); ok {
		v.Reset(rw)
		bc.bw = v
	} else {
		bc.bw = newWbuf(rw, 8192)
	}
	return bc
}

func (bc *backendConn) close() {
	_ = bc.c.Close()
	bc.sock.release()
	if bc.br != nil {
		bc.br.Reset(nil)
		readerPool.Put(bc.br)
		bc.bw.Reset(nil)
		writerPool.Put(bc.bw)
		bc.br, bc.bw = nil, nil
	}
}

// bodyPhase gives every further read the backend's read-timeout (armed
// by the read itself: a body already buffered needs none).
func (bc *backendConn) bodyPhase() {
	bc.sock.idle = bc.readTimeout
}

// alive tells whether an idle pooled connection was closed by the backend,
// without consuming data. Used before sending a non-idempotent request on a
// reused connection, which could not be replayed if it turned out stale.
func (bc *backendConn) alive() bool {
	if bc.br.Buffered() > 0 {
		return false // unsolicited bytes: the connection is out of sync
	}
	bc.sock.idle = 0
	bc.sock.drained = false // really look: a FIN may not have been delivered as an edge yet
	bc.sock.setDeadline(time.Now().Add(time.Microsecond))
	_, err := bc.br.Peek(1)
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// dialServer connects to s for a long-lived stream (TCP session, Upgrade),
// with Go's default TCP keep-alive probes.
func dialServer(ctx context.Context, s *Server) (net.Conn, error) {
	d := net.Dialer{Timeout: s.group.cfg.ConnectTimeout}
	return d.DialContext(ctx, "tcp", s.cfg.Address)
}

// dialPooled connects to s for pooled HTTP/1.1 exchanges, without TCP
// keep-alive probes: a pooled connection lives at most idle-conn-timeout
// idle, a dead one is caught by the stale-connection rule (decideRetry),
// and nginx and HAProxy set none on theirs either. Why: the probes cost
// setsockopt calls on every dial, and with more requests in flight than
// idle-conns (1,000 clients) many requests dial (nginx's pool as well).
func dialPooled(ctx context.Context, s *Server) (net.Conn, error) {
	d := net.Dialer{Timeout: s.group.cfg.ConnectTimeout, KeepAlive: -1}
	return d.DialContext(ctx, "tcp", s.cfg.Address)
}

// ServeHTTP forwards one request to the backend chosen by the route.
func (p *httpProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt := p.route.Load()
	var start time.Time
	if p.accessLog {
		start = time.Now()
	}
	code := 0
	switch {
	case len(r.Header) > rt.lc.MaxHeaderCount:
		code = http.StatusRequestHeaderFieldsTooLarge
		http.Error(w, "too many header fields", code)
	case r.ProtoMajor == 1 && r.Header.Get("Upgrade") != "" && headerHasToken(r.Header, "Connection", "upgrade"):
		code = p.serveUpgrade(w, r, rt.g)
	default:
		code = p.forward(w, r, rt.g)
	}
	if p.accessLog {
		p.lg.Info("access", zap.String("client", r.RemoteAddr), zap.String("method", r.Method),
			zap.String("host", r.Host), zap.String("uri", r.RequestURI), zap.String("proto", r.Proto),
			zap.Int("status", code), zap.Duration("duration", time.Since(start)),
			zap.String("backend", rt.g.cfg.Name))
	}
}

// forward runs attempts until one completes or decideRetry says stop.
func (p *httpProxy) forward(w http.ResponseWriter, r *http.Request, g *Group) int {
	idem := idempotent(r.Method)
	hasBody := !(r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0)
	var triedBuf [4]*Server
	tried := triedBuf[:0]
	for attempt := 0; ; attempt++ {
		s, err := g.acquire(r.Context(), tried)
		if err != nil && len(tried) > 0 {
			http.Error(w, "bad gateway", http.StatusBadGateway) // every server we could try failed
			return http.StatusBadGateway
		}
		if err != nil {
			return p.unavailable(w, g, err)
		}
		out, code := p.try(w, r, s, idem, hasBody)
		s.release()
		act, _ := decideRetry(attemptResult{out: out, idem: idem, hasBody: hasBody, attempt: attempt, retries: *g.cfg.Retries})
		if act == retryStop {
			switch out {
			case outDone:
				return code
			case outAborted:
				s.noteFailure()
				panic(http.ErrAbortHandler)
			case outBadRequest:
				if code == 0 {
					panic(http.ErrAbortHandler) // the client went away
				}
				// The body's framing is broken or stalled: net/http must
				// not look for another request after it.
				w.Header().Set("Connection", "close")
				http.Error(w, http.StatusText(code), code)
				return code
			}
			s.noteFailure()
			if code == 0 {
				code = http.StatusBadGateway
			}
			http.Error(w, http.StatusText(code), code)
			return code
		}
		s.noteFailure()
		g.m.retries.WithLabelValues(g.cfg.Name).Inc()
		tried = append(tried, s)
	}
}

// unavailable answers when no server could be found (after the hold).
func (p *httpProxy) unavailable(w http.ResponseWriter, g *Group, err error) int {
	g.m.noServer.WithLabelValues(g.cfg.Name).Inc()
	if errors.Is(err, context.Canceled) {
		return 499 // client went away while holding
	}
	secs := int((g.cfg.RetryAfter + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
	http.Error(w, "no server available", http.StatusServiceUnavailable)
	return http.StatusServiceUnavailable
}

// try makes one attempt on server s. A stale pooled connection (closed by
// the backend while idle) is replaced by a fresh one on the same server when
// that is safe, without counting as a retry.
func (p *httpProxy) try(w http.ResponseWriter, r *http.Request, s *Server, idem, hasBody bool) (outcome, int) {
	for fresh := false; ; fresh = true {
		bc, reused, err := s.conn(r.Context(), replayable(idem, hasBody), fresh)
		if err != nil {
			return outNotSent, http.StatusBadGateway
		}
		out, code, err := p.exchange(w, r, s, bc)
		if act, _ := decideRetry(attemptResult{out: out, reused: reused, idem: idem, hasBody: hasBody}); act == retryFresh {
			continue
		}
		s.logExchange(out, err)
		return out, code
	}
}

// conn returns a backend connection to s for one attempt: a pooled one
// unless fresh is asked for (a request that cannot be replayed never gets
// one that is visibly dead), else a new dial. reused tells whether it came
// from the pool.
func (s *Server) conn(ctx context.Context, replay, fresh bool) (bc *backendConn, reused bool, err error) {
	if !fresh {
		bc = s.pool.get()
		if bc != nil && !replay && !bc.alive() {
			bc.close()
			bc = nil
		}
	}
	if bc != nil {
		return bc, true, nil
	}
	c, err := dialPooled(ctx, s)
	if err != nil {
		s.group.lg.Debug("connect failed", zap.String("server", s.name), zap.Error(err))
		return nil, false, err
	}
	return newBackendConn(c, s.group.cfg.ReadTimeout, s.group.poll.pick()), false, nil
}

func (s *Server) logExchange(out outcome, err error) {
	if err != nil && out != outAborted {
		s.group.lg.Debug("backend exchange failed", zap.String("server", s.name), zap.Error(err))
	}
}

// exchange writes the request on bc and relays the response.
func (p *httpProxy) exchange(w http.ResponseWriter, r *http.Request, s *Server, bc *backendConn) (outcome, int, error) {
	if err := writeRequest(bc.bw, r, p.tls, false, p.bodyReads(w)); err != nil {
		bc.close()
		if errors.Is(err, errClientBody) {
			return outBadRequest, stdBodyErrorStatus(err), err
		}
		return outNoResponse, http.StatusBadGateway, err
	}
	resp, out, code, err := readResponse(bc, r, s.group.cfg.ResponseHeaderTimeout)
	if err != nil {
		bc.close()
		return out, code, err
	}
	s.countResponse(resp.StatusCode)
	copyHeader(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	if err := copyBody(w, resp.Body, bc.br, resp.ContentLength < 0); err != nil {
		bc.close()
		return outAborted, resp.StatusCode, err
	}
	if resp.Close || bc.br.Buffered() > 0 {
		bc.close() // unread bytes would be taken for the next answer
	} else {
		s.pool.put(bc)
	}
	return outDone, resp.StatusCode, nil
}

// readResponse waits (bounded) for the response head, skipping interim 1xx.
func readResponse(bc *backendConn, r *http.Request, timeout time.Duration) (*http.Response, outcome, int, error) {
	bc.sock.idle = 0
	bc.sock.arm(timeout)
	if _, err := bc.br.Peek(1); err != nil {
		code := http.StatusBadGateway
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			code = http.StatusGatewayTimeout
		}
		return nil, outNoResponse, code, err
	}
	for {
		resp, err := http.ReadResponse(bc.br, r)
		if err != nil {
			return nil, outFailed, http.StatusBadGateway, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			bc.bodyPhase()
			return resp, outDone, resp.StatusCode, nil
		}
	}
}

// writeRequest writes the request head and streams its body. With upgrade
// the Connection/Upgrade pair is kept (WebSocket); otherwise hop-by-hop
// headers are dropped and the connection is kept alive.
// bodyDeadline, when set, is called with true before each read of the
// body (the client-body-timeout's deadline) and with false after the last.
func writeRequest(bw *wbuf, r *http.Request, tlsIn, upgrade bool, bodyDeadline func(bool)) error {
	uri := r.RequestURI
	if uri == "" || uri[0] != '/' && uri != "*" {
		uri = r.URL.RequestURI()
	}
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	bw.WriteString(uri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(r.Host)
	bw.WriteString("\r\n")
	connListed := r.Header["Connection"]
	for k, vv := range r.Header {
		if skipRequest[k] || len(connListed) > 0 && headerHasToken(r.Header, "Connection", k) {
			continue
		}
		for _, v := range vv {
			writeHeaderLine(bw, k, v)
		}
	}
	writeForwarded(bw, r, tlsIn)
	if upgrade {
		writeHeaderLine(bw, "Connection", "Upgrade")
		writeHeaderLine(bw, "Upgrade", r.Header.Get("Upgrade"))
	}
	hasBody := r.Body != nil && r.Body != http.NoBody
	switch {
	case r.ContentLength > 0:
		bw.WriteString("Content-Length: ")
		bw.WriteString(strconv.FormatInt(r.ContentLength, 10))
		bw.WriteString("\r\n\r\n")
	case r.ContentLength < 0 && hasBody:
		bw.WriteString("Transfer-Encoding: chunked\r\n\r\n")
	case r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch:
		bw.WriteString("Content-Length: 0\r\n\r\n")
	default:
		bw.WriteString("\r\n")
	}
	if hasBody && r.ContentLength != 0 {
		if err := writeBody(bw, r, bodyDeadline); err != nil {
			return err
		}
	}
	return bw.Flush()
}

func writeBody(bw *wbuf, r *http.Request, bodyDeadline func(bool)) error {

	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	var dst io.Writer = bw
	var cw io.WriteCloser
	if r.ContentLength < 0 {
		cw = httputil.NewChunkedWriter(bw)
		dst = cw
	}
	buf := *bp
	for {
		if bodyDeadline != nil {
			bodyDeadline(true)
		}
		n, rerr := r.Body.Read(buf)
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			// The deadline stays: net/http, closing the body after us,
			// would otherwise wait without limit for the rest of it.
			return errors.Join(errClientBody, rerr)
		}
	}
	if bodyDeadline != nil {
		// Cleared after the body: net/http's background read of the
		// connection must not trip over it while the backend answers.
		bodyDeadline(false)
	}
	if cw != nil {
		if err := cw.Close(); err != nil {
			return err
		}
		_, err := bw.WriteString("\r\n")
		return err
	}
	return nil
}

// writeForwarded adds X-Forwarded-For (appended), -Proto, -Host and X-Real-IP.
func writeForwarded(bw *wbuf, r *http.Request, tlsIn bool) {
	ip := r.RemoteAddr
	if h, _, err := net.SplitHostPort(ip); err == nil {
		ip = h
	}
	bw.WriteString("X-Forwarded-For: ")
	for _, v := range r.Header["X-Forwarded-For"] {
		bw.WriteString(v)
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
	bw.WriteString(r.Host)
	bw.WriteString("\r\n")
}

func writeHeaderLine(bw *wbuf, k, v string) {
	bw.WriteString(k)
	bw.WriteString(": ")
	bw.WriteString(v)
	bw.WriteString("\r\n")
}

// copyHeader copies response headers without hop-by-hop ones.
func copyHeader(dst, src http.Header) {
	connListed := len(src["Connection"]) > 0
	for k, vv := range src {
		if skipResponse[k] || connListed && headerHasToken(src, "Connection", k) {
			continue
		}
		dst[k] = vv
	}
}

// copyBody relays a response body with a pooled buffer. It flushes what
// it wrote when the backend has nothing more buffered (so a slow body
// streams) and, with flush, after every write (SSE, chunked).
func copyBody(w http.ResponseWriter, body io.ReadCloser, src *bufio.Reader, flush bool) error {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	fl, _ := w.(http.Flusher)
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return errors.Join(errClientGone, err)
			}
			if fl != nil && (flush || rerr == nil && src.Buffered() == 0) {
				fl.Flush()
			}
		}
		if rerr == io.EOF {
			return body.Close()
		}
		if rerr != nil {
			return rerr
		}
	}
}

// bodyReads returns what sets the deadline of each read of a request
// body: client-body-timeout from the read's start (net/http's ReadTimeout would
// bound the whole request instead, and its IdleTimeout only the wait
// between requests).
func (p *httpProxy) bodyReads(w http.ResponseWriter) func(bool) {
	d := p.route.Load().lc.ClientBodyTimeout
	if d <= 0 {
		return nil
	}
	rc := http.NewResponseController(w)
	return func(on bool) {
		var t time.Time
		if on {
			t = time.Now().Add(d)
		}
		_ = rc.SetReadDeadline(t)
	}
}

// stdBodyErrorStatus is the answer to a request body net/http could not
// read: 408 for a stall past client-body-timeout, 0 (just close) for a
// client that went away, 400 for the rest (net/http's framing errors are
// not typed).
func stdBodyErrorStatus(err error) int {
	var ne net.Error
	var oe *net.OpError
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return http.StatusRequestTimeout
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.As(err, &oe):
		return 0
	}
	return http.StatusBadRequest
}

// idempotent per RFC 9110 §9.2.2.
func idempotent(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// headerHasToken reports whether a comma-separated header lists token.
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h[name] {
		for v != "" {
			var t string
			t, v, _ = strings.Cut(v, ",")
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// serveUpgrade relays an Upgrade (WebSocket) request: a fresh backend
// connection, and after 101 the raw bytes both ways until either side closes.
func (p *httpProxy) serveUpgrade(w http.ResponseWriter, r *http.Request, g *Group) int {
	s, err := g.acquire(r.Context(), nil)
	if err != nil {
		return p.unavailable(w, g, err)
	}
	defer s.release()
	c, err := dialServer(r.Context(), s)
	if err != nil {
		s.noteFailure()
		http.Error(w, "bad gateway", http.StatusBadGateway)
		return http.StatusBadGateway
	}
	bc := newBackendConn(c, s.group.cfg.ReadTimeout, s.group.poll.pick())
	defer bc.close()
	if err := writeRequest(bc.bw, r, p.tls, true, p.bodyReads(w)); err != nil {
		s.noteFailure()
		http.Error(w, "bad gateway", http.StatusBadGateway)
		return http.StatusBadGateway
	}
	resp, _, code, err := readResponse(bc, r, s.group.cfg.ResponseHeaderTimeout)
	if err != nil {
		s.noteFailure()
		http.Error(w, http.StatusText(code), code)
		return code
	}
	s.countResponse(resp.StatusCode)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		copyHeader(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		_ = copyBody(w, resp.Body, bc.br, true)
		return resp.StatusCode
	}
	cc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return http.StatusInternalServerError
	}
	defer cc.Close()
	bc.sock.idle = 0 // an upgraded stream may idle as long as its ends like
	bc.sock.setDeadline(time.Time{})
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\n")
	resp.Header.Write(brw)
	brw.WriteString("\r\n")
	if err := brw.Flush(); err != nil {
		return http.StatusSwitchingProtocols
	}
	pipe(cc, brw.Reader, bc.c, bc.br)
	return http.StatusSwitchingProtocols
}

// pipe copies a↔b (with already buffered bytes first) until one side ends.
func pipe(a net.Conn, ar io.Reader, b net.Conn, br io.Reader) {
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(b, ar)
		closeWrite(b)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(a, br)
		closeWrite(a)
		done <- struct{}{}
	}()
	<-done
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}
