package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapair/hapair/budget"
)

const (
	planRoled   = "node: A\nlease-ttl: 3s\nsafety-margin: 600ms\nkeepalive-interval: 800ms\nreread-interval: 800ms\npatroni: {ttl: 5s, poll-interval: 250ms, timeout: 1s}\npostgres: {timeout: 1s}\n"
	planLB      = "listeners: [{name: web, listen: \"127.0.0.1:0\", backend: app}]\nbackends:\n  - name: app\n    kind: active-passive\n    hold-timeout: 9s\n    check: {interval: 320ms, timeout: 250ms}\n    servers: [{name: A, address: \"127.0.0.1:8080\"}]\n"
	planWitness = "name: witness\nheartbeat-interval: 54ms\nelection-timeout: 540ms\n"
	planPatroni = "scope: hapair\nrestapi: {listen: 0.0.0.0:8008}\nbootstrap:\n  dcs: {ttl: 5, loop_wait: 1, retry_timeout: 2}\n"
)

func writeFiles(t *testing.T, files map[string]string) []string {
	t.Helper()
	dir := t.TempDir()
	var paths []string
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}

func TestPlanRTO(t *testing.T) {
	code, out, errs := runCtl(t, "plan", "--rto", "6.5s")
	if code != 0 || !strings.Contains(out, "meets rto 6.5s") || !strings.Contains(out, "kill of the primary's node: typical 5.495s, worst 9.09s") ||
		!strings.Contains(out, "death of the primary's host (no RST): typical 7.495s, worst 11.09s\n  outside the target") {
		t.Fatalf("plan --rto 6.5s: exit %d\n%s%s", code, out, errs)
	}
	code, out, _ = runCtl(t, "plan", "--rto", "6.5s", "--json")
	var f budget.File
	if err := json.Unmarshal([]byte(out), &f); code != 0 || err != nil || f.Patroni.TTL != 5 || len(f.Outages) != 5 || f.Outages[4].Outside == "" || f.LB.HoldTimeout != budget.Duration(12*time.Second) {
		t.Fatalf("plan --json: exit %d, %v, %+v", code, err, f)
	}
	code, _, errs = runCtl(t, "plan", "--rto", "5s")
	if code != 1 || !strings.Contains(errs, "cannot be met safely") || !strings.Contains(errs, "fastest safe timers") {
		t.Fatalf("plan --rto 5s: exit %d, stderr %s", code, errs)
	}
	if code, _, _ := runCtl(t, "plan"); code != 2 {
		t.Fatalf("plan without --rto: exit %d, want 2", code)
	}
}

// TestPlanCheck: the files the 5 s plan describes pass; a hand-set
// combination breaking a rule across files is refused naming the field.
func TestPlanCheck(t *testing.T) {
	good := map[string]string{"roled.yaml": planRoled, "lb.yaml": planLB, "witness.yaml": planWitness, "config.yml": planPatroni}
	code, out, errs := runCtl(t, append([]string{"plan", "--check", "--rto", "6.5s"}, writeFiles(t, good)...)...)
	if code != 0 || !strings.Contains(out, "meets rto 6.5s") {
		t.Fatalf("consistent files: exit %d\n%s%s", code, out, errs)
	}
	for _, tc := range []struct {
		name string
		edit map[string]string // file → new body
		want string
		code int
	}{
		{"lease − margin reaches ttl − loop_wait", map[string]string{
			"roled.yaml": strings.NewReplacer("lease-ttl: 3s", "lease-ttl: 5s", "ttl: 5s", "ttl: 6s").Replace(planRoled),
			"config.yml": strings.Replace(planPatroni, "ttl: 5, loop_wait: 1", "ttl: 6, loop_wait: 2", 1)},
			"roled.yaml: lease-ttl", 2},
		{"roled's patroni.ttl is not Patroni's", map[string]string{"roled.yaml": strings.Replace(planRoled, "ttl: 5s", "ttl: 10s", 1)},
			"roled.yaml: patroni.ttl", 2},
		{"election outlasts retry_timeout", map[string]string{"witness.yaml": strings.Replace(planWitness, "540ms", "1s", 1)},
			"witness.yaml: election-timeout", 2},
		{"check interval × fall above hold-timeout", map[string]string{"lb.yaml": strings.Replace(planLB, "hold-timeout: 9s", "hold-timeout: 400ms", 1)},
			"backends[0].check.interval", 2},
		{"slower Patroni misses the target", map[string]string{
			"config.yml": strings.Replace(planPatroni, "ttl: 5, loop_wait: 1, retry_timeout: 2", "ttl: 10, loop_wait: 2, retry_timeout: 3", 1),
			"roled.yaml": strings.Replace(planRoled, "ttl: 5s", "ttl: 10s", 1)},
			"miss rto 6.5s", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := map[string]string{}
			for k, v := range good {
				files[k] = v
			}
			for k, v := range tc.edit {
				files[k] = v
			}
			code, out, errs := runCtl(t, append([]string{"plan", "--check", "--rto", "6.5s"}, writeFiles(t, files)...)...)
			if code != tc.code || !strings.Contains(errs, tc.want) {
				t.Errorf("exit %d (want %d), stderr lacks %q:\n%s%s", code, tc.code, tc.want, errs, out)
			}
		})
	}
}

