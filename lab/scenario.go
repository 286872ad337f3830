package lab

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hapair/hapair/ctl"
	"github.com/hapair/hapair/roled"
)

// Result is one scenario's outcome: checks that failed, notes, and the
// measured figures (seconds or counts) for the README's table.
type Result struct {
	Name     string
	Failures []string
	Notes    []string
	Figures  []Figure
	Skipped  string
}

// Figure is one measured value.
type Figure struct {
	Name  string
	Value float64
	Unit  string
}

// OK reports whether every check passed.
func (r *Result) OK() bool { return len(r.Failures) == 0 }

func (r *Result) fail(format string, args ...any) {
	r.Failures = append(r.Failures, fmt.Sprintf(format, args...))
}

func (r *Result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

func (r *Result) fig(name string, v float64, unit string) {
	r.Figures = append(r.Figures, Figure{name, v, unit})
}

func (r *Result) secs(name string, d time.Duration) { r.fig(name, d.Seconds(), "s") }

// Scenario is one lab scenario; it runs on a settled lab (nodea primary).
type Scenario struct {
	Name string
	DCS  string // Patroni DCS mode the scenario needs
	Run  func(ctx context.Context, l *Lab, r *Result)
}

// Scenarios in the order they run (issue "Must show" 1–8).
var Scenarios = []Scenario{
	{"1-bootstrap", DCSRemote, Bootstrap},
	{"2-switchover", DCSRemote, Switchovers},
	{"3-drill", DCSRemote, DrillBoth},
	{"4-witness-lost", DCSRemote, WitnessLost},
	{"16-standby-dies-leading-etcd", DCSRemote, StandbyDiesLeadingEtcd},
	{"5-partition", DCSRemote, PartitionDesign},
	{"7-frozen-patroni", DCSRemote, FrozenPatroni},
	{"8-lb-partitioned", DCSRemote, LBPartitioned},
	{"9-drills-back-to-back", DCSRemote, DrillsBackToBack},
	{"10-vip-switchover", DCSRemote, VIPSwitchover},
	{"11-vip-roled-paused", DCSRemote, VIPRoledPaused},
	{"17-vip-kill", DCSRemote, VIPKill},
	{"18-vip-partition", DCSRemote, VIPPartition},
	{"21-lb-vip-kill", DCSRemote, LBVIPKill},
	{"22-lb-vip-partition", DCSRemote, LBVIPPartition},
	{"23-lb-vip-paused", DCSRemote, LBVIPPaused},
	{"12-primary-dies-during-rewind", DCSRemote, PrimaryDiesDuringRewind},
	{"15-kill", DCSRemote, KillAtRTO},            // the lab's own timers: 13's comparison point
	{"20-host-death", DCSRemote, HostDeathAtRTO}, // and 19's
	{"6-partition-default-hosts", DCSAll, PartitionDefaultHosts},
}

// Group is scenarios that run again on a lab built another way (their own
// lab), named "<name>-<scenario>".
type Group struct {
	Name string
	// Build turns the run's options into the group's lab's.
	Build func(*Options)
	// Runs reports whether a run with these options includes the group.
	Runs      func(Options) bool
	Scenarios []Scenario
}

func durability(d string) func(*Options) { return func(o *Options) { o.Durability = d } }

// asyncRun: the durability groups run from a run in the default mode (a
// whole run in another mode already is one).
func asyncRun(o Options) bool { return roled.Durability(o.Durability) == roled.DurabilityAsync }

// Groups run after the RTO scenarios. The durability modes' own (issue 19):
// the frozen-Patroni scenario is not among them, because in sync mode
// Patroni 3.0.2 takes the leader key back after SIGCONT as in async mode
// (the takeover guard holds, README), so it shows nothing of sync's own.
// Then the VIP scenarios with keepalived holding the VIPs (issue 20's peer,
// side by side with the same checkers; the nodes' VIP and the balancer
// pair's), on a run with --vip. Then the balancer pair's on a lab with a
// timing budget (--rto 6.5s): its etcd grants 1 s leases, so the pair holds
// the VIP on a 1 s lease with the nftables fence (Lab.lbFastVIP).
var Groups = []Group{
	{"sync", durability("sync"), asyncRun, []Scenario{
		{"1-bootstrap", DCSRemote, Bootstrap},
		{"2-switchover", DCSRemote, Switchovers},
		{"3-drill", DCSRemote, DrillBoth},
		{"5-partition", DCSRemote, PartitionDesign},
	}},
	{"sync-strict", durability("sync-strict"), asyncRun, []Scenario{
		{"1-bootstrap", DCSRemote, Bootstrap},
		{"14-strict-standby-lost", DCSRemote, StrictStandbyLost},
	}},
	{VIPPeerKeepalived, func(o *Options) { o.VIP, o.VIPPeer = true, VIPPeerKeepalived },
		func(o Options) bool { return o.VIP && o.VIPPeer == "" }, []Scenario{
			{"10-vip-switchover", DCSRemote, VIPSwitchover},
			{"11-vip-roled-paused", DCSRemote, VIPRoledPaused},
			{"17-vip-kill", DCSRemote, VIPKill},
			{"18-vip-partition", DCSRemote, VIPPartition},
			{"21-lb-vip-kill", DCSRemote, LBVIPKill},
			{"22-lb-vip-partition", DCSRemote, LBVIPPartition},
			{"23-lb-vip-paused", DCSRemote, LBVIPPaused},
		}},
	{"lb-vip-1s", func(o *Options) { o.VIP, o.VIPPeer, o.RTO, o.Hold = true, "", "6.5s", "" },
		func(o Options) bool { return o.VIP && o.VIPPeer == "" && o.RTO == "" }, []Scenario{
			{"21-lb-vip-kill", DCSRemote, LBVIPKill},
			{"22-lb-vip-partition", DCSRemote, LBVIPPartition},
			{"23-lb-vip-paused", DCSRemote, LBVIPPaused},
		}},
}

// RunScenarios runs the scenarios matching re, sharing one lab per DCS mode
// (fresh labs keep CI time low), and prints each result.
func RunScenarios(ctx context.Context, opt Options, re string, w io.Writer) error {
	rx, err := regexp.Compile(re)
	if err != nil {
		return err
	}
	var results []*Result
	for _, mode := range []string{DCSRemote, DCSAll} {
		var todo []Scenario
		for _, s := range Scenarios {
			if s.DCS == mode && rx.MatchString(s.Name) {
				todo = append(todo, s)
			}
		}
		if len(todo) == 0 {
			continue
		}
		var res []*Result
		if opt.Tag != "" {
			// An existing lab (hapair-lab up): run on it, leave it up.
			l, err := Open(opt.Root, opt.Tag, w)
			if err != nil {
				return err
			}
			for _, s := range todo {
				r := RunOne(ctx, l, s)
				PrintResult(w, r)
				res = append(res, r)
			}
			results = append(results, res...)
			continue
		}
		o := opt
		o.DCSMode, o.Tag = mode, ""
		res, err := runGroup(ctx, o, todo, w)
		results = append(results, res...)
		if err != nil {
			return err
		}
	}
	for _, rs := range RTOScenarios {
		if !rx.MatchString(rs.Scenario.Name) {
			continue
		}
		if opt.Tag != "" {
			l, err := Open(opt.Root, opt.Tag, w)
			if err != nil {
				return err
			}
			if l.Opt.RTO != rs.RTO {
				continue // the lab was not built with this budget
			}
			r := RunOne(ctx, l, rs.Scenario)
			PrintResult(w, r)
			results = append(results, r)
			continue
		}
		o := opt
		o.DCSMode, o.Tag, o.RTO, o.Hold = rs.Scenario.DCS, "", rs.RTO, ""
		res, err := runGroup(ctx, o, []Scenario{rs.Scenario}, w)
		results = append(results, res...)
		if err != nil {
			return err
		}
	}
	for _, g := range Groups {
		todo := g.Matching(rx)
		if len(todo) == 0 || opt.Tag != "" || !g.Runs(opt) {
			continue // on an existing lab, or a run the group is not part of
		}
		o := opt
		o.DCSMode, o.Tag = DCSRemote, ""
		g.Build(&o)
		res, err := runGroup(ctx, o, todo, w)
		results = append(results, res...)
		if err != nil {
			return err
		}
	}
	PrintResults(w, results)
	for _, r := range results {
		if !r.OK() {
			return fmt.Errorf("scenario %s failed", r.Name)
		}
	}
	return nil
}

// Matching returns the group's scenarios whose "<group>-<name>" matches
// rx, named so.
func (g Group) Matching(rx *regexp.Regexp) []Scenario {
	var out []Scenario
	for _, s := range g.Scenarios {
		s.Name = g.Name + "-" + s.Name
		if rx.MatchString(s.Name) {
			out = append(out, s)
		}
	}
	return out
}

func runGroup(ctx context.Context, opt Options, todo []Scenario, w io.Writer) ([]*Result, error) {
	l, err := NewLab(opt, w)
	if err != nil {
		return nil, err
	}
	defer func() { _ = l.Down() }() // the last lab: l changes on a rebuild
	if err := l.Up(ctx); err != nil {
		return nil, err
	}
	var out []*Result
	for i, s := range todo {
		r := RunOne(ctx, l, s)
		out = append(out, r)
		PrintResult(w, r)
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		if r.OK() || i == len(todo)-1 {
			continue
		}
		// One failure stays one failure: the next scenario runs on a new
		// lab, not on whatever this one left behind (as TestLab does).
		fmt.Fprintf(w, "rebuilding the lab after the failed scenario %s\n", s.Name)
		_ = l.Down()
		nl, err := NewLab(opt, w)
		if err != nil {
			return out, fmt.Errorf("rebuild after %s: %w", s.Name, err)
		}
		l = nl
		if err := l.Up(ctx); err != nil {
			return out, fmt.Errorf("rebuild after %s: up: %w", s.Name, err)
		}
	}
	return out, nil
}

// RunOne runs one scenario after bringing the lab back to "nodea primary +
// ACTIVE" (a switchover when the previous scenario left nodeb primary).
func RunOne(ctx context.Context, l *Lab, s Scenario) *Result {
	r := &Result{Name: s.Name}
	l.logf("=== scenario %s", s.Name)
	if err := l.Normalize(ctx); err != nil {
		r.fail("lab not settled before the scenario: %v", err)
		return r
	}
	s.Run(ctx, l, r)
	return r
}

// Normalize waits for a settled lab and makes nodea the primary.
func (l *Lab) Normalize(ctx context.Context) error {
	var primary string
	ok := poll(ctx, 90*time.Second, 250*time.Millisecond, func() bool {
		for _, h := range DataNodes {
			if l.settledProblem(h) == "" {
				primary = h
				return true
			}
		}
		return false
	})
	if held, _ := alarmState(l.Ctl().Status(ctx).Alarms); !ok && held {
		// A takeover alarm blocks ACTIVE until the operator acknowledges it.
		out, err := l.Ack(ctx)
		l.logf("takeover alarm left by the previous scenario; hapairctl ack: %v %s", err, out)
		ok = poll(ctx, 60*time.Second, 250*time.Millisecond, func() bool {
			for _, h := range DataNodes {
				if l.settledProblem(h) == "" {
					primary = h
					return true
				}
			}
			return false
		})
	}
	if !ok {
		return fmt.Errorf("not settled after 90s: %s / %s", l.settledProblem(NodeA), l.settledProblem(NodeB))
	}
	if primary == NodeA {
		return nil
	}
	if _, err := l.Switchover(ctx, NodeA, io.Discard); err != nil {
		return err
	}
	return l.WaitSettled(ctx, NodeA, 60*time.Second)
}

// Ack runs "hapairctl ack" on the client host (the operator's path after a
// takeover alarm).
func (l *Lab) Ack(ctx context.Context) (string, error) {
	bin := l.Bin(BinCtl)
	if bin == "" {
		return "", fmt.Errorf("hapairctl not built")
	}
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", l.Net.NS(Client), bin, "ack", "--config",
		l.path("ctl.yaml")).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// PrintResult prints one scenario's outcome.
func PrintResult(w io.Writer, r *Result) {
	state := "PASS"
	switch {
	case r.Skipped != "":
		state = "SKIP (" + r.Skipped + ")"
	case !r.OK():
		state = "FAIL"
	}
	fmt.Fprintf(w, "--- %s: %s\n", r.Name, state)
	for _, f := range r.Failures {
		fmt.Fprintf(w, "    FAIL: %s\n", f)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "    %s\n", n)
	}
	// Repeated figures (--repeat) print as median, min, max and count.
	var order []string
	vals := map[string][]float64{}
	unit := map[string]string{}
	for _, f := range r.Figures {
		if _, ok := vals[f.Name]; !ok {
			order = append(order, f.Name)
		}
		vals[f.Name] = append(vals[f.Name], f.Value)
		unit[f.Name] = f.Unit
	}
	for _, n := range order {
		v := append([]float64(nil), vals[n]...)
		sort.Float64s(v)
		if len(v) == 1 {
			fmt.Fprintf(w, "    %-58s %8.3f %s\n", n, v[0], unit[n])
			continue
		}
		fmt.Fprintf(w, "    %-58s %8.3f %s (median of %d; min %.3f, max %.3f)\n", n, v[len(v)/2], unit[n], len(v), v[0], v[len(v)-1])
	}
}

