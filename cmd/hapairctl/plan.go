package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/hapair/hapair/budget"
	"github.com/hapair/hapair/ctl"
)

func init() {
	register(command{name: "plan", summary: "the timing budget: --rto 5s derives every timer with the worst-case arithmetic; --check FILE... validates hand-set ones (--json)", run: runPlan})
}

// runPlan: exit 0 when the target is met (or the files keep every rule), 1
// when a target cannot be met safely or checked files miss --rto, 2 on
// usage errors, unreadable files and broken rules.
func runPlan(_ context.Context, e *env, args []string) int {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	rto := fs.Duration("rto", 0, "recovery time objective: the typical outage of an unplanned failover (e.g. 5s)")
	check := fs.Bool("check", false, "validate the timers of the files given as arguments (roled.yaml, lb.yaml, witness.yaml, Patroni's config.yml or dynamic config, a plan --json file) against the rules, together")
	asJSON := fs.Bool("json", false, "print the plan as JSON (the form --check and the Ansible play read back)")
	patroni := fs.String("patroni", "", "the Patroni release that runs the timers, as `patroni --version` says it (default "+budget.DefaultPatroni+"; from 3.2.0 on Patroni raises ttl below 20s and retry_timeout below 3s)")
	fs.Usage = func() {
		fmt.Fprintln(e.stderr, "usage: hapairctl plan --rto DURATION [--patroni VERSION] [--json]\n       hapairctl plan --check [--rto DURATION] [--patroni VERSION] [--json] FILE...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *patroni != "" {
		if _, err := budget.FloorsFor(*patroni); err != nil {
			e.errorf("plan", "--patroni: %v", err)
			return 2
		}
	}
	if *check {
		return planCheck(e, *rto, *patroni, *asJSON, fs.Args())
	}
	if *rto == 0 || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	if *patroni == "" {
		*patroni = budget.DefaultPatroni
	}
	p, err := budget.DeriveFor(*rto, *patroni)
	if err != nil {
		e.errorf("plan", "%v", err)
		var re *budget.RefusedError
		if errors.As(err, &re) && re.Closest != nil {
			fmt.Fprintf(e.stderr, "\nthe fastest safe timers, for comparison:\n\n")
			_ = ctl.WritePlan(e.stderr, 0, re.Closest.Timers)
		}
		return 1
	}
	if *asJSON {
		return writeJSON(e.stdout, p.File())
	}
	fmt.Fprintf(e.stdout, "timing budget for rto %s on Patroni %s: typical outage ≤ %s, worst ≤ %s\n\n", p.Target,
		p.Timers.PatroniVersion, p.Target, time.Duration(float64(p.Target)*budget.WorstFactor))
	if err := ctl.WritePlan(e.stdout, p.Target, p.Timers); err != nil {
		return 1
	}
	return 0
}

// planCheck validates files together; patroni (when given) is the release
// that runs them, over any patroni.version a plan file carries.
func planCheck(e *env, rto time.Duration, patroni string, asJSON bool, files []string) int {
	if len(files) == 0 {
		e.errorf("plan", "--check needs at least one file")
		return 2
	}
	t, srcs, err := ctl.ReadTimings(files)
	if err != nil {
		e.errorf("plan", "%v", err)
		return 2
	}
	if patroni != "" {
		t.PatroniVersion = patroni
	}
	vs := budget.Violations(t)
	if asJSON {
		if code := writeJSON(e.stdout, budget.FileOf(rto, t.Merge(budget.Defaults()))); code != 0 {
			return code
		}
	} else {
		for _, s := range srcs {
			fmt.Fprintf(e.stdout, "read %s (%s)\n", s.Path, s.Kind)
		}
		fmt.Fprintln(e.stdout)
		if err := ctl.WritePlan(e.stdout, rto, t); err != nil {
			return 1
		}
	}
	for _, v := range vs {
		e.errorf("plan", "%v", v)
	}
	if len(vs) > 0 {
		return 2
	}
	if rto > 0 {
		p := budget.Plan{Target: rto, Timers: t, Outages: budget.Arithmetic(t)}
		if !p.Meets() {
			e.errorf("plan", "these timers miss rto %s (see the arithmetic); hapairctl plan --rto %s derives ones that meet it", rto, rto)
			return 1
		}
	}
	return 0
}

func writeJSON(w io.Writer, v any) int {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return 1
	}
	return 0
}
