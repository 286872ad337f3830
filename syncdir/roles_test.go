package syncdir

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Must show 2: the direction follows the role.
func TestDirectionFollowsRole(t *testing.T) {
	a, b, _ := pair(t)
	a.activate(10)
	writeFile(t, filepath.Join(a.root, "from-a.txt"), "a was active", 0o644)
	waitSame(t, a, b, 10*time.Second, nil)
	waitConfirmed(t, a)

	// Switch: A passive first (stop sending), then B active with a newer epoch.
	a.deactivate()
	writeFile(t, filepath.Join(a.root, "written-on-passive-a.txt"), "must not reach b", 0o644)
	b.activate(20)
	writeFile(t, filepath.Join(b.root, "from-b.txt"), "b is active", 0o644)
	writeFile(t, filepath.Join(b.root, "from-a.txt"), "b changed it", 0o644)
	eventually(t, 10*time.Second, "b's files on a", func() bool {
		return readFile(filepath.Join(a.root, "from-b.txt")) == "b is active" &&
			readFile(filepath.Join(a.root, "from-a.txt")) == "b changed it"
	})
	waitSame(t, b, a, 10*time.Second, nil)
	if _, err := os.Lstat(filepath.Join(b.root, "written-on-passive-a.txt")); err == nil {
		t.Fatal("a file written on the passive node flowed the old way")
	}
	// Nothing is lost: the passive node's own write is in its quarantine.
	q := filepath.Join(a.root, quarantineDir, "20", "written-on-passive-a.txt")
	if readFile(q) != "must not reach b" {
		t.Fatalf("passive node's local file not quarantined: %s", readFile(q))
	}
	// The file is moved before the count is kept: wait for the count.
	eventually(t, 10*time.Second, "a's status counts the quarantined file", func() bool {
		return a.s.Status().QuarantinedTotal == 1
	})
	if st := a.s.Status(); st.Sending || st.HighestEpoch != 20 || st.QuarantinedTotal != 1 {
		t.Fatalf("a status: %+v", st)
	}

	// And back again.
	waitConfirmed(t, b)
	b.deactivate()
	a.activate(30)
	writeFile(t, filepath.Join(a.root, "back-on-a.txt"), "a again", 0o644)
	eventually(t, 10*time.Second, "a's new file on b", func() bool {
		return readFile(filepath.Join(b.root, "back-on-a.txt")) == "a again"
	})
	waitSame(t, a, b, 10*time.Second, nil)
	if got := b.s.Status().QuarantinedTotal; got != 0 {
		t.Fatalf("b quarantined %d files that were all delivered", got)
	}
}

// proxy is a TCP relay the test can cut, like a network partition.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newProxy(t testing.TB, target string) *proxy {
	p := &proxy{ln: listen(t), target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() { p.ln.Close(); p.cut(); p.wg.Wait() })
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			c.Close()
			continue
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); io.Copy(u, c); u.Close() }()
		go func() { defer p.wg.Done(); io.Copy(c, u); c.Close() }()
	}
}

func (p *proxy) cut() {
	p.mu.Lock()
	p.down = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
}

