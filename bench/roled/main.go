// Command roledbench measures hapair-roled by hand (it is not part of CI):
//
//	roledbench patroni -listen 127.0.0.1:18008 -etcd http://127.0.0.1:12379 -member A
//	    a fake Patroni 3.0.2 that is primary and holds the leader key
//	roledbench load -url http://127.0.0.1:17400/ha-health -rate 2000 -duration 10s
//	    open-loop GETs at a fixed rate; prints latency percentiles
//	roledbench idle -pid N -duration 30s
//	    CPU share and RSS of a process over the interval
//	roledbench flip -etcd http://127.0.0.1:12379 -roled BIN -dir DIR -flips 20
//	    two hapair-roled on fake Patronis: leader-key change → new ACTIVE's 200
//
// run.sh wires them together with Debian's etcd and a built hapair-roled.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: roledbench patroni|load|idle|flip [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "patroni":
		err = patroni(os.Args[2:])
	case "load":
		err = load(os.Args[2:])
	case "idle":
		err = idle(os.Args[2:])
	case "flip":
		err = flip(os.Args[2:])
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "roledbench:", err)
		os.Exit(1)
	}
}

const doc = `{"state": "running", "role": "master", "server_version": 150020, "xlog": {"location": 50331744}, "timeline": 1, "patroni": {"version": "3.0.2", "scope": "hapair"}}`

// patroni serves a primary Patroni REST API and holds the leader key.
func patroni(args []string) error {
	fs := flag.NewFlagSet("patroni", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:18008", "REST address")
	ep := fs.String("etcd", "http://127.0.0.1:2379", "etcd endpoint")
	member := fs.String("member", "A", "member name")
	scope := fs.String("scope", "hapair", "scope")
	_ = fs.Parse(args)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{*ep}, DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	g, err := cli.Grant(ctx, 10)
	if err != nil {
		return err
	}
	ka, err := cli.KeepAlive(ctx, g.ID)
	if err != nil {
		return err
	}
	go func() {
		for range ka {
		}
	}()
	key := "/service/" + *scope + "/leader"
	if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, *member, clientv3.WithLease(g.ID))).Commit(); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/config", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"ttl": 10}`) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, doc)
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux}
	go func() { <-ctx.Done(); srv.Close() }()
	fmt.Fprintln(os.Stderr, "fake patroni on", ln.Addr(), "holding", key)
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// load sends GETs at a fixed rate (open loop: a slow answer does not delay
// the next request) over a pool of keep-alive connections.
func load(args []string) error {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	url := fs.String("url", "http://127.0.0.1:7400/ha-health", "URL")
	rate := fs.Int("rate", 2000, "requests per second")
	dur := fs.Duration("duration", 10*time.Second, "duration")
	_ = fs.Parse(args)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	var mu sync.Mutex
	var lats []time.Duration
	codes := map[int]int{}
	errs := 0
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(*rate)
	start := time.Now()
	next := start
	for time.Since(start) < *dur {
		next = next.Add(interval)
		time.Sleep(time.Until(next))
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			resp, err := hc.Get(*url)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			d := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs++
				return
			}
			codes[resp.StatusCode]++
			lats = append(lats, d)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	if len(lats) == 0 {
		return fmt.Errorf("no answers (%d errors)", errs)
	}
	q := func(p float64) time.Duration { return lats[min(len(lats)-1, int(p*float64(len(lats))))] }
	fmt.Printf("requests %d in %s (%.0f/s), codes %v, errors %d\n", len(lats)+errs, elapsed.Round(time.Millisecond),
		float64(len(lats)+errs)/elapsed.Seconds(), codes, errs)
	fmt.Printf("latency p50 %s p90 %s p99 %s p99.9 %s max %s\n", q(.5), q(.9), q(.99), q(.999), lats[len(lats)-1])
	return nil
}

// idle reports the CPU share and RSS of a process over an interval.
func idle(args []string) error {
	fs := flag.NewFlagSet("idle", flag.ExitOnError)
	pid := fs.Int("pid", 0, "process id")
	dur := fs.Duration("duration", 30*time.Second, "interval")
	_ = fs.Parse(args)
	t0, err := cpuTicks(*pid)
	if err != nil {
		return err
	}
	start := time.Now()
	time.Sleep(*dur)
	t1, err := cpuTicks(*pid)
	if err != nil {
		return err
	}
	const hz = 100 // USER_HZ on Linux
	cpu := float64(t1-t0) / hz / time.Since(start).Seconds() * 100
	rss, _ := statusField(*pid, "VmRSS")
	threads, _ := statusField(*pid, "Threads")
	fmt.Printf("pid %d over %s: CPU %.2f%% of one core, VmRSS %s, threads %s\n", *pid, dur, cpu, rss, threads)
	return nil
}

func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return ut + st, nil
}

func statusField(pid int, name string) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, name+":") {
			return strings.TrimSpace(strings.TrimPrefix(l, name+":")), nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}
