package lb

import (
	"context"
	"errors"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// poller wakes the goroutines waiting to read sockets in the order the
// sockets became readable.
//
// Why: Go's netpoller returns the goroutines of one poll in reverse
// readiness order (the runtime pushes each onto the head of a list), so
// under load the connection that has waited longest in a batch is served
// last. With one or two Ps and ~50 busy connections that made our p99
// about 1.3x Nginx's at the same p50 and CPU per request; served in
// readiness order (an epoll set of our own, read by one goroutine) the tail
// matches an event loop's. Sockets stay in Go's poller too: writes, Close
// and deadlines keep working as before, and a socket not registered here
// (no poller, or registration failed) simply waits there.
type poller struct {
	f  *os.File        // the epoll fd, itself waited on through Go's poller
	rc syscall.RawConn // of f
	fd int

	mu    sync.Mutex
	slots []pollSlot
	free  []uint32

	stopped atomic.Bool
	evs     [128]syscall.EpollEvent
	batch   []*sockIO
	inline  []*sockIO // this turn's sockets owned by the event loop

	pollFn func(uintptr) bool // p.poll, bound once (a method value per call allocates)

	// Requests its event loop served wholly, and handed to a goroutine
	// (written by the poller's goroutine only: no shared cache line).
	served, handed atomic.Uint64

	// Event loop (see eventloop.go): efd wakes the poller for mail, the
	// connections adopted and the loop sockets kicked from elsewhere
	// (deadline timers, Close).
	efd   int
	mail  []mailItem
	spare []mailItem
}

// mailItem is a socket kicked while in the loop, or a connection to adopt.
type mailItem struct {
	s  *sockIO
	hc *h1Conn
}

// efdSlot marks the eventfd's events in the set.
const efdSlot = ^uint32(0)

type pollSlot struct {
	s   *sockIO
	gen uint32
}

// newPoller creates the epoll set; nothing runs until run.
func newPoller() (*poller, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		_ = syscall.Close(fd)
		return nil, err
	}
	efd, err := newEventFD(fd)
	if err != nil {
		_ = syscall.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "lb-poller")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		_ = syscall.Close(efd)
		return nil, err
	}
	p := &poller{f: f, rc: rc, fd: fd, efd: efd}
	p.pollFn = p.poll
	return p, nil
}

// newEventFD creates the mail eventfd and adds it to the set epfd.
func newEventFD(epfd int) (int, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return -1, errno
	}
	efd := int(r)
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | -syscall.EPOLLET, Fd: -1}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, efd, &ev); err != nil {
		_ = syscall.Close(efd)
		return -1, err
	}
	return efd, nil
}

// post queues a kick of a loop socket and wakes the poller; false once the
// poller has stopped.
func (p *poller) post(s *sockIO) bool { return p.postItem(mailItem{s: s}) }

// adopt hands the idle client connection hc to the event loop; false (the
// caller keeps it) once the poller has stopped.
func (p *poller) adopt(hc *h1Conn) bool { return p.postItem(mailItem{hc: hc}) }

func (p *poller) postItem(it mailItem) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped.Load() || p.efd < 0 {
		return false
	}
	p.mail = append(p.mail, it)
	one := uint64(1)
	_, _ = syscall.Write(p.efd, (*[8]byte)(unsafe.Pointer(&one))[:])
	return true
}

// deliver handles one piece of mail on the poller's goroutine.
func (p *poller) deliver(it mailItem) {
	if it.hc != nil {
		it.hc.enterLoop()
		return
	}
	s := it.s
	if s.loop.Load() != p {
		s.kick() // it left the loop meanwhile: wake its reader
		return
	}
	s.drained = false // a Close or a deadline: look at the socket
	loopEvent(s)
}

// move re-registers s (on another poller) with p, so the loop of p sees
// its readiness. False leaves s on Go's poller alone.
func (p *poller) move(s *sockIO) bool {
	old := s.pw
	if old == p {
		return true
	}
	if old == nil {
		return false
	}
	var err error
	cerr := s.rc.Control(func(fd uintptr) {
		err = syscall.EpollCtl(old.fd, syscall.EPOLL_CTL_DEL, int(fd), &syscall.EpollEvent{})
	})
	old.release(s.slot)
	s.pw = nil
	if cerr != nil || err != nil {
		return false
	}
	return p.register(s)
}

// takeMail empties the eventfd and returns the queued mail.
func (p *poller) takeMail() []mailItem {
	var b [8]byte
	_, _ = syscall.Read(p.efd, b[:])
	p.mu.Lock()
	m := p.mail
	p.mail = p.spare[:0]
	p.mu.Unlock()
	p.spare = m
	return m
}

