package lab

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/hapair/hapair/internal/nettest"
)

// VIPAddr is the lab's floating service address (Options.VIP).
const VIPAddr = Subnet + ".100"

// VIPSwitchover (issue 20): with --vip the service address follows ACTIVE
// through planned switchovers both ways. A checker on the client asks ARP
// for it every 10 ms and records every MAC that answers; another polls
// both nodes' addresses. Figures: the VIP's arrival after the new ACTIVE
// serves 200, double-answer rounds (must be 0).
func VIPSwitchover(ctx context.Context, l *Lab, r *Result) {
	if !l.Opt.VIP {
		r.note("skipped: the lab was made without --vip")
		return
	}
	vip := netip.MustParseAddr(VIPAddr)
	hosts := map[string]*nettest.Host{}
	for _, h := range []string{NodeA, NodeB, Client} {
		nh, err := nettest.HostAt(h, "/run/netns/"+l.Net.NS(h))
		if err != nil {
			r.fail("namespace of %s: %v", h, err)
			return
		}
		defer nh.Close()
		hosts[h] = nh
	}
	pres := nettest.StartPresence([]*nettest.Host{hosts[NodeA], hosts[NodeB]}, vip)
	arp, err := nettest.StartARP(hosts[Client], vip, 10*time.Millisecond)
	if err != nil {
		pres.Stop()
		r.fail("ARP checker: %v", err)
		return
	}
	wctx, stopWriter := context.WithCancel(ctx)
	wr := &vipWriter{}
	wdone := make(chan struct{})
	go func() { defer close(wdone); wr.run(wctx, l) }()
	for range max(l.Opt.Repeat, 1) {
		for _, to := range []string{NodeB, NodeA} {
			vipSwitchoverOnce(ctx, l, r, hosts[to], to, vip)
		}
	}
	stopWriter()
	<-wdone
	r.note("writes through the VIP (client -> %s:%d/write every 20 ms, new connection each): %d ok, %d failed, failures from first to last %s, by node %v",
		VIPAddr, AppPort, wr.ok, wr.failed, wr.lastFail.Sub(wr.firstFail).Round(time.Millisecond), wr.byNode)
	r.fig("vip writes failed", float64(wr.failed), "requests")
	arp.Stop()
	readings, overlaps, seen := pres.Stop()
	rounds, answered, doubles, byMAC := arp.Snapshot()
	r.note("VIP checkers: %d address readings (by host %v), %d ARP rounds, %d answered, answers by MAC %v",
		readings, seen, rounds, answered, byMAC)
	r.fig("vip double-answer ARP rounds", float64(doubles), "rounds")
	r.fig("vip on both nodes (address readings)", float64(overlaps), "readings")
	if doubles != 0 || overlaps != 0 {
		r.fail("the VIP on two nodes at once: %d double-answer ARP rounds, %d address overlaps", doubles, overlaps)
	}
	if len(byMAC) < 2 {
		r.fail("ARP answers from %d MACs, want both nodes'", len(byMAC))
	}
}

