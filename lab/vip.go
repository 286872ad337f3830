package lab

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"time"

	"github.com/hapair/hapair/internal/nettest"
)

// VIPAddr is the lab's floating service address (Options.VIP), on the
// ACTIVE data node; LBVIPAddr the balancer pair's, on the balancer that
// holds the pair's election (or keepalived's VRRP master).
const (
	VIPAddr   = Subnet + ".100"
	LBVIPAddr = Subnet + ".101"
)

// vipShape is what a vipWatch watches: the address, the two hosts that
// may hold it, the port the writer sends /write to through it.
type vipShape struct {
	addr    string
	holders [2]string
	port    int
}

var (
	nodesVIP = vipShape{VIPAddr, [2]string{NodeA, NodeB}, AppPort}
	lbVIP    = vipShape{LBVIPAddr, [2]string{LB, LB2}, LBWebPort}
)

// VIPSwitchover (issue 20): with --vip the service address follows ACTIVE
// through planned switchovers both ways (Repeat rounds). Figures: the VIP's
// arrival after the new ACTIVE serves 200, and vipWatch's (double-answer
// rounds must be 0).
func VIPSwitchover(ctx context.Context, l *Lab, r *Result) {
	w, ok := startVIPWatch(ctx, l, r, nodesVIP)
	if !ok {
		return
	}
	for range max(l.Opt.Repeat, 1) {
		for _, to := range []string{NodeB, NodeA} {
			f0, d0 := w.counts()
			vipSwitchoverOnce(ctx, l, r, w.hosts[to], to, w.vip)
			w.faultFigures(r, "vip switchover", f0, d0)
		}
	}
	w.stop(l, r)
	if len(w.byMAC) < 2 {
		r.fail("ARP answers from %d MACs, want both nodes'", len(w.byMAC))
	}
}

// vipWatch is every VIP scenario's checkers, from the client's side of the
// LAN: an ARP request for the VIP every 10 ms (every MAC that answers is
// recorded), the address polled on both hosts that may hold it, and a
// write through the VIP every 20 ms.
type vipWatch struct {
	shape      vipShape
	vip        netip.Addr
	hosts      map[string]*nettest.Host // the two holders, client
	pres       *nettest.Presence
	arp        *nettest.ARPWatch
	wr         *vipWriter
	stopWriter context.CancelFunc
	wdone      chan struct{}
	// After stop: answers by MAC, readings with the VIP by host.
	byMAC, seen map[string]int
	// silenced: a holder that lost the VIP may keep it on its interface,
	// silenced (the balancer pair's nftables fence, Lab.lbFastVIP): the
	// VIP on two hosts is then two ARP answers, not two address readings.
	silenced bool
}

// startVIPWatch starts the checkers; false (r failed or skipped) when
// they cannot run.
func startVIPWatch(ctx context.Context, l *Lab, r *Result, shape vipShape) (*vipWatch, bool) {
	if !l.Opt.VIP {
		r.note("skipped: the lab was made without --vip")
		return nil, false
	}
	w := &vipWatch{shape: shape, vip: netip.MustParseAddr(shape.addr), hosts: map[string]*nettest.Host{},
		silenced: shape == lbVIP && l.Opt.VIPPeer == "" && l.lbFastVIP()}
	for _, h := range []string{shape.holders[0], shape.holders[1], Client} {
		nh, err := nettest.HostAt(h, "/run/netns/"+l.Net.NS(h))
		if err != nil {
			w.closeHosts()
			r.fail("namespace of %s: %v", h, err)
			return nil, false
		}
		w.hosts[h] = nh
	}
	w.pres = nettest.StartPresence([]*nettest.Host{w.hosts[shape.holders[0]], w.hosts[shape.holders[1]]}, w.vip)
	arp, err := nettest.StartARP(w.hosts[Client], w.vip, 10*time.Millisecond)
	if err != nil {
		w.pres.Stop()
		w.closeHosts()
		r.fail("ARP checker: %v", err)
		return nil, false
	}
	w.arp = arp
	wctx, cancel := context.WithCancel(ctx)
	w.wr, w.stopWriter, w.wdone = &vipWriter{url: fmt.Sprintf("http://%s:%d/write", shape.addr, shape.port), byNode: map[string]int{}}, cancel, make(chan struct{})
	go func() { defer close(w.wdone); w.wr.run(wctx, l) }()
	return w, true
}

func (w *vipWatch) closeHosts() {
	for _, h := range w.hosts {
		h.Close()
	}
}

