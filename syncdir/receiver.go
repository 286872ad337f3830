package syncdir

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// canChown: only root can give files away; elsewhere owners are not synced.
var canChown = os.Geteuid() == 0

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// ServeHTTP is the receiver. Every request is authenticated (TLS client
// certificate at the handshake and/or bearer token here), decoded, fenced,
// then applied inside the root through an os.Root.
func (s *Syncer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q, rt, err := s.admit(r)
	if err == nil {
		err = s.apply(w, r, rt, q)
	}
	if err != nil {
		s.fail(w, r, q, err)
		return
	}
	if q.op != opManifest && q.op != opBatch {
		w.WriteHeader(http.StatusOK)
	}
}

func (s *Syncer) admit(r *http.Request) (request, *rootState, error) {
	if s.token != "" {
		got := r.Header.Get(hdrToken)
		if subtle.ConstantTimeCompare([]byte(got), []byte("Bearer "+s.token)) != 1 {
			return request{}, nil, refuse(ReasonAuth, http.StatusUnauthorized, "missing or wrong bearer token")
		}
	}
	q, err := decodeRequest(r)
	if err != nil {
		return q, nil, err
	}
	rt := s.rootByName[q.root]
	if rt == nil || rt.root == nil {
		return q, nil, refuse(ReasonUnknownRoot, http.StatusNotFound, "no root %q here", q.root)
	}
	if h := s.epochs.get(); q.epoch < h {
		return q, nil, refuse(ReasonStaleEpoch, http.StatusConflict, "epoch %d from %s is below %d", q.epoch, q.node, h)
	}
	if s.fence.Holding() {
		return q, nil, refuse(ReasonHolding, http.StatusConflict, "this node is or is becoming ACTIVE")
	}
	// The epoch is not recorded here: only the first change of a request
	// that passed every check does that (holdFence), so a request refused
	// later (an excluded path, a bad body) never locks its betters out.
	s.applyPolicy(&q)
	return q, rt, nil
}

func (s *Syncer) apply(w http.ResponseWriter, r *http.Request, rt *rootState, q request) error {
	if q.op != opManifest && q.op != opBatch && (rt.ex.matchAny(q.path, q.op == opMkdir) || (q.to != "" && rt.ex.matchAny(q.to, false))) {
		return refuse(ReasonExcluded, http.StatusBadRequest, "path %q is excluded here", q.path)
	}
	switch q.op {
	case opPut:
		return s.recvPut(r, rt, q)
	case opMkdir:
		return s.recvMkdir(rt, q)
	case opDelete:
		return s.recvDelete(rt, q)
	case opRename:
		return s.recvRename(rt, q)
	case opSymlink:
		return s.recvSymlink(rt, q)
	case opManifest:
		return s.recvManifest(w, r, rt, q)
	case opBatch:
		return s.recvBatch(w, r, rt, q)
	}
	return refuse(ReasonBadRequest, http.StatusNotFound, "unknown operation")
}

// fail answers an error, counting refusals by reason and failures by kind.
func (s *Syncer) fail(w http.ResponseWriter, r *http.Request, q request, err error) {
	var rf *refusal
	status, reason := http.StatusInternalServerError, Reason("")
	if errors.As(err, &rf) {
		status, reason = rf.status, rf.reason
		s.countRejected(reason)
		s.lg.Warn("sync request refused", zap.String("reason", string(reason)), zap.String("op", string(q.op)),
			zap.String("path", q.path), zap.String("from", r.RemoteAddr), zap.Int64("epoch", q.epoch), zap.Error(err))
	} else {
		kind := errKind(err)
		if kind == "disk-full" {
			status = http.StatusInsufficientStorage
		}
		s.countError("recv-" + kind)
		s.lg.Error("sync request failed", zap.String("kind", kind), zap.String("op", string(q.op)),
			zap.String("path", q.path), zap.Error(err))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(errorBody{Error: err.Error(), Reason: reason})
}

func errKind(err error) string {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return "disk-full"
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return "permission"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "truncated"
	}
	return "io"
}