func vipSwitchoverOnce(ctx context.Context, l *Lab, r *Result, h *nettest.Host, to string, vip netip.Addr) {
	if err := l.Ctl().WaitStandbyReady(ctx, to, l.Out); err != nil {
		r.fail("vip switchover -> %s: target never ready: %v", to, err)
		return
	}
	// Watch the target from now: first 200 of its /ha-health, first sight
	// of the VIP on its interface.
	var served, held time.Time
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		url := fmt.Sprintf("http://%s:%d/ha-health", IP(to), RoledPort)
		for wctx.Err() == nil && (served.IsZero() || held.IsZero()) {
			at := time.Now()
			if served.IsZero() && l.httpCode(Client, url, 500*time.Millisecond) == 200 {
				served = at
			}
			if ok, _ := h.Has(vip); ok && held.IsZero() {
				held = time.Now()
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	_, err := l.Ctl().Switchover(ctx, to, l.Out)
	if err == nil {
		err = l.WaitSettled(ctx, to, 30*time.Second)
	}
	<-done
	name := "vip switchover -> " + to
	switch {
	case err != nil:
		r.fail("%s: %v", name, err)
	case served.IsZero() || held.IsZero():
		r.fail("%s: 200 seen %v, VIP seen %v", name, !served.IsZero(), !held.IsZero())
	default:
		// The 200 is probed over HTTP from the client (a round trip), the
		// VIP over netlink: a small negative value means "at once".
		r.secs(name+": VIP after 200", held.Sub(served))
	}
}

// vipWriter sends the app's /write through the VIP, as a client of a
// two-node site without a balancer would.
type vipWriter struct {
	ok, failed          int
	firstFail, lastFail time.Time
	byNode              map[string]int
}

func (w *vipWriter) run(ctx context.Context, l *Lab) {
	w.byNode = map[string]int{}
	id := time.Now().UnixMilli() * 1000
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		id++
		var res WriteResult
		err := l.getJSON(Client, fmt.Sprintf("http://%s:%d/write?id=%d", VIPAddr, AppPort, id), time.Second, &res)
		if err == nil && res.Error == "" {
			w.ok++
			w.byNode[res.Node]++
			continue
		}
		if ctx.Err() != nil {
			return
		}
		w.failed++
		now := time.Now()
		if w.firstFail.IsZero() {
			w.firstFail = now
		}
		w.lastFail = now
	}
}

// VIPRoledPaused (issue 20): SIGSTOP of the ACTIVE node's roled for longer
// than its lease (5 s). While it is stopped the kernel drops the VIP before
// roled's local deadline (last keep-alive sent + 5 s − 1 s); nobody else
// takes it (Patroni still names that node: no ACTIVE without it). After
// SIGCONT roled is ACTIVE again and adds it back.
func VIPRoledPaused(ctx context.Context, l *Lab, r *Result) {
	if !l.Opt.VIP {
		r.note("skipped: the lab was made without --vip")
		return
	}
	const lease, margin = 5 * time.Second, time.Second // roledConfig's
	vip := netip.MustParseAddr(VIPAddr)
	active, other := "", ""
	for _, h := range []string{NodeA, NodeB} {
		if l.httpCode(Client, fmt.Sprintf("http://%s:%d/ha-health", IP(h), RoledPort), 2*time.Second) == 200 {
			active = h
		} else {
			other = h
		}
	}
	if active == "" || other == "" {
		r.fail("want one ACTIVE node, got %q", active)
		return
	}
	hosts := map[string]*nettest.Host{}
	for _, h := range []string{active, other, Client} {
		nh, err := nettest.HostAt(h, "/run/netns/"+l.Net.NS(h))
		if err != nil {
			r.fail("namespace of %s: %v", h, err)
			return
		}
		defer nh.Close()
		hosts[h] = nh
	}
	if !poll(ctx, 10*time.Second, 5*time.Millisecond, func() bool { ok, _ := hosts[active].Has(vip); return ok }) {
		r.fail("the VIP is not on the ACTIVE %s", active)
		return
	}
	pres := nettest.StartPresence([]*nettest.Host{hosts[active], hosts[other]}, vip)
	arp, err := nettest.StartARP(hosts[Client], vip, 10*time.Millisecond)
	if err != nil {
		pres.Stop()
		r.fail("ARP checker: %v", err)
		return
	}
	// The start time of the last reading that found the VIP on the paused
	// node: it was there at some instant after that.
	var lastSeen time.Time
	pctx, stopPoll := context.WithCancel(ctx)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for pctx.Err() == nil {
			at := time.Now()
			if ok, _ := hosts[active].Has(vip); ok {
				lastSeen = at
			}
			time.Sleep(time.Millisecond)
		}
	}()
	if err := l.Signal(active, ProcRoled, 19); err != nil { // SIGSTOP
		stopPoll()
		<-polled
		arp.Stop()
		pres.Stop()
		r.fail("SIGSTOP roled on %s: %v", active, err)
		return
	}
	stopped := time.Now()
	time.Sleep(lease + time.Second) // the pause outlasts the lease (scenario)
	stopPoll()
	<-polled
	_ = l.Signal(active, ProcRoled, 18) // SIGCONT
	resumed := time.Now()
	back := poll(ctx, 30*time.Second, 5*time.Millisecond, func() bool { ok, _ := hosts[active].Has(vip); return ok })
	backAfter := time.Since(resumed)
	arp.Stop()
	readings, overlaps, seen := pres.Stop()
	rounds, answered, doubles, byMAC := arp.Snapshot()
	r.note("VIP checkers: %d address readings (by host %v), %d ARP rounds, %d answered, answers by MAC %v",
		readings, seen, rounds, answered, byMAC)
	r.secs("vip last seen on the paused node after SIGSTOP", lastSeen.Sub(stopped))
	if back {
		r.secs("vip back after SIGCONT", backAfter)
	} else {
		r.fail("the VIP did not come back on %s after SIGCONT", active)
	}
	if !lastSeen.Before(stopped.Add(lease - margin)) {
		r.fail("the VIP was on the stopped %s %s after SIGSTOP, past its deadline (< %s)", active, lastSeen.Sub(stopped), lease-margin)
	}
	if doubles != 0 || overlaps != 0 || seen[other] != 0 {
		r.fail("the VIP elsewhere: %d double-answer rounds, %d overlaps, %d readings on %s", doubles, overlaps, seen[other], other)
	}
}
