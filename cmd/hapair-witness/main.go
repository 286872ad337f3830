// Command hapair-witness runs one embedded etcd member: the witness VM's
// vote (role witness) or a data node's etcd (role member).
//
//	hapair-witness --config /etc/hapair/witness.yaml [--check-config] [--<key> value ...]
//
// It tells systemd READY=1 once the member has joined the quorum, pings the
// watchdog while its check loop runs, and stops gracefully on SIGTERM/SIGINT.
// Configuration errors exit with status 2 before anything touches the data
// directory.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/hapair/hapair/internal/config"
	"github.com/hapair/hapair/internal/daemon"
	"github.com/hapair/hapair/witness"
)

const name = "hapair-witness"

func main() {
	os.Exit(daemon.Exit(name, run(os.Args[1:]), isConfigError))
}

func isConfigError(err error) bool {
	var ue *config.UsageError
	return config.IsConfigError(err) || errors.As(err, &ue)
}

func run(args []string) error {
	cfg := witness.DefaultConfig()
	cmd, err := config.ParseCommandLine(name, args, "/etc/hapair/witness.yaml", &cfg)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return nil
	case cmd.Version:
		fmt.Println(name, daemon.Version)
		return nil
	case err != nil:
		return err
	case cmd.CheckOnly:
		fmt.Fprintln(os.Stderr, name+": configuration ok")
		return nil
	}

	lg, err := daemon.NewLogger(cfg.LogLevel)
	if err != nil {
		return config.Errorf("log-level", cfg.LogLevel, "%v", err)
	}
	defer func() { _ = lg.Sync() }()
	lg.Info("starting", zap.String("version", daemon.Version), zap.String("config", cmd.ConfigPath),
		zap.String("name", cfg.Name), zap.String("role", string(cfg.Role)), zap.String("mode", string(cfg.Mode)))

	m, err := witness.New(cfg, lg.Named("witness"), witness.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		return err
	}
	ctx, stop := daemon.SignalContext()
	defer stop()
	notifyCtx, cancelNotify := context.WithCancel(ctx)
	defer cancelNotify()
	go notifySystemd(notifyCtx, m)

	err = m.Run(ctx)
	lg.Info("stopped", zap.Error(err))
	return err
}

// notifySystemd sends READY=1 once the member is in the quorum, pings the
// watchdog while the member's check loop is alive, and says STOPPING=1 as
// soon as the stop begins (a leader's stop can take an election timeout).
func notifySystemd(ctx context.Context, m *witness.Member) {
	defer daemon.Stopping()
	select {
	case <-ctx.Done():
		return
	case <-m.Ready():
	}
	daemon.Ready()
	daemon.Watchdog(ctx, m.Alive)
	<-ctx.Done()
}
