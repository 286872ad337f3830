package syncdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A plain inotify watcher. fsnotify hides IN_CLOSE_WRITE, and that event is
// what lets the sender push a file the moment its writer closes it, and
// never while it is half written.

type evOp uint32

const (
	evCreate evOp = 1 << iota
	evWrite
	evCloseWrite
	evRemove
	evRename // moved away
	evChmod
	evMovedIn
)

type event struct {
	name string
	op   evOp
}

func (e event) has(o evOp) bool { return e.op&o != 0 }

// errOverflow means the kernel dropped events: the sender must rescan.
var errOverflow = errors.New("syncdir: inotify queue overflow")

// watcher is what the sender needs from inotify (a fake in tests).
type watcher interface {
	Add(dir string) error
	Remove(dir string) error
	Events() <-chan event
	Errors() <-chan error
	Close() error
}

type inotify struct {
	f      *os.File
	fd     int
	mu     sync.Mutex
	wds    map[int32]string
	paths  map[string]int32
	events chan event
	errs   chan error
	done   chan struct{}
	exited chan struct{}
	once   sync.Once
}

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CLOSE_WRITE |
	unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_ONLYDIR |
	unix.IN_DONT_FOLLOW | unix.IN_EXCL_UNLINK

func newInotify() (watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		if errors.Is(err, syscall.EMFILE) {
			return nil, fmt.Errorf("syncdir: too many inotify instances: raise sysctl fs.inotify.max_user_instances: %w", err)
		}
		return nil, fmt.Errorf("syncdir: inotify: %w", err)
	}
	w := &inotify{
		f: os.NewFile(uintptr(fd), "inotify"), fd: fd,
		wds: map[int32]string{}, paths: map[string]int32{},
		events: make(chan event, 1024), errs: make(chan error, 4),
		done: make(chan struct{}), exited: make(chan struct{}),
	}
	go w.read()
	return w, nil
}

func (w *inotify) Add(dir string) error {
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask)
	if err != nil {
		return &os.PathError{Op: "inotify_add_watch", Path: dir, Err: err}
	}
	w.mu.Lock()
	w.wds[int32(wd)] = dir
	w.paths[dir] = int32(wd)
	w.mu.Unlock()
	return nil
}

func (w *inotify) Remove(dir string) error {
	w.mu.Lock()
	wd, ok := w.paths[dir]
	if ok {
		delete(w.paths, dir)
		delete(w.wds, wd)
	}
	w.mu.Unlock()
	if !ok {
		return nil
	}
	_, err := unix.InotifyRmWatch(w.fd, uint32(wd))
	return err
}

func (w *inotify) Events() <-chan event { return w.events }
func (w *inotify) Errors() <-chan error { return w.errs }

func (w *inotify) Close() error {
	w.once.Do(func() {
		close(w.done)
		w.f.Close() // wakes the reader
		<-w.exited
	})
	return nil
}

func (w *inotify) read() {
	defer close(w.exited)
	defer close(w.events)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.sendErr(fmt.Errorf("syncdir: inotify read: %w", err))
			}
			return
		}
		if !w.parse(buf[:n]) {
			return
		}
	}
}

// parse delivers the events in buf; false once the watcher is closed.
func (w *inotify) parse(buf []byte) bool {
	for off := 0; off+unix.SizeofInotifyEvent <= len(buf); {
		raw := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(raw.Len)]
		off += unix.SizeofInotifyEvent + int(raw.Len)
		if raw.Mask&unix.IN_Q_OVERFLOW != 0 {
			if !w.sendErr(errOverflow) {
				return false
			}
			continue
		}
		w.mu.Lock()
		dir, ok := w.wds[raw.Wd]
		if raw.Mask&unix.IN_IGNORED != 0 && ok {
			delete(w.wds, raw.Wd)
			if w.paths[dir] == raw.Wd {
				delete(w.paths, dir)
			}
		}
		w.mu.Unlock()
		name := string(trimNUL(nameBytes))
		if !ok || name == "" {
			continue
		}
		ev := event{name: filepath.Join(dir, name), op: opOf(raw.Mask)}
		if ev.op == 0 {
			continue
		}
		select {
		case w.events <- ev:
		case <-w.done:
			return false
		}
	}
	return true
}

func opOf(mask uint32) evOp {
	var op evOp
	if mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
		op |= evCreate
	}
	if mask&unix.IN_MOVED_TO != 0 {
		op |= evMovedIn
	}
	if mask&unix.IN_MODIFY != 0 {
		op |= evWrite
	}
	if mask&unix.IN_CLOSE_WRITE != 0 {
		op |= evCloseWrite
	}
	if mask&unix.IN_DELETE != 0 {
		op |= evRemove
	}
	if mask&unix.IN_MOVED_FROM != 0 {
		op |= evRename
	}
	if mask&unix.IN_ATTRIB != 0 {
		op |= evChmod
	}
	return op
}

func trimNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}

func (w *inotify) sendErr(err error) bool {
	select {
	case w.errs <- err:
		return true
	case <-w.done:
		return false
	}
}