// PrintResults prints the summary of all scenarios.
func PrintResults(w io.Writer, rs []*Result) {
	fmt.Fprintln(w, "\n=== summary")
	for _, r := range rs {
		st := "PASS"
		if !r.OK() {
			st = "FAIL"
		}
		fmt.Fprintf(w, "%-28s %s\n", r.Name, st)
	}
}

// runWithProbe runs action while probing writes through the balancer every
// 50 ms (plus the independent checkers), waiting settle after it.
type probeRun struct {
	probe *ctl.Probe
	ha    *HAChecker
	pg    *PGChecker
	lb    *LBWatcher
	start time.Time
	// balancer dual-claim counters when the run started
	dualBefore, pgDualBefore float64
}

func (l *Lab) startProbes(ctx context.Context, haInterval time.Duration) (*probeRun, func()) {
	pr := &probeRun{probe: l.Ctl().NewProbe(50 * time.Millisecond), ha: l.NewHAChecker(haInterval),
		pg: l.NewPGChecker(50 * time.Millisecond), lb: l.NewLBWatcher(20 * time.Millisecond), start: time.Now()}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 4)
	go func() { pr.lb.Run(pctx); done <- struct{}{} }()
	go func() { pr.probe.Run(pctx); done <- struct{}{} }()
	go func() { pr.ha.Run(pctx); done <- struct{}{} }()
	go func() { pr.pg.Run(pctx); done <- struct{}{} }()
	// stop may be called more than once (a deferred stop beside an
	// explicit one): the second call must not wait for the drained done.
	var once sync.Once
	return pr, func() {
		once.Do(func() {
			cancel()
			for range 4 {
				<-done
			}
		})
	}
}

