package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hapair/hapair/ctl"
	"github.com/hapair/hapair/roled"
)

// needParts marks r skipped when a part the scenario needs was not built.
func needParts(l *Lab, r *Result, bins ...string) bool {
	for _, b := range bins {
		if l.Bin(b) == "" {
			r.Skipped = b + " not built"
			r.note("needs %s, which did not build: skipped", b)
			return false
		}
	}
	return true
}

// Bootstrap (1): nodea primary + ACTIVE, nodeb replica + PASSIVE, a file
// written through the lb on nodea reaches nodeb, status shows all of it.
func Bootstrap(ctx context.Context, l *Lab, r *Result) {
	c := l.Ctl()
	st := c.Status(ctx)
	var buf bytes.Buffer
	_ = st.WriteTable(&buf)
	r.note("hapairctl status:\n%s", buf.String())
	healthy := 0
	for _, m := range st.Etcd {
		if m.Healthy {
			healthy++
		}
	}
	if healthy != 3 {
		r.fail("etcd: %d healthy members, want 3 (%s)", healthy, st.EtcdErr)
	}
	if len(st.Patroni) != 2 {
		r.fail("patroni: %d members, want 2", len(st.Patroni))
	}
	if l.Bin(BinRoled) != "" {
		for _, n := range st.Roled {
			want := map[string]string{NodeA: "active", NodeB: "passive"}[n.Node]
			if n.Role != want {
				r.fail("roled %s: role %q, want %q", n.Node, n.Role, want)
			}
		}
	}
	if l.Bin(BinLB) == "" {
		r.note("hapair-lb missing: no write through the balancer")
		return
	}
	if s := st.Serving("app"); len(s) != 1 || s[0] != NodeA {
		r.fail("balancer serves %v, want [nodea]", s)
	}
	p := c.NewProbe(time.Second)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	p.Run(pctx)
	cancel()
	samples := p.Samples()
	if len(samples) != 1 || !samples[0].OK || samples[0].Node != NodeA {
		r.fail("write through the lb: %+v", samples)
		return
	}
	id := samples[0].ID
	t0 := time.Now()
	ok := poll(ctx, 15*time.Second, 20*time.Millisecond, func() bool { return l.FileNode(NodeB, id) == NodeA })
	if !ok {
		r.fail("file w/%d.txt written on nodea did not reach nodeb within 15s (syncdir in roled?)", id)
		return
	}
	r.secs("file written through lb visible on nodeb after", time.Since(t0))
	writeLatency(ctx, l, r, "lab rate (50 ms)", 50*time.Millisecond, 10*time.Second)
	writeLatency(ctx, l, r, "10x rate (5 ms)", 5*time.Millisecond, 5*time.Second)
}

// writeLatency probes writes through the balancer at one write per every
// for d and reports p50/p99 of the acknowledged ones (durability sync waits
// for the standby on each commit: its cost shows here, beside async).
func writeLatency(ctx context.Context, l *Lab, r *Result, label string, every, d time.Duration) {
	p := l.Ctl().NewProbe(every)
	pctx, cancel := context.WithTimeout(ctx, d)
	p.Run(pctx)
	cancel()
	var lat []time.Duration
	failed := 0
	for _, s := range p.Samples() {
		if s.OK {
			lat = append(lat, s.End.Sub(s.Start))
		} else {
			failed++
		}
	}
	if len(lat) == 0 {
		r.fail("write latency at %s: no acknowledged write", label)
		return
	}
	slices.Sort(lat)
	q := func(f float64) time.Duration { return lat[min(len(lat)-1, int(f*float64(len(lat))))] }
	name := fmt.Sprintf("write latency through lb, durability %s, %s", l.Opt.Durability, label)
	r.fig(name+": p50", float64(q(0.50).Microseconds())/1000, "ms")
	r.fig(name+": p99", float64(q(0.99).Microseconds())/1000, "ms")
	r.note("%s: %d writes acknowledged, %d failed", name, len(lat), failed)
}

// Switchovers (2): A→B and B→A through hapairctl's switchover, with the
// balancer's hold on, then off.
func Switchovers(ctx context.Context, l *Lab, r *Result) {
	if !needParts(l, r, BinLB) {
		return
	}
	for _, hold := range []string{"5s", "0s"} {
		if err := l.SetHold(ctx, hold); err != nil {
			r.fail("hold %s: %v", hold, err)
			continue
		}
		label := "hold on"
		if hold == "0s" {
			label = "hold off"
		}
		for range l.Opt.Repeat {
			for _, to := range []string{NodeB, NodeA} {
				switchoverOnce(ctx, l, r, label, to)
			}
		}
	}
	_ = l.SetHold(ctx, "5s")
}

// steady: the last n writes succeeded, each within limit.
func steady(samples []ctl.Sample, n int, limit time.Duration) bool {
	if len(samples) < n {
		return false
	}
	for _, s := range samples[len(samples)-n:] {
		if !s.OK || s.End.Sub(s.Start) > limit {
			return false
		}
	}
	return true
}