// setOwner gives the new file the sender's owner when the owner policy
// allows it (applyPolicy cleared q.owner otherwise). It runs before the
// mode is set: chown clears setuid bits.
func setOwner(chown func(uid, gid int) error, q request) error {
	if !q.owner {
		return nil
	}
	if err := chown(int(q.uid), int(q.gid)); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	return nil
}

func tempName(dir string) string {
	var b [8]byte
	rand.Read(b[:])
	return path.Join(dir, tempPrefix+hex.EncodeToString(b[:]))
}

// prepDir opens the directory to prepare rel's content in, out of sight
// under a temp name (or unnamed): rel's parent, or while that is missing,
// the nearest directory above it that exists, on the same file system as
// the directories install will make below it. So nothing, not even a
// directory, appears before install (finding 4: a refused or cut request
// leaves no empty directory). dirRel is the directory opened.
func (s *Syncer) prepDir(rt *rootState, q request, rel string) (d *os.File, dirRel string, err error) {
	for {
		d, err := s.parentOf(rt, q, rel, false)
		if !errors.Is(err, errNoParent) {
			return d, path.Dir(rel), err
		}
		rel = path.Dir(rel)
	}
}

func (s *Syncer) recvPut(r *http.Request, rt *rootState, q request) error {
	tmpDir, dirRel, err := s.prepDir(rt, q, q.path)
	if err != nil {
		return err
	}
	defer tmpDir.Close()
	f, tmp, err := createIn(tmpDir, 0o600)
	if err != nil {
		return err
	}
	start := time.Now()
	err = setOwner(f.Chown, q)
	if err == nil {
		q.size, q.mtime, err = writeBody(f, r.Body, r.Trailer, q)
	}
	if ce := s.lg.Check(zap.DebugLevel, "sync put received"); ce != nil {
		ce.Write(zap.String("path", q.path), zap.Int64("size", q.size), zap.Bool("stream", q.stream),
			zap.Time("start", start), zap.Duration("took", time.Since(start)))
	}
	if err == nil {
		err = setMtime(f, q.mtime)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = s.place(rt, q, tmpDir, dirRel, tmp)
	}
	if err != nil {
		unix.Unlinkat(int(tmpDir.Fd()), tmp, 0)
		return err
	}
	s.countReceived(q.size)
	return nil
}

// place installs the prepared temp file (or link) tmp, in the directory
// tmpDir (dirRel), as q.path, makes the rename durable and records the
// path as received.
func (s *Syncer) place(rt *rootState, q request, tmpDir *os.File, dirRel, tmp string) error {
	dir := tmpDir
	if dirRel != path.Dir(q.path) {
		var err error
		if dir, err = s.parentOf(rt, q, q.path, true); err != nil {
			return err
		}
		defer dir.Close()
	}
	t := target{rel: q.path, dir: dir, name: path.Base(q.path)}
	if q.op == opPut {
		t.incoming = func() (*os.File, error) { return openIn(tmpDir, tmp) }
	}
	err := s.install(rt, q, t, clearAll,
		func() error { return renameNoReplace(tmpDir, tmp, dir, t.name) },
		func() error { return renameAt(tmpDir, tmp, dir, t.name) })
	if err != nil {
		return err
	}
	s.rememberAt(rt, t)
	return durable(rt, func() error { return syncDirFD(rt, path.Dir(q.path), dir) })
}

