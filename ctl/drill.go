package ctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"
)

// DrillPhase is one "lose a node, bring it back" round.
type DrillPhase struct {
	Victim, Survivor string
	Started          time.Time // the stop command ran
	// Times from the stop command.
	PatroniLeader time.Duration // survivor's Patroni holds the leader lock
	RoledActive   time.Duration // survivor's roled is ACTIVE
	LBServing     time.Duration // the balancer serves only the survivor
	FirstWrite    time.Duration // first successful write through the lb served by the survivor
	Rejoined      time.Duration // victim ready to take over again: streaming replica + PASSIVE (from its start command)
	Probe         ProbeReport
	// The acknowledged-write check after the takeover (lb.check-path):
	// AckedBefore writes were answered 200 before the stop command ran,
	// AckedMissing are those the survivor lacks. AckChecked is false when
	// the check was skipped (no check-path) or could not run.
	AckChecked   bool
	AckedBefore  int
	AckedMissing []int64
	Failures     []string
}

// OK reports whether every check of the phase passed.
func (p DrillPhase) OK() bool { return len(p.Failures) == 0 }

func (p *DrillPhase) fail(format string, args ...any) {
	p.Failures = append(p.Failures, fmt.Sprintf(format, args...))
}

// Drill stops the current primary's node hard, checks the other takes over,
// brings it back, checks it rejoins as replica + PASSIVE without disturbing
// the new ACTIVE; then the same the other way round.
func (c *Client) Drill(ctx context.Context, w io.Writer) ([]DrillPhase, error) {
	var phases []DrillPhase
	for i := 0; i < 2; i++ {
		victim, err := c.Leader(ctx)
		if err != nil {
			return phases, err
		}
		p := c.drillPhase(ctx, victim, w)
		phases = append(phases, p)
		if !p.OK() {
			return phases, fmt.Errorf("drill phase %s lost: %v", victim, p.Failures)
		}
	}
	return phases, nil
}

func (c *Client) other(name string) (Node, bool) {
	for _, n := range c.Cfg.Nodes {
		if n.Name != name {
			return n, true
		}
	}
	return Node{}, false
}

func (c *Client) drillPhase(ctx context.Context, victimName string, w io.Writer) DrillPhase {
	victim, _ := c.Cfg.Node(victimName)
	survivor, ok := c.other(victimName)
	p := DrillPhase{Victim: victimName, Survivor: survivor.Name}
	if c.Cfg.LB.URL == "" {
		p.fail("lb.url is needed: the drill probes writes through the balancer")
		return p
	}
	if !ok || victim.StopCommand == "" || victim.StartCommand == "" {
		p.fail("node %s needs a survivor, stop-command and start-command", victimName)
		return p
	}
	cli, _ := c.Etcd() // nil on error: followed over REST alone
	if cli != nil {
		defer cli.Close()
	}
	leaders := c.newLeaderSource(ctx, cli, victimName)
	st := &Steps{W: w, Start: time.Now()}
	// Never take the last good copy away: the phase starts only once the
	// survivor-to-be is ready to take over (e.g. right after a switchover the
	// old primary may not replicate from the new one yet).
	if _, err := c.waitReady(ctx, st, survivor, nil); err != nil {
		p.fail("pair not redundant, phase not started: %v", err)
		return p
	}
	st.Start = time.Now()
	probe := c.NewProbe(c.Cfg.Drill.ProbeInterval)
	pctx, stopProbe := context.WithCancel(ctx)
	probeDone := make(chan struct{})
	go func() { probe.Run(pctx); close(probeDone) }()
	finish := func() {
		stopProbe()
		<-probeDone
		p.Probe = Analyze(probe.Samples(), st.Start)
		if t, ok := p.Probe.FirstOK[survivor.Name]; ok {
			p.FirstWrite = t
		}
		st.Printf("probe: %s", p.Probe)
	}
	time.Sleep(c.Cfg.Drill.ProbeInterval * 4) // a few writes before the fault
	st.Start = time.Now()
	p.Started = st.Start
	st.Printf("stop %s: %s", victim.Name, victim.StopCommand)
	if err := drillAction(ctx, victim.StopCommand); err != nil {
		p.fail("stop command: %v", err)
		finish()
		return p
	}
	if err := c.waitTakeover(ctx, st, leaders, survivor, &p); err != nil {
		p.fail("%v", err)
		finish()
		return p
	}
	// The takeover is complete once the survivor serves writes; then every
	// write acknowledged before the kill must be there. A failure here
	// fails the phase, but the victim is still brought back below: the
	// drill never leaves a node down.
	if waitServed(ctx, probe, survivor.Name, p.Started, c.Cfg.Drill.PhaseTimeout) {
		c.checkAcked(ctx, st, probe.Samples(), p.Started, survivor.Name, &p)
	} else {
		p.fail("no write served by %s within %s of the takeover: acknowledged writes not checked",
			survivor.Name, c.Cfg.Drill.PhaseTimeout)
	}
	epoch := c.Roled(ctx, survivor).Epoch
	back := time.Now()
	st.Printf("start %s: %s", victim.Name, victim.StartCommand)
	if err := drillAction(ctx, victim.StartCommand); err != nil {
		p.fail("start command: %v", err)
	} else if ready, err := c.waitRejoin(ctx, st, victim, survivor, epoch); err != nil {
		p.fail("%v", err)
	} else {
		p.Rejoined = ready.Sub(back)
	}
	time.Sleep(c.Cfg.Drill.Settle)
	finish()
	for _, s := range probe.Samples() {
		if s.OK && s.Node == victim.Name && s.End.Sub(st.Start) > p.FirstWrite && p.FirstWrite > 0 {
			p.fail("write %d served by %s after %s took over", s.ID, victim.Name, survivor.Name)
			break
		}
	}
	return p
}

