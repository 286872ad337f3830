package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runCombined runs hapairctl with stdout and stderr in one buffer.
func runCombined(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	code := run(context.Background(), &env{stdout: &out, stderr: &out}, args)
	return code, out.String()
}

func TestCertsCommand(t *testing.T) {
	dir := t.TempDir()
	code, out := runCombined(t, "certs", "--dir", dir, "nodeA=10.0.0.11", "witness=10.0.0.13,witness.example")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	for _, f := range []string{"ca.pem", "ca-key.pem", "nodeA.pem", "nodeA-key.pem", "witness.pem", "witness-key.pem"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	if st, _ := os.Stat(filepath.Join(dir, "nodeA-key.pem")); st != nil && st.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v, want 0600", st.Mode().Perm())
	}
	if code, _ := runCombined(t, "certs", "--dir", dir); code != 2 {
		t.Errorf("certs without hosts: exit %d, want 2", code)
	}
}

func TestStatusBadConfigExits2(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ctl.yaml")
	if err := os.WriteFile(p, []byte("nodes:\n  - name: a\n    patroni-url: ftp://x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"status", "switchover", "drill"} {
		code, out := runCombined(t, cmd, "--config", p)
		if code != 2 || !strings.Contains(out, "nodes[0].patroni-url") {
			t.Errorf("%s: exit %d, output %q", cmd, code, out)
		}
	}
}
