package roled

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hapair/hapair/internal/etcdtest"
)

func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test (real etcd); skipped with -short")
	}
}

// Must show 1: the node whose Patroni is primary becomes ACTIVE (200, marker,
// epoch > 0), the other PASSIVE (503, no marker).
func TestBootstrap(t *testing.T) {
	skipShort(t)
	c := etcdtest.New(t)
	a := startNode(t, c, "A", nil)
	b := startNode(t, c, "B", nil)
	oc := startChecker(t, a, b)
	a.pat.promote()
	epoch := a.waitCode(t, 200, 10*time.Second)
	if epoch <= 0 {
		t.Fatalf("A epoch %d, want > 0", epoch)
	}
	if !markerExists(a.cfg.Marker.Path) {
		t.Fatal("A is ACTIVE without a marker")
	}
	b.waitCode(t, 503, 10*time.Second)
	if markerExists(b.cfg.Marker.Path) {
		t.Fatal("B is PASSIVE with a marker")
	}
	v, ok := getKey(t, c.Client(t), Prefix("hapair")+"active")
	if !ok || !strings.Contains(v, `"node":"A"`) {
		t.Fatalf("active key = %q (exists %v), want node A", v, ok)
	}
	if st := a.status(t); st.Role != "active" || st.Epoch != epoch || st.Patroni.Role != "master" {
		t.Fatalf("A /role = %+v", st)
	}
	waitFor(t, 5*time.Second, "heartbeat keys", func() bool {
		_, okA := getKey(t, c.Client(t), Prefix("hapair")+"nodes/A")
		_, okB := getKey(t, c.Client(t), Prefix("hapair")+"nodes/B")
		return okA && okB
	})
	oc.halt()
	if oc.overlaps.Load() != 0 {
		t.Fatalf("%d overlapping rounds", oc.overlaps.Load())
	}
}

// Must show 2: 20 planned switchovers; never two 200s; strictly growing
// epochs; latency from the leader-key change to the new ACTIVE's 200.
func TestSwitchovers(t *testing.T) {
	skipShort(t)
	c := etcdtest.New(t)
	a := startNode(t, c, "A", nil)
	b := startNode(t, c, "B", nil)
	oc := startChecker(t, a, b)
	a.pat.promote()
	last := a.waitCode(t, 200, 10*time.Second)
	from, to := a, b
	var lat []time.Duration
	for i := 0; i < 20; i++ {
		from.pat.demote()
		changed := to.pat.promote()
		var epoch int64
		waitFor(t, 10*time.Second, to.name+" 200", func() bool {
			code, e := health(to.url)
			epoch = e
			return code == 200
		})
		lat = append(lat, time.Since(changed))
		if epoch <= last {
			t.Fatalf("switchover %d: epoch %d not above %d", i, epoch, last)
		}
		if markerExists(from.cfg.Marker.Path) || !markerExists(to.cfg.Marker.Path) {
			t.Fatalf("switchover %d: markers wrong (from %v, to %v)", i,
				markerExists(from.cfg.Marker.Path), markerExists(to.cfg.Marker.Path))
		}
		last = epoch
		from, to = to, from
	}
	oc.halt()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("leader-key change -> new ACTIVE 200 over %d switchovers: median %s, max %s, min %s (checker rounds %d)",
		len(lat), lat[len(lat)/2], lat[len(lat)-1], lat[0], oc.rounds.Load())
	if oc.overlaps.Load() != 0 {
		t.Fatalf("%d overlapping rounds", oc.overlaps.Load())
	}
}

