package lab

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/hapair/hapair/ctl"
)

// The soak's bounds, counted from each fault's repair (node started again,
// partition healed, Patroni continued, witness started, switchover
// returned). A takeover alarm is acknowledged the operator's way 30 s into
// the first (settleOrAck).
const (
	// soakSettleBound: one node Patroni primary + ACTIVE, the other a
	// Patroni replica + PASSIVE, both apps answering, the balancer serving
	// from the primary.
	soakSettleBound = 120 * time.Second
	// soakRedundantBound: hapairctl status says REDUNDANT yes (the standby
	// is ready to take over).
	soakRedundantBound = 120 * time.Second
)

// soakFaultRun is one injected fault and what followed it.
type soakFaultRun struct {
	Kind   string
	Target string    // the node the fault hit (the witness for a witness kill)
	Began  time.Time // the fault began
	// Repaired: the fault was undone (or the switchover returned).
	Repaired time.Time
	// Stuck: not settled within soakSettleBound of the repair; the stuck
	// state and its cause as hapairctl status says it.
	Stuck string
	// Redundant is when hapairctl status first said REDUNDANT yes after
	// the repair (zero: not within soakRedundantBound; NotRedundant is
	// then what it said instead).
	Redundant    time.Time
	NotRedundant string
	Acked        bool // a takeover alarm was acknowledged (hapairctl ack)
	// Alarm: a takeover alarm was raised during the fault or its settling;
	// AutoAcked: roled acknowledged it itself (the guard's proof held).
	Alarm, AutoAcked bool
	// KeptOther: a held takeover alarm was resolved by keeping the other
	// node's data (Lab.KeepOther) instead of acknowledging it.
	KeptOther bool
	// Errors of the fault's own actions (a refused switchover, a failed
	// start): the fault may not have happened as planned.
	Errors []string
	// SelfHealed: after Stuck, when the cluster settled without any
	// operator command (zero: not before the soak's planned end).
	SelfHealed time.Time
}

// servedAgain is how long after from the pair served writes again, judged on
// the writes that failed in [from, to): the end of the first successful
// write after the last failed one, counted from from. A window without a
// failed write was served throughout (0, true). false: no write succeeded
// after the last failure. A write counts by when it failed, not when it
// started: one sent just before the next fault and failed by it belongs to
// that fault (a soak once charged a node kill 34 s this way, the next
// kill's whole outage).
func servedAgain(samples []ctl.Sample, from, to time.Time) (time.Duration, bool) {
	last := -1
	for i, s := range samples {
		if !s.OK && !s.End.Before(from) && s.End.Before(to) {
			last = i
		}
	}
	if last < 0 {
		return 0, true
	}
	for _, s := range samples[last+1:] {
		if s.OK {
			return s.End.Sub(from), true
		}
	}
	return 0, false
}

// faultKindSummary is the summary line of one fault kind.
type faultKindSummary struct {
	Kind string
	N    int
	// Served: time from the fault's start until the pair served again,
	// per fault that was served again; NotServed counts the others.
	Served    []time.Duration
	NotServed int
	// Redundant: time from the fault's start until REDUNDANT yes.
	Redundant    []time.Duration
	NotRedundant int
	Stuck        int
	// LostRows: acknowledged writes the audit found missing from the
	// database, among the writes that started in the faults' windows.
	LostRows int
}

// lostIn counts the lost ids whose write started in [from, to).
func lostIn(samples []ctl.Sample, lost map[int64]bool, from, to time.Time) int {
	n := 0
	for _, s := range samples {
		if lost[s.ID] && !s.Start.Before(from) && s.Start.Before(to) {
			n++
		}
	}
	return n
}

