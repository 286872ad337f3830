package syncdir

import (
	"bytes"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// fuzzPaths is the small alphabet of paths the fuzzer combines, so
// requests meet each other: files and directories at the same names,
// excluded names, a link inside the root to a directory outside it.
var fuzzPaths = []string{"a", "b", "d", "d/b", "d/c", "d/e", "d/e/x.tmp", "d/e/f", "ln/z", "ln", "cache/k", "n/m/o"}

// FuzzReceiverSequence drives a real receiver (ServeHTTP on a real tree)
// with sequences of requests: puts, batches, mkdirs, deletes, renames,
// links, at two epochs. After every request: nothing outside the root
// changed, no temp file is left, and no local file that was never
// delivered is gone: its bytes are still in the tree or in the quarantine.
func FuzzReceiverSequence(f *testing.F) {
	f.Add([]byte{0, 0, 1, 2, 3, 3, 4, 5, 1})
	f.Add([]byte{2, 2, 0, 3, 2, 0, 1, 6, 7, 0, 4, 2, 9})
	f.Add([]byte{5, 8, 0, 0, 9, 1, 3, 3, 10, 4, 2, 3})
	f.Add([]byte{4, 2, 1, 4, 0, 2, 3, 5, 2, 1, 2, 11, 0})
	f.Fuzz(func(t *testing.T, prog []byte) {
		if len(prog) > 64 {
			prog = prog[:64]
		}
		outside := t.TempDir()
		writeFile(t, filepath.Join(outside, "secret"), "outside", 0o644)
		root := filepath.Join(t.TempDir(), "root")
		local := map[string]string{"a": "LOCAL-a", "d/b": "LOCAL-b", "d/e/x.tmp": "LOCAL-x", "d/e/f": "LOCAL-f"}
		for p, c := range local {
			writeFile(t, filepath.Join(root, p), c, 0o644)
		}
		os.Symlink(outside, filepath.Join(root, "ln"))
		cfg := DefaultConfig()
		cfg.Node, cfg.Peer, cfg.StateDir, cfg.Insecure = "b", "127.0.0.1:1", t.TempDir(), true
		cfg.Roots = []Root{{Name: "data", Path: root}}
		s, err := New(cfg, zap.NewNop(), NewMetrics(nil), &fakeFence{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.openRoots(); err != nil {
			t.Fatal(err)
		}
		defer s.closeRoots()
		next := func() int {
			if len(prog) == 0 {
				return 0
			}
			b := int(prog[0])
			prog = prog[1:]
			return b
		}
		pathOf := func() string { return fuzzPaths[next()%len(fuzzPaths)] }
		for n := 0; len(prog) > 0; n++ {
			epoch := "5"
			op := next()
			if op&0x80 != 0 {
				epoch = "4" // stale once 5 was recorded
			}
			content := fmt.Sprintf("S%d", n)
			var method, u string
			var body []byte
			switch op % 7 {
			case 0, 1:
				method, u, body = "PUT", "/v1/put/data?mode=644&mtime=0&path="+url.QueryEscape(pathOf()), []byte(content)
			case 2:
				method, u = "POST", "/v1/mkdir/data?mode=755&path="+url.QueryEscape(pathOf())
			case 3:
				method, u = "POST", "/v1/delete/data?path="+url.QueryEscape(pathOf())
			case 4:
				method, u = "POST", "/v1/rename/data?path="+url.QueryEscape(pathOf())+"&to="+url.QueryEscape(pathOf())
			case 5:
				method, u = "POST", "/v1/symlink/data?target=elsewhere&path="+url.QueryEscape(pathOf())
			case 6:
				method, u = "PUT", "/v1/batch/data?n=2"
				body = batchBody([]batchFile{{path: pathOf(), content: content + "a", mode: 0o644}, {path: pathOf(), content: content + "b", mode: 0o600}})
			}
			req := httptest.NewRequest(method, u, bytes.NewReader(body))
			req.Header.Set(hdrEpoch, epoch)
			req.Header.Set(hdrNode, "a")
			w := httptest.NewRecorder()
			s.ServeHTTP(w, req)
			if w.Code >= 500 && w.Code != http.StatusInsufficientStorage {
				t.Fatalf("request %d %s %s: %d %s", n, method, u, w.Code, w.Body.String())
			}
			checkFuzzedTree(t, root, outside, local, fmt.Sprintf("after request %d (%s %s)", n, method, u))
		}
	})
}

func checkFuzzedTree(t *testing.T, root, outside string, local map[string]string, when string) {
	t.Helper()
	if got := treeHash(t, outside); len(got) != 1 || readFile(filepath.Join(outside, "secret")) != "outside" {
		t.Fatalf("%s: outside the root changed: %v", when, got)
	}
	found := map[string]bool{}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if strings.HasPrefix(d.Name(), tempPrefix) {
			t.Errorf("%s: temp file left: %s", when, p)
		}
		if d.Type().IsRegular() {
			found[readFile(p)] = true
		}
		return nil
	})
	for p, c := range local {
		if !found[c] {
			t.Fatalf("%s: the local file %s (never delivered) is gone", when, p)
		}
	}
}
