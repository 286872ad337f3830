package roled

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/etcdtest"
	"github.com/hapair/hapair/internal/proctest"
)

// startHAProxy runs Debian's haproxy with agent-checks against both roleds
// and returns its frontend URL.
func startHAProxy(t *testing.T, backends map[string][2]string) string {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("haproxy not installed (Debian package haproxy)")
	}
	ln := listenLocal(t)
	fe := ln.Addr().String()
	ln.Close()
	cfg := fmt.Sprintf(`global
  nbthread 1
defaults
  mode http
  timeout connect 500ms
  timeout client 5s
  timeout server 5s
frontend fe
  bind %s
  default_backend app
backend app
  balance roundrobin
`, fe)
	for name, b := range backends {
		// The agent decides the state: "up ready 100%%" on the ACTIVE node,
		// "down" on the PASSIVE one.
		cfg += fmt.Sprintf("  server %s %s check inter 200ms fall 5 agent-check agent-addr 127.0.0.1 agent-port %s agent-inter 100ms\n",
			name, b[0], portStr(b[1]))
	}
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-db", "-f", path)
	proctest.DieWithTest(cmd)
	out := &capped{max: 64 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("haproxy output:\n%s", out.String())
		}
	})
	waitFor(t, 10*time.Second, "haproxy listening", func() bool {
		c, err := net.DialTimeout("tcp", fe, 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return "http://" + fe
}

func portStr(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// appServer answers every request with its node name.
func appServer(t *testing.T, name string) string {
	return newLocalServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, name)
	}))
}

var haproxyClient = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// served asks HAProxy n times and returns who answered (or "error").
func served(url string, n int) map[string]int {
	got := map[string]int{}
	for i := 0; i < n; i++ {
		resp, err := haproxyClient.Get(url)
		if err != nil {
			got["error"]++
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			got[resp.Status]++
			continue
		}
		got[string(b)]++
	}
	return got
}

// Must show 7: a real HAProxy with agent-check against both roleds sends
// traffic only to the ACTIVE node, and follows a switchover.
func TestHAProxyAgentCheck(t *testing.T) {
	skipShort(t)
	if _, err := exec.LookPath("haproxy"); err != nil {
		t.Skip("haproxy not installed (Debian package haproxy)")
	}
	c := etcdtest.New(t)
	a := startNode(t, c, "A", nil)
	b := startNode(t, c, "B", nil)
	a.pat.promote()
	a.waitCode(t, 200, 10*time.Second)
	url := startHAProxy(t, map[string][2]string{
		"A": {trimHTTP(appServer(t, "A")), a.d.AgentAddr()},
		"B": {trimHTTP(appServer(t, "B")), b.d.AgentAddr()},
	})
	only := func(name string) func() bool {
		return func() bool { got := served(url, 10); return got[name] == 10 }
	}
	waitFor(t, 10*time.Second, "HAProxy sends everything to A", only("A"))
	// Under heavy load a check may time out and leave no server for a
	// moment (503); what must never happen is traffic to the PASSIVE node.
	if got := served(url, 50); got["B"] != 0 || got["A"] == 0 {
		t.Fatalf("with A ACTIVE, HAProxy served %v", got)
	}
	a.pat.demote()
	b.pat.promote()
	b.waitCode(t, 200, 10*time.Second)
	switched := time.Now()
	waitFor(t, 10*time.Second, "HAProxy sends everything to B", only("B"))
	t.Logf("HAProxy followed the switchover %s after B's 200", time.Since(switched))
	if got := served(url, 50); got["A"] != 0 || got["B"] == 0 {
		t.Fatalf("with B ACTIVE, HAProxy served %v", got)
	}
}

func trimHTTP(u string) string { return u[len("http://"):] }
