package syncdir

import (
	"context"
	"errors"
	"hash/maphash"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// A large file is sent while its writer is still writing it, so the copy
// overlaps the write instead of following it. The receiver keeps the bytes
// in a temp file as always and installs them only if the sender proves, at
// the end, that they are the file's final content:
//
//   - every byte read before the writer was seen done (its close, or
//     holdOpen without growth) goes through a keyed hash as it is sent;
//   - once done, the file is stat'ed (s1), the rest is read up to s1's
//     size while the hashed part is read again and hashed (in the
//     background), and at the end the file is stat'ed again (s2);
//   - the commit trailer says "ok" only if both hashes agree, s2 has s1's
//     size and mtime, exactly s1's size was sent and the file still has a
//     name. Otherwise the receiver discards the copy (409 source-changed)
//     and the file is sent again once closed, never early again.
//
// A rewrite of already sent bytes shows in the hash, a truncation in the
// size, a write after s1 in s2's mtime or size. The epoch travels and is
// checked at the start as for any request; the body stops the moment the
// fence says this node may no longer push, and the receiver checks its
// fence and highest epoch again just before it installs the file.
//
// The same body carries every file of bulkMin bytes and up, a closed one
// with s1 taken at the open (nothing hashed): over HTTP/1.1 the size and
// commit can only follow the content as chunked-encoding trailers.

// earlyMin is the size from which a file still open for writing is streamed.
// Smaller files wait for their close: they are quick to send then.
const earlyMin = 8 << 20

// earlyLook paces the sender's look at the size of files being written.
// Writing earlyMin bytes takes a few milliseconds at the least.
const earlyLook = 5 * time.Millisecond

// bulkMin is the size from which a closed file goes over its own HTTP/1.1
// connection, streamed (see newBulkTransport); files streamed while
// written always do. Below it, the many big files of an initial sync share
// the HTTP/2 connection, whose flow control paces them (measured faster
// for 20 files of 16 MiB than a connection each).
const bulkMin = 64 << 20

// maxEarly bounds the files streamed while being written, so a few big
// writers do not tie up the sender's requests.
const maxEarly = 4

// maxGrow bounds how long a growing file is followed: a file appended to
// for ever (a log never closed) is then sent the ordinary way, once quiet.
const maxGrow = time.Minute

// hashSeed keys the hash of streamed files: a rewrite cannot be crafted to
// collide with what was sent.
var hashSeed = maphash.MakeSeed()

// growing is the link from the watcher to a file being streamed.
type growing struct {
	closed atomic.Bool // its writer closed it
	poke   chan struct{}
}

func newGrowing() *growing { return &growing{poke: make(chan struct{}, 1)} }

// signal tells the stream the file changed or was closed.
func (g *growing) signal(closed bool) {
	if closed {
		g.closed.Store(true)
	}
	select {
	case g.poke <- struct{}{}:
	default:
	}
}

// sendGrowing streams rel while it is written; see the top of this file.
// With g nil the file is taken as done: s1 is its state at the open, and
// the proof is the one of an ordinary put (s2 the same as s1).
func (s *Syncer) sendGrowing(ctx context.Context, rt *rootState, rel string, g *growing) (entry, error) {
	f, e, v, err := openForPut(rt, rel)
	if err != nil {
		return entry{}, err
	}
	defer f.Close()
	v.Set("stream", "1")
	tr := http.Header{hdrCommit: nil, hdrSize: nil, hdrMtime: nil}
	// The body may still be waiting for the writer when the peer answers
	// early (a refusal): ending bctx lets it go.
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b := &growBody{ctx: bctx, f: f, g: g, tr: tr, last: time.Now(), start: time.Now(), hashing: g != nil,
		active: func() bool { _, ok := s.fence.ActiveEpoch(); return ok }}
	if g == nil {
		b.final = e
	}
	err = s.call(ctx, rt, opPut, v, b, -1, tr)
	cancel()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.verdict == "" {
		return e, err // ended before the writer was done
	}
	return b.final, err
}

// growBody is the request body of a streamed file.
type growBody struct {
	ctx    context.Context
	f      *os.File
	g      *growing
	tr     http.Header
	active func() bool

	mu          sync.Mutex // the transport reads the body on its own goroutine
	off         int64      // bytes sent
	sum         sum        // of the bytes sent before the writer was done
	hashing     bool       // bytes still go into sum: the writer is not done
	check       chan bool  // the result of reading the hashed part again
	final       entry      // s1, once the writer is done
	start, last time.Time
	verdict     string
}

var errStreamAborted = errors.New("syncdir: stream stopped: no longer active")

func (b *growBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		if b.verdict != "" {
			return 0, io.EOF
		}
		if !b.active() {
			return 0, errStreamAborted // the receiver sees a cut body and discards it
		}
		if b.hashing && b.g.closed.Load() {
			// Done while we were behind: what is left needs no hash.
			if err := b.takeFinal(); err != nil {
				return 0, err
			}
		}
		if !b.hashing {
			return b.readRest(p)
		}
		n, err := b.f.ReadAt(p, b.off)
		if n > 0 {
			b.sum.add(p[:n])
			b.off += int64(n)
			b.last = time.Now()
			return n, nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		if err := b.waitMore(); err != nil {
			return 0, err
		}
	}
}

// WriteTo sends the file in big writes (the HTTP/1.1 transport copies a
// body through a 32 KiB buffer otherwise, which makes small TLS records),
// with the file read on one goroutine and the TLS writes on another.
func (b *growBody) WriteTo(w io.Writer) (int64, error) {
	return pipeCopy(w, onlyReader{b})
}

// onlyReader hides WriteTo from io.Copy.
type onlyReader struct{ io.Reader }

// waitMore waits at the end of the bytes written so far for more, or for
// the writer to be done; then it takes s1 and stops hashing.
func (b *growBody) waitMore() error {
	now := time.Now()
	quiet := b.last.Add(holdOpen)
	if !b.g.closed.Load() && now.Before(quiet) && now.Sub(b.start) < maxGrow {
		t := time.NewTimer(quiet.Sub(now))
		defer t.Stop()
		select {
		case <-b.ctx.Done():
			return b.ctx.Err()
		case <-b.g.poke:
			return nil
		case <-t.C:
			return nil
		}
	}
	return b.takeFinal()
}

// takeFinal takes s1: the writer is done, bytes read from now on are
// proven by the file staying as s1 says.
func (b *growBody) takeFinal() error {
	fi, err := b.f.Stat()
	if err != nil {
		return err
	}
	b.final, b.hashing = entryOf(fi), false
	if len(b.sum.lens) > 0 {
		// Read the hashed part again while the rest is sent: it only has
		// to happen after s1 and before s2.
		b.check = make(chan bool, 1)
		go func(s sum) { b.check <- s.matches(b.f) }(b.sum)
	}
	return nil
}

// readRest sends the bytes written before s1 that are not sent yet, then
// decides the verdict.
func (b *growBody) readRest(p []byte) (int, error) {
	if left := b.final.Size - b.off; left > 0 {
		n, err := b.f.ReadAt(p[:min(int64(len(p)), left)], b.off)
		b.off += int64(n)
		if n > 0 {
			return n, nil
		}
		if err == nil || errors.Is(err, io.EOF) {
			return b.end(commitChanged) // shrank under us
		}
		return 0, err
	}
	v := commitChanged
	if b.off == b.final.Size && b.proven() {
		v = commitOK
	}
	return b.end(v)
}

// proven re-reads the hashed part and checks nothing changed since s1.
func (b *growBody) proven() bool {
	if b.check != nil && !<-b.check {
		return false
	}
	fi, err := b.f.Stat()
	if err != nil || !entryOf(fi).sameContent(b.final) {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Nlink > 0
}

func (b *growBody) end(verdict string) (int, error) {
	b.verdict = verdict
	b.tr.Set(hdrCommit, verdict)
	b.tr.Set(hdrSize, strconv.FormatInt(b.off, 10))
	b.tr.Set(hdrMtime, strconv.FormatInt(b.final.Mtime, 10))
	return 0, io.EOF
}

// sum fingerprints the start of a file as it was read, piece by piece:
// one keyed hash per piece (maphash.Bytes is fast on big pieces, unlike
// Hash.Write, which goes 128 bytes at a time), and the lengths, so the
// same pieces can be read and hashed again.
type sum struct {
	lens []int
	sums []uint64
}

func (s *sum) add(p []byte) {
	s.lens = append(s.lens, len(p))
	s.sums = append(s.sums, maphash.Bytes(hashSeed, p))
}

// matches reads the same pieces of f again and compares their hashes.
func (s *sum) matches(f *os.File) bool {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	var off int64
	for i, n := range s.lens {
		buf := *bp
		if n > len(buf) {
			buf = make([]byte, n)
		}
		k, err := f.ReadAt(buf[:n], off)
		if k != n || (err != nil && !errors.Is(err, io.EOF)) || maphash.Bytes(hashSeed, buf[:n]) != s.sums[i] {
			return false
		}
		off += int64(n)
	}
	return true
}
