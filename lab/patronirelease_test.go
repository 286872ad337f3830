package lab

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakePatroni writes an executable that prints version the way `patroni
// --version` does.
func fakePatroni(t *testing.T, version string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "patroni")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho '"+version+"'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPatroniReleaseDecidesTheBudget: the lab derives its budget for the
// release its Patroni executable reports; a target that release cannot
// meet (3.2.0 and later run ttl ≥ 20 s) is refused before anything starts.
func TestPatroniReleaseDecidesTheBudget(t *testing.T) {
	for _, tc := range []struct {
		out, want string
	}{{"patroni 3.0.2", "3.0.2"}, {"__main__.py 3.2.2", "3.2.2"}, {"patroni 4.0.4", "4.0.4"}} {
		got, err := patroniRelease(fakePatroni(t, tc.out))
		if err != nil || got != tc.want {
			t.Errorf("patroniRelease(%q) = %q, %v; want %q", tc.out, got, err, tc.want)
		}
	}
	if _, err := patroniRelease(fakePatroni(t, "no version here")); err == nil {
		t.Error("patroniRelease accepted an answer without a version")
	}
	if _, err := patroniRelease(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("patroniRelease accepted a missing executable")
	}
	if hold, err := checkRTO("6.5s", "3.0.2"); err != nil || hold != "12s" {
		t.Errorf("checkRTO(6.5s, 3.0.2) = %q, %v; want 12s", hold, err)
	}
	if _, err := checkRTO("6.5s", "3.2.2"); err == nil || !strings.Contains(err.Error(), "Patroni 3.2.2") {
		t.Errorf("checkRTO(6.5s, 3.2.2) = %v, want a refusal naming the release", err)
	}
	_, err := NewLab(Options{Root: t.TempDir(), RTO: "6.5s", Patroni: fakePatroni(t, "patroni 3.2.2")}, nil)
	if err == nil || !strings.Contains(err.Error(), "Patroni 3.2.2") {
		t.Errorf("NewLab with rto 6.5s on Patroni 3.2.2 = %v, want a refusal naming the release", err)
	}
	l, err := NewLab(Options{Root: t.TempDir(), RTO: "30s", Patroni: fakePatroni(t, "patroni 3.2.2")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if x := l.timers(); x.PatroniTTL < 20*time.Second || x.PatroniVersion != "3.2.2" {
		t.Errorf("lab timers at 30s on Patroni 3.2.2: ttl %s release %q, want ≥ 20s and 3.2.2", x.PatroniTTL, x.PatroniVersion)
	}
}
