package hosts

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hapair/hapair/ctl"
	"github.com/hapair/hapair/lab"
)

// The five hosts of the deployment test and their addresses.
const (
	witness    = "witness"
	nodeA      = "nodea"
	nodeB      = "nodeb"
	lbHost     = "lb"
	controller = "controller"
)

var addrs = map[string]string{
	nodeA: Subnet + ".11", nodeB: Subnet + ".12", witness: Subnet + ".13",
	lbHost: Subnet + ".20", controller: Subnet + ".30",
}

var dataNodes = []string{nodeA, nodeB}

// superPassword is the inventory's PostgreSQL superuser password (the test
// application connects with it, as an application would with its own role).
const superPassword = "deploy-superuser"

// units are what must be active on each host after the play.
var units = map[string][]string{
	witness: {"hapair-witness"},
	nodeA:   {"hapair-witness", "patroni", "hapair-roled", "hapair-testapp"},
	nodeB:   {"hapair-witness", "patroni", "hapair-roled", "hapair-testapp"},
	lbHost:  {"hapair-lb"},
}

// inventory is what an operator would write for these five hosts: the
// example inventory's shape, the controller in a ctl group of its own
// (Ansible runs there, locally, for hapairctl's config).
func inventory() map[string]string {
	host := func(n string) string { return fmt.Sprintf("        %s:\n          ansible_host: %s\n", n, addrs[n]) }
	return map[string]string{
		"hosts.yml": "---\n# Written by the deployment test (deploy/hosts).\nall:\n  children:\n" +
			"    data:\n      hosts:\n" + host(nodeA) + host(nodeB) +
			"    witness:\n      hosts:\n" + host(witness) +
			"    etcd:\n      children:\n        data:\n        witness:\n" +
			"    balancer:\n      hosts:\n" + host(lbHost) +
			"    ctl:\n      hosts:\n" + host(controller) + "          ansible_connection: local\n",
		"group_vars/all.yml": `---
ansible_user: root
ansible_python_interpreter: /usr/bin/python3
ansible_ssh_common_args: "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
hapair_common_binary_src_dir: ` + CtlDist + `
hapair_common_tls_src_dir: ` + CtlCerts + `
hapair_common_cluster: hapair
hapair_common_manage_services: true
hapair_common_manage_users: true
hapair_common_manage_packages: true
# The test application answers GET /check?id=N: hapairctl drill proves that
# no acknowledged write was lost.
hapair_ctl_lb_check_path: /check
`,
		"group_vars/data.yml": `---
hapair_patroni_superuser_password: ` + superPassword + `
hapair_patroni_replication_password: deploy-replication
hapair_patroni_rewind_password: deploy-rewind
hapair_patroni_restapi_password: deploy-restapi
hapair_patroni_client_cidrs: [` + Subnet + `.0/24]
hapair_roled_sync_roots:
  - name: uploads
    path: /srv/app/uploads
`,
		"group_vars/witness.yml": "---\nhapair_etcd_witness: true\n",
		// hapairctl drill powers a node off and boots it through the
		// harness's switch.
		"host_vars/" + nodeA + ".yml": drillVars(nodeA),
		"host_vars/" + nodeB + ".yml": drillVars(nodeB),
		// The controller's hapairctl reads the balancer's admin JSON.
		"group_vars/balancer.yml": "---\nhapair_lb_admin_listen: \"0.0.0.0:7480\"\nhapair_lb_app_port: 8080\n",
	}
}

func drillVars(node string) string {
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	return "---\nhapair_ctl_stop_command: " + q(PowerCommand("poweroff", node)) +
		"\nhapair_ctl_start_command: " + q(PowerCommand("boot", node)) + "\n"
}

