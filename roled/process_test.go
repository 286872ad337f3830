package roled

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/etcdtest"
	"github.com/hapair/hapair/internal/proctest"
)

var (
	buildOnce sync.Once
	buildBin  string
	buildErr  error
	buildDir  string
)

// roledBinary builds cmd/hapair-roled once per test run.
func roledBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "hapair-roled-bin-")
		if buildErr != nil {
			return
		}
		buildBin = filepath.Join(buildDir, "hapair-roled")
		out, err := exec.Command("go", "build", "-o", buildBin, "github.com/hapair/hapair/cmd/hapair-roled").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// roledProcess is hapair-roled running as a real process.
type roledProcess struct {
	cmd  *exec.Cmd
	url  string
	mu   sync.Mutex
	logs []string
}

// startProcess writes a YAML config equivalent to cfg and starts the binary.
func startProcess(t *testing.T, cfg Config) *roledProcess {
	t.Helper()
	bin := roledBinary(t)
	yml := fmt.Sprintf(`node: %s
listen: "127.0.0.1:0"
lease-ttl: %s
safety-margin: %s
keepalive-interval: %s
reread-interval: %s
heartbeat-interval: %s
quorum-loss-after: %s
quorum-check-interval: %s
log-level: info
etcd: {endpoints: [%s]}
patroni: {url: %q, poll-interval: %s, fast-poll-interval: %s, timeout: %s}
postgres: {enabled: false, timeout: %s}
marker: {path: %q}
agent: {listen: "127.0.0.1:0"}
`, cfg.Node, cfg.LeaseTTL, cfg.SafetyMargin, cfg.KeepAliveInterval, cfg.RereadInterval, cfg.HeartbeatInterval,
		cfg.QuorumLossAfter, cfg.QuorumCheckInterval,
		`"`+strings.Join(cfg.Etcd.Endpoints, `","`)+`"`, cfg.Patroni.URL, cfg.Patroni.PollInterval,
		cfg.Patroni.FastPollInterval, cfg.Patroni.Timeout, cfg.Postgres.Timeout, cfg.Marker.Path)
	if v := cfg.VIP; v.Enabled() {
		yml += fmt.Sprintf("vip: {address: %q, interface: %q, netns: %q}\n", v.Address, v.Interface, v.Netns)
	}
	path := filepath.Join(t.TempDir(), "roled.yaml")
	if err := os.WriteFile(path, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &roledProcess{cmd: exec.Command(bin, "--config", path)}
	proctest.DieWithTest(p.cmd)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go p.scan(stderr, addr)
	t.Cleanup(func() { p.stop(t) })
	select {
	case a := <-addr:
		p.url = "http://" + a
	case <-time.After(20 * time.Second):
		t.Fatalf("hapair-roled did not start; log:\n%s", p.log())
	}
	return p
}

func (p *roledProcess) scan(r interface{ Read([]byte) (int, error) }, addr chan<- string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		p.mu.Lock()
		p.logs = append(p.logs, line)
		p.mu.Unlock()
		var m struct {
			Msg  string `json:"msg"`
			HTTP string `json:"http"`
		}
		if json.Unmarshal([]byte(line), &m) == nil && m.Msg == "starting" && m.HTTP != "" {
			select {
			case addr <- m.HTTP:
			default:
			}
		}
	}
}

func (p *roledProcess) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.logs, "\n")
}

func (p *roledProcess) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

func (p *roledProcess) stop(t *testing.T) {
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("hapair-roled exited with %v; log:\n%s", err, p.log())
		}
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
		t.Errorf("hapair-roled did not stop on SIGTERM; log:\n%s", p.log())
	}
}

// Must show 4: SIGSTOP the ACTIVE roled process for longer than its lease
// TTL while its Patroni stays primary and the peer's is promoted; on SIGCONT
// it serves 503 at once and never 200 again; the peer is ACTIVE with a larger
// epoch; never two 200s.
func TestPausedProcessWakesPassive(t *testing.T) {
	skipShort(t)
	c := etcdtest.New(t)
	patA := newFakePatroni(t, c.Client(t), "A", "hapair")
	cfgA := testConfig(t, c, "A", patA.URL())
	pa := startProcess(t, cfgA)
	a := &node{name: "A", cfg: cfgA, pat: patA, url: pa.url}
	b := startNode(t, c, "B", nil)
	oc := startChecker(t, a, b)
	patA.promote()
	ea := a.waitCode(t, 200, 15*time.Second)

	pa.signal(t, syscall.SIGSTOP)
	// kill(2) returns before every thread has stopped; the pause begins
	// when /proc says the process is stopped.
	waitFor(t, 5*time.Second, "A stopped", func() bool { return procState(pa.cmd.Process.Pid) == "T" })
	stopped := time.Now()
	// A's Patroni keeps claiming primary (its REST API still says master);
	// its leader key goes away and B's Patroni takes over.
	patA.dropKey()
	b.pat.promote()
	eb := b.waitCode(t, 200, 15*time.Second)
	if eb <= ea {
		t.Fatalf("B's epoch %d not above A's %d", eb, ea)
	}
	bActive := time.Since(stopped)
	// A never let go: its key went with its lease, and B records a failover.
	hcli := c.Client(t)
	waitFor(t, 10*time.Second, "failover in the history", func() bool {
		evs := readHistory(t, hcli, cfgA.prefix())
		if len(evs) == 0 {
			return false
		}
		ev := evs[len(evs)-1]
		return ev.Kind == KindFailover && ev.From == "A" && ev.FromEpoch == ea && ev.To == "B" && ev.Epoch == eb && ev.GapSeconds > 0
	})
	// The pause must outlast the lease TTL (the scenario, not a sync point).
	time.Sleep(time.Until(stopped.Add(cfgA.LeaseTTL + 500*time.Millisecond)))
	pa.signal(t, syscall.SIGCONT)
	resumed := time.Now()
	code, _ := patientHealth(a.url)
	t.Logf("A paused for %s; B ACTIVE %s into the pause with epoch %d (A had %d); first answer of A after SIGCONT: %d in %s",
		resumed.Sub(stopped), bActive, eb, ea, code, time.Since(resumed))
	if code != 503 {
		t.Fatalf("A answered %d right after SIGCONT, want 503; log:\n%s", code, pa.log())
	}
	watchPassiveOne(t, a, time.Second)
	if code, _ := patientHealth(b.url); code != 200 {
		t.Fatalf("B answered %d after A resumed", code)
	}
	oc.halt()
	if last := oc.lastOK("A"); last.After(stopped) {
		t.Fatalf("A answered 200 at %s, after the pause began at %s", last, stopped)
	}
	if oc.overlaps.Load() != 0 {
		t.Fatalf("%d overlapping rounds", oc.overlaps.Load())
	}
}

// procState is the state letter of /proc/<pid>/stat ("T" when stopped).
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

func watchPassiveOne(t *testing.T, n *node, d time.Duration) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < d {
		if code, _ := health(n.url); code == 200 {
			t.Fatalf("%s answered 200", n.name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
