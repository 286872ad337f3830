package lb

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// dropper reads one request per connection and closes without answering.
type dropper struct {
	ln   net.Listener
	mu   sync.Mutex
	seqs []string
}

func newDropper(t *testing.T) *dropper {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dropper{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go d.handle(c)
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return d
}

func (d *dropper) handle(c net.Conn) {
	defer c.Close()
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, req.Body)
	d.mu.Lock()
	d.seqs = append(d.seqs, req.Header.Get("X-Seq"))
	d.mu.Unlock()
}

func (d *dropper) got() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.seqs...)
}

func poolConfig(addrs ...string) Config {
	cfg := DefaultConfig()
	cfg.Admin.Listen = ""
	cfg.ShutdownTimeout = 5 * time.Second
	cfg.Listeners = []ListenerConfig{{Name: "web", Listen: "127.0.0.1:0", Backend: "pool"}}
	off := false
	b := BackendConfig{Name: "pool", Kind: KindPool, Check: CheckConfig{Enabled: &off}}
	for i, a := range addrs {
		b.Servers = append(b.Servers, ServerConfig{Name: "s" + strconv.Itoa(i), Address: a})
	}
	cfg.Backends = []BackendConfig{b}
	return cfg
}

// closedAddr returns an address where nothing listens (connect refused).
func closedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

// TestRetrySafety is Must-show 3: a POST whose connection is dropped after
// the backend read it is not replayed; GETs are retried on connect refused
// and on a drop before any response byte.
func TestRetrySafety(t *testing.T) {
	d := newDropper(t)
	good := newFakeNode(t, "good")
	cfg := poolConfig(d.ln.Addr().String(), good.addr())
	cfg.Backends[0].Balance = BalanceRoundRobin
	l := startLB(t, cfg, nil)
	c := newClient()

	var status502 int
	for i := range 6 {
		req, _ := http.NewRequest("POST", l.url("web")+"/submit", strings.NewReader("payload"))
		req.Header.Set("X-Seq", "post-"+strconv.Itoa(i))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusBadGateway {
			status502++
		}
	}
	dropped := d.got()
	if len(dropped) == 0 || status502 != len(dropped) {
		t.Fatalf("dropper read %d POSTs, clients saw %d 502s; want equal and > 0", len(dropped), status502)
	}
	if n := good.appRequests.Load(); int(n)+len(dropped) != 6 {
		t.Errorf("good backend got %d POSTs, dropper %d: a POST was replayed", n, len(dropped))
	}

	// GET: dropped before any response byte → retried on the other server.
	before := good.appRequests.Load()
	for i := range 6 {
		req, _ := http.NewRequest("GET", l.url("web")+"/page", nil)
		req.Header.Set("X-Seq", "get-"+strconv.Itoa(i))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %d: %s, want 200 after retry", i, resp.Status)
		}
	}
	if good.appRequests.Load()-before != 6 {
		t.Errorf("good served %d of 6 GETs", good.appRequests.Load()-before)
	}

	// GET on connect refused: another server, same request.
	cfg2 := poolConfig(closedAddr(t), good.addr())
	cfg2.Backends[0].Balance = BalanceRoundRobin
	l2 := startLB(t, cfg2, nil)
	for i := range 6 {
		resp, err := c.Get(l2.url("web") + "/page")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %d with a refusing server: %s, want 200", i, resp.Status)
		}
	}
	if n := counterValue(l2.m.retries.WithLabelValues("pool")); n < 1 {
		t.Errorf("retries_total = %v, want ≥ 1", n)
	}
}

// TestPoolLeastConn is Must-show 5 (first part): slow requests spread evenly.
func TestPoolLeastConn(t *testing.T) {
	nodes := []*fakeNode{newFakeNode(t, "n0"), newFakeNode(t, "n1"), newFakeNode(t, "n2")}
	var addrs []string
	for _, n := range nodes {
		n.appDelay.Store(int64(300 * time.Millisecond))
		addrs = append(addrs, n.addr())
	}
	l := startLB(t, poolConfig(addrs...), nil)
	c := newClient()
	c.Transport.(*http.Transport).MaxIdleConnsPerHost = 64
	var wg sync.WaitGroup
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Get(l.url("web") + "/slow")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
		}()
	}
	wg.Wait()
	for _, n := range nodes {
		if got := n.appRequests.Load(); got < 8 || got > 12 {
			t.Errorf("%s got %d of 30 slow requests, want about 10", n.name, got)
		}
	}
}

