package syncdir

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The installer's system calls: directories walked one component at a
// time with O_NOFOLLOW, changes made relative to their descriptors
// (mkdirat, renameat2, fstatat), Linux's stat layout.

// parentOf opens the directory that holds rel, one component at a time
// from the root and never through a symlink. With mk, a missing directory
// is made through install (and what stands in its way quarantined unless
// delivered); without, a missing or non-directory component is
// errNoParent. A symlink on the way is refused either way.
func (s *Syncer) parentOf(rt *rootState, q request, rel string, mk bool) (*os.File, error) {
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(int(rt.fsFD.Fd()), ".", flags, 0)
	if err != nil {
		return nil, &os.PathError{Op: "openat", Path: ".", Err: err}
	}
	dir := path.Dir(rel)
	if dir == "." {
		return os.NewFile(uintptr(fd), "."), nil
	}
	cur := os.NewFile(uintptr(fd), ".")
	done := ""
	for c := range strings.SplitSeq(dir, "/") {
		p := path.Join(done, c)
		next, err := unix.Openat(int(cur.Fd()), c, flags, 0)
		if err != nil {
			next, err = s.missingDir(rt, q, cur, p, c, mk)
		}
		cur.Close()
		if err != nil {
			return nil, err
		}
		cur, done = os.NewFile(uintptr(next), p), p
	}
	return cur, nil
}

// missingDir handles the component c (at p) of a path that did not open
// as a directory in d, and returns c's descriptor.
func (s *Syncer) missingDir(rt *rootState, q request, d *os.File, p, c string, mk bool) (int, error) {
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd := int(d.Fd())
	var st unix.Stat_t
	err := unix.Fstatat(fd, c, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return -1, refuse(ReasonSymlinkParent, http.StatusBadRequest, "parent %q of %q is a symlink", p, q.path)
	case err != nil && !errors.Is(err, unix.ENOENT):
		return -1, &os.PathError{Op: "fstatat", Path: p, Err: err}
	case !mk:
		return -1, errNoParent
	}
	t := target{rel: p, dir: d, name: c, forDir: true}
	made := false
	mkdir := func() (err error) {
		made, err = s.makeDirAt(rt, d, c, p)
		return err
	}
	replace := func() error {
		// makeRoom left a directory, or a delivered file, which goes.
		var st unix.Stat_t
		err := unix.Fstatat(fd, c, &st, unix.AT_SYMLINK_NOFOLLOW)
		switch {
		case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
			return nil
		case err == nil:
			if err := unix.Unlinkat(fd, c, 0); err != nil {
				return &os.PathError{Op: "unlinkat", Path: p, Err: err}
			}
		case !errors.Is(err, unix.ENOENT):
			return &os.PathError{Op: "fstatat", Path: p, Err: err}
		}
		return mkdir()
	}
	err = s.install(rt, q, t, keepDir, mkdir, replace)
	if err == nil {
		// The new entry of the parent becomes durable with the file's
		// own directory sync, or the syncfs, of the change that needed it.
		s.rememberAt(rt, t)
		if f := s.afterMadeDir.Load(); f != nil && made {
			(*f)(p)
		}
		var next int
		next, err = unix.Openat(fd, c, flags, 0)
		if err != nil {
			err = &os.PathError{Op: "openat", Path: p, Err: err}
		}
		return next, err
	}
	return -1, err
}

// replaceWithDir makes t a directory: a directory there stays, a file
// (left by makeRoom because it was delivered) is replaced.
func replaceWithDir(t target, perm uint32) error {
	var st unix.Stat_t
	err := unix.Fstatat(int(t.dir.Fd()), t.name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return nil
	case err == nil:
		if err := unix.Unlinkat(int(t.dir.Fd()), t.name, 0); err != nil {
			return &os.PathError{Op: "unlinkat", Path: t.rel, Err: err}
		}
	case !errors.Is(err, unix.ENOENT):
		return &os.PathError{Op: "fstatat", Path: t.rel, Err: err}
	}
	if err := unix.Mkdirat(int(t.dir.Fd()), t.name, perm); err != nil {
		return &os.PathError{Op: "mkdirat", Path: t.rel, Err: err}
	}
	return nil
}