// summarizeFaults groups the runs by kind (in first-seen order); each
// fault's served-again window ends where the next fault began (the last
// one's at end).
func summarizeFaults(runs []soakFaultRun, samples []ctl.Sample, lost map[int64]bool, end time.Time) []faultKindSummary {
	var out []faultKindSummary
	idx := map[string]int{}
	for i, f := range runs {
		to := end
		if i+1 < len(runs) {
			to = runs[i+1].Began
		}
		k, ok := idx[f.Kind]
		if !ok {
			k = len(out)
			idx[f.Kind] = k
			out = append(out, faultKindSummary{Kind: f.Kind})
		}
		s := &out[k]
		s.N++
		if d, ok := servedAgain(samples, f.Began, to); ok {
			s.Served = append(s.Served, d)
		} else {
			s.NotServed++
		}
		if f.Redundant.IsZero() {
			s.NotRedundant++
		} else {
			s.Redundant = append(s.Redundant, f.Redundant.Sub(f.Began))
		}
		if f.Stuck != "" {
			s.Stuck++
		}
		s.LostRows += lostIn(samples, lost, f.Began, to)
	}
	return out
}

// medianMax is the median (the upper one of an even count) and the maximum.
func medianMax(ds []time.Duration) (med, mx time.Duration, ok bool) {
	if len(ds) == 0 {
		return 0, 0, false
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)-1], true
}

func fmtMedianMax(ds []time.Duration) string {
	med, mx, ok := medianMax(ds)
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.1f s / %.1f s", med.Seconds(), mx.Seconds())
}

// soakResult is everything the soak's summary reports.
type soakResult struct {
	Planned, Ran time.Duration
	Start, End   time.Time
	Runs         []soakFaultRun
	Samples      []ctl.Sample
	Dual, Rounds int // 10 ms checker rounds that saw two ACTIVE, of all
	Leader       string
	LeaderErr    error // no Patroni leader to audit on
	Audit        Audit
	AuditErr     error // the audit could not run: unknown, never "0 lost"
}

