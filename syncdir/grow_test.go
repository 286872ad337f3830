package syncdir

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// growWriter writes a file the way an application does, and keeps the
// file growing (1 MiB every 50 ms) while the test waits, so the sender's
// stream stays open until the test closes the file.
type growWriter struct {
	t    *testing.T
	f    *os.File
	rnd  *rand.ChaCha8
	buf  []byte
	size int64
}

func newGrowWriter(t *testing.T, p string) *growWriter {
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &growWriter{t: t, f: f, rnd: rand.NewChaCha8([32]byte{9}), buf: make([]byte, 1<<20)}
}

func (w *growWriter) write(mib int) {
	for range mib {
		w.rnd.Read(w.buf)
		if _, err := w.f.WriteAt(w.buf, w.size); err != nil {
			w.t.Fatal(err)
		}
		w.size += int64(len(w.buf))
	}
}

// waitStreaming appends until the receiver holds a temp file of at least
// min bytes in dir: the file is being streamed before its writer is done.
func (w *growWriter) waitStreaming(dir string, min int64) {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if tempBytes(dir) >= min {
			return
		}
		w.write(1)
		time.Sleep(50 * time.Millisecond) // the pace of the writer, not a sync point
	}
	w.t.Fatalf("no stream of %d bytes started in %s while the file was written", min, dir)
}

func tempBytes(dir string) int64 {
	ents, _ := os.ReadDir(dir)
	var most int64
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			if fi, err := e.Info(); err == nil {
				most = max(most, fi.Size())
			}
		}
	}
	return most
}

// watchFinal polls the target's final name for the whole test: it must
// only ever show the complete file, never a part or an older content.
func watchFinal(t *testing.T, target, src string) (done func()) {
	stop := make(chan struct{})
	var bad atomic.Value
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if fi, err := os.Stat(target); err == nil {
				sfi, serr := os.Stat(src)
				if serr == nil && fi.Size() != sfi.Size() {
					bad.Store("size " + strconv.FormatInt(fi.Size(), 10) + " under the final name, source has " + strconv.FormatInt(sfi.Size(), 10))
				}
			}
			time.Sleep(500 * time.Microsecond)
		}
	}()
	return func() {
		close(stop)
		<-finished
		if v := bad.Load(); v != nil {
			t.Fatalf("partial file visible: %s", v)
		}
	}
}

func sum256(t *testing.T, p string) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}

// waitEqual waits until the target has the source's content, then checks
// it stays so (no late install of an older copy).
func waitEqual(t *testing.T, src, target string) {
	t.Helper()
	want := sum256(t, src)
	eventually(t, time.Minute, "target equal to source", func() bool { return sum256(t, target) == want })
}

// startStreaming starts an active pair and a file of mib MiB on its ACTIVE
// node, growing until the PASSIVE one holds a temp file of at least min
// bytes; done ends the watch of the final name (see watchFinal).
func startStreaming(t *testing.T, mib int, min int64) (a, b *node, src, target string, w *growWriter, done func()) {
	a, b, _ = pair(t)
	a.activate(3)
	src, target = filepath.Join(a.root, "grow.bin"), filepath.Join(b.root, "grow.bin")
	done = watchFinal(t, target, src)
	w = newGrowWriter(t, src)
	w.write(mib)
	w.waitStreaming(b.root, min)
	return a, b, src, target, w, done
}

func rejected(s *Syncer, reason string) uint64 {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	return s.st.rejected[reason]
}

// A file streamed while written and then closed is installed from the
// stream: the proof at the end holds, nothing is sent twice.
func TestGrowingFileStreamedBeforeClose(t *testing.T) {
	_, b, src, target, w, done := startStreaming(t, 9, 1<<20)
	if _, err := os.Stat(target); err == nil {
		t.Fatal("installed before the writer closed it")
	}
	w.write(20) // grows after the stream started
	if err := w.f.Close(); err != nil {
		t.Fatal(err)
	}
	waitEqual(t, src, target)
	done()
	if n := rejected(b.s, "source-changed"); n != 0 {
		t.Fatalf("an honest stream was refused %d times", n)
	}
	// Counted once durable, a moment after the name shows.
	eventually(t, 10*time.Second, "the stream to be counted", func() bool { return b.s.st.filesReceived.Load() > 0 })
	if n := b.s.st.filesReceived.Load(); n != 1 {
		t.Fatalf("received %d files, want the one stream", n)
	}
}

// Bytes already sent and then rewritten: the hash of what was sent does
// not match the file at the end, the copy is discarded, the file sent again.
func TestGrowingFileRewrittenInTheMiddle(t *testing.T) {
	_, b, src, target, w, done := startStreaming(t, 9, 2<<20)
	// Same size, same call pattern: only the content of sent bytes changes.
	patch := []byte(strings.Repeat("rewritten", 1000))
	if _, err := w.f.WriteAt(patch, 1<<20); err != nil {
		t.Fatal(err)
	}
	w.write(2)
	if err := w.f.Close(); err != nil {
		t.Fatal(err)
	}
	waitEqual(t, src, target)
	done()
	if n := rejected(b.s, "source-changed"); n == 0 {
		t.Fatal("the stale stream was not refused")
	}
}

