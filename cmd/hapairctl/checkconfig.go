package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/hapair/hapair/ctl"
	"github.com/hapair/hapair/internal/config"
)

// isCheckConfig reports whether args are the common check command line of
// every hapair binary (--config FILE --check-config, -t), rather than a
// subcommand: Ansible validates ctl.yaml the way it validates the others.
func isCheckConfig(args []string) bool {
	return len(args) > 0 && strings.HasPrefix(args[0], "-") && args[0] != "-h" && args[0] != "--help" && args[0] != "--version"
}

// runCheckConfig loads and validates ctl.yaml as every subcommand would
// (the full file, strictly; the etcd part as check and ack read it). Exit
// 0 when fine, 2 with the field named otherwise.
func runCheckConfig(e *env, args []string) int {
	fs := flag.NewFlagSet("hapairctl", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	path := fs.String("config", ctl.DefaultPath, "hapairctl configuration (YAML)")
	check := fs.Bool("check-config", false, "validate the configuration and exit")
	fs.BoolVar(check, "t", false, "same as --check-config")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if !*check || fs.NArg() > 0 {
		fmt.Fprintln(e.stderr, "usage: hapairctl [--config FILE] --check-config   or   hapairctl COMMAND [flags]")
		return 2
	}
	cfg := ctl.DefaultConfig()
	if err := config.Load(*path, &cfg); err != nil {
		fmt.Fprintf(e.stderr, "hapairctl: %v\n", err)
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(e.stderr, "hapairctl: %s: %v\n", *path, err)
		return 2
	}
	if _, err := (&ctlFlags{path: *path}).load(); err != nil {
		fmt.Fprintf(e.stderr, "hapairctl: %s: %v\n", *path, err)
		return 2
	}
	fmt.Fprintf(e.stdout, "hapairctl: %s: configuration ok\n", *path)
	return 0
}
