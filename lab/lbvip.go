package lab

import (
	"context"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/hapair/hapair/internal/nettest"
)

// The balancer pair (issue 20's second shape): with --vip the lab runs
// hapair-lb on lb and lb2, and LBVIPAddr is held by the one that holds the
// pair's etcd election (hapair-lb's vip section), or by keepalived's VRRP
// master (--vip-peer keepalived). The client writes through LBVIPAddr:80;
// the data nodes do not move. Each fault hits the balancer holding the VIP,
// Repeat times.

// lbPartitionHold is how long a cut balancer stays cut after the other one
// took the VIP: long enough for a peer that keeps the address on the cut
// host (two VRRP masters) to show it in the ARP rounds.
const lbPartitionHold = 3 * time.Second

// lbPauseFor is how long the holder's hapair-lb stays SIGSTOPped: past
// the pair's 2 s lease and keepalived's 3.6 s master-down time.
const lbPauseFor = 5 * time.Second

// lbFaults runs fault Repeat times on the balancer holding LBVIPAddr, with
// the checkers running. fault gets the holder, the standby and the ACTIVE
// data node (whose app answers the writes) and restores the holder
// itself; it returns false when it has failed r. Each round starts on a
// settled pair (settleLB) and its failed writes and double answers count
// until the pair has settled again, so a VRRP pair resolving two masters
// after a heal is in the round that caused it.
func lbFaults(ctx context.Context, l *Lab, r *Result, what string, fault func(w *vipWatch, holder, standby, active string) bool) {
	if !needParts(l, r, BinLB, BinRoled) {
		return
	}
	w, ok := startVIPWatch(ctx, l, r, lbVIP)
	if !ok {
		return
	}
	defer w.stop(l, r)
	for range max(l.Opt.Repeat, 1) {
		active, other, ok := l.vipActive(r)
		if !ok {
			return
		}
		holder, ok := l.settleLB(ctx, r, w, active, other, what)
		if !ok {
			return
		}
		standby := LB2
		if holder == LB2 {
			standby = LB
		}
		f0, d0 := w.counts()
		if !fault(w, holder, standby, active) {
			return
		}
		if _, ok := l.settleLB(ctx, r, w, active, other, what); !ok {
			return
		}
		w.faultFigures(r, "lb vip "+what, f0, d0)
	}
}

// lbSteady is how long the VIP must stay on one balancer alone before a
// round starts or ends: longer than a VRRP advert interval, so two masters
// that have just heard each other have resolved.
const lbSteady = 1500 * time.Millisecond

// settleLB waits until both balancers serve from the ACTIVE node, the other
// data node is a ready standby whose etcd member has had up to 3 s to take
// the raft leadership (roled's etcd-leader standby: a leader change renews
// every lease, the election's too), and the VIP has been on one balancer
// alone for lbSteady. It returns that balancer.
func (l *Lab) settleLB(ctx context.Context, r *Result, w *vipWatch, active, other, what string) (string, bool) {
	for _, h := range w.shape.holders {
		if !poll(ctx, 30*time.Second, 50*time.Millisecond, func() bool { return l.balancerServes(h, active) }) {
			r.fail("%s does not serve from %s (around the %s)", h, active, what)
			return "", false
		}
	}
	if err := l.Ctl().WaitStandbyReady(ctx, other, io.Discard); err != nil {
		r.fail("%s not a ready standby (around the %s): %v", other, what, err)
		return "", false
	}
	poll(ctx, 3*time.Second, 50*time.Millisecond, func() bool { h, err := l.etcdLeaderHost(ctx); return err == nil && h == other })
	var on string
	var since time.Time
	ok := poll(ctx, 30*time.Second, 5*time.Millisecond, func() bool {
		a, _ := w.hosts[w.shape.holders[0]].Has(w.vip)
		b, _ := w.hosts[w.shape.holders[1]].Has(w.vip)
		now := ""
		switch {
		case a && !b:
			now = w.shape.holders[0]
		case b && !a:
			now = w.shape.holders[1]
		}
		if now == "" || now != on {
			on, since = now, time.Now()
			return false
		}
		return time.Since(since) >= lbSteady
	})
	if !ok {
		r.fail("the balancer VIP not on one balancer alone for %s (around the %s)", lbSteady, what)
		return "", false
	}
	return on, true
}

// balancerServes: host's hapair-lb answers the app's /health from node.
func (l *Lab) balancerServes(host, node string) bool {
	var h struct{ Node string }
	err := l.getJSON(Client, fmt.Sprintf("http://%s:%d/health", IP(host), LBWebPort), time.Second, &h)
	return err == nil && h.Node == node
}