// writeBody copies the body (exactly q.size bytes, or for a stream all of
// it and then checks the size in the trailer), sets the mode and fsyncs; it
// returns the file's size and mtime. A short body (truncated, cancelled
// sender) is an error, never a short file.
func writeBody(f *os.File, body io.Reader, trailer http.Header, q request) (int64, int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	wb := &writeBehind{f: f}
	defer wb.wait()
	src := body
	if !q.stream {
		src = io.LimitReader(body, q.size)
	}
	var n int64
	var err error
	if q.stream || q.size >= bulkMin {
		n, err = pipeCopy(wb, src)
	} else {
		n, err = io.CopyBuffer(wb, src, *bp)
	}
	if err != nil {
		return n, q.mtime, fmt.Errorf("write: %w", err)
	}
	if !q.stream && n != q.size {
		return n, q.mtime, fmt.Errorf("write: body ended after %d of %d bytes: %w", n, q.size, io.ErrUnexpectedEOF)
	}
	// Read to the end so the trailer arrives; a sender that saw its file
	// change while reading says so there.
	if _, err := io.CopyN(io.Discard, body, 1); err == nil {
		return n, q.mtime, refuse(ReasonBadRequest, http.StatusBadRequest, "body longer than Content-Length")
	} else if !errors.Is(err, io.EOF) {
		return n, q.mtime, fmt.Errorf("write: %w", err)
	}
	if c := trailer.Get(hdrCommit); (c != "" || q.stream) && c != commitOK {
		return n, q.mtime, refuse(ReasonSourceChanged, http.StatusConflict, "the file changed while it was sent")
	}
	mtime, err := streamEnd(trailer, q, n)
	if err != nil {
		return n, q.mtime, err
	}
	if err := f.Chmod(fileMode(q.mode)); err != nil {
		return n, mtime, err
	}
	if err := wb.wait(); err != nil {
		return n, mtime, fmt.Errorf("fdatasync: %w", err)
	}
	if err := f.Sync(); err != nil {
		return n, mtime, fmt.Errorf("fsync: %w", err)
	}
	return n, mtime, nil
}

// pipeCopy copies a big body with the reads (network, TLS) and the writes
// (file, write-behind) on two goroutines: on one, a big file's receiver is
// one long chain of system calls and decryption, the longest of the
// transfer; split, the two halves overlap on two cores.
func pipeCopy(dst io.Writer, src io.Reader) (int64, error) {
	const nbuf = 4
	free, full := make(chan *[]byte, nbuf), make(chan []byte, nbuf)
	for range nbuf {
		free <- pipeBufs.Get().(*[]byte)
	}
	var failed atomic.Bool
	werr := make(chan error, 1)
	go func() {
		var err error
		for b := range full {
			if err == nil {
				if _, err = dst.Write(b); err != nil {
					failed.Store(true)
				}
			}
			b = b[:cap(b)]
			free <- &b
		}
		werr <- err
	}()
	var n int64
	var rerr error
	for !failed.Load() {
		bp := <-free
		k, err := io.ReadFull(src, *bp)
		n += int64(k)
		if k > 0 {
			full <- (*bp)[:k]
		} else {
			free <- bp
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				rerr = err
			}
			break
		}
	}
	close(full)
	err := <-werr
	for range nbuf {
		pipeBufs.Put(<-free)
	}
	if err != nil {
		return n, err
	}
	return n, rerr
}

var pipeBufs = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

// streamEnd checks a streamed put's trailers against the n bytes received
// and returns the mtime to give the file. The size must match exactly: a
// stream cut short by the sender never becomes a short file.
func streamEnd(trailer http.Header, q request, n int64) (int64, error) {
	if !q.stream {
		return q.mtime, nil
	}
	size, err := strconv.ParseInt(trailer.Get(hdrSize), 10, 64)
	if err != nil || size != n {
		return 0, refuse(ReasonBadRequest, http.StatusBadRequest, "stream of %d bytes announced size %q", n, trailer.Get(hdrSize))
	}
	mtime, err := strconv.ParseInt(trailer.Get(hdrMtime), 10, 64)
	if err != nil {
		return 0, refuse(ReasonBadRequest, http.StatusBadRequest, "bad stream mtime %q", trailer.Get(hdrMtime))
	}
	return mtime, nil
}

