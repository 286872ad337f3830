// Package daemon holds the process plumbing every hapair binary shares: the
// logger, signals, systemd readiness and watchdog, and HTTP serving with a
// graceful stop. Component packages never import it; mains do.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Version is the build's version, set with -ldflags "-X github.com/hapair/hapair/internal/daemon.Version=...".
var Version = "dev"

// ShutdownTimeout bounds a graceful HTTP stop before connections are closed.
const ShutdownTimeout = 5 * time.Second

// NewLogger returns the binary's one structured logger: JSON on stderr (which
// systemd's journal keeps), at level debug, info, warn or error. etcd's
// client and server are handed the same logger.
func NewLogger(level string) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.EncoderConfig.TimeKey = "ts"
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	cfg.Sampling = nil // transitions are rare and must never be dropped
	return cfg.Build()
}

// SignalContext is cancelled by SIGINT or SIGTERM (systemd stops with SIGTERM).
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// Ready tells systemd (Type=notify) the service is ready. Outside systemd it
// does nothing.
func Ready() { _, _ = daemon.SdNotify(false, daemon.SdNotifyReady) }

// Stopping tells systemd the service is stopping.
func Stopping() { _, _ = daemon.SdNotify(false, daemon.SdNotifyStopping) }

// Watchdog pings systemd's watchdog at half its interval until ctx is done.
// It returns at once when the unit has no WatchdogSec. alive, when not nil, is
// asked before each ping: a process whose main loop is stuck must not keep
// itself alive by a healthy side goroutine.
func Watchdog(ctx context.Context, alive func() bool) {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil || interval <= 0 {
		return
	}
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if alive == nil || alive() {
				_, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog)
			}
		}
	}
}

// ServeHTTP listens on addr and serves h until ctx is done, then shuts down
// gracefully within ShutdownTimeout.
func ServeHTTP(ctx context.Context, lg *zap.Logger, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	return Serve(ctx, lg, ln, &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second})
}

// Serve serves srv on ln until ctx is done, then shuts it down gracefully.
// It returns nil after a stop caused by ctx.
func Serve(ctx context.Context, lg *zap.Logger, ln net.Listener, srv *http.Server) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	lg.Info("serving http", zap.String("addr", ln.Addr().String()))
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		lg.Warn("http shutdown deadline passed, closing connections", zap.Error(err))
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Exit prints err for a main and returns the exit code: 2 for configuration
// and usage errors, 1 otherwise, 0 for nil.
func Exit(name string, err error, isConfig func(error) bool) int {
	if err == nil {
		return 0
	}
	fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	if isConfig(err) {
		return 2
	}
	return 1
}
