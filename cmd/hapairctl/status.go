package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"

	"github.com/hapair/hapair/ctl"
	"github.com/hapair/hapair/internal/config"
)

func init() {
	register(command{name: "status", summary: "REDUNDANT yes/no, then one table of the whole cluster (--json); exit 0 redundant, 1 degraded, 2 not serving", run: runStatus})
}

// loadCtl parses the subcommand's flags (plus --config) and reads ctl.yaml.
// It returns an exit code and false when the caller should stop.
func loadCtl(fs *flag.FlagSet, e *env, args []string) (ctl.Config, int, bool) {
	cfg := ctl.DefaultConfig()
	path := fs.String("config", ctl.DefaultPath, "hapairctl configuration (YAML)")
	if code, ok := parseFlags(fs, e, args); !ok {
		return cfg, code, false
	}
	if err := config.Load(*path, &cfg); err != nil {
		e.errorf(fs.Name(), "%v", err)
		return cfg, 2, false
	}
	if err := cfg.Validate(); err != nil {
		e.errorf(fs.Name(), "%v", err)
		return cfg, 2, false
	}
	return cfg, 0, true
}

// runStatus prints the whole cluster: etcd, Patroni, roled, balancer.
func runStatus(ctx context.Context, e *env, args []string) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON instead of the table")
	cfg, code, ok := loadCtl(fs, e, args)
	if !ok {
		return code
	}
	st := ctl.NewClient(cfg, nil, nil).Status(ctx)
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(st); err != nil {
			return int(ctl.NotServing)
		}
		return int(st.Redundancy.Level)
	}
	if err := st.WriteTable(e.stdout); err != nil {
		return int(ctl.NotServing)
	}
	for _, a := range st.Alarms {
		if !a.Acked() {
			fmt.Fprintln(e.stdout, "\ntakeover alarm raised: check the data (LAB.md §6), then clear it with: hapairctl ack")
			break
		}
	}
	// For scripts and monitoring: 0 redundant, 1 serving but not
	// redundant, 2 not serving (also a configuration error, above).
	return int(st.Redundancy.Level)
}
