package syncdir

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// batchFile is one file of a hand-made batch; rawPath goes on the wire as
// is (already query-escaped) when set.
type batchFile struct {
	path, rawPath, content string
	mode                   uint32
	mtime                  int64
}

func batchBody(files []batchFile) []byte {
	var b []byte
	for _, f := range files {
		if f.rawPath != "" {
			b = fmt.Appendf(b, "path=%s&mode=%o&mtime=%d&size=%d\n", f.rawPath, f.mode, f.mtime, len(f.content))
		} else {
			b = appendBatchHeader(b, f.path, entry{Mode: f.mode, Mtime: f.mtime, Size: int64(len(f.content))})
		}
		b = append(b, f.content...)
	}
	return b
}

// batch sends a batch put and returns the status and the per-file results.
func (h *hostileClient) batch(epoch string, n int, body []byte) (int, []batchResult) {
	h.t.Helper()
	req, err := http.NewRequest("PUT", fmt.Sprintf("https://%s/v1/batch/data?n=%d", h.addr, n), bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set(hdrEpoch, epoch)
	req.Header.Set(hdrNode, "a")
	resp, err := h.c.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var br batchResp
	if resp.StatusCode == 200 {
		if err := json.NewDecoder(resp.Body).Decode(&br); err != nil {
			h.t.Fatalf("batch answer: %v", err)
		}
	}
	return resp.StatusCode, br.Results
}

// A batch lands every file with its content, mode and mtime, one 200 each,
// made durable by one syncfs or, with syncfs-min-files 0, by fsyncs; written
// as unnamed files and linked, or (without O_TMPFILE or /proc) as temp
// files and renamed.
func TestBatchPut(t *testing.T) {
	defer func(v bool) { procFDs = v }(procFDs)
	for _, anon := range []bool{true, false} {
		procFDs = anon
		for _, syncfs := range []bool{true, false} {
			t.Run(fmt.Sprintf("unnamed=%v/syncfs=%v", anon, syncfs), func(t *testing.T) { testBatchPut(t, syncfs) })
		}
	}
}

func testBatchPut(t *testing.T, syncfs bool) {
	_, b, p := pair(t)
	if !syncfs {
		b.s.roots[0].syncfsMin = 0
	}
	h := newHostileClient(t, p, b.ln.Addr().String())
	mt := time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC).UnixNano()
	files := []batchFile{
		{path: "one.txt", content: "first", mode: 0o644, mtime: mt},
		{path: "empty", content: "", mode: 0o600, mtime: mt},
		{path: "new/dir/deep.bin", content: strings.Repeat("d", 5000), mode: 0o640, mtime: mt},
		{path: "odd name\n%.txt", content: "odd", mode: 0o755, mtime: mt},
	}
	for i := range DefaultConfig().SyncfsMinFiles { // a big batch takes the syncfs path
		files = append(files, batchFile{path: fmt.Sprintf("many/m%02d", i), content: fmt.Sprint(i), mode: 0o644, mtime: mt})
	}
	st, res := h.batch("4", len(files), batchBody(files))
	if st != 200 || len(res) != len(files) {
		t.Fatalf("batch: %d %+v", st, res)
	}
	for i, f := range files {
		if res[i].Status != 200 {
			t.Fatalf("%s: %+v", f.path, res[i])
		}
		fp := filepath.Join(b.root, f.path)
		fi, err := os.Stat(fp)
		if err != nil || readFile(fp) != f.content || unixMode(fi.Mode()) != f.mode || fi.ModTime().UnixNano() != mt {
			t.Fatalf("%s: %v %q %o %v", f.path, err, readFile(fp), unixMode(fi.Mode()), fi.ModTime())
		}
		if _, ok := b.s.roots[0].rec.get(f.path); !ok {
			t.Fatalf("%s not remembered as received", f.path)
		}
	}
	if got := b.s.Status().FilesReceived; got != uint64(len(files)) {
		t.Fatalf("files received %d", got)
	}
	noTempFiles(t, b.root)
	testBatchReplace(t, b, h)
}

