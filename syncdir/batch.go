package syncdir

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// A batch put carries many small files in one request, so a burst costs a
// few requests and a few rounds of fsync instead of one of each per file.
//
//	PUT /v1/batch/<root>?n=N
//	body = N times: header line "\n"-terminated + content
//	header = path=P&mode=0644&mtime=NS&size=S[&uid=U&gid=G] (URL query syntax)
//	         or "skip=1": no file (the sender could not read it after all)
//
// The receiver writes every file to a temp file, fsyncs them all together,
// renames them, fsyncs each parent directory once, and only then answers
// 200 with one result per file, in order. A refused or failed file does
// not stop the others; a body that breaks the framing (truncated, bad
// header) fails the whole batch and leaves nothing behind.
const (
	batchMaxFiles    = 256      // files per batch
	batchMaxBytes    = 4 << 20  // content bytes per batch (sender side)
	batchFileMax     = 64 << 10 // larger files go as a streamed put
	batchMaxHeader   = 16 << 10 // one file's header line
	batchMaxBody     = 24 << 20 // receiver's cap on a whole batch body
	batchSyncWorkers = 64       // fsyncs in flight per batch
)

// batchSkip stands in for a file the sender announced in n but could not
// read when its turn came: the body is streamed, so n is fixed before the
// files are read.
const batchSkip = "skip=1\n"

// errSkipped marks a skip entry: nothing to do, nothing to count.
var errSkipped = errors.New("syncdir: skipped by the sender")

