package ctl

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hapair/hapair/internal/config"
	"github.com/hapair/hapair/internal/etcdtest"
	"github.com/hapair/hapair/roled"
)

func TestAnalyzeDowntime(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	mk := func(ms int, ok bool, node string) Sample {
		return Sample{Start: at(ms), End: at(ms + 10), OK: ok, Node: node}
	}
	samples := []Sample{
		mk(0, true, "a"), mk(50, false, ""), mk(100, false, ""), mk(150, true, "b"),
		mk(200, false, ""), mk(250, true, "b"), mk(300, true, "b"), mk(350, true, "b"),
	}
	r := Analyze(samples, t0)
	if r.Failed != 3 || r.Total != 8 {
		t.Fatalf("failed/total = %d/%d, want 3/8", r.Failed, r.Total)
	}
	// First failure at 50 ms; the first of three consecutive successes
	// starts at 250 ms and ends at 260 ms.
	if want := 210 * time.Millisecond; r.Downtime != want {
		t.Errorf("downtime = %v, want %v", r.Downtime, want)
	}
	if r.Outages != 1 || r.TotalDown != r.Downtime {
		t.Errorf("outages %d total %v", r.Outages, r.TotalDown)
	}
	two := append(append([]Sample{}, samples...), mk(400, false, ""), mk(450, true, "b"), mk(500, true, "b"), mk(550, true, "b"))
	r2 := Analyze(two, t0)
	if r2.Outages != 2 || r2.TotalDown != r.Downtime+60*time.Millisecond || r2.Longest != r.Downtime || r2.Downtime != r.Downtime {
		t.Errorf("two outages: %d, total %v, longest %v, first %v", r2.Outages, r2.TotalDown, r2.Longest, r2.Downtime)
	}
	// The headline is the total, the longest and the count; the first
	// outage alone never reads as the whole.
	if got := r2.String(); !strings.Contains(got, "outage 0.270s in all, longest 0.210s, 2 outage(s)") ||
		strings.Contains(got, "visible downtime") {
		t.Errorf("String() = %q", got)
	}
	// The longest need not be the first.
	long := append(append([]Sample{}, two...), mk(600, false, ""), mk(650, false, ""), mk(700, false, ""),
		mk(750, false, ""), mk(800, false, ""), mk(850, false, ""), mk(900, true, "b"), mk(950, true, "b"), mk(1000, true, "b"))
	if r3 := Analyze(long, t0); r3.Outages != 3 || r3.Longest != 310*time.Millisecond || r3.TotalDown != 580*time.Millisecond {
		t.Errorf("three outages: %d, longest %v, total %v", r3.Outages, r3.Longest, r3.TotalDown)
	}
	if r.FirstOK["b"] != 160*time.Millisecond || r.PerNode["b"] != 4 {
		t.Errorf("first ok b = %v, per node %v", r.FirstOK["b"], r.PerNode)
	}
	if got := Analyze(samples[:1], t0); got.Downtime != 0 || got.Failed != 0 {
		t.Errorf("no failure: %+v", got)
	}
}

func TestConfigValidateNamesField(t *testing.T) {
	cases := map[string]func(c *Config){
		"nodes[1].name":         func(c *Config) { c.Nodes = append(c.Nodes, c.Nodes[0]) },
		"nodes[0].patroni-url":  func(c *Config) { c.Nodes[0].PatroniURL = "ftp://x" },
		"lb.admin-url":          func(c *Config) { c.LB.AdminURL = "nope" },
		"drill.probe-interval":  func(c *Config) { c.Drill.ProbeInterval = 0 },
		"etcd.endpoints":        func(c *Config) { c.Etcd.Endpoints = nil },
		"key-prefix":            func(c *Config) { c.KeyPrefix = "/x" },
		"nodes[0].roled-url":    func(c *Config) { c.Nodes[0].RoledURL = "x" },
		"drill.phase-timeout":   func(c *Config) { c.Drill.PhaseTimeout = -1 },
		"drill.max-lag":         func(c *Config) { c.Drill.MaxLag = -1 },
		"drill.ready-for":       func(c *Config) { c.Drill.ReadyFor = -1 },
		"timeout":               func(c *Config) { c.Timeout = 0 },
		"cluster":               func(c *Config) { c.Cluster = "" },
		"lb.url":                func(c *Config) { c.LB.URL = ":80" },
		"lb.check-path":         func(c *Config) { c.LB.CheckPath = "check" },
		"nodes[0].patroni-url ": func(c *Config) { c.Nodes[0].PatroniURL = "" },
	}
	for field, mutate := range cases {
		c := DefaultConfig()
		c.Nodes = []Node{{Name: "a", PatroniURL: "http://127.0.0.1:8008"}}
		if err := c.Validate(); err != nil {
			t.Fatalf("base config: %v", err)
		}
		mutate(&c)
		err := c.Validate()
		var fe *config.FieldError
		if !errors.As(err, &fe) || fe.Field != strings.TrimSpace(field) {
			t.Errorf("%s: got %v", field, err)
		}
	}
}