// stop ends the checkers and reports their figures. The VIP on two nodes
// at once fails the scenario when hapair holds it; keepalived's doubles are
// its figures, reported (the comparison), not failures.
func (w *vipWatch) stop(l *Lab, r *Result) {
	w.stopWriter()
	<-w.wdone
	wr := w.wr
	r.note("writes through the VIP (client -> %s every 20 ms, new connection each): %d ok, %d failed, failures from first to last %s, by node %v",
		wr.url, wr.ok, wr.failed, wr.lastFail.Sub(wr.firstFail).Round(time.Millisecond), wr.byNode)
	r.fig("vip writes failed", float64(wr.failed), "requests")
	w.arp.Stop()
	readings, overlaps, seen := w.pres.Stop()
	rounds, answered, doubles, byMAC := w.arp.Snapshot()
	w.byMAC, w.seen = byMAC, seen
	w.closeHosts()
	r.note("VIP checkers (%s held by %s): %d address readings (by host %v), %d ARP rounds, %d answered, answers by MAC %v",
		w.shape.addr, l.vipHolder(w.shape), readings, seen, rounds, answered, byMAC)
	r.fig("vip double-answer ARP rounds", float64(doubles), "rounds")
	r.fig("vip on both hosts (address readings)", float64(overlaps), "readings")
	if doubles == 0 && overlaps == 0 {
		return
	}
	if doubles == 0 && w.silenced {
		r.note("%d address readings on both balancers: a fenced holder's silenced address (nftables fence; no double ARP answer)", overlaps)
		return
	}
	if l.Opt.VIPPeer != "" {
		r.note("%s: the VIP on two hosts at once: %d double-answer ARP rounds (10 ms), %d address overlaps", l.Opt.VIPPeer, doubles, overlaps)
		return
	}
	r.fail("the VIP on two hosts at once: %d double-answer ARP rounds, %d address overlaps", doubles, overlaps)
}

// vipHolder names what holds the shape's VIP: roled or hapair-lb, or the
// peer.
func (l *Lab) vipHolder(shape vipShape) string {
	switch {
	case l.Opt.VIPPeer != "":
		return l.Opt.VIPPeer
	case shape.addr == LBVIPAddr:
		return BinLB
	}
	return "roled"
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
	url                 string // .../write, through the VIP
	mu                  sync.Mutex
	ok, failed          int
	firstFail, lastFail time.Time
	byNode              map[string]int
	oks                 []vipOK
}

// vipOK is one acknowledged write: when it was sent, which node answered.
type vipOK struct {
	sent time.Time
	node string
}

func (w *vipWriter) run(ctx context.Context, l *Lab) {
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
		sent := time.Now()
		err := l.getJSON(Client, fmt.Sprintf("%s?id=%d", w.url, id), time.Second, &res)
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		if err == nil && res.Error == "" {
			w.ok++
			w.byNode[res.Node]++
			w.oks = append(w.oks, vipOK{sent, res.Node})
		} else {
			w.failed++
			now := time.Now()
			if w.firstFail.IsZero() {
				w.firstFail = now
			}
			w.lastFail = now
		}
		w.mu.Unlock()
	}
}

// firstOK is the send time of the first write node acknowledged that was
// sent after t0.
func (w *vipWriter) firstOK(node string, t0 time.Time) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, o := range w.oks {
		if o.node == node && o.sent.After(t0) {
			return o.sent, true
		}
	}
	return time.Time{}, false
}

// VIPRoledPaused (issue 20): SIGSTOP of the ACTIVE node's roled for longer
// than its lease (5 s). While it is stopped the kernel drops the VIP before
// roled's local deadline (last keep-alive sent + 5 s − 1 s); nobody else
// takes it (Patroni still names that node: no ACTIVE without it). After
// SIGCONT roled is ACTIVE again and adds it back. With keepalived the
// vrrp_script's check times out instead, and FAULT drops the VIP.
func VIPRoledPaused(ctx context.Context, l *Lab, r *Result) {
	const lease, margin = 5 * time.Second, time.Second // roledConfig's
	active, other, ok := l.vipActive(r)
	if !ok {
		return
	}
	w, ok := startVIPWatch(ctx, l, r, nodesVIP)
	if !ok {
		return
	}
	if !w.heldBy(ctx, active, 30*time.Second) {
		w.stop(l, r)
		r.fail("the VIP is not on the ACTIVE %s", active)
		return
	}
	// The start time of the last reading that found the VIP on the paused
	// node: it was there at some instant after that.
	last := nettest.StartLastSeen(w.hosts[active], w.vip)
	if err := l.Signal(active, ProcRoled, 19); err != nil { // SIGSTOP
		last.Halt()
		w.stop(l, r)
		r.fail("SIGSTOP roled on %s: %v", active, err)
		return
	}
	stopped := time.Now()
	time.Sleep(lease + time.Second) // the pause outlasts the lease (scenario)
	lastSeen := last.Halt()
	_ = l.Signal(active, ProcRoled, 18) // SIGCONT
	resumed := time.Now()
	back := w.heldBy(ctx, active, 30*time.Second)
	backAfter := time.Since(resumed)
	w.stop(l, r)
	r.secs("vip last seen on the paused node after SIGSTOP", lastSeen.Sub(stopped))
	if back {
		r.secs("vip back after SIGCONT", backAfter)
	} else {
		r.fail("the VIP did not come back on %s after SIGCONT", active)
	}
	if !lastSeen.Before(stopped.Add(lease - margin)) {
		r.fail("the VIP was on the stopped %s %s after SIGSTOP, past its deadline (< %s)", active, lastSeen.Sub(stopped), lease-margin)
	}
	if w.seen[other] != 0 {
		r.fail("the VIP on %s (%d readings) while Patroni named %s", other, w.seen[other], active)
	}
}

