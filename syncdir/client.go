package syncdir

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
)

// httpError is a non-200 answer from the peer.
type httpError struct {
	status int
	reason string
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
			sd.results <- sd.execute(ctx, j)
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

// owner adds the numeric owner: both nodes are deployed alike, so ids match.
func owner(v url.Values, e entry) {
	v.Set("uid", strconv.FormatUint(uint64(e.Uid), 10))
	v.Set("gid", strconv.FormatUint(uint64(e.Gid), 10))
}

// sendFile streams one file; the state sent is the one of the open file.
func (s *Syncer) sendFile(ctx context.Context, rt *rootState, rel string) (entry, error) {
	f, err := rt.root.Open(rel)
	if err != nil {
		return entry{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return entry{}, err
	}
	if !fi.Mode().IsRegular() {
		return entry{}, fmt.Errorf("syncdir: %s is no longer a regular file: %w", rel, os.ErrNotExist)
	}
	e := entryOf(fi)
	v := url.Values{"path": {rel}, "mode": {strconv.FormatUint(uint64(e.Mode), 8)}, "mtime": {strconv.FormatInt(e.Mtime, 10)}}
	owner(v, e)
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
// job. Each file is read whole and checked unchanged before it goes in, so
// the batch needs no commit trailer; a file that grew goes on its own.
func (s *Syncer) sendBatch(ctx context.Context, rt *rootState, jobs []job) []result {
	res := make([]result, len(jobs))
	body := make([]byte, 0, batchMaxBytes/4)
	var in []int // indexes of res carried by the batch
	var big []int
	for i, j := range jobs {
		res[i].j = j
		mark := len(body)
		var err error
		body, res[i].ent, err = appendSmallFile(body, rt, j.k.rel)
		switch {
		case errors.Is(err, errTooBig):
			big = append(big, i)
		case err != nil:
			res[i].err = err
		default:
			in = append(in, i)
			continue
		}
		body = body[:mark]
	}
	if len(in) > 0 {
		s.callBatch(ctx, rt, body, in, res)
	}
	for _, i := range big {
		res[i].ent, res[i].err = s.sendFile(ctx, rt, jobs[i].k.rel)
	}
	return res
}

func (s *Syncer) callBatch(ctx context.Context, rt *rootState, body []byte, in []int, res []result) {
	var resp batchResp
	v := url.Values{"n": {strconv.Itoa(len(in))}}
	err := s.callInto(ctx, rt, opBatch, v, bytes.NewReader(body), int64(len(body)), nil, &resp)
	if err == nil && len(resp.Results) != len(in) {
		err = fmt.Errorf("syncdir: batch of %d answered with %d results", len(in), len(resp.Results))
	}
	for k, i := range in {
		switch {
		case err != nil:
			res[i].err, res[i].echo = err, k > 0
		case resp.Results[k].Status != http.StatusOK:
			br := resp.Results[k]
			res[i].err = &httpError{status: br.Status, reason: br.Reason, msg: br.Error}
		}
	}
}

// appendSmallFile appends rel's batch header and content to b.
func appendSmallFile(b []byte, rt *rootState, rel string) ([]byte, entry, error) {
	f, err := rt.root.Open(rel)
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
	b = append(b, make([]byte, e.Size+1)...)
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
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("syncdir: %s %s: %w", op, v.Get("path"), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var eb struct{ Error, Reason string }
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
