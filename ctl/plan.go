package ctl

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/hapair/hapair/budget"
	"github.com/hapair/hapair/internal/config"
	"github.com/hapair/hapair/lb"
	"github.com/hapair/hapair/roled"
)

// TimingKind is the kind of file hapairctl plan --check read timers from.
type TimingKind string

// The files plan --check understands.
const (
	TimingRoled          TimingKind = "roled.yaml"
	TimingLB             TimingKind = "lb.yaml"
	TimingWitness        TimingKind = "witness.yaml"
	TimingPatroni        TimingKind = "patroni config.yml (bootstrap.dcs)"
	TimingPatroniDynamic TimingKind = "patroni dynamic configuration"
	TimingPlan           TimingKind = "hapairctl plan --json"
)

// TimingSource is one file read by ReadTimings.
type TimingSource struct {
	Path string
	Kind TimingKind
}

// ReadTimings reads the timers of every file ("-" is standard input) (roled.yaml, lb.yaml,
// witness.yaml, Patroni's config.yml or its dynamic configuration as
// patronictl show-config / GET /config print it, or a plan --json file) and
// merges them; every field is named "<file>: <key>". The same timer set to
// two values in two files (roled's patroni.ttl and Patroni's ttl, node A's
// and node B's lease) is an error naming both.
func ReadTimings(paths []string) (budget.Timers, []TimingSource, error) {
	merged := budget.Timers{Names: map[budget.Key]string{}}
	var srcs []TimingSource
	for _, p := range paths {
		t, kind, err := readTimingFile(p)
		if err != nil {
			return merged, srcs, err
		}
		srcs = append(srcs, TimingSource{p, kind})
		if kind == TimingLB {
			merged.FastPath = t.FastPath
		}
		for _, k := range budget.Keys() {
			d, ok := t.Get(k)
			_, named := t.Names[k]
			if !ok && !(k == budget.HoldTimeout && named) {
				continue
			}
			if prev, had := merged.Get(k); had && prev != d {
				return merged, srcs, config.Errorf(t.Name(k), show(k, d), "differs from %s (%s): the parts must agree", merged.Name(k), show(k, prev))
			}
			merged.Set(k, d)
			merged.Names[k] = t.Name(k)
		}
	}
	if _, ok := merged.Names[budget.CheckInterval]; !ok {
		merged.FastPath = true // no lb.yaml: the shipped lb config uses the fast path
	}
	return merged, srcs, nil
}

func show(k budget.Key, d time.Duration) string {
	if k.IsCount() {
		return fmt.Sprint(int64(d))
	}
	return d.String()
}

func readTimingFile(path string) (budget.Timers, TimingKind, error) {
	var b []byte
	var err error
	name := filepath.Base(path)
	if path == "-" { // the Ansible play hands its merged timers over on stdin
		b, err = io.ReadAll(os.Stdin)
		name = "stdin"
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return budget.Timers{}, "", &config.LoadError{Path: path, Err: err}
	}
	var top map[string]any
	if err := yaml.Unmarshal(b, &top); err != nil {
		return budget.Timers{}, "", &config.LoadError{Path: path, Err: err}
	}
	has := func(keys ...string) bool {
		for _, k := range keys {
			if _, ok := top[k]; ok {
				return true
			}
		}
		return false
	}
	switch {
	// A plan: hapairctl plan --json's (outages), or the Ansible play's
	// merged timers (target, with only the sections hand-set).
	case has("outages", "target") || (has("roled") && has("lb")):
		var f budget.File
		if err := yaml.Unmarshal(b, &f); err != nil {
			return budget.Timers{}, "", &config.LoadError{Path: path, Err: err}
		}
		t, err := f.Timers(name)
		return t, TimingPlan, err
	case has("backends", "listeners"):
		cfg := lb.DefaultConfig()
		if err := config.Decode(b, &cfg); err != nil {
			return budget.Timers{}, "", &config.LoadError{Path: path, Err: err}
		}
		if err := cfg.Validate(); err != nil {
			return budget.Timers{}, "", fmt.Errorf("%s: %w", name, err)
		}
		for i, be := range cfg.Backends {
			if be.Kind == lb.KindActivePassive {
				return prefixed(be.Timers(fmt.Sprintf("backends[%d]", i)), name), TimingLB, nil
			}
		}
		return budget.Timers{}, "", &config.LoadError{Path: path, Err: errors.New("no active-passive backend: nothing of the budget in it")}
	case has("lease-ttl", "node"):
		cfg := roled.DefaultConfig()
		if err := config.Decode(b, &cfg); err != nil {
			return budget.Timers{}, "", &config.LoadError{Path: path, Err: err}
		}
		if err := cfg.Validate(); err != nil {
			return budget.Timers{}, "", fmt.Errorf("%s: %w", name, err)
		}
		return prefixed(cfg.Timers(), name), TimingRoled, nil
	case has("initial-cluster", "election-timeout", "heartbeat-interval", "advertise-peer-urls"):
		// hapair-witness's own defaults (witness.DefaultConfig); the rest of
		// the file is the witness's to check (hapair-witness --check-config).
		w := struct {
			Heartbeat time.Duration `yaml:"heartbeat-interval"`
			Election  time.Duration `yaml:"election-timeout"`
		}{100 * time.Millisecond, time.Second}
		if err := yaml.Unmarshal(b, &w); err != nil {
			return budget.Timers{}, "", &config.LoadError{Path: path, Err: err}
		}
		return prefixed(budget.Timers{EtcdHeartbeat: w.Heartbeat, EtcdElection: w.Election}, name), TimingWitness, nil
	case has("ttl", "loop_wait", "retry_timeout"):
		t, err := patroniTimers(b, path, "")
		return prefixed(t, name), TimingPatroniDynamic, err
	case has("bootstrap", "restapi", "postgresql"):
		t, err := patroniTimers(b, path, "bootstrap.dcs.")
		return prefixed(t, name), TimingPatroni, err
	}
	return budget.Timers{}, "", &config.LoadError{Path: path,
		Err: errors.New("not a roled, lb, witness, Patroni or plan file (none of their keys at the top)")}
}