// testBatchReplace sends a second batch over names that are taken: a file
// the receiver put there (replaced in place), a file written here and never
// delivered (quarantined first), a directory of such files in the way.
func testBatchReplace(t *testing.T, b *node, h *hostileClient) {
	os.WriteFile(filepath.Join(b.root, "local.txt"), []byte("mine"), 0o644)
	os.MkdirAll(filepath.Join(b.root, "was-dir"), 0o755)
	os.WriteFile(filepath.Join(b.root, "was-dir", "inside"), []byte("inside"), 0o644)
	files := []batchFile{
		{path: "one.txt", content: "second", mode: 0o644},
		{path: "local.txt", content: "theirs", mode: 0o644},
		{path: "was-dir", content: "now a file", mode: 0o644},
	}
	for i := range DefaultConfig().SyncfsMinFiles {
		files = append(files, batchFile{path: fmt.Sprintf("many/m%02d", i), content: "again", mode: 0o644})
	}
	st, res := h.batch("5", len(files), batchBody(files))
	if st != 200 || len(res) != len(files) {
		t.Fatalf("second batch: %d %+v", st, res)
	}
	for i, f := range files {
		if got := readFile(filepath.Join(b.root, f.path)); res[i].Status != 200 || got != f.content {
			t.Fatalf("%s: %+v, content %q", f.path, res[i], got)
		}
	}
	q := filepath.Join(b.root, ".hapair-quarantine", "5")
	if readFile(filepath.Join(q, "local.txt")) != "mine" || readFile(filepath.Join(q, "was-dir", "inside")) != "inside" {
		t.Fatalf("undelivered local files not quarantined: %q %q",
			readFile(filepath.Join(q, "local.txt")), readFile(filepath.Join(q, "was-dir", "inside")))
	}
	if _, err := os.Stat(filepath.Join(q, "one.txt")); err == nil {
		t.Fatal("a file the receiver put there was quarantined")
	}
	noTempFiles(t, b.root)
}

// One hostile path in a batch is refused and counted; the others land, and
// the results say which is which.
func TestBatchBadPath(t *testing.T) {
	_, b, p := pair(t)
	outside := t.TempDir()
	os.Symlink(outside, filepath.Join(b.root, "evil"))
	h := newHostileClient(t, p, b.ln.Addr().String())
	files := []batchFile{
		{path: "good-1", content: "g1", mode: 0o644},
		{rawPath: "..%2fescape", content: "bad", mode: 0o644},
		{path: "evil/through-link", content: "bad", mode: 0o644},
		{path: "cache/excluded", content: "bad", mode: 0o644},
		{rawPath: "x&path=y", content: "bad", mode: 0o644},
		{path: "good-2", content: "g2", mode: 0o644},
	}
	st, res := h.batch("4", len(files), batchBody(files))
	if st != 200 || len(res) != len(files) {
		t.Fatalf("batch: %d %+v", st, res)
	}
	want := []string{"", "traversal", "symlink-parent", "excluded", "bad-request", ""}
	for i, w := range want {
		if w == "" && res[i].Status != 200 || w != "" && (res[i].Status != 400 || res[i].Reason != Reason(w)) {
			t.Errorf("file %d: want %q, got %+v", i, w, res[i])
		}
	}
	rej := b.s.Status().Rejected
	for _, w := range want[1:5] {
		if rej[w] != 1 {
			t.Errorf("rejected[%s] = %d (%v)", w, rej[w], rej)
		}
	}
	if readFile(filepath.Join(b.root, "good-1")) != "g1" || readFile(filepath.Join(b.root, "good-2")) != "g2" {
		t.Fatal("good files of the batch not applied")
	}
	if e, _ := os.ReadDir(outside); len(e) != 0 || fileExists(filepath.Join(filepath.Dir(b.root), "escape")) {
		t.Fatal("a file landed outside the root")
	}
	if fileExists(filepath.Join(b.root, "cache")) {
		t.Fatal("excluded path written")
	}
	noTempFiles(t, b.root)
}

// A batch from an epoch below the highest recorded is refused whole.
func TestBatchLowerEpoch(t *testing.T) {
	_, b, p := pair(t)
	h := newHostileClient(t, p, b.ln.Addr().String())
	if st, _ := h.batch("9", 1, batchBody([]batchFile{{path: "first", content: "x", mode: 0o644}})); st != 200 {
		t.Fatalf("first batch: %d", st)
	}
	files := []batchFile{{path: "late-1", content: "a", mode: 0o644}, {path: "late-2", content: "b", mode: 0o644}}
	if st, _ := h.batch("8", len(files), batchBody(files)); st != http.StatusConflict {
		t.Fatalf("lower epoch: %d", st)
	}
	if fileExists(filepath.Join(b.root, "late-1")) || fileExists(filepath.Join(b.root, "late-2")) {
		t.Fatal("a file of a stale batch applied")
	}
	if got := b.s.Status().Rejected["stale-epoch"]; got != 1 {
		t.Fatalf("rejected[stale-epoch] = %d", got)
	}
	noTempFiles(t, b.root)
}

