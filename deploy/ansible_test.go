package deploy_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/hapair/hapair/budget"
)

// Paths from this package's directory (go test runs in deploy/).
const (
	repoDir    = ".."
	ansibleDir = "../ansible"
	testInv    = "tests/inventory" // relative to ansibleDir
)

var playbooks = []string{"site.yml", "etcd.yml", "patroni.yml", "roled.yml", "lb.yml", "ctl.yml"}

// need skips the test when a tool of a Debian package is missing (CI
// installs them all, so there the test runs).
func need(t *testing.T, tool, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		t.Skipf("%s not found: install the Debian package %s", tool, pkg)
	}
	return p
}

// run runs a command with a deadline and returns its combined output.
func run(t *testing.T, dir string, env []string, timeout time.Duration, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// ansibleEnv keeps Ansible's temp and cache files inside tmp.
func ansibleEnv(tmp string) []string {
	abs, _ := filepath.Abs(filepath.Join(ansibleDir, "ansible.cfg"))
	return []string{
		"ANSIBLE_CONFIG=" + abs,
		"ANSIBLE_LOCAL_TEMP=" + filepath.Join(tmp, "ansible-local"),
		"ANSIBLE_REMOTE_TEMP=" + filepath.Join(tmp, "ansible-remote"),
		"ANSIBLE_NOCOLOR=1",
		"ANSIBLE_FORCE_COLOR=0",
		"ANSIBLE_HOME=" + filepath.Join(tmp, "ansible-home"),
		"XDG_CACHE_HOME=" + filepath.Join(tmp, "cache"),
	}
}

// TestAnsibleLint runs ansible-lint with its default rules on the roles and
// playbooks (nothing skipped in ansible/.ansible-lint).
func TestAnsibleLint(t *testing.T) {
	lint := need(t, "ansible-lint", "ansible-lint")
	tmp := t.TempDir()
	// ansible-lint keeps a cache next to the project; do not leave it behind.
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Join(ansibleDir, ".cache")) })
	out, err := run(t, ansibleDir, ansibleEnv(tmp), 3*time.Minute, lint, "--nocolor")
	if err != nil {
		t.Fatalf("ansible-lint: %v\n%s", err, out)
	}
	t.Logf("ansible-lint: %s", lastLine(out))
}

// TestAnsibleSyntax runs --syntax-check on every playbook, with the
// example inventory and with the test inventory.
func TestAnsibleSyntax(t *testing.T) {
	ap := need(t, "ansible-playbook", "ansible")
	tmp := t.TempDir()
	for _, inv := range []string{"inventories/example", testInv} {
		args := append([]string{"--syntax-check", "-i", inv}, playbooks...)
		if out, err := run(t, ansibleDir, ansibleEnv(tmp), time.Minute, ap, args...); err != nil {
			t.Fatalf("syntax-check with %s: %v\n%s", inv, err, out)
		}
	}
}

// binaries are the hapair binaries the roles install, by role.
var binaries = []string{"hapair-witness", "hapair-roled", "hapair-lb", "hapairctl"}

// buildBinaries builds each binary into dir. One that does not build (yet)
// is replaced by a stub that accepts every config, and reported in the
// returned map as false so its --check-config part is skipped.
func buildBinaries(t *testing.T, dir string) map[string]bool {
	t.Helper()
	built := map[string]bool{}
	for _, b := range binaries {
		out, err := run(t, repoDir, nil, 4*time.Minute, "go", "build", "-o", filepath.Join(dir, b), "./cmd/"+b)
		if err == nil {
			built[b] = true
			continue
		}
		t.Logf("SKIP part: %s does not build, a stub stands in and its --check-config is not exercised:\n%s", b, out)
		stub := "#!/bin/sh\n# stub for " + b + " (the real one did not build)\nexit 0\n"
		if err := os.WriteFile(filepath.Join(dir, b), []byte(stub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return built
}

// hostAddrs mirror ansible/tests/inventory/hosts.yml.
var hostAddrs = map[string]string{"A": "127.0.10.11", "B": "127.0.10.12", "witness": "127.0.10.13", "lb1": "127.0.10.20"}

// writeCerts writes what `hapairctl certs` writes: ca.pem, <host>.pem and
// <host>-key.pem, each host certificate valid for server and client use.
func writeCerts(t *testing.T, dir string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "hapair test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", caDER, 0o644)
	serial := int64(2)
	for host, addr := range hostAddrs {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: host},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			DNSNames:     []string{host, "localhost"},
			IPAddresses:  []net.IP{net.ParseIP(addr), net.ParseIP("127.0.0.1")},
		}
		serial++
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		writePEM(t, filepath.Join(dir, host+".pem"), "CERTIFICATE", der, 0o644)
		writePEM(t, filepath.Join(dir, host+"-key.pem"), "PRIVATE KEY", kder, 0o600)
	}
}