// Must show 3: quorum loss makes the ACTIVE node PASSIVE (503, no marker)
// before its lease TTL has passed; quorum back, one node is ACTIVE again.
func TestQuorumLoss(t *testing.T) {
	skipShort(t)
	c := etcdtest.New(t)
	a := startNode(t, c, "A", nil)
	b := startNode(t, c, "B", nil)
	oc := startChecker(t, a, b)
	a.pat.promote()
	a.waitCode(t, 200, 10*time.Second)
	// Muting two members takes quorum away at one instant (stopping them
	// takes seconds each, which blurs the measurement).
	start := time.Now()
	c.Pause(1)
	c.Pause(2)
	lost := time.Now()
	waitFor(t, 2*a.cfg.LeaseTTL, "A 503 after quorum loss", func() bool {
		code, _ := patientHealth(a.url)
		return code != 200 && !markerExists(a.cfg.Marker.Path)
	})
	// The lease expires on etcd's side no earlier than TTL after the last
	// keep-alive that reached it, which was sent at or after lastSent: the
	// last 200 must come before lastSent + TTL.
	lastKA := a.d.start.Add(a.d.lease.Load().lastSent)
	last200 := oc.lastOK("A")
	t.Logf("quorum loss: A's last 200 came %s after its last successful keep-alive was sent "+
		"and %s after quorum was lost (lease TTL %s, deadline TTL-%s); 503 and no marker confirmed %s after the loss",
		last200.Sub(lastKA), last200.Sub(start), a.cfg.LeaseTTL, a.cfg.SafetyMargin, time.Since(lost))
	if took := last200.Sub(start); took >= a.cfg.LeaseTTL {
		t.Fatalf("A answered 200 %s after quorum was lost, not before the lease TTL %s", took, a.cfg.LeaseTTL)
	}
	if gap := last200.Sub(lastKA); gap >= a.cfg.LeaseTTL-a.cfg.SafetyMargin+10*time.Millisecond {
		t.Fatalf("A answered 200 %s after its last keep-alive, past its deadline (lease TTL %s)", gap, a.cfg.LeaseTTL)
	}
	c.Resume(1)
	c.Resume(2)
	waitFor(t, 20*time.Second, "one ACTIVE after quorum is back", func() bool {
		ca, _ := health(a.url)
		cb, _ := health(b.url)
		return (ca == 200) != (cb == 200)
	})
	oc.halt()
	if oc.overlaps.Load() != 0 {
		t.Fatalf("%d overlapping rounds", oc.overlaps.Load())
	}
}

// Must show 5 (first half): Patroni says primary, but the leader key names
// the peer or is missing: PASSIVE. Garbage and a hung Patroni: PASSIVE.
func TestPatroniPrimaryWithoutLeaderKey(t *testing.T) {
	skipShort(t)
	c := etcdtest.New(t)
	a := startNode(t, c, "A", nil)
	b := startNode(t, c, "B", nil)
	oc := startChecker(t, a, b)
	// B holds the leader key, but its Patroni says replica; A's says master.
	b.pat.promote()
	b.pat.set(func(p *fakePatroni) { p.primary = false })
	a.pat.set(func(p *fakePatroni) { p.primary = true })
	waitFor(t, 5*time.Second, "A sees the leader key", func() bool { return a.status(t).Etcd.Leader == "B" })
	watchPassive(t, oc, a, b, 1500*time.Millisecond)
	if r := a.status(t).Reason; r != string(ReasonLeaderOther) {
		t.Fatalf("A reason %q, want %q", r, ReasonLeaderOther)
	}
	b.pat.dropKey()
	waitFor(t, 5*time.Second, "leader key gone", func() bool { return a.status(t).Reason == string(ReasonLeaderMissing) })
	watchPassive(t, oc, a, b, time.Second)

	// A's Patroni gets the key: ACTIVE; then garbage, then a hang: PASSIVE.
	a.pat.promote()
	a.waitCode(t, 200, 5*time.Second)
	a.pat.set(func(p *fakePatroni) { p.garbage = true })
	a.waitCode(t, 503, 10*time.Second)
	if r := a.status(t).Reason; r != string(ReasonPatroniGarbage) {
		t.Fatalf("A reason %q, want %q", r, ReasonPatroniGarbage)
	}
	a.pat.set(func(p *fakePatroni) { p.garbage = false })
	a.waitCode(t, 200, 5*time.Second)
	a.pat.set(func(p *fakePatroni) { p.hang = true })
	a.waitCode(t, 503, 10*time.Second)
	if r := a.status(t).Reason; r != string(ReasonPatroniDown) {
		t.Fatalf("A reason %q, want %q", r, ReasonPatroniDown)
	}
	if n := counterValue(a.d.m.patroniErrors.WithLabelValues("garbage")); n < 1 {
		t.Fatalf("garbage errors metric %v, want >= 1", n)
	}
	a.pat.set(func(p *fakePatroni) { p.hang = false })
	oc.halt()
}

