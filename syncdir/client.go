package syncdir

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"
)

// httpError is a non-200 answer from the peer.
type httpError struct {
	status int
	reason Reason
	msg    string
}

func (e *httpError) Error() string {
	return fmt.Sprintf("syncdir: peer answered %d %s: %s", e.status, e.reason, e.msg)
}

func (sd *sender) worker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-sd.jobs:
			// Never blocks: results has room for one per worker. A success
			// that lands after the stop is still recorded (see runSenderOnce).
			start := time.Now()
			r := sd.execute(ctx, j)
			r.start, r.end = start, time.Now()
			sd.results <- r
		}
	}
}

func (sd *sender) execute(ctx context.Context, j job) result {
	rt := sd.s.roots[j.k.root]
	r := result{j: j, ent: j.ent}
	v := url.Values{"path": {j.k.rel}}
	switch j.kind {
	case jobBatch:
		r.batch = sd.s.sendBatch(ctx, rt, j.batch)
		return r
	case jobPut:
		if j.grow != nil || j.ent.Size >= bulkMin {
			r.ent, r.err = sd.s.sendGrowing(ctx, rt, j.k.rel, j.grow)
			return r
		}
		r.ent, r.err = sd.s.sendFile(ctx, rt, j.k.rel)
		return r
	case jobMkdir:
		owner(v, j.ent)
		v.Set("mode", strconv.FormatUint(uint64(j.ent.Mode), 8))
		r.err = sd.s.call(ctx, rt, opMkdir, v, nil, 0, nil)
	case jobSymlink:
		owner(v, j.ent)
		v.Set("target", j.target)
		r.err = sd.s.call(ctx, rt, opSymlink, v, nil, 0, nil)
	case jobDelete:
		r.err = sd.s.call(ctx, rt, opDelete, v, nil, 0, nil)
	case jobRename:
		v.Set("to", j.to)
		r.err = sd.s.call(ctx, rt, opRename, v, nil, 0, nil)
	}
	return r
}

// trace logs a finished put or batch at debug level: from the first and
// the last change it carries, through the queue, to the peer's answer.
func (sd *sender) trace(r result) {
	if r.j.kind != jobPut && r.j.kind != jobBatch {
		return
	}
	ce := sd.s.lg.Check(zap.DebugLevel, "sync request done")
	if ce == nil {
		return
	}
	jobs := r.j.batch
	if r.j.kind == jobPut {
		jobs = []job{r.j}
	}
	var first, last time.Time
	for _, b := range jobs {
		if b.p == nil {
			continue
		}
		if first.IsZero() || b.p.since.Before(first) {
			first = b.p.since
		}
		if b.p.last.After(last) {
			last = b.p.last
		}
	}
	ce.Write(zap.Int("files", len(jobs)), zap.String("path", r.j.k.rel), zap.Time("first_change", first),
		zap.Time("last_change", last), zap.Time("queued", r.j.queued), zap.Time("start", r.start),
		zap.Time("end", r.end), zap.Error(r.err))
}

// owner adds the numeric owner: both nodes are deployed alike, so ids match.
func owner(v url.Values, e entry) {
	v.Set("uid", strconv.FormatUint(uint64(e.Uid), 10))
	v.Set("gid", strconv.FormatUint(uint64(e.Gid), 10))
}

// openForPut opens rel for a put: its state at the open and the query that
// describes it (path, mode, mtime, owner).
func openForPut(rt *rootState, rel string) (*os.File, entry, url.Values, error) {
	f, err := rt.root.Open(rel)
	if err != nil {
		return nil, entry{}, nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("syncdir: %s is no longer a regular file: %w", rel, os.ErrNotExist)
	}
	if err != nil {
		f.Close()
		return nil, entry{}, nil, err
	}
	e := entryOf(fi)
	v := url.Values{"path": {rel}, "mode": {strconv.FormatUint(uint64(e.Mode), 8)}, "mtime": {strconv.FormatInt(e.Mtime, 10)}}
	owner(v, e)
	return f, e, v, nil
}

