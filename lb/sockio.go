package lb

import (
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// sockIO reads and writes a TCP connection with direct non-blocking system
// calls, parking on Go's netpoller (deadlines and Close still apply) only
// when the socket is not ready.
//
// Why: a socket read or write through net.Conn enters the scheduler's
// syscall state; when the kernel preempts the thread inside it (a loopback
// write wakes the peer, which often runs first), sysmon sees a P stuck in a
// syscall, hands it to another thread, and keeps polling every 20 µs. With
// one or two Ps that thread ping-pong cost ~30 % of the proxy's CPU per
// small request. A non-blocking socket call never blocks, so it may run
// without entering that state (see sysRead/sysWrite; race builds use the
// annotated calls so the race detector keeps its view of I/O ordering).
type sockIO struct {
	c  net.Conn
	rc syscall.RawConn // nil: plain c.Read/c.Write

	// Read deadline bookkeeping: dl is the deadline set on c (zero: none);
	// idle, when set, gives every read a deadline of idle from its start.
	dl   time.Time
	idle time.Duration
	now  time.Time // when arm last read the clock (a cheap recent time)

	// State of the call in progress, kept here so the callbacks are bound
	// once per connection instead of allocating a closure per call. Reads
	// and writes have their own, so one reader and one writer may run at
	// once (a TLS connection's writes, an alert or an HTTP/2 frame, come
	// from other goroutines than its reads).
	rfn, wfn, ofn, nwfn func(fd uintptr) bool
	buf                 []byte // read
	n                   int
	err                 error
	wb                  []byte // write
	wn                  int
	werr                error

	// out is sent at the start of the next Read, which then waits for the
	// answer without a read attempt (see wbuf.pend). Only for backend
	// connections: a backend speaks only when asked, so readiness that
	// arrived before that Read (and is forgotten when it starts) cannot be
	// an answer; a client may pipeline, so its reads always try first.
	out []byte

	// Waiting for readability through the poller (pw != nil): wake gets a
	// token for every edge, a deadline change or Close (kick); dlNano is
	// the read deadline (unix nanos, 0: none) and tm wakes the reader at it.
	pw    *poller
	slot  uint32
	wake  chan struct{}
	again bool // the last read attempt found the socket empty
	// drained: the last read took less than it asked for, so it emptied
	// the socket; unless an edge has been delivered since (a token in
	// wake), a new read could only find it empty (see readPolled).
	drained bool
	// hup: the peer has shut down its side (or the socket failed). An edge
	// that brings the last data and the FIN together is the last edge, so
	// after it a short read does not mean "wait for the next edge": the
	// next read returns the end (a half-closed client was otherwise kept
	// until idle-timeout).
	hup    atomic.Bool
	dlNano atomic.Int64
	tm     *time.Timer
	tmAt   int64

	// Event-loop mode (see eventloop.go): while loop is set, that poller's
	// goroutine owns the socket; its readiness, deadline timer and kicks
	// go to the loop serving owner instead of a parked reader, and reads
	// return errWouldBlock instead of waiting (nb).
	loop  atomic.Pointer[poller]
	owner *h1Conn
	nb    bool
}

// newSockIO returns the I/O of c: raw when c offers it, else c's own. With
// a poller, reads wait for it instead of Go's poller (see poller); the
// owner must call release when c is closed.
func newSockIO(c net.Conn, p *poller) *sockIO {
	s := &sockIO{c: c}
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			s.rc = rc
		}
	}
	s.rfn, s.wfn, s.ofn, s.nwfn = s.doRead, s.doWrite, s.doOut, s.doWriteNB
	if p != nil && s.rc != nil {
		s.wake = make(chan struct{}, 1)
		p.register(s)
	}
	return s
}

// release leaves the poller (c is closed or about to be).
func (s *sockIO) release() {
	if s.pw != nil {
		s.pw.release(s.slot)
		s.pw = nil
	}
	if s.tm != nil {
		s.tm.Stop()
	}
}

// close closes c and wakes a reader waiting on it in another goroutine.
func (s *sockIO) close() error {
	err := s.c.Close()
	s.kick()
	return err
}