// writeBehind writes a big file back to disk while it is still being
// received: each chunk is submitted once written, and the chunk before it
// is waited for, so at most two chunks are ever dirty. On top, an
// fdatasync runs in the background every syncEvery bytes, so the disk's
// own cache is flushed as the file grows and the final fsync only has the
// tail left. The waits cost nothing while the disk keeps up with the
// network, and hold the receiver back (flow control) when not.
type writeBehind struct {
	f       *os.File
	off     int64
	flushed int64 // submitted up to here
	waited  int64 // written to the device up to here
	synced  int64 // covered by the last background fdatasync started
	bg      chan struct{}
	bgErr   error // set by the background fdatasync before bg is closed
}

const (
	writeBehindChunk = 4 << 20
	syncEvery        = 32 << 20
)

func (w *writeBehind) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.off += int64(n)
	if w.off-w.flushed < writeBehindChunk {
		return n, err
	}
	// Advisory: an error only means the final fsync does all the work.
	fd := int(w.f.Fd())
	unix.SyncFileRange(fd, w.flushed, w.off-w.flushed, unix.SYNC_FILE_RANGE_WRITE)
	if w.flushed > w.waited {
		unix.SyncFileRange(fd, w.waited, w.flushed-w.waited,
			unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
		w.waited = w.flushed
	}
	w.flushed = w.off
	if w.waited-w.synced >= syncEvery && w.idle() {
		w.synced = w.waited
		ch := make(chan struct{})
		w.bg = ch
		go func() {
			defer close(ch)
			if err := unix.Fdatasync(fd); err != nil {
				w.bgErr = err
			}
		}()
	}
	return n, err
}

func (w *writeBehind) idle() bool {
	if w.bg == nil {
		return true
	}
	select {
	case <-w.bg:
		return w.bgErr == nil // after an error, leave it all to the final fsync
	default:
		return false
	}
}

// wait returns once no background fdatasync runs, with its error: the
// kernel reports a write-back error once per open file, so an error seen
// there would be missing from the final fsync.
func (w *writeBehind) wait() error {
	if w.bg != nil {
		<-w.bg
	}
	return w.bgErr
}

// syncRootFS makes everything written to the root's file system durable
// with one syncfs(2): for a batch, one journal commit instead of one per
// file, which also spares every other writer on that file system the
// stalls of back-to-back commits. The descriptor stays open from Run on,
// so a write-back error since the previous call is reported (Linux 5.8+).
func syncRootFS(rt *rootState) error {
	return groupSync(rt, "fs", func() error {
		if err := unix.Syncfs(int(rt.fsFD.Fd())); err != nil {
			return fmt.Errorf("syncfs: %w", err)
		}
		return nil
	})
}

// groupSync runs fn for key with group commit: a caller waits for a run
// that started after it called, and whoever finds none running starts it,
// so concurrent callers share one fsync.
func groupSync(rt *rootState, key string, fn func() error) error {
	rt.dmu.Lock()
	g := rt.dirSyncs[key]
	if g == nil {
		g = &dirSync{}
		g.cond = sync.NewCond(&rt.dmu)
		rt.dirSyncs[key] = g
	}
	target := g.started + 1
	for g.finished < target {
		if g.running {
			g.cond.Wait()
			continue
		}
		g.running = true
		g.started++
		n := g.started
		rt.dmu.Unlock()
		err := fn()
		rt.dmu.Lock()
		g.running, g.finished, g.err = false, n, err
		g.cond.Broadcast()
	}
	err := g.err
	if !g.running && g.finished == g.started {
		delete(rt.dirSyncs, key) // idle: do not keep one per directory forever
	}
	rt.dmu.Unlock()
	return err
}

type dirSync struct {
	cond              *sync.Cond
	running           bool
	started, finished uint64
	err               error
}

