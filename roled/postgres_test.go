package roled

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/etcdtest"
)

const pgBin = "/usr/lib/postgresql/15/bin"

// agentReply reads one HAProxy agent-check answer.
func agentReply(t *testing.T, addr string) string {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	b, _ := io.ReadAll(c)
	return strings.TrimSuffix(string(b), "\n")
}

// testPG is a throw-away PostgreSQL 15 cluster (Debian's postgresql-15),
// run as user postgres when the test runs as root.
type testPG struct {
	t      *testing.T
	dir    string
	data   string
	sock   string
	port   int
	asUser *user.User // nil: run as ourselves
}

func newTestPG(t *testing.T) *testPG {
	t.Helper()
	if _, err := os.Stat(filepath.Join(pgBin, "initdb")); err != nil {
		t.Skip("PostgreSQL 15 not installed (Debian package postgresql-15)")
	}
	p := &testPG{t: t}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skip("running as root without a postgres user (Debian package postgresql-15)")
		}
		p.asUser = u
	}
	dir, err := os.MkdirTemp("", "hapair-pg-")
	if err != nil {
		t.Fatal(err)
	}
	p.dir, p.data, p.sock = dir, filepath.Join(dir, "data"), filepath.Join(dir, "sock")
	t.Cleanup(func() {
		_ = p.cmd("pg_ctl", "-D", p.data, "-m", "immediate", "-w", "stop").Run()
		os.RemoveAll(dir)
	})
	if err := os.Mkdir(p.sock, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if p.asUser != nil {
		uid, _ := strconv.Atoi(p.asUser.Uid)
		gid, _ := strconv.Atoi(p.asUser.Gid)
		for _, d := range []string{dir, p.sock} {
			if err := os.Chown(d, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	ln := listenLocal(t)
	p.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	p.run("initdb", "-D", p.data, "-U", "postgres", "-A", "trust", "-N", "--locale=C", "-E", "UTF8")
	p.start()
	return p
}

// cmd runs a PostgreSQL binary, as postgres via setpriv when we are root.
func (p *testPG) cmd(bin string, args ...string) *exec.Cmd {
	path := filepath.Join(pgBin, bin)
	if p.asUser == nil {
		return exec.Command(path, args...)
	}
	full := append([]string{"--reuid=postgres", "--regid=postgres", "--init-groups", path}, args...)
	c := exec.Command("setpriv", full...)
	c.Env = []string{"HOME=" + p.asUser.HomeDir, "USER=postgres", "LOGNAME=postgres", "PATH=/usr/bin:/bin", "LANG=C.UTF-8"}
	return c
}

func (p *testPG) run(bin string, args ...string) {
	p.t.Helper()
	if out, err := p.cmd(bin, args...).CombinedOutput(); err != nil {
		p.t.Fatalf("%s %v: %v\n%s", bin, args, err, out)
	}
}

func (p *testPG) start() {
	p.t.Helper()
	opts := fmt.Sprintf("-k %s -p %d -c listen_addresses='' -c fsync=off", p.sock, p.port)
	p.run("pg_ctl", "-D", p.data, "-o", opts, "-l", filepath.Join(p.dir, "log"), "-w", "-t", "60", "start")
}

func (p *testPG) stop() { p.run("pg_ctl", "-D", p.data, "-m", "fast", "-w", "stop") }

// standby makes the next start come up in recovery.
func (p *testPG) standby() {
	p.t.Helper()
	f := filepath.Join(p.data, "standby.signal")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		p.t.Fatal(err)
	}
	if p.asUser != nil {
		uid, _ := strconv.Atoi(p.asUser.Uid)
		gid, _ := strconv.Atoi(p.asUser.Gid)
		_ = os.Chown(f, uid, gid)
	}
}

func (p *testPG) dsn() string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", p.sock, p.port)
}

// Must show 5 (second half): Patroni says primary and the leader key names
// this node, but the real PostgreSQL refuses connections or is in recovery:
// PASSIVE. Writable again: ACTIVE.
func TestPostgresCheck(t *testing.T) {
	skipShort(t)
	pg := newTestPG(t)
	c := etcdtest.New(t)
	a := startNode(t, c, "A", func(cfg *Config) {
		cfg.Postgres.Enabled = true
		cfg.Postgres.DSN = pg.dsn()
		cfg.ReplicaAgent.Listen = "127.0.0.1:0"
		cfg.ReplicaAgent.Interval = 100 * time.Millisecond
	})
	agent := func(want string) {
		t.Helper()
		waitFor(t, 5*time.Second, "replica agent says "+want, func() bool { return agentReply(t, a.d.ReplicaAgentAddr()) == want })
	}
	oc := startChecker(t, a)
	a.pat.promote()
	a.waitCode(t, 200, 10*time.Second)
	agent("drain") // the primary leaves the replica pool

	pg.stop()
	a.waitCode(t, 503, 3*time.Second)
	agent("down")
	if r := a.status(t).Reason; r != string(ReasonPostgresDown) {
		t.Fatalf("reason %q, want %q", r, ReasonPostgresDown)
	}
	pg.standby()
	pg.start()
	waitFor(t, 5*time.Second, "in-recovery seen", func() bool { return a.status(t).Postgres.InRecovery })
	if code, _ := patientHealth(a.url); code != 503 {
		t.Fatalf("A answered %d with PostgreSQL in recovery", code)
	}
	agent("up ready 100%")
	if r := a.status(t).Reason; r != string(ReasonInRecovery) {
		t.Fatalf("reason %q, want %q", r, ReasonInRecovery)
	}
	pg.run("pg_ctl", "-D", pg.data, "-w", "promote")
	a.waitCode(t, 200, 10*time.Second)
	oc.halt()
	oc.mu.Lock()
	defer oc.mu.Unlock()
	if n := len(oc.first200["A"]); n != 2 {
		t.Fatalf("A was ACTIVE under %d epochs, want 2 (before the stop, after the promotion): %v", n, oc.first200["A"])
	}
}

// An ACTIVE node whose PostgreSQL stops accepting connections (as the old
// primary does about 1 s before its /primary turns 503 in a switchover) goes
// PASSIVE within about postgres.active-interval, not one Patroni poll.
func TestPostgresStopEndsActiveFast(t *testing.T) {
	skipShort(t)
	pg := newTestPG(t)
	c := etcdtest.New(t)
	a := startNode(t, c, "A", func(cfg *Config) {
		cfg.Postgres.Enabled = true
		cfg.Postgres.DSN = pg.dsn()
		// Patroni is polled so slowly that only the ACTIVE-time
		// PostgreSQL recheck can notice the stop within the bound below.
		cfg.Patroni.PollInterval = time.Minute
		cfg.Postgres.ActiveInterval = 100 * time.Millisecond
	})
	a.pat.promote()
	a.waitCode(t, 200, 10*time.Second)
	pg.stop()
	a.waitCode(t, 503, 1500*time.Millisecond)
	if r := a.status(t).Reason; r != string(ReasonPostgresDown) {
		t.Fatalf("reason %q, want %q", r, ReasonPostgresDown)
	}
}
