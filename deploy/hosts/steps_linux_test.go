package hosts

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hapair/hapair/ctl"
	"github.com/hapair/hapair/lab"
)

// The steps the deployment test runs on the deployed cluster after the
// play (issue 18, steps 3 to 5): a rolling upgrade, roled restarted and
// frozen on the ACTIVE node, the PASSIVE and the ACTIVE host rebooted. Each
// prints what the user saw through the balancer (FIGURE lines).

// buildDist builds the hapair binaries with version into the controller's
// dist directory (what hapair_common installs from), and the test
// application into the run directory.
func buildDist(t *testing.T, ctx context.Context, c *Cluster, root, version string) {
	t.Helper()
	dist := c.Hosts[controller].Path(CtlDist)
	build := func(out string, pkgs ...string) {
		args := append([]string{"build", "-trimpath", "-ldflags", "-X github.com/hapair/hapair/internal/daemon.Version=" + version, "-o", out}, pkgs...)
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = root
		cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, b)
		}
	}
	build(dist+"/", "./cmd/hapair-witness", "./cmd/hapair-roled", "./cmd/hapair-lb", "./cmd/hapairctl")
	build(filepath.Join(c.Dir, "hapair-lab"), "./lab/cmd/hapair-lab")
}

// hapairUnits are the units running a hapair binary, host -> unit ->
// binary (what a version check asks).
var hapairUnits = map[string]map[string]string{
	witness: {"hapair-witness": "hapair-witness"},
	nodeA:   {"hapair-witness": "hapair-witness", "hapair-roled": "hapair-roled"},
	nodeB:   {"hapair-witness": "hapair-witness", "hapair-roled": "hapair-roled"},
	lbHost:  {"hapair-lb": "hapair-lb"},
}

// runningVersion is what the process a unit runs now says of itself:
// /proc/PID/exe is the file it was started from, even when the play has
// replaced the binary since (then the old inode, and the old version).
func runningVersion(ctx context.Context, h *Host, unit string) (string, error) {
	out, err := h.Exec(ctx, "sh", "-c", `p=$(systemctl show -p MainPID --value "$0"); [ "$p" -gt 0 ] && exec /proc/$p/exe --version`, unit)
	return strings.TrimSpace(out), err
}

// roleWatch polls both data nodes' roled (GET /role) every 100 ms from the
// controller and records two ACTIVE at once and every move of ACTIVE from
// one node to the other.
type roleWatch struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu         sync.Mutex
	violations []string
	moves      []string // "nodea -> nodeb at 12:00:01.123"
	lastActive string
	rounds     int
}

type roleAnswer struct {
	start time.Time
	st    struct {
		Role  string    `json:"role"`
		Epoch int64     `json:"epoch"`
		Since time.Time `json:"since"`
	}
	err error
}

func startRoleWatch(ctx context.Context, c *Cluster) *roleWatch {
	ctx, cancel := context.WithCancel(ctx)
	rw := &roleWatch{cancel: cancel, done: make(chan struct{})}
	dial := lab.Net{Tag: nsPrefix + c.Tag}.DialContext(controller)
	cl := &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}, Timeout: 2 * time.Second}
	ask := func(node string) roleAnswer {
		a := roleAnswer{start: time.Now()}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addrs[node]+":7400/role", nil)
		resp, err := cl.Do(req)
		if err != nil {
			a.err = err
			return a
		}
		defer resp.Body.Close()
		a.err = json.NewDecoder(resp.Body).Decode(&a.st)
		return a
	}
	go func() {
		defer close(rw.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var ans [2]roleAnswer
			var wg sync.WaitGroup
			for i, n := range dataNodes {
				wg.Add(1)
				go func() { defer wg.Done(); ans[i] = ask(n) }()
			}
			wg.Wait()
			if ctx.Err() != nil {
				return
			}
			rw.observe(ans)
		}
	}()
	return rw
}

