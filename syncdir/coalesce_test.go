package syncdir

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"
)

// tcpPair is a real loopback connection: the writer side coalesces, the
// reader side reads through readBufConn, as sender and receiver do.
func tcpPair(t *testing.T) (*coalesceConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := readBufListener{ln}.Accept()
		if err != nil {
			c = nil
		}
		accepted <- c
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srv := <-accepted
	if srv == nil {
		t.Fatal("accept failed")
	}
	w := newCoalesceConn(raw)
	t.Cleanup(func() { w.Close(); srv.Close() })
	return w, srv
}

// readN reads exactly n bytes or fails after a bounded wait.
func readN(t *testing.T, c net.Conn, n int, within time.Duration) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(within))
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	return b
}

// A short write goes out at once; a lone full-size record is sent by the
// timer; nothing is lost, reordered or held back for good.
func TestCoalesceConn(t *testing.T) {
	w, r := tcpPair(t)
	if _, err := w.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if got := readN(t, r, 5, 5*time.Second); string(got) != "hello" {
		t.Fatalf("got %q", got)
	}
	full := bytes.Repeat([]byte("F"), coalesceFull)
	if _, err := w.Write(full); err != nil {
		t.Fatal(err)
	}
	if got := readN(t, r, len(full), 5*time.Second); !bytes.Equal(got, full) {
		t.Fatal("full record garbled")
	}
	// Mixed sizes, as TLS records of HTTP/2 frames come: the stream read on
	// the other side is exactly the stream written.
	rng := rand.New(rand.NewPCG(1, 2))
	var sent bytes.Buffer
	for range 300 {
		n := coalesceFull + 30
		if rng.IntN(4) == 0 {
			n = 1 + rng.IntN(2000)
		}
		for range n {
			sent.WriteByte(byte(rng.Uint32()))
		}
	}
	done := make(chan []byte, 1)
	go func() { // reads while the writes go on: socket buffers are finite
		r.SetReadDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, sent.Len())
		io.ReadFull(r, b)
		done <- b
	}()
	rng = rand.New(rand.NewPCG(1, 2))
	for rest := sent.Bytes(); len(rest) > 0; {
		n := coalesceFull + 30
		if rng.IntN(4) == 0 {
			n = 1 + rng.IntN(2000)
		}
		for range n {
			rng.Uint32()
		}
		if _, err := w.Write(rest[:n]); err != nil {
			t.Fatal(err)
		}
		rest = rest[n:]
	}
	if got := <-done; !bytes.Equal(got, sent.Bytes()) {
		t.Fatal("the stream read differs from the stream written")
	}
	if rb := r.(*readBufConn); rb.r == nil {
		t.Error("a long stream was read without the buffer")
	}
}

// A write to a connection whose peer is gone fails, also when the failure
// happened in a timer's flush.
func TestCoalesceConnError(t *testing.T) {
	w, r := tcpPair(t)
	r.Close()
	full := bytes.Repeat([]byte("F"), coalesceFull)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := w.Write(full)
		if err != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("writes to a closed peer never failed")
		}
	}
}
