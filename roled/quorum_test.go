package roled

import (
	"context"
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