func TestExampleConfigLoads(t *testing.T) {
	cfg := DefaultConfig()
	if err := config.Load("../examples/ctl.yaml", &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Etcd.TLS = config.TLS{} // the example's certificate files do not exist here
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Nodes) != 2 || cfg.Nodes[1].Member() != "B" || cfg.LeaderKey() != "/service/hapair/leader" {
		t.Errorf("example: %+v", cfg)
	}
}

func TestCertsMutualTLS(t *testing.T) {
	dir := t.TempDir()
	hosts := []CertHost{{Name: "a", SANs: []string{"a", "127.0.0.1"}}, {Name: "b", SANs: []string{"127.0.0.1"}}}
	written, err := Certs(dir, hosts, time.Hour, false)
	if err != nil || len(written) != 2 {
		t.Fatalf("certs: %v %v", written, err)
	}
	// A second run keeps the CA and the existing host certificates.
	ca1, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if w, err := Certs(dir, append(hosts, CertHost{Name: "c"}), time.Hour, false); err != nil || len(w) != 1 {
		t.Fatalf("second run: %v %v", w, err)
	}
	if ca2, _ := os.ReadFile(filepath.Join(dir, "ca.pem")); !bytes.Equal(ca1, ca2) {
		t.Fatal("CA was replaced")
	}
	server := config.TLS{CertFile: filepath.Join(dir, "a.pem"), KeyFile: filepath.Join(dir, "a-key.pem"),
		CAFile: filepath.Join(dir, "ca.pem")}
	sc, err := server.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	srv.TLS = sc
	srv.StartTLS()
	defer srv.Close()
	client := config.TLS{CertFile: filepath.Join(dir, "b.pem"), KeyFile: filepath.Join(dir, "b-key.pem"),
		CAFile: filepath.Join(dir, "ca.pem")}
	cc, err := client.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cc}}
	resp, err := hc.Get(srv.URL)
	if err != nil {
		t.Fatalf("mutual TLS with issued certs: %v", err)
	}
	resp.Body.Close()
	// Without a client certificate the server refuses.
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	pool.AppendCertsFromPEM(caPEM)
	bare := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if resp, err := bare.Get(srv.URL); err == nil {
		resp.Body.Close()
		t.Fatal("request without a client certificate was accepted")
	}
	if _, err := ParseCertHost("bad name=1.2.3.4"); err == nil {
		t.Error("ParseCertHost accepted a name with a space")
	}
}

// fakeCluster serves Patroni, roled and lb admin answers for one leader;
// with kv set, its switchover also moves Patroni's leader key, as Patroni
// does.
type fakeCluster struct {
	leader atomic.Value // string
	noRepl atomic.Bool  // the leader has no walsender: the standby is not ready
	// What the PASSIVE roled publishes as its own readiness (nil: none, as
	// an older roled), and a stuck leader the leader's roled publishes.
	readiness atomic.Pointer[roled.Readiness]
	stuck     atomic.Pointer[roled.StuckLeader]
	kv        *clientv3.Client
	key       string
}

func (f *fakeCluster) patroni(w http.ResponseWriter, r *http.Request) {
	l := f.leader.Load().(string)
	switch r.URL.Path {
	case "/cluster":
		ms := []PatroniMember{{Name: "a", Role: "replica", State: "running"}, {Name: "b", Role: "replica", State: "running"}}
		for i := range ms {
			if ms[i].Name == l {
				ms[i].Role = "leader"
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"members": ms})
	case "/patroni": // the leader's walsenders: the other node streams
		other := "a"
		if l == "a" {
			other = "b"
		}
		repl := []Replication{{ApplicationName: other, State: "streaming"}}
		if f.noRepl.Load() {
			repl = nil
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"role": "master", "replication": repl})
	case "/switchover":
		var body map[string]string
		_ = json.NewDecoder(r.Body).Decode(&body)
		if body["leader"] != l {
			http.Error(w, "not the leader", http.StatusPreconditionFailed)
			return
		}
		if f.kv != nil {
			if _, err := f.kv.Put(r.Context(), f.key, body["candidate"]); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		f.leader.Store(body["candidate"])
		_, _ = w.Write([]byte("Successfully switched over"))
	}
}