// watchPassive asserts that neither node answers 200 for d.
func watchPassive(t *testing.T, oc *overlapChecker, a, b *node, d time.Duration) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < d {
		for _, n := range []*node{a, b} {
			if code, _ := health(n.url); code == 200 {
				t.Fatalf("%s answered 200 (reason %s)", n.name, n.status(t).Reason)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Must show 6: a failing on_active leaves the node PASSIVE and the key
// released; it is retried with backoff and succeeds once the hook does.
func TestHookFailure(t *testing.T) {
	skipShort(t)
	c := etcdtest.New(t)
	flag := t.TempDir() + "/hook-ok"
	log := t.TempDir() + "/hooks.log"
	a := startNode(t, c, "A", func(cfg *Config) {
		cfg.Hooks.OnActive = "echo active $HAPAIR_EPOCH >> " + log + "; test -e " + flag
		cfg.Hooks.OnPassive = "echo passive $HAPAIR_REASON >> " + log
	})
	oc := startChecker(t, a)
	a.pat.promote()
	waitFor(t, 10*time.Second, "two failed on_active runs", func() bool {
		return counterValue(a.d.m.hookRuns.WithLabelValues("on_active", "failed")) >= 2
	})
	cli := c.Client(t)
	waitFor(t, 10*time.Second, "active key released", func() bool {
		_, ok := getKey(t, cli, Prefix("hapair")+"active")
		return !ok && !markerExists(a.cfg.Marker.Path)
	})
	if oc.lastOK("A") != (time.Time{}) {
		t.Fatal("A answered 200 although on_active failed")
	}
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	a.waitCode(t, 200, 5*time.Second)
	b, _ := os.ReadFile(log)
	if !strings.Contains(string(b), "passive on_active_failed") {
		t.Fatalf("hook log %q lacks the on_passive run after the failure", b)
	}
	oc.halt()
}

// Must show 8: the metrics pass promtool check metrics.
func TestMetricsPromtool(t *testing.T) {
	skipShort(t)
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus)")
	}
	fpm := fakeFPM(t)
	c := etcdtest.New(t)
	a := startNode(t, c, "A", func(cfg *Config) {
		cfg.PHPFPM.URL = fpm
		cfg.PHPFPM.Interval = 100 * time.Millisecond
		cfg.PHPFPM.Timeout = 100 * time.Millisecond
		cfg.PHPFPM.MaxChildren = 10
	})
	a.pat.promote()
	a.waitCode(t, 200, 10*time.Second)
	waitFor(t, 5*time.Second, "fpm scraped", func() bool { return a.d.fpm.Load().OK })
	resp, err := http.Get(a.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`hapair_roled_role{role="active"} 1`, "hapair_roled_epoch ",
		"hapair_roled_transitions_total{reason=\"primary\",to=\"active\"} 1", "hapair_roled_patroni_check_duration_seconds_bucket",
		"hapair_roled_lease_keepalive_age_seconds", "hapair_roled_fpm_utilisation_ratio 0.3", "hapair_roled_fpm_max_children 10"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(string(body))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

func fakeFPM(t *testing.T) string {
	ln := newLocalServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := r.URL.Query()["json"]; !ok {
			http.Error(w, "want ?json", 400)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"pool":"www","process manager":"dynamic","start time":1796000000,"start since":100,`+
			`"accepted conn":1234,"listen queue":2,"max listen queue":5,"listen queue len":511,"idle processes":4,`+
			`"active processes":3,"total processes":7,"max active processes":9,"max children reached":1,"slow requests":6}`)
	}))
	return ln + "/fpm-status"
}

func newLocalServer(t *testing.T, h http.Handler) string {
	srv := &http.Server{Handler: h}
	ln := listenLocal(t)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String()
}

// Must show 9: the old primary's Patroni overwrites the new leader key with a
// plain PUT; the overwriting node never serves 200, the alarm is visible in
// /role, metrics and etcd, and acknowledging it lets the node become ACTIVE.
func TestTakeoverGuard(t *testing.T) {
	skipShort(t)
	c := etcdtest.New(t)
	a := startNode(t, c, "A", nil)
	b := startNode(t, c, "B", nil)
	oc := startChecker(t, a, b)
	a.pat.promote()
	a.waitCode(t, 200, 10*time.Second)
	// A is cut off: its leader key expires on the majority, B takes it.
	a.pat.dropKey()
	b.pat.promote()
	eb := b.waitCode(t, 200, 10*time.Second)
	a.waitCode(t, 503, 10*time.Second)
	// The heal: A's Patroni PUTs its name over B's key, B's demotes.
	b.pat.set(func(p *fakePatroni) { p.primary = false })
	overwrite := time.Now()
	a.pat.overwrite()
	cli := c.Client(t)
	waitFor(t, 5*time.Second, "alarm key", func() bool {
		_, ok := getKey(t, cli, AlarmPrefix(Prefix("hapair"))+"A")
		return ok
	})
	b.waitCode(t, 503, 5*time.Second)
	watchPassive(t, oc, a, b, 1500*time.Millisecond)
	// B was ACTIVE after A: the guard cannot prove nothing is lost and
	// says so in the alarm.
	waitFor(t, 5*time.Second, "the guard's verdict in the alarm", func() bool {
		st := a.status(t)
		return len(st.Takeover) == 1 && st.Takeover[0].Guard == GuardOtherActiveLater
	})
	for _, n := range []*node{a, b} {
		st := n.status(t)
		if len(st.Takeover) != 1 || st.Takeover[0].Member != "A" || st.Takeover[0].PreviousValue != "B" || st.Takeover[0].Acked {
			t.Fatalf("%s /role takeover alarms = %+v", n.name, st.Takeover)
		}
	}
	if r := a.status(t).Reason; r != string(ReasonTakeover) {
		t.Fatalf("A reason %q, want %q", r, ReasonTakeover)
	}
	if !strings.Contains(metricsText(t, a), `hapair_roled_takeover_alarm{member="A"} 1`) {
		t.Fatal("takeover alarm metric not 1")
	}
	oc.halt()
	if last := oc.lastOK("A"); last.After(overwrite) {
		t.Fatalf("A answered 200 at %s, after the overwrite at %s", last, overwrite)
	}
	if oc.overlaps.Load() != 0 {
		t.Fatalf("%d overlapping rounds", oc.overlaps.Load())
	}
	// A restarted roled still refuses: the alarm lives in etcd.
	a.stop(t)
	a = runNode(t, "A", a.cfg, a.pat)
	oc = startChecker(t, a, b)
	waitFor(t, 10*time.Second, "restarted A sees the alarm", func() bool { return a.status(t).Reason == string(ReasonTakeover) })
	watchPassive(t, oc, a, b, time.Second)
	acked, err := AckTakeover(context.Background(), cli, Prefix("hapair"), "A", "test")
	if err != nil || len(acked) != 1 {
		t.Fatalf("ack: %v (%d)", err, len(acked))
	}
	ea := a.waitCode(t, 200, 10*time.Second)
	if ea <= eb {
		t.Fatalf("A's epoch %d after ack not above B's %d", ea, eb)
	}
	if st := a.status(t); len(st.Takeover) != 1 || !st.Takeover[0].Acked {
		t.Fatalf("after ack, alarms = %+v", st.Takeover)
	}
	// A normal re-creation of the leader key clears the alarm.
	a.pat.demote()
	b.pat.promote()
	b.waitCode(t, 200, 10*time.Second)
	waitFor(t, 5*time.Second, "alarm cleared", func() bool {
		_, ok := getKey(t, cli, AlarmPrefix(Prefix("hapair"))+"A")
		return !ok
	})
	oc.halt()
	if oc.overlaps.Load() != 0 {
		t.Fatalf("%d overlapping rounds", oc.overlaps.Load())
	}
}

// Issue 19 item 5: the takeover guard resolves itself when it can prove that
// nothing the other node acknowledged is lost. Here B's Patroni takes the
// leader key while A's is cut off, but B never becomes ACTIVE (its
// PostgreSQL never reports primary); A's Patroni then overwrites B's key. No
// node was ACTIVE since A's epoch, so A's roled acknowledges the alarm itself
// and A serves again with a new epoch, without a person.
func TestTakeoverGuardResolvesItself(t *testing.T) {
	skipShort(t)
	c := etcdtest.New(t)
	a := startNode(t, c, "A", nil)
	b := startNode(t, c, "B", nil)
	oc := startChecker(t, a, b)
	cli := c.Client(t)
	waitFor(t, 5*time.Second, "both last-active records", func() bool {
		_, okA := getKey(t, cli, LastActivePrefix(Prefix("hapair"))+"A")
		_, okB := getKey(t, cli, LastActivePrefix(Prefix("hapair"))+"B")
		return okA && okB
	})
	a.pat.promote()
	ea := a.waitCode(t, 200, 10*time.Second)
	a.pat.dropKey()
	// B's Patroni takes the key; its PostgreSQL is not promoted (yet).
	lease := b.pat.ensureLease()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(b.pat.key), "=", 0)).
		Then(clientv3.OpPut(b.pat.key, "B", clientv3.WithLease(lease))).Commit(); err != nil || !r.Succeeded {
		t.Fatalf("B takes the leader key: %v", err)
	}
	a.waitCode(t, 503, 10*time.Second)
	a.pat.overwrite()
	ea2 := a.waitCode(t, 200, 10*time.Second)
	if ea2 <= ea {
		t.Fatalf("A's epoch after the takeover %d not above its first %d", ea2, ea)
	}
	st := a.status(t)
	if len(st.Takeover) != 1 || !st.Takeover[0].Acked || !st.Takeover[0].AutoAcked || st.Takeover[0].Guard != GuardProved ||
		st.Takeover[0].AckedBy != "roled:A" {
		t.Fatalf("alarm after the guard resolved itself = %+v", st.Takeover)
	}
	if !strings.Contains(metricsText(t, a), "hapair_roled_takeover_auto_acked_total 1") {
		t.Fatal("auto-ack counter not 1")
	}
	oc.halt()
	if oc.overlaps.Load() != 0 {
		t.Fatalf("%d overlapping rounds", oc.overlaps.Load())
	}
	if code, _ := health(b.url); code == 200 {
		t.Fatal("B served")
	}
}

func metricsText(t *testing.T, n *node) string {
	t.Helper()
	resp, err := http.Get(n.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// Graceful stop: an ACTIVE node serves 503, removes its marker and deletes
// the active key before Run returns, so the peer need not wait for a TTL.
func TestGracefulStop(t *testing.T) {
	skipShort(t)
	c := etcdtest.New(t)
	a := startNode(t, c, "A", nil)
	a.pat.promote()
	a.waitCode(t, 200, 10*time.Second)
	a.stop(t)
	if markerExists(a.cfg.Marker.Path) {
		t.Fatal("marker left behind by a stopped ACTIVE node")
	}
	cli := c.Client(t)
	if v, ok := getKey(t, cli, Prefix("hapair")+"active"); ok {
		t.Fatalf("active key %q left behind by a stopped ACTIVE node", v)
	}
	if _, ok := getKey(t, cli, Prefix("hapair")+"nodes/A"); ok {
		t.Fatal("heartbeat key left behind (lease not revoked)")
	}
}

// A step-down request (the key hapairctl switchover writes before asking
// Patroni to switch over) makes an ACTIVE node PASSIVE at once, although its
// Patroni is still primary, and keeps it so until the request is gone.
func TestStepDownRequest(t *testing.T) {
	c := etcdtest.New(t)
	a := startNode(t, c, "A", nil)
	a.pat.promote()
	a.waitCode(t, 200, 10*time.Second)
	cli := c.Client(t)
	key := StepDownKey(a.cfg.prefix(), "A")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, key, "test"); err != nil {
		t.Fatal(err)
	}
	a.waitCode(t, 503, 10*time.Second)
	if r := a.status(t).Reason; r != string(ReasonStepDown) {
		t.Fatalf("reason %q, want %q", r, ReasonStepDown)
	}
	if _, err := cli.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	a.waitCode(t, 200, 10*time.Second)
}