// testAppUnit runs the lab's test application on a data node: it writes
// a row to the local PostgreSQL and a file into the synced directory.
//
// UMask=0002 is part of the deployment's contract (ansible/roles/hapair_roled
// README): roled's sync receiver runs as the hapair user without
// CAP_DAC_OVERRIDE, so it can only write into directories the application
// made group-writable (the synced root is setgid hapair, so the group is
// inherited). With the default umask the application's first directory was
// root:hapair 2755 and, after the first switchover, every file synced back
// to the old ACTIVE failed ("create temp: openat w: permission denied",
// REDUNDANT no for good: seen on these hosts).
func testAppUnit(node string) string {
	return `[Unit]
Description=hapair deployment test application (hapair-lab app)
After=network-online.target patroni.service

[Service]
UMask=0002
ExecStart=/usr/local/bin/hapair-lab app --node ` + node + ` --listen :8080 --dir /srv/app/uploads --marker /var/lib/app-ha/active --dsn postgres://postgres:` + superPassword + `@127.0.0.1:5432/postgres?connect_timeout=1
Restart=always
RestartSec=1s

[Install]
WantedBy=multi-user.target
`
}

func need(t *testing.T, tool, pkg string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		t.Skipf("%s not found: install the Debian package %s (scripts/deps.sh deploy)", tool, pkg)
	}
}

// figures collects the timings the test prints at the end.
type figures struct {
	t     *testing.T
	names []string
	vals  map[string]time.Duration
}

func (f *figures) add(name string, d time.Duration) {
	f.names = append(f.names, name)
	f.vals[name] = d
	f.t.Logf("FIGURE %-44s %s", name, d.Round(10*time.Millisecond))
}

// note prints a figure that is not a duration (a count).
func (f *figures) note(name, v string) {
	f.t.Logf("FIGURE %-44s %s", name, v)
}

