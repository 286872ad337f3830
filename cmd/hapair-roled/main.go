// Command hapair-roled runs on each data node: it maps Patroni leadership to
// the ACTIVE/PASSIVE role of the application, fenced by an etcd lease, and
// serves /ha-health, /role, /metrics and the HAProxy agent-checks.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/hapair/hapair/internal/config"
	"github.com/hapair/hapair/internal/daemon"
	"github.com/hapair/hapair/roled"
	"github.com/hapair/hapair/syncdir"
)

const name = "hapair-roled"

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	cfg := roled.DefaultConfig()
	cmd, err := config.ParseCommandLine(name, args, "/etc/hapair/roled.yaml", &cfg)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case cmd.Version:
		fmt.Println(name, daemon.Version)
		return 0
	case err != nil:
		return daemon.Exit(name, err, isConfigErr)
	case cmd.CheckOnly:
		fmt.Printf("%s: configuration ok (%s)\n", name, orDefaults(cmd.ConfigPath))
		return 0
	}
	lg, err := daemon.NewLogger(cfg.LogLevel)
	if err != nil {
		return daemon.Exit(name, err, isConfigErr)
	}
	defer func() { _ = lg.Sync() }()
	return daemon.Exit(name, serve(cfg, lg), isConfigErr)
}

func serve(cfg roled.Config, lg *zap.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d, err := roled.New(cfg, lg.Named("roled"), roled.NewMetrics(reg))
	if err != nil {
		return err
	}
	var sync *syncdir.Syncer
	if cfg.SyncEnabled() {
		// The daemon is the sync's Fence (Holding, ActiveEpoch); the role
		// drives the sync's direction through SetSync.
		if sync, err = syncdir.New(cfg.SyncConfig(), lg.Named("sync"), syncdir.NewMetrics(reg), d); err != nil {
			d.Close()
			return err
		}
		d.SetSync(roled.SyncHooks{SetActive: sync.SetActive, SetPassive: sync.SetPassive,
			Status: func() any { return sync.Status() },
			Quarantined: func() int64 {
				var n int64
				for _, c := range sync.Status().QuarantineFiles {
					n += c
				}
				return n
			}})
	}
	ctx, stop := daemon.SignalContext()
	defer stop()
	go daemon.Watchdog(ctx, d.Alive)
	go func() {
		<-ctx.Done()
		daemon.Stopping()
	}()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.Run(gctx) })
	if sync != nil {
		g.Go(func() error { return sync.Run(gctx) })
	}
	daemon.Ready()
	return g.Wait()
}

func isConfigErr(err error) bool {
	var ue *config.UsageError
	return config.IsConfigError(err) || errors.As(err, &ue)
}

func orDefaults(path string) string {
	if path == "" {
		return "defaults and flags, no file"
	}
	return path
}
