package main

import (
	"context"
	"encoding/json"
	"flag"

	"github.com/hapair/hapair/ctl"
)

func init() {
	register(command{name: "history", summary: "every role change roled recorded: kind, from, to, epochs, time without an ACTIVE node, WAL lost, files quarantined, time to redundancy and its split (--json)", run: runHistory})
}

func runHistory(ctx context.Context, e *env, args []string) int {
	fs := flag.NewFlagSet("history", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON instead of the table")
	cfg, code, ok := loadCtl(fs, e, args)
	if !ok {
		return code
	}
	evs, err := ctl.NewClient(cfg, nil, nil).History(ctx)
	if err != nil {
		e.errorf("history", "%v", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(evs); err != nil {
			return 1
		}
		return 0
	}
	if err := ctl.WriteHistory(e.stdout, evs); err != nil {
		return 1
	}
	return 0
}
