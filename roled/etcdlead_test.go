package roled

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hapair/hapair/internal/etcdtest"
)

func TestDecideLead(t *testing.T) {
	for _, c := range []struct {
		name string
		o    leadObservation
		want LeadReason
	}{
		{"ACTIVE or not ready", leadObservation{ReadyStandby: false, Own: 1, Leader: 2, SinceAsked: -1}, LeadNotReadyStandby},
		{"own member unknown", leadObservation{ReadyStandby: true, Own: 0, Leader: 2, SinceAsked: -1}, LeadOwnUnknown},
		{"no leader (an election)", leadObservation{ReadyStandby: true, Own: 1, Leader: 0, SinceAsked: -1}, LeadNoLeader},
		{"already ours", leadObservation{ReadyStandby: true, Own: 1, Leader: 1, SinceAsked: -1}, LeadMine},
		{"asked a moment ago", leadObservation{ReadyStandby: true, Own: 1, Leader: 2, SinceAsked: time.Second}, LeadBackoff},
		{"never asked", leadObservation{ReadyStandby: true, Own: 1, Leader: 2, SinceAsked: -1}, LeadMove},
		{"asked long ago", leadObservation{ReadyStandby: true, Own: 1, Leader: 2, SinceAsked: leadBackoff}, LeadMove},
	} {
		if got := decideLead(c.o); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

// A ready standby's step moves the raft leadership of a real etcd cluster
// to its own member; a node that is not a ready standby leaves it alone.
func TestLeadKeeperMovesLeadershipToTheStandby(t *testing.T) {
	skipShort(t)
	c := etcdtest.New(t)
	l := c.WaitLeader(t)
	ownIdx := (l + 1) % c.Size()
	var members []*clientv3.Client
	for i := range c.Size() {
		members = append(members, c.MemberClient(t, i))
	}
	start := time.Now()
	moves := 0
	k := &leadKeeper{members: members, name: c.Member(ownIdx).Etcd().Config().Name, lg: zap.NewNop(),
		now: func() time.Duration { return time.Since(start) }, moved: func() { moves++ }, asked: -1}
	ctx := context.Background()
	if why := k.step(ctx, false); why != LeadNotReadyStandby || c.Leader() != l {
		t.Fatalf("not a ready standby: %s, leader %d (was %d)", why, c.Leader(), l)
	}
	if why := k.step(ctx, true); why != LeadMove {
		t.Fatalf("ready standby, another member leads: %s, want %s", why, LeadMove)
	}
	waitFor(t, 10*time.Second, "the standby's member leads", func() bool { return c.Leader() == ownIdx })
	if moves != 1 {
		t.Errorf("moves counted %d, want 1", moves)
	}
	if why := k.step(ctx, true); why != LeadMine {
		t.Errorf("after the move: %s, want %s", why, LeadMine)
	}
}