// batchResult is the receiver's verdict on one file of a batch.
type batchResult struct {
	Status int    `json:"status"`
	Reason Reason `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}

type batchResp struct {
	Results []batchResult `json:"results"`
}

func decodeBatchArgs(v url.Values, q *request) error {
	for k := range v {
		if k != "n" {
			return refuse(ReasonBadRequest, http.StatusBadRequest, "unknown parameter %q", k)
		}
	}
	n, err := strconv.Atoi(v.Get("n"))
	if err != nil || n < 1 || n > batchMaxFiles {
		return refuse(ReasonBadRequest, http.StatusBadRequest, "batch n must be 1-%d, got %q", batchMaxFiles, v.Get("n"))
	}
	q.count = n
	return nil
}

// appendBatchHeader encodes one file's header line.
func appendBatchHeader(b []byte, rel string, e entry) []byte {
	v := url.Values{"path": {rel}, "mode": {strconv.FormatUint(uint64(e.Mode), 8)},
		"mtime": {strconv.FormatInt(e.Mtime, 10)}, "size": {strconv.FormatInt(e.Size, 10)}}
	owner(v, e)
	b = append(b, v.Encode()...)
	return append(b, '\n')
}

// readBatchHeader reads one header line. The returned error is a framing
// error (the batch cannot be read further); a file that is only refused
// comes back with its size (so its content can be skipped) and ferr set.
func readBatchHeader(br *bufio.Reader, batch request) (q request, ferr error, err error) {
	line, err := br.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return q, nil, refuse(ReasonBadRequest, http.StatusBadRequest, "batch header longer than %d bytes", batchMaxHeader)
	case errors.Is(err, io.EOF):
		return q, nil, fmt.Errorf("batch body ended in a header: %w", io.ErrUnexpectedEOF)
	case err != nil:
		return q, nil, fmt.Errorf("read batch: %w", err)
	}
	if string(line) == batchSkip {
		return request{op: opPut, root: batch.root, epoch: batch.epoch, node: batch.node}, errSkipped, nil
	}
	v, err := url.ParseQuery(string(bytes.TrimSuffix(line, []byte("\n"))))
	if err != nil {
		return q, nil, refuse(ReasonBadRequest, http.StatusBadRequest, "bad batch header: %v", err)
	}
	sz := v["size"]
	if len(sz) != 1 {
		return q, nil, refuse(ReasonBadRequest, http.StatusBadRequest, "batch header needs one size")
	}
	size, err := strconv.ParseInt(sz[0], 10, 64)
	if err != nil || size < 0 || size > batchMaxBody {
		return q, nil, refuse(ReasonBadRequest, http.StatusBadRequest, "bad batch size %q", sz[0])
	}
	delete(v, "size")
	q = request{op: opPut, root: batch.root, epoch: batch.epoch, node: batch.node, size: size}
	for k, vs := range v {
		if len(vs) != 1 {
			return q, refuse(ReasonBadRequest, http.StatusBadRequest, "parameter %q given %d times", k, len(vs)), nil
		}
	}
	return q, decodeArgs(v, &q), nil
}

// batchItem is one file of a batch on its way through the receiver.
type batchItem struct {
	q request
	// tmpDir holds the file until install: its directory, or while that
	// is missing the nearest one above it (prepDir); from the batch's dirSet.
	tmpDir *os.File
	dir    *os.File // its directory, once known (at the latest in commitBatch)
	tmp    string   // temp file name in tmpDir, "" once renamed or removed
	f      *os.File // open until synced, an unnamed one until linked
	// anon: f is unnamed (O_TMPFILE) and must stay open until it is linked.
	anon bool
	ent  entry // the temp file as written, recorded once it is in place
	err  error
}

func (s *Syncer) recvBatch(w http.ResponseWriter, r *http.Request, rt *rootState, q request) error {
	var tl [4]time.Time
	tl[0] = time.Now()
	dirs := newDirSet(rt)
	defer dirs.close()
	items, err := s.readBatch(w, r, rt, q, dirs)
	if err != nil {
		for i := range items {
			items[i].discard()
		}
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return refuse(ReasonTooLarge, http.StatusRequestEntityTooLarge, "batch body over %d bytes", mbe.Limit)
		}
		return err
	}
	tl[1] = time.Now()
	syncBatch(rt, items)
	tl[2] = time.Now()
	s.commitBatch(rt, items, dirs)
	tl[3] = time.Now()
	if ce := s.lg.Check(zap.DebugLevel, "sync batch applied"); ce != nil {
		ce.Write(zap.Int("files", len(items)), zap.Bool("syncfs", rt.bySyncfs(len(items))), zap.Time("start", tl[0]),
			zap.Duration("read", tl[1].Sub(tl[0])), zap.Duration("durable", tl[2].Sub(tl[1])), zap.Duration("renamed", tl[3].Sub(tl[2])))
	}
	resp := batchResp{Results: make([]batchResult, len(items))}
	for i := range items {
		resp.Results[i] = s.batchVerdict(r, rt, &items[i])
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(resp)
}

// readBatch writes every file of the body to its temp file.
func (s *Syncer) readBatch(w http.ResponseWriter, r *http.Request, rt *rootState, q request, dirs *dirSet) ([]batchItem, error) {
	br := bufio.NewReaderSize(http.MaxBytesReader(w, r.Body, batchMaxBody), batchMaxHeader)
	items := make([]batchItem, 0, q.count)
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	for range q.count {
		fq, ferr, err := readBatchHeader(br, q)
		if err != nil {
			return items, err
		}
		if ferr == nil {
			s.applyPolicy(&fq)
		}
		it := batchItem{q: fq, err: ferr}
		body := &io.LimitedReader{R: br, N: fq.size}
		if it.err == nil {
			it.err = s.prepBatchFile(rt, &it, body, dirs, *bp)
		}
		if it.f != nil && !it.anon && rt.bySyncfs(q.count) {
			// syncfs needs no descriptor: do not hold hundreds open
			// (an unnamed file has to stay open until it is linked).
			if err := it.f.Close(); err != nil && it.err == nil {
				it.err = err
			}
			it.f = nil
		}
		if _, err := io.CopyBuffer(io.Discard, body, *bp); err != nil {
			items = append(items, it)
			return items, fmt.Errorf("read batch: %w", err)
		}
		items = append(items, it)
		if body.N != 0 {
			return items, fmt.Errorf("batch body ended inside %q: %w", fq.path, io.ErrUnexpectedEOF)
		}
		if f := s.afterBatchFile.Load(); f != nil {
			(*f)()
		}
	}
	if _, err := br.ReadByte(); err == nil {
		return items, refuse(ReasonBadRequest, http.StatusBadRequest, "batch body longer than its %d files", q.count)
	} else if !errors.Is(err, io.EOF) {
		return items, fmt.Errorf("read batch: %w", err)
	}
	return items, nil
}

// prepBatchFile writes one file to an unnamed file (or a temp file) in the
// directory of its final name; the file stays open for syncBatch.
func (s *Syncer) prepBatchFile(rt *rootState, it *batchItem, body io.Reader, dirs *dirSet, buf []byte) error {
	q := it.q
	if rt.ex.matchAny(q.path, false) {
		return refuse(ReasonExcluded, http.StatusBadRequest, "path %q is excluded here", q.path)
	}
	dir := path.Dir(q.path)
	d, err := dirs.open(dir)
	if err == nil {
		it.dir = d
	} else if d, err = dirs.prepDir(s, q); err != nil {
		// A symlink on the way; a missing directory or a file in the way
		// is for install to deal with.
		return err
	}
	it.tmpDir = d
	f, anon, err := createAnonIn(d, q.mode)
	if err != nil {
		return err
	}
	if anon {
		it.f, it.anon = f, true
	} else if it.f, it.tmp, err = createIn(d, q.mode); err != nil {
		return err
	}
	f = it.f
	// A plain writer: *os.File's ReadFrom would allocate a buffer per file.
	n, err := io.CopyBuffer(struct{ io.Writer }{f}, body, buf)
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if n != q.size {
		return fmt.Errorf("write: body ended after %d of %d bytes: %w", n, q.size, io.ErrUnexpectedEOF)
	}
	if err := setMtime(f, q.mtime); err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	it.ent, err = fixOwnerMode(f, entryOf(fi), q)
	return err
}

// fixOwnerMode gives the new file f (now as e) the owner and mode of q
// where they differ, and returns its entry. Usually they already match (the
// same owner, the mode it was created with), which spares two inode updates
// per file; chown comes first because it clears setuid bits.
func fixOwnerMode(f *os.File, e entry, q request) (entry, error) {
	chowned := false
	if q.owner && (e.Uid != q.uid || e.Gid != q.gid) {
		if err := setOwner(f.Chown, q); err != nil {
			return e, err
		}
		e.Uid, e.Gid, chowned = q.uid, q.gid, true
	}
	if chowned || e.Mode != q.mode {
		if err := f.Chmod(fileMode(q.mode)); err != nil {
			return e, err
		}
		e.Mode = q.mode
	}
	return e, nil
}

// discard removes what is left of a failed (or unsent) file.
func (it *batchItem) discard() {
	if it.f != nil {
		it.f.Close()
		it.f = nil
	}
	if it.tmp != "" {
		unix.Unlinkat(int(it.tmpDir.Fd()), it.tmp, 0)
		it.tmp = ""
	}
}

// bySyncfs: a batch of n files is made durable with one syncfs (one
// journal commit), a smaller one with parallel fsyncs (sync.syncfs-min-files).
func (rt *rootState) bySyncfs(n int) bool { return rt.syncfsMin > 0 && n >= rt.syncfsMin }

// syncBatch makes the content of every prepared file durable. Parallel
// fsyncs: the journal commits many at once, so N files cost about as much
// as a few; syncfs: one commit for the whole batch.
func syncBatch(rt *rootState, items []batchItem) {
	if rt.bySyncfs(len(items)) {
		if err := syncRootFS(rt); err != nil {
			for i := range items {
				if items[i].err == nil {
					items[i].err = err
				}
			}
		}
		return
	}
	work := make(chan *batchItem)
	var wg sync.WaitGroup
	for range min(batchSyncWorkers, len(items)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range work {
				if err := it.f.Sync(); err != nil {
					it.err = fmt.Errorf("fsync: %w", err)
				}
				if it.anon {
					continue // closed once linked
				}
				if err := it.f.Close(); err != nil && it.err == nil {
					it.err = err
				}
				it.f = nil
			}
		}()
	}
	for i := range items {
		if it := &items[i]; it.err == nil && it.f != nil {
			work <- it
		}
	}
	close(work)
	wg.Wait()
}

// commitBatch installs the durable files (quarantining what they replace
// when the peer never had it) and fsyncs each directory once.
func (s *Syncer) commitBatch(rt *rootState, items []batchItem, ds *dirSet) {
	dirs := map[*os.File][]*batchItem{}
	for i := range items {
		it := &items[i]
		if it.err != nil {
			it.discard()
			continue
		}
		if err := s.installBatchFile(rt, it, ds); err != nil {
			it.err = err
			it.discard()
			continue
		}
		dirs[it.dir] = append(dirs[it.dir], it)
		// Stat again: linking or renaming changed the inode's ctime.
		if e, err := statAt(it.dir, path.Base(it.q.path)); err == nil {
			rt.rec.set(it.q.path, e)
		}
	}
	var err error
	if n := installed(dirs); rt.bySyncfs(n) && rt.journalOnFS {
		// One syncfs makes the renames and the delivery record durable
		// (syncBatchDirs would run the same syncfs beside an fdatasync).
		err = rt.rec.commitWith(func() error { return syncRootFS(rt) })
	} else {
		err = durable(rt, func() error { syncBatchDirs(rt, dirs); return nil })
	}
	for _, its := range dirs {
		for _, it := range its {
			if it.err == nil {
				it.err = err
			}
			if it.err == nil {
				s.countReceived(it.q.size)
			}
		}
	}
}

// installBatchFile gives a durable file its final name through install.
// An unnamed file is linked straight to a free name, a temp file renamed
// without replacing; a taken name gets a temp name and rename(2), which
// replaces atomically, once makeRoom has dealt with what is there.
func (s *Syncer) installBatchFile(rt *rootState, it *batchItem, ds *dirSet) error {
	if it.dir == nil {
		d, err := ds.open(path.Dir(it.q.path))
		if err != nil {
			// Its directory is missing (or a file is in the way): install
			// makes it now, and the other files of the batch find it.
			if d, err = s.parentOf(rt, it.q, it.q.path, true); err != nil {
				return err
			}
			ds.fds[path.Dir(it.q.path)] = d
		}
		it.dir = d
	}
	name := path.Base(it.q.path)
	t := target{rel: it.q.path, dir: it.dir, name: name}
	var create, replace func() error
	t.incoming = func() (*os.File, error) {
		if it.anon {
			return os.Open("/proc/self/fd/" + strconv.Itoa(int(it.f.Fd())))
		}
		return openIn(it.tmpDir, it.tmp)
	}
	if it.anon {
		create = func() error { return linkIn(it.dir, it.f, name) }
		replace = func() error {
			it.tmpDir, it.tmp = it.dir, path.Base(tempName("."))
			if err := linkIn(it.dir, it.f, it.tmp); err != nil {
				it.tmp = ""
				return err
			}
			return renameAt(it.dir, it.tmp, it.dir, name)
		}
	} else {
		create = func() error { return renameNoReplace(it.tmpDir, it.tmp, it.dir, name) }
		replace = func() error { return renameAt(it.tmpDir, it.tmp, it.dir, name) }
	}
	if err := s.install(rt, it.q, t, clearAll, create, replace); err != nil {
		return err
	}
	it.tmp = ""
	it.closeLinked()
	return nil
}

// closeLinked closes an unnamed file once it has a name. Its content was
// made durable before, so a close error changes nothing.
func (it *batchItem) closeLinked() {
	if it.anon && it.f != nil {
		it.f.Close()
		it.f = nil
	}
}

// installed counts the files of a batch that were given their names.
func installed(dirs map[*os.File][]*batchItem) int {
	n := 0
	for _, its := range dirs {
		n += len(its)
	}
	return n
}

// syncBatchDirs makes the renames durable: one syncfs for a big batch,
// else one fsync per directory, in parallel.
func syncBatchDirs(rt *rootState, dirs map[*os.File][]*batchItem) {
	n := installed(dirs)
	fail := func(its []*batchItem, err error) {
		for _, it := range its {
			it.err = err
		}
	}
	if rt.bySyncfs(n) {
		if err := syncRootFS(rt); err != nil {
			for _, its := range dirs {
				fail(its, err)
			}
		}
		return
	}
	var wg sync.WaitGroup
	for d, its := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := groupSync(rt, "dir:"+d.Name(), func() error {
				if err := d.Sync(); err != nil {
					return fmt.Errorf("fsync dir: %w", err)
				}
				return nil
			})
			if err != nil {
				fail(its, err)
			}
		}()
	}
	wg.Wait()
}

// batchVerdict turns one file's outcome into its result, counting and
// logging failures as a single request's would be.
func (s *Syncer) batchVerdict(r *http.Request, rt *rootState, it *batchItem) batchResult {
	switch {
	case it.err == nil:
		return batchResult{Status: http.StatusOK}
	case errors.Is(it.err, errSkipped):
		return batchResult{Status: http.StatusNoContent, Reason: ReasonSkipped}
	}
	var rf *refusal
	if errors.As(it.err, &rf) {
		s.countRejected(rf.reason)
		s.lg.Warn("sync request refused", zap.String("reason", string(rf.reason)), zap.String("op", string(opBatch)),
			zap.String("root", rt.name), zap.String("path", it.q.path), zap.String("from", r.RemoteAddr),
			zap.Int64("epoch", it.q.epoch), zap.Error(it.err))
		return batchResult{Status: rf.status, Reason: rf.reason, Error: it.err.Error()}
	}
	kind := errKind(it.err)
	status := http.StatusInternalServerError
	if kind == "disk-full" {
		status = http.StatusInsufficientStorage
	}
	s.countError("recv-" + kind)
	s.lg.Error("sync request failed", zap.String("kind", kind), zap.String("op", string(opBatch)),
		zap.String("root", rt.name), zap.String("path", it.q.path), zap.Error(it.err))
	return batchResult{Status: status, Error: it.err.Error()}
}
