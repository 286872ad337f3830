package syncdir

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/config"
	"github.com/hapair/hapair/internal/proctest"
	"go.uber.org/zap"
)

// The crash helper is this test binary run again as a receiver on the
// listener handed down as fd 3, until it is killed.
const crashHelperEnv = "HAPAIR_SYNCDIR_CRASH_HELPER"

func TestCrashHelper(t *testing.T) {
	if os.Getenv(crashHelperEnv) == "" {
		return // only as the child of TestReceiverCrash
	}
	env := func(k string) string { return os.Getenv(crashHelperEnv + "_" + k) }
	cfg := DefaultConfig()
	cfg.Node, cfg.Listen, cfg.Peer, cfg.StateDir = "b", "127.0.0.1:0", "127.0.0.1:1", env("STATE")
	cfg.TLS = config.TLS{CertFile: env("CERT"), KeyFile: env("KEY"), CAFile: env("CA")}
	cfg.Roots = []Root{{Name: "data", Path: env("ROOT")}}
	s, err := New(cfg, zap.NewNop(), NewMetrics(nil), &fakeFence{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ln, err := net.FileListener(os.NewFile(3, "listener"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	s.ln = ln
	if at := env("DIE_AT"); at != "" {
		// A kill between making a directory a change needs and the change.
		die := func(rel string) {
			if rel == at {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
		s.afterMadeDir.Store(&die)
	}
	s.Run(context.Background()) // until SIGKILL
	os.Exit(3)
}

// crashChild runs the crash helper as a receiver of root, state on ln.
type crashChild struct {
	t           *testing.T
	p           *pki
	root, state string
	lnFile      *os.File
	cmd         *exec.Cmd
}

func newCrashChild(t *testing.T, p *pki, root, state string) (*crashChild, net.Listener) {
	ln := listen(t).(*net.TCPListener)
	t.Cleanup(func() { ln.Close() })
	lnFile, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lnFile.Close() })
	c := &crashChild{t: t, p: p, root: root, state: state, lnFile: lnFile}
	t.Cleanup(func() {
		if c.cmd != nil && c.cmd.ProcessState == nil {
			c.kill()
		}
	})
	return c, ln
}

// start runs a new receiver process; env is extra KEY=VALUE for the helper.
func (c *crashChild) start(env ...string) {
	c.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelper$")
	cmd.Env = append(os.Environ(), crashHelperEnv+"=1", crashHelperEnv+"_STATE="+c.state, crashHelperEnv+"_ROOT="+c.root,
		crashHelperEnv+"_CERT="+c.p.Cert, crashHelperEnv+"_KEY="+c.p.Key, crashHelperEnv+"_CA="+c.p.CA)
	for _, e := range env {
		cmd.Env = append(cmd.Env, crashHelperEnv+"_"+e)
	}
	cmd.ExtraFiles = []*os.File{c.lnFile}
	proctest.DieWithTest(cmd)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.cmd = cmd
}

// kill stops the receiver with SIGKILL and reaps it.
func (c *crashChild) kill() {
	c.cmd.Process.Kill()
	c.cmd.Wait()
}

// wait reaps a receiver that ended by itself.
func (c *crashChild) wait() { c.cmd.Wait() }

// sent is what the test pushed to one path: the hashes of every version
// sent, and the last one sent without an answer.
type sent struct {
	versions   map[string]bool
	unanswered []byte
}

// Must show 2 of issue 16: a receiver process killed (SIGKILL) at random
// moments during bursts of small files (batches), single puts and a big
// file, 20 times, then restarted: no partial file is ever visible, no
// temp file is left once it serves, no delivered file goes to quarantine
// (what the sender sends again, the same bytes, replaces without it), and
// the recorded epoch never goes back.
func TestReceiverCrash(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	root, state := filepath.Join(dir, "root"), filepath.Join(dir, "state")
	os.MkdirAll(root, 0o755)
	child, ln := newCrashChild(t, p, root, state)
	start, kill := func() { child.start() }, child.kill
	h := newHostileClient(t, p, ln.Addr().String())
	h.c.Timeout = 30 * time.Second
	// put sends one file; it reports the status, 0 when there was no answer.
	put := func(epoch int64, rel string, content []byte) int {
		req, err := http.NewRequest("PUT", fmt.Sprintf("https://%s/v1/put/data?path=%s&mode=644&mtime=0", h.addr, rel), bytes.NewReader(content))
		if err != nil {
			t.Error(err)
			return 0
		}
		req.Header.Set(hdrEpoch, strconv.FormatInt(epoch, 10))
		req.Header.Set(hdrNode, "a")
		resp, err := h.c.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	hash := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:8]) }
	var mu sync.Mutex
	paths := map[string]*sent{}
	note := func(rel string, content []byte, answered bool) {
		mu.Lock()
		defer mu.Unlock()
		s := paths[rel]
		if s == nil {
			s = &sent{versions: map[string]bool{}}
			paths[rel] = s
		}
		s.versions[hash(content)] = true
		if !answered {
			s.unanswered = content
		}
	}
	// waitServing waits for the restarted receiver to answer (its start,
	// temp-file sweep included, is then over).
	waitServing := func(epoch int64) {
		t.Helper()
		eventually(t, 30*time.Second, "the receiver to serve", func() bool {
			return h.do0("POST", "/v1/mkdir/data?path=ready&mode=755", strconv.FormatInt(epoch, 10)) == 200
		})
	}
	rng := rand.New(rand.NewPCG(16, 20))
	var highest int64
	cut := 0 // requests the kill left without an answer
	kills := 20
	if v, err := strconv.Atoi(os.Getenv("CRASH_KILLS")); err == nil {
		kills = v
	}
	start()
	for cycle := range kills {
		epoch := int64(100 + cycle)
		waitServing(epoch)
		var wg sync.WaitGroup
		// A batch of small files, single puts, one big file, at once.
		wg.Go(func() {
			var files []batchFile
			for i := range 40 {
				files = append(files, batchFile{path: fmt.Sprintf("small/s%02d", i), content: fmt.Sprintf("%d/%d %s", cycle, i, strings.Repeat("x", 4000)), mode: 0o644})
			}
			// And into directories new in this cycle, made by the installer.
			for i := range 4 {
				files = append(files, batchFile{path: fmt.Sprintf("fresh/%02d/f%d", cycle, i), content: fmt.Sprintf("fresh %d/%d", cycle, i), mode: 0o644})
			}
			st, res, _ := h.batchFrom(strconv.FormatInt(epoch, 10), len(files), bytes.NewReader(batchBody(files)))
			for i, f := range files {
				note(f.path, []byte(f.content), st == 200 && i < len(res) && res[i].Status == 200)
			}
		})
		for i := range 4 {
			wg.Go(func() {
				rel := fmt.Sprintf("mid/m%d", i)
				c := bytes.Repeat([]byte(fmt.Sprintf("%d/%d;", cycle, i)), 50_000)
				note(rel, c, put(epoch, rel, c) == 200)
			})
		}
		wg.Go(func() {
			c := bytes.Repeat([]byte(fmt.Sprintf("big %d;", cycle)), 600_000)
			note("big", c, put(epoch, "big", c) == 200)
		})
		wg.Go(func() {
			rel, c := fmt.Sprintf("deep/%02d/a/b/file", cycle), []byte(fmt.Sprintf("deep %d", cycle))
			note(rel, c, put(epoch, rel, c) == 200)
		})
		// The fault: SIGKILL at a random moment of the burst.
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
		kill()
		// Restarted at once, as systemd would: a request whose connection
		// waits in the listener's queue is then served by the new process.
		start()
		wg.Wait()
		highest = epoch
		for _, s := range paths {
			if s.unanswered != nil {
				cut++
			}
		}
		waitServing(epoch)
		checkAfterCrash(t, root, state, highest, paths, hash)
		// What the sender does next: send again what had no answer (the
		// same bytes), then a newer version of everything; nothing of it
		// may be quarantined.
		for rel, s := range paths {
			if s.unanswered != nil {
				if st := put(epoch, rel, s.unanswered); st != 200 {
					t.Fatalf("cycle %d: resend of %s: %d", cycle, rel, st)
				}
				s.unanswered = nil
			}
		}
		if q := filepath.Join(root, quarantineDir); fileExists(q) {
			var moved []string
			filepath.WalkDir(q, func(p string, d fs.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					moved = append(moved, p)
				}
				return nil
			})
			t.Fatalf("cycle %d: false quarantine after a crash: %v", cycle, moved)
		}
	}
	kill()
	t.Logf("%d kills, %d files left without an answer", kills, cut)
}

// do0 is do without failing: 0 when there was no answer.
func (h *hostileClient) do0(method, rawURL, epoch string) int {
	req, err := http.NewRequest(method, "https://"+h.addr+rawURL, nil)
	if err != nil {
		return 0
	}
	req.Header.Set(hdrEpoch, epoch)
	req.Header.Set(hdrNode, "a")
	resp, err := h.c.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// checkAfterCrash: no temp file, no half-made directory (every directory
// but the root and "ready" was made for files, which are never deleted
// here, so an empty one is half-made), every visible file one the test
// sent whole, the recorded epoch not below the highest used.
func checkAfterCrash(t *testing.T, root, state string, highest int64, paths map[string]*sent, hash func([]byte) string) {
	t.Helper()
	noTempFiles(t, root)
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			if d != nil && d.Name() == quarantineDir {
				return fs.SkipDir
			}
			if rel, _ := filepath.Rel(root, p); err == nil && rel != "." && rel != "ready" {
				if des, err := os.ReadDir(p); err == nil && len(des) == 0 {
					t.Errorf("%s: half-made directory left after the restart", rel)
				}
			}
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			return nil
		}
		if s := paths[rel]; s == nil || !s.versions[hash(b)] {
			t.Errorf("%s: visible with content never sent whole (%d bytes)", rel, len(b))
		}
		return nil
	})
	b, err := os.ReadFile(filepath.Join(state, "epoch"))
	if err != nil {
		t.Fatal(err)
	}
	if e, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); e < highest {
		t.Fatalf("recorded epoch %d went below %d", e, highest)
	}
}

