package roled

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/etcdtest"
)

// TestQuorumLossFastPassive: the ACTIVE node's etcd member is cut off from
// the other two (the partition of the primary's node). The node turns
// PASSIVE on the quorum check, long before its lease deadline, and the
// peer, on the majority side, serves only after that: the order is asserted
// on the checker's rounds, the times are printed.
func TestQuorumLossFastPassive(t *testing.T) {
	skipShort(t)
	c := etcdtest.New(t)
	only := func(i int) func(*Config) {
		return func(cfg *Config) { cfg.Etcd.Endpoints = []string{c.Member(i).Endpoint()} }
	}
	a := startNode(t, c, "A", only(0))
	// B and its Patroni stand on the majority side: their clients never
	// try member 0, which the cut mutes.
	bPat := newFakePatroni(t, c.MemberClient(t, 1), "B", "hapair")
	bCfg := testConfig(t, c, "B", bPat.URL())
	bCfg.Etcd.Endpoints = []string{c.Member(1).Endpoint(), c.Member(2).Endpoint()}
	b := runNode(t, "B", bCfg, bPat)
	oc := startChecker(t, a, b)
	a.pat.promote()
	a.waitCode(t, 200, 10*time.Second)
	if c.WaitLeader(t) == 0 {
		// The cut mutes what reaches member 0, not what it sends: a muted
		// leader would keep the others from electing a new one. Move the
		// leadership first, so the majority side can commit.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.MemberClient(t, 0).MoveLeader(ctx, uint64(c.Member(1).Etcd().Server.MemberID()))
		cancel()
		if err != nil {
			t.Fatalf("move etcd leadership off member 0: %v", err)
		}
		if c.WaitLeader(t) == 0 {
			t.Fatal("member 0 still leads etcd")
		}
	}

	cut := time.Now()
	c.Pause(0)                        // A's only member: A is on the minority side
	t.Cleanup(func() { c.Resume(0) }) // a muted member would hold the cleanup
	waitFor(t, 10*time.Second, "A 503 after its member lost the majority", func() bool {
		code, _ := patientHealth(a.url)
		return code != 200 && !markerExists(a.cfg.Marker.Path)
	})
	if r := a.status(t).Reason; r != string(ReasonQuorumLost) {
		t.Fatalf("A reason %q, want %q", r, ReasonQuorumLost)
	}
	passive := oc.lastOK("A").Sub(cut)

	// Patroni on the majority side takes the leader key (A's Patroni has
	// lost it: it cannot renew it either); B may serve only once A's lease
	// has expired on etcd's side.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.MemberClient(t, 1).Delete(ctx, a.pat.key); err != nil {
		t.Fatalf("drop A's leader key: %v", err)
	}
	b.pat.promote()
	b.waitCode(t, 200, 20*time.Second)
	// The checker's own round must have seen B's 200 before it stops
	// (b.waitCode polls on its own: halting right after it raced the
	// checker and left B with no first 200 at all).
	waitFor(t, 10*time.Second, "the checker sees B's 200", func() bool {
		oc.mu.Lock()
		defer oc.mu.Unlock()
		return len(oc.first200["B"]) > 0
	})
	oc.halt()
	var bFirst time.Time
	oc.mu.Lock()
	for _, at := range oc.first200["B"] {
		if bFirst.IsZero() || at.Before(bFirst) {
			bFirst = at
		}
	}
	oc.mu.Unlock()
	t.Logf("partition of the ACTIVE node's member: A's last 200 %s after the cut (quorum-loss-after %s, "+
		"local deadline lease-ttl %s - margin %s); B's first 200 %s after the cut",
		passive.Round(time.Millisecond), a.cfg.QuorumLossAfter, a.cfg.LeaseTTL, a.cfg.SafetyMargin,
		bFirst.Sub(cut).Round(time.Millisecond))
	if oc.overlaps.Load() != 0 {
		t.Fatalf("%d rounds with two 200s", oc.overlaps.Load())
	}
	if !oc.lastOK("A").Before(bFirst) {
		t.Fatalf("A's last 200 (%s after the cut) is not before B's first (%s)", passive, bFirst.Sub(cut))
	}
	// The behaviour, not a speed goal: A stopped on the quorum check, before
	// the deadline would have stopped it.
	if deadline := a.cfg.LeaseTTL - a.cfg.SafetyMargin; passive >= deadline {
		t.Fatalf("A served 200 for %s after the cut, not less than its deadline %s", passive, deadline)
	}
}

// TestRunProbesOverlap: a probe that has not answered does not hold back the
// next one (the proof's age is interval + one probe's latency, not the sum of
// two), each result reaches done with the time its probe was sent, a probe
// past its timeout reports the deadline, and cancel stops every probe before
// runProbes returns.
func TestRunProbesOverlap(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var clock atomic.Int64
	now := func() time.Duration { return time.Duration(clock.Add(1)) }
	started := make(chan struct{})
	release := make(chan struct{})
	var running atomic.Int32
	probe := func(pctx context.Context) error {
		running.Add(1)
		defer running.Add(-1)
		select {
		case started <- struct{}{}:
		case <-pctx.Done():
			return pctx.Err()
		}
		select {
		case <-release:
			return nil
		case <-pctx.Done():
			return pctx.Err()
		}
	}
	type result struct {
		sent time.Duration
		err  error
	}
	results := make(chan result, 16)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		runProbes(ctx, time.Millisecond, time.Hour, now, probe, func(sent time.Duration, err error) {
			results <- result{sent, err}
		})
	}()
	for i := 0; i < 3; i++ {
		<-started // three probes in flight, none answered
	}
	release <- struct{}{}
	r := <-results
	if r.err != nil || r.sent <= 0 || r.sent > time.Duration(clock.Load()) {
		t.Fatalf("released probe: sent %d err %v (clock %d)", r.sent, r.err, clock.Load())
	}
	cancel()
	<-returned
	if n := running.Load(); n != 0 {
		t.Fatalf("%d probes still running after runProbes returned", n)
	}
	select {
	case r := <-results:
		t.Fatalf("a result after the cancel reached done: %+v", r)
	default:
	}
}