// TestPoolMaxFails is Must-show 5 (second part): a backend stopped during a
// continuous GET stream is avoided after max-fails, used again after
// fail-timeout once restarted, and no GET fails meanwhile.
func TestPoolMaxFails(t *testing.T) {
	nodes := []*fakeNode{newFakeNode(t, "n0"), newFakeNode(t, "n1"), newFakeNode(t, "n2")}
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr())
	}
	cfg := poolConfig(addrs...)
	cfg.Backends[0].MaxFails = 1
	cfg.Backends[0].FailTimeout = time.Second
	l := startLB(t, cfg, nil)
	s2 := l.Group("pool").server("s2")
	tr := startTraffic(t, l.url("web"), 3, nil)
	waitFor(t, 5*time.Second, "traffic on n2", func() bool { return nodes[2].appRequests.Load() > 20 })

	addr := nodes[2].addr()
	_ = nodes[2].srv.Close()
	waitFor(t, 5*time.Second, "n2 marked failed", func() bool { return s2.passiveFailed(time.Now().UnixNano()) })
	picks := s2.requests.Load()
	marked := time.Now()
	waitFor(t, 5*time.Second, "more traffic", func() bool { tr.mu.Lock(); defer tr.mu.Unlock(); return tr.total > 200 })
	if time.Since(marked) < 900*time.Millisecond {
		if extra := s2.requests.Load() - picks; extra > 1 {
			t.Errorf("failed server picked %d more times within fail-timeout", extra)
		}
	}

	// Restart on the same address; after fail-timeout it gets traffic again.
	restarted := newFakeNodeAt(t, "n2", addr)
	waitFor(t, 5*time.Second, "restarted n2 used again", func() bool { return restarted.appRequests.Load() > 10 })
	tr.halt()
	if tr.failed > 0 {
		t.Errorf("%d of %d GETs failed while a backend stopped and restarted", tr.failed, tr.total)
	}
}

func newFakeNodeAt(t *testing.T, name, addr string) *fakeNode {
	t.Helper()
	var ln net.Listener
	var err error
	waitFor(t, 5*time.Second, "rebind "+addr, func() bool {
		ln, err = net.Listen("tcp", addr)
		return err == nil
	})
	n := &fakeNode{name: name, ln: ln, passiveSince: time.Now()}
	n.srv = &http.Server{Handler: n, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = n.srv.Serve(ln) }()
	t.Cleanup(func() { _ = n.srv.Close() })
	return n
}

// TestWeights: round-robin and least-conn honour weights.
func TestWeights(t *testing.T) {
	for _, bal := range []Balance{BalanceRoundRobin, BalanceLeastConn} {
		cfg := poolConfig("127.0.0.1:1", "127.0.0.1:2")
		cfg.Backends[0].Balance = bal
		cfg.Backends[0].Servers[1].Weight = 3
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		g := newGroup(cfg.Backends[0], zap.NewNop(), NewMetrics(prometheus.NewRegistry()))
		g.recompute("test")
		counts := map[string]int{}
		var held []*Server
		for i := range 400 {
			s := g.pick(nil)
			counts[s.name]++
			if bal == BalanceLeastConn {
				held = append(held, s) // keep them in flight: least-conn balances load
				if i%8 == 7 {
					for _, h := range held {
						h.release()
					}
					held = held[:0]
				}
			} else {
				s.release()
			}
		}
		if r := float64(counts["s1"]) / float64(counts["s0"]); r < 2.4 || r > 3.6 {
			t.Errorf("%s: s1/s0 = %d/%d, want about 3", bal, counts["s1"], counts["s0"])
		}
	}
}