// makeRoom clears t so something new can take its place: a directory is
// emptied (what the peer never confirmed quarantined) and removed, unless
// occ keeps it; a file or link the peer never confirmed is quarantined. A
// confirmed file is left for the caller's change to replace atomically.
func (s *Syncer) makeRoom(rt *rootState, t target, epoch int64, occ occupant) error {
	e, err := statAt(t.dir, t.name)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	if e.Kind == 'd' {
		if occ == keepDir {
			return nil
		}
		return s.clearTree(rt, t, epoch)
	}
	if s.confirmed(rt, t.rel, e) || e.Kind == 'f' && sameBytes(t) {
		if occ == removeAll {
			rt.rec.removeTree(t.rel)
			return unlinkIn(t.dir, t.name, t.rel, false)
		}
		return nil
	}
	return s.quarantine(rt, t.dir, t.name, t.rel, epoch)
}

func (s *Syncer) confirmed(rt *rootState, rel string, local entry) bool {
	e, ok := rt.rec.get(rel)
	return ok && e.proves(local)
}

// clearTree removes the directory t after quarantining every entry in it
// that the peer never confirmed, excluded ones included: an excluded name
// (*.tmp, cache/, logs/ ...) never travels, so it can only be this node's
// own data (finding 2). Only our own temp files go without quarantine.
// It works on descriptors all the way down (finding 9): a directory
// swapped for a link meanwhile is not followed.
func (s *Syncer) clearTree(rt *rootState, t target, epoch int64) error {
	d, err := openSubdir(t.dir, t.name, t.rel)
	if err != nil {
		return err
	}
	err = s.clearDir(rt, d, t.rel, epoch)
	d.Close()
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(int(t.dir.Fd()), t.name, unix.AT_REMOVEDIR); err != nil {
		return &os.PathError{Op: "rmdir", Path: t.rel, Err: err}
	}
	rt.rec.removeTree(t.rel)
	return nil
}

// clearDir empties the directory d (at rel); see clearTree.
func (s *Syncer) clearDir(rt *rootState, d *os.File, rel string, epoch int64) error {
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("scan %s: %w", rel, err)
	}
	for _, name := range names {
		p := path.Join(rel, name)
		e, err := statAt(d, name)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return err
		}
		switch {
		case reserved(p): // a temp file of ours: nobody's data
			err = unlinkIn(d, name, p, false)
		case rt.ex.match(p, e.Kind == 'd'), e.Kind != 'd' && !s.confirmed(rt, p, e):
			err = s.quarantine(rt, d, name, p, epoch) // a directory goes as a whole
		case e.Kind == 'd':
			var sub *os.File
			if sub, err = openSubdir(d, name, p); err == nil {
				err = s.clearDir(rt, sub, p, epoch)
				sub.Close()
			}
			if err == nil {
				err = unlinkIn(d, name, p, true)
			}
		default:
			err = unlinkIn(d, name, p, false)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func openSubdir(d *os.File, name, rel string) (*os.File, error) {
	fd, err := unix.Openat(int(d.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "openat", Path: rel, Err: err}
	}
	return os.NewFile(uintptr(fd), rel), nil
}

func unlinkIn(d *os.File, name, rel string, dir bool) error {
	flags := 0
	if dir {
		flags = unix.AT_REMOVEDIR
	}
	if err := unix.Unlinkat(int(d.Fd()), name, flags); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "unlinkat", Path: rel, Err: err}
	}
	return nil
}

// QuarantinedFile is one local file moved aside instead of being lost.
type QuarantinedFile struct {
	Root  string    `json:"root"`
	Path  string    `json:"path"`
	Moved string    `json:"moved_to"`
	Epoch int64     `json:"epoch"`
	At    time.Time `json:"at"`
}