func (f *fakeCluster) roled(node string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		role, epoch := "passive", int64(0)
		if f.leader.Load().(string) == node {
			role, epoch = "active", 7
		}
		doc := map[string]any{"node": node, "role": role, "epoch": epoch}
		if r := f.readiness.Load(); r != nil && role == "passive" {
			doc["readiness"] = r
		}
		if s := f.stuck.Load(); s != nil && s.Node == node {
			doc["stuck_leader"] = s
			doc["role"], doc["epoch"] = "passive", 0
		}
		_ = json.NewEncoder(w).Encode(doc)
	}
}

func (f *fakeCluster) lb(w http.ResponseWriter, _ *http.Request) {
	l := f.leader.Load().(string)
	servers := []LBServer{{Name: "a", State: "DOWN"}, {Name: "b", State: "DOWN"}}
	for i := range servers {
		if servers[i].Name == l {
			servers[i].State, servers[i].Eligible = "UP", true
		}
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"backends": []map[string]any{{"name": "app", "servers": servers}}})
}

// startFakes serves a fake Patroni (one for both members), roled a and b and
// the balancer's admin from f, and returns a config that names them, with
// a as the Patroni leader. The servers stop at the end of the test.
func startFakes(t *testing.T) (*fakeCluster, Config) {
	t.Helper()
	f := &fakeCluster{}
	f.leader.Store("a")
	pat := httptest.NewServer(http.HandlerFunc(f.patroni))
	ra, rb := httptest.NewServer(f.roled("a")), httptest.NewServer(f.roled("b"))
	lb := httptest.NewServer(http.HandlerFunc(f.lb))
	for _, srv := range []*httptest.Server{pat, ra, rb, lb} {
		t.Cleanup(srv.Close)
	}
	cfg := DefaultConfig()
	cfg.Nodes = []Node{{Name: "a", PatroniURL: pat.URL, RoledURL: ra.URL}, {Name: "b", PatroniURL: pat.URL, RoledURL: rb.URL}}
	cfg.LB.AdminURL = lb.URL
	return f, cfg
}

func TestStatusAndSwitchoverAgainstFakes(t *testing.T) {
	etcd := etcdtest.New(t)
	f, cfg := startFakes(t)
	cfg.Etcd.Endpoints = etcd.Endpoints()
	cfg.Drill.PhaseTimeout = 5 * time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cli := etcd.Client(t)
	ctx := context.Background()
	if _, err := cli.Put(ctx, cfg.Prefix()+"alarm/takeover/a", `{"member":"a"}`); err != nil {
		t.Fatal(err)
	}
	c := NewClient(cfg, nil, nil)
	// Without the leader key, following falls back to Patroni's REST API.
	if ls := c.newLeaderSource(ctx, cli, "a"); ls.cli != nil {
		t.Error("leader source reads a leader key that does not exist")
	}
	f.kv, f.key = cli, cfg.LeaderKey()
	if _, err := cli.Put(ctx, f.key, "a"); err != nil {
		t.Fatal(err)
	}
	if ls := c.newLeaderSource(ctx, cli, "a"); ls.cli == nil {
		t.Error("leader source ignores a leader key that names the leader")
	}
	if ls := c.newLeaderSource(ctx, nil, "a"); ls.cli != nil {
		t.Error("leader source without an etcd client reads the key")
	}
	st := c.Status(ctx)
	if len(st.Etcd) != 3 || len(st.Patroni) != 2 || len(st.Roled) != 2 || len(st.Alarms) != 1 {
		t.Fatalf("status: %+v", st)
	}
	var buf bytes.Buffer
	if err := st.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ETCD MEMBER", "PATRONI MEMBER", "ROLED NODE", "BALANCER BACKEND", "ACTIVE", "ALARM", "hapairctl ack"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
	// A target that is not streaming is refused, with the reason.
	f.noRepl.Store(true)
	if _, err := c.Switchover(ctx, "b", &buf); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "not streaming") {
		t.Fatalf("switchover to a standby that is not ready: %v", err)
	}
	f.noRepl.Store(false)
	res, err := c.Switchover(ctx, "b", &buf)
	if err != nil {
		t.Fatalf("switchover: %v\n%s", err, buf.String())
	}
	if res.Redundant <= 0 || !strings.Contains(buf.String(), "redundant again after") {
		t.Errorf("switchover did not follow the old primary back to a ready standby (%v):\n%s", res.Redundant, buf.String())
	}
	if res.From != "a" || res.LBServing == 0 || res.RoledActive == 0 || res.PatroniLeader == 0 {
		t.Errorf("switchover result %+v", res)
	}
	if !strings.Contains(buf.String(), "asked roled on a to step down") {
		t.Errorf("no step-down before the switchover:\n%s", buf.String())
	}
	if r, err := cli.Get(ctx, cfg.Prefix()+"stepdown/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || r.Count != 0 {
		t.Errorf("step-down request not released after the switchover (count %v, err %v)", r, err)
	}
	if _, err := c.Switchover(ctx, "b", &buf); err == nil {
		t.Error("switchover to the current leader succeeded")
	}
}