func switchoverOnce(ctx context.Context, l *Lab, r *Result, label, to string) {
	if err := l.Ctl().WaitStandbyReady(ctx, to, l.Out); err != nil {
		r.fail("switchover -> %s (%s): target never ready: %v", to, label, err)
		return
	}
	pr, stop := l.startProbes(ctx, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // writes before the switchover
	// A fresh lab's first writes open cold database connections and create
	// the table (0.35-0.53 s each, seen in the lab); requests queued behind
	// them (max-conns) would count that as switchover wait. Switch over
	// once the app serves writes in its steady state.
	if !poll(ctx, 10*time.Second, 20*time.Millisecond, func() bool { return steady(pr.probe.Samples(), 4, 100*time.Millisecond) }) {
		r.note("switchover -> %s (%s): writes not steady before the switchover", to, label)
	}
	t0 := time.Now()
	c := l.Ctl()
	res, err := c.Switchover(ctx, to, l.Out)
	if err == nil {
		err = l.WaitSettled(ctx, to, 30*time.Second)
	}
	time.Sleep(time.Second) // writes after it
	stop()
	name := fmt.Sprintf("switchover -> %s (%s)", to, label)
	if err != nil {
		r.fail("%s: %v", name, err)
		return
	}
	rep := ctl.Analyze(pr.probe.Samples(), t0)
	r.note("%s: %s", name, rep)
	if os.Getenv("HAPAIR_LAB_SAMPLES") != "" { // post-mortem: every write, with the steps above
		var b strings.Builder
		ctl.WriteSamples(&b, pr.probe.Samples(), t0)
		r.note("%s: samples\n%s", name, b.String())
	}
	r.fig(name+": failed writes", float64(rep.Failed), "")
	outageFigures(r, name, rep)
	r.secs(name+": max wait", rep.MaxWait)
	r.secs(name+": Patroni REST returned", res.PatroniDone)
	r.secs(name+": redundant again (old primary streaming)", res.Redundant)
	followFigures(r, pr, rep, name, to, t0)
	if pgOK, ok := pr.pg.FirstOK(to, t0); ok && label == "hold on" {
		// The part of the longest wait that is not Patroni's: the new
		// PostgreSQL's first write counted from the switchover request is
		// Patroni's own time (plus up to one probe interval).
		r.secs(name+": max wait beyond new PG writable", rep.MaxWait-pgOK.Sub(t0))
	}
	if dual, _ := pr.ha.Dual(); dual > 0 {
		r.fail("%s: checker saw two ACTIVE nodes in %d rounds", name, dual)
	}
	if label == "hold on" && rep.Failed > 0 {
		r.note("%s: %d failed writes with hold on (goal 0)", name, rep.Failed)
	}
}

// DrillBoth (3): hapairctl drill, both directions; the returning node is
// replica + PASSIVE and no file written on the new ACTIVE is overwritten.
func DrillBoth(ctx context.Context, l *Lab, r *Result) {
	if !needParts(l, r, BinLB) {
		return
	}
	c := l.Ctl()
	pg := l.NewPGChecker(50 * time.Millisecond)
	// A second writer through the balancer, for the audit of acknowledged
	// rows after the kills (the drill's own probe keeps no samples).
	audit := c.NewProbe(50 * time.Millisecond)
	pctx, stopPG := context.WithCancel(ctx)
	pgDone := make(chan struct{}, 2)
	go func() { pg.Run(pctx); pgDone <- struct{}{} }()
	go func() { audit.Run(pctx); pgDone <- struct{}{} }()
	var buf bytes.Buffer
	var phases []ctl.DrillPhase
	var err error
	for range l.Opt.Repeat {
		var ph []ctl.DrillPhase
		ph, err = c.Drill(ctx, io.MultiWriter(&buf, l.Out))
		phases = append(phases, ph...)
		if err != nil {
			break
		}
	}
	stopPG()
	<-pgDone
	<-pgDone
	ctl.WriteDrillReport(&buf, phases)
	r.note("drill:\n%s", buf.String())
	if err != nil {
		r.fail("drill: %v", err)
	}
	for _, p := range phases {
		name := "drill, " + p.Victim + " lost"
		r.secs(name+": Patroni leader on survivor", p.PatroniLeader)
		r.secs(name+": survivor ACTIVE", p.RoledActive)
		r.secs(name+": first write through lb", p.FirstWrite)
		r.fig(name+": failed writes", float64(p.Probe.Failed), "")
		outageFigures(r, name, p.Probe)
		r.secs(name+": rejoined as replica+PASSIVE", p.Rejoined)
		if t, ok := pg.FirstOK(p.Survivor, p.Started); ok && p.FirstWrite > 0 {
			r.secs(name+": survivor PG accepts writes", t.Sub(p.Started))
			r.secs(name+": lb routing after new PG writable", p.LBServing-t.Sub(p.Started))
		}
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		r.fail("no leader after the drill: %v", err)
		return
	}
	if a, err := l.AuditSettled(ctx, leader, audit.Samples(), 30*time.Second); err == nil {
		r.note("drill audit: %s", a)
		r.fig("drill: acknowledged rows lost (lb, both kills)", float64(len(a.LostRows)), "")
		syncLoses(l, r, "drill", len(a.LostRows))
	} else {
		r.note("drill audit: %v", err)
	}
	// Sync settles: the ACTIVE's sender has caught up (nothing queued).
	if n, ok := c.Cfg.Node(leader); ok && n.RoledURL != "" {
		if !poll(ctx, 30*time.Second, 50*time.Millisecond, func() bool {
			r := c.Roled(ctx, n)
			return r.Role == "active" && r.Sync.Sending && r.Sync.QueueDepth == 0 && r.Sync.LagSeconds == 0
		}) {
			r.note("drill: file sync on %s not caught up within 30s", leader)
		}
	}
	// Files written since the drill began must be those of the node that
	// acknowledged them, on the current ACTIVE.
	overwritten := 0
	for _, h := range DataNodes {
		overwritten += l.staleFiles(h)
	}
	if overwritten > 0 {
		r.fail("%d files on the ACTIVE %s carry another node's content than the one that wrote them", overwritten, leader)
	}
}

// DrillsBackToBack (9): a planned switchover, then at once three drills, six
// phases (B, A, B, A, B, A lost in turn), as an operator following "switch
// off node A, check B takes over, bring A back, then the other way" would.
// Each phase waits for a ready standby, so none starts on a pair that is not
// redundant (the lab's drill once killed the new primary while the returned
// node was still rewinding, and lost the cluster); the service comes back
// after every phase, and no acknowledged write is lost beyond what an
// asynchronous kill may cost.
func DrillsBackToBack(ctx context.Context, l *Lab, r *Result) {
	if !needParts(l, r, BinLB, BinRoled) {
		return
	}
	// The events already recorded; the scenario's own follow them. Not
	// knowing them would count every earlier scenario's as this one's.
	before, err := l.Ctl().History(ctx)
	if err != nil {
		r.fail("hapairctl history before the drills: %v", err)
		return
	}
	pr, stop := l.startProbes(ctx, 10*time.Millisecond)
	var buf bytes.Buffer
	out := io.MultiWriter(&buf, l.Out)
	var phases []ctl.DrillPhase
	res, err := l.Switchover(ctx, NodeB, out)
	if err != nil {
		stop()
		r.fail("switchover before the drills: %v", err)
		return
	}
	r.secs("switchover: redundant again (old primary streaming)", res.Redundant)
	c := l.Ctl()
	for range 3 {
		var ph []ctl.DrillPhase
		ph, err = c.Drill(ctx, out)
		phases = append(phases, ph...)
		if err != nil {
			break
		}
	}
	stop()
	ctl.WriteDrillReport(&buf, phases)
	r.note("drills:\n%s", buf.String())
	if err != nil {
		r.fail("drill: %v", err)
	}
	if len(phases) != 6 {
		r.fail("%d drill phases ran, want 6", len(phases))
	}
	for i, p := range phases {
		name := fmt.Sprintf("phase %d, %s lost", i+1, p.Victim)
		r.secs(name+": first write through lb", p.FirstWrite)
		r.secs(name+": time to redundancy (start → ready)", p.Rejoined)
		r.fig(name+": failed writes", float64(p.Probe.Failed), "")
	}
	if dual, rounds := pr.ha.Dual(); dual > 0 {
		r.fail("checker saw two ACTIVE nodes in %d of %d rounds", dual, rounds)
	}
	leader, lerr := c.Leader(ctx)
	if lerr != nil {
		r.fail("no leader after the drills: %v", lerr)
		return
	}
	if err := l.WaitSettled(ctx, leader, 90*time.Second); err != nil {
		r.fail("not settled after the drills: %v", err)
	}
	a, aerr := l.AuditSettled(ctx, leader, pr.probe.Samples(), 30*time.Second)
	if aerr != nil {
		r.fail("audit could not run: %v", aerr) // unknown is not "0 lost"
		return
	}
	r.note("audit: %s", a)
	r.fig("acknowledged rows lost", float64(len(a.LostRows)), "")
	// Asynchronous replication may lose the last few ms of writes on each
	// kill (a handful at the lab's 20 writes/s); killing the only
	// up-to-date node loses seconds of them (188 when the drill did).
	if len(a.LostRows) > 3*len(phases) {
		r.fail("%d acknowledged rows lost over %d kills", len(a.LostRows), len(phases))
	}
	if len(a.LostFiles) > 0 || len(a.Overwritten) > 0 {
		r.fail("%d acknowledged files silently lost, %d overwritten", len(a.LostFiles), len(a.Overwritten))
	}
	// The new ACTIVE's roled recorded every role change: the switchover,
	// then a failover per kill, each with its figures once they are in.
	evs, herr := historySettled(ctx, l, len(before), 1+len(phases), 120*time.Second)
	if herr != nil {
		r.fail("hapairctl history: %v", herr)
		return
	}
	var hb bytes.Buffer
	_ = ctl.WriteHistory(&hb, evs)
	r.note("hapairctl history:\n%s", hb.String())
	added := evs[min(len(before), len(evs)):]
	var kinds []string
	for _, e := range added {
		kinds = append(kinds, string(e.Kind))
	}
	if want := 1 + len(phases); len(added) != want || (len(added) > 0 && added[0].Kind != roled.KindSwitchover) {
		r.fail("history recorded %v, want a switchover and %d failovers", kinds, len(phases))
	}
	for i, e := range added {
		if i > 0 && e.Kind != roled.KindFailover {
			r.fail("history recorded %v, want a failover for each kill", kinds)
			break
		}
		name := fmt.Sprintf("history %d, %s %s → %s", i, e.Kind, e.From, e.To)
		r.secs(name+": no ACTIVE for", time.Duration(e.GapSeconds*float64(time.Second)))
		if e.WALLostBytes == nil {
			r.fail("%s: WAL lost not known (%s: %s)", name, e.WAL.Basis, e.WAL.Note)
		} else {
			r.fig(name+": WAL lost", float64(*e.WALLostBytes), "B")
		}
		if e.QuarantinedFiles == nil {
			r.fail("%s: files quarantined not recorded", name)
		} else {
			r.fig(name+": files quarantined", float64(*e.QuarantinedFiles), "")
		}
		if e.Redundancy != roled.RedundancyReached || e.StandbyRecovery == nil {
			r.fail("%s: not redundant in the history (%s: %s)", name, e.Redundancy, e.RedundancyNote)
			continue
		}
		r.secs(name+": time to redundancy (served → standby ready)", time.Duration(e.RedundancySeconds*float64(time.Second)))
		sr := e.StandbyRecovery
		r.secs(name+": standby recovery (roled start or not ready → ready)", time.Duration(sr.Seconds*float64(time.Second)))
		for _, ph := range []struct {
			n string
			v float64
		}{{"start", sr.Phases.Start}, {"rewind", sr.Phases.Rewind}, {"WAL catch-up", sr.Phases.WALCatchup},
			{"file sync", sr.Phases.FileSync}, {"waiting", sr.Phases.Waiting}} {
			r.secs(name+": standby "+ph.n, time.Duration(ph.v*float64(time.Second)))
		}
	}
}

// historySettled reads the history until the events after the first skip
// number want and none of them waits for its figures (a ready standby, the
// WAL loss), within timeout; then it returns what it has.
func historySettled(ctx context.Context, l *Lab, skip, want int, timeout time.Duration) ([]roled.HistoryEvent, error) {
	var evs []roled.HistoryEvent
	var err error
	poll(ctx, timeout, 500*time.Millisecond, func() bool {
		evs, err = l.Ctl().History(ctx)
		if err != nil || len(evs) < skip+want {
			return false
		}
		for _, e := range evs[skip:] {
			if e.Redundancy == roled.RedundancyWaiting || e.WAL.Basis == roled.WALPending {
				return false
			}
		}
		return true
	})
	return evs, err
}

// staleFiles counts files whose content names a node that is not the one the
// database row says wrote it (checked against the current primary's table).
func (l *Lab) staleFiles(host string) int {
	leader := ""
	for _, h := range DataNodes {
		if l.httpCode(Client, fmt.Sprintf("http://%s:%d/primary", IP(h), PatroniPort), time.Second) == 200 {
			leader = h
		}
	}
	if leader == "" {
		return 0
	}
	rows, err := l.Rows(context.Background(), leader)
	if err != nil {
		return 0
	}
	n := 0
	for id, node := range rows {
		if fn := l.FileNode(host, id); fn != "" && fn != node {
			n++
		}
	}
	return n
}

// WitnessLost (4): the witness dies; no role change, writes keep working;
// it comes back and rejoins.
func WitnessLost(ctx context.Context, l *Lab, r *Result) {
	if !needParts(l, r, BinLB) {
		return
	}
	c := l.Ctl()
	before := c.Roled(ctx, c.Cfg.Nodes[0])
	pr, stop := l.startProbes(ctx, 10*time.Millisecond)
	t0 := time.Now()
	if err := l.KillNode(Witness); err != nil {
		r.fail("kill witness: %v", err)
	}
	time.Sleep(8 * time.Second) // writes without the witness, longer than the lease TTL
	if err := l.StartNode(Witness); err != nil {
		r.fail("start witness: %v", err)
	}
	back := time.Now()
	if !poll(ctx, 30*time.Second, 100*time.Millisecond, l.etcdHealthy) {
		r.fail("witness did not rejoin within 30s")
	} else {
		r.secs("witness rejoined (etcd healthy) after restart", time.Since(back))
	}
	time.Sleep(time.Second)
	stop()
	rep := ctl.Analyze(pr.probe.Samples(), t0)
	r.note("witness lost: %s", rep)
	r.fig("witness lost: failed writes", float64(rep.Failed), "")
	if rep.Failed > 0 {
		r.fail("%d writes failed while the witness was down", rep.Failed)
	}
	after := c.Roled(ctx, c.Cfg.Nodes[0])
	if l.Bin(BinRoled) != "" && (after.Role != "active" || after.Epoch != before.Epoch) {
		r.fail("role changed: nodea %s epoch %d → %s epoch %d", before.Role, before.Epoch, after.Role, after.Epoch)
	}
}

// partitionRun cuts nodea (the primary) off from nodeb and the witness,
// holds hold, heals, and returns the probe run.
func partitionRun(ctx context.Context, l *Lab, r *Result, hold time.Duration) (*probeRun, time.Time, time.Time) {
	pr, stop := l.startProbes(ctx, 10*time.Millisecond)
	pr.dualBefore, _ = l.lbDualActive("app")
	pr.pgDualBefore, _ = l.lbDualActive("pg-primary")
	time.Sleep(500 * time.Millisecond)
	t0 := time.Now()
	l.logf("partition nodea from nodeb and witness")
	if err := l.Net.Partition(NodeA, NodeB, Witness); err != nil {
		r.fail("partition: %v", err)
	}
	// Figures are timed from t0, before the command: this is how much of
	// each is the command itself (the rules commit just before it returns).
	r.secs("partition: cut command returned after", time.Since(t0))
	// nodeb must take over while nodea is cut off.
	ok := poll(ctx, hold, 50*time.Millisecond, func() bool {
		_, ok := pr.ha.First(NodeB, "active", t0)
		return ok
	})
	if !ok {
		r.fail("nodeb not ACTIVE within %s of the partition", hold)
	}
	time.Sleep(2 * time.Second)
	heal := time.Now()
	l.logf("heal nodea")
	if err := l.Net.Heal(NodeA); err != nil {
		r.fail("heal: %v", err)
	}
	// Let the aftermath play out (LAB.md §6: the takeover came ~10 s after heal).
	time.Sleep(15 * time.Second)
	stop()
	return pr, t0, heal
}

func reportPartition(l *Lab, r *Result, pr *probeRun, t0 time.Time) {
	rep := ctl.Analyze(pr.probe.Samples(), t0)
	r.note("partition: %s", rep)
	if dual, rounds := pr.ha.Dual(); dual > 0 {
		r.fail("independent checker saw two ACTIVE nodes in %d of %d rounds (10 ms)", dual, rounds)
	} else {
		r.note("independent /ha-health checker from the lb host: 0 dual-ACTIVE rounds of %d", rounds)
	}
	if v, err := l.lbDualActive("app"); err == nil && v > pr.dualBefore {
		r.fail("hapair_lb_dual_active_total{backend=app} rose by %v", v-pr.dualBefore)
	} else if err == nil {
		r.note("balancer: hapair_lb_dual_active_total{backend=app} unchanged (%v)", v)
	}
	if v, err := l.lbDualActive("pg-primary"); err == nil && v > pr.pgDualBefore {
		r.note("balancer saw two Patroni /primary 200 at once (pg-primary dual claims +%v): Patroni's /primary is not a fence", v-pr.pgDualBefore)
	}
	aPassive, okA := pr.ha.First(NodeA, "passive", t0)
	if !okA {
		aPassive, okA = pr.ha.First(NodeA, "unreachable", t0)
	}
	bActive, okB := pr.ha.First(NodeB, "active", t0)
	if okA {
		r.secs("partition: isolated nodea PASSIVE after", aPassive.Sub(t0))
	}
	if okB {
		r.secs("partition: nodeb ACTIVE after", bActive.Sub(t0))
	}
	if okA && okB && !aPassive.Before(bActive) {
		r.fail("nodeb ACTIVE (%s) before nodea PASSIVE (%s)", bActive.Sub(t0), aPassive.Sub(t0))
	}
	if okB {
		// The loss window itself (issue 19's goal in async mode): the last
		// write the isolated node acknowledged through the balancer before
		// the other node took over.
		var last time.Time
		for _, s := range pr.probe.Samples() {
			if s.OK && s.Node == NodeA && s.End.After(t0) && s.End.Before(bActive) && s.End.After(last) {
				last = s.End
			}
		}
		if !last.IsZero() {
			r.secs("partition: isolated nodea's last write through lb", last.Sub(t0))
		}
	}
	followFigures(r, pr, rep, "partition", NodeB, t0)
	r.fig("partition: failed writes", float64(rep.Failed), "")
	outageFigures(r, "partition", rep)
}

// PartitionDesign (5): Patroni with remote etcd members + use_proxies.
func PartitionDesign(ctx context.Context, l *Lab, r *Result) {
	if !needParts(l, r, BinLB, BinRoled) {
		return
	}
	before, _ := l.Ctl().History(ctx)
	pr, t0, _ := partitionRun(ctx, l, r, 40*time.Second)
	reportPartition(l, r, pr, t0)
	partitionAudit(ctx, l, r, pr, t0)
	historyRedundancy(ctx, l, r, "partition", len(before))
}

// historyRedundancy reports the time to redundancy of the one failover the
// scenario caused, from the new ACTIVE's history (first write served →
// standby ready: roled's own reading, the figure hapairctl history shows).
func historyRedundancy(ctx context.Context, l *Lab, r *Result, name string, skip int) {
	evs, err := historySettled(ctx, l, skip, 1, 120*time.Second)
	if err != nil || len(evs) <= skip {
		r.note("%s: no failover in the history to time redundancy by (%v)", name, err)
		return
	}
	e := evs[len(evs)-1]
	if e.Redundancy != roled.RedundancyReached {
		r.note("%s: history %s %s → %s not redundant (%s: %s)", name, e.Kind, e.From, e.To, e.Redundancy, e.RedundancyNote)
		return
	}
	r.secs(name+": time to redundancy (served → standby ready, history)", time.Duration(e.RedundancySeconds*float64(time.Second)))
}

// syncLoses fails a scenario on a synchronous lab that lost acknowledged
// rows: sync's promise (issue 19) is 0 in every run.
func syncLoses(l *Lab, r *Result, what string, lost int) {
	if roled.Durability(l.Opt.Durability).Synchronous() && lost > 0 {
		r.fail("%s: %d acknowledged rows lost with durability %s (its promise is 0)", what, lost, l.Opt.Durability)
	}
}

// StrictStandbyLost (14, sync-strict labs): the synchronous standby's node
// is killed. With synchronous_mode_strict no commit completes without it:
// the commit canary reports hung commits and roled turns the primary PASSIVE
// with reason postgres_commits_hung (503: the balancer holds or refuses
// instead of piling requests onto commits that hang); once the standby is
// back, commits complete and the primary is ACTIVE again by itself. No
// acknowledged write may be lost, no two ACTIVE.
func StrictStandbyLost(ctx context.Context, l *Lab, r *Result) {
	if !needParts(l, r, BinLB, BinRoled) {
		return
	}
	if roled.Durability(l.Opt.Durability) != roled.DurabilitySyncStrict {
		r.Skipped = "needs durability sync-strict"
		return
	}
	primary, err := l.Ctl().Leader(ctx)
	if err != nil {
		r.fail("no leader: %v", err)
		return
	}
	standby := Other(primary)
	reason := func() string {
		var st struct{ Reason string }
		_ = l.getJSON(Client, "http://"+IP(primary)+":7400/role", time.Second, &st)
		return st.Reason
	}
	pr, stop := l.startProbes(ctx, 10*time.Millisecond)
	defer stop()
	t0 := time.Now()
	if err := l.KillNode(standby); err != nil {
		r.fail("kill %s: %v", standby, err)
		return
	}
	// The canary's bound: interval 500 ms + hang-after 2 s, then one poll.
	if !poll(ctx, 30*time.Second, 100*time.Millisecond, func() bool { return reason() == string(roled.ReasonCommitsHung) }) {
		r.fail("%s not PASSIVE with reason %s within 30 s of the standby's kill (reason %q)", primary, roled.ReasonCommitsHung, reason())
	} else {
		r.secs("strict: primary PASSIVE (commits hung) after the standby's kill", time.Since(t0))
	}
	if code := l.httpCode(Client, "http://"+IP(primary)+":7400/ha-health", time.Second); code != 503 {
		r.fail("%s /ha-health %d while its commits hang, want 503", primary, code)
	}
	// The standby stays away for a while: what users see meanwhile.
	time.Sleep(10 * time.Second)
	t1 := time.Now()
	if err := l.StartNode(standby); err != nil {
		r.fail("start %s: %v", standby, err)
		return
	}
	if err := l.WaitSettled(ctx, primary, 90*time.Second); err != nil {
		r.fail("after the standby's start: %v", err)
		return
	}
	r.secs("strict: primary ACTIVE again after the standby's start", time.Since(t1))
	stop()
	rep := ctl.Analyze(pr.probe.Samples(), t0)
	r.note("strict standby lost: %s", rep)
	r.fig("strict: failed writes through the lb", float64(rep.Failed), "")
	if dual, _ := pr.ha.Dual(); dual > 0 {
		r.fail("checker saw two ACTIVE nodes in %d rounds", dual)
	}
	a, err := l.AuditSettled(ctx, primary, pr.probe.Samples(), 30*time.Second)
	if err != nil {
		r.fail("audit could not run: %v", err)
		return
	}
	r.note("audit: %s", a)
	r.fig("strict: acknowledged rows lost (lb)", float64(len(a.LostRows)), "")
	syncLoses(l, r, "strict standby lost", len(a.LostRows))
}

// PartitionDefaultHosts (6): Patroni 3.0.2 with all three etcd members: the
// old primary takes the leader key back after the heal (LAB.md §6); roled's
// takeover guard must keep users away from it and raise the alarm.
func PartitionDefaultHosts(ctx context.Context, l *Lab, r *Result) {
	if !needParts(l, r, BinLB, BinRoled) {
		return
	}
	c := l.Ctl()
	bLog := l.logSize(NodeB, ProcPatroni)
	pr, t0, heal := partitionRun(ctx, l, r, 40*time.Second)
	reportPartition(l, r, pr, t0)
	st := c.Status(ctx)
	var buf bytes.Buffer
	_ = st.WriteTable(&buf)
	r.note("status after the heal:\n%s", buf.String())
	if st.Leader != nil {
		r.note("Patroni: leader key now %s (create_rev %d, version %d)", st.Leader.Member, st.Leader.CreateRevision, st.Leader.Version)
		if st.Leader.Version > 1 {
			r.note("Patroni 3.0.2 overwrote the leader key without re-creating it (the takeover)")
		}
	}
	bFirst, _ := pr.ha.First(NodeB, "active", t0)
	for _, s := range pr.probe.Samples() {
		if s.OK && s.Node == NodeA && !bFirst.IsZero() && s.Start.After(bFirst) {
			r.fail("write %d went to nodea through the lb at %s after nodeb took over", s.ID, s.Start.Sub(t0))
			break
		}
	}
	took := st.Leader != nil && st.Leader.Member == NodeA && st.Leader.Version > 1
	if took {
		held, auto := alarmState(st.Alarms)
		switch {
		case len(st.Alarms) == 0:
			r.fail("Patroni took the key back but no takeover alarm is raised")
		case auto:
			r.note("hapair: takeover alarm raised and acknowledged by roled itself (no other node ACTIVE since nodea was)")
		default:
			r.note("hapair: takeover alarm raised (%d key(s)); held for a person (README: keep the other node's data, or `hapairctl ack` to keep the taker's)", len(st.Alarms))
		}
		for _, n := range st.Roled {
			if n.Node == NodeA && n.Role == "active" && held {
				r.fail("nodea ACTIVE after taking the leader key over, its alarm not acknowledged")
			}
		}
	} else {
		r.note("Patroni did not take the key back in this run (heal at %s)", heal.Sub(t0))
	}
	if held, _ := alarmState(st.Alarms); held {
		rewindHeld(l, r, NodeB, bLog)
		// nodeb was ACTIVE after nodea and nodea (PASSIVE and fenced since
		// about a second after the cut) lacks its writes: keep nodeb's
		// data, the README's operator path (an ack would keep nodea's).
		keepOtherAndSettle(ctx, l, r, NodeA, NodeB)
	}
	partitionAudit(ctx, l, r, pr, t0)
}

// partitionAudit counts what a partition of nodea lost once the pair has
// settled, on whichever node leads then: acknowledged balancer rows missing
// there, and the local writer's rows on nodea.
func partitionAudit(ctx context.Context, l *Lab, r *Result, pr *probeRun, t0 time.Time) {
	leader, err := l.Ctl().Leader(ctx)
	if err != nil {
		r.fail("partition: no leader for the audit: %v", err)
		return
	}
	if err := l.WaitSettled(ctx, leader, 90*time.Second); err != nil {
		r.fail("after heal: %v", err)
	}
	t1 := time.Now()
	a, err := l.AuditSettled(ctx, leader, pr.probe.Samples(), 30*time.Second)
	if err != nil {
		r.fail("audit: %v", err)
		return
	}
	r.note("after heal, audit on %s (+%.1fs): %s", leader, time.Since(t1).Seconds(), a)
	r.fig("partition: acknowledged rows lost (lb)", float64(len(a.LostRows)), "")
	syncLoses(l, r, "partition", len(a.LostRows))
	aPassive, _ := pr.ha.First(NodeA, "passive", t0)
	reportLocalWriter(ctx, l, r, "partition", NodeA, leader, t0, aPassive, activeAgain(pr, NodeA, aPassive, t1))
	if len(a.Overwritten) > 0 {
		r.fail("%d files overwritten by the stale node", len(a.Overwritten))
	}
	if len(a.LostFiles) > 0 {
		r.fail("%d acknowledged files neither on %s nor in a quarantine: %v", len(a.LostFiles), leader, a.LostFiles)
	}
}

// rewindHeld checks, while a takeover alarm is held for a person, that the
// node whose leader key was taken has kept its data: its Patroni has run no
// pg_rewind since off (its log offset at the fault), because the taker's
// roled locks Patroni's rewind user out (roled/rewindhold.go).
func rewindHeld(l *Lab, r *Result, other string, off int64) {
	log := l.logFrom(other, ProcPatroni, off)
	ran := strings.Count(log, "running pg_rewind from dbname=")
	refused := strings.Count(log, `"`+"rewind_user"+`" is not permitted to log in`)
	r.fig("takeover held: pg_rewind runs on "+other+" before the ack", float64(ran), "")
	r.note("takeover held: %s's Patroni tried to rewind from the taker %d times and was refused (rewind hold); its data is intact until the ack", other, refused)
	if ran > 0 {
		r.fail("%s's Patroni ran pg_rewind %d times while the takeover alarm was held: the rewind hold did not keep its data", other, ran)
	}
}

// alarmState says whether any takeover alarm still holds a node back
// (unacknowledged) and whether roled acknowledged one itself.
func alarmState(alarms []ctl.Alarm) (held, auto bool) {
	for _, a := range alarms {
		held = held || !a.Acked()
		auto = auto || a.AutoAcked()
	}
	return held, auto
}

// FrozenPatroni (7): SIGSTOP the primary's Patroni for 20 s.
func FrozenPatroni(ctx context.Context, l *Lab, r *Result) {
	if !needParts(l, r, BinLB, BinRoled) {
		return
	}
	pr, stop := l.startProbes(ctx, 10*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	t0 := time.Now()
	bLog := l.logSize(NodeB, ProcPatroni)
	if err := l.Signal(NodeA, ProcPatroni, 19); err != nil { // SIGSTOP
		r.fail("SIGSTOP: %v", err)
	}
	time.Sleep(20 * time.Second)
	cont := time.Now()
	_ = l.Signal(NodeA, ProcPatroni, 18) // SIGCONT
	time.Sleep(10 * time.Second)
	stop()
	probesEnd := time.Now()
	aPassive, ok := pr.ha.First(NodeA, "passive", t0)
	if !ok {
		r.fail("nodea never went PASSIVE while its Patroni was frozen")
	} else {
		r.secs("frozen: nodea PASSIVE after SIGSTOP", aPassive.Sub(t0))
	}
	if bActive, ok := pr.ha.First(NodeB, "active", t0); ok {
		r.secs("frozen: nodeb ACTIVE after", bActive.Sub(t0))
	}
	rep := ctl.Analyze(pr.probe.Samples(), t0)
	followFigures(r, pr, rep, "frozen", NodeB, t0)
	r.note("frozen Patroni: %s", rep)
	// No lb write may land on nodea once roled said PASSIVE (one check interval of grace).
	for _, s := range pr.probe.Samples() {
		if ok && s.OK && s.Node == NodeA && s.Start.After(aPassive.Add(50*time.Millisecond)) && s.Start.Before(cont) {
			r.fail("write %d served by frozen nodea at %s (PASSIVE at %s)", s.ID, s.Start.Sub(t0), aPassive.Sub(t0))
			break
		}
	}
	na, lastA := pr.pg.OKBetween(NodeA, t0, cont)
	nb, _ := pr.pg.OKBetween(NodeB, t0, cont)
	r.note("while frozen, direct write checks accepted: nodea %d (last at %s), nodeb %d", na, lastA.Sub(t0), nb)
	r.fig("frozen: writes through lb served by nodea after SIGSTOP", float64(countNode(pr.probe.Samples(), NodeA, t0, cont)), "")
	r.fig("frozen: writes through lb served by nodeb", float64(countNode(pr.probe.Samples(), NodeB, t0, cont)), "")
	if dual, _ := pr.ha.Dual(); dual > 0 {
		r.fail("checker saw two ACTIVE nodes in %d rounds", dual)
	}
	st := l.Ctl().Status(ctx)
	if st.Leader != nil {
		r.note("after SIGCONT: Patroni leader key %s (create_rev %d, version %d)", st.Leader.Member, st.Leader.CreateRevision, st.Leader.Version)
	}
	if held, auto := alarmState(st.Alarms); held {
		r.note("hapair: takeover alarm raised, no node ACTIVE until acknowledged")
		for _, n := range st.Roled {
			if n.Role == "active" && n.Node == NodeA {
				r.fail("nodea ACTIVE after taking the leader key back")
			}
		}
		rewindHeld(l, r, NodeB, bLog)
		// nodeb served after nodea froze and nodea (PASSIVE and fenced
		// since) wrote nothing it lacks: keep nodeb's data, the path the
		// rewind hold leaves open (README).
		keepOtherAndSettle(ctx, l, r, NodeA, NodeB)
	} else if auto {
		r.note("hapair: takeover alarm raised and acknowledged by roled itself (no other node ACTIVE since nodea was)")
	}
	frozenAudit(ctx, l, r, pr, t0, aPassive, probesEnd)
}

// activeAgain is when node was next ACTIVE after passive, else end.
func activeAgain(pr *probeRun, node string, passive, end time.Time) time.Time {
	if passive.IsZero() {
		return end
	}
	if t, ok := pr.ha.First(node, "active", passive); ok && t.Before(end) {
		return t
	}
	return end
}

// frozenAudit counts what the frozen-Patroni run lost, once the pair has
// settled: acknowledged balancer rows missing on the primary, and the
// local writer's rows on nodea.
// The local writer's window ends at nodea's next ACTIVE or, if the checker
// did not see one, when the probes stopped: an operator's ack after that
// makes nodea ACTIVE legitimately (and it then writes again).
func frozenAudit(ctx context.Context, l *Lab, r *Result, pr *probeRun, t0, aPassive, probesEnd time.Time) {
	leader, err := l.Ctl().Leader(ctx)
	if err != nil {
		r.note("frozen: no leader for the audit: %v", err)
		return
	}
	if err := l.WaitSettled(ctx, leader, 90*time.Second); err != nil {
		r.note("frozen: not settled for the audit: %v", err)
	}
	end := activeAgain(pr, NodeA, aPassive, probesEnd)
	if a, err := l.AuditWrites(ctx, leader, pr.probe.Samples()); err == nil {
		r.note("frozen: audit on %s: %s", leader, a)
		r.fig("frozen: acknowledged rows lost (lb)", float64(len(a.LostRows)), "")
	} else {
		r.note("frozen: audit: %v", err)
	}
	reportLocalWriter(ctx, l, r, "frozen", NodeA, leader, t0, aPassive, end)
}

// keepOtherAndSettle is the operator path that keeps the other node's data
// after a held takeover (Lab.KeepOther), as a scenario step.
func keepOtherAndSettle(ctx context.Context, l *Lab, r *Result, taker, other string) {
	r.note("keeping %s's data: stopping Patroni on %s", other, taker)
	active, redundant, err := l.KeepOther(ctx, taker, other)
	if active > 0 {
		r.secs("keep "+other+": ACTIVE after Patroni stopped on "+taker, active)
	}
	if err != nil {
		r.fail("keep %s: %v", other, err)
		return
	}
	r.secs("keep "+other+": redundant again after Patroni stopped on "+taker, redundant)
}

// KeepOther keeps the other node's data after a held takeover (README, the
// rewind hold): stop Patroni on the taker (it stops its PostgreSQL and
// gives up the leader key), let the other node's Patroni take the key with
// its data intact, start the taker's Patroni again, which rewinds from it.
// The re-created leader key clears the alarm. It returns how long after the
// stop the other node was ACTIVE and the pair settled.
func (l *Lab) KeepOther(ctx context.Context, taker, other string) (active, settled time.Duration, err error) {
	t := time.Now()
	l.logf("keeping %s's data after the takeover: stopping Patroni on %s", other, taker)
	if err := l.Signal(taker, ProcPatroni, syscall.SIGTERM); err != nil {
		return 0, 0, fmt.Errorf("stop Patroni on %s: %w", taker, err)
	}
	if !poll(ctx, 60*time.Second, 200*time.Millisecond, func() bool { _, ok := l.PID(taker, ProcPatroni); return !ok }) {
		return 0, 0, fmt.Errorf("patroni on %s still running 60 s after SIGTERM", taker)
	}
	if !poll(ctx, 60*time.Second, 100*time.Millisecond, func() bool {
		return l.httpCode(Client, "http://"+IP(other)+":7400/ha-health", time.Second) == 200
	}) {
		return 0, 0, fmt.Errorf("%s not ACTIVE within 60 s of Patroni's stop on %s", other, taker)
	}
	active = time.Since(t)
	if err := l.removeStalePostmaster(taker); err != nil {
		return active, 0, err
	}
	off := l.logSize(taker, ProcPatroni)
	if err := l.startPatroni(taker); err != nil {
		return active, 0, fmt.Errorf("start Patroni on %s: %w", taker, err)
	}
	if err := l.WaitSettled(ctx, other, 45*time.Second); err != nil {
		// other's promotion during the fault and its promotion now can fall
		// in one WAL segment; PostgreSQL then keeps the middle timeline's
		// piece of it only as <segment>.partial, so the taker's pg_rewind
		// succeeds but its replay stops at once ("according to history
		// file, WAL location … belongs to timeline N, but previous
		// recovered WAL file came from timeline N+1") and Patroni retries
		// for ever (seen in scenario 6). The remedy (README): reinitialize
		// the taker from the other node.
		if !strings.Contains(l.logFrom(taker, ProcPatroni, off), "according to history file") {
			return active, 0, err
		}
		l.logf("%s cannot replay after its rewind (two timeline switches in one WAL segment): reinitializing it from %s", taker, other)
		if err := l.reinitialize(taker); err != nil {
			return active, 0, err
		}
		if err := l.WaitSettled(ctx, other, 120*time.Second); err != nil {
			return active, 0, fmt.Errorf("after reinitializing %s: %w", taker, err)
		}
	}
	if held, _ := alarmState(l.Ctl().Status(ctx).Alarms); held {
		return active, 0, fmt.Errorf("the takeover alarm is still held after %s took the leader key anew", other)
	}
	return active, time.Since(t), nil
}

// reinitialize asks host's Patroni to rebuild its data directory from the
// leader (POST /reinitialize, as patronictl reinit does).
func (l *Lab) reinitialize(host string) error {
	req, err := http.NewRequest(http.MethodPost, "http://"+IP(host)+":8008/reinitialize", strings.NewReader(`{"force": true}`))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.HTTPClient(Client, 10*time.Second).Do(req)
	if err != nil {
		return fmt.Errorf("reinitialize %s: %w", host, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("reinitialize %s: %d %s", host, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil
}

func countNode(ss []ctl.Sample, node string, from, to time.Time) int {
	n := 0
	for _, s := range ss {
		if s.OK && s.Node == node && s.Start.After(from) && s.Start.Before(to) {
			n++
		}
	}
	return n
}

// LBPartitioned (8): the lb loses etcd (keeps routing by checks, follows a
// switchover), then loses the PASSIVE node (no effect).
func LBPartitioned(ctx context.Context, l *Lab, r *Result) {
	if !needParts(l, r, BinLB) {
		return
	}
	pr, stop := l.startProbes(ctx, 10*time.Millisecond)
	t0 := time.Now()
	if err := l.Net.DropPort(LB, 2379); err != nil {
		r.fail("cut lb from etcd: %v", err)
	}
	time.Sleep(2 * time.Second)
	if _, err := l.Switchover(ctx, NodeB, l.Out); err != nil {
		r.fail("switchover with lb cut from etcd: %v", err)
	}
	if err := l.WaitSettled(ctx, NodeB, 30*time.Second); err != nil {
		r.fail("lb without etcd: %v", err)
	}
	_ = l.Net.Heal(LB)
	t1 := time.Now()
	if err := l.Net.Partition(LB, NodeA); err != nil { // nodea is PASSIVE now
		r.fail("cut lb from nodea: %v", err)
	}
	time.Sleep(3 * time.Second)
	_ = l.Net.Heal(LB)
	time.Sleep(time.Second)
	stop()
	all := pr.probe.Samples()
	rep := ctl.Analyze(all, t0)
	r.note("lb cut from etcd + switchover, then cut from the passive node: %s", rep)
	var after []ctl.Sample
	for _, s := range all {
		if s.Start.After(t1) {
			after = append(after, s)
		}
	}
	if a := ctl.Analyze(after, t1); a.Failed > 0 {
		r.fail("%d writes failed while the lb was cut from the PASSIVE node", a.Failed)
	}
	r.fig("lb without etcd: failed writes during the switchover", float64(rep.Failed), "")
	outageFigures(r, "lb without etcd", rep)
}

// Demo is the README's main job: up, switchover A→B and back while probing,
// timings and status, down.
func Demo(ctx context.Context, opt Options, w io.Writer) error {
	l, err := NewLab(opt, w)
	if err != nil {
		return err
	}
	defer l.Down()
	if err := l.Up(ctx); err != nil {
		return err
	}
	_ = l.PrintStatus(ctx, w)
	r := &Result{Name: "demo: planned switchover A→B and back (hold " + opt.Hold + ")"}
	if l.Bin(BinLB) == "" {
		return fmt.Errorf("hapair-lb did not build: the demo needs the balancer")
	}
	for _, to := range []string{NodeB, NodeA} {
		switchoverOnce(ctx, l, r, "hold "+opt.Hold, to)
	}
	PrintResult(w, r)
	fmt.Fprintln(w)
	_ = l.PrintStatus(ctx, w)
	if !r.OK() {
		return fmt.Errorf("demo failed")
	}
	return nil
}

// Soak repeats random faults for d with the checkers running and prints a
// summary (writeSoakSummary): per fault kind the time until the pair served
// again and until it was redundant again, outages through the balancer,
// dual-ACTIVE rounds, acknowledged writes lost, files overwritten by a
// stale node. A fault after which the cluster does not settle within
// soakSettleBound ends the soak (every later fault would land on a broken
// cluster): the summary names the stuck state as hapairctl status does.
func Soak(ctx context.Context, opt Options, d time.Duration, w io.Writer) error {
	l, err := NewLab(opt, w)
	if err != nil {
		return err
	}
	defer l.Down()
	if err := l.Up(ctx); err != nil {
		return err
	}
	pr, stop := l.startProbes(ctx, 10*time.Millisecond)
	end := time.Now().Add(d)
	var runs []soakFaultRun
	for time.Now().Before(end) && ctx.Err() == nil {
		f := soakFault(ctx, l)
		l.logf("soak: %s on %s done", f.Kind, f.Target)
		var err error
		f.Acked, f.KeptOther, err = l.settleOrAck(ctx)
		f.Alarm, f.AutoAcked = l.alarmSince(ctx, f.Began)
		f.Alarm = f.Alarm || f.Acked || f.KeptOther // a kept-other alarm is gone by now
		if err != nil {
			f.Stuck = err.Error()
			fmt.Fprintf(w, "after %s: %v\n", f.Kind, err)
			// No more faults on a broken cluster; does it recover by itself?
			if poll(ctx, time.Until(end), time.Second, func() bool {
				return l.settledProblem(NodeA) == "" || l.settledProblem(NodeB) == ""
			}) {
				f.SelfHealed = time.Now()
			}
			runs = append(runs, f)
			break
		}
		f.Redundant, f.NotRedundant = l.waitRedundant(ctx, f.Repaired.Add(soakRedundantBound))
		runs = append(runs, f)
	}
	stop()
	res := soakResult{Planned: d, Start: pr.start, End: time.Now(), Runs: runs, Samples: pr.probe.Samples()}
	res.Ran = res.End.Sub(res.Start)
	res.Dual, res.Rounds = pr.ha.Dual()
	res.Leader, res.LeaderErr = l.Ctl().Leader(ctx)
	if res.LeaderErr == nil {
		res.Audit, res.AuditErr = l.AuditSettled(ctx, res.Leader, res.Samples, 30*time.Second)
	}
	return writeSoakSummary(w, res)
}

// soakFault injects one random fault on the current leader (or the
// witness), undoes it, and says when each happened.
func soakFault(ctx context.Context, l *Lab) soakFaultRun {
	leader, _ := l.Ctl().Leader(ctx)
	if leader == "" {
		leader = NodeA
	}
	f := soakFaultRun{Target: leader, Began: time.Now()}
	do := func(what string, err error) {
		if err != nil {
			f.Errors = append(f.Errors, what+": "+err.Error())
		}
	}
	switch rand.IntN(5) {
	case 0:
		f.Kind = "node kill"
		do("kill", l.KillNode(leader))
		time.Sleep(15 * time.Second)
		do("start", l.StartNode(leader))
	case 1:
		f.Kind = "partition"
		peers := []string{Other(leader), Witness}
		do("partition", l.Net.Partition(leader, peers...))
		time.Sleep(15 * time.Second)
		do("heal", l.Net.Heal(leader))
	case 2:
		f.Kind = "patroni pause"
		do("SIGSTOP", l.Signal(leader, ProcPatroni, 19))
		time.Sleep(15 * time.Second)
		do("SIGCONT", l.Signal(leader, ProcPatroni, 18))
	case 3:
		f.Kind, f.Target = "witness kill", Witness
		do("kill", l.KillNode(Witness))
		time.Sleep(10 * time.Second)
		do("start", l.StartNode(Witness))
	default:
		f.Kind = "switchover"
		_, err := l.Switchover(ctx, Other(leader), io.Discard)
		do("switchover", err)
	}
	f.Repaired = time.Now()
	return f
}

// settleOrAck waits (soakSettleBound) for one primary + ACTIVE again after a
// fault; a takeover alarm (Patroni 3.0.2 took the leader key back) is
// acknowledged the operator's way after 30 s. When it does not settle, the
// error names the stuck state and its cause as hapairctl status says it
// (its headline, with a stuck leader's remedy).
func (l *Lab) settleOrAck(ctx context.Context) (acked, keptOther bool, err error) {
	settled := func() bool { return l.settledProblem(NodeA) == "" || l.settledProblem(NodeB) == "" }
	const beforeAck = 30 * time.Second
	if poll(ctx, beforeAck, 250*time.Millisecond, settled) {
		return false, false, nil
	}
	if st := l.Ctl().Status(ctx); len(st.Alarms) > 0 {
		if held, _ := alarmState(st.Alarms); held {
			// The other node served after the taker, which was PASSIVE
			// and fenced since: keep the other node's data (held by the
			// rewind hold) when the alarm says so, else acknowledge.
			if taker, other, ok := keepOtherCase(st); ok {
				_, _, err := l.KeepOther(ctx, taker, other)
				l.logf("soak: takeover alarm held; kept %s's data: %v", other, err)
				return acked, true, err
			}
			out, err := l.Ack(ctx)
			l.logf("soak: takeover alarm; hapairctl ack: %v %s", err, out)
			acked = true
		}
	}
	if poll(ctx, soakSettleBound-beforeAck, 250*time.Millisecond, settled) {
		return acked, false, nil
	}
	red := l.Ctl().Status(ctx).Redundancy
	msg := fmt.Sprintf("not settled within %s (nodea as primary: %s; nodeb as primary: %s); hapairctl status: %s",
		soakSettleBound, l.settledProblem(NodeA), l.settledProblem(NodeB), red.Line())
	for _, s := range red.Stuck {
		if s.Remedy != "" {
			msg += "; remedy: " + s.Remedy
		}
	}
	return acked, false, errors.New(msg)
}

// keepOtherCase says whether a held takeover alarm is the case to keep the
// other node's data: the guard found the other node ACTIVE after the taker,
// and the taker's roled holds the rewind (so that data still exists).
func keepOtherCase(st ctl.Status) (taker, other string, ok bool) {
	for _, a := range st.Alarms {
		if a.Acked() || a.Guard() != string(roled.GuardOtherActiveLater) {
			continue
		}
		taker, other = a.Members()
		for _, n := range st.Roled {
			if n.Node == taker && n.Postgres != nil && n.Postgres.RewindHold != nil && n.Postgres.RewindHold.State == roled.RewindHoldSet {
				return taker, other, other != ""
			}
		}
	}
	return "", "", false
}

// alarmSince reports whether a takeover alarm was raised at or after began,
// and whether roled acknowledged it itself (the guard's proof held).
func (l *Lab) alarmSince(ctx context.Context, began time.Time) (raised, auto bool) {
	for _, a := range l.Ctl().Status(ctx).Alarms {
		if !a.DetectedAt().Before(began) {
			raised = true
			auto = auto || a.AutoAcked()
		}
	}
	return raised, auto
}

// waitRedundant polls hapairctl status until it says REDUNDANT yes or the
// deadline passes; then it returns what status said instead.
func (l *Lab) waitRedundant(ctx context.Context, deadline time.Time) (time.Time, string) {
	last := ""
	for {
		red := l.Ctl().Status(ctx).Redundancy
		if red.Level == ctl.Redundant {
			return time.Now(), ""
		}
		last = red.Line()
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			return time.Time{}, last
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}