// drillAction runs a node's stop or start command; the fake-cluster tests
// replace it to act on their fakes instead of hosts.
var drillAction = runAction

func runAction(ctx context.Context, command string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", command)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

func (c *Client) waitTakeover(ctx context.Context, st *Steps, leaders *leaderSource, survivor Node, p *DrillPhase) error {
	deadline := time.Now().Add(c.Cfg.Drill.PhaseTimeout)
	for time.Now().Before(deadline) {
		if p.PatroniLeader == 0 {
			if l, err := leaders.leader(ctx); err == nil && l == survivor.Name {
				p.PatroniLeader = time.Since(st.Start)
				st.Printf("Patroni leader is %s", survivor.Name)
			}
		}
		if p.RoledActive == 0 && (survivor.RoledURL == "" || c.Roled(ctx, survivor).Role == "active") {
			p.RoledActive = time.Since(st.Start)
			st.Printf("roled on %s ACTIVE", survivor.Name)
		}
		if p.LBServing == 0 && c.lbServesOnly(ctx, survivor.Name) {
			p.LBServing = time.Since(st.Start)
			st.Printf("balancer serves from %s", survivor.Name)
		}
		if p.PatroniLeader > 0 && p.RoledActive > 0 && p.LBServing > 0 {
			return nil
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("%s did not take over within %s", survivor.Name, c.Cfg.Drill.PhaseTimeout)
}

// waitRejoin waits until victim is ready to take over again (standbyReady:
// streaming from the leader on its timeline, lag in bounds, PASSIVE) for
// Drill.ReadyFor without a break, and checks the survivor stays ACTIVE with
// the same epoch meanwhile.
func (c *Client) waitRejoin(ctx context.Context, st *Steps, victim, survivor Node, epoch int64) (time.Time, error) {
	return c.waitReady(ctx, st, victim, func() error {
		if r := c.Roled(ctx, survivor); survivor.RoledURL != "" && (r.Role != "active" || r.Epoch != epoch) {
			return fmt.Errorf("%s disturbed while %s came back: role %s epoch %d (was %d)",
				survivor.Name, victim.Name, r.Role, r.Epoch, epoch)
		}
		return nil
	})
}

// waitReady polls n's readiness until it has held for Drill.ReadyFor, the
// phase timeout passes (the error names the last reason) or guard fails. It
// returns when the unbroken ready stretch began.
func (c *Client) waitReady(ctx context.Context, st *Steps, n Node, guard func() error) (time.Time, error) {
	deadline := time.Now().Add(c.Cfg.Drill.PhaseTimeout)
	var since time.Time // ready without a break since
	last, lastDetail := StandbyReason(-1), ""
	for time.Now().Before(deadline) {
		if guard != nil {
			if err := guard(); err != nil {
				return time.Time{}, err
			}
		}
		reason, detail := c.StandbyReadiness(ctx, n)
		if reason != last || detail != lastDetail {
			st.Printf("%s standby: %s %s", n.Name, reason, detail)
			last, lastDetail = reason, detail
		}
		switch {
		case reason != StandbyReady:
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		}
		if !since.IsZero() && time.Since(since) >= c.Cfg.Drill.ReadyFor {
			st.Printf("%s ready to take over (replica streaming + PASSIVE)", n.Name)
			return since, nil
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return time.Time{}, err
		}
	}
	return time.Time{}, fmt.Errorf("%s not ready to take over within %s: %s %s", n.Name, c.Cfg.Drill.PhaseTimeout, last, lastDetail)
}

// waitServed waits until the probe has a write that node served, answered
// after since, or timeout passes.
func waitServed(ctx context.Context, probe *Probe, node string, since time.Time, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		for _, s := range probe.Samples() {
			if s.OK && s.Node == node && s.End.After(since) {
				return true
			}
		}
		if !time.Now().Before(deadline) || sleepCtx(ctx, 20*time.Millisecond) != nil {
			return false
		}
	}
}

// checkAcked asks the balancer, which now serves from survivor, for every
// write acknowledged before the stop command ran (at kill): each must be on
// the survivor. Missing ones fail the phase, named (count and first few).
func (c *Client) checkAcked(ctx context.Context, st *Steps, samples []Sample, kill time.Time, survivor string, p *DrillPhase) {
	if c.Cfg.LB.CheckPath == "" {
		st.Printf("acknowledged writes not checked on %s: lb.check-path not set (skipped)", survivor)
		return
	}
	var ids []int64
	for _, s := range samples {
		if s.OK && s.End.Before(kill) {
			ids = append(ids, s.ID)
		}
	}
	var missing []int64
	for _, id := range ids {
		present, err := c.checkWrite(ctx, id, survivor)
		if err != nil {
			p.fail("acknowledged writes not checked on %s: write %d: %v", survivor, id, err)
			return
		}
		if !present {
			missing = append(missing, id)
		}
	}
	p.AckChecked, p.AckedBefore, p.AckedMissing = true, len(ids), missing
	if len(missing) > 0 {
		p.fail("%d of %d writes acknowledged before the kill missing on %s: %s",
			len(missing), len(ids), survivor, firstIDs(missing, 5))
		return
	}
	st.Printf("%d writes acknowledged before the kill: all on %s", len(ids), survivor)
}

// checkWrite asks lb.check-path whether write id is on node: 200 present,
// 404 absent, and the answer must come from node. Anything else (the
// balancer between backends, a timeout) is retried a few times: the check
// must not mistake a hiccup for a lost write, nor the other way round.
func (c *Client) checkWrite(ctx context.Context, id int64, node string) (bool, error) {
	target := fmt.Sprintf("%s%s?id=%d", strings.TrimSuffix(c.Cfg.LB.URL, "/"), c.Cfg.LB.CheckPath, id)
	var last error
	for attempt := range 5 {
		if attempt > 0 {
			if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
				return false, err
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
		if err != nil {
			return false, err
		}
		resp, err := c.HTTP.Do(req)
		if err != nil {
			last = err
			continue
		}
		var body struct {
			Node string `json:"node"`
		}
		_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&body)
		resp.Body.Close()
		switch {
		case resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusNotFound:
			last = fmt.Errorf("HTTP %d from %q", resp.StatusCode, body.Node)
		case body.Node != node:
			last = fmt.Errorf("answered by %q, not %s", body.Node, node)
		default:
			return resp.StatusCode == http.StatusOK, nil
		}
	}
	return false, last
}

// firstIDs lists up to n ids, and how many more there are.
func firstIDs(ids []int64, n int) string {
	var b strings.Builder
	for i, id := range ids {
		if i == n {
			fmt.Fprintf(&b, " and %d more", len(ids)-n)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprint(&b, id)
	}
	return b.String()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// WriteDrillReport prints the phases as a table. DOWN is the phase's total
// outage (all its outages, OUTAGES of them); ACKED is how many of the writes
// acknowledged before the kill the survivor had ("-": not checked).
func WriteDrillReport(w io.Writer, phases []DrillPhase) {
	fmt.Fprintf(w, "%-8s %-8s %9s %9s %9s %9s %7s %7s %9s %9s %9s %s\n", "LOST", "TAKEOVER", "PATRONI", "ACTIVE", "LB", "1ST WRITE",
		"FAILED", "OUTAGES", "DOWN", "ACKED", "REJOINED", "RESULT")
	for _, p := range phases {
		res := "ok"
		if !p.OK() {
			res = fmt.Sprint(p.Failures)
		}
		acked := "-"
		if p.AckChecked {
			acked = fmt.Sprintf("%d/%d", p.AckedBefore-len(p.AckedMissing), p.AckedBefore)
		}
		fmt.Fprintf(w, "%-8s %-8s %8.2fs %8.2fs %8.2fs %8.2fs %7d %7d %8.2fs %9s %8.2fs %s\n", p.Victim, p.Survivor,
			p.PatroniLeader.Seconds(), p.RoledActive.Seconds(), p.LBServing.Seconds(), p.FirstWrite.Seconds(),
			p.Probe.Failed, p.Probe.Outages, p.Probe.TotalDown.Seconds(), acked, p.Rejoined.Seconds(), res)
	}
}
