package lb

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// smallBuffers makes the kernel buffers of a TCP connection small, so a
// peer that does not read fills them with a few KiB.
func smallBuffers(t *testing.T, c net.Conn) {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4096)
		if serr == nil {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
}

// TestTLSSockLoopWrites: in the event loop (non-blocking socket) a TLS
// write never waits and never fails for a full socket: what the socket did
// not take is kept, and the next write outside the loop sends it first, so
// the client reads every byte in order.
func TestTLSSockLoopWrites(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	smallBuffers(t, sc)
	smallBuffers(t, cc)
	cert, key := selfSigned(t)
	kp, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	tcp := newSockIO(sc, nil)
	ts := &tlsSock{s: tcp}
	server := tls.Server(ts, &tls.Config{Certificates: []tls.Certificate{kp}})
	client := tls.Client(cc, &tls.Config{InsecureSkipVerify: true})
	_ = client.SetDeadline(time.Now().Add(20 * time.Second))
	hs := make(chan error, 1)
	go func() { hs <- server.Handshake() }()
	if err := client.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-hs; err != nil {
		t.Fatal(err)
	}

	data := bytes.Repeat([]byte("0123456789abcdef"), 4<<10) // 64 KiB: far beyond the buffers
	tcp.nb = true                                           // as in the event loop
	if n, err := server.Write(data); err != nil || n != len(data) {
		t.Fatalf("loop write: %d, %v; want %d, nil", n, err, len(data))
	}
	if !ts.pending() {
		t.Fatal("64 KiB to a client that does not read: nothing kept for later")
	}
	tcp.nb = false // handed to a goroutine
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(client, int64(len(data)+4)))
		got <- b
	}()
	if _, err := server.Write([]byte("tail")); err != nil {
		t.Fatal(err)
	}
	if ts.pending() {
		t.Fatal("kept bytes not flushed by the next write")
	}
	if b := <-got; !bytes.Equal(b, append(data, "tail"...)) {
		t.Fatalf("client read %d bytes, not the %d written in order", len(b), len(data)+4)
	}
}

// TestEventLoopTLSBackPressure: a TLS response the loop relays to a client
// whose socket is full is finished by a goroutine (the loop never waits),
// whole; the connection then comes back to the loop.
func TestEventLoopTLSBackPressure(t *testing.T) {
	addr, _ := loopBackend(t, 0)
	cfg := loopConfig(addr)
	cfg.Listeners[0].IdleTimeout = time.Minute
	v := variant{engine: "fast", tls: true}
	v.set(t, &cfg)
	l := startLB(t, cfg, nil)
	// The client's receive buffer is small from the start, so the window
	// it advertises is too.
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		if err == nil {
			err = serr
		}
		return err
	}}
	raw, err := d.Dial("tcp", l.ListenerAddr("web").String())
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(raw, v.clientTLS())
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	getSmall(t, c, br, "first")
	h1 := l.listeners["web"].h1
	h1.mu.Lock()
	for hc := range h1.conns {
		smallBuffers(t, hc.tcp.c) // the balancer's side of the one connection
	}
	h1.mu.Unlock()
	mid := strings.Repeat("m", 24000)
	for i := range 3 {
		served, handed := l.poll.loopCounts()
		if _, err := io.WriteString(c, "GET /mid HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		// Not reading: the loop's write fills both buffers and the rest
		// goes to a goroutine.
		waitHanded(t, l, handed, "the relay")
		if resp, body := readResp(t, br); resp.StatusCode != 200 || body != mid {
			t.Fatalf("mid %d: %d, %d bytes", i, resp.StatusCode, len(body))
		}
		if s, _ := l.poll.loopCounts(); s != served {
			t.Fatalf("mid %d: counted as served by the loop", i)
		}
		getSmall(t, c, br, "after the hand-over")
		waitFor(t, 10*time.Second, "the connection back in the loop", func() bool {
			s, _ := l.poll.loopCounts()
			getSmall(t, c, br, "in the loop")
			s2, _ := l.poll.loopCounts()
			return s2 > s
		})
	}
}