// A file truncated while streamed, then written on: the stream is longer
// than the file and must not be installed.
func TestGrowingFileTruncated(t *testing.T) {
	_, _, src, target, w, done := startStreaming(t, 12, 10<<20)
	if err := w.f.Truncate(3 << 20); err != nil {
		t.Fatal(err)
	}
	w.size = 3 << 20
	w.write(1)
	if err := w.f.Close(); err != nil {
		t.Fatal(err)
	}
	waitEqual(t, src, target)
	done()
	if fi, err := os.Stat(target); err != nil || fi.Size() != 4<<20 {
		t.Fatalf("target: %v %v", fi, err)
	}
}

// A file renamed away while streamed ends under its new name only; one
// deleted while streamed ends nowhere.
func TestGrowingFileRenamedAndDeleted(t *testing.T) {
	a, b, _ := pair(t)
	a.activate(3)
	src := filepath.Join(a.root, "grow.bin")
	w := newGrowWriter(t, src)
	w.write(9)
	w.waitStreaming(b.root, 1<<20)
	moved := filepath.Join(a.root, "moved.bin")
	if err := os.Rename(src, moved); err != nil {
		t.Fatal(err)
	}
	w.write(1)
	w.f.Close()
	waitEqual(t, moved, filepath.Join(b.root, "moved.bin"))
	eventually(t, time.Minute, "old name gone on b", func() bool {
		_, err := os.Lstat(filepath.Join(b.root, "grow.bin"))
		return os.IsNotExist(err)
	})

	gone := filepath.Join(a.root, "gone.bin")
	w = newGrowWriter(t, gone)
	w.write(9)
	w.waitStreaming(b.root, 1<<20)
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	w.write(1)
	w.f.Close()
	eventually(t, time.Minute, "no temp files left on b", func() bool { return tempBytes(b.root) == 0 && !hasTemp(b.root) })
	if _, err := os.Lstat(filepath.Join(b.root, "gone.bin")); !os.IsNotExist(err) {
		// It may have been installed from a quiet stream and deleted after:
		// then it must go.
		eventually(t, time.Minute, "deleted file gone on b", func() bool {
			_, err := os.Lstat(filepath.Join(b.root, "gone.bin"))
			return os.IsNotExist(err)
		})
	}
}

func hasTemp(dir string) bool {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			return true
		}
	}
	return false
}

// A streamed put is installed only with a commit "ok" and a size trailer
// matching the bytes received.
func TestStreamedPutChecks(t *testing.T) {
	_, b, p := pair(t)
	h := newHostileClient(t, p, b.ln.Addr().String())
	send := func(name, query, trailers string) string {
		return h.raw([]byte("PUT /v1/put/data?path="+name+"&mode=644&mtime=0"+query+" HTTP/1.1\r\nHost: x\r\n"+
			"X-Hapair-Epoch: 10\r\nX-Hapair-Node: a\r\nTransfer-Encoding: chunked\r\n"+
			"Trailer: X-Hapair-Commit, X-Hapair-Size, X-Hapair-Mtime\r\n\r\n"+
			"5\r\nhello\r\n0\r\n"+trailers+"\r\n"), false)
	}
	cases := []struct {
		name, query, trailers, status string
	}{
		{"good", "&stream=1", "X-Hapair-Commit: ok\r\nX-Hapair-Size: 5\r\nX-Hapair-Mtime: 7\r\n", "200"},
		{"short", "&stream=1", "X-Hapair-Commit: ok\r\nX-Hapair-Size: 4\r\nX-Hapair-Mtime: 7\r\n", "400"},
		{"long", "&stream=1", "X-Hapair-Commit: ok\r\nX-Hapair-Size: 6\r\nX-Hapair-Mtime: 7\r\n", "400"},
		{"no-commit", "&stream=1", "X-Hapair-Size: 5\r\nX-Hapair-Mtime: 7\r\n", "409"},
		{"changed", "&stream=1", "X-Hapair-Commit: changed\r\nX-Hapair-Size: 5\r\nX-Hapair-Mtime: 7\r\n", "409"},
		{"no-mtime", "&stream=1", "X-Hapair-Commit: ok\r\nX-Hapair-Size: 5\r\n", "400"},
		{"bad-stream", "&stream=2", "X-Hapair-Commit: ok\r\nX-Hapair-Size: 5\r\nX-Hapair-Mtime: 7\r\n", "400"},
		{"no-length", "", "X-Hapair-Commit: ok\r\n", "411"},
	}
	for _, c := range cases {
		line := send(c.name, c.query, c.trailers)
		if !strings.Contains(line, " "+c.status+" ") {
			t.Errorf("%s: got %q, want %s", c.name, line, c.status)
		}
		fi, err := os.Stat(filepath.Join(b.root, c.name))
		if installed := err == nil; installed != (c.status == "200") {
			t.Errorf("%s: installed %v", c.name, installed)
		} else if installed && (fi.Size() != 5 || fi.ModTime().UnixNano() != 7) {
			t.Errorf("%s: installed as %d bytes, mtime %d", c.name, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	if hasTemp(b.root) {
		t.Error("temp files left behind")
	}
}
