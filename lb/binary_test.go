package lb

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
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/proctest"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
)

// TestMain removes the shared build directory after all tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// buildBinary builds cmd/hapair-lb once for the package's tests.
func buildBinary(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not on PATH; cannot build hapair-lb")
	}
	buildOnce.Do(func() {
		if buildDir, buildErr = os.MkdirTemp("", "hapair-lb-bin-"); buildErr != nil {
			return
		}
		buildBin = filepath.Join(buildDir, "hapair-lb")
		out, err := exec.Command(goBin, "build", "-o", buildBin, "../cmd/hapair-lb").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("build: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBin
}

// syncBuf is a goroutine-safe log sink.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func lbYAML(listen, backendAddr string) string {
	return fmt.Sprintf(`log-level: info
shutdown-timeout: 10s
admin:
  listen: 127.0.0.1:0
listeners:
  - name: web
    listen: %s
    backend: pool
backends:
  - name: pool
    kind: pool
    check:
      enabled: false
    servers:
      - name: s1
        address: %s
`, listen, backendAddr)
}

// TestReloadBinary is Must-show 8 with the built binary: SIGHUP with a
// broken file keeps the old config serving and logs why; with a good one
// new routes apply while an in-flight request completes; SIGTERM drains.
func TestReloadBinary(t *testing.T) {
	bin := buildBinary(t)
	x, y := newFakeNode(t, "X"), newFakeNode(t, "Y")
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	path := filepath.Join(t.TempDir(), "lb.yaml")
	if err := os.WriteFile(path, []byte(lbYAML(listen, x.addr())), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-t", "--config", path).CombinedOutput(); err != nil {
		t.Fatalf("-t on a good file: %v\n%s", err, out)
	}
	var logs syncBuf
	// Go's poller alone (fifo-reads off): the in-process tests run on.
	cmd := exec.Command(bin, "--config", path, "--fifo-reads", "off")
	cmd.Stderr = &logs
	proctest.DieWithTest(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	waitFor(t, 10*time.Second, "balancer running", func() bool { return strings.Contains(logs.String(), "balancer running") })
	url := "http://" + listen
	c := newClient()
	servedBy := func() string {
		resp, err := c.Get(url + "/x")
		if err != nil {
			return "error: " + err.Error()
		}
		resp.Body.Close()
		return resp.Header.Get("X-Node")
	}
	if got := servedBy(); got != "X" {
		t.Fatalf("served by %q, want X", got)
	}

	inflight := make(chan string, 1)
	go func() {
		resp, err := http.Get(url + "/slow")
		if err != nil {
			inflight <- err.Error()
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		inflight <- resp.Status + " " + resp.Header.Get("X-Node")
	}()
	waitFor(t, 5*time.Second, "slow request in flight", func() bool { return x.appRequests.Load() >= 2 })

	// Broken config: refused, old one keeps serving.
	broken := strings.Replace(lbYAML(listen, y.addr()), "kind: pool", "kind: bogus", 1)
	if err := os.WriteFile(path, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, 5*time.Second, "reload refused in log", func() bool { return strings.Contains(logs.String(), "reload refused") })
	if !strings.Contains(logs.String(), "backends[0].kind") {
		t.Errorf("refusal does not name the field:\n%s", logs.String())
	}
	if got := servedBy(); got != "X" {
		t.Fatalf("after a broken reload served by %q, want X", got)
	}

	// Good config: new route, in-flight request unharmed.
	if err := os.WriteFile(path, []byte(lbYAML(listen, y.addr())), 0o644); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, 5*time.Second, "traffic on Y", func() bool { return servedBy() == "Y" })
	if got := <-inflight; got != "200 OK X" {
		t.Errorf("in-flight request across the reload: %q, want 200 from X", got)
	}

	// SIGTERM drains an in-flight request, then exits 0.
	go func() {
		resp, err := http.Get(url + "/slow")
		if err != nil {
			inflight <- err.Error()
			return
		}
		resp.Body.Close()
		inflight <- resp.Status
	}()
	waitFor(t, 5*time.Second, "slow request on Y", func() bool { return y.appRequests.Load() >= 2 })
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit 10s after SIGTERM")
	}
	if got := <-inflight; got != "200 OK" {
		t.Errorf("in-flight request during SIGTERM: %q, want 200 OK", got)
	}
}

// TestCheckConfigBinary: -t names the bad field and exits 2.
func TestCheckConfigBinary(t *testing.T) {
	bin := buildBinary(t)
	path := filepath.Join(t.TempDir(), "lb.yaml")
	bad := strings.Replace(lbYAML("127.0.0.1:8080", "127.0.0.1:9"), "address: 127.0.0.1:9", "address: nowhere", 1)
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-t", "--config", path).CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 {
		t.Fatalf("exit %v, want 2; output %s", err, out)
	}
	if !strings.Contains(string(out), "backends[0].servers[0].address") {
		t.Errorf("output does not name the field: %s", out)
	}
	out, err = exec.Command(bin, "-t", "--config", "../examples/lb.yaml").CombinedOutput()
	if err != nil {
		t.Errorf("examples/lb.yaml does not validate: %v\n%s", err, out)
	}
}

// TestAdmin: stats JSON, runtime drain/ready, and /metrics passing
// promtool check metrics.
func TestAdmin(t *testing.T) {
	a, b := newFakeNode(t, "A"), newFakeNode(t, "B")
	cfg := poolConfig(a.addr(), b.addr())
	cfg.Backends[0].Balance = BalanceRoundRobin
	cfg.Admin.Listen = "127.0.0.1:0"
	l := startLB(t, cfg, nil)
	admin := "http://" + l.AdminAddr().String()
	c := newClient()
	for range 4 {
		resp, err := c.Get(l.url("web") + "/x")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	resp, err := c.Post(admin+"/servers/pool/s0?state=drain", "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("drain: %v %v", err, statusOf(resp))
	}
	resp.Body.Close()
	before := a.appRequests.Load()
	for range 6 {
		resp, err := c.Get(l.url("web") + "/x")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if a.appRequests.Load() != before {
		t.Errorf("drained server got %d new requests", a.appRequests.Load()-before)
	}
	var st Stats
	resp, err = c.Get(admin + "/stats.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s0 := st.Backends[0].Servers[0]
	if s0.State != "DRAIN" || s0.Requests == 0 || s0.LastReason == "" {
		t.Errorf("stats for s0: %+v", s0)
	}
	resp, err = c.Get(admin + "/")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stats page: %v %v", err, statusOf(resp))
	}
	resp.Body.Close()
	if _, err := c.Post(admin+"/servers/pool/s0?state=bogus", "", nil); err != nil {
		t.Fatal(err)
	}

	resp, err = c.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"hapair_lb_requests_total", "hapair_lb_server_up", "hapair_lb_retries_total"} {
		if !regexp.MustCompile(`(?m)^`+want).Match(body) && !strings.Contains(string(body), "# HELP "+want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc := exec.CommandContext(ctx, promtool, "check", "metrics")
	pc.Stdin = bytes.NewReader(body)
	if out, err := pc.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
