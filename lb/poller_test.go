package lb

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

// startPoller runs a poller until stop is called or the test ends; stop
// returns once the poller has stopped.
func startPoller(t *testing.T) (p *poller, stop func()) {
	t.Helper()
	p, err := newPoller()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.run(ctx)
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return p, stop
}

// tcpPair returns both ends of a loopback TCP connection.
// polledSock is one end of a loopback pair read through a running poller;
// peer is the other end.
func polledSock(t *testing.T) (s *sockIO, peer net.Conn, p *poller, stop func()) {
	t.Helper()
	p, stop = startPoller(t)
	a, peer := tcpPair(t)
	s = newSockIO(a, p)
	t.Cleanup(s.release)
	return s, peer, p, stop
}

func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { _ = a.Close(); _ = r.c.Close() })
	return a, r.c
}

// readAsync reads once from s in another goroutine.
func readAsync(s *sockIO) <-chan error {
	ch := make(chan error, 1)
	go func() {
		buf := make([]byte, 64)
		_, err := s.Read(buf)
		ch <- err
	}()
	return ch
}

// notYet checks that a read with nothing to read is still waiting a
// little later (a read that returns early fails the test).
func notYet(t *testing.T, ch <-chan error) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("read returned early: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
}

func within(t *testing.T, ch <-chan error, d time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		t.Fatalf("%s: no result within %v", what, d)
		return nil
	}
}

func TestPollerWakesReaders(t *testing.T) {
	s, b, _, _ := polledSock(t)
	if s.pw == nil {
		t.Fatal("socket not registered with the poller")
	}
	// Many short exchanges: no wake-up may be lost.
	buf := make([]byte, 16)
	for i := range 2000 {
		ch := readAsync(s)
		if _, err := b.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := within(t, ch, 5*time.Second, "read"); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
	}
	// The send-then-wait path of backend connections.
	go func() {
		in := make([]byte, 4)
		_, _ = io.ReadFull(b, in)
		_, _ = b.Write([]byte("pong"))
	}()
	s.setOut([]byte("ping"))
	n, err := s.Read(buf)
	if err != nil || string(buf[:n]) != "pong" {
		t.Fatalf("send-in-read: %q, %v", buf[:n], err)
	}
}

func TestPollerDeadlineAndClose(t *testing.T) {
	s, _, _, _ := polledSock(t)

	// A deadline ends the wait with a timeout.
	s.setDeadline(time.Now().Add(50 * time.Millisecond))
	err := within(t, readAsync(s), 5*time.Second, "deadline")
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("want a timeout, got %v", err)
	}

	// Another goroutine moving the deadline to the past wakes the reader
	// (how a held request stops its close watcher).
	s.setDeadline(time.Time{})
	ch := readAsync(s)
	notYet(t, ch)
	s.setDeadline(time.Unix(1, 0))
	if err := within(t, ch, 5*time.Second, "deadline moved"); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("want a timeout, got %v", err)
	}

	// Close from another goroutine wakes the reader with an error.
	s.setDeadline(time.Time{})
	ch = readAsync(s)
	notYet(t, ch)
	_ = s.close()
	if err := within(t, ch, 5*time.Second, "close"); err == nil {
		t.Fatal("read on a closed connection succeeded")
	}
}

// A reader waiting when the poller stops goes on waiting on Go's poller.
func TestPollerStopFallsBack(t *testing.T) {
	s, b, p, stop := polledSock(t)
	ch := readAsync(s)
	notYet(t, ch)
	stop()
	if _, err := b.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := within(t, ch, 5*time.Second, "read after stop"); err != nil {
		t.Fatal(err)
	}
	if s2 := newSockIO(b, p); s2.pw != nil {
		t.Fatal("a stopped poller registered a socket")
	}
}

// After a read that emptied the socket, the next read waits for the edge
// instead of trying (sockIO.drained); the peer's end is such an edge, and
// a read after the end sees it again instead of waiting for another.
func TestPollerDrainedSeesEnd(t *testing.T) {
	s, b, _, _ := polledSock(t)
	if _, err := b.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := within(t, readAsync(s), 5*time.Second, "read"); err != nil {
		t.Fatal(err)
	}
	if !s.drained {
		t.Fatal("a short read did not mark the socket drained")
	}
	_ = b.(*net.TCPConn).CloseWrite()
	for i := range 2 {
		if err := within(t, readAsync(s), 5*time.Second, "read at end"); err != io.EOF {
			t.Fatalf("read %d at end: want EOF, got %v", i, err)
		}
	}
}

// More sockets ready at once than one epoll_wait returns: every reader is
// woken (a full batch is followed by another poll, not a park). The
// sockets are readable before they join the set and the set before it runs.
func TestPollerFullBatch(t *testing.T) {
	p, err := newPoller()
	if err != nil {
		t.Fatal(err)
	}
	const n = 3*len(p.evs) + 5
	socks := make([]*sockIO, n)
	for i := range socks {
		a, b := tcpPair(t)
		if _, err := b.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		socks[i] = newSockIO(a, p)
		defer socks[i].release()
		socks[i].drained = true // as after an earlier read: wait for the edge
	}
	chs := make([]<-chan error, n)
	for i, s := range socks {
		chs[i] = readAsync(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	for i, ch := range chs {
		if err := within(t, ch, 10*time.Second, "read"); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
	}
}

// A set deals connections to its pollers in turn and runs them all.
func TestPollSetDeals(t *testing.T) {
	set, err := newPollSet(2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); set.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	seen := map[*poller]int{}
	for range 4 {
		a, b := tcpPair(t)
		s := newSockIO(a, set.pick())
		defer s.release()
		if s.pw == nil {
			t.Fatal("socket not registered")
		}
		seen[s.pw]++
		ch := readAsync(s)
		if _, err := b.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := within(t, ch, 5*time.Second, "read"); err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) != 2 || seen[set.ps[0]] != 2 {
		t.Fatalf("connections per poller: %v", seen)
	}
	if (*pollSet)(nil).pick() != nil {
		t.Fatal("a nil set picked a poller")
	}
}

// With one P the dispatcher's yield hands the P to the readers it woke:
// run the wake-up tests that way too (tests run with GOMAXPROCS = cores).
func TestPollerOneP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	t.Run("wakes", TestPollerWakesReaders)
	t.Run("drained", TestPollerDrainedSeesEnd)
	t.Run("full-batch", TestPollerFullBatch)
}