func writePEM(t *testing.T, path, typ string, der []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
		t.Fatal(err)
	}
}

// converge is one test environment: binaries, certificates, roots.
type converge struct {
	t     *testing.T
	tmp   string
	roots string
	bin   string
	built map[string]bool
	env   []string
	ap    string
}

func newConverge(t *testing.T) *converge {
	ap := need(t, "ansible-playbook", "ansible")
	tmp := t.TempDir()
	c := &converge{t: t, tmp: tmp, roots: filepath.Join(tmp, "roots"), bin: filepath.Join(tmp, "bin"), ap: ap}
	certs := filepath.Join(tmp, "certs")
	for _, d := range []string{c.roots, c.bin, certs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// What every Debian host has already: the roles do not create these.
	for h := range hostAddrs {
		for _, d := range []string{"usr/local/bin", "etc/systemd/system"} {
			if err := os.MkdirAll(filepath.Join(c.roots, h, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.built = buildBinaries(t, c.bin)
	c.certs(certs)
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	g, err := user.LookupGroupId(u.Gid)
	if err != nil {
		t.Fatal(err)
	}
	c.env = append(ansibleEnv(tmp),
		"HAPAIR_TEST_ROOT="+c.roots,
		"HAPAIR_TEST_BIN="+c.bin,
		"HAPAIR_TEST_CERTS="+certs,
		"HAPAIR_TEST_USER="+u.Username,
		"HAPAIR_TEST_GROUP="+g.Name,
		"HAPAIR_TEST_CTL="+filepath.Join(tmp, "hapairctl"),
	)
	return c
}

// certs makes the hosts' certificates with `hapairctl certs`, the way an
// operator would; while hapairctl does not build, with the same layout
// generated here.
func (c *converge) certs(dir string) {
	t := c.t
	ctl := filepath.Join(c.tmp, "hapairctl")
	if out, err := run(t, repoDir, nil, 4*time.Minute, "go", "build", "-o", ctl, "./cmd/hapairctl"); err != nil {
		t.Logf("hapairctl does not build, generating the certificates in the test:\n%s", out)
		writeCerts(t, dir)
		return
	}
	args := []string{"certs", "--dir", dir}
	for h, a := range hostAddrs {
		args = append(args, h+"="+a)
	}
	if out, err := run(t, c.tmp, nil, time.Minute, ctl, args...); err != nil {
		t.Fatalf("hapairctl certs: %v\n%s", err, out)
	}
}

// site applies site.yml to all four hosts. The hosts share nothing at
// apply time here (no services), so the run is split over two
// ansible-playbook processes to use both cores (Ansible's per-task cost is
// mostly CPU: about 1 s per module run on the CI machines); the output of
// both is returned, recaps included.
func (c *converge) site(extra ...string) (string, error) {
	c.t.Helper()
	type result struct {
		out string
		err error
	}
	limits := []string{"A,witness", "B,lb1"}
	res := make(chan result, len(limits))
	for _, l := range limits {
		go func() {
			args := append([]string{"-i", testInv, "site.yml", "--limit", l}, extra...)
			out, err := run(c.t, ansibleDir, c.env, 20*time.Minute, c.ap, args...)
			res <- result{out, err}
		}()
	}
	var all strings.Builder
	var firstErr error
	for range limits {
		r := <-res
		all.WriteString(r.out)
		if r.err != nil && firstErr == nil {
			firstErr = r.err
		}
	}
	return all.String(), firstErr
}

// play runs a playbook against the test inventory.
func (c *converge) play(args ...string) (string, error) {
	c.t.Helper()
	return run(c.t, ansibleDir, c.env, 20*time.Minute, c.ap, append([]string{"-i", testInv}, args...)...)
}

var recapRE = regexp.MustCompile(`(?m)^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)`)

// recap sums changed and failed per host over every PLAY RECAP line.
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
		t.Fatalf("no PLAY RECAP in the output:\n%s", out)
	}
	return changed, failed
}

func (c *converge) path(host, p string) string { return filepath.Join(c.roots, host, p) }

// TestConverge applies site.yml for real (ansible_connection=local) to the
// four inventory hosts, each under its own root, then checks the files,
// idempotence, --check --diff, the binaries' --check-config on the rendered
// configs, systemd-analyze verify on the units, and that a broken variable
// stops the play at validation with the existing config untouched.
func TestConverge(t *testing.T) {
	if testing.Short() {
		t.Skip("the converge test applies the playbooks for real (minutes): skipped with -short")
	}
	c := newConverge(t)

	start := time.Now()
	out, err := c.site()
	if err != nil {
		t.Fatalf("first run: %v\n%s", err, out)
	}
	t.Logf("first run: %s", time.Since(start).Round(time.Millisecond))
	if changed, failed := recap(t, out); sum(failed) != 0 || len(changed) != len(hostAddrs) {
		t.Fatalf("first run: failed hosts %v, hosts run %v\n%s", failed, changed, out)
	}

	t.Run("files", c.checkFiles)
	t.Run("rendered", c.checkRendered)

	t.Run("idempotent", func(t *testing.T) {
		start := time.Now()
		out, err := c.site()
		if err != nil {
			t.Fatalf("second run: %v\n%s", err, out)
		}
		t.Logf("second run: %s", time.Since(start).Round(time.Millisecond))
		if changed, _ := recap(t, out); sum(changed) != 0 {
			t.Fatalf("second run changed %v (want 0 everywhere)\n%s", changed, out)
		}
	})

	t.Run("check-diff", c.checkDiff)
	t.Run("check-config", c.checkConfigs)
	t.Run("systemd-analyze", c.verifyUnits)
	t.Run("broken-peer-url", c.brokenPeerURL)
	t.Run("patroni-3.2-defaults", c.patroniReleaseDefaults) // before rto-6.5s, which rewrites every file
	t.Run("rto-6.5s", c.rtoBudget)
	t.Run("rto-hand-set-refused", c.rtoRefused)
	t.Run("rto-patroni-release", c.rtoPatroniRelease)
}

// rtoBudget applies site.yml with hapair_rto=6.5s: the rendered timers are
// the ones `hapairctl plan --rto 5s` derives (run on the controller), and
// every binary accepts its file.
func (c *converge) rtoBudget(t *testing.T) {
	if _, err := os.Stat(filepath.Join(c.tmp, "hapairctl")); err != nil {
		t.Skip("hapairctl did not build: nothing derives the budget")
	}
	out, err := c.site("-e", "hapair_rto=6.5s")
	if err != nil {
		t.Fatalf("site.yml with hapair_rto=6.5s: %v\n%s", err, out)
	}
	r := readYAML(t, c.path("A", "etc/hapair/roled.yaml"))
	p := r["patroni"].(map[string]any)
	if r["lease-ttl"] != "3s" || r["safety-margin"] != "600ms" || p["poll-interval"] != "250ms" || p["ttl"] != "5s" {
		t.Errorf("A: roled lease-ttl %v safety-margin %v patroni.poll-interval %v patroni.ttl %v, want 3s 600ms 250ms 5s",
			r["lease-ttl"], r["safety-margin"], p["poll-interval"], p["ttl"])
	}
	if sy := r["sync"].(map[string]any); sy["retry-min"] != "200ms" || sy["retry-max"] != "3.2s" || p["fast-poll-interval"] != "50ms" {
		t.Errorf("A: sync retry-min %v retry-max %v patroni.fast-poll-interval %v, want 200ms 3.2s 50ms (the budget's)",
			sy["retry-min"], sy["retry-max"], p["fast-poll-interval"])
	}
	if r["etcd-leader"] != "standby" || r["etcd-member"] != r["node"] {
		t.Errorf("A: etcd-leader %v etcd-member %v, want standby and the node's name %v", r["etcd-leader"], r["etcd-member"], r["node"])
	}
	lbc := readYAML(t, c.path("lb1", "etc/hapair/lb.yaml"))
	app := lbc["backends"].([]any)[0].(map[string]any)
	chk := app["check"].(map[string]any)
	if app["hold-timeout"] != "12s" || chk["interval"] != "320ms" || chk["timeout"] != "250ms" {
		t.Errorf("lb1: hold-timeout %v check.interval %v check.timeout %v, want 12s 320ms 250ms", app["hold-timeout"], chk["interval"], chk["timeout"])
	}
	w := readYAML(t, c.path("witness", "etc/hapair/witness.yaml"))
	if w["heartbeat-interval"] != "54ms" || w["election-timeout"] != "540ms" {
		t.Errorf("witness: heartbeat-interval %v election-timeout %v, want 54ms 540ms", w["heartbeat-interval"], w["election-timeout"])
	}
	pc := readYAML(t, c.path("B", "etc/patroni/config.yml"))
	dcs := pc["bootstrap"].(map[string]any)["dcs"].(map[string]any)
	if dcs["ttl"] != 5 || dcs["loop_wait"] != 1 || dcs["retry_timeout"] != 2 {
		t.Errorf("B: dcs timings %v/%v/%v, want 5/1/2", dcs["ttl"], dcs["loop_wait"], dcs["retry_timeout"])
	}
	c.checkConfigs(t)
}

// rtoRefused hand-sets a lease that Patroni's derived ttl cannot cover: the
// play stops at the budget check, naming the field, before any config is
// written.
func (c *converge) rtoRefused(t *testing.T) {
	if _, err := os.Stat(filepath.Join(c.tmp, "hapairctl")); err != nil {
		t.Skip("hapairctl did not build: nothing checks the budget")
	}
	cfg := c.path("A", "etc/hapair/roled.yaml")
	before := fileSum(t, cfg)
	out := c.playRefused(t, []string{"Check the timers against the budget", "roled.lease-ttl"},
		"roled.yml", "-e", "hapair_rto=6.5s", "-e", `{"hapair_timings": {"roled": {"lease-ttl": "9s"}}}`)
	if fileSum(t, cfg) != before {
		t.Errorf("A: roled.yaml changed by the refused run")
	}
	t.Logf("refused as expected: %s", grepLine(out, "lease-ttl"))
}

// patroniReleaseDefaults: without a budget, Patroni 3.2.0 and later get
// ttl 20 (they would run a lower one as 20 while /config showed it as set),
// the same loop_wait and retry_timeout, and no stop at the release check.
func (c *converge) patroniReleaseDefaults(t *testing.T) {
	dcs := func() map[string]any {
		pc := readYAML(t, c.path("B", "etc/patroni/config.yml"))
		return pc["bootstrap"].(map[string]any)["dcs"].(map[string]any)
	}
	if d := dcs(); d["ttl"] != 10 || d["loop_wait"] != 2 || d["retry_timeout"] != 3 {
		t.Fatalf("B on Patroni 3.0.2: dcs timings %v/%v/%v, want 10/2/3", d["ttl"], d["loop_wait"], d["retry_timeout"])
	}
	if out, err := c.play("patroni.yml", "-e", "hapair_patroni_version=3.2.2"); err != nil {
		t.Fatalf("patroni.yml on Patroni 3.2.2 with hapair's defaults: %v\n%s", err, out)
	}
	if d := dcs(); d["ttl"] != 20 || d["loop_wait"] != 2 || d["retry_timeout"] != 3 {
		t.Errorf("B on Patroni 3.2.2: dcs timings %v/%v/%v, want 20/2/3", d["ttl"], d["loop_wait"], d["retry_timeout"])
	}
}

// playRefused runs a play that must stop; its output must hold every
// string of want (the task that stopped it, the field it named).
func (c *converge) playRefused(t *testing.T, want []string, args ...string) string {
	t.Helper()
	out, err := c.play(args...)
	if err == nil {
		t.Fatalf("%v succeeded:\n%s", args, out)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Fatalf("%v did not stop with %q:\n%s", args, w, out)
		}
	}
	return out
}

// rtoPatroniRelease: Patroni 3.2.0 and later run a ttl below 20 s as 20 s
// (and retry_timeout below 3 s as 3 s). A target the release cannot meet
// is refused where it is derived, with the release named; hand-set timers
// it would raise stop the Patroni play at the release check, naming the
// field, before Patroni's config is written.
func (c *converge) rtoPatroniRelease(t *testing.T) {
	if _, err := os.Stat(filepath.Join(c.tmp, "hapairctl")); err != nil {
		t.Skip("hapairctl did not build: nothing checks the budget")
	}
	cfg := c.path("B", "etc/patroni/config.yml")
	before := fileSum(t, cfg)
	out := c.playRefused(t, []string{"Derive every timer from the RTO target", "for Patroni 3.2.2 (ttl 20s"},
		"patroni.yml", "-e", "hapair_rto=6.5s", "-e", "hapair_patroni_version=3.2.2")
	t.Logf("refused as expected: %s", grepLine(out, "cannot be met"))
	out = c.playRefused(t, []string{"against the release that runs them", "stdin: ttl: Patroni 3.2.2 runs ttl below 20s as 20s"},
		"patroni.yml", "-e", "hapair_patroni_version=3.2.2",
		"-e", `{"hapair_timings": {"patroni": {"ttl": 5, "loop_wait": 1, "retry_timeout": 2}}}`)
	if fileSum(t, cfg) != before {
		t.Errorf("B: Patroni's config.yml changed by the refused runs")
	}
	t.Logf("refused as expected: %s", grepLine(out, "runs ttl below"))
}

// checkDiff changes one variable and runs lb.yml with --check --diff: the
// change is reported and shown, and nothing is written.
func (c *converge) checkDiff(t *testing.T) {
	cfg := c.path("lb1", "etc/hapair/lb.yaml")
	before := fileSum(t, cfg)
	out, err := c.play("lb.yml", "--check", "--diff", "-e", "hapair_lb_hold_timeout=7s")
	if err != nil {
		t.Fatalf("--check --diff: %v\n%s", err, out)
	}
	if changed, _ := recap(t, out); changed["lb1"] != 1 {
		t.Errorf("--check --diff reports changed=%d on lb1, want 1 (the config)\n%s", changed["lb1"], out)
	}
	if !strings.Contains(out, "+    hold-timeout: 7s") || !strings.Contains(out, "-    hold-timeout: 5s") {
		t.Errorf("--diff does not show the hold-timeout change:\n%s", out)
	}
	if fileSum(t, cfg) != before {
		t.Errorf("--check wrote %s", cfg)
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// expected lists, per host, the files the roles must have written.
var expected = map[string][]string{
	"A": {
		"usr/local/bin/hapair-witness", "usr/local/bin/hapair-roled",
		"etc/hapair/witness.yaml", "etc/hapair/roled.yaml",
		"etc/hapair/tls/ca.pem", "etc/hapair/tls/node.pem", "etc/hapair/tls/node-key.pem",
		"etc/systemd/system/hapair-witness.service", "etc/systemd/system/hapair-roled.service",
		"etc/systemd/system/patroni.service.d/hapair.conf",
		"etc/patroni/config.yml", "usr/local/bin/hapair-check-patroni-config",
		"var/lib/hapair/witness", "var/lib/hapair/sync", "var/lib/app-ha",
		"srv/app/uploads", "srv/app/config",
		"usr/local/bin/hapairctl", "etc/hapair/ctl.yaml",
	},
	"witness": {
		"usr/local/bin/hapair-witness", "etc/hapair/witness.yaml",
		"etc/hapair/tls/node.pem", "etc/systemd/system/hapair-witness.service",
		"var/lib/hapair/witness",
		"usr/local/bin/hapairctl", "etc/hapair/ctl.yaml",
	},
	"lb1": {
		"usr/local/bin/hapair-lb", "etc/hapair/lb.yaml", "etc/hapair/tls/node.pem",
		"etc/systemd/system/hapair-lb.service", "etc/systemd/system/hapair-lb-web.socket",
		"usr/local/bin/hapairctl", "etc/hapair/ctl.yaml",
	},
}

// absent lists files a host must not get (narrow roles per host).
var absent = map[string][]string{
	"witness": {"usr/local/bin/hapair-roled", "etc/hapair/roled.yaml", "etc/patroni/config.yml", "usr/local/bin/hapair-lb"},
	"lb1":     {"usr/local/bin/hapair-witness", "etc/hapair/witness.yaml", "etc/hapair/roled.yaml"},
}

func (c *converge) checkFiles(t *testing.T) {
	expected["B"] = expected["A"]
	for host, files := range expected {
		for _, f := range files {
			if _, err := os.Stat(c.path(host, f)); err != nil {
				t.Errorf("%s: %s missing: %v", host, f, err)
			}
		}
	}
	for host, files := range absent {
		for _, f := range files {
			if _, err := os.Stat(c.path(host, f)); err == nil {
				t.Errorf("%s: %s present, it belongs to another host", host, f)
			}
		}
	}
	if fi, err := os.Stat(c.path("A", "etc/hapair/tls/node-key.pem")); err == nil && fi.Mode().Perm() != 0o640 {
		t.Errorf("A: node-key.pem mode %v, want 0640", fi.Mode().Perm())
	}
}

func readYAML(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

// checkRendered checks the settings DESIGN.md relies on in the rendered files.
func (c *converge) checkRendered(t *testing.T) {
	// Patroni 3.0.2: only the two members not on the node, through proxies.
	for host, want := range map[string][]any{
		"A": {"127.0.10.12:2379", "127.0.10.13:2379"},
		"B": {"127.0.10.11:2379", "127.0.10.13:2379"},
	} {
		p := readYAML(t, c.path(host, "etc/patroni/config.yml"))
		etcd := p["etcd3"].(map[string]any)
		if got := etcd["hosts"]; !equalAny(got, want) {
			t.Errorf("%s: etcd3.hosts = %v, want %v", host, got, want)
		}
		if etcd["use_proxies"] != true {
			t.Errorf("%s: etcd3.use_proxies = %v, want true", host, etcd["use_proxies"])
		}
		dcs := p["bootstrap"].(map[string]any)["dcs"].(map[string]any)
		if dcs["ttl"] != 10 || dcs["loop_wait"] != 2 || dcs["retry_timeout"] != 3 {
			t.Errorf("%s: dcs timings %v/%v/%v, want 10/2/3", host, dcs["ttl"], dcs["loop_wait"], dcs["retry_timeout"])
		}
		if dcs["check_timeline"] != true {
			t.Errorf("%s: check_timeline = %v, want true (lab scenario 12 lost writes without it)", host, dcs["check_timeline"])
		}
		// hapair_durability's default, async.
		if dcs["synchronous_mode"] != false || dcs["synchronous_mode_strict"] != false {
			t.Errorf("%s: synchronous_mode %v, strict %v; want false, false (hapair_durability async)", host, dcs["synchronous_mode"], dcs["synchronous_mode_strict"])
		}
		pg := dcs["postgresql"].(map[string]any)
		if pg["use_pg_rewind"] != true || pg["parameters"].(map[string]any)["wal_log_hints"] != "on" {
			t.Errorf("%s: pg_rewind/wal_log_hints not set: %v", host, pg)
		}
		// The budget's worst cases count one wal_retrieve_retry_interval
		// for a promote (PostgreSQL's default is 5 s).
		if v := pg["parameters"].(map[string]any)["wal_retrieve_retry_interval"]; v != budget.WalRetrieveRetryInterval.String() {
			t.Errorf("%s: wal_retrieve_retry_interval = %v, want the budget's %s", host, v, budget.WalRetrieveRetryInterval)
		}
		hba := fmtAny(p["postgresql"].(map[string]any)["pg_hba"])
		// 127.0.0.1: Patroni's own replication connection to its
		// PostgreSQL (a replica's timeline and LSN; without it no
		// switchover or failover to it, seen on the systemd hosts).
		for _, line := range []string{"host replication replicator 127.0.0.1/32", "host replication replicator 127.0.10.11/32", "host postgres rewind_user 127.0.10.12/32"} {
			if !strings.Contains(hba, line) {
				t.Errorf("%s: pg_hba lacks %q: %s", host, line, hba)
			}
		}
		params := p["postgresql"].(map[string]any)["parameters"].(map[string]any)
		if params["wal_sender_timeout"] != "5s" {
			t.Errorf("%s: wal_sender_timeout = %v, want 5s", host, params["wal_sender_timeout"])
		}
	}
	for host, role := range map[string]string{"A": "member", "B": "member", "witness": "witness"} {
		w := readYAML(t, c.path(host, "etc/hapair/witness.yaml"))
		if w["role"] != role || w["name"] != host {
			t.Errorf("%s: witness.yaml role/name = %v/%v, want %s/%s", host, w["role"], w["name"], role, host)
		}
		if n := len(w["initial-cluster"].([]any)); n != 3 {
			t.Errorf("%s: initial-cluster has %d members, want 3", host, n)
		}
	}
	// Patroni's unsafe REST endpoints need credentials (issue 18: anyone
	// reaching :8008 could POST /switchover or /reinitialize).
	restapi, _ := readYAML(t, c.path("A", "etc/patroni/config.yml"))["restapi"].(map[string]any)
	auth, _ := restapi["authentication"].(map[string]any)
	if auth["username"] != "patroni" || auth["password"] != "test-restapi" {
		t.Errorf("A: restapi.authentication = %v, want patroni/test-restapi", auth)
	}
	// ... and, with TLS on, a client certificate the cluster's CA signed:
	// HTTPS with verify_client optional (certificate-less unsafe requests
	// get 403; GETs need none).
	clean := func(v any) string { s, _ := v.(string); return filepath.Clean(s) }
	if clean(restapi["certfile"]) != c.path("A", "etc/hapair/tls/node.pem") || clean(restapi["cafile"]) != c.path("A", "etc/hapair/tls/ca.pem") ||
		restapi["verify_client"] != "optional" {
		t.Errorf("A: restapi TLS = certfile %v, cafile %v, verify_client %v; want the host's hapair files, optional",
			restapi["certfile"], restapi["cafile"], restapi["verify_client"])
	}
	rp, _ := readYAML(t, c.path("A", "etc/hapair/roled.yaml"))["patroni"].(map[string]any)
	if rp["url"] != "https://127.0.10.11:8008" || rp["tls"] == nil {
		t.Errorf("A: roled patroni.url %v, tls %v; want https://127.0.10.11:8008 (the certificate's address) with the host's files", rp["url"], rp["tls"])
	}
	for _, b := range readYAML(t, c.path("lb1", "etc/hapair/lb.yaml"))["backends"].([]any) {
		b := b.(map[string]any)
		if k := b["kind"]; (k == "pg-primary" || k == "pg-replicas") && b["check"].(map[string]any)["tls"] == nil {
			t.Errorf("lb1: backend %v checks Patroni without check.tls", b["name"])
		}
	}
	// hapairctl's config: every data node with the REST credentials, the
	// witness named, the balancer's admin JSON only where it listens.
	for host, admin := range map[string]string{"A": "", "witness": "", "lb1": "http://127.0.0.1:7480"} {
		p := c.path(host, "etc/hapair/ctl.yaml")
		cy := readYAML(t, p)
		nodes, _ := cy["nodes"].([]any)
		if len(nodes) != 2 || nodes[0].(map[string]any)["patroni-url"] != "https://patroni:test-restapi@127.0.10.11:8008" ||
			nodes[1].(map[string]any)["roled-url"] != "http://127.0.10.12:7400" {
			t.Errorf("%s: ctl.yaml nodes = %v", host, nodes)
		}
		if cy["patroni-tls"] == nil {
			t.Errorf("%s: ctl.yaml has no patroni-tls: hapairctl switchover could not present a client certificate", host)
		}
		if got := cy["lb"].(map[string]any)["admin-url"]; got != admin {
			t.Errorf("%s: ctl.yaml lb.admin-url = %v, want %q", host, got, admin)
		}
		if !equalAny(cy["witness-names"], []any{"witness"}) || len(cy["etcd"].(map[string]any)["endpoints"].([]any)) != 3 {
			t.Errorf("%s: ctl.yaml witness-names %v, etcd %v", host, cy["witness-names"], cy["etcd"])
		}
		if fi, err := os.Stat(p); err != nil {
			t.Error(err)
		} else if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: ctl.yaml mode %v, want 0600: it holds the REST API password", host, fi.Mode().Perm())
		}
	}
	r := readYAML(t, c.path("A", "etc/hapair/roled.yaml"))
	if peer := r["sync"].(map[string]any)["peer"]; peer != "127.0.10.12:7402" {
		t.Errorf("A: sync.peer = %v, want B's 127.0.10.12:7402", peer)
	}
	unit, _ := os.ReadFile(c.path("A", "etc/systemd/system/hapair-roled.service"))
	for _, want := range []string{"Type=notify", "WatchdogSec=", "Restart=on-failure", "After=network-online.target hapair-witness.service patroni.service",
		"ProtectSystem=strict", "ProtectHome=yes", "NoNewPrivileges=yes", "PrivateTmp=yes",
		"AmbientCapabilities=CAP_LEASE", "CapabilityBoundingSet=CAP_LEASE",
		"ReadWritePaths=" + c.path("A", "srv/app/uploads")} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("A: hapair-roled.service lacks %q", want)
		}
	}
	// Patroni cannot make PostgreSQL's socket directory on /run itself; a
	// boot whose systemd-tmpfiles run failed left it missing.
	dropin, _ := os.ReadFile(c.path("A", "etc/systemd/system/patroni.service.d/hapair.conf"))
	if !regexp.MustCompile(`(?m)^ExecStartPre=\+/usr/bin/install -d -o \S+ -g \S+ -m 2775 /\S+$`).Match(dropin) {
		t.Errorf("A: patroni.service.d/hapair.conf does not make the socket directory:\n%s", dropin)
	}
}

func equalAny(got any, want []any) bool { return fmtAny(got) == fmtAny(want) }

func fmtAny(v any) string {
	b, _ := yaml.Marshal(v)
	return string(b)
}

// configs maps each rendered config to its binary.
var configs = []struct{ host, file, bin string }{
	{"A", "etc/hapair/witness.yaml", "hapair-witness"},
	{"B", "etc/hapair/witness.yaml", "hapair-witness"},
	{"witness", "etc/hapair/witness.yaml", "hapair-witness"},
	{"A", "etc/hapair/roled.yaml", "hapair-roled"},
	{"B", "etc/hapair/roled.yaml", "hapair-roled"},
	{"lb1", "etc/hapair/lb.yaml", "hapair-lb"},
	{"A", "etc/hapair/ctl.yaml", "hapairctl"},
	{"witness", "etc/hapair/ctl.yaml", "hapairctl"},
	{"lb1", "etc/hapair/ctl.yaml", "hapairctl"},
}

func (c *converge) checkConfigs(t *testing.T) {
	for _, cf := range configs {
		if !c.built[cf.bin] {
			t.Logf("SKIP %s %s: %s did not build", cf.host, cf.file, cf.bin)
			continue
		}
		out, err := run(t, c.tmp, nil, 30*time.Second, filepath.Join(c.bin, cf.bin), "--config", c.path(cf.host, cf.file), "--check-config")
		if err != nil {
			t.Errorf("%s: %s --check-config %s: %v\n%s", cf.host, cf.bin, cf.file, err, out)
		}
	}
}

// verifyUnits runs systemd-analyze verify on every rendered unit. The units
// name the binaries by their root-prefixed paths (hapair_common_root), which
// exist, so verify checks the real ExecStart; any warning fails the test.
func (c *converge) verifyUnits(t *testing.T) {
	sa := need(t, "systemd-analyze", "systemd")
	units, _ := filepath.Glob(filepath.Join(c.roots, "*", "etc/systemd/system/*.service"))
	if len(units) != 6 {
		t.Fatalf("found %d units, want 6 (hapair-witness on A, B, witness; hapair-roled on A, B; hapair-lb on lb1): %v", len(units), units)
	}
	for _, u := range units {
		// With the socket units beside it (hapair-lb's listeners): the
		// service requires them.
		sockets, _ := filepath.Glob(filepath.Join(filepath.Dir(u), "*.socket"))
		out, err := run(t, c.tmp, []string{"SYSTEMD_LOG_COLOR=0"}, time.Minute, sa, append([]string{"verify", u}, sockets...)...)
		if err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("systemd-analyze verify %s %v: %v\n%s", u, sockets, err, out)
		}
	}
	// hapair-lb's listeners are socket-activated (hapair_lb_socket_activation).
	unit, _ := os.ReadFile(c.path("lb1", "etc/systemd/system/hapair-lb.service"))
	for _, name := range []string{"web", "pg-rw", "pg-ro"} {
		sock, err := os.ReadFile(c.path("lb1", "etc/systemd/system/hapair-lb-"+name+".socket"))
		if err != nil || !strings.Contains(string(sock), "FileDescriptorName="+name+"\n") || !strings.Contains(string(sock), "Service=hapair-lb.service") {
			t.Errorf("lb1: hapair-lb-%s.socket: %v\n%s", name, err, sock)
		}
		if !strings.Contains(string(unit), "hapair-lb-"+name+".socket") {
			t.Errorf("lb1: hapair-lb.service does not name hapair-lb-%s.socket:\n%s", name, unit)
		}
	}
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// brokenPeerURL sets a malformed peer URL: hapair-witness --check-config
// (the template's validate:) refuses it, the play stops there, and the
// config already on every host is unchanged.
func (c *converge) brokenPeerURL(t *testing.T) {
	if !c.built["hapair-witness"] {
		t.Skip("hapair-witness does not build: nothing validates the peer URL")
	}
	before := map[string]string{}
	for _, h := range []string{"A", "B", "witness"} {
		before[h] = fileSum(t, c.path(h, "etc/hapair/witness.yaml"))
	}
	out, err := c.play("etcd.yml", "-e", "hapair_etcd_peer_url=https//127.0.10.11:2380")
	if err == nil {
		t.Fatalf("etcd.yml with a malformed peer URL succeeded:\n%s", out)
	}
	if !strings.Contains(out, "failed to validate") || !strings.Contains(out, "Write the member config") {
		t.Fatalf("the play did not stop at the config validation:\n%s", out)
	}
	if !strings.Contains(out, "peer-url") {
		t.Errorf("the validation error does not name the field:\n%s", out)
	}
	for h, sum := range before {
		if got := fileSum(t, c.path(h, "etc/hapair/witness.yaml")); got != sum {
			t.Errorf("%s: witness.yaml changed by the failed run", h)
		}
	}
	t.Logf("refused as expected: %s", grepLine(out, "peer-url"))
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func grepLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}
