package syncdir

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

func TestJudgeMadeDirs(t *testing.T) {
	a, b, c := madeDir{Ino: 10, Ctime: 100}, madeDir{Ino: 11, Ctime: 110}, madeDir{Ino: 12, Ctime: 120}
	dir := func(now madeDir, names ...string) dirSeen {
		return dirSeen{exists: true, isDir: true, now: now, names: names}
	}
	for _, tc := range []struct {
		name string
		list map[string]madeDir
		seen map[string]dirSeen
		want map[string]dirVerdict
	}{
		{"empty and untouched", map[string]madeDir{"x": a}, map[string]dirSeen{"x": dir(a)},
			map[string]dirVerdict{"x": dirRemove}},
		{"a chain made for one file", map[string]madeDir{"x": a, "x/y": b, "x/y/z": c},
			map[string]dirSeen{"x": dir(a, "y"), "x/y": dir(b, "z"), "x/y/z": dir(c)},
			map[string]dirVerdict{"x": dirRemove, "x/y": dirRemove, "x/y/z": dirRemove}},
		{"a file in it", map[string]madeDir{"x": a}, map[string]dirSeen{"x": dir(a, "f")},
			map[string]dirVerdict{"x": dirInUse}},
		{"a file below keeps the chain above", map[string]madeDir{"x": a, "x/y": b},
			map[string]dirSeen{"x": dir(a, "y"), "x/y": dir(b, "f")},
			map[string]dirVerdict{"x": dirInUse, "x/y": dirInUse}},
		{"an unlisted directory in it", map[string]madeDir{"x": a}, map[string]dirSeen{"x": dir(a, "mine")},
			map[string]dirVerdict{"x": dirInUse}},
		{"a sibling in use, the other empty", map[string]madeDir{"x": a, "x/y": b, "x/z": c},
			map[string]dirSeen{"x": dir(a, "y", "z"), "x/y": dir(b), "x/z": dir(c, "f")},
			map[string]dirVerdict{"x": dirInUse, "x/y": dirRemove, "x/z": dirInUse}},
		{"ctime moved (something came and went, a chmod)", map[string]madeDir{"x": a},
			map[string]dirSeen{"x": dir(madeDir{Ino: 10, Ctime: 101})}, map[string]dirVerdict{"x": dirChanged}},
		{"another inode at the name", map[string]madeDir{"x": a},
			map[string]dirSeen{"x": dir(madeDir{Ino: 99, Ctime: 100})}, map[string]dirVerdict{"x": dirReplaced}},
		{"a file at the name", map[string]madeDir{"x": a},
			map[string]dirSeen{"x": {exists: true, now: a}}, map[string]dirVerdict{"x": dirReplaced}},
		{"gone", map[string]madeDir{"x": a}, map[string]dirSeen{}, map[string]dirVerdict{"x": dirGone}},
		{"a child changed keeps its parent", map[string]madeDir{"x": a, "x/y": b},
			map[string]dirSeen{"x": dir(a, "y"), "x/y": dir(madeDir{Ino: 11, Ctime: 999})},
			map[string]dirVerdict{"x": dirInUse, "x/y": dirChanged}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := judgeMadeDirs(tc.list, tc.seen); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	order := removalOrder(map[string]dirVerdict{"x": dirRemove, "x/y/z": dirRemove, "x/y": dirRemove, "w": dirInUse})
	if want := []string{"x/y/z", "x/y", "x"}; !reflect.DeepEqual(order, want) {
		t.Errorf("removal order %v, want %v", order, want)
	}
}

func TestParseMadeDirs(t *testing.T) {
	var b []byte
	b = appendMadeLine(b, "x", madeDir{Ino: 1, Ctime: 2})
	b = appendMadeLine(b, "x/y z", madeDir{Ino: 3, Ctime: 4})
	b = appendMadeLine(b, "v", madeDir{Ino: 7, Ctime: 8})
	b = appendSettledLine(b, "v")
	b = appendMadeLine(b, "x", madeDir{Ino: 1, Ctime: 5}) // refreshed: a child was made in it
	b = appendMadeLine(b, "../out", madeDir{Ino: 9, Ctime: 9})
	b = appendMadeLine(b, "after", madeDir{Ino: 9, Ctime: 9})
	want := map[string]madeDir{"x": {Ino: 1, Ctime: 5}, "x/y z": {Ino: 3, Ctime: 4}}
	if got := parseMadeDirs(b); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v (a path out of the root ends the replay)", got, want)
	}
	torn := appendMadeLine(nil, "a", madeDir{Ino: 1, Ctime: 1})
	torn = append(torn, `+ 2 2 "b`...)
	if got := parseMadeDirs(torn); len(got) != 1 {
		t.Errorf("torn tail: %v, want only a", got)
	}
}

// Issue 16, finding 4, without a crash: the fence moves right after the
// installer made the directories a put needs, so the put is refused and
// they stay empty. The next start removes what the receiver made and left
// untouched (whole chains), keeps a directory a local program used or
// changed meanwhile and one it never made, and counts what it removed.
func TestHalfMadeDirsRemovedAtStart(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	root, state := filepath.Join(dir, "root"), filepath.Join(dir, "state")
	os.MkdirAll(filepath.Join(root, "empty-before"), 0o755)
	cfg := testConfig(p, "b", root, state, "127.0.0.1:1")
	run := func(f *fakeFence) (*Syncer, func()) {
		s, err := New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), NewMetrics(nil), f)
		if err != nil {
			t.Fatal(err)
		}
		s.ln = listen(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		stopped := false
		stop := func() {
			if !stopped {
				stopped = true
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			}
		}
		t.Cleanup(stop)
		return s, stop
	}
	list := filepath.Join(state, "made-dirs-data")
	f := &fakeFence{}
	s, stop := run(f)
	h := newHostileClient(t, p, s.ln.Addr().String())
	if st := h.do("PUT", "/v1/put/data?path=ok/sub/a.txt&mode=644&mtime=0", "5", "a"); st != 200 {
		t.Fatalf("put: %d", st)
	}
	if fi, err := os.Stat(list); err != nil || fi.Size() != 0 {
		t.Fatalf("directories settled by their file are still listed: %v %v", fi, err)
	}
	flipAt := map[string]bool{"half/way": true, "used/dir": true, "changed/x": true}
	flip := func(rel string) {
		if flipAt[rel] {
			f.mu.Lock()
			f.holding = true
			f.mu.Unlock()
		}
	}
	s.afterMadeDir.Store(&flip)
	for _, rel := range []string{"half/way/f.txt", "used/dir/f.txt", "changed/x/f.txt"} {
		if st := h.do("PUT", "/v1/put/data?path="+rel+"&mode=644&mtime=0", "5", "x"); st != http.StatusConflict {
			t.Fatalf("put %s with the fence moved after its directories: %d, want 409", rel, st)
		}
		f.mu.Lock()
		f.holding = false
		f.mu.Unlock()
	}
	stop()
	for _, d := range []string{"half/way", "used/dir", "changed/x"} {
		if fi, err := os.Lstat(filepath.Join(root, d)); err != nil || !fi.IsDir() {
			t.Fatalf("%s: not left half-made to test with: %v", d, err)
		}
	}
	// While the receiver is stopped, a local program uses one and
	// changes (chmod) another.
	writeFile(t, filepath.Join(root, "used/local.txt"), "local", 0o644)
	// The ctime must move: it is kept in ns, but some file systems tick coarsely.
	eventually(t, 10*time.Second, "changed/'s ctime to move", func() bool {
		os.Chmod(filepath.Join(root, "changed"), 0o750)
		os.Chmod(filepath.Join(root, "changed"), 0o755)
		st, err := os.Lstat(filepath.Join(root, "changed"))
		l, _ := newMadeDirs(state, "data").load()
		return err == nil && madeDirOfInfo(st) != l["changed"]
	})
	s2, _ := run(&fakeFence{})
	eventually(t, 10*time.Second, "the half-made directories to be removed and counted", func() bool {
		return counterValue(s2.m.staleDirs) == 4
	})
	for _, gone := range []string{"half", "used/dir", "changed/x"} {
		if _, err := os.Lstat(filepath.Join(root, gone)); err == nil {
			t.Errorf("%s: half-made, still there", gone)
		}
	}
	for _, kept := range []string{"used/local.txt", "changed", "empty-before", "ok/sub/a.txt"} {
		if _, err := os.Lstat(filepath.Join(root, kept)); err != nil {
			t.Errorf("%s: removed: %v", kept, err)
		}
	}
	if fi, err := os.Stat(list); err != nil || fi.Size() != 0 {
		t.Errorf("the list after the sweep: %v %v, want empty", fi, err)
	}
}

func madeDirOfInfo(fi os.FileInfo) madeDir {
	st := fi.Sys().(*syscall.Stat_t)
	return madeDir{Ino: st.Ino, Ctime: st.Ctim.Nano()}
}
