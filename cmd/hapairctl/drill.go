package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/hapair/hapair/ctl"
)

func init() {
	register(command{name: "drill", summary: "failover drill both ways on a redundant pair (asks first; --yes): stop a node hard, takeover, time to redundancy", run: runDrill})
}

// runDrill runs the failover drill in both directions with the stop/start
// commands of ctl.yaml; any failed check gives exit code 1.
func runDrill(ctx context.Context, e *env, args []string) int {
	fs := flag.NewFlagSet("drill", flag.ContinueOnError)
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	cfg, code, ok := loadCtl(fs, e, args)
	if !ok {
		return code
	}
	if !*yes && !confirm(e, "hapairctl drill stops the primary's node hard (stop-command), then the other one; "+
		"each phase waits for a ready standby first. Type yes to go on: ") {
		e.errorf("drill", "not confirmed (--yes to skip the question)")
		return 1
	}
	phases, err := ctl.NewClient(cfg, nil, nil).Drill(ctx, e.stdout)
	ctl.WriteDrillReport(e.stdout, phases)
	if err != nil {
		e.errorf("drill", "%v", err)
		return 1
	}
	return 0
}

// confirm asks on stdout and reads one line from stdin; only "yes" is yes.
func confirm(e *env, question string) bool {
	if e.stdin == nil {
		return false
	}
	fmt.Fprint(e.stdout, question)
	line, _ := bufio.NewReader(e.stdin).ReadString('\n')
	return strings.TrimSpace(line) == "yes"
}