// sendFile streams one file; the state sent is the one of the open file.
func (s *Syncer) sendFile(ctx context.Context, rt *rootState, rel string) (entry, error) {
	f, e, v, err := openForPut(rt, rel)
	if err != nil {
		return entry{}, err
	}
	defer f.Close()
	var body io.Reader = http.NoBody
	var tr http.Header
	if e.Size > 0 {
		tr = http.Header{hdrCommit: nil}
		body = &commitBody{r: io.LimitReader(f, e.Size), f: f, start: e, size: e.Size, tr: tr}
	}
	return e, s.call(ctx, rt, opPut, v, body, e.Size, tr)
}

// commitBody streams a file and, at its end, tells the receiver in a
// trailer whether the file stayed unchanged while it was read. A copy of a
// file that changed under the reader is thrown away, never renamed into place.
type commitBody struct {
	r     io.Reader
	f     *os.File
	start entry
	size  int64
	n     int64
	tr    http.Header
}

func (b *commitBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += int64(n)
	if err == io.EOF {
		verdict := commitChanged
		if fi, serr := b.f.Stat(); serr == nil && b.n == b.size && entryOf(fi).sameContent(b.start) {
			verdict = commitOK
		}
		b.tr.Set(hdrCommit, verdict)
	}
	return n, err
}

// errSourceChanged: a file changed while it was read; its change event
// brings it back.
var errSourceChanged = errors.New("syncdir: file changed while it was read")

// errTooBig: a file grew past the batch limit since it was planned.
var errTooBig = errors.New("syncdir: file too big for a batch")

// sendBatch sends small files in one request and returns one result per
// job. The body is streamed: each file is read whole and checked unchanged
// just before it goes out, so the receiver writes the first files while
// later ones are still being read here. A file that cannot go (vanished,
// changed, grew past the batch limit) goes as a skip entry; one that grew
// is then sent on its own.
func (s *Syncer) sendBatch(ctx context.Context, rt *rootState, jobs []job) []result {
	res := make([]result, len(jobs))
	for i, j := range jobs {
		res[i].j = j
	}
	dirs := newDirSet(rt)
	defer dirs.close()
	// The request starts with the first file that reads well, so a batch
	// is never all skips.
	var first []byte
	start := 0
	for ; start < len(jobs) && first == nil; start++ {
		b, ent, err := appendSmallFile(nil, rt, dirs, jobs[start].k.rel)
		res[start].ent, res[start].err = ent, err
		if err == nil {
			first = b
		}
	}
	if first != nil {
		s.streamBatch(ctx, rt, dirs, first, start-1, res)
	}
	for i := range res {
		if errors.Is(res[i].err, errTooBig) {
			res[i].ent, res[i].err = s.sendFile(ctx, rt, jobs[i].k.rel)
		}
	}
	return res
}

// streamBatch sends res[from:] as one batch whose first file is already in
// first; it fills each result.
func (s *Syncer) streamBatch(ctx context.Context, rt *rootState, dirs *dirSet, first []byte, from int, res []result) {
	pr, pw := io.Pipe()
	skipped := make([]bool, len(res))
	done := make(chan struct{})
	go func() {
		defer close(done)
		pw.CloseWithError(s.produceBatch(pw, rt, dirs, first, from, res, skipped))
	}()
	var resp batchResp
	n := len(res) - from
	v := url.Values{"n": {strconv.Itoa(n)}}
	err := s.callInto(ctx, rt, opBatch, v, pr, -1, nil, &resp)
	pr.CloseWithError(errBatchEnded) // stops the producer if the request ended early
	<-done
	if err == nil && len(resp.Results) != n {
		err = fmt.Errorf("syncdir: batch of %d answered with %d results", n, len(resp.Results))
	}
	echo := false
	for k := range n {
		i := from + k
		switch {
		case skipped[i]:
			// keeps its own error
		case err != nil:
			res[i].err, res[i].echo = err, echo
			echo = true
		case resp.Results[k].Status != http.StatusOK:
			br := resp.Results[k]
			res[i].err = &httpError{status: br.Status, reason: br.Reason, msg: br.Error}
		}
	}
}

var errBatchEnded = errors.New("syncdir: batch request ended")

