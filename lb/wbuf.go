package lb

import (
	"io"
	"strconv"
)

// wbuf is a write buffer like bufio.Writer, with one addition: pend leaves
// its contents to be sent at the start of the connection's next read
// (sockIO.Read). A proxy always reads right after it sends a request or a
// response; sending from inside that read lets it park for the answer
// without first trying a read that could only find the socket empty.
type wbuf struct {
	buf []byte // len = bytes buffered
	w   io.Writer
	s   *sockIO // raw I/O under w, or nil
	err error
}

func newWbuf(w io.Writer, size int) *wbuf {
	b := &wbuf{buf: make([]byte, 0, size)}
	b.Reset(w)
	return b
}

// Reset discards buffered data and writes to w from now on.
func (b *wbuf) Reset(w io.Writer) {
	b.buf, b.w, b.err = b.buf[:0], w, nil
	b.s, _ = w.(*sockIO)
}

// Buffered is the number of bytes not yet handed to the writer.
func (b *wbuf) Buffered() int { return len(b.buf) }

func (b *wbuf) Flush() error {
	if b.err != nil {
		return b.err
	}
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.w.Write(b.buf)
	b.buf = b.buf[:0]
	b.err = err
	return err
}

// pend hands the buffered bytes to the next read of the connection, which
// sends them before it waits (see sockIO). Without raw I/O it flushes.
func (b *wbuf) pend() error {
	if b.s == nil || b.s.rc == nil || b.err != nil || len(b.buf) == 0 {
		return b.Flush()
	}
	b.s.setOut(b.buf)
	b.buf = b.buf[:0] // the bytes stay valid: nothing writes here before that read
	return nil
}

func (b *wbuf) Write(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if len(p) > cap(b.buf)-len(b.buf) {
		if err := b.Flush(); err != nil {
			return 0, err
		}
		if len(p) >= cap(b.buf) { // too big to buffer: write it through
			n, err := b.w.Write(p)
			b.err = err
			return n, err
		}
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *wbuf) WriteString(s string) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if len(s) > cap(b.buf)-len(b.buf) {
		if err := b.Flush(); err != nil {
			return 0, err
		}
		if len(s) >= cap(b.buf) {
			n, err := io.WriteString(b.w, s)
			b.err = err
			return n, err
		}
	}
	b.buf = append(b.buf, s...)
	return len(s), nil
}

func (b *wbuf) WriteByte(c byte) error {
	if b.err != nil {
		return b.err
	}
	if len(b.buf) == cap(b.buf) {
		if err := b.Flush(); err != nil {
			return err
		}
	}
	b.buf = append(b.buf, c)
	return nil
}

// writeInt writes n in decimal without the allocation of strconv.Itoa
// (which only caches numbers below 100: status codes and lengths are not).
func (b *wbuf) writeInt(n int64) {
	if b.err != nil {
		return
	}
	if cap(b.buf)-len(b.buf) < 20 {
		if b.Flush() != nil {
			return
		}
	}
	b.buf = strconv.AppendInt(b.buf, n, 10)
}
