package lab

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/hapair/hapair/budget"
	"github.com/hapair/hapair/ctl"
)

// labTimers are the lab's timers without a budget: Patroni 10/2/3, roled's
// defaults, the balancer's checks at 250 ms (faster than the shipped 1 s).
func labTimers() budget.Timers {
	t := budget.Defaults()
	t.CheckInterval, t.CheckTimeout = 250*time.Millisecond, 200*time.Millisecond
	return t
}

// timers are the lab's timers: derived from Opt.RTO when it is set
// (hapair-lab up --rto 5s), else labTimers. NewLab has checked the target.
func (l *Lab) timers() budget.Timers {
	if l.Opt.RTO == "" {
		return labTimers()
	}
	d, _ := time.ParseDuration(l.Opt.RTO)
	p, err := budget.DeriveFor(d, l.release())
	if err != nil {
		return labTimers()
	}
	return p.Timers
}

// release is the Patroni release the lab runs, as far as it asked.
func (l *Lab) release() string {
	if l.Opt.PatroniRelease != "" {
		return l.Opt.PatroniRelease
	}
	return budget.DefaultPatroni
}

// checkRTO validates Options.RTO for a Patroni release ("" the default)
// and returns the hold the budget asks for.
func checkRTO(rto, release string) (hold string, err error) {
	d, err := time.ParseDuration(rto)
	if err != nil {
		return "", fmt.Errorf("rto %q: %w", rto, err)
	}
	if release == "" {
		release = budget.DefaultPatroni
	}
	p, err := budget.DeriveFor(d, release)
	if err != nil {
		return "", err
	}
	return p.Timers.HoldTimeout.String(), nil
}

// RTOScenario is a scenario that runs on a lab built with a timing budget
// (its own lab: the timers are set when the lab comes up).
type RTOScenario struct {
	RTO      string
	Scenario Scenario
}

// RTOScenarios run after Scenarios, one lab per target.
// 6.5 s is the lowest target the budget accepts (budget.Lowest):
// 5 s is refused, Patroni 3.0.2 cannot take the leader key with a
// retry_timeout of 1 s, so ttl cannot go under 5 s.
var RTOScenarios = []RTOScenario{
	{"6.5s", Scenario{"13-kill-at-rto-6.5s", DCSRemote, KillAtRTO}},
	{"6.5s", Scenario{"19-host-death-at-rto-6.5s", DCSRemote, HostDeathAtRTO}},
}

// HostDeathAtRTO (19, and 20 on the lab's own timers) is KillAtRTO with
// the node's cable pulled as well: a host that lost power sends no RST, so
// every connection to it waits for its timeout instead of failing at once
// (Patroni's status request to the old leader in the leader race among
// them). The node's cable is back before it starts again.
func HostDeathAtRTO(ctx context.Context, l *Lab, r *Result) { killAtRTO(ctx, l, r, true) }

// KillAtRTO (13, and 15 on the lab's own timers): kill -9 of everything on
// the primary's node: the first write through the balancer after the kill,
// the failed writes, the time to redundancy once the node is back, and the
// checks of every scenario (no dual ACTIVE, no acknowledged write lost
// beyond what an asynchronous kill may cost). On a lab built with --rto the
// timers are the budget's and Patroni's /config must run them; on any other
// lab they are the lab's defaults (Patroni 10/2/3), the comparison point.
// The timing bound is far outside every goal (12 × the target, or 12 × the
// arithmetic's typical kill): it only catches timers that did not apply.
func KillAtRTO(ctx context.Context, l *Lab, r *Result) { killAtRTO(ctx, l, r, false) }