// observe checks one round. Both nodes answered ACTIVE, each since before
// either request started: both were ACTIVE at the later of the two
// starts (the hosts share this machine's clock). Two answers that only
// overlap in flight (one stepped down, the other took over in between) are
// not counted.
func (rw *roleWatch) observe(ans [2]roleAnswer) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	rw.rounds++
	a, b := ans[0], ans[1]
	isActive := func(x roleAnswer) bool { return x.err == nil && x.st.Role == "active" }
	if isActive(a) && isActive(b) {
		first := a.start
		if b.start.Before(first) {
			first = b.start
		}
		if !a.st.Since.After(first) && !b.st.Since.After(first) {
			rw.violations = append(rw.violations, fmt.Sprintf("%s: both ACTIVE (epochs %d since %s, %d since %s)",
				first.Format("15:04:05.000"), a.st.Epoch, a.st.Since.Format("15:04:05.000"), b.st.Epoch, b.st.Since.Format("15:04:05.000")))
		}
	}
	for i, x := range ans {
		if isActive(x) && !isActive(ans[1-i]) {
			if rw.lastActive != "" && rw.lastActive != dataNodes[i] {
				rw.moves = append(rw.moves, fmt.Sprintf("%s -> %s at %s", rw.lastActive, dataNodes[i], x.start.Format("15:04:05.000")))
			}
			rw.lastActive = dataNodes[i]
		}
	}
}

// mark is the position to count from.
func (rw *roleWatch) mark() (violations, moves int) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return len(rw.violations), len(rw.moves)
}

// since returns the violations and moves after a mark.
func (rw *roleWatch) since(v0, m0 int) (violations, moves []string) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return append([]string(nil), rw.violations[v0:]...), append([]string(nil), rw.moves[m0:]...)
}

func (rw *roleWatch) stop() {
	rw.cancel()
	<-rw.done
}

// userFigures prints what the writer saw of a step as FIGURE lines.
func userFigures(t *testing.T, fig *figures, name string, v userView) {
	t.Helper()
	fig.note(name+": writes failed", strconv.Itoa(v.failed)+" of "+strconv.Itoa(v.n))
	fig.add(name+": slowest write", v.slowest)
	fig.add(name+": longest without a write", v.gap)
	t.Logf("%s: %s", name, v)
}

// checkRoles fails the test on two ACTIVE at once and on more moves of
// ACTIVE than planned since the mark.
func checkRoles(t *testing.T, rw *roleWatch, v0, m0, planned int) {
	t.Helper()
	viol, moves := rw.since(v0, m0)
	for _, v := range viol {
		t.Errorf("two ACTIVE: %s", v)
	}
	if len(moves) > planned {
		t.Errorf("ACTIVE moved %d times, planned %d: %v", len(moves), planned, moves)
	} else if len(moves) > 0 {
		t.Logf("ACTIVE moved (planned): %v", moves)
	}
}

// stepRollingUpgrade rebuilds the binaries with a new version and rolls
// them out as the README says: etcd.yml (members one at a time), roled.yml
// (serial: 1, /role answers before the next node), lb.yml, ctl.yml. No
// switchover is planned: none may happen; with the balancer's hold on no
// write may fail while etcd and roled roll, nor while the balancer restarts
// (socket activation); every unit then runs the new version.
func stepRollingUpgrade(t *testing.T, ctx context.Context, c *Cluster, root string, w *writer, rw *roleWatch, fig *figures) {
	// Each step starts from a healthy cluster (and says so if the one
	// before left it otherwise).
	before := waitHealthy(t, ctx, c)
	version := "deploytest-" + c.Tag + "-upgraded"
	t0 := time.Now()
	buildDist(t, ctx, c, root, version)
	fig.add("upgrade: rebuild", time.Since(t0))
	v0, m0 := rw.mark()
	for _, pb := range []string{"etcd.yml", "roled.yml", "lb.yml", "ctl.yml"} {
		t0 := time.Now()
		out, err := c.Play(ctx, controller, CtlInventory, playLog(t, "upgrade-"+strings.TrimSuffix(pb, ".yml")), pb)
		if err != nil {
			t.Fatalf("%s: %v\n%s", pb, err, tail(out, 120))
		}
		_, failed := recap(t, out)
		if sum(failed) != 0 {
			t.Fatalf("%s: failed %v\n%s", pb, failed, tail(out, 60))
		}
		fig.add("upgrade: "+pb, time.Since(t0))
		v := w.upTo(t, t0)
		userFigures(t, fig, "upgrade "+pb, v)
		// hapair-lb's new binary needs a restart (a reload keeps the old
		// one); its listeners are socket-activated (systemd holds the
		// sockets across it), so the writes only wait: none may fail.
		if v.failed != 0 {
			t.Errorf("%s: %d writes failed with the hold on: %v", pb, v.failed, v.errs)
		}
	}
	st := waitHealthy(t, ctx, c)
	checkRoles(t, rw, v0, m0, 0)
	if before.Redundancy.Active != st.Redundancy.Active {
		t.Errorf("ACTIVE %s before the upgrade, %s after (no switchover planned)", before.Redundancy.Active, st.Redundancy.Active)
	}
	for h, us := range hapairUnits {
		for u := range us {
			got, err := runningVersion(ctx, c.Hosts[h], u)
			if err != nil || !strings.HasSuffix(got, " "+version) {
				t.Errorf("%s: %s runs %q (%v), want version %s", h, u, got, err, version)
			}
		}
	}
	for _, h := range []string{controller, witness, nodeA, nodeB, lbHost} {
		out, err := c.Hosts[h].Exec(ctx, "hapairctl", "--version")
		if err != nil || !strings.Contains(out, version) {
			t.Errorf("%s: hapairctl --version = %q (%v), want %s", h, strings.TrimSpace(out), err, version)
		}
	}
}

