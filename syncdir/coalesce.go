package syncdir

import (
	"bufio"
	"context"
	"crypto/tls"
	"net"
	"sync"
	"time"
)

// crypto/tls writes each record (at most 16 KiB of data) with its own
// write(2). A 256 MiB file is then 16,384 system calls on the sender, and
// on loopback or a fast LAN those calls, not AES-GCM, are the larger part
// of the sender's CPU. coalesceConn sits under the TLS layer and gathers
// full-size records into one write of up to coalesceMax bytes. Anything
// shorter than a full record (the end of a TLS write, a small frame, the
// handshake) goes out at once together with what is gathered, so small
// requests pay no added latency; a TLS write that happens to end on a
// full record is sent by a timer coalesceDelay later at most.
type coalesceConn struct {
	net.Conn
	mu    sync.Mutex
	buf   []byte
	timer *time.Timer
	err   error // of a timer's flush, returned by the next write
}

const (
	coalesceFull  = 16 << 10  // a write this long is a full record: gather it
	coalesceMax   = 256 << 10 // gathered bytes that go out without waiting
	coalesceDelay = 200 * time.Microsecond

	handshakeTimeout = 10 * time.Second
)

func newCoalesceConn(c net.Conn) *coalesceConn {
	cc := &coalesceConn{Conn: c, buf: make([]byte, 0, coalesceMax+coalesceFull+64)}
	cc.timer = time.AfterFunc(time.Hour, cc.timedFlush)
	cc.timer.Stop()
	return cc
}

func (c *coalesceConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if len(p) >= coalesceFull && len(c.buf)+len(p) <= cap(c.buf) {
		c.buf = append(c.buf, p...)
		if len(c.buf) < coalesceMax {
			c.timer.Reset(coalesceDelay)
			return len(p), nil
		}
		return len(p), c.flushLocked()
	}
	if held := len(c.buf); held > 0 {
		c.timer.Stop()
		bufs := net.Buffers{c.buf, p} // one writev
		n, err := bufs.WriteTo(c.Conn)
		c.buf = c.buf[:0]
		if err != nil {
			c.err = err
			return max(0, int(n)-held), err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *coalesceConn) flushLocked() error {
	c.timer.Stop()
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.buf)
	c.buf = c.buf[:0]
	if err != nil {
		c.err = err
	}
	return err
}

func (c *coalesceConn) timedFlush() {
	c.mu.Lock()
	c.flushLocked()
	c.mu.Unlock()
}

func (c *coalesceConn) Close() error {
	c.mu.Lock()
	c.timer.Stop()
	c.buf = c.buf[:0]
	c.mu.Unlock()
	return c.Conn.Close()
}

// dialTLS dials addr and runs the TLS handshake over a coalesceConn, for
// http.Transport.DialTLSContext; proto is the one protocol offered by ALPN.
func dialTLS(d *net.Dialer, cfg *tls.Config, proto string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c := cfg.Clone()
		if c.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				raw.Close()
				return nil, err
			}
			c.ServerName = host
		}
		c.NextProtos = []string{proto}
		tc := tls.Client(newCoalesceConn(raw), c)
		hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
		defer cancel()
		if err := tc.HandshakeContext(hctx); err != nil {
			raw.Close()
			return nil, err
		}
		return tc, nil
	}
}

// readBufConn reads the connection through a large buffer: crypto/tls asks
// for about one record at a time, so a big upload is otherwise one read(2)
// per 16 KiB on the receiver's frame-reading goroutine, its busiest. The
// buffer comes only after readBufAfter bytes, so the handshake and idle or
// refused connections never hold one.
type readBufConn struct {
	net.Conn
	n int64 // read so far without the buffer
	r *bufio.Reader
}

func (c *readBufConn) Read(p []byte) (int, error) {
	if c.r != nil {
		return c.r.Read(p)
	}
	if c.n >= readBufAfter {
		c.r = bufio.NewReaderSize(c.Conn, readBufSize)
		return c.r.Read(p)
	}
	n, err := c.Conn.Read(p)
	c.n += int64(n)
	return n, err
}

const (
	readBufSize  = 128 << 10
	readBufAfter = 64 << 10
)

type readBufListener struct{ net.Listener }

func (l readBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &readBufConn{Conn: c}, nil
}