// TestRunProbesTimeout: a probe that never answers ends at its timeout, and
// done hears the deadline.
func TestRunProbesTimeout(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 1)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		runProbes(ctx, time.Hour, time.Millisecond, func() time.Duration { return 1 },
			func(pctx context.Context) error { <-pctx.Done(); return pctx.Err() },
			func(_ time.Duration, err error) {
				select {
				case errs <- err:
				default:
				}
			})
	}()
	if err := <-errs; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hung probe reported %v, want the deadline", err)
	}
	cancel()
	<-returned
}

// TestQuorumSurvivesEtcdLeaderLoss: the member leading raft (the PASSIVE
// node's, say) dies. Until the other two elect a leader (an election
// timeout and more), no linearizable read succeeds anywhere, yet the ACTIVE
// node is not cut off: a majority of the members still answer it. It stays
// ACTIVE on the same epoch, without a blip, while the partition test above
// still turns a cut-off node PASSIVE within quorum-loss-after.
func TestQuorumSurvivesEtcdLeaderLoss(t *testing.T) {
	skipShort(t)
	c := etcdtest.New(t)
	// A lease long enough that the election cannot reach the deadline: the
	// test is about the quorum check alone.
	// The shipped quorum-loss-after (800 ms): shorter than any election
	// (etcd's 1 s election timeout and more), so the linearizable proof alone
	// would turn A PASSIVE in every run.
	a := startNode(t, c, "A", func(cfg *Config) {
		cfg.LeaseTTL, cfg.SafetyMargin = 6*time.Second, time.Second
		cfg.QuorumLossAfter, cfg.QuorumCheckInterval = 800*time.Millisecond, 200*time.Millisecond
	})
	oc := startChecker(t, a)
	a.pat.promote()
	a.waitCode(t, 200, 10*time.Second)
	const dead = 1
	if l := c.WaitLeader(t); l != dead {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.MemberClient(t, l).MoveLeader(ctx, uint64(c.Member(dead).Etcd().Server.MemberID()))
		cancel()
		if err != nil {
			t.Fatalf("move etcd leadership to member %d: %v", dead, err)
		}
	}
	waitFor(t, 10*time.Second, "member 1 leads etcd", func() bool { return c.Leader() == dead })
	epoch := a.status(t).Epoch
	passives := func() float64 {
		return counterValue(a.d.m.transitions.WithLabelValues(RolePassive.String(), string(ReasonQuorumLost))) +
			counterValue(a.d.m.transitions.WithLabelValues(RolePassive.String(), string(ReasonDeadline)))
	}
	passive0 := passives()
	deadID := c.Member(dead).Etcd().Server.MemberID()

	cut := time.Now()
	c.Pause(dead)
	t.Cleanup(func() { c.Resume(dead) })
	waitFor(t, 20*time.Second, "a new etcd leader among the other two", func() bool {
		l := c.Member(0).Etcd().Server.Leader()
		return l != 0 && l != deadID && c.Member(2).Etcd().Server.Leader() == l
	})
	elected := time.Since(cut)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := c.MemberClient(t, 0).Get(ctx, "probe")
	cancel()
	if err != nil {
		t.Fatalf("linearizable read after the election: %v", err)
	}
	// Watch a while past the election: a late PASSIVE would show here.
	watch := time.Now().Add(2 * time.Second)
	waitFor(t, 10*time.Second, "the watch window", func() bool { return time.Now().After(watch) })
	oc.halt()
	st := a.status(t)
	oc.mu.Lock()
	epochs := len(oc.first200["A"])
	oc.mu.Unlock()
	t.Logf("etcd leader paused: a new leader after %s (quorum-loss-after %s); A %s epoch %d (was %d), %d epochs served",
		elected.Round(time.Millisecond), a.cfg.QuorumLossAfter, st.Role, st.Epoch, epoch, epochs)
	// A blip may keep the epoch (the key cannot be released without a
	// leader): the transitions count it.
	if n := passives() - passive0; n != 0 {
		t.Fatalf("A turned PASSIVE %v times (quorum lost or deadline) during the etcd election", n)
	}
	if st.Role != RoleActive.String() || st.Epoch != epoch || epochs != 1 {
		t.Fatalf("A did not stay ACTIVE on epoch %d through the etcd election: now %s epoch %d (reason %s), %d epochs served",
			epoch, st.Role, st.Epoch, st.Reason, epochs)
	}
	if last := oc.lastOK("A"); !last.After(watch.Add(-100 * time.Millisecond)) {
		t.Fatalf("A's last 200 %s before the end of the watch", watch.Sub(last))
	}
}