// stepRestartRoled: systemctl restart hapair-roled on the ACTIVE node.
// roled steps down on SIGTERM and the same node (still Patroni's leader)
// takes a new lease when it is back; the balancer holds new requests
// meanwhile.
func stepRestartRoled(t *testing.T, ctx context.Context, c *Cluster, w *writer, rw *roleWatch, fig *figures) {
	// Each step starts from a healthy cluster (and says so if the one
	// before left it otherwise).
	before := waitHealthy(t, ctx, c)
	active := before.Redundancy.Active
	v0, m0 := rw.mark()
	t0 := time.Now()
	if _, err := c.Hosts[active].Exec(ctx, "systemctl", "restart", "hapair-roled"); err != nil {
		t.Fatal(err)
	}
	fig.add("roled restart: systemctl returned", time.Since(t0))
	back := waitRole(t, ctx, c, active, "active", before.Active.Epoch, time.Minute)
	fig.add("roled restart: ACTIVE again", back)
	st := waitHealthy(t, ctx, c)
	fig.add("roled restart: healthy", time.Since(t0))
	userFigures(t, fig, "roled restart", w.upTo(t, t0))
	checkRoles(t, rw, v0, m0, 0)
	if st.Redundancy.Active != active {
		t.Errorf("ACTIVE moved from %s to %s on a roled restart", active, st.Redundancy.Active)
	}
}

// stepRestartLB: `systemctl restart hapair-lb` on the balancer while a
// request goes out every 10 ms, each on a new connection. The listeners are
// socket-activated (systemd holds the sockets; hapair-lb says it took them
// over), so no connection may be refused: the requests that came while no
// process ran waited in the backlog. The slowest is the restart's cost.
func stepRestartLB(t *testing.T, ctx context.Context, c *Cluster, fig *figures) {
	waitHealthy(t, ctx, c)
	h := c.Hosts[lbHost]
	cl := client(c)
	pctx, stop := context.WithCancel(ctx)
	type result struct {
		took time.Duration
		err  error
	}
	results := make(chan result, 4096)
	var wg sync.WaitGroup
	// The sender is waited for before wg.Wait: its wg.Add must not race
	// the Wait (the race detector caught it in CI).
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-tick.C:
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addrs[lbHost]+"/health", nil)
				resp, err := cl.Do(req)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %s", resp.Status)
					}
				}
				results <- result{time.Since(t0), err}
			}()
		}
	}()
	time.Sleep(500 * time.Millisecond) // requests before the restart, as users
	t0 := time.Now()
	if out, err := h.Exec(ctx, "systemctl", "restart", "hapair-lb"); err != nil {
		t.Fatalf("systemctl restart hapair-lb: %v\n%s", err, out)
	}
	fig.add("lb restart: systemctl returned", time.Since(t0))
	time.Sleep(time.Second) // and after it
	stop()
	<-sent
	wg.Wait()
	close(results)
	var n, failed int
	var slowest time.Duration
	var errs []string
	for r := range results {
		n++
		slowest = max(slowest, r.took)
		if r.err != nil {
			failed++
			if len(errs) < 5 {
				errs = append(errs, r.err.Error())
			}
		}
	}
	fig.note("lb restart: requests failed (every 10 ms)", fmt.Sprintf("%d of %d", failed, n))
	fig.add("lb restart: slowest request", slowest)
	if failed > 0 {
		// Connections wait in systemd's socket while no process runs, and
		// the old process answers what it accepted before it stopped
		// accepting (lb.TestShutdownServesAcceptedConnections): none fails.
		t.Errorf("%d of %d requests failed across a restart of the socket-activated balancer: %v", failed, n, errs)
	}
	journal, _ := h.Exec(ctx, "journalctl", "--no-pager", "-u", "hapair-lb", "--since", "-1min")
	if !strings.Contains(journal, "listener socket from systemd") {
		t.Errorf("hapair-lb did not say it took its listeners from systemd:\n%s", tail(journal, 30))
	}
}