// Issue 16, finding 4: a receiver killed right after it made the
// directories a put needs, before the put's file is in place, leaves them
// empty; the restarted receiver removes them before it serves (the whole
// chain), and keeps an empty directory it never made.
func TestHalfMadeDirRemovedAfterKill(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	root, state := filepath.Join(dir, "root"), filepath.Join(dir, "state")
	os.MkdirAll(filepath.Join(root, "empty-before"), 0o755)
	child, ln := newCrashChild(t, p, root, state)
	h := newHostileClient(t, p, ln.Addr().String())
	child.start("DIE_AT=new/deep")
	eventually(t, 30*time.Second, "the receiver to serve", func() bool {
		return h.do0("POST", "/v1/mkdir/data?path=ready&mode=755", "5") == 200
	})
	if st := h.do0("PUT", "/v1/put/data?path=new/deep/f.txt&mode=644&mtime=0", "5"); st != 0 {
		t.Fatalf("put: %d, want no answer (the receiver killed itself)", st)
	}
	child.wait()
	if fi, err := os.Lstat(filepath.Join(root, "new/deep")); err != nil || !fi.IsDir() {
		t.Fatalf("the kill left no half-made directory to test with: %v", err)
	}
	child.start()
	eventually(t, 30*time.Second, "the restarted receiver to serve", func() bool {
		return h.do0("POST", "/v1/mkdir/data?path=ready&mode=755", "5") == 200
	})
	if _, err := os.Lstat(filepath.Join(root, "new")); err == nil {
		t.Error("the half-made directories are still there after the restart")
	}
	if fi, err := os.Lstat(filepath.Join(root, "empty-before")); err != nil || !fi.IsDir() {
		t.Errorf("an empty directory the receiver never made was removed: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(state, "made-dirs-data")); err == nil && fi.Size() != 0 {
		t.Errorf("the half-made list holds %d bytes after the sweep, want 0", fi.Size())
	}
}
