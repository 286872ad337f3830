package roled

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sync/errgroup"

	"github.com/hapair/hapair/internal/etcdtest"
	"github.com/hapair/hapair/syncdir"
)

// fakePatroni is a controllable stand-in for one node's Patroni 3.0.2: a REST
// API that answers like BaseHTTP (HTTP/1.0, close; HEAD/OPTIONS a bare status
// line), and a writer of the leader key the way Patroni does it: create-if-
// absent on its own lease, delete on demotion; overwrite() is 3.0.2's plain
// PUT after a partition heals (LAB.md §6).
type fakePatroni struct {
	t      testing.TB
	member string
	key    string
	cli    *clientv3.Client
	ln     net.Listener

	mu      sync.Mutex
	primary bool // /primary 200 and role master
	garbage bool // answer with a non-Patroni body
	hang    bool // accept, never answer
	// timeline, WAL location and GET /history body (defaults 1, 50331744,
	// []), for the failover history's WAL arithmetic
	timeline int64
	location int64
	history  string
	lease    clientv3.LeaseID
	stopKA   context.CancelFunc
	served   atomic.Int64
}

func newFakePatroni(t testing.TB, cli *clientv3.Client, member, scope string) *fakePatroni {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &fakePatroni{t: t, member: member, key: "/service/" + scope + "/leader", cli: cli, ln: ln}
	done := make(chan struct{})
	go func() { defer close(done); p.serve() }()
	t.Cleanup(func() {
		ln.Close()
		<-done
		p.mu.Lock()
		if p.stopKA != nil {
			p.stopKA()
		}
		p.mu.Unlock()
	})
	return p
}

func (p *fakePatroni) URL() string { return "http://" + p.ln.Addr().String() }

func (p *fakePatroni) serve() {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() { defer wg.Done(); p.handle(c) }()
	}
}

func (p *fakePatroni) handle(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		return
	}
	for {
		h, err := br.ReadString('\n')
		if err != nil || h == "\r\n" || h == "\n" {
			break
		}
	}
	f := strings.Fields(line)
	if len(f) < 2 {
		return
	}
	method, path := f[0], f[1]
	p.mu.Lock()
	primary, garbage, hang := p.primary, p.garbage, p.hang
	p.mu.Unlock()
	p.served.Add(1)
	if hang {
		_, _ = io.Copy(io.Discard, br) // until the client gives up
		return
	}
	p.mu.Lock()
	tl, loc, hist := p.timeline, p.location, p.history
	p.mu.Unlock()
	code, body := p.answer(path, primary, tl, loc, hist)
	if garbage {
		code, body = 200, "<html>502 Bad Gateway</html>"
	}
	status := map[int]string{200: "200 OK", 503: "503 Service Unavailable"}[code]
	if method == "HEAD" || method == "OPTIONS" {
		fmt.Fprintf(c, "HTTP/1.0 %s\r\n\r\n", status)
		return
	}
	fmt.Fprintf(c, "HTTP/1.0 %s\r\nServer: BaseHTTP/0.6 Python/3.11.2\r\nDate: %s\r\nContent-Type: application/json\r\n\r\n%s",
		status, time.Now().UTC().Format(http.TimeFormat), body)
}

func (p *fakePatroni) answer(path string, primary bool, tl, loc int64, hist string) (int, string) {
	if tl == 0 {
		tl = 1
	}
	if loc == 0 {
		loc = 50331744
	}
	if hist == "" {
		hist = "[]"
	}
	role := "replica"
	xlog := fmt.Sprintf(`{"received_location": %d, "replayed_location": %d, "replayed_timestamp": null, "paused": false}`, loc, loc)
	if primary {
		role, xlog = "master", fmt.Sprintf(`{"location": %d}`, loc)
	}
	doc := fmt.Sprintf(`{"state": "running", "postmaster_start_time": "2026-11-30 03:15:47.161331+00:00", "role": %q, "server_version": 150020, "xlog": %s, "timeline": %d, "dcs_last_seen": 1796008581, "database_system_identifier": "7713797969606798174", "patroni": {"version": "3.0.2", "scope": "hapair"}}`, role, xlog, tl)
	switch {
	case path == "/history":
		return 200, hist
	case path == "/config":
		return 200, `{"ttl": 10, "loop_wait": 2, "retry_timeout": 3}`
	case path == "/patroni":
		return 200, doc
	case path == "/primary", path == "/master", path == "/leader", path == "/":
		if primary {
			return 200, doc
		}
		return 503, doc
	case strings.HasPrefix(path, "/replica"):
		if primary {
			return 503, doc
		}
		return 200, doc
	}
	return 503, doc
}

