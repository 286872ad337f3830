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
			return request{}, nil, refuse("auth", http.StatusUnauthorized, "missing or wrong bearer token")
		}
	}
	q, err := decodeRequest(r)
	if err != nil {
		return q, nil, err
	}
	rt := s.rootByName[q.root]
	if rt == nil || rt.root == nil {
		return q, nil, refuse("unknown-root", http.StatusNotFound, "no root %q here", q.root)
	}
	if h := s.epochs.get(); q.epoch < h {
		return q, nil, refuse("stale-epoch", http.StatusConflict, "epoch %d from %s is below %d", q.epoch, q.node, h)
	}
	if s.fence.Holding() {
		return q, nil, refuse("holding", http.StatusConflict, "this node is or is becoming ACTIVE")
	}
	ok, err := s.epochs.admit(q.epoch)
	if err != nil {
		return q, nil, err
	}
	if !ok {
		return q, nil, refuse("stale-epoch", http.StatusConflict, "epoch %d from %s is below %d", q.epoch, q.node, s.epochs.get())
	}
	s.m.highestEpoch.Set(float64(s.epochs.get()))
	return q, rt, nil
}

func (s *Syncer) apply(w http.ResponseWriter, r *http.Request, rt *rootState, q request) error {
	if q.op != opManifest && q.op != opBatch && (rt.ex.matchAny(q.path, q.op == opMkdir) || (q.to != "" && rt.ex.matchAny(q.to, false))) {
		return refuse("excluded", http.StatusBadRequest, "path %q is excluded here", q.path)
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
	return refuse("bad-request", http.StatusNotFound, "unknown operation")
}

// fail answers an error, counting refusals by reason and failures by kind.
func (s *Syncer) fail(w http.ResponseWriter, r *http.Request, q request, err error) {
	var rf *refusal
	status, reason := http.StatusInternalServerError, ""
	if errors.As(err, &rf) {
		status, reason = rf.status, rf.reason
		s.countRejected(reason)
		s.lg.Warn("sync request refused", zap.String("reason", reason), zap.String("op", string(q.op)),
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
	json.NewEncoder(w).Encode(map[string]string{"error": err.Error(), "reason": reason})
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

// setOwner applies the sender's owner when it sent one and we are root.
// It runs before the mode is set: chown clears setuid bits.
func setOwner(chown func(uid, gid int) error, q request) error {
	if !q.owner || !canChown {
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

func (s *Syncer) recvPut(r *http.Request, rt *rootState, q request) error {
	if err := s.ensureParents(rt, q.path, q.epoch); err != nil {
		return err
	}
	dir := path.Dir(q.path)
	tmp := tempName(dir)
	f, err := rt.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create temp: %w", err)
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
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		t := time.Unix(0, q.mtime)
		err = rt.root.Chtimes(tmp, t, t)
	}
	return s.install(rt, q, tmp, err, q.size)
}

// install puts the prepared temp file (or link) tmp in place of q.path: the
// local file it replaces is quarantined first when the peer never had it,
// the rename is made durable, and the path is recorded as received. prepErr
// is the error of preparing tmp; on any error tmp is removed.
func (s *Syncer) install(rt *rootState, q request, tmp string, prepErr error, size int64) error {
	err := prepErr
	if err == nil {
		err = s.stillAdmitted(q)
	}
	if err == nil {
		err = s.makeRoom(rt, q.path, q.epoch, false)
	}
	if err == nil {
		err = rt.root.Rename(tmp, q.path)
	}
	if err != nil {
		rt.root.Remove(tmp)
		return err
	}
	if err := syncRootDir(rt, path.Dir(q.path)); err != nil {
		return err
	}
	s.remember(rt, q.path)
	s.countReceived(size)
	return nil
}

// stillAdmitted repeats the fence checks of admit just before a file is
// installed: a big or streamed file takes long enough to arrive for this
// node to start taking the active key, or a newer sender to appear, meanwhile.
func (s *Syncer) stillAdmitted(q request) error {
	if h := s.epochs.get(); q.epoch < h {
		return refuse("stale-epoch", http.StatusConflict, "epoch %d from %s fell below %d while the file arrived", q.epoch, q.node, h)
	}
	if s.fence.Holding() {
		return refuse("holding", http.StatusConflict, "this node began taking the active role while the file arrived")
	}
	return nil
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
		return n, q.mtime, refuse("bad-request", http.StatusBadRequest, "body longer than Content-Length")
	} else if !errors.Is(err, io.EOF) {
		return n, q.mtime, fmt.Errorf("write: %w", err)
	}
	if c := trailer.Get(hdrCommit); (c != "" || q.stream) && c != commitOK {
		return n, q.mtime, refuse("source-changed", http.StatusConflict, "the file changed while it was sent")
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
		return 0, refuse("bad-request", http.StatusBadRequest, "stream of %d bytes announced size %q", n, trailer.Get(hdrSize))
	}
	mtime, err := strconv.ParseInt(trailer.Get(hdrMtime), 10, 64)
	if err != nil {
		return 0, refuse("bad-request", http.StatusBadRequest, "bad stream mtime %q", trailer.Get(hdrMtime))
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

// syncRootDir makes the renames in dir durable.
func syncRootDir(rt *rootState, dir string) error {
	return groupSync(rt, "dir:"+dir, func() error { return fsyncDir(rt, dir) })
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

func fsyncDir(rt *rootState, dir string) error {
	d, err := rt.root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir: %w", err)
	}
	return nil
}

func (s *Syncer) remember(rt *rootState, rel string) {
	if fi, err := rt.root.Lstat(rel); err == nil {
		rt.rec.set(rel, entryOf(fi))
	}
}

// ensureParents creates missing parent directories and refuses to go through
// a symlink: os.Root already keeps us inside the root, this keeps us out of
// links that point elsewhere inside it too.
func (s *Syncer) ensureParents(rt *rootState, rel string, epoch int64) error {
	parts := strings.Split(rel, "/")
	for i := 1; i < len(parts); i++ {
		p := strings.Join(parts[:i], "/")
		fi, err := rt.root.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := rt.root.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			s.remember(rt, p)
			continue
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			return refuse("symlink-parent", http.StatusBadRequest, "parent %q of %q is a symlink", p, rel)
		case fi.IsDir():
			continue
		}
		if err := s.makeRoom(rt, p, epoch, false); err != nil {
			return err
		}
		if err := rt.root.Mkdir(p, 0o755); err != nil {
			return err
		}
		s.remember(rt, p)
	}
	return nil
}

// makeRoom clears rel so something new can take its place: a directory is
// emptied (its unconfirmed files quarantined) and removed; a file or link the
// peer never confirmed is quarantined. A confirmed file is left for the
// caller's rename to replace atomically. keepDir leaves a directory in place.
func (s *Syncer) makeRoom(rt *rootState, rel string, epoch int64, keepDir bool) error {
	fi, err := rt.root.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		if keepDir {
			return nil
		}
		return s.clearTree(rt, rel, epoch)
	}
	if s.confirmed(rt, rel, fi) {
		return nil
	}
	return s.quarantine(rt, rel, epoch)
}

func (s *Syncer) confirmed(rt *rootState, rel string, fi fs.FileInfo) bool {
	e, ok := rt.rec.get(rel)
	return ok && e.sameContent(entryOf(fi))
}

// clearTree removes the directory rel after quarantining every file in it
// that the peer never confirmed.
func (s *Syncer) clearTree(rt *rootState, rel string, epoch int64) error {
	var unconfirmed []string
	err := fs.WalkDir(rt.root.FS(), rel, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rt.ex.match(p, d.IsDir()) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if !s.confirmed(rt, p, fi) {
			unconfirmed = append(unconfirmed, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("scan %s: %w", rel, err)
	}
	for _, p := range unconfirmed {
		if err := s.quarantine(rt, p, epoch); err != nil {
			return err
		}
	}
	if err := rt.root.RemoveAll(rel); err != nil {
		return err
	}
	rt.rec.removeTree(rel)
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

func (s *Syncer) quarantine(rt *rootState, rel string, epoch int64) error {
	base := path.Join(quarantineDir, strconv.FormatInt(epoch, 10), rel)
	if err := rt.root.MkdirAll(path.Dir(base), 0o700); err != nil {
		return fmt.Errorf("quarantine: %w", err)
	}
	dst := base
	for i := 1; ; i++ {
		if _, err := rt.root.Lstat(dst); errors.Is(err, fs.ErrNotExist) {
			break
		}
		dst = fmt.Sprintf("%s.%d", base, i)
	}
	if err := rt.root.Rename(rel, dst); err != nil {
		return fmt.Errorf("quarantine: %w", err)
	}
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

func (s *Syncer) recvMkdir(rt *rootState, q request) error {
	if err := s.ensureParents(rt, q.path, q.epoch); err != nil {
		return err
	}
	if err := s.makeRoom(rt, q.path, q.epoch, true); err != nil {
		return err
	}
	fi, err := rt.root.Lstat(q.path)
	if err == nil && !fi.IsDir() {
		if err := rt.root.Remove(q.path); err != nil {
			return err
		}
	}
	if err != nil || !fi.IsDir() {
		if err := rt.root.Mkdir(q.path, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	if err := setOwner(func(u, g int) error { return rt.root.Chown(q.path, u, g) }, q); err != nil {
		return err
	}
	if err := rt.root.Chmod(q.path, fileMode(q.mode)); err != nil {
		return err
	}
	if err := syncRootDir(rt, path.Dir(q.path)); err != nil {
		return err
	}
	s.remember(rt, q.path)
	s.countReceived(0)
	return nil
}

func (s *Syncer) recvDelete(rt *rootState, q request) error {
	if err := s.checkParents(rt, q.path); err != nil {
		return err
	}
	fi, err := rt.root.Lstat(q.path)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		rt.rec.removeTree(q.path)
		return nil
	case err != nil:
		return err
	case fi.IsDir():
		err = s.clearTree(rt, q.path, q.epoch)
	case !s.confirmed(rt, q.path, fi):
		err = s.quarantine(rt, q.path, q.epoch)
	default:
		err = rt.root.Remove(q.path)
		rt.rec.removeTree(q.path)
	}
	if err != nil {
		return err
	}
	if err := syncRootDir(rt, path.Dir(q.path)); err != nil {
		return err
	}
	s.countReceived(0)
	return nil
}

// checkParents refuses a path whose parents include a symlink, without
// creating anything.
func (s *Syncer) checkParents(rt *rootState, rel string) error {
	for d := path.Dir(rel); d != "."; d = path.Dir(d) {
		fi, err := rt.root.Lstat(d)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return refuse("symlink-parent", http.StatusBadRequest, "parent %q of %q is a symlink", d, rel)
		}
	}
	return nil
}

func (s *Syncer) recvRename(rt *rootState, q request) error {
	if err := s.checkParents(rt, q.path); err != nil {
		return err
	}
	if err := s.ensureParents(rt, q.to, q.epoch); err != nil {
		return err
	}
	fi, err := rt.root.Lstat(q.path)
	if err != nil {
		return refuse("rename-source", http.StatusConflict, "rename source %q: %v", q.path, err)
	}
	if !fi.IsDir() && !s.confirmed(rt, q.path, fi) {
		return refuse("rename-source", http.StatusConflict, "rename source %q differs from what was synced", q.path)
	}
	if err := s.makeRoom(rt, q.to, q.epoch, false); err != nil {
		return err
	}
	if err := rt.root.Rename(q.path, q.to); err != nil {
		return err
	}
	rt.rec.renameTree(q.path, q.to)
	if err := syncRootDir(rt, path.Dir(q.to)); err != nil {
		return err
	}
	if path.Dir(q.to) != path.Dir(q.path) {
		if err := syncRootDir(rt, path.Dir(q.path)); err != nil {
			return err
		}
	}
	s.countReceived(0)
	return nil
}

func (s *Syncer) recvSymlink(rt *rootState, q request) error {
	if err := s.ensureParents(rt, q.path, q.epoch); err != nil {
		return err
	}
	dir := path.Dir(q.path)
	tmp := tempName(dir)
	if err := rt.root.Symlink(q.target, tmp); err != nil {
		return err
	}
	err := setOwner(func(u, g int) error { return rt.root.Lchown(tmp, u, g) }, q)
	return s.install(rt, q, tmp, err, 0)
}