// TestPlanCheckDynamic reads Patroni's dynamic configuration as GET /config
// and patronictl show-config print it, and plan --json's own output.
func TestPlanCheckDynamic(t *testing.T) {
	_, js, _ := runCtl(t, "plan", "--rto", "6.5s", "--json")
	paths := writeFiles(t, map[string]string{"dynamic.json": `{"ttl": 5, "loop_wait": 1, "retry_timeout": 2, "postgresql": {}}`,
		"plan.json": js})
	if code, out, errs := runCtl(t, append([]string{"plan", "--check"}, paths...)...); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	paths = writeFiles(t, map[string]string{"dynamic.json": `{"ttl": 10, "loop_wait": 2, "retry_timeout": 3}`, "plan.json": js})
	if code, _, errs := runCtl(t, append([]string{"plan", "--check"}, paths...)...); code != 2 || !strings.Contains(errs, "differs") {
		t.Fatalf("dynamic ttl 10 against the plan's 5: exit %d, stderr %s", code, errs)
	}
}

// TestPlanPatroniRelease: Patroni 3.2.0 and later run a ttl below 20 s as
// 20 s. A plan for such a release never sets one, a target it cannot meet
// is refused with the release named, and --check refuses timers it would
// raise, naming the field.
func TestPlanPatroniRelease(t *testing.T) {
	code, out, errs := runCtl(t, "plan", "--rto", "6.5s")
	if code != 0 || !strings.Contains(out, "on Patroni 3.0.2") {
		t.Fatalf("plan --rto 6.5s does not say it is for Patroni 3.0.2: exit %d\n%s%s", code, out, errs)
	}
	code, _, errs = runCtl(t, "plan", "--rto", "6.5s", "--patroni", "patroni 3.2.2")
	if code != 1 || !strings.Contains(errs, "for Patroni 3.2.2 (ttl 20s") {
		t.Fatalf("plan --rto 6.5s --patroni 3.2.2: exit %d, stderr %s", code, errs)
	}
	code, out, errs = runCtl(t, "plan", "--rto", "30s", "--patroni", "4.0.4", "--json")
	var f budget.File
	if err := json.Unmarshal([]byte(out), &f); code != 0 || err != nil || f.Patroni.TTL < 20 || f.Patroni.RetryTimeout < 3 || f.Patroni.Version != "4.0.4" {
		t.Fatalf("plan --rto 30s --patroni 4.0.4: exit %d, %v, %+v %s", code, err, f.Patroni, errs)
	}
	if code, _, errs := runCtl(t, "plan", "--rto", "30s", "--patroni", "latest"); code != 2 || !strings.Contains(errs, "--patroni") {
		t.Fatalf("an unreadable --patroni: exit %d, stderr %s", code, errs)
	}
	// Patroni's dynamic configuration as the Ansible play hands it over.
	dyn := writeFiles(t, map[string]string{"dynamic.json": `{"ttl": 5, "loop_wait": 1, "retry_timeout": 2}`})
	if code, out, errs := runCtl(t, "plan", "--check", "--patroni", "3.0.2", dyn[0]); code != 0 {
		t.Fatalf("5/1/2 on Patroni 3.0.2: exit %d\n%s%s", code, out, errs)
	}
	code, _, errs = runCtl(t, "plan", "--check", "--patroni", "3.2.2", dyn[0])
	if code != 2 || !strings.Contains(errs, "dynamic.json: ttl: Patroni 3.2.2 runs ttl below 20s as 20s") ||
		!strings.Contains(errs, "retry_timeout: Patroni 3.2.2 runs retry_timeout below 3s as 3s") {
		t.Fatalf("5/1/2 on Patroni 3.2.2: exit %d, stderr %s", code, errs)
	}
	// A plan file carries its release: checked against it without --patroni.
	_, js, _ := runCtl(t, "plan", "--rto", "30s", "--patroni", "3.2.2", "--json")
	if code, out, errs := runCtl(t, "plan", "--check", writeFiles(t, map[string]string{"plan.json": js})[0]); code != 0 {
		t.Fatalf("the 3.2.2 plan read back: exit %d\n%s%s", code, out, errs)
	}
}

// TestPlanCheckPartial: the Ansible play's merged timers when only some
// sections are hand-set (no hapair_rto): a plan with a target and the
// sections given.
func TestPlanCheckPartial(t *testing.T) {
	p := writeFiles(t, map[string]string{"merged.json": `{"target": "0s", "patroni": {"ttl": 5, "loop_wait": 1, "retry_timeout": 2}}`})
	if code, out, errs := runCtl(t, "plan", "--check", p[0]); code != 0 {
		t.Fatalf("patroni section alone: exit %d\n%s%s", code, out, errs)
	}
	p = writeFiles(t, map[string]string{"merged.json": `{"target": "0s", "patroni": {"ttl": 5, "loop_wait": 2, "retry_timeout": 2}}`})
	if code, _, errs := runCtl(t, "plan", "--check", p[0]); code != 2 || !strings.Contains(errs, "merged.json: patroni.ttl") {
		t.Fatalf("loop_wait + 2 × retry_timeout above ttl: exit %d, stderr %s", code, errs)
	}
}