func (p *fakePatroni) set(f func(p *fakePatroni)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

// ensureLease gives the fake its own kept-alive lease (Patroni's ttl 10).
func (p *fakePatroni) ensureLease() clientv3.LeaseID {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lease != 0 {
		return p.lease
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := p.cli.Grant(ctx, 10)
	if err != nil {
		p.t.Fatalf("fake patroni %s: grant: %v", p.member, err)
	}
	kctx, stop := context.WithCancel(context.Background())
	ch, err := p.cli.KeepAlive(kctx, g.ID)
	if err != nil {
		stop()
		p.t.Fatalf("fake patroni %s: keepalive: %v", p.member, err)
	}
	go func() {
		for range ch {
		}
	}()
	p.lease, p.stopKA = g.ID, stop
	return g.ID
}

// promote takes the leader key like Patroni (create if absent, own lease)
// after switching the REST API to primary. It returns when the key was taken.
func (p *fakePatroni) promote() time.Time {
	p.t.Helper()
	lease := p.ensureLease()
	p.set(func(p *fakePatroni) { p.primary = true })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := p.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(p.key), "=", 0)).
		Then(clientv3.OpPut(p.key, p.member, clientv3.WithLease(lease))).Commit()
	if err != nil || !resp.Succeeded {
		p.t.Fatalf("fake patroni %s: take leader key: %v (succeeded %v)", p.member, err, resp != nil && resp.Succeeded)
	}
	return time.Now()
}

// demote turns the REST API to replica and deletes our leader key.
func (p *fakePatroni) demote() {
	p.t.Helper()
	p.set(func(p *fakePatroni) { p.primary = false })
	p.dropKey()
}

// dropKey deletes the leader key if it names us (lease expiry, seen from
// the majority), leaving the REST API as it is.
func (p *fakePatroni) dropKey() {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(p.key), "=", p.member)).
		Then(clientv3.OpDelete(p.key)).Commit(); err != nil {
		p.t.Fatalf("fake patroni %s: delete leader key: %v", p.member, err)
	}
}

// overwrite is Patroni 3.0.2's _update_leader after a heal: a new lease and
// an unconditional PUT over whatever leader key exists.
func (p *fakePatroni) overwrite() {
	p.t.Helper()
	p.mu.Lock()
	if p.stopKA != nil {
		p.stopKA()
	}
	p.lease, p.stopKA = 0, nil
	p.mu.Unlock()
	lease := p.ensureLease()
	p.set(func(p *fakePatroni) { p.primary = true })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.cli.Put(ctx, p.key, p.member, clientv3.WithLease(lease)); err != nil {
		p.t.Fatalf("fake patroni %s: overwrite: %v", p.member, err)
	}
}

// node is one roled under test, in-process.
type node struct {
	name   string
	cfg    Config
	d      *Daemon
	pat    *fakePatroni
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
	url    string
}

// testConfig is a fast configuration for node name against cluster c.
func testConfig(t testing.TB, c *etcdtest.Cluster, name, patroniURL string) Config {
	cfg := DefaultConfig()
	cfg.Node = name
	cfg.Listen = "127.0.0.1:0"
	cfg.Agent.Listen = "127.0.0.1:0"
	cfg.Etcd.Endpoints = c.Endpoints()
	// Short, but with room for a 2-core machine under a load of 10+.
	cfg.LeaseTTL = 3 * time.Second
	cfg.SafetyMargin = 750 * time.Millisecond
	cfg.KeepAliveInterval = 300 * time.Millisecond
	cfg.RereadInterval = 500 * time.Millisecond
	cfg.HeartbeatInterval = time.Second
	// Below the 2.25 s deadline, with room for a linearizable read that a
	// loaded machine stretches past the 1 s default (seen at a load of 20).
	cfg.QuorumLossAfter = 1500 * time.Millisecond
	cfg.QuorumCheckInterval = 250 * time.Millisecond
	cfg.Patroni.URL = patroniURL
	cfg.Patroni.PollInterval = 200 * time.Millisecond
	cfg.Patroni.FastPollInterval = 20 * time.Millisecond
	cfg.Patroni.Timeout = time.Second
	cfg.Postgres.Enabled = false
	cfg.Postgres.Timeout = time.Second
	cfg.Marker.Path = filepath.Join(t.TempDir(), "active")
	cfg.Hooks.Timeout = 5 * time.Second
	cfg.Hooks.FailureBackoff = 300 * time.Millisecond
	cfg.Hooks.FailureBackoffMax = time.Second
	return cfg
}

func startNode(t testing.TB, c *etcdtest.Cluster, name string, mod func(*Config)) *node {
	t.Helper()
	pat := newFakePatroni(t, c.Client(t), name, "hapair")
	cfg := testConfig(t, c, name, pat.URL())
	if mod != nil {
		mod(&cfg)
	}
	return runNode(t, name, cfg, pat)
}