// quarantine moves the entry name of the directory d (at rel) to
// <root>/.hapair-quarantine/<epoch>/<rel>, by descriptors; a name taken
// there by an earlier one gets a suffix .1, .2, ...
func (s *Syncer) quarantine(rt *rootState, d *os.File, name, rel string, epoch int64) error {
	qd, qrel, err := quarantineDirFor(rt, epoch, path.Dir(rel))
	if err != nil {
		return fmt.Errorf("quarantine: %w", err)
	}
	defer qd.Close()
	dst := name
	for i := 1; ; i++ {
		err := renameNoReplace(d, name, qd, dst)
		if err == nil {
			break
		}
		if errors.Is(err, unix.EINVAL) { // no RENAME_NOREPLACE here
			if _, serr := statAt(qd, dst); errors.Is(serr, unix.ENOENT) {
				if err := renameAt(d, name, qd, dst); err != nil {
					return fmt.Errorf("quarantine: %w", err)
				}
				break
			}
			err = unix.EEXIST
		}
		if !errors.Is(err, unix.EEXIST) || i > 1000 {
			return fmt.Errorf("quarantine: %w", err)
		}
		dst = fmt.Sprintf("%s.%d", name, i)
	}
	dst = path.Join(qrel, dst)
	rt.rec.removeTree(rel)
	q := QuarantinedFile{Root: rt.name, Path: rel, Moved: path.Join(rt.abs, dst), Epoch: epoch, At: time.Now().UTC()}
	s.m.quarantined.Inc()
	s.st.quarantined.Add(1)
	s.m.inQuarantine.WithLabelValues(rt.name).Set(float64(rt.inQuarantine.Add(1)))
	s.qmu.Lock()
	s.quarantined = append(s.quarantined, q)
	if len(s.quarantined) > maxQuarantineList {
		s.quarantined = s.quarantined[len(s.quarantined)-maxQuarantineList:]
	}
	s.qmu.Unlock()
	s.lg.Warn("local file never delivered to the peer moved to quarantine",
		zap.String("root", rt.name), zap.String("path", rel), zap.String("moved_to", q.Moved), zap.Int64("epoch", epoch))
	return nil
}

const maxQuarantineList = 100

// chmodDir gives the directory d the mode sent (already through the
// policy: permission bits only), unless its permission bits are that
// already: then it is left alone, a setgid bit it has here included. A
// non-root receiver does not own the application's directories, and
// chmod(2) by anyone but the owner fails (the deployment on systemd hosts
// failed on "chmod w: operation not permitted" after its first
// switchover); the setgid bit of a directory under a setgid synced root
// is inherited here, not sent, and is what gives the application's and
// the receiver's files one group. Where the mode must change the setgid
// bit goes (as before): hapair-roled's unit has RestrictSUIDSGID=yes, which
// refuses any chmod that sets it.
func chmodDir(d *os.File, mode uint32) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(d.Fd()), &st); err != nil {
		return &os.PathError{Op: "fstat", Path: d.Name(), Err: err}
	}
	if st.Mode&^unix.S_ISGID&0o7777 == mode {
		return nil
	}
	return d.Chmod(fileMode(mode))
}

func (s *Syncer) recvMkdir(rt *rootState, q request) error {
	dir, err := s.parentOf(rt, q, q.path, true)
	if err != nil {
		return err
	}
	defer dir.Close()
	t := target{rel: q.path, dir: dir, name: path.Base(q.path)}
	// Made 0700 and opened again without following a link to set owner and
	// mode, inside the fence like the mkdir itself.
	attrs := func() error {
		fd, err := unix.Openat(int(dir.Fd()), t.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return &os.PathError{Op: "openat", Path: q.path, Err: err}
		}
		d := os.NewFile(uintptr(fd), q.path)
		defer d.Close()
		if err := setOwner(d.Chown, q); err != nil {
			return err
		}
		return chmodDir(d, q.mode)
	}
	err = s.install(rt, q, t, keepDir,
		func() error {
			if err := unix.Mkdirat(int(dir.Fd()), t.name, 0o700); err != nil {
				return err
			}
			return attrs()
		},
		func() error {
			if err := replaceWithDir(t, 0o700); err != nil {
				return err
			}
			return attrs()
		})
	if err != nil {
		return err
	}
	s.rememberAt(rt, t)
	if err := durable(rt, func() error { return syncDirFD(rt, path.Dir(q.path), dir) }); err != nil {
		return err
	}
	s.countReceived(0)
	return nil
}