func (p *proxy) restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// Must show 3: the stale node. A writes while cut off, B takes over with a
// higher epoch and writes newer versions; when A returns, B's files win on
// both nodes, A's undelivered files are in A's quarantine, A's old-epoch
// pushes are refused by B.
func TestStaleNode(t *testing.T) {
	p := newPKI(t)
	lnA, lnB := listen(t), listen(t)
	toB, toA := newProxy(t, lnB.Addr().String()), newProxy(t, lnA.Addr().String())
	dir := t.TempDir()
	ra, rb := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	a := startNode(t, "a", testConfig(p, "a", ra, filepath.Join(dir, "sa"), toB.addr()), lnA, &fakeFence{})
	b := startNode(t, "b", testConfig(p, "b", rb, filepath.Join(dir, "sb"), toA.addr()), lnB, &fakeFence{})

	a.activate(100)
	for _, f := range []string{"f1", "f2", "f3", "dir/f4"} {
		writeFile(t, filepath.Join(ra, f), "base "+f, 0o644)
	}
	waitSame(t, a, b, 10*time.Second, nil)
	waitConfirmed(t, a)

	// Partition. A, still believing it is ACTIVE, writes; nothing arrives.
	toB.cut()
	toA.cut()
	writeFile(t, filepath.Join(ra, "f1"), "A undelivered f1", 0o644)
	writeFile(t, filepath.Join(ra, "dir/f4"), "A undelivered f4", 0o644)
	writeFile(t, filepath.Join(ra, "a-only.txt"), "A undelivered new file", 0o644)
	eventually(t, 10*time.Second, "a to notice the peer is gone", func() bool {
		return a.s.Status().QueueDepth > 0 && a.s.Status().Errors["network"] > 0
	})

	// B takes over with a higher epoch and writes newer versions.
	b.activate(200)
	writeFile(t, filepath.Join(rb, "f1"), "B newer f1", 0o644)
	writeFile(t, filepath.Join(rb, "f2"), "B newer f2", 0o644)

	// A comes back still thinking it is ACTIVE: B refuses its old epoch.
	toB.restore()
	eventually(t, 10*time.Second, "b to refuse a's old epoch", func() bool {
		return b.s.Status().Rejected["stale-epoch"] > 0
	})
	if readFile(filepath.Join(rb, "f1")) != "B newer f1" || fileExists(filepath.Join(rb, "a-only.txt")) {
		t.Fatal("a stale push was applied on b")
	}

	// roled on A notices it lost the key: A goes PASSIVE, B reaches it.
	a.deactivate()
	toA.restore()
	waitSame(t, b, a, 15*time.Second, nil)
	for f, want := range map[string]string{"f1": "B newer f1", "f2": "B newer f2", "f3": "base f3", "dir/f4": "base dir/f4"} {
		if got := readFile(filepath.Join(rb, f)); got != want {
			t.Fatalf("b's %s = %q, want %q", f, got, want)
		}
	}
	qdir := filepath.Join(ra, quarantineDir, "200")
	for f, want := range map[string]string{"f1": "A undelivered f1", "dir/f4": "A undelivered f4", "a-only.txt": "A undelivered new file"} {
		if got := readFile(filepath.Join(qdir, f)); got != want {
			t.Fatalf("quarantined %s = %q, want %q", f, got, want)
		}
	}
	st := a.s.Status()
	if st.QuarantinedTotal != 3 || len(st.Quarantined) != 3 {
		t.Fatalf("a status shows %d quarantined (%+v)", st.QuarantinedTotal, st.Quarantined)
	}
	for _, q := range st.Quarantined {
		if !strings.HasPrefix(q.Moved, qdir) || q.Epoch != 200 {
			t.Fatalf("quarantine entry %+v", q)
		}
	}
	if fileExists(filepath.Join(rb, quarantineDir)) {
		t.Fatal("b's tree got a quarantine it should not have")
	}
	// The gauge shows the files present, and falls once they are dealt with.
	if got := gaugeValue(a.s.m.inQuarantine.WithLabelValues("data")); got != 3 || st.QuarantineFiles["data"] != 3 {
		t.Fatalf("quarantine gauge %v, status %v", got, st.QuarantineFiles)
	}
	os.RemoveAll(filepath.Join(ra, quarantineDir, "200", "dir"))
	eventually(t, 3*recordFlushInterval, "the quarantine gauge to fall", func() bool {
		return a.s.Status().QuarantineFiles["data"] == 2 && gaugeValue(a.s.m.inQuarantine.WithLabelValues("data")) == 2
	})
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// waitConfirmed waits until the sender has every answer: a file is visible
// on the peer a moment before its 200 arrives, and a sender stopped in that
// moment counts the file as undelivered (and the peer later quarantines it).
func waitConfirmed(t *testing.T, n *node) {
	t.Helper()
	eventually(t, 10*time.Second, n.name+"'s queue to drain", func() bool { return n.s.Status().QueueDepth == 0 })
}

func gaugeValue(g prometheus.Gauge) float64 {
	var m dto.Metric
	g.Write(&m)
	return m.GetGauge().GetValue()
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	c.Write(&m)
	return m.GetCounter().GetValue()
}
