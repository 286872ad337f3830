package lb

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// fakeNode follows the /ha-health contract of roled and serves an app that
// records the role it had when each request arrived.
type fakeNode struct {
	name   string
	srv    *http.Server
	ln     net.Listener
	active atomic.Bool
	epoch  atomic.Int64

	mu           sync.Mutex
	passiveSince time.Time // when it last became passive
	gotPassive   []served  // app requests served while passive
	appRequests  atomic.Int64
	appDelay     atomic.Int64 // nanoseconds
}

type served struct {
	at    time.Time
	since time.Time
	seq   string
}

func newFakeNode(t *testing.T, name string) *fakeNode {
	t.Helper()
	n := &fakeNode{name: name, passiveSince: time.Now()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n.ln = ln
	n.srv = &http.Server{Handler: n, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = n.srv.Serve(ln) }()
	t.Cleanup(func() { _ = n.srv.Close() })
	return n
}

func (n *fakeNode) addr() string { return n.ln.Addr().String() }

func (n *fakeNode) setActive(epoch int64) {
	n.mu.Lock()
	n.epoch.Store(epoch)
	n.active.Store(true)
	n.mu.Unlock()
}

func (n *fakeNode) setPassive() {
	n.mu.Lock()
	n.active.Store(false)
	n.epoch.Store(0)
	n.passiveSince = time.Now()
	n.mu.Unlock()
}

func (n *fakeNode) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/ha-health" {
		n.mu.Lock()
		active, epoch := n.active.Load(), n.epoch.Load()
		n.mu.Unlock()
		role, code := "passive", http.StatusServiceUnavailable
		if active {
			role, code = "active", http.StatusOK
		}
		w.Header().Set("X-Hapair-Role", role)
		w.Header().Set("X-Hapair-Epoch", strconv.FormatInt(epoch, 10))
		w.WriteHeader(code)
		_, _ = io.WriteString(w, `{"node":"`+n.name+`","role":"`+role+`"}`)
		return
	}
	n.appRequests.Add(1)
	n.mu.Lock()
	if !n.active.Load() {
		n.gotPassive = append(n.gotPassive, served{at: time.Now(), since: n.passiveSince, seq: r.Header.Get("X-Seq")})
	}
	role := map[bool]string{true: "active", false: "passive"}[n.active.Load()]
	n.mu.Unlock()
	if d := n.appDelay.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	if r.URL.Path == "/slow" {
		time.Sleep(time.Second) // an in-flight request for reload and drain tests
	}
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("X-Node", n.name)
	w.Header().Set("X-Node-Role", role)
	_, _ = io.WriteString(w, "hello from "+n.name+"\n")
}

// testLB starts a balancer for cfg and stops it at cleanup.
type testLB struct {
	*LB
	reg *prometheus.Registry
}

func startLB(t testing.TB, cfg Config, setup func(*LB)) *testLB {
	t.Helper()
	reg := prometheus.NewRegistry()
	lg := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	if cfg.FIFOReads == "" || cfg.FIFOReads == "auto" {
		cfg.FIFOReads = "on" // the default; TestReloadBinary runs off
	}
	l, err := New(cfg, lg, NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	l.SetGatherer(reg)
	if setup != nil {
		setup(l)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	select {
	case <-l.Ready():
	case err := <-done:
		cancel()
		t.Fatalf("run: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("lb did not stop")
		}
	})
	return &testLB{LB: l, reg: reg}
}

func (l *testLB) url(listener string) string { return "http://" + l.ListenerAddr(listener).String() }

// apConfig is an active-passive config over the given nodes.
func apConfig(nodes ...*fakeNode) Config {
	cfg := DefaultConfig()
	cfg.Admin.Listen = "127.0.0.1:0"
	cfg.ShutdownTimeout = 5 * time.Second
	cfg.Listeners = []ListenerConfig{{Name: "web", Listen: "127.0.0.1:0", Backend: "app"}}
	b := BackendConfig{Name: "app", Kind: KindActivePassive,
		Check: CheckConfig{Interval: 50 * time.Millisecond, Timeout: 40 * time.Millisecond, Fall: 2, Rise: 2}}
	for _, n := range nodes {
		b.Servers = append(b.Servers, ServerConfig{Name: n.name, Address: n.addr()})
	}
	cfg.Backends = []BackendConfig{b}
	return cfg
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// eligibleNames lists the servers currently routed to.
func eligibleNames(g *Group) []string {
	var out []string
	for _, s := range *g.eligible.Load() {
		out = append(out, s.name)
	}
	return out
}

func newClient() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
}

func durPtr(d time.Duration) *time.Duration { return &d }

// counterValue reads a counter without client_golang's testutil.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