// A batch body that breaks off, or that holds fewer or more files than it
// announces, applies nothing and leaves no temp files.
func TestBatchTruncated(t *testing.T) {
	_, b, p := pair(t)
	h := newHostileClient(t, p, b.ln.Addr().String())
	files := []batchFile{
		{path: "t-1", content: strings.Repeat("1", 1000), mode: 0o644},
		{path: "t-2", content: strings.Repeat("2", 1000), mode: 0o644},
		{path: "t-3", content: strings.Repeat("3", 1000), mode: 0o644},
	}
	body := batchBody(files)
	// Fewer files than announced, more, and a last file shorter than its size.
	for name, c := range map[string]struct {
		n    int
		body []byte
	}{
		"missing file": {4, body},
		"extra bytes":  {3, append(append([]byte{}, body...), "junk"...)},
		"short file":   {3, body[:len(body)-10]},
		"no header":    {3, body[:len(body)-1010]},
	} {
		if st, _ := h.batch("5", c.n, c.body); st == 200 {
			t.Errorf("%s: accepted", name)
		}
	}
	// The connection dies in the middle of the second file.
	errsBefore := b.s.Status().Errors["recv-truncated"]
	head := fmt.Sprintf("PUT /v1/batch/data?n=3 HTTP/1.1\r\nHost: x\r\n%s: 5\r\n%s: a\r\nContent-Length: %d\r\n\r\n",
		hdrEpoch, hdrNode, len(body))
	h.raw(append([]byte(head), body[:1500]...), true)
	eventually(t, 10*time.Second, "the truncated batch to fail", func() bool {
		return b.s.Status().Errors["recv-truncated"] > errsBefore
	})
	for _, f := range files {
		if fileExists(filepath.Join(b.root, f.path)) {
			t.Fatalf("%s of a broken batch visible", f.path)
		}
	}
	noTempFiles(t, b.root)
	if st, res := h.batch("5", 3, body); st != 200 || len(res) != 3 || res[2].Status != 200 {
		t.Fatalf("receiver stopped serving batches: %d %+v", st, res)
	}
}

