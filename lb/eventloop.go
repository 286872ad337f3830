package lb

import (
	"errors"
	"time"
)

// The event loop serves the common HTTP/1.1 keep-alive request, plain or
// over TLS (see h1tls.go), on the poller's own goroutine, as a
// per-connection state machine: read a
// whole bodiless idempotent request from the client, send it on a pooled
// backend connection of the same poller, read the whole response
// (Content-Length, fits the buffers) and write it back, never parking a
// goroutine. Anything else (a partial head, a body, Upgrade, no eligible
// server, no pooled connection, a write that would block, an error, a
// timeout) hands the connection to a goroutine at the point reached
// (attempt), which carries on exactly as the goroutine path would; an idle
// keep-alive connection then comes back (h1Server.serve).
//
// Why: with one goroutine per connection, a readable socket means a
// goroutine to wake, and under load on one or two Ps it waits its turn
// behind a dozen others (runtime trace: ready→running p99 1.5 ms), which
// kept our p99 for 100-byte responses ~1.3x HAProxy's, whose threads each
// own their connections like this loop.

// Where a connection in the loop is.
const (
	loopOff  uint8 = iota // served by a goroutine
	loopIdle              // waiting for the client's next request
	loopHead              // request sent, waiting for the response head
	loopBody              // head parsed, waiting for the rest of the body
)

// Stages an attempt handed to a goroutine has reached.
const (
	stageNew  uint8 = iota // server picked, nothing sent
	stageSent              // request sent (the rest in bc.sock.out), no response head yet
	stageHead              // response head parsed into hc.resp, body not relayed
)

// attempt is a request attempt in progress on a server.
type attempt struct {
	srv   *Server
	bc    *backendConn // nil: no connection yet (stageNew)
	stage uint8
	// The failure met in the loop while waiting for the head (stageSent).
	out  outcome
	code int
	err  error
}

// loopEvent serves a socket the loop owns that is readable, was kicked
// (Close) or reached its deadline; runs on the poller's goroutine.
func loopEvent(s *sockIO) {
	hc := s.owner
	if hc == nil {
		return
	}
	switch {
	case s == hc.rs:
		if hc.lstate == loopIdle {
			hc.loopRequest()
		}
		// Otherwise a pipelined request or the client's end: read once the
		// response is out (drained is false now).
	case hc.at.bc != nil && s == hc.at.bc.sock && (hc.lstate == loopHead || hc.lstate == loopBody):
		hc.loopResponse()
	}
}

// enterLoop takes over the idle connection hc, whose goroutine has ended.
func (hc *h1Conn) enterLoop() {
	s := hc.rs
	if st := hc.state.Load(); st == connClosed || hc.used && hc.srv.shutting.Load() {
		hc.srv.finish(hc)
		return
	}
	if hc.srv.shutting.Load() {
		go hc.srv.serveConn(hc, nil) // a new connection's request is served
		return
	}
	s.owner, s.nb, hc.lstate = hc, true, loopIdle
	s.loop.Store(s.pw)
	select {
	case <-s.wake: // readiness (or a kick) while it changed hands
		s.drained = false
	default:
	}
	hc.loopRequest()
}

// leaveLoop gives hc (and its backend connection) back to goroutine I/O.
func (hc *h1Conn) leaveLoop() {
	for _, s := range []*sockIO{hc.rs, hc.loopBackendSock()} {
		if s != nil && s.owner == hc {
			s.loop.Store(nil)
			s.owner, s.nb, s.drained = nil, false, false
		}
	}
	hc.lstate = loopOff
}

func (hc *h1Conn) loopBackendSock() *sockIO {
	if hc.at.bc == nil {
		return nil
	}
	return hc.at.bc.sock
}

// handoff continues hc on a new goroutine: cont first (nil: the next
// request from the start), then the goroutine path's loop.
func (hc *h1Conn) handoff(cont func() bool) {
	hc.rs.pw.handed.Add(1)
	hc.leaveLoop()
	hc.at = attempt{}
	go hc.srv.serveConn(hc, cont)
}

// handoffAttempt hands hc over in the middle of the attempt at.
func (hc *h1Conn) handoffAttempt(at attempt) {
	s, rt := hc.srv, hc.rt
	hc.handoff(func() bool { return s.serveFrom(hc, rt, &at) })
}

// loopStop: the poller is stopping; a goroutine finishes what hc was doing.
func (hc *h1Conn) loopStop() {
	switch hc.lstate {
	case loopIdle:
		hc.loopFinish()
	case loopHead:
		hc.handoffAttempt(attempt{srv: hc.at.srv, bc: hc.at.bc, stage: stageSent})
	case loopBody:
		hc.handoffAttempt(attempt{srv: hc.at.srv, bc: hc.at.bc, stage: stageHead})
	}
}

