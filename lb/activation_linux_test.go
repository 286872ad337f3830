package lb

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/proctest"
)

// TestSocketActivation runs the built binary under systemd's own
// systemd-socket-activate, which holds the listening socket and passes it
// in (LISTEN_FDS, LISTEN_FDNAMES=web): hapair-lb serves on that socket,
// binding nothing itself (it would fail with "address in use"), and the
// connection that arrived before it started, waiting in the backlog, is
// answered. A socket whose address is not the configured one is refused at
// start, naming the listener.
func TestSocketActivation(t *testing.T) {
	activate, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		t.Skip("systemd-socket-activate not installed (package systemd)")
	}
	bin := buildBinary(t)
	x := newFakeNode(t, "X")
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	type proc struct {
		logs   *syncBuf
		exited chan struct{} // closed once the process is gone; then err
		err    error
	}
	run := func(t *testing.T, configured string) *proc {
		path := filepath.Join(t.TempDir(), "lb.yaml")
		if err := os.WriteFile(path, []byte(lbYAML(configured, x.addr())), 0o644); err != nil {
			t.Fatal(err)
		}
		var logs syncBuf
		cmd := exec.Command(activate, "-l", listen, "--fdname=web", bin, "--config", path, "--fifo-reads", "off")
		cmd.Stdout, cmd.Stderr = &logs, &logs
		proctest.DieWithTest(cmd) // systemd-socket-activate execs hapair-lb: passed on
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p := &proc{logs: &logs, exited: make(chan struct{})}
		go func() { p.err = cmd.Wait(); close(p.exited) }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-p.exited
		})
		waitFor(t, 10*time.Second, "socket held by systemd-socket-activate", func() bool { return strings.Contains(logs.String(), "Listening on") })
		return p
	}

	t.Run("serves on the passed socket", func(t *testing.T) {
		logs := run(t, listen).logs
		// This request's connection starts hapair-lb: it waits in the
		// backlog until the balancer takes the socket over.
		resp, err := newClient().Get("http://" + listen + "/x")
		if err != nil {
			t.Fatalf("GET through the passed socket: %v\n%s", err, logs)
		}
		resp.Body.Close()
		if got := resp.Header.Get("X-Node"); got != "X" {
			t.Fatalf("served by %q, want X\n%s", got, logs)
		}
		if !strings.Contains(logs.String(), "listener socket from systemd") {
			t.Errorf("no log line of the passed socket:\n%s", logs)
		}
	})

	t.Run("socket on another address", func(t *testing.T) {
		other, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		p := run(t, fmt.Sprintf("127.0.0.1:%d", other))
		// Start it (the first connection), then it must exit with the error.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if c, err := (&net.Dialer{}).DialContext(ctx, "tcp", listen); err == nil {
			defer c.Close()
		}
		select {
		case <-p.exited:
			if p.err == nil || !strings.Contains(p.logs.String(), "listener web: systemd passed a socket on "+listen) {
				t.Fatalf("exit %v, want the listener named in the error:\n%s", p.err, p.logs)
			}
		case <-ctx.Done():
			t.Fatalf("still running with a socket on the wrong address:\n%s", p.logs)
		}
	})
}
