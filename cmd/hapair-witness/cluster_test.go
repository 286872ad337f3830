package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const readyTimeout = 30 * time.Second

// startCluster bootstraps nodeA, nodeB (role member) and witness (role
// witness) over plain http and waits until all three are healthy.
func startCluster(t *testing.T) (a, b, w *proc) {
	t.Helper()
	a = newProc(t, "nodeA", "member", "http")
	b = newProc(t, "nodeB", "member", "http")
	w = newProc(t, "witness", "witness", "http")
	bootstrap(a, b, w)
	for _, p := range []*proc{a, b, w} {
		p.start()
	}
	for _, p := range []*proc{a, b, w} {
		p.waitReady(readyTimeout)
	}
	return a, b, w
}

// Must show 1: three processes bootstrap; losing the witness or a data
// member keeps a quorum; losing two stops writes within the client's
// timeout; restarting one restores the quorum with no data lost; SIGTERM
// stops a member cleanly.
func TestBootstrapSurvivesOneLossNotTwo(t *testing.T) {
	a, b, w := startCluster(t)
	cli := newClient(t, clientURLs(a, b, w))
	putEventually(t, cli, "k1", "v1", 5*time.Second)
	mustGet(t, cli, "k1", "v1")

	w.kill()
	putEventually(t, cli, "k2", "after-witness-kill", 10*time.Second)
	w.start() // restarts from its data dir
	w.waitReady(readyTimeout)

	b.kill()
	putEventually(t, cli, "k3", "after-data-kill", 10*time.Second)

	a.kill() // only the witness is left: no quorum
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	start := time.Now()
	_, err := cli.Put(ctx, "k4", "must-fail")
	cancel()
	if err == nil {
		t.Fatal("put succeeded with one member of three")
	}
	// It fails at the 2 s client timeout; the bound only says it does not
	// hang (10× the timeout).
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("failed put took %s with a 2s client timeout", took)
	}

	a.start()
	a.waitReady(readyTimeout)
	putEventually(t, cli, "k5", "after-restore", 10*time.Second)
	for k, v := range map[string]string{"k1": "v1", "k2": "after-witness-kill", "k3": "after-data-kill", "k5": "after-restore"} {
		mustGet(t, cli, k, v)
	}
	for _, p := range []*proc{w, a} {
		if err := p.stop(20 * time.Second); err != nil {
			t.Fatalf("SIGTERM %s: %v", p.name, err)
		}
	}
}

// Must show 2: a witness joins a running two-member cluster; afterwards the
// cluster has three voting members and survives the loss of either original.
// READY=1 reaches systemd's socket once the member is in, and the watchdog
// is pinged.
func TestJoinRunningCluster(t *testing.T) {
	a := newProc(t, "nodeA", "member", "http")
	b := newProc(t, "nodeB", "member", "http")
	bootstrap(a, b)
	a.start()
	b.start()
	a.waitReady(readyTimeout)
	b.waitReady(readyTimeout)
	cli := newClient(t, clientURLs(a, b))
	putEventually(t, cli, "before", "join", 5*time.Second)

	w := newProc(t, "witness", "witness", "http")
	w.cfg["mode"] = "join"
	w.cfg["join-endpoints"] = clientURLs(a, b)
	notify := listenNotify(t)
	w.env = []string{"NOTIFY_SOCKET=" + notify.addr, "WATCHDOG_USEC=400000"}
	w.start()
	w.waitReady(readyTimeout)
	notify.expect(t, "READY=1", 5*time.Second)
	notify.expect(t, "WATCHDOG=1", 5*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ml, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ml.Members) != 3 {
		t.Fatalf("members = %d, want 3", len(ml.Members))
	}
	for _, m := range ml.Members {
		if m.IsLearner || m.Name == "" {
			t.Fatalf("member %x (%q) learner=%v: want three started voters", m.ID, m.Name, m.IsLearner)
		}
	}
	mustGet(t, newClient(t, []string{w.clientURL}), "before", "join")

	all := newClient(t, clientURLs(a, b, w))
	a.kill()
	putEventually(t, all, "without-a", "1", 10*time.Second)
	a.start()
	a.waitReady(readyTimeout)
	b.kill()
	putEventually(t, all, "without-b", "1", 10*time.Second)
	mustGet(t, all, "before", "join")

	// A restart of the joined member (data dir present) just restarts it.
	w.kill()
	w.start()
	w.waitReady(readyTimeout)
}