// loopFinish closes hc from the loop. A TLS connection is closed on a
// goroutine: its close_notify is a write that may wait (up to 5 s).
func (hc *h1Conn) loopFinish() {
	hc.leaveLoop()
	if hc.ts != nil {
		go hc.srv.finish(hc)
		return
	}
	hc.srv.finish(hc)
}

// loopRequest starts serving the next request if a whole one is there.
func (hc *h1Conn) loopRequest() {
	br := hc.br
	if br.Buffered() == 0 {
		if _, err := br.Peek(1); err != nil {
			if errors.Is(err, errWouldBlock) {
				if hc.ts != nil && hc.ts.pending() {
					hc.handoff(nil) // a TLS message the read answered (KeyUpdate) is not out yet
					return
				}
				if hc.rs.schedule() == nil {
					return // wait for data (or the idle deadline)
				}
			}
			hc.loopFinish() // idle timeout, end, reset or closed by shutdown
			return
		}
	}
	if !hc.activate() {
		hc.loopFinish() // shutdown closed it first
		return
	}
	hc.fastRequest()
}

// fastRequest sends the buffered request if it is a common one, else
// hands hc to a goroutine.
func (hc *h1Conn) fastRequest() {
	s := hc.srv
	rt := s.route.Load()
	hc.rt = rt
	lc := &rt.lc
	buf, _ := hc.br.Peek(hc.br.Buffered())
	end := headEnd(buf, 0)
	if end == 0 || end > lc.MaxHeaderBytes || s.accessLog.Load() {
		hc.handoff(nil) // a partial head waits under the header timeout there
		return
	}
	req := &hc.req
	req.reset()
	req.raw = append(req.raw[:0], buf[:end]...)
	// Only requests the retry rule may replay (decideRetry): the loop's
	// failures are handed to the goroutine path, which may send it again.
	if req.parseRequest(lc.MaxHeaderCount) != 0 || req.upgrade ||
		!replayable(idempotent(string(req.method)), req.length > 0 || req.chunked) {
		hc.slow++
		hc.handoff(nil) // parsed again there, errors answered there
		return
	}
	g := rt.g
	srv := g.tryPick(nil)
	if srv == nil {
		hc.handoff(nil) // hold, queue or 503 there
		return
	}
	hc.slow = 0
	_, _ = hc.br.Discard(end)
	bc := srv.pool.getFor(hc.rs.pw)
	if bc == nil || !hc.rs.pw.move(bc.sock) {
		hc.handoffAttempt(attempt{srv: srv, bc: bc})
		return
	}
	writeRequestHead(bc.bw, req, hc.ip, hc.ts != nil, false)
	bs := bc.sock
	bs.idle = 0
	bs.owner, bs.nb = hc, true
	bs.loop.Store(bs.pw)
	hc.at = attempt{srv: srv, bc: bc, stage: stageSent}
	bs.arm(g.cfg.ResponseHeaderTimeout)
	out := bc.bw.buf
	n, err := bs.writeNB(out)
	bc.bw.buf = out[:0] // the rest stays valid for setOut: nothing writes there before
	switch {
	case err != nil:
		hc.handoffAttempt(attempt{srv: srv, bc: bc, stage: stageSent, out: outNoResponse, code: 502, err: err})
	case n < len(out):
		bs.setOut(out[n:])
		hc.handoffAttempt(attempt{srv: srv, bc: bc, stage: stageSent})
	default:
		// An answer comes as a new edge: no read until then.
		bs.drained = true
		hc.lstate = loopHead
		if bs.schedule() != nil {
			hc.handoffAttempt(attempt{srv: srv, bc: bc, stage: stageSent})
		}
	}
}

// loopResponse reads what the backend sent; once the whole response is
// buffered it is relayed.
func (hc *h1Conn) loopResponse() {
	at := &hc.at
	bc := at.bc
	br := bc.br
	resp := &hc.resp
	for hc.lstate == loopHead {
		if !headBuffered(br) {
			if br.Buffered() >= br.Size() {
				hc.handoffAttempt(*at) // too large: refused there
				return
			}
			if err := hc.loopRead(func() error { _, err := br.Peek(br.Buffered() + 1); return err }); err != nil {
				if !errors.Is(err, errWouldBlock) {
					out, code, err := noResponse(err)
					hc.handoffAttempt(attempt{srv: at.srv, bc: bc, stage: stageSent, out: out, code: code, err: err})
				}
				return
			}
			continue
		}
		resp.reset()
		raw, err := readHead(br, br.Size(), resp.raw)
		if err == nil {
			resp.raw = raw
			err = resp.parseResponse()
		}
		if err != nil {
			hc.handoffAttempt(attempt{srv: at.srv, bc: bc, stage: stageSent, out: outFailed, code: 502, err: err})
			return
		}
		if resp.status >= 200 || resp.status == 101 {
			bc.bodyPhase()
			hc.lstate = loopBody
		}
	}
	req := &hc.req
	body := hasBody(req, resp)
	n := int(max(resp.length, 0))
	if resp.status == 101 || body && (resp.length < 0 || n > br.Size() || len(resp.raw)+n+512 > h1WriterSize) {
		hc.handoffAttempt(attempt{srv: at.srv, bc: bc, stage: stageHead}) // streamed there
		return
	}
	if body && br.Buffered() < n {
		if err := hc.loopRead(func() error { _, err := br.Peek(n); return err }); err != nil {
			if !errors.Is(err, errWouldBlock) {
				hc.handoffAttempt(attempt{srv: at.srv, bc: bc, stage: stageHead})
			}
			return
		}
	}
	hc.relay(body, n)
}

