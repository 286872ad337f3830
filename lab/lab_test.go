package lab

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/hapair/hapair/budget"
)

func TestPatroniConfigModes(t *testing.T) {
	for _, mode := range []string{DCSRemote, DCSAll} {
		var cfg struct {
			Etcd3 struct {
				Hosts      []string `yaml:"hosts"`
				UseProxies bool     `yaml:"use_proxies"`
			} `yaml:"etcd3"`
			PostgreSQL struct {
				BinDir string `yaml:"bin_dir"`
			} `yaml:"postgresql"`
		}
		text := patroniConfig(NodeA, mode, "/d/pg", "/d/run", budget.FileOf(0, labTimers()).Patroni, "")
		if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
			t.Fatalf("%s: %v\n%s", mode, err, text)
		}
		hosts := strings.Join(cfg.Etcd3.Hosts, ",")
		own := strings.Contains(hosts, IP(NodeA))
		switch mode {
		case DCSRemote:
			if own || len(cfg.Etcd3.Hosts) != 2 || !cfg.Etcd3.UseProxies {
				t.Errorf("remote mode: hosts %v use_proxies %v (DESIGN.md §3: the two other members + use_proxies)", hosts, cfg.Etcd3.UseProxies)
			}
		case DCSAll:
			if !own || len(cfg.Etcd3.Hosts) != 3 || cfg.Etcd3.UseProxies {
				t.Errorf("all mode: hosts %v use_proxies %v", hosts, cfg.Etcd3.UseProxies)
			}
		}
		for _, want := range []string{"ttl: 10", "loop_wait: 2", "retry_timeout: 3", "use_pg_rewind: true",
			"wal_sender_timeout: 5s", "locale: C.UTF-8", "bin_dir: /usr/lib/postgresql/15/bin", "pgpass: /d/run/pgpass"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s: config lacks %q", mode, want)
			}
		}
	}
}

// TestLab runs the scenarios on real namespaces, Patroni 3.0.2 and
// PostgreSQL 15, with the project's binaries built from this tree. It needs
// root and the Debian packages patroni, postgresql-15, iptables; set
// HAPAIR_LAB_RUN to a regexp to run only some scenarios. Allow ~15 min
// (go test -timeout 32m, as make test does).
func TestLab(t *testing.T) {
	if testing.Short() {
		t.Skip("lab scenarios are long; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("the lab needs root (network namespaces)")
	}
	for p, pkg := range map[string]string{"/usr/bin/patroni": "patroni", "/usr/lib/postgresql/15/bin/postgres": "postgresql-15",
		"/usr/sbin/iptables": "iptables"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("%s missing: apt-get install %s", p, pkg)
		}
	}
	budget := 28 * time.Minute
	if dl, ok := t.Deadline(); ok && time.Until(dl) < 13*time.Minute && os.Getenv("HAPAIR_LAB_RUN") == "" {
		t.Skipf("the lab scenarios need about 13 min on 2 cores: run with go test -timeout 32m (%s left)", time.Until(dl).Round(time.Second))
	} else if ok && time.Until(dl)-time.Minute < budget {
		budget = time.Until(dl) - time.Minute
	}
	rx := regexp.MustCompile(os.Getenv("HAPAIR_LAB_RUN"))
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	opt := buildForTest(ctx, t)
	for _, mode := range []string{DCSRemote, DCSAll} {
		var todo []Scenario
		for _, s := range Scenarios {
			if s.DCS == mode && rx.MatchString(s.Name) {
				todo = append(todo, s)
			}
		}
		if len(todo) == 0 {
			continue
		}
		t.Run("dcs-"+mode, func(t *testing.T) { runLabGroup(ctx, t, opt, mode, todo) })
	}
	// Scenarios on a lab built with a timing budget, one lab per target.
	for _, rs := range RTOScenarios {
		if !rx.MatchString(rs.Scenario.Name) {
			continue
		}
		o := opt
		o.RTO, o.Hold = rs.RTO, ""
		t.Run("rto-"+rs.RTO, func(t *testing.T) { runLabGroup(ctx, t, o, rs.Scenario.DCS, []Scenario{rs.Scenario}) })
	}
	// The durability modes' own scenarios (issue 19) and the VIP scenarios
	// with keepalived (issue 20), one lab per group.
	for _, g := range Groups {
		todo := g.Matching(rx)
		if len(todo) == 0 || !g.Runs(opt) {
			continue
		}
		o := opt
		g.Build(&o)
		t.Run(g.Name, func(t *testing.T) {
			if _, err := exec.LookPath("keepalived"); err != nil && o.VIPPeer == VIPPeerKeepalived {
				t.Skip("keepalived not installed (Debian package keepalived)")
			}
			runLabGroup(ctx, t, o, DCSRemote, todo)
		})
	}
}

func runLabGroup(ctx context.Context, t *testing.T, opt Options, mode string, todo []Scenario) {
	opt.DCSMode = mode
	var out bytes.Buffer
	l, err := NewLab(opt, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Down(); err != nil {
			t.Errorf("down: %v", err)
		}
		for _, h := range append([]string{bridge}, Hosts...) {
			if l.Net.Exists(h) {
				t.Errorf("namespace %s left behind", l.Net.NS(h))
			}
		}
	})
	if err := l.Up(ctx); err != nil {
		t.Fatalf("up: %v\n%s", err, out.String())
	}
	for _, s := range todo {
		t.Run(s.Name, func(t *testing.T) {
			out.Reset()
			r := RunOne(ctx, l, s)
			var rep bytes.Buffer
			PrintResult(&rep, r)
			t.Log("\n" + rep.String())
			if r.Skipped != "" {
				t.Skip(r.Skipped)
			}
			if !r.OK() {
				t.Errorf("scenario failed; lab output:\n%s", out.String())
				// One failure stays one failure: the next scenario runs on
				// a new lab, not on whatever this one left behind.
				t.Logf("rebuilding the lab after the failed scenario")
				_ = l.Down()
				nl, err := NewLab(opt, &out)
				if err != nil {
					t.Fatalf("rebuild: %v", err)
				}
				l = nl
				if err := l.Up(ctx); err != nil {
					t.Fatalf("rebuild: up: %v\n%s", err, out.String())
				}
			}
		})
	}
}

// buildForTest builds hapair-lab and the project's binaries into a temp
// dir; the lab state goes under /var/tmp (postgres must traverse it).
func buildForTest(ctx context.Context, t *testing.T) Options {
	wd, _ := os.Getwd()
	root, err := ModuleRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	self, err := BuildSelf(ctx, root, bin)
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	built, failed := Build(ctx, root, bin, &log)
	t.Logf("built %v; missing %v\n%s", built, failed, log.String())
	state, err := os.MkdirTemp("/var/tmp", "hapair-labtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if os.Getenv("HAPAIR_LAB_KEEP") != "" { // post-mortem: logs stay in <state>/logs
			t.Logf("lab state kept in %s", state)
			return
		}
		_ = os.RemoveAll(state)
	})
	if err := os.Chmod(state, 0o755); err != nil {
		t.Fatal(err)
	}
	// roled holds the lab's VIP (scenarios 10 and 11; the other scenarios
	// then also run in the "two nodes, VIP" shape). HAPAIR_LAB_VIP=0: without.
	return Options{Root: state, BinDir: bin, SelfExe: self, Hold: "5s", Owned: true, VIP: os.Getenv("HAPAIR_LAB_VIP") != "0"}
}
