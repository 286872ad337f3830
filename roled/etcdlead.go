package roled

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Why the standby's member should lead raft (issue 21). When the primary's
// node dies while its own etcd member leads, the two survivors first elect
// a leader, and the new leader renews every lease for a full TTL (etcd's
// lessor Promote): Patroni's leader key then outlives the node by an
// election plus a whole ttl instead of at most one ttl. The lab measured
// the first write after a kill at rto 6.5 s at 6.73 s with the dead node's
// member leading and 4.94–5.13 s with a survivor's. So a ready standby
// asks the leader to hand the leadership to its own member. The standby's
// death then costs an election but no failover, and a moment without a
// leader is not a partition to roled (quorum.go majorityProbe). The witness
// never keeps it (hapair-witness hands it to a data member), so the two
// rules agree.

// EtcdLeaderPolicy is the etcd-leader setting.
type EtcdLeaderPolicy string

// The etcd-leader words.
const (
	EtcdLeaderStandby EtcdLeaderPolicy = "standby"
	EtcdLeaderAny     EtcdLeaderPolicy = "any"
)

// LeadReason is decideLead's answer.
type LeadReason string

// The reasons, in the order decideLead checks them.
const (
	LeadNotReadyStandby LeadReason = "not-ready-standby" // ACTIVE, or a standby not ready to take over
	LeadOwnUnknown      LeadReason = "own-member-unknown"
	LeadNoLeader        LeadReason = "no-leader"
	LeadMine            LeadReason = "already-mine"
	LeadBackoff         LeadReason = "backoff" // a move was asked recently
	LeadMove            LeadReason = "move"    // ask the leader to hand it over
)

// leadObservation is what decideLead looks at.
type leadObservation struct {
	ReadyStandby bool
	Own, Leader  uint64        // member IDs; 0: unknown, no leader
	SinceAsked   time.Duration // since the last move was asked; negative: never
}

// leadCheckInterval: how often a ready standby looks at the leadership.
// It only matters after a switchover or a rejoin, so once a second is
// plenty; leadBackoff spaces the moves out when one does not take.
const (
	leadCheckInterval = time.Second
	leadBackoff       = 10 * time.Second
)

// decideLead is the rule as a pure function.
func decideLead(o leadObservation) LeadReason {
	switch {
	case !o.ReadyStandby:
		return LeadNotReadyStandby
	case o.Own == 0:
		return LeadOwnUnknown
	case o.Leader == 0:
		return LeadNoLeader
	case o.Leader == o.Own:
		return LeadMine
	case o.SinceAsked >= 0 && o.SinceAsked < leadBackoff:
		return LeadBackoff
	}
	return LeadMove
}

// leadLoop applies decideLead every leadCheckInterval with the per-member
// clients of the quorum check, until ctx is done.
func (d *Daemon) leadLoop(ctx context.Context, members []*clientv3.Client) {
	name := d.cfg.EtcdMember
	if name == "" {
		name = d.cfg.Node
	}
	k := &leadKeeper{members: members, name: name, lg: d.lg.With(zap.String("etcd_member", name)),
		now: d.now, moved: d.m.etcdLeaderMoves.Inc, asked: -1}
	t := time.NewTicker(leadCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rd, _ := d.readiness()
		k.step(ctx, rd.Ready)
	}
}

// leadKeeper is leadLoop's state between steps.
type leadKeeper struct {
	members []*clientv3.Client // one per member
	name    string             // this node's member
	lg      *zap.Logger
	now     func() time.Duration
	moved   func()
	own     uint64        // this node's member ID, once known
	asked   time.Duration // when the last move was asked; negative: never
	warned  bool
}

// step looks once and asks for the leadership when decideLead says so. An
// ACTIVE node, or a standby not ready, makes no etcd call at all.
func (k *leadKeeper) step(ctx context.Context, readyStandby bool) LeadReason {
	if !readyStandby {
		return LeadNotReadyStandby
	}
	if k.own == 0 {
		k.own = memberID(ctx, k.members, k.name)
		if k.own == 0 && !k.warned {
			k.lg.Warn("no etcd member has this name; etcd-leader standby does nothing (set etcd-member)")
			k.warned = true
		}
	}
	leader, leaderCli := raftLeader(ctx, k.members)
	o := leadObservation{ReadyStandby: true, Own: k.own, Leader: leader, SinceAsked: -1}
	if k.asked >= 0 {
		o.SinceAsked = k.now() - k.asked
	}
	why := decideLead(o)
	if why != LeadMove || leaderCli == nil {
		return why
	}
	k.asked = k.now()
	mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := leaderCli.MoveLeader(mctx, k.own)
	cancel()
	if err != nil {
		k.lg.Warn("could not move etcd's raft leadership to this standby", zap.Error(err))
		return why
	}
	k.moved()
	k.lg.Info("etcd's raft leadership moved to this standby's member")
	return why
}

// memberID is the ID of the member named name (0: none answered, or no
// such member).
func memberID(ctx context.Context, members []*clientv3.Client, name string) uint64 {
	for _, c := range members {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := c.MemberList(cctx)
		cancel()
		if err != nil {
			continue
		}
		for _, m := range resp.Members {
			if m.Name == name {
				return m.ID
			}
		}
		return 0
	}
	return 0
}

// raftLeader asks each member for its status: the leader's ID and the
// client connected to the leader itself (MoveLeader must go to the leader).
func raftLeader(ctx context.Context, members []*clientv3.Client) (uint64, *clientv3.Client) {
	var leader uint64
	var cli *clientv3.Client
	for _, c := range members {
		eps := c.Endpoints()
		if len(eps) == 0 {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := c.Status(cctx, eps[0])
		cancel()
		if err != nil || st.Leader == 0 {
			continue
		}
		leader = st.Leader
		if st.Header.MemberId == st.Leader {
			cli = c
		}
	}
	return leader, cli
}
