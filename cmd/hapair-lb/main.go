// Command hapair-lb is hapair's balancer: it routes HTTP to the ACTIVE node,
// balances Web pools, and forwards PostgreSQL connections to the Patroni
// primary or to replicas. See examples/lb.yaml.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/hapair/hapair/internal/config"
	"github.com/hapair/hapair/internal/daemon"
	"github.com/hapair/hapair/lb"
)

const defaultPath = "/etc/hapair/lb.yaml"

func main() {
	err := run(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	os.Exit(daemon.Exit("hapair-lb", err, isConfigError))
}

func isConfigError(err error) bool {
	var ue *config.UsageError
	return config.IsConfigError(err) || errors.As(err, &ue)
}

func run(args []string) error {
	cfg := lb.DefaultConfig()
	cmd, err := config.ParseCommandLine("hapair-lb", args, defaultPath, &cfg)
	if cmd.Version {
		fmt.Println("hapair-lb", daemon.Version)
		return nil
	}
	if err != nil {
		return err
	}
	if cmd.CheckOnly {
		fmt.Printf("hapair-lb: configuration %s is valid\n", orDefaults(cmd.ConfigPath))
		return nil
	}
	lg, err := daemon.NewLogger(cfg.LogLevel)
	if err != nil {
		return err
	}
	defer func() { _ = lg.Sync() }()
	lg.Info("starting", zap.String("version", daemon.Version), zap.String("config", cmd.ConfigPath))

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	b, err := lb.New(cfg, lg.Named("lb"), lb.NewMetrics(reg))
	if err != nil {
		return err
	}
	b.SetGatherer(reg)
	if c := b.VIPCollector(); c != nil {
		reg.MustRegister(c)
	}

	// Registered before anything runs: an early SIGHUP must not kill us.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	ctx, stop := daemon.SignalContext()
	defer stop()
	go daemon.Watchdog(ctx, nil)
	go reloadOnHUP(ctx, lg, b, args, hup)
	go func() {
		select {
		case <-b.Ready():
			daemon.Ready()
		case <-ctx.Done():
		}
	}()
	err = b.Run(ctx)
	daemon.Stopping()
	return err
}

// reloadOnHUP re-reads the configuration (file and the same flags) on
// SIGHUP. A configuration that does not validate is refused and the
// running one keeps serving.
func reloadOnHUP(ctx context.Context, lg *zap.Logger, b *lb.LB, args []string, hup <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		cfg := lb.DefaultConfig()
		_, err := config.ParseCommandLine("hapair-lb", args, defaultPath, &cfg)
		if err == nil {
			err = b.Reload(cfg)
		}
		if err != nil {
			lg.Error("reload refused, keeping the running configuration", zap.Error(err))
			continue
		}
		lg.Info("reload applied")
	}
}

func orDefaults(p string) string {
	if p == "" {
		return "(defaults)"
	}
	return p
}
