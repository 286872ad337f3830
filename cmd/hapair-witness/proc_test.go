package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/proctest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"gopkg.in/yaml.v3"
)

// binary is the hapair-witness built once for this test package.
var binary string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "hapair-witness-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "hapair-witness")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build hapair-witness:", err)
		return 1
	}
	return m.Run()
}

// Test timings: fast raft so kills and elections settle in well under a
// second, but loose enough for two busy cores.
const (
	testHeartbeat = "50ms"
	testElection  = "500ms"
	testCheck     = "200ms"
)

// proc is one hapair-witness process under test.
type proc struct {
	t       *testing.T
	name    string
	cfg     map[string]any
	cfgPath string
	logPath string
	env     []string

	clientURL, peerURL, metricsURL string

	cmd   *exec.Cmd
	waitc chan error // receives the exit once; nil when not running
}

// freePort returns a loopback port that was free a moment ago, below
// Linux's ephemeral range (32768-60999): a port the kernel handed out for
// a listen on :0 goes back to that range when closed, and under load it was
// taken as the source port of some connection before the member bound it
// ("bind: address already in use", CI). A port below the range is never
// given to a connection; ports are not handed out twice in this process.
func freePort(t *testing.T) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		p := 20000 + rand.IntN(12000)
		if portsGiven[p] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		l.Close()
		portsGiven[p] = true
		return p
	}
	t.Fatal("no free loopback port in 20000-31999")
	return 0
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// newProc prepares (does not start) a member with fresh ports and data dir.
// scheme is "http" (insecure) or "https".
func newProc(t *testing.T, name, role, scheme string) *proc {
	t.Helper()
	dir := t.TempDir()
	p := &proc{
		t:          t,
		name:       name,
		cfgPath:    filepath.Join(dir, name+".yaml"),
		logPath:    filepath.Join(dir, name+".log"),
		clientURL:  fmt.Sprintf("%s://127.0.0.1:%d", scheme, freePort(t)),
		peerURL:    fmt.Sprintf("%s://127.0.0.1:%d", scheme, freePort(t)),
		metricsURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
	}
	p.cfg = map[string]any{
		"name":                  name,
		"role":                  role,
		"data-dir":              filepath.Join(dir, "data"),
		"listen-peer-urls":      []string{p.peerURL},
		"advertise-peer-urls":   []string{p.peerURL},
		"listen-client-urls":    []string{p.clientURL},
		"advertise-client-urls": []string{p.clientURL},
		"metrics-listen":        strings.TrimPrefix(p.metricsURL, "http://"),
		"insecure":              scheme == "http",
		"heartbeat-interval":    testHeartbeat,
		"election-timeout":      testElection,
		"check-interval":        testCheck,
		"log-level":             "info",
	}
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			p.dumpLog()
		}
	})
	return p
}

// bootstrap sets every member's initial-cluster to the whole group.
func bootstrap(ps ...*proc) {
	var list []string
	for _, p := range ps {
		list = append(list, p.name+"="+p.peerURL)
	}
	for _, p := range ps {
		p.cfg["mode"] = "bootstrap"
		p.cfg["initial-cluster"] = list
	}
}

func (p *proc) writeConfig() {
	p.t.Helper()
	b, err := yaml.Marshal(p.cfg)
	if err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(p.cfgPath, b, 0o600); err != nil {
		p.t.Fatal(err)
	}
}

// start launches the process; it does not wait for readiness.
func (p *proc) start() {
	p.t.Helper()
	p.writeConfig()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		p.t.Fatal(err)
	}
	p.cmd = exec.Command(binary, "--config", p.cfgPath)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.Env = append(os.Environ(), p.env...)
	proctest.DieWithTest(p.cmd)
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		p.t.Fatal(err)
	}
	waitc := make(chan error, 1)
	p.waitc = waitc
	cmd := p.cmd
	go func() {
		err := cmd.Wait()
		logf.Close()
		waitc <- err
	}()
}

// waitReady polls the member's /health until it answers healthy.
func (p *proc) waitReady(timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-p.waitc:
			p.waitc = nil
			p.t.Fatalf("%s exited before it was ready: %v", p.name, err)
		default:
		}
		if body, code := httpGet(p.metricsURL + "/health"); code == http.StatusOK && strings.Contains(body, `"health":"true"`) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.t.Fatalf("%s not healthy within %s", p.name, timeout)
}

// kill sends SIGKILL and waits for the exit. No-op when not running.
func (p *proc) kill() {
	if p.waitc == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.waitc
	p.waitc = nil
}

// stop sends SIGTERM and returns the exit error once the process has exited.
func (p *proc) stop(timeout time.Duration) error {
	p.t.Helper()
	if p.waitc == nil {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.waitc:
		p.waitc = nil
		return err
	case <-time.After(timeout):
		p.kill()
		return fmt.Errorf("%s did not stop within %s after SIGTERM", p.name, timeout)
	}
}

func (p *proc) dumpLog() {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	p.t.Logf("---- %s log (tail) ----\n%s", p.name, b)
}

// metric returns the value of an unlabelled series from /metrics, or -1.
func (p *proc) metric(name string) float64 {
	body, code := httpGet(p.metricsURL + "/metrics")
	if code != http.StatusOK {
		return -1
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

func httpGet(url string) (string, int) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}

func clientURLs(ps ...*proc) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.clientURL)
	}
	return out
}

// newClient returns a plain-http client on endpoints, closed at cleanup.
func newClient(t *testing.T, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// putEventually retries a put until it succeeds or timeout passes: after a
// kill the client needs a moment to leave the dead endpoint.
func putEventually(t *testing.T, cli *clientv3.Client, key, val string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = cli.Put(ctx, key, val)
		cancel()
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("put %s did not succeed within %s: %v", key, timeout, err)
}

// mustGet asserts key holds want (linearizable read).
func mustGet(t *testing.T, cli *clientv3.Client, key, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(resp.Kvs) != 1 || !bytes.Equal(resp.Kvs[0].Value, []byte(want)) {
		t.Fatalf("get %s = %v, want %q", key, resp.Kvs, want)
	}
}

// leaderName asks each running member for its view of the leader and
// returns the leader's name when a member answers.
func leaderName(t *testing.T, cli *clientv3.Client, ps ...*proc) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ml, err := cli.MemberList(ctx)
	if err != nil {
		return ""
	}
	for _, p := range ps {
		if p.waitc == nil {
			continue
		}
		st, err := cli.Status(ctx, p.clientURL)
		if err != nil || st.Leader == 0 {
			continue
		}
		for _, m := range ml.Members {
			if m.ID == st.Leader {
				return m.Name
			}
		}
	}
	return ""
}