// A paused etcd member (it accepts connections and never answers) shows its
// own error; the others stay healthy, and the pair is serving but not
// redundant (exit code 1) instead of every member looking UNHEALTHY.
func TestStatusRedundancyAndDeadMember(t *testing.T) {
	etcd := etcdtest.New(t)
	_, cfg := startFakes(t)
	cfg.Etcd.Endpoints = etcd.Endpoints()
	cfg.Timeout = time.Second
	c := NewClient(cfg, nil, nil)
	ctx := context.Background()
	st := c.Status(ctx)
	if st.Redundancy.Level != Redundant {
		t.Fatalf("healthy pair: %+v", st.Redundancy)
	}
	var buf bytes.Buffer
	if err := st.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(buf.String(), "\n")
	if first != "REDUNDANT yes — a ACTIVE, b ready to take over" {
		t.Errorf("headline %q", first)
	}
	if !strings.Contains(buf.String(), "STANDBY") || strings.Contains(buf.String(), "DOWN") {
		t.Errorf("the PASSIVE node should show as STANDBY, not DOWN:\n%s", buf.String())
	}

	victim := (etcd.Leader() + 1) % etcd.Size()
	etcd.Pause(victim)
	defer etcd.Resume(victim)
	st = c.Status(ctx)
	healthy := 0
	for _, m := range st.Etcd {
		if m.Healthy {
			healthy++
		} else if m.Error == "" {
			t.Errorf("unhealthy member %s without its error", m.Name)
		}
	}
	if healthy != 2 {
		t.Errorf("%d healthy members with one paused, want 2: %+v", healthy, st.Etcd)
	}
	if st.Redundancy.Level != Degraded || !strings.Contains(st.Redundancy.Line(), "etcd member") {
		t.Errorf("one member paused: %+v", st.Redundancy)
	}
}

