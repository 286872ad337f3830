package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/hapair/hapair/ctl"
)

// StandbyDiesLeadingEtcd (16): kill -9 of everything on the PASSIVE node
// while its etcd member leads raft. etcd has no leader until the two others
// elect one (an election timeout and more), and no linearizable read
// succeeds anywhere meanwhile; the ACTIVE node is not cut off, though (a
// majority of the members still answer it: roled's quorum check), so it
// must stay ACTIVE on its epoch, and no write through the balancer may
// fail. The node then comes back as a ready standby.
func StandbyDiesLeadingEtcd(ctx context.Context, l *Lab, r *Result) {
	if !needParts(l, r, BinLB, BinRoled) {
		return
	}
	c := l.Ctl()
	before := c.Roled(ctx, c.Cfg.Nodes[0])
	if before.Role != "active" {
		r.fail("nodea is %s at the start, want active", before.Role)
		return
	}
	deadID, err := l.moveEtcdLeader(ctx, NodeB)
	if err != nil {
		r.fail("move etcd leadership to nodeb: %v", err)
		return
	}
	pr, stop, ok := l.probesServing(ctx, r)
	if !ok {
		return
	}
	t0 := time.Now()
	if err := l.KillNode(NodeB); err != nil {
		stop()
		r.fail("kill nodeb: %v", err)
		return
	}
	elected := poll(ctx, 30*time.Second, 20*time.Millisecond, func() bool {
		lead, err := l.etcdLeaderOf(ctx, NodeA)
		return err == nil && lead != 0 && lead != deadID
	})
	if !elected {
		r.fail("no new etcd leader within 30 s of the kill")
	} else {
		r.secs("standby killed: etcd without a leader (kill → nodea's member sees a new one)", time.Since(t0))
	}
	// Writes for as long as a lease, past the election: a late PASSIVE
	// would show here.
	time.Sleep(l.timers().LeaseTTL)
	stop()
	rep := ctl.Analyze(pr.probe.Samples(), t0)
	r.note("standby killed while leading etcd: %s", rep)
	r.fig("standby killed: failed writes", float64(rep.Failed), "")
	if rep.Failed > 0 {
		r.fail("%d writes failed while the standby was dead", rep.Failed)
	}
	if dual, rounds := pr.ha.Dual(); dual > 0 {
		r.fail("checker saw two ACTIVE nodes in %d of %d rounds", dual, rounds)
	}
	// A blip can keep the epoch (without an etcd leader the key cannot be
	// released), so the 10 ms checker's answers decide, not the epoch alone.
	if at, ok := pr.ha.First(NodeA, "passive", t0); ok {
		r.fail("nodea answered 503 %.3f s after the kill: a role change while only etcd's leader was gone", at.Sub(t0).Seconds())
	}
	after := c.Roled(ctx, c.Cfg.Nodes[0])
	if after.Role != "active" || after.Epoch != before.Epoch {
		r.fail("nodea did not stay ACTIVE through the etcd election: %s epoch %d → %s epoch %d (%s)",
			before.Role, before.Epoch, after.Role, after.Epoch, after.Reason)
	}
	t1 := time.Now()
	if err := l.StartNode(NodeB); err != nil {
		r.fail("start nodeb: %v", err)
		return
	}
	if err := c.WaitStandbyReady(ctx, NodeB, io.Discard); err != nil {
		r.fail("nodeb not ready as a standby after its restart: %v", err)
	} else {
		r.secs("standby killed: restart → standby ready", time.Since(t1))
	}
	if err := l.WaitSettled(ctx, NodeA, 90*time.Second); err != nil {
		r.fail("not settled after the standby's restart: %v", err)
	}
}

// etcdClient is a client of the members at hosts (every member when none
// is given), dialled from the client host.
func (l *Lab) etcdClient(hosts ...string) (*clientv3.Client, error) {
	eps := EtcdEndpoints()
	if len(hosts) > 0 {
		eps = nil
		for _, h := range hosts {
			eps = append(eps, "http://"+IP(h)+":2379")
		}
	}
	dial := l.Net.DialContext(Client)
	return clientv3.New(clientv3.Config{
		Endpoints: eps, DialTimeout: 2 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dial(ctx, "tcp", addr)
		})},
	})
}

// etcdLeaderOf is the leader host's member sees (0: none).
func (l *Lab) etcdLeaderOf(ctx context.Context, host string) (uint64, error) {
	cli, err := l.etcdClient(host)
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := cli.Status(sctx, "http://"+IP(host)+":2379")
	if err != nil {
		return 0, err
	}
	return st.Leader, nil
}

// etcdLeaderHost names the host whose member leads etcd, as nodeb's member
// sees it (a killed node's member that led raft costs the survivors an
// election, and the new leader renews every lease: the kill's worst case).
func (l *Lab) etcdLeaderHost(ctx context.Context) (string, error) {
	lead, err := l.etcdLeaderOf(ctx, NodeB)
	if err != nil {
		return "", err
	}
	for _, h := range EtcdHosts {
		cli, err := l.etcdClient(h)
		if err != nil {
			return "", err
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := cli.Status(sctx, "http://"+IP(h)+":2379")
		cancel()
		cli.Close()
		if err == nil && st.Header.MemberId == lead {
			return h, nil
		}
	}
	return "", fmt.Errorf("no member has the leader's ID %x", lead)
}

// moveEtcdLeader makes host's member the raft leader and returns its ID.
func (l *Lab) moveEtcdLeader(ctx context.Context, host string) (uint64, error) {
	ids := map[string]uint64{}
	var lead uint64
	for _, h := range EtcdHosts {
		cli, err := l.etcdClient(h)
		if err != nil {
			return 0, err
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := cli.Status(sctx, "http://"+IP(h)+":2379")
		cancel()
		cli.Close()
		if err != nil {
			return 0, fmt.Errorf("status of %s's member: %w", h, err)
		}
		ids[h] = st.Header.MemberId
		lead = st.Leader
	}
	target := ids[host]
	for h, id := range ids {
		if id != lead || id == target {
			continue
		}
		cli, err := l.etcdClient(h)
		if err != nil {
			return 0, err
		}
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = cli.MoveLeader(mctx, target)
		cancel()
		cli.Close()
		if err != nil {
			return 0, fmt.Errorf("move leadership from %s to %s: %w", h, host, err)
		}
	}
	// The witness hands leadership to a data member, never away from one:
	// nodeb's member keeps it until the kill.
	if !poll(ctx, 10*time.Second, 50*time.Millisecond, func() bool {
		lead, err := l.etcdLeaderOf(ctx, NodeA)
		return err == nil && lead == target
	}) {
		return 0, fmt.Errorf("%s's member does not lead etcd 10 s after the move", host)
	}
	return target, nil
}

// probesServing starts the probes (the 10 ms checker among them) and waits
// for a few writes served by nodea, the starting point of the kill
// scenarios; on false it has stopped them and failed r.
func (l *Lab) probesServing(ctx context.Context, r *Result) (*probeRun, func(), bool) {
	pr, stop := l.startProbes(ctx, 10*time.Millisecond)
	pr.dualBefore, _ = l.lbDualActive("app")
	if !poll(ctx, 10*time.Second, 20*time.Millisecond, func() bool { return countOK(pr.probe.Samples(), NodeA) >= 5 }) {
		stop()
		r.fail("no writes through the balancer before the fault")
		return nil, nil, false
	}
	return pr, stop, true
}
