package main

import (
	"context"
	"flag"
	"strconv"

	"github.com/hapair/hapair/ctl"
)

func init() {
	register(command{name: "switchover", summary: "planned switchover via Patroni to a ready standby (--force), followed until the pair is redundant again", run: runSwitchover})
}

// runSwitchover asks Patroni for a planned switchover and follows it until
// the balancer serves from the new node, printing each step with its time.
func runSwitchover(ctx context.Context, e *env, args []string) int {
	fs := flag.NewFlagSet("switchover", flag.ContinueOnError)
	to := fs.String("to", "", "node that becomes primary and ACTIVE (required)")
	force := fs.Bool("force", false, "switch over even to a node that is not ready to take over (loses what it lacks)")
	stepDown := fs.String("step-down", "", "true|false: ask the old ACTIVE's roled to step down first (default: step-down in ctl.yaml, true)")
	cfg, code, ok := loadCtl(fs, e, args)
	if !ok {
		return code
	}
	if *stepDown != "" {
		v, err := strconv.ParseBool(*stepDown)
		if err != nil {
			e.errorf("switchover", "--step-down %q: want true or false", *stepDown)
			return 2
		}
		cfg.StepDown = v
	}
	if *to == "" {
		e.errorf("switchover", "--to NODE is required")
		return 2
	}
	c := ctl.NewClient(cfg, nil, nil)
	c.Force = *force
	if _, err := c.Switchover(ctx, *to, e.stdout); err != nil {
		e.errorf("switchover", "%v", err)
		return 1
	}
	return 0
}
