package syncdir

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"go.uber.org/zap"
)

// ErrWatchLimit is returned (wrapped) when inotify runs out of watches.
var ErrWatchLimit = errors.New("syncdir: inotify watch limit reached: raise sysctl fs.inotify.max_user_watches")

// tree tracks the watched directories of all roots and turns file system
// events into relative paths for the dispatcher.
type tree struct {
	s     *Syncer
	w     watcher
	note  func(root int, rel string, st writeState)
	mu    sync.Mutex
	dirs  map[string]bool // watched absolute directories
	roots []*rootState
}

// add watches dir rel of root i and every directory below it; with notify it
// also reports every entry found, for directories that appeared after the
// first scan (files may land in them before the watch exists).
func (t *tree) add(i int, rel string, notify bool) error {
	rt := t.roots[i]
	start := filepath.Join(rt.abs, filepath.FromSlash(rel))
	return filepath.WalkDir(start, func(abs string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		r := t.rel(rt, abs)
		if r != "" && rt.ex.match(r, d.IsDir()) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if notify && r != "" && r != rel {
			t.note(i, r, changed)
		}
		if !d.IsDir() {
			return nil
		}
		if err := t.w.Add(abs); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return fmt.Errorf("%w (%s, now %s): %w", ErrWatchLimit, abs, currentWatchLimit(), err)
			}
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
				return nil
			}
			return fmt.Errorf("syncdir: watch %s: %w", abs, err)
		}
		t.mu.Lock()
		t.dirs[abs] = true
		t.mu.Unlock()
		return nil
	})
}

func currentWatchLimit() string {
	b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_watches")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// forget drops the watches of a directory that moved or vanished.
func (t *tree) forget(abs string) {
	t.mu.Lock()
	var gone []string
	pre := abs + string(filepath.Separator)
	for d := range t.dirs {
		if d == abs || strings.HasPrefix(d, pre) {
			gone = append(gone, d)
			delete(t.dirs, d)
		}
	}
	t.mu.Unlock()
	for _, d := range gone {
		t.w.Remove(d) // the kernel may have dropped it already
	}
}

func (t *tree) isWatched(abs string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dirs[abs]
}

func (t *tree) rel(rt *rootState, abs string) string {
	if abs == rt.abs {
		return ""
	}
	return filepath.ToSlash(strings.TrimPrefix(abs, rt.abs+string(filepath.Separator)))
}

// locate maps an event path to its root.
func (t *tree) locate(abs string) (int, string, bool) {
	best, bestLen := -1, 0
	for i, rt := range t.roots {
		if (abs == rt.abs || strings.HasPrefix(abs, rt.abs+string(filepath.Separator))) && len(rt.abs) > bestLen {
			best, bestLen = i, len(rt.abs)
		}
	}
	if best < 0 {
		return 0, "", false
	}
	return best, t.rel(t.roots[best], abs), true
}

// run turns events into notes until ctx is done. Overflow asks for a rescan;
// a failure to watch a new directory is fatal for this sender run.
func (t *tree) run(ctx context.Context, rescan func(), fatal func(error)) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-t.w.Events():
			if !ok {
				return
			}
			if err := t.handle(ev); err != nil {
				fatal(err)
				return
			}
		case err, ok := <-t.w.Errors():
			if !ok {
				return
			}
			if errors.Is(err, errOverflow) {
				t.s.lg.Warn("inotify queue overflow, rescanning")
				t.s.countError("overflow")
				rescan()
				continue
			}
			t.s.lg.Warn("inotify error", zap.Error(err))
		}
	}
}

// writeState tells the dispatcher whether a writer may still have the file
// open: a file is sent once closed, or after a while without writes.
type writeState uint8

const (
	changed writeState = iota
	writing
	closed
)

func (t *tree) handle(ev event) error {
	i, rel, ok := t.locate(filepath.Clean(ev.name))
	if !ok || rel == "" {
		return nil
	}
	rt := t.roots[i]
	if rt.ex.matchAny(rel, false) {
		return nil
	}
	if ev.has(evRemove | evRename) {
		if t.isWatched(ev.name) {
			t.forget(ev.name)
		}
	}
	st := changed
	switch {
	case ev.has(evCloseWrite):
		st = closed
	case ev.has(evWrite):
		st = writing
	}
	if ev.has(evCreate) {
		fi, err := os.Lstat(ev.name)
		switch {
		case err == nil && fi.IsDir():
			if rt.ex.matchAny(rel, true) {
				return nil
			}
			t.note(i, rel, changed)
			return t.add(i, rel, true)
		case err == nil && fi.Mode().IsRegular() && ev.has(evMovedIn):
			// Renamed into place: the atomic-write idiom (write a temp file,
			// close, rename). No close event follows, so waiting for one
			// would hold the file back for holdOpen; a writer that keeps
			// writing after the rename is still caught by the sender's
			// source-changed check.
			st = closed
		case err == nil && fi.Mode().IsRegular() && fi.Size() == 0:
			st = writing // created by open(O_CREAT): wait for the close
		}
	}
	t.note(i, rel, st)
	return nil
}
