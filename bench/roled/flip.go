package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// fakeNode is one node's fake Patroni 3.0.2 REST API: primary or replica,
// switched by the flip driver, which also moves the leader key.
type fakeNode struct {
	name    string
	primary atomic.Bool
	addr    string
}

func (f *fakeNode) serve(ctx context.Context) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	f.addr = ln.Addr().String()
	mux := http.NewServeMux()
	mux.HandleFunc("/config", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"ttl": 10}`) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		role := "replica"
		if f.primary.Load() {
			role = "master"
		}
		if r.URL.Path == "/primary" && role != "master" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintf(w, `{"state": "running", "role": %q, "server_version": 150020, "timeline": 1, "patroni": {"version": "3.0.2", "scope": "hapair"}}`, role)
	})
	srv := &http.Server{Handler: mux}
	go func() { <-ctx.Done(); srv.Close() }()
	go func() { _ = srv.Serve(ln) }()
	return nil
}

// flip measures roled's role change: two hapair-roled processes on fake
// Patronis and one etcd; each flip moves Patroni's leader key (and the fake
// REST roles) from one node to the other and times the new ACTIVE's first 200
// on /ha-health from the key change, polling both nodes every millisecond,
// and counts rounds where both answered 200.
func flip(args []string) error {
	fs := flag.NewFlagSet("flip", flag.ExitOnError)
	ep := fs.String("etcd", "http://127.0.0.1:12379", "etcd endpoint")
	bin := fs.String("roled", "hapair-roled", "hapair-roled binary")
	dir := fs.String("dir", os.TempDir(), "directory for configs and markers")
	flips := fs.Int("flips", 20, "role flips")
	_ = fs.Parse(args)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{*ep}, DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	nodes := []*fakeNode{{name: "A"}, {name: "B"}}
	urls := make([]string, 2)
	for i, n := range nodes {
		if err := n.serve(ctx); err != nil {
			return err
		}
		port := 17410 + 10*i
		urls[i] = fmt.Sprintf("http://127.0.0.1:%d/ha-health", port)
		cfg := filepath.Join(*dir, "roled-"+n.name+".yaml")
		if err := os.WriteFile(cfg, fmt.Appendf(nil, `node: %s
listen: "127.0.0.1:%d"
etcd: {endpoints: [%q]}
patroni: {url: "http://%s"}
postgres: {enabled: false}
marker: {path: %q}
agent: {listen: "127.0.0.1:%d"}
`, n.name, port, *ep, n.addr, filepath.Join(*dir, "active-"+n.name), port+1), 0o600); err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, *bin, "--config", cfg)
		logf, err := os.Create(filepath.Join(*dir, "roled-"+n.name+".log"))
		if err != nil {
			return err
		}
		defer logf.Close()
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			return err
		}
		defer func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() }()
	}
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	code := func(u string) int {
		resp, err := hc.Get(u)
		if err != nil {
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	key := "/service/hapair/leader"
	var lease clientv3.LeaseID
	give := func(i int) (time.Time, error) {
		nodes[1-i].primary.Store(false)
		if _, err := cli.Delete(ctx, key); err != nil {
			return time.Time{}, err
		}
		if lease != 0 {
			_, _ = cli.Revoke(ctx, lease)
		}
		g, err := cli.Grant(ctx, 10)
		if err != nil {
			return time.Time{}, err
		}
		lease = g.ID
		if _, err := cli.Put(ctx, key, nodes[i].name, clientv3.WithLease(g.ID)); err != nil {
			return time.Time{}, err
		}
		changed := time.Now() // the key changed when the put committed
		nodes[i].primary.Store(true)
		return changed, nil
	}
	ka := func() {
		for ctx.Err() == nil {
			if lease != 0 {
				_, _ = cli.KeepAliveOnce(ctx, lease)
			}
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
		}
	}
	waitActive := func(i int, d time.Duration) (time.Time, int, bool) {
		deadline := time.Now().Add(d)
		both := 0
		for time.Now().Before(deadline) {
			a, b := code(urls[i]), code(urls[1-i])
			if a == 200 && b == 200 {
				both++
			}
			if a == 200 && b != 200 {
				return time.Now(), both, true
			}
			time.Sleep(time.Millisecond) // the poll period of the measurement
		}
		return time.Time{}, both, false
	}
	if _, err := give(0); err != nil {
		return err
	}
	go ka()
	if _, _, ok := waitActive(0, 30*time.Second); !ok {
		return fmt.Errorf("node A not ACTIVE within 30s (logs in %s)", *dir)
	}
	var lat []time.Duration
	dual := 0
	for f := 0; f < *flips; f++ {
		to := (f + 1) % 2
		changed, err := give(to)
		if err != nil {
			return err
		}
		at, both, ok := waitActive(to, 30*time.Second)
		dual += both
		if !ok {
			return fmt.Errorf("flip %d: %s not ACTIVE within 30s", f, nodes[to].name)
		}
		lat = append(lat, at.Sub(changed))
		fmt.Printf("flip %2d →%s: new ACTIVE 200 after %6.1f ms\n", f, nodes[to].name, ms(at.Sub(changed)))
		time.Sleep(500 * time.Millisecond) // the pair at rest between flips
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	fmt.Printf("SUMMARY roled flip: median %.1f ms max %.1f ms over %d flips; both 200 in %d polls\n",
		ms(lat[len(lat)/2]), ms(lat[len(lat)-1]), len(lat), dual)
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }
