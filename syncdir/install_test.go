package syncdir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// batchFrom sends a batch put whose body is read from r; it reports
// errors instead of failing, so it can run on its own goroutine.
func (h *hostileClient) batchFrom(epoch string, n int, r io.Reader) (int, []batchResult, error) {
	req, err := http.NewRequest("PUT", fmt.Sprintf("https://%s/v1/batch/data?n=%d", h.addr, n), r)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set(hdrEpoch, epoch)
	req.Header.Set(hdrNode, "a")
	resp, err := h.c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var br batchResp
	if resp.StatusCode == 200 {
		if err := json.NewDecoder(resp.Body).Decode(&br); err != nil {
			return resp.StatusCode, nil, err
		}
	}
	return resp.StatusCode, br.Results, nil
}

// Issue 16 finding 1: the fence is re-checked right before anything of a
// batch becomes visible. Half of a batch body is sent at epoch 10, then
// the receiving node starts taking the active key (or a request at epoch
// 11 is accepted), then the rest: no file of the batch may appear, none
// may replace a file, no directory may be made. The old code answered 200
// and installed every file.
func TestFenceFlipMidBatch(t *testing.T) {
	for _, flip := range []string{"holding", "newer-epoch"} {
		t.Run(flip, func(t *testing.T) {
			_, b, p := pair(t)
			h := newHostileClient(t, p, b.ln.Addr().String())
			if st := h.do("PUT", "/v1/put/data?path=before.txt&mode=644&mtime=0", "10", "mine"); st != 200 {
				t.Fatalf("first put: %d", st)
			}
			read := make(chan struct{}, 1)
			hook := func() {
				select {
				case read <- struct{}{}:
				default:
				}
			}
			b.s.afterBatchFile.Store(&hook)
			files := []batchFile{
				{path: "first.txt", content: "one", mode: 0o644},
				{path: "new/dir/second.txt", content: "two", mode: 0o644},
				{path: "before.txt", content: "overwritten", mode: 0o644},
			}
			body := batchBody(files)
			half := len(batchBody(files[:1]))
			pr, pw := io.Pipe()
			type answer struct {
				status int
				res    []batchResult
				err    error
			}
			done := make(chan answer, 1)
			go func() {
				st, res, err := h.batchFrom("10", len(files), pr)
				done <- answer{st, res, err}
			}()
			if _, err := pw.Write(body[:half]); err != nil {
				t.Fatal(err)
			}
			select {
			case <-read: // the receiver admitted the batch and read its first file
			case <-time.After(30 * time.Second):
				t.Fatal("the receiver never read the first file")
			}
			switch flip {
			case "holding":
				b.fence.mu.Lock()
				b.fence.holding = true
				b.fence.mu.Unlock()
			case "newer-epoch":
				if st := h.do("PUT", "/v1/put/data?path=other.txt&mode=644&mtime=0", "11", "newer"); st != 200 {
					t.Fatalf("put at 11: %d", st)
				}
			}
			pw.Write(body[half:])
			pw.Close()
			a := <-done
			if a.err != nil {
				t.Fatal(a.err)
			}
			if a.status == 200 {
				for i, r := range a.res {
					if r.Status != http.StatusConflict {
						t.Errorf("%s: %+v, want 409", files[i].path, r)
					}
				}
			} else if a.status != http.StatusConflict {
				t.Errorf("batch: %d, want 409 (per file or for all)", a.status)
			}
			for _, p := range []string{"first.txt", "new"} {
				if _, err := os.Lstat(filepath.Join(b.root, p)); err == nil {
					t.Errorf("%s became visible after the fence moved", p)
				}
			}
			if got := readFile(filepath.Join(b.root, "before.txt")); got != "mine" {
				t.Errorf("before.txt: %q, want it untouched", got)
			}
			noTempFiles(t, b.root)
		})
	}
}

// Issue 16 finding 6: only a request that passed every check and made a
// change records its epoch. Refused requests at epoch 1000 (an excluded
// path, a path through a symlink, a broken manifest, a batch of only
// refused files) leave the highest epoch at 11, and the sender at 11
// goes on. The old code recorded 1000 at admission and locked it out.
func TestEpochMovesOnlyOnSuccess(t *testing.T) {
	_, b, p := pair(t)
	h := newHostileClient(t, p, b.ln.Addr().String())
	if st := h.do("PUT", "/v1/put/data?path=a.txt&mode=644&mtime=0", "11", "a"); st != 200 {
		t.Fatalf("put at 11: %d", st)
	}
	os.Symlink(t.TempDir(), filepath.Join(b.root, "link"))
	for _, c := range []struct {
		name, method, url, body string
		status                  int
	}{
		{"excluded", "PUT", "/v1/put/data?path=x.tmp&mode=644&mtime=0", "x", 400},
		{"excluded mkdir", "POST", "/v1/mkdir/data?path=cache&mode=755", "", 400},
		{"symlink parent", "PUT", "/v1/put/data?path=link/x&mode=644&mtime=0", "x", 400},
		{"bad manifest", "POST", "/v1/manifest/data", "{not json", 400},
	} {
		if st := h.do(c.method, c.url, "1000", c.body); st != c.status {
			t.Errorf("%s: %d, want %d", c.name, st, c.status)
		}
	}
	body := batchBody([]batchFile{{path: "y.swp", content: "y", mode: 0o644}})
	if st, res := h.batch("1000", 1, body); st != 200 || len(res) != 1 || res[0].Status != 400 {
		t.Errorf("excluded batch: %d %+v", st, res)
	}
	if got := b.s.Status().HighestEpoch; got != 11 {
		t.Fatalf("highest epoch %d after refused requests, want 11", got)
	}
	if st := h.do("PUT", "/v1/put/data?path=b.txt&mode=644&mtime=0", "11", "b"); st != 200 {
		t.Fatalf("put at 11 after refused requests at 1000: %d", st)
	}
	if st := h.do("PUT", "/v1/put/data?path=c.txt&mode=644&mtime=0", "12", "c"); st != 200 {
		t.Fatalf("put at 12: %d", st)
	}
	if got := b.s.Status().HighestEpoch; got != 12 {
		t.Fatalf("highest epoch %d after a put at 12, want 12", got)
	}
}

// Issue 16 finding 6: epochs are parsed strictly, one spelling per number.
func TestEpochHeaderStrict(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64 // 0: refused
	}{
		{"10", 10}, {"1", 1}, {"9223372036854775807", 9223372036854775807},
		{"+10", 0}, {"010", 0}, {"-1", 0}, {"0", 0}, {"", 0}, {" 10", 0}, {"10 ", 0},
		{"1_0", 0}, {"0x10", 0}, {"1e3", 0}, {"9223372036854775808", 0}, {"٣", 0},
	} {
		r := httptest.NewRequest("POST", "/v1/delete/data?path=x", nil)
		r.Header.Set(hdrEpoch, c.in)
		r.Header.Set(hdrNode, "a")
		var q request
		err := decodeFence(r, &q)
		if c.want == 0 {
			if err == nil {
				t.Errorf("%q: accepted as %d", c.in, q.epoch)
			}
			continue
		}
		if err != nil || q.epoch != c.want {
			t.Errorf("%q: %d %v, want %d", c.in, q.epoch, err, c.want)
		}
	}
}

// Issue 16 finding 2: excluded files (*.tmp, *.swp, cache/, logs/) inside
// a never-received directory are this node's own data: when the directory
// is deleted, renamed over or replaced by a file, they go to quarantine
// with the rest. The old code quarantined only a and deleted the others.
func TestExcludedFilesQuarantined(t *testing.T) {
	local := map[string]string{"a": "a", "x.tmp": "x", "b.swp": "b", "cache/c": "c", "logs/l": "l"}
	for _, c := range []struct {
		name string
		push func(h *hostileClient) int
	}{
		{"delete", func(h *hostileClient) int { return h.do("POST", "/v1/delete/data?path=d", "5", "") }},
		{"rename onto", func(h *hostileClient) int {
			if st := h.do("PUT", "/v1/put/data?path=src.txt&mode=644&mtime=0", "5", "new"); st != 200 {
				return st
			}
			return h.do("POST", "/v1/rename/data?path=src.txt&to=d", "5", "")
		}},
		{"file replaces", func(h *hostileClient) int {
			return h.do("PUT", "/v1/put/data?path=d&mode=644&mtime=0", "5", "new")
		}},
		{"batch file replaces", func(h *hostileClient) int {
			st, res := h.batch("5", 1, batchBody([]batchFile{{path: "d", content: "new", mode: 0o644}}))
			if st == 200 && len(res) == 1 {
				st = res[0].Status
			}
			return st
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, b, p := pair(t)
			for f, content := range local {
				writeFile(t, filepath.Join(b.root, "d", f), content, 0o644)
			}
			if st := c.push(newHostileClient(t, p, b.ln.Addr().String())); st != 200 {
				t.Fatalf("push: %d", st)
			}
			q := filepath.Join(b.root, quarantineDir, "5", "d")
			for f, content := range local {
				if got := readFile(filepath.Join(q, f)); got != content {
					t.Errorf("%s in quarantine: %q, want %q", f, got, content)
				}
			}
		})
	}
}

// Issue 16 finding 4: temp files a killed receiver left are removed at
// start and counted, and so is a temp directory (one the installer had
// not renamed into place yet); a quarantined file is not touched.
func TestStaleTempsRemovedAtStart(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	left := []string{tempPrefix + "0123456789abcdef", "sub/deeper/" + tempPrefix + "fedcba9876543210"}
	for _, f := range left {
		writeFile(t, filepath.Join(root, f), "half a file", 0o600)
	}
	tmpDir := filepath.Join(root, "sub", tempPrefix+"00112233445566aa")
	if err := os.Mkdir(tmpDir, 0o755); err != nil {
		t.Fatal(err)
	}
	kept := filepath.Join(root, quarantineDir, "3", tempPrefix+"0000000000000000")
	writeFile(t, kept, "quarantined", 0o600)
	b := startNode(t, "b", testConfig(p, "b", root, filepath.Join(dir, "state"), "127.0.0.1:1"), listen(t), &fakeFence{})
	eventually(t, 10*time.Second, "the temp files to be removed", func() bool {
		for _, f := range left {
			if _, err := os.Lstat(filepath.Join(root, f)); err == nil {
				return false
			}
		}
		return true
	})
	eventually(t, 10*time.Second, "the removal to be counted", func() bool {
		return counterValue(b.s.m.staleTemps) == float64(len(left)) && counterValue(b.s.m.staleDirs) == 1
	})
	if _, err := os.Lstat(tmpDir); err == nil {
		t.Error("the temp directory is still there")
	}
	if readFile(kept) != "quarantined" {
		t.Fatal("a file in the quarantine was removed")
	}
}

// Issue 16 finding 4: a batch refused as a whole (413, or a body cut
// short) leaves nothing behind, not even the directory its first file
// needed. The old code left the empty directory.
func TestRefusedBatchLeavesNoDirectory(t *testing.T) {
	_, b, p := pair(t)
	h := newHostileClient(t, p, b.ln.Addr().String())
	first := batchBody([]batchFile{{path: "new/dir/first.txt", content: "one", mode: 0o644}})
	cut := append(append([]byte{}, first...), "path=second&mode=644&mtime=0&size=10\nabc"...)
	if st, _ := h.batch("5", 2, cut); st == 200 {
		t.Fatalf("cut batch: %d", st)
	}
	big := batchBody([]batchFile{{path: "new/dir/first.txt", content: "one", mode: 0o644},
		{path: "new/dir/big", content: string(make([]byte, batchMaxBody)), mode: 0o644}})
	if st, _ := h.batch("5", 2, big); st != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized batch: %d, want 413", st)
	}
	if _, err := os.Lstat(filepath.Join(b.root, "new")); err == nil {
		t.Fatal("a refused batch left a directory")
	}
	noTempFiles(t, b.root)
}

