package main

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// arrivals counts the files that land in one directory, from inotify: a name
// renamed into place or closed after writing, dot-names (both tools' temp
// files) left out. Waiting on events instead of listing the directory every
// millisecond keeps the bench's own CPU out of the measurement: on two
// cores a listing of the growing directory took about a tenth of the CPU the
// burst itself needed.
type arrivals struct {
	fd   int
	seen map[string]bool
	buf  []byte
}

func watchArrivals(dir string) (*arrivals, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("inotify watch %s: %w", dir, err)
	}
	return &arrivals{fd: fd, seen: map[string]bool{}, buf: make([]byte, 64<<10)}, nil
}

func (a *arrivals) close() { unix.Close(a.fd) }

// waitCount returns once n distinct names have arrived, or errors at the
// deadline.
func (a *arrivals) waitCount(n int, deadline time.Time) error {
	for len(a.seen) < n {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("only %d of %d files arrived", len(a.seen), n)
		}
		fds := []unix.PollFd{{Fd: int32(a.fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(left/time.Millisecond)+1); err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		if err := a.drain(); err != nil {
			return err
		}
	}
	return nil
}

func (a *arrivals) drain() error {
	for {
		k, err := unix.Read(a.fd, a.buf)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			return nil
		}
		if err != nil {
			return err
		}
		for off := 0; off+unix.SizeofInotifyEvent <= k; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&a.buf[off]))
			name := a.buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				return errors.New("inotify queue overflow while counting arrivals")
			}
			s := string(bytes.TrimRight(name, "\x00"))
			if s != "" && !strings.HasPrefix(s, ".") {
				a.seen[s] = true
			}
		}
	}
}