func runNode(t testing.TB, name string, cfg Config, pat *fakePatroni) *node {
	t.Helper()
	reg := prometheus.NewRegistry()
	d, err := New(cfg, zaptest.NewLogger(t).Named(name), NewMetrics(reg))
	if err != nil {
		t.Fatalf("node %s: %v", name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{name: name, cfg: cfg, d: d, pat: pat, reg: reg, cancel: cancel, done: make(chan error, 1),
		url: "http://" + d.HTTPAddr()}
	if cfg.SyncEnabled() {
		// The same wiring as cmd/hapair-roled.
		s, err := syncdir.New(cfg.SyncConfig(), zaptest.NewLogger(t).Named(name+".sync"), syncdir.NewMetrics(reg), d)
		if err != nil {
			d.Close()
			t.Fatalf("node %s: sync: %v", name, err)
		}
		d.SetSync(SyncHooks{SetActive: s.SetActive, SetPassive: s.SetPassive, Status: func() any { return s.Status() }})
		go func() {
			var g errgroup.Group
			g.Go(func() error { return d.Run(ctx) })
			g.Go(func() error { return s.Run(ctx) })
			n.done <- g.Wait()
		}()
		t.Cleanup(func() { n.stop(t) })
		return n
	}
	go func() { n.done <- d.Run(ctx) }()
	t.Cleanup(func() { n.stop(t) })
	return n
}

func (n *node) stop(t testing.TB) {
	if n.cancel == nil {
		return
	}
	n.cancel()
	n.cancel = nil
	select {
	case err := <-n.done:
		if err != nil {
			t.Errorf("node %s: Run: %v", n.name, err)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("node %s: Run did not return", n.name)
	}
}

var probeClient = &http.Client{Timeout: 200 * time.Millisecond,
	Transport: &http.Transport{DisableKeepAlives: true}}

// health returns the /ha-health code and epoch header; 0 on error (the
// checker's short timeout: a node that does not answer is not ACTIVE).
func health(url string) (int, int64) { return healthVia(probeClient, url) }

// patientHealth waits up to 5 s for the answer, for asserting a code.
func patientHealth(url string) (int, int64) { return healthVia(statusClient, url) }

func healthVia(hc *http.Client, url string) (int, int64) {
	resp, err := hc.Get(url + "/ha-health")
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	e, _ := strconv.ParseInt(resp.Header.Get("X-Hapair-Epoch"), 10, 64)
	return resp.StatusCode, e
}

// statusClient is patient: /role is read to assert, not to race.
var statusClient = &http.Client{Timeout: 5 * time.Second}

func (n *node) status(t testing.TB) Status {
	t.Helper()
	resp, err := statusClient.Get(n.url + "/role")
	if err != nil {
		t.Fatalf("node %s /role: %v", n.name, err)
	}
	defer resp.Body.Close()
	var st Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("node %s /role: %v", n.name, err)
	}
	return st
}

// waitFor polls cond every 5 ms until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (n *node) waitCode(t testing.TB, code int, timeout time.Duration) int64 {
	t.Helper()
	var epoch int64
	waitFor(t, timeout, fmt.Sprintf("%s /ha-health %d", n.name, code), func() bool {
		c, e := health(n.url)
		epoch = e
		return c == code
	})
	return epoch
}

func markerExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// overlapChecker polls every node's /ha-health every 5 ms and records any
// round in which more than one answered 200, and every epoch seen with 200.
type overlapChecker struct {
	stop     chan struct{}
	done     chan struct{}
	overlaps atomic.Int64
	rounds   atomic.Int64
	mu       sync.Mutex
	first200 map[string]map[int64]time.Time // node -> epoch -> first seen
	last200  map[string]time.Time
}

func startChecker(t testing.TB, nodes ...*node) *overlapChecker {
	oc := &overlapChecker{stop: make(chan struct{}), done: make(chan struct{}),
		first200: map[string]map[int64]time.Time{}, last200: map[string]time.Time{}}
	go func() {
		defer close(oc.done)
		tk := time.NewTicker(5 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-oc.stop:
				return
			case <-tk.C:
			}
			oc.round(t, nodes)
		}
	}()
	t.Cleanup(oc.halt)
	return oc
}

func (oc *overlapChecker) round(t testing.TB, nodes []*node) {
	type res struct {
		code  int
		epoch int64
	}
	rs := make([]res, len(nodes))
	// Answers are stamped with the round's start: a 200 was produced after
	// it, and it proves the node was ACTIVE no later than its arrival.
	now := time.Now()
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); c, e := health(n.url); rs[i] = res{c, e} }()
	}
	wg.Wait()
	oc.rounds.Add(1)
	ok := 0
	oc.mu.Lock()
	defer oc.mu.Unlock()
	for i, r := range rs {
		if r.code != 200 {
			continue
		}
		ok++
		name := nodes[i].name
		if oc.first200[name] == nil {
			oc.first200[name] = map[int64]time.Time{}
		}
		if _, seen := oc.first200[name][r.epoch]; !seen {
			oc.first200[name][r.epoch] = now
		}
		oc.last200[name] = now
	}
	if ok > 1 {
		oc.overlaps.Add(1)
		t.Errorf("overlap: %d nodes answered 200 in one round: %+v", ok, rs)
	}
}

func (oc *overlapChecker) halt() {
	select {
	case <-oc.stop:
	default:
		close(oc.stop)
	}
	<-oc.done
}

func (oc *overlapChecker) lastOK(name string) time.Time {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	return oc.last200[name]
}

func getKey(t testing.TB, cli *clientv3.Client, key string) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return "", false
	}
	return string(resp.Kvs[0].Value), true
}

func listenLocal(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