// Issue 16 finding 5: a delivery is on disk in the record before the
// receiver answers 200, so a crash right after never turns delivered
// files into false quarantine. What a restarted receiver would read
// (openRecord of the state directory, the periodic rewrite not run yet)
// must hold every path just answered. The old code wrote the record
// every 3 s only.
func TestDeliveryRecordDurableBeforeAnswer(t *testing.T) {
	_, b, p := pair(t)
	h := newHostileClient(t, p, b.ln.Addr().String())
	if st := h.do("PUT", "/v1/put/data?path=a.txt&mode=644&mtime=0", "5", "a"); st != 200 {
		t.Fatalf("put: %d", st)
	}
	files := []batchFile{{path: "b1", content: "b1", mode: 0o644}, {path: "d/b2", content: "b2", mode: 0o644}}
	if st, res := h.batch("5", len(files), batchBody(files)); st != 200 || res[0].Status != 200 || res[1].Status != 200 {
		t.Fatalf("batch: %d %+v", st, res)
	}
	if st := h.do("POST", "/v1/mkdir/data?path=dir2&mode=755", "5", ""); st != 200 {
		t.Fatalf("mkdir: %d", st)
	}
	if st := h.do("POST", "/v1/rename/data?path=a.txt&to=dir2/c.txt", "5", ""); st != 200 {
		t.Fatalf("rename: %d", st)
	}
	rec, err := openRecord(b.state, "data")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"b1", "d", "d/b2", "dir2", "dir2/c.txt"} {
		fi, err := os.Lstat(filepath.Join(b.root, p))
		if err != nil {
			t.Fatal(err)
		}
		if e, ok := rec.get(p); !ok || !e.sameContent(entryOf(fi)) {
			t.Errorf("%s: a restarted receiver reads %+v (%v), on disk %+v", p, e, ok, entryOf(fi))
		}
	}
	if _, ok := rec.get("a.txt"); ok {
		t.Error("a.txt: renamed away, still in the record a restart reads")
	}
}

// Recording an entry the record already holds writes nothing: a
// reconcile of an unchanged tree (every file confirmed again) commits
// without a journal write or an fdatasync.
func TestRecordSetUnchangedWritesNothing(t *testing.T) {
	dir := t.TempDir()
	r, err := openRecord(dir, "data")
	if err != nil {
		t.Fatal(err)
	}
	e := entry{Kind: 'f', Size: 1, Mtime: 2, Mode: 0o644, Ino: 3, Ctime: 4}
	r.set("a", e)
	if err := r.commit(); err != nil {
		t.Fatal(err)
	}
	written := r.j.f
	if written == nil {
		t.Fatal("first set wrote no journal")
	}
	fi, err := written.Stat()
	if err != nil {
		t.Fatal(err)
	}
	r.set("a", e)
	if n := len(r.j.pending); n != 0 {
		t.Fatalf("unchanged entry left %d pending journal bytes", n)
	}
	if err := r.commit(); err != nil {
		t.Fatal(err)
	}
	if fi2, _ := written.Stat(); fi2.Size() != fi.Size() {
		t.Fatalf("journal grew %d -> %d bytes for an unchanged entry", fi.Size(), fi2.Size())
	}
	changed := e
	changed.Ctime = 5 // a local rewrite keeping size and mtime
	r.set("a", changed)
	if len(r.j.pending) == 0 {
		t.Fatal("a changed entry was not journalled")
	}
	if err := r.commit(); err != nil {
		t.Fatal(err)
	}
	got, err := openRecord(dir, "data")
	if err != nil {
		t.Fatal(err)
	}
	if got.m["a"] != changed {
		t.Fatalf("replayed %+v, want %+v", got.m["a"], changed)
	}
}