// vipActive finds the ACTIVE node and the other one, asked from the client.
func (l *Lab) vipActive(r *Result) (active, other string, ok bool) {
	for _, h := range DataNodes {
		if l.httpCode(Client, fmt.Sprintf("http://%s:%d/ha-health", IP(h), RoledPort), 2*time.Second) == 200 {
			active = h
		} else {
			other = h
		}
	}
	if active == "" || other == "" {
		r.fail("want one ACTIVE node, got %q", active)
		return "", "", false
	}
	return active, other, true
}

// counts are the failed writes and double-answer ARP rounds so far: one
// fault's own are the difference across it.
func (w *vipWatch) counts() (failed, doubles int) {
	w.wr.mu.Lock()
	failed = w.wr.failed
	w.wr.mu.Unlock()
	_, _, doubles, _ = w.arp.Snapshot()
	return failed, doubles
}

// faultFigures reports one fault's failed writes and double-answer rounds
// (since counts gave f0, d0), so that repeated faults print medians and
// ranges.
func (w *vipWatch) faultFigures(r *Result, name string, f0, d0 int) {
	f, d := w.counts()
	r.fig(name+": failed writes through the VIP", float64(f-f0), "requests")
	r.fig(name+": double-answer ARP rounds", float64(d-d0), "rounds")
}

// firstWrite reports the first write through the VIP that node
// acknowledged after t0 (waiting up to 30 s for one).
func (w *vipWatch) firstWrite(ctx context.Context, r *Result, name, node string, t0 time.Time) {
	if !poll(ctx, 30*time.Second, 20*time.Millisecond, func() bool { _, ok := w.wr.firstOK(node, t0); return ok }) {
		r.fail("%s: no write through the VIP acknowledged by %s within 30 s of its takeover", name, node)
		return
	}
	first, _ := w.wr.firstOK(node, t0)
	r.secs(name+": first write through the VIP after", first.Sub(t0))
}

// lastAnswer is when host last answered an ARP request for the VIP from
// the client (zero: not after t0).
func (w *vipWatch) lastAnswer(host string, t0 time.Time) time.Time {
	if a := w.arp.LastAnswer(w.hosts[host].MAC.String()); a.After(t0) {
		return a
	}
	return time.Time{}
}

// heldBy waits until the VIP is on host's interface.
func (w *vipWatch) heldBy(ctx context.Context, host string, timeout time.Duration) bool {
	return poll(ctx, timeout, 2*time.Millisecond, func() bool { ok, _ := w.hosts[host].Has(w.vip); return ok })
}

// vipFaults runs fault Repeat times on the node holding the VIP, with the
// checkers running, and after each waits until the other node is primary
// and the faulted one a ready standby again. fault returns false when it
// has failed r and the scenario stops.
func vipFaults(ctx context.Context, l *Lab, r *Result, what string, fault func(w *vipWatch, active, other string) bool) {
	if !needParts(l, r, BinRoled) {
		return
	}
	w, ok := startVIPWatch(ctx, l, r, nodesVIP)
	if !ok {
		return
	}
	defer w.stop(l, r)
	for range max(l.Opt.Repeat, 1) {
		active, other, ok := l.vipActive(r)
		if !ok || !w.heldBy(ctx, active, 30*time.Second) {
			r.fail("the VIP is not on the ACTIVE node %q before the %s", active, what)
			return
		}
		if !fault(w, active, other) {
			return
		}
		if err := l.WaitSettled(ctx, other, 120*time.Second); err != nil {
			r.fail("not settled after the %s of %s: %v", what, active, err)
			return
		}
		if err := l.Ctl().WaitStandbyReady(ctx, active, io.Discard); err != nil {
			r.fail("%s not ready as a standby after the %s: %v", active, what, err)
			return
		}
	}
}

