package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Must show 5: each bad configuration exits 2 with one line naming the
// field, and touches no data dir.
func TestBadConfigExits2(t *testing.T) {
	cases := []struct {
		name    string
		edit    func(p *proc)
		field   string
		anyLine bool // the YAML decoder's own message may span lines
	}{
		{"missing name", func(p *proc) { delete(p.cfg, "name") }, "name", false},
		{"malformed peer URL", func(p *proc) { p.cfg["advertise-peer-urls"] = []string{"http//127.0.0.1:2380"} }, "advertise-peer-urls[0]", false},
		{"duplicate member name", func(p *proc) {
			list := p.cfg["initial-cluster"].([]string)
			p.cfg["initial-cluster"] = append(list, "nodeA=http://127.0.0.1:1")
		}, "initial-cluster[2]", false},
		{"unreadable certificate", func(p *proc) {
			p.cfg["peer-tls"] = map[string]string{"cert-file": filepath.Join(t.TempDir(), "missing.pem"), "key-file": "/dev/null"}
		}, "peer-tls.cert-file", false},
		{"plain http without insecure", func(p *proc) { p.cfg["insecure"] = false }, "listen-peer-urls[0]", false},
		{"unknown key", func(p *proc) { p.cfg["heartbeat"] = "1s" }, "heartbeat", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newProc(t, "nodeA", "member", "http")
			q := newProc(t, "nodeB", "member", "http")
			bootstrap(p, q)
			tc.edit(p)
			p.writeConfig()
			out, err := exec.Command(binary, "--config", p.cfgPath).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit: %v, want status 2; output:\n%s", err, out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if (len(lines) != 1 && !tc.anyLine) || !strings.Contains(string(out), tc.field) {
				t.Fatalf("output %q: want one line naming %q", out, tc.field)
			}
			if _, err := os.Stat(p.cfg["data-dir"].(string)); !os.IsNotExist(err) {
				t.Fatalf("data dir touched: stat err %v", err)
			}
		})
	}
}

// --check-config on a good file exits 0 without starting anything; flags
// override the file.
func TestCheckConfig(t *testing.T) {
	p := newProc(t, "nodeA", "member", "http")
	q := newProc(t, "nodeB", "member", "http")
	bootstrap(p, q)
	p.writeConfig()
	if out, err := exec.Command(binary, "--config", p.cfgPath, "--check-config").CombinedOutput(); err != nil {
		t.Fatalf("check-config: %v\n%s", err, out)
	}
	out, err := exec.Command(binary, "--config", p.cfgPath, "--check-config", "--name", "").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "name") {
		t.Fatalf("--name '' should fail with exit 2 naming name: %v\n%s", err, out)
	}
	if _, err := os.Stat(p.cfg["data-dir"].(string)); !os.IsNotExist(err) {
		t.Fatalf("data dir touched: stat err %v", err)
	}
}
