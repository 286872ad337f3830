package syncdir

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/testpki"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// fakeFence is the role as roled would report it.
type fakeFence struct {
	mu      sync.Mutex
	holding bool
	active  bool
	epoch   int64
}

func (f *fakeFence) Holding() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.holding
}

func (f *fakeFence) ActiveEpoch() (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.epoch, f.active
}

func (f *fakeFence) set(active bool, epoch int64) {
	f.mu.Lock()
	f.active, f.holding, f.epoch = active, active, epoch
	f.mu.Unlock()
}

// pki is a throwaway CA with one certificate for both nodes.
type pki = testpki.PKI

func newPKI(t testing.TB) *pki { return testpki.New(t) }

// node is one Syncer with its root, state, listener and fence.
type node struct {
	name  string
	root  string
	state string
	fence *fakeFence
	s     *Syncer
	ln    net.Listener
	lg    *zap.Logger
}

type pairOpt func(*Config)

// withOwners makes the receiver apply the sender's owners (as root).
func withOwners(c *Config) { c.Owners = true }

// listen reserves an address for a node before its Syncer exists.
func listen(t testing.TB) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func testConfig(p *pki, name, root, state, peer string, opts ...pairOpt) Config {
	cfg := DefaultConfig()
	cfg.Node = name
	cfg.Listen = "127.0.0.1:0"
	cfg.Peer = peer
	cfg.StateDir = state
	cfg.TLS = p.TLS()
	cfg.RetryMin = 20 * time.Millisecond
	cfg.RetryMax = 300 * time.Millisecond
	cfg.Roots = []Root{{Name: "data", Path: root}}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// startNode builds and runs a Syncer; it stops at cleanup.
func startNode(t testing.TB, name string, cfg Config, ln net.Listener, f *fakeFence) *node {
	t.Helper()
	lg := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).Named(name)
	s, err := New(cfg, lg, NewMetrics(nil), f)
	if err != nil {
		t.Fatal(err)
	}
	s.ln = ln
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: Run: %v", name, err)
		}
	})
	return &node{name: name, root: cfg.Roots[0].Path, state: cfg.StateDir, fence: f, s: s, ln: ln, lg: lg}
}

// pair starts nodes A and B peered with each other, both PASSIVE.
func pair(t testing.TB, opts ...pairOpt) (a, b *node, p *pki) {
	p = newPKI(t)
	lnA, lnB := listen(t), listen(t)
	dir := t.TempDir()
	mk := func(n string) (string, string) {
		r, s := filepath.Join(dir, n, "root"), filepath.Join(dir, n, "state")
		os.MkdirAll(r, 0o755)
		return r, s
	}
	ra, sa := mk("a")
	rb, sb := mk("b")
	a = startNode(t, "a", testConfig(p, "a", ra, sa, lnB.Addr().String(), opts...), lnA, &fakeFence{})
	b = startNode(t, "b", testConfig(p, "b", rb, sb, lnA.Addr().String(), opts...), lnB, &fakeFence{})
	return a, b, p
}

func (n *node) activate(epoch int64) {
	n.fence.set(true, epoch)
	n.s.SetActive(epoch)
}

func (n *node) deactivate() {
	n.fence.set(false, 0)
	n.s.SetPassive()
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// treeHash describes a tree: every path with kind, mode, size, mtime and
// content hash (files) or target (links); directory mtimes are left out.
func treeHash(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // changed while walking; the next poll sees it
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		if rel == quarantineDir {
			return fs.SkipDir
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		own := ""
		if e := entryOf(fi); canChown {
			own = fmt.Sprintf(" %d:%d", e.Uid, e.Gid)
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			tg, _ := os.Readlink(p)
			out[rel] = "link " + tg + own
		case fi.IsDir():
			out[rel] = fmt.Sprintf("dir %o%s", unixMode(fi.Mode()), own)
		default:
			out[rel] = fmt.Sprintf("file %o %d %d %s%s", unixMode(fi.Mode()), fi.Size(), fi.ModTime().UnixNano(), hashFile(t, p), own)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func hashFile(t testing.TB, p string) string {
	f, err := os.Open(p)
	if err != nil {
		return "gone"
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func diffTrees(a, b map[string]string) string {
	var lines []string
	for k, v := range a {
		if b[k] != v {
			lines = append(lines, fmt.Sprintf("%s: %q vs %q", k, v, b[k]))
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			lines = append(lines, fmt.Sprintf("%s: missing vs %q", k, v))
		}
	}
	sort.Strings(lines)
	if len(lines) > 20 {
		lines = append(lines[:20], "...")
	}
	return strings.Join(lines, "\n")
}

// waitSame waits until the two trees are identical (minus excluded paths).
func waitSame(t testing.TB, a, b *node, d time.Duration, skip func(string) bool) {
	t.Helper()
	var last string
	deadline := time.Now().Add(d)
	for {
		ha, hb := treeHash(t, a.root), treeHash(t, b.root)
		for k := range ha {
			if skip != nil && skip(k) {
				delete(ha, k)
			}
		}
		if last = diffTrees(ha, hb); last == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("trees still differ after %s:\n%s", d, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func writeFile(t testing.TB, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func readFile(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}
