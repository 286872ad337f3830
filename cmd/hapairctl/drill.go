package main

import (
	"context"
	"flag"

	"github.com/hapair/hapair/ctl"
)

func init() {
	register(command{name: "drill", summary: "failover drill both ways: stop a node hard, check takeover and rejoin, measure downtime", run: runDrill})
}

// runDrill runs the failover drill in both directions with the stop/start
// commands of ctl.yaml; any failed check gives exit code 1.
func runDrill(ctx context.Context, e *env, args []string) int {
	fs := flag.NewFlagSet("drill", flag.ContinueOnError)
	cfg, code, ok := loadCtl(fs, e, args)
	if !ok {
		return code
	}
	phases, err := ctl.NewClient(cfg, nil, nil).Drill(ctx, e.stdout)
	ctl.WriteDrillReport(e.stdout, phases)
	if err != nil {
		e.errorf("drill", "%v", err)
		return 1
	}
	return 0
}