// lbDualActive reads hapair_lb_dual_active_total{backend=...} from the lb's
// metrics.
func (l *Lab) lbDualActive(backend string) (float64, error) {
	resp, err := l.HTTPClient(Client, 2*time.Second).Get(fmt.Sprintf("http://%s:%d/metrics", IP(LB), LBAdminPort))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, `hapair_lb_dual_active_total{backend="`+backend+`"}`) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += v
		}
	}
	return total, sc.Err()
}

// SetHold rewrites the lb's hold timeout and reloads it (SIGHUP); ctl.yaml
// follows (step-down with a hold only).
func (l *Lab) SetHold(ctx context.Context, hold string) error {
	l.Opt.Hold = hold
	if _, err := l.lbConfig(LB); err != nil {
		return err
	}
	if err := l.writeCtlConfig(); err != nil {
		return err
	}
	if err := l.Signal(LB, ProcLB, syscall.SIGHUP); err != nil {
		return err
	}
	// The reload is visible in the lb log; give it a moment to apply.
	ok := poll(ctx, 5*time.Second, 100*time.Millisecond, func() bool {
		return strings.Contains(l.logTail(LB, ProcLB, 4000), "reload")
	})
	if !ok {
		return fmt.Errorf("lb did not log a reload after SIGHUP")
	}
	return nil
}

// followFigures records when the new node's PostgreSQL first accepted a
// write, when the balancer made it eligible, and the first write through
// the balancer it served, all from t0; and the lb's delay after the PG.
func followFigures(r *Result, pr *probeRun, rep ctl.ProbeReport, name, node string, t0 time.Time) {
	pgOK, okPG := pr.pg.FirstOK(node, t0)
	if okPG {
		r.secs(name+": new PG accepts writes", pgOK.Sub(t0))
	}
	el, okEl := pr.lb.FirstEligible(node, t0)
	if okEl {
		r.secs(name+": lb routes to new node", el.Sub(t0))
	}
	if first, ok := rep.FirstOK[node]; ok {
		r.secs(name+": first write through lb", first)
	}
	if okPG && okEl {
		r.secs(name+": lb routing after new PG writable", el.Sub(pgOK))
	}
	if okPG {
		if n, last := pr.pg.OKBetween(Other(node), t0, pgOK); n > 0 {
			r.secs(name+": Patroni write gap (old PG last write → new PG first)", pgOK.Sub(last))
		}
	}
}