// TestDeploySystemd deploys hapair with site.yml over SSH onto four real
// systemd hosts (witness, nodea, nodeb, lb) from a controller, then checks
// what a user would: the units are active, hapairctl status on the
// controller shows the whole cluster healthy, a write through the balancer
// lands on the ACTIVE node and its file reaches the PASSIVE one.
func TestDeploySystemd(t *testing.T) {
	if testing.Short() {
		t.Skip("boots five systemd containers and deploys (minutes): skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, overlay mounts, systemd-nspawn)")
	}
	need(t, "debootstrap", "debootstrap")
	need(t, "systemd-nspawn", "systemd-container")
	need(t, "nsenter", "util-linux")
	need(t, "go", "golang")
	fig := &figures{t: t, vals: map[string]time.Duration{}}
	logw := &testWriter{t: t}
	start := time.Now()

	if err := Sweep(logw); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	// The image is built once per machine (and package list): its own
	// bound, apart from the test's.
	t0 := time.Now()
	ictx, icancel := context.WithTimeout(context.Background(), 40*time.Minute)
	img, err := DefaultImage().Ensure(ictx, logw)
	icancel()
	if err != nil {
		t.Fatalf("image: %v", err)
	}
	fig.add("image (cached or built)", time.Since(t0))
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()

	c, err := New(img, addrs, logw)
	if err != nil {
		t.Fatalf("hosts: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() && os.Getenv("HAPAIR_DEPLOY_KEEP") != "" {
			// For a developer looking into a failure: the next run's Sweep
			// removes it.
			t.Logf("HAPAIR_DEPLOY_KEEP: hosts of run %s left running (%s)", c.Tag, c.Dir)
			return
		}
		t0 := time.Now()
		if err := c.Down(); err != nil {
			t.Errorf("teardown: %v", err)
		}
		t.Logf("teardown: %s", time.Since(t0).Round(10*time.Millisecond))
		checkNothingLeft(t, c)
	})
	t.Cleanup(func() {
		if t.Failed() {
			dumpHosts(t, c)
		}
	})

	t0 = time.Now()
	root := stage(t, ctx, c)
	fig.add("build + stage", time.Since(t0))

	t0 = time.Now()
	if err := c.Boot(ctx, 2*time.Minute); err != nil {
		t.Fatalf("boot: %v", err)
	}
	fig.add("boot 5 hosts (running)", time.Since(t0))
	for _, h := range c.Hosts {
		if h.Degraded != "" {
			t.Logf("%s booted degraded: %s", h.Name, h.Degraded)
		}
	}

	t0 = time.Now()
	out, err := c.Play(ctx, controller, CtlInventory, playLog(t, "site-1"), "site.yml")
	if err != nil {
		t.Fatalf("site.yml: %v\n%s", err, tail(out, 120))
	}
	fig.add("site.yml, first run", time.Since(t0))
	changed, failed := recap(t, out)
	if len(changed) != len(addrs) || sum(failed) != 0 {
		t.Fatalf("site.yml: hosts run %v, failed %v\n%s", changed, failed, tail(out, 60))
	}

	for _, n := range dataNodes {
		if _, err := c.Hosts[n].Exec(ctx, "systemctl", "enable", "--now", "hapair-testapp"); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("units-active", func(t *testing.T) { checkUnits(t, ctx, c) })

	t0 = time.Now()
	st := waitHealthy(t, ctx, c)
	fig.add("play end -> status healthy", time.Since(t0))
	active, passive := st.Redundancy.Active, st.Redundancy.Standby

	t.Run("write-and-sync", func(t *testing.T) {
		t0 := time.Now()
		writeAndSync(t, ctx, c, active, passive, 1)
		fig.add("write -> file on PASSIVE", time.Since(t0))
	})

	t.Run("check-config-everywhere", func(t *testing.T) {
		for _, h := range []string{controller, witness, nodeA, nodeB, lbHost} {
			if out, err := c.Hosts[h].Exec(ctx, "hapairctl", "--check-config"); err != nil {
				t.Errorf("%s: hapairctl --check-config: %v\n%s", h, err, out)
			}
		}
	})

	// From here on a writer goes through the balancer the whole time.
	w := startWriter(ctx, c, 1000)
	defer w.stop()
	rw := startRoleWatch(ctx, c)
	defer rw.stop()

	t.Run("second-run-changes-nothing", func(t *testing.T) {
		before := unitStarts(t, ctx, c)
		t0 := time.Now()
		out, err := c.Play(ctx, controller, CtlInventory, playLog(t, "site-2"), "site.yml")
		if err != nil {
			t.Fatalf("second site.yml: %v\n%s", err, tail(out, 120))
		}
		fig.add("site.yml, second run", time.Since(t0))
		changed, failed := recap(t, out)
		if sum(changed) != 0 || sum(failed) != 0 {
			t.Errorf("second run: changed %v, failed %v (want 0 everywhere)\n%s", changed, failed, changedTasks(out))
		}
		after := unitStarts(t, ctx, c)
		for u, ts := range before {
			if after[u] != ts {
				t.Errorf("%s restarted by the second run (start %s -> %s)", u, ts, after[u])
			}
		}
		st, _, err := status(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if st.Active == nil || st.Active.Node != active {
			t.Errorf("the ACTIVE node changed during the second run: %+v (was %s)", st.Active, active)
		}
		w.settle(t, time.Now())
		ok, bad := w.counts()
		t.Logf("writer during the second run: %d ok, %d failed", ok, bad)
		if bad != 0 {
			t.Errorf("%d writes failed during the second run: %v", bad, w.errors())
		}
	})

	t.Run("patroni-rest-auth", func(t *testing.T) { checkPatroniAuth(t, ctx, c) })

	t.Run("switchover", func(t *testing.T) {
		st, _, err := status(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		from, to := st.Redundancy.Active, st.Redundancy.Standby
		t0 := time.Now()
		out, err := c.Hosts[controller].Exec(ctx, "hapairctl", "switchover", "--to", to)
		t.Logf("hapairctl switchover --to %s on the controller:\n%s", to, out)
		if err != nil {
			t.Fatalf("switchover: %v", err)
		}
		fig.add("hapairctl switchover", time.Since(t0))
		if strings.Contains(out, "deploy-restapi") {
			t.Errorf("hapairctl switchover printed the Patroni password")
		}
		st = waitHealthy(t, ctx, c)
		if st.Redundancy.Active != to {
			t.Errorf("ACTIVE after the switchover: %s, want %s (was %s)", st.Redundancy.Active, to, from)
		}
		// Files now flow the other way, into the directories the old
		// ACTIVE's application made.
		writeAndSync(t, ctx, c, to, from, 2)
	})

	t.Run("drill", func(t *testing.T) {
		if os.Getenv("HAPAIR_DEPLOY_DRILL") == "0" {
			t.Skip("HAPAIR_DEPLOY_DRILL=0")
		}
		if err := c.ServePower(ctx); err != nil {
			t.Fatal(err)
		}
		v0, m0 := rw.mark()
		t0 := time.Now()
		dctx, dcancel := context.WithTimeout(ctx, 6*time.Minute)
		defer dcancel()
		// A drill that failed half-way may leave a node powered off: boot
		// it, so the steps after start from a whole cluster.
		defer func() {
			for _, n := range dataNodes {
				if !c.Hosts[n].Running() {
					if err := c.Hosts[n].Boot(ctx, 2*time.Minute); err != nil {
						t.Errorf("boot %s after the drill: %v", n, err)
					}
				}
			}
		}()
		out, err := c.Hosts[controller].Exec(dctx, "hapairctl", "drill", "--yes")
		t.Logf("hapairctl drill on the controller:\n%s", out)
		fig.add("hapairctl drill, both ways", time.Since(t0))
		drillFigures(t, fig, out)
		// Hard power-offs: failures are expected until the takeover.
		userFigures(t, fig, "drill", w.upTo(t, t0))
		if err != nil {
			t.Fatalf("hapairctl drill: %v", err)
		}
		waitHealthy(t, ctx, c)
		checkRoles(t, rw, v0, m0, 2)
	})

	t.Run("rolling-upgrade", func(t *testing.T) { stepRollingUpgrade(t, ctx, c, root, w, rw, fig) })
	t.Run("lb-restart", func(t *testing.T) { stepRestartLB(t, ctx, c, fig) })
	t.Run("roled-restart-on-active", func(t *testing.T) { stepRestartRoled(t, ctx, c, w, rw, fig) })
	t.Run("roled-sigstop-on-active", func(t *testing.T) { stepFreezeRoled(t, ctx, c, w, rw, fig) })
	t.Run("reboot-passive", func(t *testing.T) { stepReboot(t, ctx, c, w, rw, fig, "passive") })
	t.Run("reboot-active", func(t *testing.T) { stepReboot(t, ctx, c, w, rw, fig, "active") })
	// Last: the cluster runs on the 6.5 s budget from here on.
	t.Run("budget-change", func(t *testing.T) { stepBudgetChange(t, ctx, c, w, rw, fig) })

	fig.add("total so far", time.Since(start))
	t.Logf("figures were taken on a shared, loaded machine (other sessions' tests run beside it)")
}

// playLog is where a playbook run's output goes as it comes: a file in
// $HAPAIR_DEPLOY_LOG_DIR when set (make test keeps them in bin/), else
// nowhere (the test prints the tail of a failed run).
func playLog(t *testing.T, name string) io.Writer {
	dir := os.Getenv("HAPAIR_DEPLOY_LOG_DIR")
	if dir == "" {
		return io.Discard
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// stage builds the binaries into the controller's dist directory, copies
// the playbooks, makes the certificates, writes the inventory and the SSH
// key, and puts the test application on the data nodes.
func stage(t *testing.T, ctx context.Context, c *Cluster) (root string) {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err = lab.ModuleRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	ch := c.Hosts[controller]
	if err := os.MkdirAll(ch.Path(CtlDist), 0o755); err != nil {
		t.Fatal(err)
	}
	buildDist(t, ctx, c, root, "deploytest-"+c.Tag)
	app, err := os.ReadFile(filepath.Join(c.Dir, "hapair-lab"))
	if err != nil {
		t.Fatal(err)
	}
	// The image's package index is as old as the image (minutes on a
	// fresh machine): make it two days old, as on a host long after its
	// last apt-get update, so a role that refreshes it needlessly fails
	// here at once (hosts without a route out) and not only an hour after
	// the image was built (hapair_patroni's cache_valid_time did).
	old := time.Now().Add(-48 * time.Hour)
	for _, h := range c.Hosts {
		if err := os.Chtimes(h.Path("/var/lib/apt/lists"), old, old); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(h.Path("/var/lib/apt/periodic/update-success-stamp"), old, old); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	for _, n := range dataNodes {
		h := c.Hosts[n]
		if err := h.WriteFile("/usr/local/bin/hapair-lab", app, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := h.WriteFile("/etc/systemd/system/hapair-testapp.service", []byte(testAppUnit(n)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.CopyTree(filepath.Join(root, "ansible"), CtlAnsible, ".cache"); err != nil {
		t.Fatal(err)
	}
	for name, body := range inventory() {
		if err := ch.WriteFile(filepath.Join(CtlInventory, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.MakeCerts(controller); err != nil {
		t.Fatal(err)
	}
	if err := c.SetUpSSH(ctx, controller); err != nil {
		t.Fatal(err)
	}
	return root
}

// checkUnits: systemd says every unit is active (a Type=notify unit is
// only active once it sent READY=1).
func checkUnits(t *testing.T, ctx context.Context, c *Cluster) {
	for h, us := range units {
		for _, u := range us {
			out, err := c.Hosts[h].Exec(ctx, "systemctl", "is-active", u)
			if err != nil || strings.TrimSpace(out) != "active" {
				t.Errorf("%s: systemctl is-active %s = %q (%v)", h, u, strings.TrimSpace(out), err)
			}
		}
	}
	out, err := c.Hosts[nodeA].Exec(ctx, "systemctl", "show", "-p", "Type", "--value", "hapair-roled")
	if err != nil || strings.TrimSpace(out) != "notify" {
		t.Errorf("nodea: hapair-roled Type = %q (%v), want notify", strings.TrimSpace(out), err)
	}
}

// status runs hapairctl status --json on the controller.
func status(ctx context.Context, c *Cluster) (ctl.Status, string, error) {
	var st ctl.Status
	out, err := c.Hosts[controller].Exec(ctx, "hapairctl", "status", "--json")
	// Exit 1 (degraded) and 2 (not serving) still print the JSON.
	if jerr := json.Unmarshal([]byte(out), &st); jerr != nil {
		return st, out, fmt.Errorf("hapairctl status --json: %v / %v: %s", err, jerr, out)
	}
	return st, out, nil
}

// healthy says what is still missing from the wanted picture: three
// healthy etcd members, a Patroni leader with a streaming replica, one
// ACTIVE and one PASSIVE roled with the same epoch, the balancer on that
// epoch, sync lag 0, REDUNDANT yes.
func healthy(st ctl.Status) []string {
	var missing []string
	n := 0
	for _, m := range st.Etcd {
		if m.Healthy {
			n++
		}
	}
	if n != 3 {
		missing = append(missing, fmt.Sprintf("etcd: %d healthy members, want 3 (%s)", n, st.EtcdErr))
	}
	leaders := 0
	for _, m := range st.Patroni {
		if m.Role == "leader" {
			leaders++
		}
	}
	streaming := 0
	for _, r := range st.LeaderRepl {
		if r.State == "streaming" {
			streaming++
		}
	}
	if leaders != 1 || len(st.Patroni) != 2 || streaming != 1 {
		missing = append(missing, fmt.Sprintf("patroni: %d leaders of %d members, %d streaming replicas", leaders, len(st.Patroni), streaming))
	}
	roles := map[string]int{}
	var activeEpoch int64
	for _, r := range st.Roled {
		roles[r.Role]++
		if r.Role == "active" {
			activeEpoch = r.Epoch
			if r.Sync.LagSeconds != 0 {
				missing = append(missing, fmt.Sprintf("sync lag %.1fs on %s", r.Sync.LagSeconds, r.Node))
			}
		}
	}
	// The PASSIVE holds no lease: roled reports epoch 0 there. The ACTIVE's
	// epoch must be the active key's (and, below, the balancer's).
	if roles["active"] != 1 || roles["passive"] != 1 || st.Active == nil || activeEpoch != st.Active.Epoch {
		missing = append(missing, fmt.Sprintf("roled: roles %v, ACTIVE epoch %d, active key %+v", roles, activeEpoch, st.Active))
	}
	if st.Active == nil {
		missing = append(missing, "no active key")
	} else {
		served := false
		for _, b := range st.Backends {
			if b.Name == st.Active.Node && b.Eligible && b.Epoch == st.Active.Epoch {
				served = true
			}
		}
		if !served {
			missing = append(missing, fmt.Sprintf("balancer does not serve %s at epoch %d: %+v %s", st.Active.Node, st.Active.Epoch, st.Backends, st.LBErr))
		}
	}
	if st.Redundancy.Level != ctl.Redundant {
		missing = append(missing, "redundancy: "+st.Redundancy.Line())
	}
	return missing
}

func waitHealthy(t *testing.T, ctx context.Context, c *Cluster) ctl.Status {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	var last []string
	var raw string
	for time.Now().Before(deadline) {
		st, out, err := status(ctx, c)
		raw = out
		if err == nil {
			if last = healthy(st); len(last) == 0 {
				table, _ := c.Hosts[controller].Exec(ctx, "hapairctl", "status")
				t.Logf("hapairctl status on the controller:\n%s", table)
				return st
			}
		} else {
			last = []string{err.Error()}
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(time.Second):
		}
	}
	t.Fatalf("cluster not healthy after the play: %s\n%s", strings.Join(last, "; "), raw)
	return ctl.Status{}
}

// client dials from the controller's namespace, as a user on that host.
func client(c *Cluster) *http.Client {
	dial := lab.Net{Tag: nsPrefix + c.Tag}.DialContext(controller)
	return &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}, Timeout: 10 * time.Second}
}

// writeAndSync posts a write through the balancer: the ACTIVE node answers,
// and the file it wrote arrives on the PASSIVE node.
func writeAndSync(t *testing.T, ctx context.Context, c *Cluster, active, passive string, id int) {
	t.Helper()
	url := fmt.Sprintf("http://%s/write?id=%d", addrs[lbHost], id)
	var res lab.WriteResult
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := client(c).Post(url, "text/plain", nil)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && json.Unmarshal(b, &res) == nil {
				break
			}
			err = fmt.Errorf("%s: %s", resp.Status, b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("write through the balancer: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if res.Node != active {
		t.Errorf("write %d answered by %s, want the ACTIVE %s", id, res.Node, active)
	}
	file := fmt.Sprintf("/srv/app/uploads/w/%d.txt", id)
	deadline = time.Now().Add(time.Minute)
	for {
		b, err := os.ReadFile(c.Hosts[passive].Path(file))
		if err == nil && bytes.Contains(b, []byte(fmt.Sprintf("id=%d node=%s", id, active))) {
			t.Logf("%s on the PASSIVE %s: %s", file, passive, strings.TrimSpace(string(b)))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not arrive on the PASSIVE %s: %v %q", file, passive, err, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// postSwitchover is run on a host: POST /switchover to a Patroni REST API
// over HTTPS (verified against the cluster's CA), with Basic credentials
// (argv[3], "-" for none) and a client certificate (argv[4] and argv[5],
// "-" for none); prints the HTTP status.
const postSwitchover = `import base64, ssl, sys, urllib.request as u, urllib.error as e
url, ca, auth, cert, key = sys.argv[1:6]
ctx = ssl.create_default_context(cafile=ca)
if cert != "-":
    ctx.load_cert_chain(cert, key)
req = u.Request(url + "/switchover", data=b'{"leader": "x", "candidate": "y"}', method="POST")
if auth != "-":
    req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
try:
    print(u.urlopen(req, timeout=10, context=ctx).status)
except e.HTTPError as x:
    print(x.code)
`

// checkPatroniAuth: from the balancer and the controller, POST /switchover
// to either data node's Patroni (HTTPS, verify_client optional) is refused
// unless it carries both the password and a certificate the cluster's CA
// signed: 403 without the certificate (with or without the password), 401
// with the certificate but no password. The GETs roled, the balancer and
// hapairctl use still answer (the cluster stays healthy: checked after).
func checkPatroniAuth(t *testing.T, ctx context.Context, c *Cluster) {
	const tlsDir = "/etc/hapair/tls/"
	for _, from := range []string{lbHost, controller} {
		h := c.Hosts[from]
		if err := h.WriteFile("/root/post-switchover.py", []byte(postSwitchover), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, n := range dataNodes {
			url := "https://" + addrs[n] + ":8008"
			for _, tc := range []struct {
				what, auth, cert, key, want string
			}{
				{"no password, no certificate", "-", "-", "-", "403"},
				{"the password, no certificate", "patroni:deploy-restapi", "-", "-", "403"},
				{"a certificate, no password", "-", tlsDir + "node.pem", tlsDir + "node-key.pem", "401"},
			} {
				out, err := h.Exec(ctx, "python3", "/root/post-switchover.py", url, tlsDir+"ca.pem", tc.auth, tc.cert, tc.key)
				code := strings.TrimSpace(out)
				t.Logf("from %s: POST %s/switchover with %s -> %s", from, url, tc.what, code)
				if err != nil || code != tc.want {
					t.Errorf("from %s: POST /switchover to %s with %s answered %q (%v), want %s", from, n, tc.what, code, err, tc.want)
				}
			}
		}
	}
}

// unitStarts is each hapair unit's and Patroni's start time (monotonic)
// and restart count, host/unit -> "start/restarts".
func unitStarts(t *testing.T, ctx context.Context, c *Cluster) map[string]string {
	t.Helper()
	m := map[string]string{}
	for h, us := range units {
		for _, u := range us {
			out, err := c.Hosts[h].Exec(ctx, "systemctl", "show", "-p", "ActiveEnterTimestampMonotonic", "-p", "NRestarts", "--value", u)
			if err != nil {
				t.Fatal(err)
			}
			m[h+"/"+u] = strings.Join(strings.Fields(out), "/")
		}
	}
	return m
}

// changedTasks picks the "changed:" lines (and the task above each) of
// a playbook run.
func changedTasks(out string) string {
	var b strings.Builder
	task := ""
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "TASK [") || strings.HasPrefix(l, "RUNNING HANDLER [") {
			task = l
		}
		if strings.HasPrefix(l, "changed:") {
			b.WriteString(task + "\n  " + l + "\n")
		}
	}
	return b.String()
}

// writer posts /write?id=N through the balancer every 100 ms from the
// controller's namespace, like a user, until stopped. Every request is kept
// (start, end, result), so a step can say what the user saw during it.
type writer struct {
	cancel   context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	samples  []sample
	inflight map[int]time.Time // id -> start of the writes not yet answered
}

// sample is one write as the user saw it.
type sample struct {
	id         int
	start, end time.Time
	ok         bool
	node       string // who answered (ok only)
	err        string
}

func startWriter(ctx context.Context, c *Cluster, firstID int) *writer {
	ctx, cancel := context.WithCancel(ctx)
	w := &writer{cancel: cancel, done: make(chan struct{}), inflight: map[int]time.Time{}}
	cl := client(c)
	var wg sync.WaitGroup
	go func() {
		defer close(w.done)
		defer wg.Wait()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for id := firstID; ; id++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			// One goroutine per write: a held request (up to the
			// balancer's hold-timeout) does not delay the next one, as
			// with many users.
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.write(ctx, cl, c, id)
			}()
		}
	}()
	return w
}

func (w *writer) write(ctx context.Context, cl *http.Client, c *Cluster, id int) {
	s := sample{id: id, start: time.Now()}
	w.mu.Lock()
	w.inflight[id] = s.start
	w.mu.Unlock()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://%s/write?id=%d", addrs[lbHost], id), nil)
	resp, err := cl.Do(req)
	if ctx.Err() != nil {
		w.mu.Lock()
		delete(w.inflight, id)
		w.mu.Unlock()
		return
	}
	s.end = time.Now()
	switch {
	case err != nil:
		s.err = err.Error()
	case resp.StatusCode != http.StatusOK:
		s.err = resp.Status
	default:
		var res lab.WriteResult
		b, _ := io.ReadAll(resp.Body)
		if json.Unmarshal(b, &res) == nil {
			s.ok, s.node = true, res.Node
		} else {
			s.err = "bad answer: " + string(b)
		}
	}
	if resp != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	w.mu.Lock()
	w.samples = append(w.samples, s)
	delete(w.inflight, id)
	w.mu.Unlock()
}

// settle waits until every write started before t1 has its answer (a
// held one ends up to the balancer's hold-timeout later; the client gives
// up after its 10 s timeout), so a step's figures count all of its writes.
func (w *writer) settle(t *testing.T, t1 time.Time) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.mu.Lock()
		open := 0
		for _, start := range w.inflight {
			if start.Before(t1) {
				open++
			}
		}
		w.mu.Unlock()
		if open == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d writes started before %s still unanswered after 30 s (the client's timeout is 10 s)", open, t1.Format("15:04:05.000"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// upTo is what the user saw of the writes started in [t0, now), once all of
// them are answered.
func (w *writer) upTo(t *testing.T, t0 time.Time) userView {
	t.Helper()
	t1 := time.Now()
	w.settle(t, t1)
	return w.between(t0, t1)
}

func (w *writer) counts() (ok, bad int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.samples {
		if s.ok {
			ok++
		} else {
			bad++
		}
	}
	return ok, bad
}

func (w *writer) errors() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, s := range w.samples {
		if !s.ok && len(out) < 10 {
			out = append(out, fmt.Sprintf("%d: %s", s.id, s.err))
		}
	}
	return out
}

// between is what the user saw of the writes started in [t0, t1) (t1 zero:
// up to now).
func (w *writer) between(t0, t1 time.Time) userView {
	w.mu.Lock()
	var in []sample
	for _, s := range w.samples {
		if !s.start.Before(t0) && (t1.IsZero() || s.start.Before(t1)) {
			in = append(in, s)
		}
	}
	w.mu.Unlock()
	slices.SortFunc(in, func(a, b sample) int { return a.end.Compare(b.end) })
	v := userView{n: len(in)}
	lastOK := t0
	for _, s := range in {
		if d := s.end.Sub(s.start); d > v.slowest {
			v.slowest = d
		}
		if !s.ok {
			v.failed++
			if len(v.errs) < 5 {
				v.errs = append(v.errs, fmt.Sprintf("%d: %s", s.id, s.err))
			}
			continue
		}
		// The longest stretch without a completed write: the outage as
		// the user saw it (held requests end late, all at once).
		if g := s.end.Sub(lastOK); g > v.gap {
			v.gap = g
		}
		lastOK = s.end
	}
	return v
}

// userView sums up a stretch of writes.
type userView struct {
	n, failed    int
	slowest, gap time.Duration // longest write (held), longest stretch without a completed write
	errs         []string
}

func (v userView) String() string {
	return fmt.Sprintf("%d writes, %d failed, slowest %s (held), longest without a write %s %v",
		v.n, v.failed, v.slowest.Round(10*time.Millisecond), v.gap.Round(10*time.Millisecond), v.errs)
}

func (w *writer) stop() {
	w.cancel()
	<-w.done
}

var recapRE = regexp.MustCompile(`(?m)^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)`)

// recap sums changed and failed per host over the PLAY RECAP lines.
func recap(t *testing.T, out string) (changed, failed map[string]int) {
	t.Helper()
	changed, failed = map[string]int{}, map[string]int{}
	for _, m := range recapRE.FindAllStringSubmatch(out, -1) {
		ch, _ := strconv.Atoi(m[3])
		un, _ := strconv.Atoi(m[4])
		fa, _ := strconv.Atoi(m[5])
		changed[m[1]] += ch
		failed[m[1]] += fa + un
	}
	if len(changed) == 0 {
		t.Fatalf("no PLAY RECAP in the output:\n%s", tail(out, 60))
	}
	return changed, failed
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// dumpHosts logs, on failure, each host's failed units with their
// journals, and the hapair and Patroni journals.
func dumpHosts(t *testing.T, c *Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	names := make([]string, 0, len(c.Hosts))
	for n := range c.Hosts {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		h := c.Hosts[n]
		if !h.Running() {
			t.Logf("%s: not running; console:\n%s", n, tailFile(filepath.Join(h.dir, "console.log"), 40))
			continue
		}
		out, _ := h.Exec(ctx, "sh", "-c", FailedUnitsScript+"\njournalctl --no-pager -n 80 -u 'hapair-*' -u patroni")
		t.Logf("%s:\n%s", n, out)
	}
}

func tailFile(p string, n int) string {
	b, _ := os.ReadFile(p)
	return tail(string(b), n)
}

// checkNothingLeft: after Down no namespace, mount or container of the run.
func checkNothingLeft(t *testing.T, c *Cluster) {
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), nsPrefix+c.Tag) {
			t.Errorf("namespace %s left", e.Name())
		}
	}
	for _, m := range mounts() {
		if strings.HasPrefix(m, c.Dir) {
			t.Errorf("mount %s left", m)
		}
	}
	if _, err := os.Stat(c.Dir); err == nil {
		t.Errorf("run directory %s left", c.Dir)
	}
}

// testWriter sends lines to t.Log.
type testWriter struct {
	t   *testing.T
	mu  sync.Mutex
	buf []byte
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.t.Log(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}
