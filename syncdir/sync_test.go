package syncdir

import (
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// excludedForTest matches what the default excludes leave out of the test trees.
func excludedForTest(rel string) bool {
	for _, part := range strings.Split(rel, "/") {
		if part == "cache" || part == "tmp" || part == "logs" {
			return true
		}
	}
	return strings.HasSuffix(rel, ".tmp") || strings.HasSuffix(rel, ".swp")
}

// Must show 1: creates, modifies, deletes, renames, nested and empty dirs,
// empty files, modes, mtimes, symlinks; excluded paths stay behind.
func TestRoundTrip(t *testing.T) {
	a, b, _ := pair(t, withOwners)
	ra := a.root
	writeFile(t, filepath.Join(ra, "pre-existing.txt"), "was here before the sender started", 0o644)
	a.activate(5)

	writeFile(t, filepath.Join(ra, "top.txt"), "hello", 0o644)
	writeFile(t, filepath.Join(ra, "d1/d2/d3/deep.txt"), "deep", 0o600)
	writeFile(t, filepath.Join(ra, "empty"), "", 0o644)
	writeFile(t, filepath.Join(ra, "exec.sh"), "#!/bin/sh\n", 0o755)
	os.MkdirAll(filepath.Join(ra, "emptydir/inner"), 0o750)
	os.Chmod(filepath.Join(ra, "emptydir"), 0o711)
	old := time.Date(2001, 2, 3, 4, 5, 6, 789, time.UTC)
	writeFile(t, filepath.Join(ra, "old.txt"), "old mtime", 0o640)
	os.Chtimes(filepath.Join(ra, "old.txt"), old, old)
	if canChown { // owners travel when the receiver runs as root
		writeFile(t, filepath.Join(ra, "owned/by-app.txt"), "www-data's", 0o640)
		os.Chown(filepath.Join(ra, "owned/by-app.txt"), 33, 33)
		os.Chown(filepath.Join(ra, "owned"), 33, 4321)
		os.Symlink("by-app.txt", filepath.Join(ra, "owned/link"))
		os.Lchown(filepath.Join(ra, "owned/link"), 1234, 1234)
	}
	os.Symlink("top.txt", filepath.Join(ra, "link-rel"))
	os.Symlink("/etc/passwd", filepath.Join(ra, "link-abs"))
	os.Symlink("d1/d2", filepath.Join(ra, "link-dir"))
	for _, ex := range []string{"x.tmp", "d1/y.swp", "cache/c.txt", "d1/tmp/t.txt", "logs/app.log"} {
		writeFile(t, filepath.Join(ra, ex), "excluded", 0o644)
	}
	waitSame(t, a, b, 20*time.Second, excludedForTest)
	if fi, err := os.Stat(filepath.Join(b.root, "old.txt")); err != nil || !fi.ModTime().Equal(old) {
		t.Fatalf("mtime not kept: %v %v", fi.ModTime(), err)
	}

	// Modify, delete, rename a file and a directory.
	writeFile(t, filepath.Join(ra, "top.txt"), "hello again, longer", 0o644)
	os.Remove(filepath.Join(ra, "exec.sh"))
	os.Rename(filepath.Join(ra, "old.txt"), filepath.Join(ra, "d1/renamed.txt"))
	os.Rename(filepath.Join(ra, "d1/d2"), filepath.Join(ra, "moved-d2"))
	os.RemoveAll(filepath.Join(ra, "emptydir/inner"))
	os.Chmod(filepath.Join(ra, "top.txt"), 0o600)
	os.Remove(filepath.Join(ra, "link-rel"))
	os.Symlink("d1/renamed.txt", filepath.Join(ra, "link-rel"))
	if canChown { // a chown alone travels too
		os.Lchown(filepath.Join(ra, "owned/link"), 4321, 4321)
		os.Chown(filepath.Join(ra, "owned/by-app.txt"), 33, 1234)
	}
	waitSame(t, a, b, 20*time.Second, excludedForTest)
	if _, err := os.Lstat(filepath.Join(b.root, "cache")); err == nil {
		t.Fatal("excluded directory copied")
	}
	waitConfirmed(t, a)
	st := a.s.Status()
	if st.FilesSent == 0 || !st.Sending || st.LagSeconds != 0 {
		t.Fatalf("status after quiescence: %+v", st)
	}
	if bs := b.s.Status(); bs.FilesReceived == 0 || bs.HighestEpoch != 5 || bs.QuarantinedTotal != 0 {
		t.Fatalf("receiver status: %+v", bs)
	}
}

// Must show 1, the big file: 256 MiB streamed, never visible half-written.
func TestBigFile(t *testing.T) {
	if testing.Short() {
		t.Skip("256 MiB round trip skipped in -short")
	}
	a, b, _ := pair(t)
	a.activate(3)
	const size = 256 << 20
	p := filepath.Join(a.root, "big.bin")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	buf := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{1}).Read(buf)
	for i := 0; i < size/len(buf); i++ {
		buf[0], buf[1] = byte(i), byte(i>>8) // every MiB differs
		f.Write(buf)
		h.Write(buf)
	}
	f.Close()
	want := h.Sum(nil)
	target := filepath.Join(b.root, "big.bin")
	partial := false
	eventually(t, 2*time.Minute, "big file complete", func() bool {
		fi, err := os.Stat(target)
		if err != nil {
			return false
		}
		if fi.Size() != size {
			t.Logf("partial: %d", fi.Size())
			partial = true
			return false
		}
		return true
	})
	if partial {
		t.Fatal("a partial file was visible under the final name")
	}
	g, _ := os.Open(target)
	defer g.Close()
	h2 := sha256.New()
	io.Copy(h2, g)
	if string(h2.Sum(nil)) != string(want) {
		t.Fatal("content differs")
	}
}