func killAtRTO(ctx context.Context, l *Lab, r *Result, hostDeath bool) {
	if !needParts(l, r, BinLB, BinRoled) {
		return
	}
	t, label := l.timers(), "lab defaults"
	outages := budget.Arithmetic(t)
	var target time.Duration
	if l.Opt.RTO != "" {
		var err error
		if target, err = time.ParseDuration(l.Opt.RTO); err != nil {
			r.fail("lab rto %q: %v", l.Opt.RTO, err)
			return
		}
		p, err := budget.DeriveFor(target, l.release())
		if err != nil {
			r.fail("lab rto %s: %v", target, err)
			return
		}
		t, outages, label = p.Timers, p.Outages, "rto "+target.String()
	}
	arith := outages[0] // the kill's
	fault := "kill"
	if hostDeath {
		fault = "host death"
		for _, o := range outages {
			if o.Fault == budget.FaultHostDeath {
				arith = o
			}
		}
	}
	name := fault + " at " + label
	if target == 0 {
		target = arith.Typical
	}
	// What the release runs: a ttl set after the bootstrap shows in /config
	// as set, raised or not (checkPatroniTTL cannot see it).
	rt := t
	rt.PatroniVersion = l.release()
	runs := rt.Running().PatroniTTL
	r.note("timers (%s): Patroni %s ttl %s (runs %s) loop_wait %s retry_timeout %s, etcd election %s, lease %s, checks %s×%d, hold %s; %s arithmetic typical %s, worst %s",
		label, l.release(), t.PatroniTTL, runs, t.PatroniLoopWait, t.PatroniRetryTimeout, t.EtcdElection,
		t.LeaseTTL, t.CheckInterval, t.CheckFall, t.HoldTimeout, fault, arith.Typical, arith.Worst)
	if err := l.checkPatroniTTL(t); err != nil {
		r.fail("%v", err)
		return
	}
	// The fault strikes a redundant pair: nodeb a ready standby, and, with
	// roled's etcd-leader standby, its member given the time to take the
	// raft leadership (up to 3 s, not required: older roleds leave it).
	if err := l.Ctl().WaitStandbyReady(ctx, NodeB, io.Discard); err != nil {
		r.fail("nodeb not a ready standby before the %s: %v", fault, err)
		return
	}
	poll(ctx, 3*time.Second, 50*time.Millisecond, func() bool { h, err := l.etcdLeaderHost(ctx); return err == nil && h == NodeB })
	before, _ := l.Ctl().History(ctx)
	pr, stop, ok := l.probesServing(ctx, r)
	if !ok {
		return
	}
	if h, err := l.etcdLeaderHost(ctx); err == nil {
		r.note("%s: etcd's raft leader at the fault: %s's member", name, h)
	}
	// The fault strikes at a random moment of the old primary's keep-alive
	// loop, as a real one does: the leader key outlives the kill by ttl
	// minus that phase, the largest variable of the kill's median. And at
	// least one loop after the pair was ready: the raft leadership moves to
	// nodeb's member about then, and the new leader renews every lease for
	// a full ttl + election-timeout (etcd's lessor Promote), so a kill
	// before Patroni's next keep-alive met a key 0.8–1 s longer-lived (2 of
	// 15 runs, killed 0.1–0.3 s after the move).
	loop := rt.Running().PatroniLoopWait
	wait := loop + time.Duration(rand.Int64N(int64(loop)))
	r.note("%s: strikes %s after the pair was ready", name, wait.Round(time.Millisecond))
	select {
	case <-ctx.Done():
		stop()
		return
	case <-time.After(wait):
	}
	t0 := time.Now()
	err := l.KillNode(NodeA)
	if err == nil && hostDeath {
		err = l.Net.SetLink(NodeA, false)
	}
	if err != nil {
		stop()
		r.fail("%s: %v", fault, err)
		return
	}
	// 12 × the target: far outside the goal, never a flaky bound.
	bound := 12 * target
	served := poll(ctx, bound, 20*time.Millisecond, func() bool {
		_, ok := ctl.Analyze(pr.probe.Samples(), t0).FirstOK[NodeB]
		return ok
	})
	time.Sleep(time.Second) // a second of writes on the survivor, for the report
	stop()
	rep := ctl.Analyze(pr.probe.Samples(), t0)
	r.note("%s: %s", name, rep)
	if !served {
		r.fail("no write served by nodeb within %s of the kill", bound)
	}
	if first, ok := rep.FirstOK[NodeB]; ok { // the figure itself: followFigures
		l.logf("%s: first write through the balancer %.2f s after the fault", name, first.Seconds())
	}
	followFigures(r, pr, rep, name, NodeB, t0)
	r.fig(name+": failed writes", float64(rep.Failed), "")
	if dual, rounds := pr.ha.Dual(); dual > 0 {
		r.fail("checker saw two ACTIVE nodes in %d of %d rounds", dual, rounds)
	}
	if v, err := l.lbDualActive("app"); err == nil && v > pr.dualBefore {
		r.fail("hapair_lb_dual_active_total{backend=app} rose by %v", v-pr.dualBefore)
	}
	// Bring nodea back: it must rejoin as a replica and be ready again.
	t1 := time.Now()
	if hostDeath {
		if err := l.Net.SetLink(NodeA, true); err != nil {
			r.fail("cable of nodea: %v", err)
			return
		}
	}
	if err := l.StartNode(NodeA); err != nil {
		r.fail("start nodea: %v", err)
		return
	}
	if err := l.Ctl().WaitStandbyReady(ctx, NodeA, io.Discard); err != nil {
		r.fail("nodea not ready as a standby after its restart: %v", err)
	} else {
		r.secs(name+": time to redundancy (restart → standby ready)", time.Since(t1))
	}
	if err := l.WaitSettled(ctx, NodeB, 90*time.Second); err != nil {
		r.fail("not settled after the kill: %v", err)
		return
	}
	a, err := l.AuditSettled(ctx, NodeB, pr.probe.Samples(), 30*time.Second)
	if err != nil {
		r.fail("audit could not run: %v", err)
		return
	}
	r.note("audit: %s", a)
	historyRedundancy(ctx, l, r, name, len(before))
	r.fig(name+": acknowledged rows lost", float64(len(a.LostRows)), "")
	// Asynchronous replication may lose the last few ms of writes on a kill.
	if len(a.LostRows) > 3 {
		r.fail("%d acknowledged rows lost on one kill", len(a.LostRows))
	}
	if len(a.LostFiles) > 0 || len(a.Overwritten) > 0 {
		r.fail("%d acknowledged files silently lost, %d overwritten", len(a.LostFiles), len(a.Overwritten))
	}
}