// kick wakes the reader (or its next wait) once; a socket in the event
// loop is handed to its poller instead.
func (s *sockIO) kick() {
	if s.wake == nil {
		return
	}
	if p := s.loop.Load(); p != nil && p.post(s) {
		return
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// setDeadline sets the read deadline of c (zero: none) and remembers it.
// A reader waiting in another goroutine sees the change.
func (s *sockIO) setDeadline(t time.Time) {
	if t.Equal(s.dl) {
		return
	}
	s.dl = t
	_ = s.c.SetReadDeadline(t)
	if s.wake != nil {
		var dn int64
		if !t.IsZero() {
			dn = max(t.UnixNano(), 1)
		}
		s.dlNano.Store(dn)
		if !s.nb { // the event loop sets its own deadlines: nobody to wake
			s.kick()
		}
	}
}

// wait parks until the poller reports the socket readable, the read
// deadline passes (errDeadline) or something kicks the reader.
func (s *sockIO) wait() error {
	if err := s.schedule(); err != nil {
		return err
	}
	if !s.pw.stopped.Load() { // (checked again after: it may stop meanwhile)
		<-s.wake
	}
	if s.pw.stopped.Load() {
		s.release() // the poller is gone: wait on Go's from now on
	}
	return nil
}

// schedule makes the deadline timer kick the reader at the read deadline;
// errDeadline when it has passed.
func (s *sockIO) schedule() error {
	dl := s.dlNano.Load()
	if dl == 0 {
		return nil
	}
	now := time.Now().UnixNano()
	if now >= dl {
		return errDeadline
	}
	if s.tmAt != dl {
		s.tmAt = dl
		if s.tm == nil {
			s.tm = time.AfterFunc(time.Duration(dl-now), s.kick)
		} else {
			s.tm.Reset(time.Duration(dl - now))
		}
	}
	return nil
}

// arm makes the read deadline d from now, coarsely: a deadline already set
// that is at most a small slack earlier is kept. Setting a deadline costs a
// timer update in the runtime; a busy keep-alive connection would pay it
// twice per request for nothing.
func (s *sockIO) arm(d time.Duration) {
	if d <= 0 {
		s.setDeadline(time.Time{})
		return
	}
	s.now = time.Now()
	want := s.now.Add(d)
	if !s.dl.IsZero() && !s.dl.After(want) && want.Sub(s.dl) <= min(d/16, 250*time.Millisecond) {
		return
	}
	s.setDeadline(want)
}

func (s *sockIO) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if s.idle > 0 {
		s.arm(s.idle)
	}
	if s.rc == nil {
		if len(s.out) > 0 {
			out := s.out
			s.out = nil
			if _, err := s.c.Write(out); err != nil {
				return 0, err
			}
		}
		return s.c.Read(p)
	}
	s.buf, s.n, s.err = p, 0, nil
	err := s.read()
	if err == nil && s.err == nil && len(s.out) > 0 {
		// The socket buffer filled while sending: finish the usual way.
		if err = s.rc.Write(s.ofn); err == nil && s.err == nil {
			err = s.read()
		}
	}
	s.out = nil
	n, rerr := s.n, s.err
	s.buf, s.err = nil, nil
	if err != nil {
		return n, err // deadline passed or connection closed
	}
	return n, rerr
}

// read runs doRead until it has data, an end or an error.
func (s *sockIO) read() error {
	if s.pw != nil {
		return s.readPolled()
	}
	return s.rc.Read(s.rfn)
}

// readPolled reads, waiting for the poller whenever the socket is empty.
func (s *sockIO) readPolled() error {
	if s.nb {
		// Event loop: one attempt, unless the socket is known empty.
		if s.drained {
			return errWouldBlock
		}
		s.again = false
		if err := s.rc.Read(s.rfn); err != nil || !s.again {
			return err
		}
		return errWouldBlock
	}
	if len(s.out) > 0 {
		// Edges before this send cannot be its answer: forget them.
		select {
		case <-s.wake:
		default:
		}
	} else if s.drained {
		// The last read emptied the socket and the set is edge-triggered:
		// anything that arrived since queued an edge, which the poller
		// turns into a token. Without one yet, wait for it instead of a
		// read that would only say EAGAIN (for a client between keep-alive
		// requests that is one system call of five per request).
		select {
		case <-s.wake:
		default:
			if err := s.wait(); err != nil {
				return err
			}
		}
	}
	for {
		s.again = false
		if err := s.rc.Read(s.rfn); err != nil || !s.again {
			return err
		}
		if err := s.wait(); err != nil {
			return err
		}
	}
}

func (s *sockIO) doRead(fd uintptr) bool {
	if len(s.out) > 0 {
		if s.pw != nil {
			if s.sendOut(fd) && s.err == nil {
				s.again = true // sent: wait for the answer without reading
			}
			return true
		}
		// The poller's readiness was reset just before this callback, so
		// an answer to what we send now wakes us: wait without reading.
		return !s.sendOut(fd) || s.err != nil
	}
	for {
		n, errno := sysRead(fd, s.buf)
		switch errno {
		case 0:
			s.n = n
			s.drained = n > 0 && n < len(s.buf) && !s.hup.Load()
			if n == 0 {
				s.err = io.EOF
			}
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			if s.pw != nil {
				s.again = true // the poller waits (readPolled)
				return true
			}
			return false // park until readable
		default:
			s.drained = false
			s.err = &net.OpError{Op: "read", Net: "tcp", Err: errno}
			return true
		}
	}
}

// setOut leaves p to be sent by the next Read before it waits.
func (s *sockIO) setOut(p []byte) { s.out = p }

// sendOut writes pending bytes; false when the socket would block (or on
// an error, recorded in s.err).
func (s *sockIO) sendOut(fd uintptr) bool {
	for len(s.out) > 0 {
		n, errno := sysWrite(fd, s.out)
		switch errno {
		case 0:
			s.out = s.out[n:]
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			s.err = &net.OpError{Op: "write", Net: "tcp", Err: errno}
			s.out = nil
			return false
		}
	}
	return true
}

func (s *sockIO) doOut(fd uintptr) bool { return s.sendOut(fd) || s.err != nil }

// errWouldBlock is what a read in the event loop returns when the socket
// has nothing more for now. It is a net.Error whose Temporary() is true:
// crypto/tls keeps a connection usable after such a read error (and keeps
// a partial record it read), so a TLS connection can live in the loop too;
// any other error would break it for good.
var errWouldBlock error = wouldBlockError{}

type wouldBlockError struct{}

var _ net.Error = wouldBlockError{}

func (wouldBlockError) Error() string   { return "lb: would block" }
func (wouldBlockError) Timeout() bool   { return false }
func (wouldBlockError) Temporary() bool { return true }

// writeNB writes as much of p as the socket takes now, never waiting.
func (s *sockIO) writeNB(p []byte) (int, error) { return s.rawWrite(p, s.nwfn) }

// rawWrite writes p through the raw connection with fn (doWrite, or
// doWriteNB that never waits) and returns what fn wrote and its error.
func (s *sockIO) rawWrite(p []byte, fn func(uintptr) bool) (int, error) {
	s.wb, s.wn, s.werr = p, 0, nil
	err := s.rc.Write(fn)
	n, werr := s.wn, s.werr
	s.wb, s.werr = nil, nil
	if err == nil {
		err = werr
	}
	return n, err
}

func (s *sockIO) doWriteNB(fd uintptr) bool {
	s.doWrite(fd)
	return true
}

// Write writes all of p (parking while the socket buffer is full).
func (s *sockIO) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if s.rc == nil {
		return s.c.Write(p)
	}
	n, err := s.rawWrite(p, s.wfn)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return n, err
}

func (s *sockIO) doWrite(fd uintptr) bool {
	for s.wn < len(s.wb) {
		n, errno := sysWrite(fd, s.wb[s.wn:])
		switch errno {
		case 0:
			s.wn += n
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false // park until writable, then go on
		default:
			s.werr = &net.OpError{Op: "write", Net: "tcp", Err: errno}
			return true
		}
	}
	return true
}
