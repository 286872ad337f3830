package syncdir

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// neverPartial is a poll condition: true once p exists, and a test failure
// if p ever shows up under its final name with the wrong size.
func neverPartial(t *testing.T, p string, want int64) func() bool {
	return func() bool {
		fi, err := os.Stat(p)
		if err != nil {
			return false
		}
		if fi.Size() != want {
			t.Fatalf("%s visible with %d of %d bytes", p, fi.Size(), want)
		}
		return true
	}
}

func noTempFiles(t *testing.T, root string) {
	t.Helper()
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), tempPrefix) {
			t.Errorf("temp file left behind: %s", p)
		}
		return nil
	})
}

// Must show 5, permission denied: the sender retries, nothing partial shows.
func TestPermissionDenied(t *testing.T) {
	a, b, _ := pair(t)
	os.MkdirAll(filepath.Join(a.root, "locked"), 0o755)
	locked := filepath.Join(b.root, "locked")
	os.MkdirAll(locked, 0o755)
	unlock := lockDir(t, locked)

	a.activate(7)
	const size = 64 << 10
	writeFile(t, filepath.Join(a.root, "locked/file.bin"), strings.Repeat("x", size), 0o644)
	target := filepath.Join(locked, "file.bin")
	eventually(t, 10*time.Second, "the sender to see errors", func() bool {
		return a.s.Status().Errors["peer-error"] >= 2 // failed, retried, failed again
	})
	if fileExists(target) {
		t.Fatal("file visible in a locked directory")
	}
	// The status view is published periodically: wait for it rather than
	// read it once.
	eventually(t, 5*time.Second, "the failed change queued with a lag", func() bool {
		st := a.s.Status()
		return st.QueueDepth > 0 && st.LagSeconds > 0
	})
	unlock()
	eventually(t, 10*time.Second, "the file after the unlock", neverPartial(t, target, size))
	noTempFiles(t, b.root)
	waitSame(t, a, b, 10*time.Second, nil)
}

// lockDir makes dir unwritable: a read-only bind mount as root (root ignores
// modes), chmod otherwise. It returns the undo, also run at cleanup.
func lockDir(t *testing.T, dir string) func() {
	var undo func()
	if os.Geteuid() == 0 {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			t.Skipf("bind mount not permitted here: %v", err)
		}
		if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			unix.Unmount(dir, unix.MNT_DETACH)
			t.Skipf("read-only remount not permitted: %v", err)
		}
		undo = func() { unix.Unmount(dir, unix.MNT_DETACH) }
	} else {
		os.Chmod(dir, 0o555)
		undo = func() { os.Chmod(dir, 0o755) }
	}
	var done atomic.Bool
	once := func() {
		if done.CompareAndSwap(false, true) {
			undo()
		}
	}
	t.Cleanup(once)
	return once
}