// A file written elsewhere and renamed into the root (temp file + rename, the
// usual atomic write) is sent at once: no close event follows a rename, and
// waiting for one would hold it back for holdOpen, long enough to be caught
// by a switchover.
func TestRenamedInFileIsNotHeld(t *testing.T) {
	a, b, _ := pair(t)
	a.activate(10)
	// Wait until the sender watches w/ (a file found by a scan, the start-up
	// reconcile's or a new directory's, with no close seen, is held back
	// where no read lease can tell whether it is still open).
	writeFile(t, filepath.Join(a.root, "w", "first.txt"), "x", 0o644)
	eventually(t, 10*time.Second, "first file on b", func() bool {
		return readFile(filepath.Join(b.root, "w", "first.txt")) == "x"
	})
	// Twenty uploads, as an application writes them: temp file, rename.
	notHeld(t, b, 20, "renamed-in", func(n int) (string, time.Time) {
		name := fmt.Sprintf("w/%d.txt", n)
		tmp := filepath.Join(a.root, "w", fmt.Sprintf(".%d.tmp", n)) // excluded by default
		writeFile(t, tmp, name, 0o644)
		start := time.Now()
		if err := os.Rename(tmp, filepath.Join(a.root, name)); err != nil {
			t.Fatal(err)
		}
		return name, start
	})
}

// notHeld makes n files with put (each holding its own name; put returns
// the name and when the clock starts) and fails if any took holdOpen or
// more to show on b.
func notHeld(t *testing.T, b *node, n int, what string, put func(n int) (string, time.Time)) {
	t.Helper()
	var worst time.Duration
	for i := 0; i < n; i++ {
		name, start := put(i)
		eventually(t, 10*time.Second, name+" on b", func() bool {
			return readFile(filepath.Join(b.root, name)) == name
		})
		worst = max(worst, time.Since(start))
	}
	t.Logf("worst %s file to visible: %v", what, worst)
	if worst >= holdOpen {
		t.Fatalf("a %s file took %v, at least holdOpen (%v)", what, worst, holdOpen)
	}
}

// The first files of a new directory are made before the sender watches it,
// so no close event is seen for them: they go at once when no writer has
// them open (a read lease says so), and a file still open is held back.
func TestNewDirectoryFilesNotHeld(t *testing.T) {
	a, b, _ := pair(t)
	a.activate(10)
	writeFile(t, filepath.Join(a.root, "first.txt"), "x", 0o644)
	eventually(t, 10*time.Second, "first file on b", func() bool {
		return readFile(filepath.Join(b.root, "first.txt")) == "x"
	})
	notHeld(t, b, 10, "new directory's", func(n int) (string, time.Time) {
		name := fmt.Sprintf("d%d/sub/f.txt", n)
		start := time.Now()
		writeFile(t, filepath.Join(a.root, name), name, 0o644) // makes the directories
		return name, start
	})

	// Still open for writing: not sent while open, whole once closed.
	if err := os.MkdirAll(filepath.Join(a.root, "open"), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(a.root, "open", "held.txt"))
	if err != nil {
		t.Fatal(err)
	}
	wrote := time.Now() // before the write: its mtime is not earlier
	f.WriteString("part")
	writeFile(t, filepath.Join(a.root, "open", "after.txt"), "after", 0o644)
	eventually(t, 10*time.Second, "open/after.txt on b", func() bool {
		return readFile(filepath.Join(b.root, "open", "after.txt")) == "after"
	})
	// After holdOpen without writes an open file is sent anyway (logs); a
	// machine slow enough to get here that late proves nothing either way.
	if _, err := os.Lstat(filepath.Join(b.root, "open", "held.txt")); err == nil && time.Since(wrote) < holdOpen {
		t.Fatal("a file still open for writing was sent")
	}
	f.WriteString(" and the rest")
	f.Close()
	eventually(t, 10*time.Second, "open/held.txt on b", func() bool {
		return readFile(filepath.Join(b.root, "open", "held.txt")) == "part and the rest"
	})
}

func TestNoWriter(t *testing.T) {
	dir := t.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	f, err := os.Create(filepath.Join(dir, "w.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if noWriter(root, "w.txt") {
		t.Fatal("noWriter: true while the file is open for writing")
	}
	f.Close()
	if !noWriter(root, "w.txt") {
		t.Fatal("noWriter: false once the writer closed it")
	}
	if noWriter(root, "missing.txt") {
		t.Fatal("noWriter: true for a missing file")
	}
}