// A step-down request is not lost to one etcd member that accepts
// connections and never answers: the client sends each request to the
// next member, and a try that stalled is tried again.
func TestStepDownSurvivesAStalledMember(t *testing.T) {
	etcd := etcdtest.New(t)
	_, cfg := startFakes(t)
	cfg.Etcd.Endpoints = etcd.Endpoints()
	cfg.Timeout = 500 * time.Millisecond
	c := NewClient(cfg, nil, nil)
	cli, err := c.Etcd()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	from, _ := c.Cfg.Node("a")
	ctx := context.Background()
	key := roled.StepDownKey(cfg.Prefix(), "a")
	// Connected to every member first (a member paused before the client
	// reached it is never picked).
	for range 2 * etcd.Size() {
		if _, err := cli.Get(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	victim := (etcd.Leader() + 1) % etcd.Size()
	check := etcd.MemberClient(t, etcd.Leader())
	etcd.Pause(victim)
	defer etcd.Resume(victim)
	// The client sends each request to the next member in turn, and a try
	// is two requests: three tries in a row meet the paused member.
	for i := range etcd.Size() {
		release, err := c.stepDown(ctx, cli, from)
		if err != nil {
			t.Fatalf("step-down %d with one member paused: %v", i, err)
		}
		defer release()
		r, err := check.Get(ctx, key)
		if err != nil || len(r.Kvs) != 1 {
			t.Fatalf("step-down %d: key %v, %v", i, r, err)
		}
	}
}

// hapairctl prefers the readiness roled computes on the standby (it sees
// the replica's own pg_stat_wal_receiver) over its reading of Patroni, which
// lists a diverged replica as running; it names a stuck leader with its
// remedy.
func TestStatusPrefersRoledReadiness(t *testing.T) {
	f, cfg := startFakes(t)
	cfg.Etcd.Endpoints = []string{"127.0.0.1:1"} // etcd plays no part here
	cfg.Timeout = 200 * time.Millisecond
	c := NewClient(cfg, nil, nil)
	ctx := context.Background()

	// Patroni and the leader's walsender say b streams; b's roled knows better.
	f.readiness.Store(&roled.Readiness{Reason: roled.StandbyNotStreaming, Detail: "no WAL receiver",
		Since: time.Now().Add(-2 * time.Second)})
	st := c.Status(ctx)
	line := st.Redundancy.Line()
	if !strings.Contains(line, "b: not streaming from the leader (no WAL receiver), for 2.") {
		t.Errorf("headline %q", line)
	}
	if reason, detail := c.StandbyReadiness(ctx, cfg.Nodes[1]); reason != StandbyRoled || detail != "not streaming from the leader (no WAL receiver)" {
		t.Errorf("StandbyReadiness = %v %q", reason, detail)
	}
	var buf bytes.Buffer
	_ = st.WriteTable(&buf)
	if !strings.Contains(buf.String(), "no: not streaming from the leader (no WAL receiver)") {
		t.Errorf("roled table lacks the standby's reason:\n%s", buf.String())
	}

	f.readiness.Store(&roled.Readiness{Ready: true, Reason: roled.StandbyReady, LagBytes: 2048})
	if reason, _ := c.StandbyReadiness(ctx, cfg.Nodes[1]); reason != StandbyReady {
		t.Errorf("ready roled: %v", reason)
	}
	buf.Reset()
	_ = c.Status(ctx).WriteTable(&buf)
	if !strings.Contains(buf.String(), "yes (lag 2.0 KiB, 0.0 s)") {
		t.Errorf("roled table lacks the ready standby:\n%s", buf.String())
	}
	// A roled that cannot check (postgres.enabled false): Patroni's view.
	f.readiness.Store(&roled.Readiness{Reason: roled.StandbyUnchecked})
	f.noRepl.Store(true)
	if reason, _ := c.StandbyReadiness(ctx, cfg.Nodes[1]); reason != StandbyNotStreaming {
		t.Errorf("fallback: %v", reason)
	}
	f.noRepl.Store(false)

	// Patroni on a holds the leader key, its PostgreSQL waits for WAL.
	f.stuck.Store(&roled.StuckLeader{Node: "a", Member: "a", Cause: roled.CauseWaitingForWAL, Seconds: 42,
		Remedy: "restart Patroni on a"})
	st = c.Status(ctx)
	if st.Redundancy.Level != NotServing || !strings.Contains(st.Redundancy.Line(),
		"a: Patroni holds the leader key but PostgreSQL has not accepted writes for 42 s (in standby mode, waiting for WAL)") {
		t.Errorf("stuck leader: %v %q", st.Redundancy.Level, st.Redundancy.Line())
	}
	buf.Reset()
	_ = st.WriteTable(&buf)
	if !strings.Contains(buf.String(), "STUCK LEADER a: Patroni holds") || !strings.Contains(buf.String(), "remedy: restart Patroni on a") {
		t.Errorf("table lacks the stuck leader and its remedy:\n%s", buf.String())
	}
}

// TestRedacted: a Patroni URL with REST API credentials is printed without
// the password.
func TestRedacted(t *testing.T) {
	if got := redacted("http://patroni:s3cret@10.0.0.11:8008"); got != "http://patroni:xxxxx@10.0.0.11:8008" {
		t.Errorf("redacted = %q", got)
	}
	if got := redacted("http://10.0.0.11:8008"); got != "http://10.0.0.11:8008" {
		t.Errorf("redacted plain = %q", got)
	}
}

// fakeApp is the application behind the balancer for the drill: each write
// lands on the Patroni leader and is replicated to the other node, except
// what the test drops; /check answers for the leader.
type fakeApp struct {
	f    *fakeCluster
	mu   sync.Mutex
	rows map[string]map[int64]bool // node → write ids present
}

func (a *fakeApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, _ := strconv.ParseInt(r.URL.Query().Get("id"), 10, 64)
	node := a.f.leader.Load().(string)
	a.mu.Lock()
	defer a.mu.Unlock()
	switch r.URL.Path {
	case "/write":
		for _, n := range []string{"a", "b"} {
			a.rows[n][id] = true
		}
	case "/check":
		if !a.rows[node][id] {
			w.WriteHeader(http.StatusNotFound)
		}
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"node": node, "id": id})
}

// lose removes node's first write (asynchronous replication lost it).
func (a *fakeApp) lose(node string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	first := int64(-1)
	for id := range a.rows[node] {
		if first < 0 || id < first {
			first = id
		}
	}
	delete(a.rows[node], first)
	return first
}

// After the takeover the drill checks every write acknowledged before the
// kill on the survivor (lb.check-path): one missing fails the phase, naming
// it; with all present it says so; without a check-path it says the check
// was skipped.
func TestDrillChecksAcknowledgedWrites(t *testing.T) {
	f, cfg := startFakes(t)
	app := &fakeApp{f: f, rows: map[string]map[int64]bool{"a": {}, "b": {}}}
	srv := httptest.NewServer(app)
	t.Cleanup(srv.Close)
	cfg.Etcd.Endpoints, cfg.Etcd.DialTimeout = []string{"http://127.0.0.1:1"}, 100*time.Millisecond // followed over REST
	cfg.Timeout = time.Second
	cfg.LB.URL, cfg.LB.CheckPath = srv.URL, "/check"
	cfg.Drill = Drill{ProbeInterval: 10 * time.Millisecond, PhaseTimeout: 5 * time.Second, Settle: 50 * time.Millisecond}
	for i := range cfg.Nodes {
		n := cfg.Nodes[i].Name
		cfg.Nodes[i].StopCommand, cfg.Nodes[i].StartCommand = "stop "+n, "start "+n
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var lost atomic.Int64
	lose := true
	old := drillAction
	t.Cleanup(func() { drillAction = old })
	drillAction = func(_ context.Context, cmd string) error {
		if victim, ok := strings.CutPrefix(cmd, "stop "); ok {
			survivor := map[string]string{"a": "b", "b": "a"}[victim]
			if lose {
				lost.Store(app.lose(survivor))
			}
			f.leader.Store(survivor) // the survivor takes over at once
		}
		return nil
	}
	c := NewClient(cfg, nil, nil)
	ctx := context.Background()

	var buf bytes.Buffer
	p := c.drillPhase(ctx, "a", &buf)
	want := fmt.Sprintf("writes acknowledged before the kill missing on b: %d", lost.Load())
	if p.OK() || !strings.Contains(strings.Join(p.Failures, "; "), want) || len(p.AckedMissing) != 1 || p.AckedBefore < 2 {
		t.Fatalf("phase with a lost write: ok=%v failures %v, acked %d missing %v; want %q\n%s",
			p.OK(), p.Failures, p.AckedBefore, p.AckedMissing, want, buf.String())
	}

	lose = false
	buf.Reset()
	p = c.drillPhase(ctx, "b", &buf)
	if !p.OK() || !p.AckChecked || len(p.AckedMissing) != 0 ||
		!strings.Contains(buf.String(), fmt.Sprintf("%d writes acknowledged before the kill: all on a", p.AckedBefore)) {
		t.Fatalf("phase with every write on the survivor: %v, acked %d\n%s", p.Failures, p.AckedBefore, buf.String())
	}
	var rep bytes.Buffer
	WriteDrillReport(&rep, []DrillPhase{p})
	if !strings.Contains(rep.String(), fmt.Sprintf("%d/%d", p.AckedBefore, p.AckedBefore)) {
		t.Errorf("report lacks the ACKED column:\n%s", rep.String())
	}

	c.Cfg.LB.CheckPath = ""
	buf.Reset()
	if p = c.drillPhase(ctx, "a", &buf); !p.OK() || p.AckChecked || !strings.Contains(buf.String(), "lb.check-path not set (skipped)") {
		t.Fatalf("phase without a check-path: %v\n%s", p.Failures, buf.String())
	}
}