// Must show 5, disk full: a small tmpfs on the receiver (root only).
func TestDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("disk-full test mounts a small tmpfs: needs root (TestPermissionDenied covers the retry path)")
	}
	a, b, _ := pair(t)
	os.MkdirAll(filepath.Join(a.root, "full"), 0o755)
	full := filepath.Join(b.root, "full")
	os.MkdirAll(full, 0o755)
	if err := unix.Mount("tmpfs", full, "tmpfs", 0, "size=1m,mode=0755"); err != nil {
		t.Skipf("tmpfs mount not permitted: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(full, unix.MNT_DETACH) })

	a.activate(9)
	const size = 3 << 20
	writeFile(t, filepath.Join(a.root, "full/big.bin"), strings.Repeat("y", size), 0o644)
	target := filepath.Join(full, "big.bin")
	check := neverPartial(t, target, size)
	eventually(t, 15*time.Second, "disk-full errors on both sides", func() bool {
		check()
		return a.s.Status().Errors["peer-disk-full"] >= 2 && b.s.Status().Errors["recv-disk-full"] >= 2
	})
	noTempFiles(t, b.root)
	var st syscall.Statfs_t
	syscall.Statfs(full, &st)
	if used := (st.Blocks - st.Bfree) * uint64(st.Bsize); used > 64<<10 {
		t.Fatalf("failed writes left %d bytes on the full disk", used)
	}
	if err := unix.Mount("tmpfs", full, "tmpfs", unix.MS_REMOUNT, "size=16m"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the file once space is back", check)
	waitSame(t, a, b, 10*time.Second, nil)
}

// Must show 6: 10,000 files created in one burst all arrive.
func TestBurst10k(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000-file burst skipped in -short")
	}
	a, b, _ := pair(t)
	a.activate(11)
	content := strings.Repeat("z", 4096)
	start := time.Now()
	for d := 0; d < 10; d++ {
		dir := filepath.Join(a.root, fmt.Sprintf("d%02d", d))
		os.Mkdir(dir, 0o755)
		for i := 0; i < 1000; i++ {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", i)), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	lastLog := time.Now()
	eventually(t, 150*time.Second, "10,000 files on b", func() bool {
		n := 0
		filepath.WalkDir(b.root, func(p string, d fs.DirEntry, err error) error {
			// A temp file on its way to its name is not an arrived file.
			if err == nil && d.Type().IsRegular() && !strings.HasPrefix(d.Name(), tempPrefix) {
				n++
			}
			return nil
		})
		if time.Since(lastLog) > 10*time.Second {
			lastLog = time.Now()
			st := a.s.Status()
			t.Logf("%s: %d files on b, queue %d, sent %d, errors %v", time.Since(start).Round(time.Second), n, st.QueueDepth, st.FilesSent, st.Errors)
		}
		if n != 10000 {
			time.Sleep(100 * time.Millisecond) // each poll walks 10,000 files
		}
		return n == 10000
	})
	t.Logf("10,000 files arrived %s after the first write", time.Since(start).Round(time.Millisecond))
	for _, f := range []string{"d00/f0000", "d04/f0517", "d09/f0999"} { // full tree hashes are slow under -race
		if got := readFile(filepath.Join(b.root, f)); got != content {
			t.Fatalf("%s differs: %d bytes %.60q", f, len(got), got)
		}
	}
	// The answers of the last requests may still be on their way back.
	eventually(t, 10*time.Second, "10,000 files confirmed to the sender", func() bool {
		return a.s.Status().FilesSent >= 10000
	})
}

// limitWatcher is inotify with a watch limit of zero.
type limitWatcher struct {
	adds atomic.Int64
	ev   chan event
	errs chan error
}

func (w *limitWatcher) Add(dir string) error {
	w.adds.Add(1)
	return &os.PathError{Op: "inotify_add_watch", Path: dir, Err: syscall.ENOSPC}
}
func (w *limitWatcher) Remove(string) error  { return nil }
func (w *limitWatcher) Events() <-chan event { return w.ev }
func (w *limitWatcher) Errors() <-chan error { return w.errs }
func (w *limitWatcher) Close() error         { return nil }

// Must show 6: a watch limit that is too low gives a clear error naming the
// sysctl, and the sender retries calmly instead of spinning.
func TestWatchLimit(t *testing.T) {
	a, _, _ := pair(t)
	w := &limitWatcher{ev: make(chan event), errs: make(chan error)}
	a.s.newWatcher = func() (watcher, error) { return w, nil }
	a.activate(3)
	eventually(t, 5*time.Second, "the watch-limit error", func() bool {
		return strings.Contains(a.s.Status().LastError, "fs.inotify.max_user_watches")
	})
	start, n0 := time.Now(), w.adds.Load()
	eventually(t, 5*time.Second, "a retry", func() bool { return w.adds.Load() > n0+1 })
	if rate := float64(w.adds.Load()-n0) / time.Since(start).Seconds(); rate > 100 {
		t.Fatalf("retrying %.0f times a second", rate)
	}
	if a.s.Status().Errors["sender"] == 0 {
		t.Fatal("error not counted")
	}
}

// lossyWatcher is real inotify that can drop events and report an overflow,
// as the kernel does when its queue fills up.
type lossyWatcher struct {
	watcher
	drop atomic.Bool
	ev   chan event
	errs chan error
}

func newLossy(t *testing.T) *lossyWatcher {
	w, err := newInotify()
	if err != nil {
		t.Fatal(err)
	}
	l := &lossyWatcher{watcher: w, ev: make(chan event, 1024), errs: make(chan error, 1)}
	go func() { // ends when the watcher closes its channel
		for e := range w.Events() {
			if !l.drop.Load() {
				select {
				case l.ev <- e:
				default:
				}
			}
		}
	}()
	return l
}

func (l *lossyWatcher) Events() <-chan event { return l.ev }
func (l *lossyWatcher) Errors() <-chan error { return l.errs }

// Lost events are recovered by the rescan that an overflow triggers.
func TestOverflowRescan(t *testing.T) {
	a, b, _ := pair(t)
	l := newLossy(t)
	a.s.newWatcher = func() (watcher, error) { return l, nil }
	a.activate(4)
	writeFile(t, filepath.Join(a.root, "seen.txt"), "seen", 0o644)
	eventually(t, 10*time.Second, "the first file", func() bool { return readFile(filepath.Join(b.root, "seen.txt")) == "seen" })
	l.drop.Store(true)
	writeFile(t, filepath.Join(a.root, "lost-event.txt"), "found by the rescan", 0o644)
	os.Remove(filepath.Join(a.root, "seen.txt"))
	l.errs <- errOverflow
	waitSame(t, a, b, 10*time.Second, nil)
	if a.s.Status().Errors["overflow"] != 1 {
		t.Fatal("overflow not counted")
	}
}