// stepFreezeRoled: SIGSTOP to hapair-roled's main process on the ACTIVE
// node (roled is one process; systemctl's default, the whole cgroup, fails
// inside a container with "Failed to send signal SIGSTOP to auxiliary
// processes: Input/output error"). Nothing in roled runs any more; the unit's watchdog must notice
// (WatchdogSec) and restart it, with nobody's help.
func stepFreezeRoled(t *testing.T, ctx context.Context, c *Cluster, w *writer, rw *roleWatch, fig *figures) {
	// Each step starts from a healthy cluster (and says so if the one
	// before left it otherwise).
	before := waitHealthy(t, ctx, c)
	active := before.Redundancy.Active
	h := c.Hosts[active]
	restarts := func() int {
		out, _ := h.Exec(ctx, "systemctl", "show", "-p", "NRestarts", "--value", "hapair-roled")
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n
	}
	n0 := restarts()
	v0, m0 := rw.mark()
	t0 := time.Now()
	if _, err := h.Exec(ctx, "systemctl", "kill", "--kill-whom=main", "-s", "SIGSTOP", "hapair-roled"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for restarts() == n0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: hapair-roled frozen for 2 min and not restarted (NRestarts %d): the watchdog did not act", active, n0)
		}
		time.Sleep(200 * time.Millisecond)
	}
	fig.add("roled SIGSTOP: watchdog restart", time.Since(t0))
	journal, _ := h.Exec(ctx, "journalctl", "--no-pager", "-o", "short-precise", "-u", "hapair-roled", "--since", "-5min")
	var wd []string
	for _, l := range strings.Split(journal, "\n") {
		if strings.Contains(strings.ToLower(l), "watchdog") {
			wd = append(wd, l)
		}
	}
	t.Logf("%s journal of hapair-roled, watchdog lines:\n%s", active, strings.Join(wd, "\n"))
	if !strings.Contains(strings.ToLower(journal), "watchdog timeout") {
		t.Errorf("%s: no watchdog timeout in the journal of hapair-roled", active)
	}
	back := waitRole(t, ctx, c, active, "active", before.Active.Epoch, time.Minute)
	fig.add("roled SIGSTOP: ACTIVE again", back)
	waitHealthy(t, ctx, c)
	fig.add("roled SIGSTOP: healthy", time.Since(t0))
	userFigures(t, fig, "roled SIGSTOP", w.upTo(t, t0))
	checkRoles(t, rw, v0, m0, 0)
}

