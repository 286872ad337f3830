package syncdir

import (
	"errors"
	"io"
	"os"
	"path"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// The system calls of the half-made directory list (halfmade.go): the
// inode and ctime of a directory just made, and the sweep at start.

// makeDirAt makes the directory c in d (at p, from the root) that a change
// needs, listed as half-made at every step, so a kill at any point leaves
// nothing the next start cannot prove it made:
//
//  1. a listed parent's ctime is forgotten (its inode proves it): making
//     c changes it;
//  2. the directory is made under a temp name (a kill now leaves a temp
//     directory, removed at start by its name) and listed by its inode;
//  3. it is renamed to c without replacing (EEXIST: c was made
//     meanwhile, and this one goes again);
//  4. it is listed again with its ctime, and a listed parent with its new one.
//
// A list that cannot be written only means the directory may be left
// over after a crash: it is logged and the change goes on.
func (s *Syncer) makeDirAt(rt *rootState, d *os.File, c, p string) (made bool, err error) {
	fd := int(d.Fd())
	s.listed(rt, p, rt.made.loosenParent(p))
	tmp := path.Base(tempName("."))
	if err := unix.Mkdirat(fd, tmp, 0o755); err != nil {
		return false, &os.PathError{Op: "mkdirat", Path: p, Err: err}
	}
	var st unix.Stat_t
	err = unix.Fstatat(fd, tmp, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == nil {
		err = rt.made.expect(p, st.Ino)
	}
	s.listed(rt, p, err)
	if err := unix.Renameat2(fd, tmp, fd, c, unix.RENAME_NOREPLACE); err != nil {
		unix.Unlinkat(fd, tmp, unix.AT_REMOVEDIR)
		s.listed(rt, p, rt.made.forget(p, st.Ino))
		if !errors.Is(err, unix.EINVAL) {
			return false, &os.LinkError{Op: "renameat2", Old: tmp, New: p, Err: err}
		}
		// No RENAME_NOREPLACE on this file system: made in place, listed
		// right after (a kill in between leaves it over).
		if err := unix.Mkdirat(fd, c, 0o755); err != nil {
			return false, &os.PathError{Op: "mkdirat", Path: p, Err: err}
		}
	}
	var pst unix.Stat_t
	err = unix.Fstatat(fd, c, &st, unix.AT_SYMLINK_NOFOLLOW)
	parentSeen := false
	if err == nil && rt.made.parentListed(p) {
		err = unix.Fstat(fd, &pst)
		parentSeen = err == nil
	}
	if err == nil {
		err = rt.made.made(p, madeDirOf(&st), madeDirOf(&pst), parentSeen)
	}
	s.listed(rt, p, err)
	return true, nil
}

// listed logs a failure to write the half-made list.
func (s *Syncer) listed(rt *rootState, p string, err error) {
	if err != nil {
		s.countError("state")
		s.lg.Error("sync half-made directory list not written", zap.String("root", rt.name), zap.String("path", p), zap.Error(err))
	}
}

// settle tells the list that a change was installed at rel: rel and the
// directories above it are in use.
func (s *Syncer) settle(rt *rootState, rel string) {
	s.listed(rt, rel, rt.made.settle(rel))
}

func madeDirOf(st *unix.Stat_t) madeDir {
	return madeDir{Ino: st.Ino, Ctime: st.Ctim.Nano()}
}

// maxSeenNames bounds the entries read of a listed directory: one the
// receiver made and left holds a few directories at the most.
const maxSeenNames = 1024

// seeDir looks at the listed directory p without following a link on the
// way; a path that cannot be reached counts as gone.
func seeDir(rt *rootState, p string) dirSeen {
	parent, err := openDirNoFollow(rt.fsFD, path.Dir(p))
	if err != nil {
		return dirSeen{}
	}
	defer parent.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(int(parent.Fd()), path.Base(p), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return dirSeen{}
	}
	s := dirSeen{exists: true, isDir: st.Mode&unix.S_IFMT == unix.S_IFDIR, now: madeDirOf(&st)}
	if !s.isDir {
		return s
	}
	d, err := openSubdir(parent, path.Base(p), p)
	if err != nil {
		s.isDir = false // swapped meanwhile: keep it
		return s
	}
	defer d.Close()
	s.names, err = d.Readdirnames(maxSeenNames + 1)
	if len(s.names) > maxSeenNames || err != nil && !errors.Is(err, io.EOF) {
		s.names = append(s.names, "\x00") // never a listed name: in use
	}
	return s
}

// sweepHalfMade removes the half-made directories an earlier run listed,
// before the receiver serves (judgeMadeDirs decides which), and empties the
// list. rmdir(2) removes an empty directory only, whatever was decided.
func (s *Syncer) sweepHalfMade(rt *rootState) (removed int, err error) {
	list, err := rt.made.load()
	if err != nil {
		return 0, err
	}
	if len(list) > 0 {
		seen := make(map[string]dirSeen, len(list))
		for p := range list {
			seen[p] = seeDir(rt, p)
		}
		verdicts := judgeMadeDirs(list, seen)
		for _, p := range removalOrder(verdicts) {
			parent, err := openDirNoFollow(rt.fsFD, path.Dir(p))
			if err != nil {
				continue
			}
			err = unix.Unlinkat(int(parent.Fd()), path.Base(p), unix.AT_REMOVEDIR)
			parent.Close()
			if err != nil {
				if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.ENOENT) {
					s.lg.Warn("sync half-made directory not removed", zap.String("root", rt.name), zap.String("path", p), zap.Error(err))
				}
				continue
			}
			rt.rec.removeTree(p)
			removed++
		}
		for p, v := range verdicts {
			s.lg.Debug("sync half-made directory judged", zap.String("root", rt.name), zap.String("path", p), zap.Stringer("verdict", v))
		}
	}
	return removed, rt.made.reset()
}
