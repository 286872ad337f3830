package syncdir

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"golang.org/x/sys/unix"
)

// The installer is the one way anything becomes visible in a root: a
// received file, link or directory taking its name, a rename, a delete,
// and the directories a path needs (issue 16, finding 1). Every receive
// path (single put, batch, streamed file, mkdir, delete, rename, symlink)
// prepares its change out of sight and then calls install, which
//
//  1. re-checks the fence immediately before the change, and holds it:
//     the node is not (becoming) ACTIVE and the request's epoch is the
//     highest admitted; a higher epoch is recorded here, by the first
//     change of a request that passed every check, and waits until the
//     changes of lower epochs in flight are done (epochStore.gate);
//  2. tries the change at a free name (linkat, mkdirat, renameat2 with
//     RENAME_NOREPLACE), the fast path of a new file;
//  3. if the name is taken, moves whatever is there into quarantine
//     unless the delivery record proves the receiver put exactly that
//     there (makeRoom), then makes the change over what is left;
//  4. once the change is made, tells the half-made directory list
//     (halfmade.go) that the directories above it are in use.
//
// The change happens relative to a directory descriptor that was reached
// from the root without following a symlink (parentOf), never by path.
// The speed paths (batches, unnamed files, streaming) differ only in how
// they prepare the content.

// target is where a change lands: the directory that holds it, opened
// without following symlinks, and its name there.
type target struct {
	rel  string   // slash-separated, relative to the root
	dir  *os.File // rel's parent
	name string   // path.Base(rel)
	// incoming opens the new content of a file change (nil otherwise): a
	// local file the record does not prove but with the very same bytes
	// is replaced without quarantine, since nothing of it is lost.
	incoming func() (*os.File, error)
	// forDir: the change makes a directory another change needs
	// (parentOf). It and the directories above it stay half-made
	// (halfmade.go) until a change lands in them; any other change
	// settles the directories above it.
	forDir bool
}

// occupant says what install may leave of what is already at the name.
type occupant uint8

const (
	// clearAll: nothing may stay but a file the record proves delivered
	// (which the change then replaces atomically or removes).
	clearAll occupant = iota
	// keepDir: a directory stays (mkdir of an existing directory).
	keepDir
	// removeAll: as clearAll, and a delivered file is removed too: a
	// directory renamed into place cannot replace a file.
	removeAll
)

// install makes one change of request q visible at t; see the top of this
// file. create makes it at a free name and fails with EEXIST when the
// name is taken (nil: there is no such fast path); replace makes it over
// whatever makeRoom left.
func (s *Syncer) install(rt *rootState, q request, t target, occ occupant, create, replace func() error) error {
	release, err := s.holdFence(q)
	if err != nil {
		return err
	}
	defer release()
	err = errNoFastPath
	if create != nil {
		err = create()
	}
	// EINVAL: renameat2 flags not supported by the file system.
	if errors.Is(err, errNoFastPath) || errors.Is(err, unix.EEXIST) || errors.Is(err, unix.EINVAL) {
		if err = s.makeRoom(rt, t, q.epoch, occ); err == nil {
			err = replace()
		}
	}
	if err == nil && !t.forDir {
		s.settle(rt, t.rel)
	}
	return err
}

// errNoFastPath: install has no create to try first.
var errNoFastPath = errors.New("syncdir: no fast path")

// holdFence checks that q may change the tree now and keeps it so until
// release is called: no higher epoch can be recorded in between. It is
// the only place a request raises the highest epoch (finding 6), so a
// request refused for any reason before its first change never moves it.
func (s *Syncer) holdFence(q request) (release func(), err error) {
	e := s.epochs
	for {
		e.gate.RLock()
		h := e.get()
		switch {
		case q.epoch < h:
			e.gate.RUnlock()
			return nil, refuse(ReasonStaleEpoch, http.StatusConflict, "epoch %d from %s is below %d", q.epoch, q.node, h)
		case s.fence.Holding():
			e.gate.RUnlock()
			return nil, refuse(ReasonHolding, http.StatusConflict, "this node is or is becoming ACTIVE")
		case q.epoch == h:
			return e.gate.RUnlock, nil
		}
		e.gate.RUnlock()
		if _, err := e.admit(q.epoch); err != nil {
			return nil, err
		}
		s.m.highestEpoch.Set(float64(e.get()))
	}
}

// errNoParent: a directory of the path is missing (or not a directory)
// and parentOf was not asked to make it.
var errNoParent = fmt.Errorf("syncdir: parent directory missing: %w", os.ErrNotExist)

// sameBytes reports whether the local regular file t and the incoming
// content have the same bytes. It reads both: only for a name that is
// taken by a file the record does not prove, never on the fast path.
func sameBytes(t target) bool {
	if t.incoming == nil {
		return false
	}
	in, err := t.incoming()
	if err != nil {
		return false
	}
	defer in.Close()
	local, err := openIn(t.dir, t.name)
	if err != nil {
		return false
	}
	defer local.Close()
	a, err1 := in.Stat()
	b, err2 := local.Stat()
	if err1 != nil || err2 != nil || !a.Mode().IsRegular() || !b.Mode().IsRegular() || a.Size() != b.Size() {
		return false
	}
	bp, bq := copyBufs.Get().(*[]byte), copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	defer copyBufs.Put(bq)
	for off := int64(0); off < a.Size(); {
		n, err1 := in.ReadAt(*bp, off)
		m, err2 := local.ReadAt((*bq)[:n], off)
		if n == 0 || m != n || !bytes.Equal((*bp)[:n], (*bq)[:n]) {
			return false
		}
		if err1 != nil && !errors.Is(err1, io.EOF) || err2 != nil && !errors.Is(err2, io.EOF) {
			return false
		}
		off += int64(n)
	}
	return true
}

// rememberAt records what is now at t as delivered.
func (s *Syncer) rememberAt(rt *rootState, t target) {
	if e, err := statAt(t.dir, t.name); err == nil {
		rt.rec.set(t.rel, e)
	}
}

// durable runs syncChange (the fsyncs that make a change durable) and the
// record's commit side by side, and returns once both are done: a success
// is answered only with the change and its delivery record on disk
// (finding 5), the two fsyncs overlapping.
func durable(rt *rootState, syncChange func() error) error {
	jerr := make(chan error, 1)
	go func() { jerr <- rt.rec.commit() }()
	err := syncChange()
	if e := <-jerr; err == nil {
		err = e
	}
	return err
}

// syncDirFD makes the entries of the directory d (rel dir) durable, with
// group commit per directory.
func syncDirFD(rt *rootState, rel string, d *os.File) error {
	return groupSync(rt, "dir:"+rel, func() error {
		if err := d.Sync(); err != nil {
			return fmt.Errorf("fsync dir: %w", err)
		}
		return nil
	})
}