// commitWith writes the journal before the caller's syncfs runs (the
// syncfs is what makes the lines durable), holds commits off until it
// returns, and a failed syncfs is the commit's failure.
func TestRecordCommitWithSyncfs(t *testing.T) {
	dir := t.TempDir()
	r, err := openRecord(dir, "data")
	if err != nil {
		t.Fatal(err)
	}
	e := entry{Kind: 'f', Size: 1, Mtime: 2, Mode: 0o644, Ino: 3, Ctime: 4}
	r.set("a", e)
	err = r.commitWith(func() error {
		b, err := os.ReadFile(r.j.name(r.j.gen))
		if err != nil || !strings.Contains(string(b), `"a"`) {
			t.Errorf("journal before the syncfs: %q, %v; want the line for a", b, err)
		}
		if r.fmu.TryLock() {
			t.Error("fmu free during the syncfs: a commit could return before its lines are durable")
			r.fmu.Unlock()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.j.pending) != 0 {
		t.Fatalf("%d bytes still pending", len(r.j.pending))
	}
	r.set("b", e)
	boom := errors.New("syncfs: EIO")
	if err := r.commitWith(func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("commitWith = %v, want the syncfs error", err)
	}
	got, err := openRecord(dir, "data")
	if err != nil {
		t.Fatal(err)
	}
	if got.m["a"] != e || got.m["b"] != e {
		t.Fatalf("replayed %v", got.m)
	}
	root, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if !sameFS(root, dir) {
		t.Fatal("sameFS: a directory is not on its own file system")
	}
	if sameFS(root, "/proc") {
		t.Fatal("sameFS: a temp dir on /proc's file system")
	}
}

// The journal replays over the record file whatever happened since it
// was written, across rewrites, and stops at a torn last line.
func TestRecordJournalReplay(t *testing.T) {
	dir := t.TempDir()
	r, err := openRecord(dir, "data")
	if err != nil {
		t.Fatal(err)
	}
	r.set("x/a", entry{Kind: 'f', Size: 1, Mtime: 2, Mode: 0o644, Ino: 3})
	r.set("x/b", entry{Kind: 'f', Size: 4, Mode: 0o600, Ino: 5})
	r.set("odd \"name\"\n", entry{Kind: 'l', Ino: 6})
	if err := r.commit(); err != nil {
		t.Fatal(err)
	}
	if err := r.flush(); err != nil {
		t.Fatal(err)
	}
	r.renameTree("x", "y z")
	r.set("c", entry{Kind: 'd', Mode: 0o755, Ino: 7})
	r.removeTree("odd \"name\"\n")
	if err := r.commit(); err != nil {
		t.Fatal(err)
	}
	want := map[string]entry{}
	for k, v := range r.m {
		want[k] = v
	}
	got, err := openRecord(dir, "data")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got.m) != fmt.Sprint(want) {
		t.Fatalf("replayed %v, want %v", got.m, want)
	}
	// A torn line at the end is dropped, the lines before it kept.
	gens, _ := got.j.generations()
	f, err := os.OpenFile(got.j.name(gens[len(gens)-1]), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("s f 1 2 644 9 \"torn")
	f.Close()
	again, err := openRecord(dir, "data")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(again.m) != fmt.Sprint(want) {
		t.Fatalf("with a torn tail: %v, want %v", again.m, want)
	}
	// A rewrite folds the journals in and removes them.
	if err := again.flush(); err != nil {
		t.Fatal(err)
	}
	if gens, _ := again.j.generations(); len(gens) != 0 {
		t.Fatalf("journals left after a rewrite: %v", gens)
	}
	last, _ := openRecord(dir, "data")
	if fmt.Sprint(last.m) != fmt.Sprint(want) {
		t.Fatalf("after the rewrite: %v, want %v", last.m, want)
	}
}

// manifestGen is a manifest body of n file entries made on the fly, so
// the test itself allocates next to nothing for it.
type manifestGen struct {
	n, i int
	buf  []byte
	done bool
}

func (g *manifestGen) Read(p []byte) (int, error) {
	for len(g.buf) < len(p) && !g.done {
		switch {
		case g.i == 0 && g.buf == nil:
			g.buf = append(g.buf, `{"entries":[`...)
		case g.i < g.n:
			if g.i > 0 {
				g.buf = append(g.buf, ',')
			}
			g.buf = fmt.Appendf(g.buf, `{"p":"dir/file-%09d","k":"f","s":1,"m":1,"o":420}`, g.i)
			g.i++
		default:
			g.buf = append(g.buf, "]}"...)
			g.done = true
		}
	}
	n := copy(p, g.buf)
	g.buf = g.buf[n:]
	if n == 0 && g.done {
		return 0, io.EOF
	}
	return n, nil
}

// Issue 16 finding 7: a manifest is read one entry at a time within
// manifest-max-entries and manifest-max-bytes; one over either is refused
// with 413 as soon as the limit is read, and the receiver does not hold
// the body meanwhile (the old code decoded it whole first: 812 MB for a
// refused 257 MiB manifest).
func TestManifestBounded(t *testing.T) {
	_, b, p := pair(t, func(c *Config) { c.ManifestMaxEntries, c.ManifestMaxBytes = 1000, 1<<30 })
	h := newHostileClient(t, p, b.ln.Addr().String())
	send := func(r io.Reader) int {
		req, err := http.NewRequest("POST", "https://"+h.addr+"/v1/manifest/data", r)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(hdrEpoch, "5")
		req.Header.Set(hdrNode, "a")
		resp, err := h.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := send(&manifestGen{n: 1000}); st != 200 {
		t.Fatalf("1000 entries: %d", st)
	}
	if st := send(&manifestGen{n: 1001}); st != http.StatusRequestEntityTooLarge {
		t.Fatalf("1001 entries: %d, want 413", st)
	}
	// 2,000,000 entries (about 100 MiB) refused after the first 1,000:
	// the receiver's allocations stay far below the body's size.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if st := send(&manifestGen{n: 2_000_000}); st != http.StatusRequestEntityTooLarge {
		t.Fatalf("2M entries: %d, want 413", st)
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 32<<20 {
		t.Errorf("refusing a 100 MiB manifest allocated %d MiB", got>>20)
	}
	t.Logf("refusing a 100 MiB manifest allocated %d KiB in all", (after.TotalAlloc-before.TotalAlloc)>>10)
	if st := send(strings.NewReader(`{"entries":[{"p":"../x","k":"f"}]}`)); st != http.StatusBadRequest {
		t.Fatalf("a bad path in a manifest: %d, want 400", st)
	}
	if got := b.s.Status().HighestEpoch; got != 5 {
		t.Fatalf("highest epoch %d", got)
	}
}

// The bytes bound alone (manifest-max-bytes).
func TestManifestBoundedBytes(t *testing.T) {
	_, b, p := pair(t, func(c *Config) { c.ManifestMaxBytes = 64 << 10 })
	h := newHostileClient(t, p, b.ln.Addr().String())
	req, err := http.NewRequest("POST", "https://"+h.addr+"/v1/manifest/data", &manifestGen{n: 2000})
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(hdrEpoch, "5")
	req.Header.Set(hdrNode, "a")
	resp, err := h.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a manifest over manifest-max-bytes: %d, want 413", resp.StatusCode)
	}
}

// Issue 16 finding 3: delivery is proven by the very inode the receiver
// installed, unchanged since (its ctime), not by size and mtime. A local
// rewrite that keeps both (cp -p, touch -r) is quarantined before a push
// replaces it; a manifest naming a local file's size, mtime and mode no
// longer marks it delivered; and a local file with the very bytes pushed
// is replaced without a (false) quarantine.
func TestDeliveryProvenByIdentity(t *testing.T) {
	_, b, p := pair(t)
	h := newHostileClient(t, p, b.ln.Addr().String())
	put := func(rel, content string, mtime int64) {
		t.Helper()
		if st := h.do("PUT", fmt.Sprintf("/v1/put/data?path=%s&mode=644&mtime=%d", rel, mtime), "5", content); st != 200 {
			t.Fatalf("put %s: %d", rel, st)
		}
	}
	const mt = 1_600_000_000_000_000_000
	q := filepath.Join(b.root, quarantineDir, "5")

	// Delivered, then rewritten here with the same size and mtime.
	put("kept.txt", "delivered", mt)
	f := filepath.Join(b.root, "kept.txt")
	if err := os.WriteFile(f, []byte("LOCALEDIT"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(f, time.Unix(0, mt), time.Unix(0, mt))
	put("kept.txt", "the newer", mt+1)
	if got := readFile(filepath.Join(q, "kept.txt")); got != "LOCALEDIT" {
		t.Errorf("a local rewrite keeping size and mtime: quarantine holds %q", got)
	}

	// Never delivered; a manifest names its size, mtime and mode.
	m := filepath.Join(b.root, "local.txt")
	writeFile(t, m, "LOCAL!", 0o644)
	os.Chtimes(m, time.Unix(0, mt), time.Unix(0, mt))
	body := fmt.Sprintf(`{"entries":[{"p":"local.txt","k":"f","s":6,"m":%d,"o":420}]}`, int64(mt))
	if st := h.do("POST", "/v1/manifest/data", "5", body); st != 200 {
		t.Fatalf("manifest: %d", st)
	}
	put("local.txt", "theirs", mt)
	if got := readFile(filepath.Join(q, "local.txt")); got != "LOCAL!" {
		t.Errorf("a file a manifest named: quarantine holds %q", got)
	}

	// Never delivered, but the very bytes that are pushed: nothing to keep.
	writeFile(t, filepath.Join(b.root, "same.txt"), "same bytes", 0o644)
	put("same.txt", "same bytes", mt)
	if _, err := os.Lstat(filepath.Join(q, "same.txt")); err == nil {
		t.Error("a local file with the pushed bytes was quarantined")
	}
	if got := readFile(filepath.Join(b.root, "same.txt")); got != "same bytes" {
		t.Errorf("same.txt: %q", got)
	}
}

// A record line written before ctime was kept still reads, with ctime 0
// (proof by size and mtime, as then); one written before the owner was
// kept reads without it.
func TestRecordLegacyLine(t *testing.T) {
	m, err := decodeRecord([]byte("f 12 34 644 56 \"a b  c\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if e := m["a b  c"]; e != (entry{Kind: 'f', Size: 12, Mtime: 34, Mode: 0o644, Ino: 56}) {
		t.Fatalf("got %+v", m)
	}
	if !m["a b  c"].proves(entry{Kind: 'f', Size: 12, Mtime: 34, Ino: 99, Ctime: 7}) {
		t.Fatal("a legacy entry does not prove by size and mtime")
	}
	// Written before the owner was kept: read with OwnerKnown false, and
	// same then ignores the owner instead of sending every file again.
	m, err = decodeRecord([]byte("l 3 34 777 56 78 \"x\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if e := m["x"]; e != (entry{Kind: 'l', Size: 3, Mtime: 34, Mode: 0o777, Ino: 56, Ctime: 78}) ||
		!e.same(entry{Kind: 'l', Size: 3, Mtime: 34, Mode: 0o777, Uid: 1234, Gid: 1234, OwnerKnown: true}) {
		t.Fatalf("got %+v", m)
	}
	owned := entry{Kind: 'l', Size: 3, Mtime: 34, Mode: 0o777, OwnerKnown: true}
	if owned.same(entry{Kind: 'l', Size: 3, Mtime: 34, Mode: 0o777, Uid: 1234, Gid: 1234, OwnerKnown: true}) {
		t.Fatal("a chown alone looks unchanged")
	}
	for _, bad := range []string{"f 1 2 644 5 6 7 \"p\"\n", "f 1 2 644 5 6 7 x \"p\"\n", "f 1 2 644 5 6 -1 0 \"p\"\n", "f 1 2 644 5 6 7 8\"p\"\n"} {
		if _, err := decodeRecord([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	e := entry{Kind: 'f', Size: 12, Mtime: 34, Ino: 56, Ctime: 78}
	if e.proves(entry{Kind: 'f', Size: 12, Mtime: 34, Ino: 56, Ctime: 79}) || e.proves(entry{Kind: 'f', Size: 12, Mtime: 34, Ino: 57, Ctime: 78}) {
		t.Fatal("a changed inode or ctime still proves delivery")
	}
}

// Issue 16 finding 9: while a directory of the root is swapped, again and
// again, with a link to another directory inside the root, nothing a push
// makes (directories, files, batch files) lands in that other directory:
// every change is made relative to directories opened without following
// a link. The old code, walking paths through os.Root, which follows
// links that stay inside the root, let mkdirs and files through.
func TestSwapInsideRootNotFollowed(t *testing.T) {
	_, b, p := pair(t)
	h := newHostileClient(t, p, b.ln.Addr().String())
	other := filepath.Join(b.root, "other")
	sw, alt := filepath.Join(b.root, "sw"), filepath.Join(b.root, "swalt")
	for _, d := range []string{other, sw} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("other", alt); err != nil {
		t.Fatal(err)
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			unix.Renameat2(unix.AT_FDCWD, sw, unix.AT_FDCWD, alt, unix.RENAME_EXCHANGE)
		}
	}()
	for i := range 200 {
		h.do("POST", fmt.Sprintf("/v1/mkdir/data?path=sw/d%d&mode=777", i), "5", "")
		h.do("PUT", fmt.Sprintf("/v1/put/data?path=sw/f%d&mode=644&mtime=0", i), "5", "x")
		h.batch("5", 1, batchBody([]batchFile{{path: fmt.Sprintf("sw/new%d/b", i), content: "b", mode: 0o644}}))
	}
	close(stop)
	<-stopped
	des, err := os.ReadDir(other)
	if err != nil {
		t.Fatal(err)
	}
	if len(des) != 0 {
		var names []string
		for _, de := range des {
			names = append(names, de.Name())
		}
		t.Fatalf("%d entries landed in the other directory through the link: %v", len(des), names)
	}
	noTempFiles(t, b.root)
}