func countOK(ss []ctl.Sample, node string) int {
	n := 0
	for _, s := range ss {
		if s.OK && s.Node == node {
			n++
		}
	}
	return n
}

// checkPatroniTTL reads Patroni's dynamic configuration (GET /config on the
// primary) and compares it with the budget: the timers the scenario
// measures must be the ones in force.
func (l *Lab) checkPatroniTTL(t budget.Timers) error {
	var cfg struct {
		TTL          float64 `json:"ttl"`
		LoopWait     float64 `json:"loop_wait"`
		RetryTimeout float64 `json:"retry_timeout"`
	}
	if err := l.getJSON(Client, fmt.Sprintf("http://%s:%d/config", IP(NodeA), PatroniPort), 2*time.Second, &cfg); err != nil {
		return fmt.Errorf("reading Patroni's /config: %w", err)
	}
	got := []time.Duration{time.Duration(cfg.TTL * float64(time.Second)), time.Duration(cfg.LoopWait * float64(time.Second)),
		time.Duration(cfg.RetryTimeout * float64(time.Second))}
	if got[0] != t.PatroniTTL || got[1] != t.PatroniLoopWait || got[2] != t.PatroniRetryTimeout {
		return fmt.Errorf("ttl/loop_wait/retry_timeout in Patroni's /config are %v, the budget says %s/%s/%s", got,
			t.PatroniTTL, t.PatroniLoopWait, t.PatroniRetryTimeout)
	}
	return nil
}
