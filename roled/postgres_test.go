package roled

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/etcdtest"
	"github.com/hapair/hapair/internal/pgtest"
)

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

// newTestPG starts a throw-away PostgreSQL 15, or skips without one.
func newTestPG(t *testing.T) *pgtest.Server {
	t.Helper()
	pgtest.Require(t)
	pg, err := pgtest.New(t)
	if err != nil {
		t.Fatal(err)
	}
	return pg
}

// must fails the test on a PostgreSQL control error.
func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
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
		cfg.Postgres.DSN = pg.SocketDSN()
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
	// The checker polls on its own: the first epoch must be seen by it too
	// before PostgreSQL stops (once, under -race, A was ACTIVE for 15 ms only).
	waitFor(t, 5*time.Second, "the checker sees A ACTIVE", func() bool {
		oc.mu.Lock()
		defer oc.mu.Unlock()
		return len(oc.first200["A"]) >= 1
	})
	agent("drain") // the primary leaves the replica pool

	must(t, pg.Stop())
	a.waitCode(t, 503, 10*time.Second)
	agent("down")
	if r := a.status(t).Reason; r != string(ReasonPostgresDown) {
		t.Fatalf("reason %q, want %q", r, ReasonPostgresDown)
	}
	must(t, pg.Standby())
	must(t, pg.Start())
	waitFor(t, 5*time.Second, "in-recovery seen", func() bool { return a.status(t).Postgres.InRecovery })
	if code, _ := patientHealth(a.url); code != 503 {
		t.Fatalf("A answered %d with PostgreSQL in recovery", code)
	}
	agent("up ready 100%")
	if r := a.status(t).Reason; r != string(ReasonInRecovery) {
		t.Fatalf("reason %q, want %q", r, ReasonInRecovery)
	}
	must(t, pg.Promote())
	a.waitCode(t, 200, 10*time.Second)
	// The checker polls on its own: wait until it too has seen the new
	// epoch, or it may be halted a poll before.
	waitFor(t, 5*time.Second, "the checker sees A ACTIVE under a second epoch", func() bool {
		oc.mu.Lock()
		defer oc.mu.Unlock()
		return len(oc.first200["A"]) >= 2
	})
	oc.halt()
	oc.mu.Lock()
	defer oc.mu.Unlock()
	if n := len(oc.first200["A"]); n != 2 {
		t.Fatalf("A was ACTIVE under %d epochs, want 2 (before the stop, after the promotion): %v", n, oc.first200["A"])
	}
}

// An ACTIVE node whose PostgreSQL stops accepting connections (as the old
// primary does about 1 s before its /primary turns 503 in a switchover) goes
// PASSIVE within about postgres.active-interval (100 ms here), not one
// Patroni poll (a minute here); the 10 s bound tells the two apart with room.
func TestPostgresStopEndsActiveFast(t *testing.T) {
	skipShort(t)
	pg := newTestPG(t)
	c := etcdtest.New(t)
	a := startNode(t, c, "A", func(cfg *Config) {
		cfg.Postgres.Enabled = true
		cfg.Postgres.DSN = pg.SocketDSN()
		// Patroni is polled so slowly that only the ACTIVE-time
		// PostgreSQL recheck can notice the stop within the bound below.
		cfg.Patroni.PollInterval = time.Minute
		cfg.Postgres.ActiveInterval = 100 * time.Millisecond
	})
	a.pat.promote()
	a.waitCode(t, 200, 10*time.Second)
	must(t, pg.Stop())
	a.waitCode(t, 503, 10*time.Second)
	if r := a.status(t).Reason; r != string(ReasonPostgresDown) {
		t.Fatalf("reason %q, want %q", r, ReasonPostgresDown)
	}
}