// Disk full in the middle of a batch: every file reported 200 is complete
// under its final name, every other one is absent, no temp file stays.
func TestBatchDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("disk-full test mounts a small tmpfs: needs root")
	}
	_, b, p := pair(t)
	full := filepath.Join(b.root, "full")
	os.MkdirAll(full, 0o755)
	if err := unix.Mount("tmpfs", full, "tmpfs", 0, "size=256k,mode=0755"); err != nil {
		t.Skipf("tmpfs mount not permitted: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(full, unix.MNT_DETACH) })
	h := newHostileClient(t, p, b.ln.Addr().String())
	var files []batchFile
	for i := range 2 * DefaultConfig().SyncfsMinFiles { // enough for the syncfs path
		files = append(files, batchFile{path: fmt.Sprintf("full/f%02d", i), content: strings.Repeat("x", 16<<10), mode: 0o644})
	}
	st, res := h.batch("6", len(files), batchBody(files))
	if st != 200 || len(res) != len(files) {
		t.Fatalf("batch: %d %+v", st, res)
	}
	ok, failed := 0, 0
	for i, f := range files {
		fp := filepath.Join(b.root, f.path)
		switch res[i].Status {
		case 200:
			ok++
			if readFile(fp) != f.content {
				t.Fatalf("%s reported stored but holds %d bytes", f.path, len(readFile(fp)))
			}
		case http.StatusInsufficientStorage:
			failed++
			if fileExists(fp) {
				t.Fatalf("%s failed but is visible", f.path)
			}
		default:
			t.Fatalf("%s: %+v", f.path, res[i])
		}
	}
	if failed == 0 || ok == 0 {
		t.Fatalf("want some files stored and some refused for space: %d ok, %d failed", ok, failed)
	}
	if got := b.s.Status().Errors["recv-disk-full"]; got != uint64(failed) {
		t.Fatalf("recv-disk-full %d, want %d", got, failed)
	}
	noTempFiles(t, b.root)
}

// The batch header decoder refuses what the query decoder refuses.
func TestBatchHeaderDecoding(t *testing.T) {
	batch := request{op: opBatch, root: "data", epoch: 3, node: "a"}
	for _, c := range []struct {
		line    string
		framing bool   // the batch cannot go on
		reason  string // the file alone is refused
	}{
		{"path=a&mode=644&mtime=1&size=2\n", false, ""},
		{"path=a&mode=644&mtime=1&size=-1\n", true, ""},
		{"path=a&mode=644&mtime=1\n", true, ""},
		{"path=a&mode=644&mtime=1&size=2&size=2\n", true, ""},
		{"path=a&mode=644&mtime=1&size=2", true, ""},
		{"path=a%zz&size=2\n", true, ""},
		{"path=%2fetc&mode=644&mtime=1&size=2\n", false, "absolute"},
		{"path=a&path=b&mode=644&mtime=1&size=2\n", false, "bad-request"},
		{"path=a&mode=99&mtime=1&size=2\n", false, "bad-request"},
		{"path=a&mode=644&mtime=1&size=2&to=b\n", false, "bad-request"},
		{"path=a%00b&mode=644&mtime=1&size=2\n", false, "nul"},
		{"path=" + strings.Repeat("a", batchMaxHeader) + "&size=1\n", true, ""},
	} {
		q, ferr, err := readBatchHeader(bufio.NewReaderSize(strings.NewReader(c.line), batchMaxHeader), batch)
		if (err != nil) != c.framing {
			t.Errorf("%.60q: framing error %v", c.line, err)
			continue
		}
		if c.framing {
			continue
		}
		rf, _ := ferr.(*refusal)
		if c.reason == "" && ferr != nil || c.reason != "" && (rf == nil || rf.reason != Reason(c.reason)) {
			t.Errorf("%.60q: want %q, got %v", c.line, c.reason, ferr)
		}
		if q.size != 2 || q.epoch != 3 || q.op != opPut {
			t.Errorf("%.60q: decoded %+v", c.line, q)
		}
	}
	if _, err := url.ParseQuery(string(appendBatchHeader(nil, "a b/c&d", entry{Size: 1}))); err != nil {
		t.Fatal(err)
	}
}

// A streamed batch announces its files before reading them: one that has
// vanished by its turn goes as a skip entry, one that grew past the batch
// limit goes on its own, and the others land.
func TestBatchStreamSkips(t *testing.T) {
	a, b, p := pair(t)
	a.fence.set(true, 5) // may push; the sender loop is not started
	eventually(t, 5*time.Second, "a running", func() bool {
		a.s.mu.Lock() // Run opens the roots before it sets runCtx
		defer a.s.mu.Unlock()
		return a.s.runCtx != nil
	})
	os.MkdirAll(filepath.Join(a.root, "s"), 0o755)
	writeFile(t, filepath.Join(a.root, "s", "one"), "1", 0o644)
	writeFile(t, filepath.Join(a.root, "s", "three"), strings.Repeat("3", batchFileMax+1), 0o640)
	writeFile(t, filepath.Join(a.root, "s", "four"), "4444", 0o600)
	var jobs []job
	for _, n := range []string{"zero", "one", "two", "three", "four"} {
		jobs = append(jobs, job{kind: jobPut, k: key{0, "s/" + n}})
	}
	res := a.s.sendBatch(t.Context(), a.s.roots[0], jobs)
	for i, want := range []bool{false, true, false, true, true} {
		if ok := res[i].err == nil; ok != want {
			t.Errorf("%s: err %v", jobs[i].k.rel, res[i].err)
		}
	}
	for _, i := range []int{0, 2} {
		if !errors.Is(res[i].err, fs.ErrNotExist) {
			t.Errorf("%s: err %v, want not-exist", jobs[i].k.rel, res[i].err)
		}
	}
	for _, n := range []string{"one", "three", "four"} {
		if got, want := readFile(filepath.Join(b.root, "s", n)), readFile(filepath.Join(a.root, "s", n)); got != want {
			t.Errorf("%s on the target: %d bytes, want %d", n, len(got), len(want))
		}
	}
	if fileExists(filepath.Join(b.root, "s", "zero")) || fileExists(filepath.Join(b.root, "s", "two")) {
		t.Error("a skipped file exists on the target")
	}
	// A hand-made batch with a skip entry: nothing to do, nothing refused.
	h := newHostileClient(t, p, b.ln.Addr().String())
	body := append(batchBody([]batchFile{{path: "k-1", content: "k", mode: 0o644}}), batchSkip...)
	st, rs := h.batch("5", 2, body)
	if st != 200 || len(rs) != 2 || rs[0].Status != 200 || rs[1].Status != http.StatusNoContent {
		t.Fatalf("batch with a skip: %d %+v", st, rs)
	}
	if got := b.s.Status().Rejected; len(got) != 0 {
		t.Errorf("rejected: %v", got)
	}
	noTempFiles(t, b.root)
}

// ownerCase is one file sent with a mode and an owner, and what the
// receiver must make of them.
type ownerCase struct {
	name              string
	mode, uid, gid    uint32
	wantMode, wantUid uint32
	wantGid           uint32
}

// sendOwners sends files as one batch and checks mode, owner and mtime
// on disk and in the record.
func sendOwners(t *testing.T, b *node, h *hostileClient, files []ownerCase) {
	t.Helper()
	var body []byte
	for _, f := range files {
		body = appendBatchHeader(body, f.name, entry{Mode: f.mode, Mtime: 1e18, Size: 2, Uid: f.uid, Gid: f.gid})
		body = append(body, "ok"...)
	}
	if st, rs := h.batch("3", len(files), body); st != 200 || len(rs) != len(files) {
		t.Fatalf("batch: %d %+v", st, rs)
	}
	for _, f := range files {
		fi, err := os.Lstat(filepath.Join(b.root, f.name))
		if err != nil {
			t.Fatal(err)
		}
		e := entryOf(fi)
		if e.Mode != f.wantMode || e.Uid != f.wantUid || e.Gid != f.wantGid || e.Mtime != 1e18 {
			t.Errorf("%s: mode %o uid %d gid %d mtime %d, want %o %d %d", f.name, e.Mode, e.Uid, e.Gid, e.Mtime, f.wantMode, f.wantUid, f.wantGid)
		}
		if r, ok := b.s.roots[0].rec.get(f.name); !ok || !r.same(e) {
			t.Errorf("%s: recorded %+v, on disk %+v", f.name, r, e)
		}
	}
}

// Issue 16 finding 8: by default a received file belongs to the
// receiver's user and never gets setuid, setgid or sticky bits, whatever
// the wire says (a pushed 4755 owned by uid 0 made a setuid-root file).
func TestBatchOwnerModeDefaultPolicy(t *testing.T) {
	_, b, p := pair(t)
	h := newHostileClient(t, p, b.ln.Addr().String())
	me, mg := uint32(os.Geteuid()), uint32(os.Getegid())
	sendOwners(t, b, h, []ownerCase{
		{"suid-root", 0o4755, 0, 0, 0o755, me, mg},
		{"suid", 0o4755, 65534, 65534, 0o755, me, mg},
		{"open", 0o666, 0, 0, 0o666, me, mg},
		{"grp", 0o2750, 0, 65534, 0o750, me, mg},
		{"sticky", 0o1777, 65534, 65534, 0o777, me, mg},
	})
}

// With owners on (and roled root), the sender's owner is applied, except
// uid or gid 0 unless root-owner; special bits stay off, mode-mask applies;
// chown comes before chmod (chown clears setuid bits, the order matters).
func TestBatchOwnerModePolicy(t *testing.T) {
	if !canChown {
		t.Skip("owners are applied only by a receiver running as root")
	}
	for _, tc := range []struct {
		name      string
		rootOwner bool
		mask      uint32
		files     []ownerCase
	}{
		{"owners", false, 0o777, []ownerCase{
			{"suid", 0o4755, 65534, 65534, 0o755, 65534, 65534},
			{"root", 0o644, 0, 0, 0o644, 0, 0}, // the receiver's user (root here)
			{"half-root", 0o640, 0, 65534, 0o640, 0, 0},
		}},
		{"root-owner", true, 0o777, []ownerCase{
			{"suid-root", 0o4755, 0, 0, 0o755, 0, 0},
			{"grp", 0o2750, 0, 65534, 0o750, 0, 65534},
		}},
		{"mask", false, 0o750, []ownerCase{
			{"open", 0o666, 65534, 65534, 0o640, 65534, 65534},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, b, p := pair(t, func(c *Config) { c.Owners, c.RootOwner, c.ModeMask = true, tc.rootOwner, tc.mask })
			sendOwners(t, b, newHostileClient(t, p, b.ln.Addr().String()), tc.files)
		})
	}
}
