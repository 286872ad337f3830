package roled

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// markerValue is the content of the marker file.
type markerValue struct {
	Node  string `json:"node"`
	Epoch int64  `json:"epoch"`
	Since string `json:"since"`
}

// writeMarker writes the marker atomically: a temp file in the same
// directory, fsync, rename, fsync of the directory. Readers see the old
// state or the whole new file, never a torn one. An empty path disables it.
func writeMarker(path string, v markerValue) error {
	if path == "" {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".active-*")
	if err != nil {
		return fmt.Errorf("marker temp file: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after the rename
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("marker write: %w", err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return fmt.Errorf("marker chmod: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("marker fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("marker close: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("marker rename: %w", err)
	}
	return syncDir(dir)
}

// removeMarker removes the marker (absent is fine) and syncs the directory.
func removeMarker(path string) error {
	if path == "" {
		return nil
	}
	if err := os.Remove(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("marker remove: %w", err)
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir %s: %w", dir, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}

// maxHookOutput bounds the hook output kept for the log.
const maxHookOutput = 16 << 10

// runHook runs a hook command with /bin/sh -c in its own process group,
// killed as a group on timeout, and logs its output. It reports success; an
// empty command succeeds.
func (d *Daemon) runHook(ctx context.Context, hook, command string, role Role, epoch int64, reason Reason) bool {
	if command == "" {
		return true
	}
	hctx, cancel := context.WithTimeout(ctx, d.cfg.Hooks.Timeout)
	defer cancel()
	cmd := exec.CommandContext(hctx, "/bin/sh", "-c", command)
	cmd.Env = append(os.Environ(), "HAPAIR_NODE="+d.cfg.Node, "HAPAIR_ROLE="+role.String(),
		"HAPAIR_EPOCH="+strconv.FormatInt(epoch, 10), "HAPAIR_REASON="+string(reason))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	out := &capped{max: maxHookOutput}
	cmd.Stdout, cmd.Stderr = out, out
	start := time.Now()
	err := cmd.Run()
	fields := []zap.Field{zap.String("hook", hook), zap.Duration("took", time.Since(start)),
		zap.Int64("epoch", epoch), zap.String("output", out.String())}
	if err != nil {
		if hctx.Err() == context.DeadlineExceeded {
			err = fmt.Errorf("timed out after %s: %w", d.cfg.Hooks.Timeout, err)
		}
		d.m.hookRuns.WithLabelValues(hook, "failed").Inc()
		d.lg.Error("hook failed", append(fields, zap.Error(err))...)
		return false
	}
	d.m.hookRuns.WithLabelValues(hook, "ok").Inc()
	d.lg.Info("hook ran", fields...)
	return true
}

// capped is a buffer that keeps the first max bytes written to it.
type capped struct {
	buf bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (c *capped) String() string { return c.buf.String() }
