package hosts

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// PowerPort is where the power switch listens, on the bridge's address
// (Subnet.1, inside the bridge namespace: only the hosts reach it).
const PowerPort = 7999

// PowerAddr is the switch's address as the hosts see it.
func PowerAddr() string { return fmt.Sprintf("%s.1:%d", Subnet, PowerPort) }

// PowerCommand is a shell command, run on a host (the controller), that
// asks the switch to power host off ("poweroff") or boot it ("boot") and
// waits for the answer: what `hapairctl drill` runs as the node's stop and
// start commands. There is no machinectl here; the switch is the
// harness's own Host.PowerOff and Host.Boot.
func PowerCommand(action, host string) string {
	return fmt.Sprintf(`python3 -c 'import urllib.request as u; print(u.urlopen(u.Request("http://%s/%s/%s", method="POST"), timeout=300).read().decode())'`,
		PowerAddr(), action, host)
}

// ServePower gives the bridge the address Subnet.1 and serves the power
// switch there until ctx ends: POST /poweroff/<host> pulls the plug
// (Host.PowerOff), POST /boot/<host> boots it and answers once it runs.
func (c *Cluster) ServePower(ctx context.Context) error {
	if err := c.net.ip(bridgeHost, "addr", "add", Subnet+".1/24", "dev", "br0"); err != nil {
		return err
	}
	ln, err := listenIn("/run/netns/"+c.net.ns(bridgeHost), fmt.Sprintf("%s.1:%d", Subnet, PowerPort))
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /poweroff/{host}", func(w http.ResponseWriter, r *http.Request) {
		h, ok := c.Hosts[r.PathValue("host")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		t0 := time.Now()
		if err := h.PowerOff(30 * time.Second); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(c.log, "power: %s off (%s)\n", h.Name, time.Since(t0).Round(time.Millisecond))
		fmt.Fprintf(w, "%s powered off\n", h.Name)
	})
	mux.HandleFunc("POST /boot/{host}", func(w http.ResponseWriter, r *http.Request) {
		h, ok := c.Hosts[r.PathValue("host")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		t0 := time.Now()
		if err := h.Boot(ctx, 2*time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(c.log, "power: %s booted, running after %s\n", h.Name, time.Since(t0).Round(time.Millisecond))
		fmt.Fprintf(w, "%s running after %s\n", h.Name, time.Since(t0).Round(time.Millisecond))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(c.log, "power switch: %v\n", err)
		}
	}()
	return nil
}

// listenIn opens a TCP listener inside the network namespace at nsPath:
// the socket is made on a thread switched into it and stays there.
func listenIn(nsPath, addr string) (net.Listener, error) {
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer orig.Close()
		target, err := os.Open(nsPath)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("setns %s: %w", nsPath, err)}
			return
		}
		ln, lerr := net.Listen("tcp", addr)
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Stuck in the namespace: the thread stays locked and is
			// discarded when this goroutine ends.
			ch <- result{ln, lerr}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{ln, lerr}
	}()
	r := <-ch
	if r.err != nil {
		return nil, fmt.Errorf("listen %s in %s: %w", addr, strings.TrimPrefix(nsPath, "/run/netns/"), r.err)
	}
	return r.ln, nil
}