// loopRead runs a read of the backend's response; errWouldBlock means wait
// (the deadline timer is set), any other error is the attempt's.
func (hc *h1Conn) loopRead(read func() error) error {
	err := read()
	if errors.Is(err, errWouldBlock) {
		if derr := hc.at.bc.sock.schedule(); derr != nil {
			return derr
		}
	}
	return err
}

// relay writes the buffered response to the client and ends the attempt.
func (hc *h1Conn) relay(body bool, n int) {
	s := hc.srv
	at := hc.at
	bc, req, resp := at.bc, &hc.req, &hc.resp
	at.srv.countResponse(resp.status)
	hc.bw = h1WriterPool.Get().(*wbuf)
	hc.bw.Reset(hc.sock)
	keep := s.writeResponseHead(hc, req, resp)
	if body {
		b, _ := bc.br.Peek(n)
		_, _ = hc.bw.Write(b)
		_, _ = bc.br.Discard(n)
	}
	if bs := bc.sock; bs.owner == hc {
		bs.loop.Store(nil)
		bs.owner, bs.nb = nil, false
	}
	if resp.close || bc.br.Buffered() > 0 {
		bc.close() // unread bytes would be taken for the next answer
	} else {
		at.srv.pool.put(bc)
	}
	at.srv.release()
	hc.at = attempt{}
	out := hc.bw.buf
	if hc.ts != nil {
		// Encrypted and written at once; what the socket did not take
		// waits in hc.ts.pend, for the goroutine it is handed to.
		_, err := hc.c.Write(out)
		hc.bw.buf = out[:0]
		hc.releaseWriter()
		switch {
		case err != nil:
			at.srv.noteFailure()
			hc.loopFinish()
			return
		case hc.ts.pending():
			hc.handoff(func() bool { return keep })
			return
		}
	} else {
		w, err := hc.sock.writeNB(out)
		switch {
		case err != nil:
			at.srv.noteFailure() // as the goroutine path counts an aborted relay
			hc.loopFinish()
			return
		case w < len(out):
			hc.bw.buf = out[:copy(out, out[w:])]
			hc.handoff(func() bool { return s.flushRest(hc) && keep })
			return
		}
		hc.releaseWriter()
	}
	hc.rs.pw.served.Add(1)
	if !keep || s.shutting.Load() {
		hc.loopFinish()
		return
	}
	hc.nextRequest()
}

// nextRequest waits for the client's next request (or serves it when it is
// already there).
func (hc *h1Conn) nextRequest() {
	hc.lstate = loopIdle
	hc.state.Store(connIdle)
	hc.sock.arm(hc.rt.lc.IdleTimeout)
	// Under TLS the next request may wait in crypto/tls's buffers, which
	// bring no new edge: always look.
	if hc.br.Buffered() > 0 || !hc.rs.drained || hc.ts != nil {
		hc.loopRequest()
		return
	}
	if hc.rs.schedule() != nil {
		hc.loopFinish()
	}
}

// flushRest (on a goroutine) writes what the loop could not.
func (s *h1Server) flushRest(hc *h1Conn) bool {
	if wt := hc.rt.lc.WriteTimeout; wt > 0 {
		_ = hc.c.SetWriteDeadline(time.Now().Add(wt))
	}
	err := hc.bw.Flush()
	hc.releaseWriter()
	return err == nil
}

// serveFrom (on a goroutine) finishes the request the loop started.
func (s *h1Server) serveFrom(hc *h1Conn, rt *route, at *attempt) bool {
	if wt := rt.lc.WriteTimeout; wt > 0 {
		_ = hc.c.SetWriteDeadline(time.Now().Add(wt))
	}
	hc.bw = h1WriterPool.Get().(*wbuf)
	hc.bw.Reset(hc.sock)
	_, keep := s.proxy(hc, rt.g, at)
	hc.releaseWriter()
	req := &hc.req
	return keep && !req.close && (req.minor == 1 || req.keepAlive)
}