// LBVIPKill (issue 20): the balancer host holding the VIP dies (kill -9 of
// everything on it, cable pulled), then comes back as a rebooted host,
// without the VIP. Figures: the VIP on the standby balancer after the kill
// (the goal: 1.5 s), the first write through it, failed writes,
// double-answer rounds.
func LBVIPKill(ctx context.Context, l *Lab, r *Result) {
	lbFaults(ctx, l, r, "kill", func(w *vipWatch, holder, standby, active string) bool {
		// Cable first: a host that dies sends nothing, and a keepalived
		// whose parent is killed first gets out a priority-0 advert
		// (measured: the standby took over in 0.43 s).
		t0 := time.Now()
		err := l.Net.SetLink(holder, false)
		if err == nil {
			err = l.KillNode(holder)
		}
		if err != nil {
			r.fail("kill %s: %v", holder, err)
			return false
		}
		if !w.heldBy(ctx, standby, 30*time.Second) {
			r.fail("the balancer VIP not on %s within 30 s of the kill of %s", standby, holder)
			return false
		}
		moved := time.Since(t0)
		stale, _ := w.hosts[holder].Has(w.vip)
		r.secs("lb vip kill: VIP on the standby balancer after", moved)
		r.note("lb vip kill of %s: its interface still had the VIP at the takeover: %v", holder, stale)
		if stale && l.Opt.VIPPeer == "" && !w.silenced {
			r.fail("the killed %s still had the VIP when %s took it (its kernel lifetime should have removed it)", holder, standby)
		}
		w.firstWrite(ctx, r, "lb vip kill", active, t0)
		return w.powerOn(l, r, holder)
	})
}

// LBVIPPartition (issue 20): the holding balancer is cut off from every
// lab host but the client (the other balancer, the data nodes, the
// witness; VRRP adverts too), and stays cut lbPartitionHold after the
// other balancer took the VIP. hapair's holder loses etcd and drops the
// VIP at its deadline, before the key can pass; a VRRP master that cannot
// hear its peer keeps it. Figures: the VIP last seen on the cut balancer
// and on the other one, both after the cut; failed writes; double answers.
func LBVIPPartition(ctx context.Context, l *Lab, r *Result) {
	lbFaults(ctx, l, r, "partition", func(w *vipWatch, holder, standby, active string) bool {
		last := nettest.StartLastSeen(w.hosts[holder], w.vip)
		t0 := time.Now()
		if err := l.Net.Partition(holder, standby, NodeA, NodeB, Witness); err != nil {
			last.Halt()
			r.fail("partition: %v", err)
			return false
		}
		held := w.heldBy(ctx, standby, 30*time.Second)
		moved := time.Since(t0)
		if held {
			time.Sleep(lbPartitionHold) // the cut lasts: a peer's double holder shows
		}
		lastSeen := last.Halt()
		if w.silenced {
			lastSeen = w.lastAnswer(holder, t0) // its address may stay, silenced
		}
		if err := l.Net.Heal(holder); err != nil {
			r.fail("heal: %v", err)
			return false
		}
		if !held {
			r.fail("the balancer VIP not on %s within 30 s of the partition of %s", standby, holder)
			return false
		}
		w.handoff(ctx, l, r, handoff{"lb vip partition", "cut balancer", "other balancer", holder, standby, active, t0, lastSeen, moved})
		return true
	})
}

// LBVIPPaused (issue 20): the holding balancer's hapair-lb is SIGSTOPped
// for lbPauseFor, then resumed. hapair: the kernel lifetime removes the
// VIP from the stopped host before its deadline, the other takes it when
// the lease expires. keepalived: its check of the stopped balancer's
// /healthz times out and FAULT drops the VIP. Figures: VIP last seen on
// the paused balancer, VIP on the other, failed writes, double answers.
func LBVIPPaused(ctx context.Context, l *Lab, r *Result) {
	lbFaults(ctx, l, r, "pause", func(w *vipWatch, holder, standby, active string) bool {
		last := nettest.StartLastSeen(w.hosts[holder], w.vip)
		if err := l.Signal(holder, ProcLB, syscall.SIGSTOP); err != nil {
			last.Halt()
			r.fail("SIGSTOP hapair-lb on %s: %v", holder, err)
			return false
		}
		t0 := time.Now()
		held := w.heldBy(ctx, standby, lbPauseFor)
		moved := time.Since(t0)
		if rest := lbPauseFor - time.Since(t0); rest > 0 {
			time.Sleep(rest) // the pause lasts lbPauseFor (the scenario)
		}
		lastSeen := last.Halt()
		if w.silenced {
			lastSeen = w.lastAnswer(holder, t0) // its address stays, silenced
		}
		if err := l.Signal(holder, ProcLB, syscall.SIGCONT); err != nil {
			r.fail("SIGCONT hapair-lb on %s: %v", holder, err)
			return false
		}
		if !held {
			r.fail("the balancer VIP not on %s within %s of the SIGSTOP of %s's hapair-lb", standby, lbPauseFor, holder)
			return false
		}
		w.handoff(ctx, l, r, handoff{"lb vip pause", "paused balancer", "other balancer", holder, standby, active, t0, lastSeen, moved})
		return true
	})
}