// patroniTimers reads ttl, loop_wait and retry_timeout (seconds) at the top
// level (dynamic configuration) or under bootstrap.dcs (config.yml).
func patroniTimers(b []byte, path, prefix string) (budget.Timers, error) {
	type dcs struct {
		TTL          *float64 `yaml:"ttl"`
		LoopWait     *float64 `yaml:"loop_wait"`
		RetryTimeout *float64 `yaml:"retry_timeout"`
	}
	var f struct {
		Top       dcs `yaml:",inline"`
		Bootstrap struct {
			DCS dcs `yaml:"dcs"`
		} `yaml:"bootstrap"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		return budget.Timers{}, &config.LoadError{Path: path, Err: err}
	}
	d := f.Top
	if prefix != "" {
		d = f.Bootstrap.DCS
	}
	// Patroni's own defaults (30/10/10) apply to what the file leaves out.
	sec := func(v *float64, def float64) time.Duration {
		if v == nil {
			return time.Duration(def * float64(time.Second))
		}
		return time.Duration(*v * float64(time.Second))
	}
	t := budget.Timers{PatroniTTL: sec(d.TTL, 30), PatroniLoopWait: sec(d.LoopWait, 10), PatroniRetryTimeout: sec(d.RetryTimeout, 10),
		Names: map[budget.Key]string{budget.PatroniTTL: prefix + "ttl", budget.PatroniLoopWait: prefix + "loop_wait",
			budget.PatroniRetryTimeout: prefix + "retry_timeout"}}
	return t, nil
}

// prefixed names every known timer of t "<file>: <key>".
func prefixed(t budget.Timers, file string) budget.Timers {
	names := map[budget.Key]string{}
	for _, k := range budget.Keys() {
		_, known := t.Get(k)
		if _, named := t.Names[k]; known || named {
			names[k] = file + ": " + t.Name(k)
		}
	}
	t.Names = names
	return t
}

// WritePlan prints the timers by part and every fault's arithmetic: how the
// outage splits into detection, decision, promotion and routing, typical and
// worst. target 0 prints no verdict.
func WritePlan(w io.Writer, target time.Duration, t budget.Timers) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PART\tSETTING\tVALUE\tWHERE")
	full := t.Merge(budget.Defaults())
	parts := []struct {
		part string
		keys []budget.Key
	}{
		{"etcd", []budget.Key{budget.EtcdHeartbeat, budget.EtcdElection}},
		{"patroni", []budget.Key{budget.PatroniTTL, budget.PatroniLoopWait, budget.PatroniRetryTimeout}},
		{"roled", []budget.Key{budget.LeaseTTL, budget.SafetyMargin, budget.KeepAliveInterval, budget.RereadInterval,
			budget.PollInterval, budget.FastPollInterval, budget.PatroniTimeout, budget.PostgresTimeout,
			budget.QuorumLossAfter, budget.QuorumCheckInterval, budget.SyncRetryMin, budget.SyncRetryMax}},
		{"lb", []budget.Key{budget.CheckInterval, budget.CheckTimeout, budget.CheckFall, budget.CheckRise, budget.HoldTimeout}},
	}
	for _, p := range parts {
		for _, k := range p.keys {
			d, _ := full.Get(k)
			where := "derived"
			if target == 0 {
				where = t.Name(k)
				if _, ok := t.Get(k); !ok && !(k == budget.HoldTimeout && t.Names[k] != "") {
					where = "not given: hapair's default"
				}
			}
			v := show(k, d)
			if p.part == "patroni" {
				v = fmt.Sprintf("%d", int64(d/time.Second)) // Patroni takes seconds
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.part, k, v, where)
		}
	}
	fmt.Fprintf(tw, "lb\tetcd-fast-path\t%v\t\n", full.FastPath)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, o := range budget.Arithmetic(t) {
		fmt.Fprintf(w, "%s: typical %s, worst %s\n", o.Fault, o.Typical, o.Worst)
		if o.Outside != "" {
			fmt.Fprintf(w, "  outside the target: %s; the hold-timeout covers its worst\n", o.Outside)
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		var typ, worst []string
		for _, s := range o.Steps {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", s.Stage, s.Typical, s.Worst, s.Why)
			typ, worst = append(typ, s.Typical.String()), append(worst, s.Worst.String())
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(w, "  typical %s = %s; worst %s = %s\n", strings.Join(typ, " + "), o.Typical, strings.Join(worst, " + "), o.Worst)
	}
	if target > 0 {
		p := budget.Plan{Target: target, Timers: t, Outages: budget.Arithmetic(t)}
		b := p.Binding()
		verdict := "meets"
		if !p.Meets() {
			verdict = "MISSES"
		}
		fmt.Fprintf(w, "\n%s rto %s: every typical outage ≤ %s and worst ≤ %s (%.1f × target), those outside it aside; binding: %s (typical %s, worst %s)\n",
			verdict, target, target, time.Duration(float64(target)*budget.WorstFactor), budget.WorstFactor, b.Fault, b.Typical, b.Worst)
	}
	return nil
}