// writeSoakSummary prints the summary and returns why the soak failed (nil:
// passed). Headline: the faults, then the outages through the balancer as
// total, longest and count.
func writeSoakSummary(w io.Writer, r soakResult) error {
	var fails []string
	fmt.Fprintf(w, "\n=== soak summary (%s planned, %s ran)\n", r.Planned.Round(time.Second), r.Ran.Round(time.Second))
	fmt.Fprintf(w, "bounds: after each fault's repair, settled (primary + ACTIVE, replica + PASSIVE, balancer serving) within %s "+
		"and hapairctl status REDUNDANT yes within %s\n", soakSettleBound, soakRedundantBound)
	lost := map[int64]bool{}
	for _, id := range r.Audit.LostRows {
		lost[id] = true
	}
	audited := r.LeaderErr == nil && r.AuditErr == nil
	lostText := func(n int) string { // unknown without an audit, never 0
		if !audited {
			return "unknown"
		}
		return fmt.Sprint(n)
	}
	kinds := summarizeFaults(r.Runs, r.Samples, lost, r.End)
	var names []string
	for _, k := range kinds {
		names = append(names, fmt.Sprintf("%d %s", k.N, k.Kind))
	}
	fmt.Fprintf(w, "faults injected: %d (%s)\n", len(r.Runs), strings.Join(names, ", "))
	rep := ctl.Analyze(r.Samples, r.Start)
	fmt.Fprintf(w, "outages through the balancer: %.1f s in all, longest %.1f s, %d outage(s); %d writes, %d failed, max wait %.1f s\n",
		rep.TotalDown.Seconds(), rep.Longest.Seconds(), rep.Outages, rep.Total, rep.Failed, rep.MaxWait.Seconds())
	fmt.Fprintf(w, "dual-ACTIVE rounds (10 ms checker): %d of %d\n", r.Dual, r.Rounds)
	if r.Dual > 0 {
		fails = append(fails, fmt.Sprintf("%d dual-ACTIVE rounds", r.Dual))
	}
	acks, alarms, autos, kept := 0, 0, 0, 0
	for _, f := range r.Runs {
		if f.Acked {
			acks++
		}
		if f.KeptOther {
			kept++
		}
		if f.Alarm {
			alarms++
		}
		if f.AutoAcked {
			autos++
		}
	}
	fmt.Fprintf(w, "takeover alarms: %d raised; %d acknowledged by roled itself (proved nothing lost); held for a person: %d resolved by keeping the other node's data (its rewind held; Patroni stopped on the taker), %d acknowledged (hapairctl ack)\n",
		alarms, autos, kept, acks)
	fmt.Fprintf(w, "%-14s %3s  %-24s %-24s %-9s %s\n", "fault", "n", "served again (med / max)", "redundant (med / max)", "rows lost",
		"not settled / not redundant / never served")
	for _, k := range kinds {
		fmt.Fprintf(w, "%-14s %3d  %-24s %-24s %-9s %d / %d / %d\n", k.Kind, k.N, fmtMedianMax(k.Served), fmtMedianMax(k.Redundant),
			lostText(k.LostRows), k.Stuck, k.NotRedundant, k.NotServed)
	}
	fmt.Fprintln(w, "(served again: from the fault's start to the first write served after its last failed one, 0 when none failed; "+
		"redundant: from the fault's start to REDUNDANT yes; rows lost: acknowledged writes started in the fault's window "+
		"that the audit found missing from the database)")
	for i, f := range r.Runs {
		to := r.End
		if i+1 < len(r.Runs) {
			to = r.Runs[i+1].Began
		}
		served := "never served again"
		if d, ok := servedAgain(r.Samples, f.Began, to); ok {
			served = fmt.Sprintf("served again %.1f s", d.Seconds())
		}
		red := "not redundant within the bound"
		if !f.Redundant.IsZero() {
			red = fmt.Sprintf("redundant %.1f s", f.Redundant.Sub(f.Began).Seconds())
		}
		fmt.Fprintf(w, "  +%-8s %-14s %-8s %s, %s, acknowledged rows lost %s\n", fmtOffset(f.Began.Sub(r.Start)), f.Kind, f.Target,
			served, red, lostText(lostIn(r.Samples, lost, f.Began, to)))
		for _, e := range f.Errors {
			fmt.Fprintf(w, "      fault action: %s\n", e)
		}
		if f.Stuck != "" {
			fmt.Fprintf(w, "      NOT SETTLED: %s\n", f.Stuck)
			if f.SelfHealed.IsZero() {
				fmt.Fprintln(w, "      (still not settled at the soak's planned end; no fault injected after it)")
			} else {
				fmt.Fprintf(w, "      settled by itself %.1f s after the repair (no fault injected after it)\n",
					f.SelfHealed.Sub(f.Repaired).Seconds())
			}
			fails = append(fails, fmt.Sprintf("not settled after the %s at +%s", f.Kind, fmtOffset(f.Began.Sub(r.Start))))
		} else if f.Redundant.IsZero() {
			fmt.Fprintf(w, "      NOT REDUNDANT: %s\n", f.NotRedundant)
			fails = append(fails, fmt.Sprintf("not redundant after the %s at +%s", f.Kind, fmtOffset(f.Began.Sub(r.Start))))
		}
	}
	switch {
	case r.LeaderErr != nil:
		fmt.Fprintf(w, "audit: unknown (no Patroni leader to audit on: %v)\n", r.LeaderErr)
		fails = append(fails, "audit unknown")
	case r.AuditErr != nil:
		fmt.Fprintf(w, "audit on %s: unknown (could not run: %v)\n", r.Leader, r.AuditErr)
		fails = append(fails, "audit unknown")
	default:
		fmt.Fprintf(w, "audit on %s: %s\n", r.Leader, r.Audit)
		if len(r.Audit.Overwritten) > 0 || len(r.Audit.LostFiles) > 0 {
			fails = append(fails, "files overwritten or silently lost")
		}
	}
	if len(fails) == 0 {
		fmt.Fprintln(w, "result: PASS")
		return nil
	}
	fmt.Fprintf(w, "result: FAIL (%s)\n", strings.Join(fails, "; "))
	return errors.New("soak failed: " + strings.Join(fails, "; "))
}

func fmtOffset(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
}

// outageFigures records a probe run's outages as the scenarios' figures:
// the visible downtime is all of them (rep.Downtime is only the first, and
// a run with a second outage printed it as if it were the whole), then the
// longest and their number.
func outageFigures(r *Result, name string, rep ctl.ProbeReport) {
	r.secs(name+": visible downtime (all outages)", rep.TotalDown)
	r.secs(name+": longest outage", rep.Longest)
	r.fig(name+": outages", float64(rep.Outages), "")
}