// VIPKill (issue 20): the ACTIVE node dies (kill -9 of everything on it and
// its cable pulled: a dead host answers no ARP), Repeat times, each time the
// node holding the VIP. Figures: the VIP on the survivor after the kill,
// the first write acknowledged through the VIP after it, failed writes, and
// whether the dead node's interface still had the VIP when the survivor
// took it (roled's kernel lifetime removes it; a killed keepalived leaves
// it). The node comes back as a rebooted host would: without the VIP.
func VIPKill(ctx context.Context, l *Lab, r *Result) {
	vipFaults(ctx, l, r, "kill", func(w *vipWatch, active, other string) bool {
		f0, d0 := w.counts()
		t0 := time.Now()
		err := l.KillNode(active)
		if err == nil {
			err = l.Net.SetLink(active, false)
		}
		if err != nil {
			r.fail("kill %s: %v", active, err)
			return false
		}
		if !w.heldBy(ctx, other, 90*time.Second) {
			r.fail("the VIP not on %s within 90 s of the kill", other)
			return false
		}
		moved := time.Since(t0)
		stale, _ := w.hosts[active].Has(w.vip)
		r.secs("vip kill: VIP on the survivor after", moved)
		r.note("vip kill of %s: the dead node's interface still had the VIP at the takeover: %v", active, stale)
		if stale && l.Opt.VIPPeer == "" {
			r.fail("the killed %s still had the VIP when %s took it (its kernel lifetime should have removed it)", active, other)
		}
		w.firstWrite(ctx, r, "vip kill", other, t0)
		w.faultFigures(r, "vip kill", f0, d0)
		return w.powerOn(l, r, active)
	})
}

// powerOn brings a killed host back as a rebooted one: without the VIP (a
// killed keepalived leaves it on the interface), cable in, its services
// started. false: r failed.
func (w *vipWatch) powerOn(l *Lab, r *Result, host string) bool {
	if stale, _ := w.hosts[host].Has(w.vip); stale {
		_ = l.Net.ipns(host, "addr", "del", w.shape.addr+"/24", "dev", "eth0")
	}
	if err := l.Net.SetLink(host, true); err != nil {
		r.fail("cable of %s: %v", host, err)
		return false
	}
	if err := l.StartNode(host); err != nil {
		r.fail("start %s: %v", host, err)
		return false
	}
	return true
}

// VIPPartition (issue 20): the ACTIVE node is cut off from the other node
// and the witness (the client still reaches it, and ARP is not filtered),
// Repeat times. It must drop the VIP before the other node adds it.
// Figures: the VIP last seen on the isolated node, the VIP on the other
// node, both after the cut; failed writes. Healed after the takeover.
func VIPPartition(ctx context.Context, l *Lab, r *Result) {
	vipFaults(ctx, l, r, "partition", func(w *vipWatch, active, other string) bool {
		last := nettest.StartLastSeen(w.hosts[active], w.vip)
		f0, d0 := w.counts()
		t0 := time.Now()
		if err := l.Net.Partition(active, other, Witness); err != nil {
			last.Halt()
			r.fail("partition: %v", err)
			return false
		}
		held := w.heldBy(ctx, other, 90*time.Second)
		moved := time.Since(t0)
		lastSeen := last.Halt()
		if err := l.Net.Heal(active); err != nil {
			r.fail("heal: %v", err)
			return false
		}
		if !held {
			r.fail("the VIP not on %s within 90 s of the partition", other)
			return false
		}
		w.handoff(ctx, l, r, handoff{"vip partition", "isolated node", "other node", active, other, other, t0, lastSeen, moved})
		w.faultFigures(r, "vip partition", f0, d0)
		return true
	})
}

// handoff is one fault's move of the VIP from the faulted host to the
// other: t0 the fault, lastSeen the start of the last reading that found
// the VIP on the faulted host (zero: none after t0), moved the VIP's
// arrival on the other host after t0. writer is the node whose app
// answers writes after the move.
type handoff struct {
	name, faultedIs, otherIs string // figure names: "<name>: VIP last seen on the <faultedIs> after"
	faulted, other, writer   string
	t0, lastSeen             time.Time
	moved                    time.Duration
}

// handoff reports h's figures and the first write after it; with hapair
// holding the VIP, the faulted host still holding it when the other took
// it fails the scenario.
func (w *vipWatch) handoff(ctx context.Context, l *Lab, r *Result, h handoff) {
	if !h.lastSeen.IsZero() {
		r.secs(h.name+": VIP last seen on the "+h.faultedIs+" after", h.lastSeen.Sub(h.t0))
	}
	r.secs(h.name+": VIP on the "+h.otherIs+" after", h.moved)
	if !h.lastSeen.Before(h.t0.Add(h.moved)) && l.Opt.VIPPeer == "" {
		r.fail("the %s %s still had the VIP when %s took it", h.faultedIs, h.faulted, h.other)
	}
	w.firstWrite(ctx, r, h.name, h.writer, h.t0)
}