// produceBatch writes the batch body: the first file, then each further one
// as it is read, or a skip entry in its place.
func (s *Syncer) produceBatch(w io.Writer, rt *rootState, dirs *dirSet, first []byte, from int, res []result, skipped []bool) error {
	// The first file goes at once so the receiver starts; later ones are
	// buffered into fewer, bigger frames.
	if _, err := w.Write(first); err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 32<<10)
	buf := make([]byte, 0, batchFileMax+4096)
	for i := from + 1; i < len(res); i++ {
		var err error
		buf, res[i].ent, err = appendSmallFile(buf[:0], rt, dirs, res[i].j.k.rel)
		if err != nil {
			res[i].err, skipped[i] = err, true
			buf = append(buf[:0], batchSkip...)
		}
		if _, err := bw.Write(buf); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// appendSmallFile appends rel's batch header and content to b.
func appendSmallFile(b []byte, rt *rootState, dirs *dirSet, rel string) ([]byte, entry, error) {
	f, err := openSmall(rt, dirs, rel)
	if err != nil {
		return b, entry{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return b, entry{}, err
	}
	if !fi.Mode().IsRegular() {
		return b, entry{}, fmt.Errorf("syncdir: %s is no longer a regular file: %w", rel, os.ErrNotExist)
	}
	e := entryOf(fi)
	if e.Size > batchFileMax {
		return b, e, errTooBig
	}
	b = appendBatchHeader(b, rel, e)
	n := len(b)
	b = slices.Grow(b, int(e.Size)+1)[:n+int(e.Size)+1]
	got, err := io.ReadFull(f, b[n:]) // one byte more than the size: growth shows
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = nil
	}
	if err != nil {
		return b, e, err
	}
	if int64(got) != e.Size {
		return b, e, errSourceChanged
	}
	b = b[:n+got]
	if fi, err := f.Stat(); err != nil || !entryOf(fi).sameContent(e) {
		return b, e, errSourceChanged
	}
	return b, e, nil
}

// openSmall opens rel through its directory, opened once per batch; a
// path whose directory cannot be walked without following a link goes the
// general way.
func openSmall(rt *rootState, dirs *dirSet, rel string) (*os.File, error) {
	d, err := dirs.open(path.Dir(rel))
	if err != nil {
		return rt.root.Open(rel)
	}
	return openIn(d, path.Base(rel))
}

func (s *Syncer) sendManifest(ctx context.Context, rt *rootState, m manifestReq) (manifestResp, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return manifestResp{}, err
	}
	var resp manifestResp
	err = s.callInto(ctx, rt, opManifest, nil, bytes.NewReader(b), int64(len(b)), nil, &resp)
	return resp, err
}

// call makes one fenced request: the fence is asked right before sending,
// and the epoch it gives travels in the header.
func (s *Syncer) call(ctx context.Context, rt *rootState, op opKind, v url.Values, body io.Reader, size int64, trailer http.Header) error {
	return s.callInto(ctx, rt, op, v, body, size, trailer, nil)
}

func (s *Syncer) callInto(ctx context.Context, rt *rootState, op opKind, v url.Values, body io.Reader, size int64, trailer http.Header, out any) error {
	epoch, ok := s.fence.ActiveEpoch()
	if !ok {
		return errNotActive
	}
	method := http.MethodPost
	if op == opPut || op == opBatch {
		method = http.MethodPut
	}
	u := rt.peerURL + "/v1/" + string(op) + "/" + rt.name
	if len(v) > 0 {
		u += "?" + v.Encode()
	}
	if body == nil {
		body = http.NoBody
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	req.ContentLength = size
	req.GetBody = nil
	req.Trailer = trailer
	req.Header.Set(hdrEpoch, strconv.FormatInt(epoch, 10))
	req.Header.Set(hdrNode, s.node)
	if s.token != "" {
		req.Header.Set(hdrToken, "Bearer "+s.token)
	}
	c := s.client
	if op == opPut && size < 0 {
		c = s.bulk
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("syncdir: %s %s: %w", op, v.Get("path"), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var eb errorBody
		json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&eb)
		return &httpError{status: resp.StatusCode, reason: eb.Reason, msg: eb.Error}
	}
	if out != nil {
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxManifest)).Decode(out); err != nil {
			return fmt.Errorf("syncdir: %s answer: %w", op, err)
		}
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	return nil
}
