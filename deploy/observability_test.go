package deploy_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

const (
	rulesFile     = "prometheus/hapair.rules.yml"
	rulesTestFile = "prometheus/hapair.rules.test.yml"
	dashboardFile = "grafana/hapair.json"
)

// TestPromtoolRules checks the alert rules and runs their unit tests
// (dual ACTIVE and no ACTIVE fire on synthetic series, among others).
func TestPromtoolRules(t *testing.T) {
	pt := need(t, "promtool", "prometheus")
	if out, err := run(t, ".", nil, time.Minute, pt, "check", "rules", rulesFile); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	// The example scrape config loads the rules with the job names they use.
	if out, err := run(t, "prometheus", nil, time.Minute, pt, "check", "config", "scrape.example.yml"); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	out, err := run(t, "prometheus", nil, time.Minute, pt, "test", "rules", filepath.Base(rulesTestFile))
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	// The alerts the issues name must be among the tested ones.
	b, _ := os.ReadFile(rulesTestFile)
	for _, a := range []string{"alertname: HapairDualActive", "alertname: HapairNoActive",
		"alertname: HapairNotRedundant", "alertname: HapairStuckLeader"} {
		if !strings.Contains(string(b), a) {
			t.Errorf("%s has no test for %s", rulesTestFile, a)
		}
	}
}

// TestAlertRulesMetricsExist checks that every metric the alert rules read
// is exported by the binaries (or etcd inside hapair-witness, or Prometheus'
// own up).
func TestAlertRulesMetricsExist(t *testing.T) {
	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	known := exportedMetrics(t)
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			for _, m := range metricNames(r.Expr) {
				if err := known.check(m); err != "" {
					t.Errorf("alert %s: %s", r.Alert, err)
				}
			}
		}
	}
}