func (s *Syncer) recvDelete(rt *rootState, q request) error {
	dir, err := s.parentOf(rt, q, q.path, false)
	if errors.Is(err, errNoParent) {
		rt.rec.removeTree(q.path)
		return nil
	}
	if err != nil {
		return err
	}
	defer dir.Close()
	t := target{rel: q.path, dir: dir, name: path.Base(q.path)}
	// makeRoom quarantines or removes all but a delivered file, which goes
	// here.
	err = s.install(rt, q, t, clearAll, nil, func() error {
		if err := unix.Unlinkat(int(dir.Fd()), t.name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return &os.PathError{Op: "unlinkat", Path: q.path, Err: err}
		}
		rt.rec.removeTree(q.path)
		return nil
	})
	if err != nil {
		return err
	}
	if err := durable(rt, func() error { return syncDirFD(rt, path.Dir(q.path), dir) }); err != nil {
		return err
	}
	s.countReceived(0)
	return nil
}

func (s *Syncer) recvRename(rt *rootState, q request) error {
	// No rename(2) moves a directory into itself or over an ancestor of
	// its source; clearing the target would remove the source.
	if q.to == q.path || strings.HasPrefix(q.to, q.path+"/") || strings.HasPrefix(q.path, q.to+"/") {
		return refuse(ReasonBadRequest, http.StatusBadRequest, "cannot rename %q to %q", q.path, q.to)
	}
	from, err := s.parentOf(rt, q, q.path, false)
	if err != nil {
		if errors.Is(err, errNoParent) {
			return refuse(ReasonRenameSource, http.StatusConflict, "rename source %q: %v", q.path, err)
		}
		return err
	}
	defer from.Close()
	fromName := path.Base(q.path)
	e, err := statAt(from, fromName)
	if err != nil {
		return refuse(ReasonRenameSource, http.StatusConflict, "rename source %q: %v", q.path, err)
	}
	if e.Kind != 'd' && !s.confirmed(rt, q.path, e) {
		return refuse(ReasonRenameSource, http.StatusConflict, "rename source %q differs from what was synced", q.path)
	}
	to, err := s.parentOf(rt, q, q.to, true)
	if err != nil {
		return err
	}
	defer to.Close()
	t := target{rel: q.to, dir: to, name: path.Base(q.to)}
	occ := clearAll
	if e.Kind == 'd' {
		occ = removeAll
	}
	err = s.install(rt, q, t, occ,
		func() error { return renameNoReplace(from, fromName, to, t.name) },
		func() error { return renameAt(from, fromName, to, t.name) })
	if err != nil {
		return err
	}
	rt.rec.renameTree(q.path, q.to)
	err = durable(rt, func() error {
		if err := syncDirFD(rt, path.Dir(q.to), to); err != nil {
			return err
		}
		if path.Dir(q.to) != path.Dir(q.path) {
			return syncDirFD(rt, path.Dir(q.path), from)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.countReceived(0)
	return nil
}

func (s *Syncer) recvSymlink(rt *rootState, q request) error {
	tmpDir, dirRel, err := s.prepDir(rt, q, q.path)
	if err != nil {
		return err
	}
	defer tmpDir.Close()
	tmp := path.Base(tempName("."))
	if err := unix.Symlinkat(q.target, int(tmpDir.Fd()), tmp); err != nil {
		return &os.LinkError{Op: "symlinkat", Old: q.target, New: tmp, Err: err}
	}
	err = setOwner(func(u, g int) error { return unix.Fchownat(int(tmpDir.Fd()), tmp, u, g, unix.AT_SYMLINK_NOFOLLOW) }, q)
	if err == nil {
		err = s.place(rt, q, tmpDir, dirRel, tmp)
	}
	if err != nil {
		unix.Unlinkat(int(tmpDir.Fd()), tmp, 0)
		return err
	}
	s.countReceived(0)
	return nil
}