// waitRole waits until node's roled answers role with an epoch other than
// old (a new lease) and returns the time since the call.
func waitRole(t *testing.T, ctx context.Context, c *Cluster, node, role string, old int64, within time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	for time.Since(t0) < within {
		out, err := c.Hosts[node].Exec(ctx, "sh", "-c", "exec python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:7400/role\", timeout=2).read().decode())'")
		var st struct {
			Role  string `json:"role"`
			Epoch int64  `json:"epoch"`
		}
		if err == nil && json.Unmarshal([]byte(out), &st) == nil && st.Role == role && st.Epoch != old {
			return time.Since(t0)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: roled not %s with a new epoch within %s", node, role, within)
	return 0
}

// stepReboot pulls the plug of one data node and boots it again: if it
// was ACTIVE the other one takes over first (the test waits for that),
// then everything on the host must come back by itself under systemd and
// the pair be redundant again.
func stepReboot(t *testing.T, ctx context.Context, c *Cluster, w *writer, rw *roleWatch, fig *figures, which string) {
	// Each step starts from a healthy cluster (and says so if the one
	// before left it otherwise).
	before := waitHealthy(t, ctx, c)
	node, other := before.Redundancy.Standby, before.Redundancy.Active
	if which == "active" {
		node, other = other, node
	}
	planned := 0
	if which == "active" {
		planned = 1
	}
	name := "reboot " + which
	h := c.Hosts[node]
	v0, m0 := rw.mark()
	t0 := time.Now()
	if err := h.PowerOff(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if which == "active" {
		// The survivor serves before the node is back: the reboot takes
		// longer than Patroni's ttl, as a real one does.
		for {
			st, _, err := status(ctx, c)
			if err == nil && st.Active != nil && st.Active.Node == other && servedBy(st, other) {
				break
			}
			if time.Since(t0) > 2*time.Minute {
				t.Fatalf("%s off: %s did not take over within 2 min: %v", node, other, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		fig.add(name+": takeover by "+other, time.Since(t0))
	} else {
		// Booted only once the cluster has seen the PASSIVE gone (its
		// roled and Patroni member unreachable: REDUNDANT no), so the
		// step is a reboot the others noticed, not a blip.
		for {
			st, _, err := status(ctx, c)
			if err == nil && st.Redundancy.Level != ctl.Redundant {
				break
			}
			if time.Since(t0) > time.Minute {
				t.Fatalf("%s off for 1 min and hapairctl status still says REDUNDANT yes (%v)", node, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		fig.add(name+": status says REDUNDANT no", time.Since(t0))
	}
	tb := time.Now()
	if err := h.Boot(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	fig.add(name+": boot -> running", time.Since(tb))
	for _, u := range units[node] {
		for {
			out, _ := h.Exec(ctx, "systemctl", "is-active", u)
			if strings.TrimSpace(out) == "active" {
				break
			}
			if time.Since(tb) > 3*time.Minute {
				t.Fatalf("%s: %s not active 3 min after boot: %s", node, u, strings.TrimSpace(out))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	fig.add(name+": boot -> units active", time.Since(tb))
	st := waitHealthy(t, ctx, c)
	fig.add(name+": boot -> redundant", time.Since(tb))
	userFigures(t, fig, name, w.upTo(t, t0))
	checkRoles(t, rw, v0, m0, planned)
	if st.Redundancy.Active != other {
		t.Errorf("after the reboot of %s: ACTIVE %s, want %s", node, st.Redundancy.Active, other)
	}
}

// servedBy: the balancer sends users to node (eligible at the active
// key's epoch).
func servedBy(st ctl.Status, node string) bool {
	for _, b := range st.Backends {
		if b.Name == node && b.Eligible && st.Active != nil && b.Epoch == st.Active.Epoch {
			return true
		}
	}
	return false
}

// drillFigures picks hapairctl drill's table (ctl.WriteDrillReport) apart
// into FIGURE lines, one set per phase. Columns: LOST TAKEOVER PATRONI
// ACTIVE LB 1ST-WRITE FAILED OUTAGES DOWN ACKED REJOINED RESULT (the header
// spells "1ST WRITE" in two words; the rows have one field each).
func drillFigures(t *testing.T, fig *figures, out string) {
	t.Helper()
	header, rows := false, 0
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && f[0] == "LOST" {
			header = true
			continue
		}
		if !header || len(f) < 12 || (f[0] != nodeA && f[0] != nodeB) {
			continue
		}
		rows++
		sec := func(s string) time.Duration {
			v, _ := strconv.ParseFloat(strings.TrimSuffix(s, "s"), 64)
			return time.Duration(v * float64(time.Second))
		}
		name := "drill " + f[0] + " lost"
		fig.add(name+": Patroni leader "+f[1], sec(f[2]))
		fig.add(name+": roled ACTIVE", sec(f[3]))
		fig.add(name+": balancer serves "+f[1], sec(f[4]))
		fig.add(name+": first write", sec(f[5]))
		fig.note(name+": probe writes failed", f[6]+" ("+f[7]+" outages)")
		fig.add(name+": downtime", sec(f[8]))
		fig.note(name+": acknowledged writes on "+f[1], f[9])
		fig.add(name+": rejoined (redundant)", sec(f[10]))
	}
	if rows == 0 {
		t.Errorf("no drill table rows in hapairctl drill's output (columns of ctl.WriteDrillReport changed?)")
	}
}

// TestDrillFiguresReadsTheReport: the figures are read from the table
// hapairctl drill prints (ctl.WriteDrillReport); a column added there must
// not shift them silently (OUTAGES and ACKED once did: REJOINED was read
// from DOWN).
func TestDrillFiguresReadsTheReport(t *testing.T) {
	var b strings.Builder
	ctl.WriteDrillReport(&b, []ctl.DrillPhase{{
		Victim: nodeA, Survivor: nodeB,
		PatroniLeader: 11 * time.Second, RoledActive: 12 * time.Second, LBServing: 13 * time.Second,
		FirstWrite: 14 * time.Second, Rejoined: 25 * time.Second,
		Probe:      ctl.ProbeReport{Failed: 7, Outages: 1, TotalDown: 15 * time.Second},
		AckChecked: true, AckedBefore: 40,
	}})
	fig := &figures{t: t, vals: map[string]time.Duration{}}
	drillFigures(t, fig, b.String())
	want := map[string]time.Duration{
		"drill nodea lost: Patroni leader nodeb":  11 * time.Second,
		"drill nodea lost: roled ACTIVE":          12 * time.Second,
		"drill nodea lost: balancer serves nodeb": 13 * time.Second,
		"drill nodea lost: first write":           14 * time.Second,
		"drill nodea lost: downtime":              15 * time.Second,
		"drill nodea lost: rejoined (redundant)":  25 * time.Second,
	}
	for k, v := range want {
		if fig.vals[k] != v {
			t.Errorf("%s = %s, want %s (table:\n%s)", k, fig.vals[k], v, b.String())
		}
	}
}

// getPatroniConfig prints ttl, loop_wait and retry_timeout from a Patroni's
// GET /config (HTTPS, the cluster's CA).
const getPatroniConfig = `import json, ssl, sys, urllib.request as u
ctx = ssl.create_default_context(cafile=sys.argv[2])
d = json.load(u.urlopen(sys.argv[1] + "/config", timeout=10, context=ctx))
print(d.get("ttl"), d.get("loop_wait"), d.get("retry_timeout"))
`

// stepBudgetChange runs site.yml again with hapair_rto=6.5s on the running
// cluster, as an operator tightening the budget would. Patroni's timers
// live in its dynamic configuration: the play PATCHes /config, and both
// members then report the derived 5/1/2 without Patroni having restarted
// (etcd, roled and the balancer do restart, one at a time, on their new
// files). No switchover is planned: the primary stays, and the writer's
// figures show what the rollout cost.
func stepBudgetChange(t *testing.T, ctx context.Context, c *Cluster, w *writer, rw *roleWatch, fig *figures) {
	before := waitHealthy(t, ctx, c)
	starts := unitStarts(t, ctx, c)
	v0, m0 := rw.mark()
	t0 := time.Now()
	out, err := c.Play(ctx, controller, CtlInventory, playLog(t, "site-rto"), "site.yml", "-e", "hapair_rto=6.5s")
	if err != nil {
		t.Fatalf("site.yml with hapair_rto=6.5s: %v\n%s", err, tail(out, 120))
	}
	fig.add("site.yml with hapair_rto=6.5s", time.Since(t0))
	for _, n := range dataNodes {
		h := c.Hosts[n]
		if err := h.WriteFile("/root/get-patroni-config.py", []byte(getPatroniConfig), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := h.Exec(ctx, "python3", "/root/get-patroni-config.py", "https://"+addrs[n]+":8008", "/etc/hapair/tls/ca.pem")
		if got = strings.TrimSpace(got); err != nil || got != "5 1 2" {
			t.Errorf("%s: Patroni /config ttl loop_wait retry_timeout %q (%v), want \"5 1 2\" (the budget's)", n, got, err)
		}
	}
	after := unitStarts(t, ctx, c)
	for _, n := range dataNodes {
		if u := n + "/patroni"; after[u] != starts[u] {
			t.Errorf("%s restarted for the budget change (start %s -> %s): /config needs no restart", u, starts[u], after[u])
		}
	}
	st := waitHealthy(t, ctx, c)
	fig.add("budget change: healthy", time.Since(t0))
	userFigures(t, fig, "budget change", w.upTo(t, t0))
	checkRoles(t, rw, v0, m0, 0)
	if st.Redundancy.Active != before.Redundancy.Active {
		t.Errorf("ACTIVE moved from %s to %s on the budget change", before.Redundancy.Active, st.Redundancy.Active)
	}
}