type dashboard struct {
	Title  string  `json:"title"`
	UID    string  `json:"uid"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// TestDashboard checks that the dashboard is valid JSON with the panels the
// issue asks for, and that every metric it queries is exported.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardFile, err)
	}
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard lacks uid, title or panels")
	}
	ids := map[int]bool{}
	queried := map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range metricNames(tg.Expr) {
				queried[m] = true
			}
		}
	}
	// The views the issue asks for, by a metric each must show.
	for _, m := range []string{
		"hapair_roled_role", "hapair_roled_epoch", // role per node, epoch
		"patroni_primary", "patroni_xlog_replayed_location", // Patroni role, replication lag
		"hapair_sync_lag_seconds", "hapair_sync_queue_depth", // sync lag and queue
		"hapair_lb_requests_total", "hapair_lb_server_errors_total", "hapair_lb_server_eligible", // balancer
		"etcd_server_has_leader", "hapair_witness_members_healthy", // etcd member health
		"hapair_roled_fpm_active_processes", "hapair_roled_fpm_idle_processes",
		"hapair_roled_fpm_listen_queue", "hapair_roled_fpm_utilisation_ratio", // worker pool
		"hapair_roled_standby_ready", "hapair_roled_standby_not_ready_reason", // redundancy (issue 17)
		"hapair_roled_leader_stuck", "hapair_roled_leader_unwritable_seconds", // stuck leader
	} {
		if !queried[m] {
			t.Errorf("dashboard does not query %s", m)
		}
	}
	known := exportedMetrics(t)
	names := make([]string, 0, len(queried))
	for m := range queried {
		names = append(names, m)
	}
	sort.Strings(names)
	for _, m := range names {
		if err := known.check(m); err != "" {
			t.Errorf("dashboard: %s", err)
		}
	}
	t.Logf("dashboard: %d panels, %d metrics, all exported", len(d.Panels), len(names))
}

var (
	labelSetRE = regexp.MustCompile(`\{[^}]*\}`)
	rangeRE    = regexp.MustCompile(`\[[^\]]*\]`)
	stringRE   = regexp.MustCompile(`"[^"]*"`)
	groupingRE = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	identRE    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?`)
)

var promqlWords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true, "group_left": true, "group_right": true}

// metricNames returns the metric names a PromQL expression reads: the
// identifiers left after removing label sets, ranges, strings and grouping
// clauses, that are not function calls or operators.
func metricNames(expr string) []string {
	s := stringRE.ReplaceAllString(expr, `""`)
	s = labelSetRE.ReplaceAllString(s, " ")
	s = rangeRE.ReplaceAllString(s, " ")
	s = groupingRE.ReplaceAllString(s, " ")
	var out []string
	for _, m := range identRE.FindAllString(s, -1) {
		if strings.HasSuffix(m, "(") {
			continue // a function or aggregation
		}
		m = strings.TrimSpace(m)
		if promqlWords[strings.ToLower(m)] {
			continue
		}
		out = append(out, m)
	}
	return out
}

// metricSet holds the names the binaries export, by source.
type metricSet struct {
	hapair  map[string]bool // from the code of roled, syncdir, lb, witness
	etcd    map[string]bool // from the etcd server module hapair-witness embeds
	patroni map[string]bool // from the installed Patroni (nil: not installed)
}

// check returns "" when m is exported, else why not. Histogram series
// (_bucket, _sum, _count) count as their family.
func (s metricSet) check(m string) string {
	if m == "up" {
		return ""
	}
	base := m
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if strings.HasSuffix(m, suf) {
			base = strings.TrimSuffix(m, suf)
		}
	}
	switch {
	case strings.HasPrefix(m, "hapair_"):
		if s.hapair[m] || s.hapair[base] {
			return ""
		}
		return m + " is not exported by roled, syncdir, lb or witness (not found in their code)"
	case strings.HasPrefix(m, "etcd_"):
		if s.etcd[m] || s.etcd[base] {
			return ""
		}
		return m + " is not an etcd server metric"
	case strings.HasPrefix(m, "patroni_"):
		if s.patroni == nil || s.patroni[m] {
			return ""
		}
		return m + " is not exported by the installed Patroni"
	}
	return m + ": unknown metric family"
}

var (
	fullNameRE  = regexp.MustCompile(`"(hapair_[a-z0-9_]+)"`)
	prefixRE    = regexp.MustCompile(`"hapair",\s*(?:Subsystem:\s*)?"([a-z0-9_]+)"`)
	shortNameRE = regexp.MustCompile(`(?:\(|Name:\s*)"([a-z][a-z0-9_]*)"`)
	etcdOptsRE  = regexp.MustCompile(`Namespace:\s*"etcd",\s*Subsystem:\s*"([a-z_]+)",\s*Name:\s*"([a-z_]+)"`)
)

// exportedMetrics greps the exported names from the code. The packages
// build names three ways: full literals ("hapair_lb_server_up"), a literal
// prefix plus a short name ("hapair_sync_" + name), and namespace/subsystem
// plus a short name (BuildFQName("hapair", "roled", n), Namespace/Subsystem
// opts, const ns, sub = "hapair", "roled"). Short names are the string
// literals passed as first argument or as Name: in the same package; the
// pairing may admit a few names no metric has, never drop a real one.
func exportedMetrics(t *testing.T) metricSet {
	t.Helper()
	s := metricSet{hapair: map[string]bool{}, etcd: map[string]bool{}}
	for _, pkg := range []string{"roled", "syncdir", "lb", "witness"} {
		files, _ := filepath.Glob(filepath.Join(repoDir, pkg, "*.go"))
		prefixes := map[string]bool{}
		shorts := map[string]bool{}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			src := string(b)
			for _, m := range fullNameRE.FindAllStringSubmatch(src, -1) {
				if strings.HasSuffix(m[1], "_") {
					prefixes[m[1]] = true
				} else {
					s.hapair[m[1]] = true
				}
			}
			for _, m := range prefixRE.FindAllStringSubmatch(src, -1) {
				prefixes["hapair_"+m[1]+"_"] = true
			}
			for _, m := range shortNameRE.FindAllStringSubmatch(src, -1) {
				shorts[m[1]] = true
			}
		}
		for p := range prefixes {
			for n := range shorts {
				s.hapair[p+n] = true
			}
		}
	}
	if len(s.hapair) == 0 {
		t.Fatal("no hapair metric found in the code")
	}
	// etcd's own metrics, served by hapair-witness's metrics listener.
	if out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "go.etcd.io/etcd/server/v3").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		_ = filepath.WalkDir(dir, func(p string, de os.DirEntry, err error) error {
			if err != nil || de.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, m := range etcdOptsRE.FindAllStringSubmatch(string(b), -1) {
				s.etcd["etcd_"+m[1]+"_"+m[2]] = true
			}
			return nil
		})
	}
	if len(s.etcd) == 0 {
		t.Fatal("no etcd server metric found in go.etcd.io/etcd/server/v3 (module not downloaded?)")
	}
	// Patroni's /metrics (Debian package patroni); without it those names
	// are not checked.
	if b, err := os.ReadFile("/usr/lib/python3/dist-packages/patroni/api.py"); err == nil {
		s.patroni = map[string]bool{}
		for _, m := range regexp.MustCompile(`patroni_[a-z_]+`).FindAllString(string(b), -1) {
			s.patroni[m] = true
		}
	} else {
		t.Log("patroni not installed (Debian package patroni): patroni_* names not checked")
	}
	return s
}

// TestMetricCheck makes sure the name check can fail: typos and names from
// nowhere are refused, PromQL syntax is not taken for names.
func TestMetricCheck(t *testing.T) {
	got := metricNames(`sum by (instance) (rate(hapair_lb_requests_total{code="5xx"}[5m])) / on (instance) group_left up or vector(0)`)
	if strings.Join(got, ",") != "hapair_lb_requests_total,up" {
		t.Errorf("metricNames = %v, want [hapair_lb_requests_total up]", got)
	}
	known := exportedMetrics(t)
	for _, m := range []string{"hapair_roled_rolee", "hapair_lb_requests", "etcd_server_has_leaders", "node_load1"} {
		if known.check(m) == "" {
			t.Errorf("check(%s) accepted a name nothing exports", m)
		}
	}
	for _, m := range []string{"hapair_roled_role", "hapair_sync_lag_seconds", "hapair_witness_members", "etcd_server_is_leader",
		"hapair_roled_patroni_check_duration_seconds_bucket"} {
		if err := known.check(m); err != "" {
			t.Errorf("check(%s): %s", m, err)
		}
	}
}