// run dispatches readiness until ctx ends, then wakes every registered
// reader so it goes back to Go's poller, and closes the set.
func (p *poller) run(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() { _ = p.f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	for ctx.Err() == nil {
		if err := p.rc.Read(p.pollFn); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		// A batch was dispatched. First give the CPU to the processes its
		// writes woke (the backend, the clients): on a busy machine the
		// kernel puts them on this CPU, and there they would preempt the
		// loop in the middle of its next batch instead. After they ran,
		// the next poll finds more of their answers, so batches grow and
		// the loop parks less, as HAProxy's, whose turn is longer. It took
		// the 1-worker 100 B p99 from about 1.1x HAProxy's to 1.0x (README,
		// hapair-lb). With nothing else runnable the yield returns at once.
		schedYield()
		// Then let the batch's goroutine readers run before polling
		// again, like an event loop's next turn. Under load the set then
		// has the next batch ready and the dispatcher does not park in
		// Go's poller (whose wake-up costs a scheduler round and a second
		// epoll_wait); when the set is empty, the next poll parks.
		runtime.Gosched()
	}
	p.stopped.Store(true)
	p.mu.Lock()
	list := make([]*sockIO, 0, len(p.slots))
	for _, sl := range p.slots {
		if sl.s != nil {
			list = append(list, sl.s)
		}
	}
	mail := p.mail
	p.mail = nil
	p.mu.Unlock()
	for _, it := range mail {
		if it.hc != nil {
			it.hc.srv.finish(it.hc) // never taken over: nothing serves it
		}
	}
	for _, s := range list {
		if s.loop.Load() == p && s.owner != nil && s.owner.rs == s {
			s.owner.loopStop() // back to a goroutine, which waits on Go's poller
		}
		s.kick()
	}
	_ = p.f.Close()
	p.mu.Lock()
	_ = syscall.Close(p.efd)
	p.efd = -1
	p.mu.Unlock()
}

// poll takes the ready sockets (without waiting) and wakes their readers;
// false (none ready) parks the dispatcher until the set has more.
func (p *poller) poll(fd uintptr) bool {
	n, errno := epollWait(fd, p.evs[:])
	if errno == syscall.EINTR {
		return true
	}
	if n <= 0 {
		return false
	}
	p.dispatch(n)
	return true
}

// dispatch hands the n ready events in p.evs to their readers or loops.
func (p *poller) dispatch(n int) {
	p.batch, p.inline = p.batch[:0], p.inline[:0]
	mail := false
	p.mu.Lock()
	for _, ev := range p.evs[:n] {
		i, gen := uint32(ev.Fd), uint32(ev.Pad)
		if i == efdSlot {
			mail = true
			continue
		}
		if int(i) < len(p.slots) && p.slots[i].gen == gen && p.slots[i].s != nil {
			if ev.Events&(syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
				p.slots[i].s.hup.Store(true) // before the wake-up: see sockIO.hup
			}
			if s := p.slots[i].s; s.loop.Load() == p {
				p.inline = append(p.inline, s)
			} else {
				p.batch = append(p.batch, s)
			}
		}
	}
	p.mu.Unlock()
	// A woken goroutine takes the P's next slot and pushes the one there
	// before it to the run queue's tail: waking the first last makes the
	// run order the readiness order.
	if len(p.batch) > 0 {
		for _, s := range p.batch[1:] {
			s.kick()
		}
		p.batch[0].kick()
		clear(p.batch)
	}
	// Sockets the loop owns are served here, in readiness order.
	for _, s := range p.inline {
		if s.loop.Load() != p {
			s.kick() // it left the loop during this batch: to its reader
			continue
		}
		s.drained = false // an edge: there is something to read
		loopEvent(s)
	}
	clear(p.inline)
	if mail {
		for _, it := range p.takeMail() {
			p.deliver(it)
		}
		clear(p.spare)
	}
}

// register adds c's socket to the set for s; false leaves s on Go's poller.
func (p *poller) register(s *sockIO) bool {
	if p == nil || p.stopped.Load() || s.rc == nil {
		return false
	}
	p.mu.Lock()
	var i uint32
	if n := len(p.free); n > 0 {
		i = p.free[n-1]
		p.free = p.free[:n-1]
	} else {
		i = uint32(len(p.slots))
		p.slots = append(p.slots, pollSlot{})
	}
	p.slots[i].s = s
	gen := p.slots[i].gen
	p.mu.Unlock()
	var err error
	cerr := s.rc.Control(func(fd uintptr) {
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | -syscall.EPOLLET, Fd: int32(i), Pad: int32(gen)}
		err = syscall.EpollCtl(p.fd, syscall.EPOLL_CTL_ADD, int(fd), &ev)
	})
	if cerr != nil || err != nil {
		p.release(i)
		return false
	}
	s.pw, s.slot = p, i
	return true
}

// release frees slot i; events still queued for it are ignored. The kernel
// drops the socket from the set when it is closed.
func (p *poller) release(i uint32) {
	p.mu.Lock()
	p.slots[i].s = nil
	p.slots[i].gen++
	p.free = append(p.free, i)
	p.mu.Unlock()
}

// schedYield gives up this thread's CPU to the runnable threads around it
// (sched_yield(2)), without the Go scheduler's involvement: the P stays
// with this goroutine, which carries on as soon as the kernel runs it.
func schedYield() { _, _, _ = syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }

// errDeadline is what a read that waited past its deadline returns, like
// net.Conn's (a net.Error whose Timeout() is true).
var errDeadline = &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}

// pollSet is one poller per P, connections dealt to them in turn: each
// poller wakes its readers onto the P it runs on, a batch at a time, like
// an event loop thread that owns its connections.
type pollSet struct {
	ps   []*poller
	next atomic.Uint32
}

func newPollSet(n int) (*pollSet, error) {
	s := &pollSet{}
	for range max(n, 1) {
		p, err := newPoller()
		if err != nil {
			for _, p := range s.ps {
				_ = p.f.Close()
				_ = syscall.Close(p.efd)
			}
			return nil, err
		}
		s.ps = append(s.ps, p)
	}
	return s, nil
}

// pick returns the poller for a new connection (nil for a nil set).
func (s *pollSet) pick() *poller {
	if s == nil {
		return nil
	}
	if len(s.ps) == 1 {
		return s.ps[0]
	}
	return s.ps[s.next.Add(1)%uint32(len(s.ps))]
}

// loopCounts sums the pollers' event-loop request counts.
func (s *pollSet) loopCounts() (served, handed uint64) {
	for _, p := range s.ps {
		served += p.served.Load()
		handed += p.handed.Load()
	}
	return served, handed
}

// run runs every poller until ctx ends and they have all stopped.
func (s *pollSet) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, p := range s.ps {
		wg.Go(func() { p.run(ctx) })
	}
	wg.Wait()
}