// Join is safe to re-run after a crash between MemberAdd and the first
// start: the member is already listed (without a name) and just starts. A
// member whose name is taken with another peer URL is refused.
func TestJoinRerunAndConflict(t *testing.T) {
	a := newProc(t, "nodeA", "member", "http")
	b := newProc(t, "nodeB", "member", "http")
	bootstrap(a, b)
	a.start()
	b.start()
	a.waitReady(readyTimeout)
	b.waitReady(readyTimeout)
	cli := newClient(t, clientURLs(a, b))

	w := newProc(t, "witness", "witness", "http")
	w.cfg["mode"] = "join"
	w.cfg["join-endpoints"] = clientURLs(a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The "crashed" first run: the member is added but never started. etcd
	// refuses additions for 5 s after the cluster starts ("unhealthy").
	waitFor(t, 15*time.Second, "member add", func() bool {
		_, err := cli.MemberAdd(ctx, []string{w.peerURL})
		return err == nil
	})
	w.start()
	w.waitReady(readyTimeout)
	ml, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ml.Members) != 3 {
		t.Fatalf("members = %d, want 3 (no duplicate add)", len(ml.Members))
	}

	imposter := newProc(t, "nodeA", "member", "http")
	imposter.cfg["mode"] = "join"
	imposter.cfg["join-endpoints"] = clientURLs(a, b)
	imposter.writeConfig()
	out, err := exec.Command(binary, "--config", imposter.cfgPath).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("imposter join: err %v, want a non-zero exit; output:\n%s", err, out)
	}
	if !strings.Contains(string(out), `a member named "nodeA"`) {
		t.Fatalf("imposter join output does not explain the conflict:\n%s", out)
	}
	if _, err := os.Stat(imposter.cfg["data-dir"].(string)); !os.IsNotExist(err) {
		t.Fatalf("refused join created its data dir: %v", err)
	}
}

// Must show 3: when the witness becomes raft leader, it hands the leadership
// to a data member within 3 s and counts the transfer.
func TestWitnessHandsLeadershipBack(t *testing.T) {
	a, b, w := startCluster(t)
	cli := newClient(t, clientURLs(a, b, w))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ml, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var witnessID uint64
	for _, m := range ml.Members {
		if m.Name == "witness" {
			witnessID = m.ID
		}
	}
	// The data members' healthy count must be known to the witness first.
	waitFor(t, 5*time.Second, "witness sees 2 healthy data members", func() bool {
		return w.metric("hapair_witness_data_members_healthy") == 2
	})

	leader := waitLeader(t, cli, a, b, w)
	if leader == nil {
		t.Fatal("no leader")
	}
	if leader == w {
		t.Fatal("the witness is leader although data members are healthy")
	}
	// The witness may hand the leadership back before the old leader sees it
	// arrive, so the move's own answer can be a timeout: judge by the result.
	moved := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		lc, err := clientv3.New(clientv3.Config{Endpoints: []string{leader.clientURL}, DialTimeout: time.Second})
		if err != nil {
			return
		}
		defer lc.Close()
		mctx, mcancel := context.WithTimeout(ctx, 3*time.Second)
		defer mcancel()
		_, _ = lc.MoveLeader(mctx, witnessID)
	}()
	t.Cleanup(func() { <-done })
	waitFor(t, 10*time.Second, "the witness to hand the leadership back", func() bool {
		if w.metric("hapair_witness_leader_transfers_total") < 1 {
			return false
		}
		n := leaderName(t, cli, a, b, w)
		return n == "nodeA" || n == "nodeB"
	})
	t.Logf("a data member is leader again %s after the move to the witness", time.Since(moved).Round(time.Millisecond))
	// The client may retry the move after the first one landed (seen in CI:
	// the witness handed the leadership back twice), so judge the end state
	// once the move call is over.
	<-done
	waitFor(t, 5*time.Second, "a data member leader and hapair_witness_is_leader 0", func() bool {
		n := leaderName(t, cli, a, b, w)
		return (n == "nodeA" || n == "nodeB") && w.metric("hapair_witness_is_leader") == 0
	})
}

func waitLeader(t *testing.T, cli *clientv3.Client, ps ...*proc) *proc {
	t.Helper()
	var name string
	waitFor(t, 10*time.Second, "a leader", func() bool {
		name = leaderName(t, cli, ps...)
		return name != ""
	})
	for _, p := range ps {
		if p.name == name {
			return p
		}
	}
	return nil
}

// waitFor polls cond every 20ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
