package syncdir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dirSet holds the directories one batch touches, each opened once by a
// walk from the root that never follows a symlink. Every file operation of
// the batch is then one system call relative to its directory, with a
// single-component name, instead of an os.Root walk per call: a burst of
// small files costs about a third fewer system calls.
type dirSet struct {
	rt  *rootState
	fds map[string]*os.File
	// above maps a directory found missing while the batch is read to the
	// one its files are prepared in (prepDir): nothing is made before
	// commit, so the answer holds until then.
	above map[string]string
}

func newDirSet(rt *rootState) *dirSet {
	return &dirSet{rt: rt, fds: map[string]*os.File{}, above: map[string]string{}}
}

// prepDir returns the directory to prepare q's file in while its own
// directory is missing: see Syncer.prepDir.
func (d *dirSet) prepDir(s *Syncer, q request) (*os.File, error) {
	dir := path.Dir(q.path)
	if a, ok := d.above[dir]; ok {
		return d.fds[a], nil
	}
	f, rel, err := s.prepDir(d.rt, q, q.path)
	if err != nil {
		return nil, err
	}
	if old := d.fds[rel]; old != nil {
		f.Close()
		f = old
	} else {
		d.fds[rel] = f
	}
	if rel != dir {
		d.above[dir] = rel
	}
	return f, nil
}

// open returns dir (slash-separated, relative to the root, "." for the
// root) opened as a directory; it fails when dir is missing or any of its
// components is a symlink or not a directory.
func (d *dirSet) open(dir string) (*os.File, error) {
	if f := d.fds[dir]; f != nil {
		return f, nil
	}
	f, err := openDirNoFollow(d.rt.fsFD, dir)
	if err != nil {
		return nil, err
	}
	d.fds[dir] = f
	return f, nil
}

func (d *dirSet) close() {
	for k, f := range d.fds {
		f.Close()
		delete(d.fds, k)
	}
}

// openDirNoFollow walks dir one component at a time below root with
// O_NOFOLLOW, so the result is inside the root and reached through real
// directories only. dir must be a path accepted by checkPath (or ".").
func openDirNoFollow(root *os.File, dir string) (*os.File, error) {
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(int(root.Fd()), ".", flags, 0)
	if err != nil {
		return nil, &os.PathError{Op: "openat", Path: ".", Err: err}
	}
	if dir != "." {
		for c := range strings.SplitSeq(dir, "/") {
			next, err := unix.Openat(fd, c, flags, 0)
			unix.Close(fd)
			if err != nil {
				return nil, &os.PathError{Op: "openat", Path: dir, Err: err}
			}
			fd = next
		}
	}
	return os.NewFile(uintptr(fd), dir), nil
}

// createIn creates a new temp file with permissions perm (less the umask)
// in the directory d; it returns the file and its name (one component).
func createIn(d *os.File, perm uint32) (*os.File, string, error) {
	name := path.Base(tempName("."))
	fd, err := unix.Openat(int(d.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm&0o777)
	if err != nil {
		return nil, "", fmt.Errorf("create temp: %w", &os.PathError{Op: "openat", Path: name, Err: err})
	}
	return os.NewFile(uintptr(fd), name), name, nil
}

// createAnonIn creates an unnamed file (O_TMPFILE) in the directory d,
// for linkIn to give it its final name once it is complete and durable. A
// new file then costs one directory entry instead of three (a temp name,
// its removal, the final name), and a failed or crashed receive leaves no
// name behind. ok is false where the file system (or a missing /proc)
// does not allow it; the caller then uses createIn.
func createAnonIn(d *os.File, perm uint32) (f *os.File, ok bool, err error) {
	if !procFDs {
		return nil, false, nil
	}
	fd, err := unix.Openat(int(d.Fd()), ".", unix.O_WRONLY|unix.O_TMPFILE|unix.O_CLOEXEC, perm&0o777)
	switch {
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EISDIR), errors.Is(err, unix.EINVAL):
		return nil, false, nil
	case err != nil:
		return nil, true, fmt.Errorf("create temp: %w", &os.PathError{Op: "openat", Path: d.Name(), Err: err})
	}
	return os.NewFile(uintptr(fd), ""), true, nil
}

// procFDs: linkat(2) of a descriptor without CAP_DAC_READ_SEARCH goes
// through /proc/self/fd.
var procFDs = func() bool {
	_, err := os.Stat("/proc/self/fd")
	return err == nil
}()

// linkIn gives the unnamed file f the name name in the directory d; it
// fails with EEXIST when the name is taken (linkat never replaces).
func linkIn(d, f *os.File, name string) error {
	err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), int(d.Fd()), name, unix.AT_SYMLINK_FOLLOW)
	if err != nil {
		return &os.LinkError{Op: "linkat", Old: "(new file)", New: name, Err: err}
	}
	return nil
}

// openIn opens the regular file name in the directory d for reading,
// without following a symlink.
func openIn(d *os.File, name string) (*os.File, error) {
	fd, err := unix.Openat(int(d.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			err = unix.ENOENT // a symlink now: not the file that was planned
		}
		return nil, &os.PathError{Op: "openat", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), name), nil
}

// setMtime sets f's access and modification times to mtime (ns since the
// epoch) through its descriptor (futimens).
func setMtime(f *os.File, mtime int64) error {
	ts := [2]unix.Timespec{unix.NsecToTimespec(mtime), unix.NsecToTimespec(mtime)}
	// utimensat with a NULL path is futimens(3); x/sys has no wrapper.
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, f.Fd(), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if errno != 0 {
		return &os.PathError{Op: "futimens", Path: f.Name(), Err: errno}
	}
	return nil
}

// subRoots opens each directory of a set of paths once as an os.Root, so
// that looking at many files of one directory costs one fstatat each
// instead of a walk from the root each.
type subRoots map[key]*os.Root // by root index and directory; nil: use the root

func (m subRoots) lstat(rt *rootState, k key) (fs.FileInfo, error) {
	dir, name := path.Dir(k.rel), path.Base(k.rel)
	if dir == "." {
		return rt.root.Lstat(k.rel)
	}
	dk := key{k.root, dir}
	sub, seen := m[dk]
	if !seen {
		sub, _ = rt.root.OpenRoot(dir) // on error: nil, the long way
		m[dk] = sub
	}
	if sub == nil {
		return rt.root.Lstat(k.rel)
	}
	return sub.Lstat(name)
}

func (m subRoots) close() {
	for k, r := range m {
		if r != nil {
			r.Close()
		}
		delete(m, k)
	}
}