// quarantineDirFor opens (making what is missing, 0700) the directory of
// the quarantine of epoch for entries of the directory relDir, one
// component at a time without following a link; it returns it and its
// path from the root. A component already taken there by something that is
// not a directory (a file of the same name quarantined earlier in this
// epoch, then a directory at that name) gets a suffix .1, .2, ... like a
// quarantined name does.
func quarantineDirFor(rt *rootState, epoch int64, relDir string) (*os.File, string, error) {
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	want := path.Join(quarantineDir, strconv.FormatInt(epoch, 10), relDir)
	fd, err := unix.Openat(int(rt.fsFD.Fd()), ".", flags, 0)
	if err != nil {
		return nil, "", &os.PathError{Op: "openat", Path: ".", Err: err}
	}
	var got []string
	for c := range strings.SplitSeq(want, "/") {
		var next int
		name := c
		for i := 1; ; i++ {
			next, err = unix.Openat(fd, name, flags, 0)
			if errors.Is(err, unix.ENOENT) {
				if err = unix.Mkdirat(fd, name, 0o700); err == nil || errors.Is(err, unix.EEXIST) {
					next, err = unix.Openat(fd, name, flags, 0)
				}
			}
			// ENOTDIR: a file; ELOOP: a link (O_NOFOLLOW). Only below the
			// epoch's own directory, never for the quarantine's top.
			if (errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)) && len(got) >= 2 && i <= 1000 {
				name = fmt.Sprintf("%s.%d", c, i)
				continue
			}
			break
		}
		unix.Close(fd)
		if err != nil {
			return nil, "", &os.PathError{Op: "openat", Path: want, Err: err}
		}
		got = append(got, name)
		fd = next
	}
	qrel := strings.Join(got, "/")
	return os.NewFile(uintptr(fd), qrel), qrel, nil
}

// renameNoReplace renames without replacing: EEXIST when to is taken.
func renameNoReplace(fromDir *os.File, from string, toDir *os.File, to string) error {
	err := unix.Renameat2(int(fromDir.Fd()), from, int(toDir.Fd()), to, unix.RENAME_NOREPLACE)
	if err != nil {
		return &os.LinkError{Op: "renameat2", Old: from, New: to, Err: err}
	}
	return nil
}

func renameAt(fromDir *os.File, from string, toDir *os.File, to string) error {
	if err := unix.Renameat(int(fromDir.Fd()), from, int(toDir.Fd()), to); err != nil {
		return &os.LinkError{Op: "renameat", Old: from, New: to, Err: err}
	}
	return nil
}

// statAt is fstatat without following a symlink, as an entry.
func statAt(d *os.File, name string) (entry, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(int(d.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return entry{}, &os.PathError{Op: "fstatat", Path: name, Err: err}
	}
	return entryOfStat(&st), nil
}

// entryOfStat is entryOf for a raw stat.
func entryOfStat(st *unix.Stat_t) entry {
	e := entry{Size: st.Size, Mtime: st.Mtim.Nano(), Mode: st.Mode & 0o7777, Ino: st.Ino, Ctime: st.Ctim.Nano(), Uid: st.Uid, Gid: st.Gid, OwnerKnown: true}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		e.Kind, e.Size, e.Mtime, e.Ctime = 'd', 0, 0, 0
	case unix.S_IFLNK:
		e.Kind = 'l'
	default:
		e.Kind = 'f'
	}
	return e
}

// sameFS reports whether dir is on the file system of the open f (a
// syncfs of f then makes dir's files durable too). Unknown counts as no.
func sameFS(f *os.File, dir string) bool {
	var a, b unix.Stat_t
	if unix.Fstat(int(f.Fd()), &a) != nil || unix.Stat(dir, &b) != nil {
		return false
	}
	return a.Dev == b.Dev
}
