// Command flipper measures how a balancer follows a role switch. It runs two
// fake nodes that follow hapair's /ha-health contract (200 + X-Hapair-Epoch
// when ACTIVE, 503 when PASSIVE), sends GETs through the balancer without
// pause, flips the role N times and reports per flip: time from the flip to
// the first response served by the new ACTIVE, failed requests, requests the
// old (now PASSIVE) node received after the flip, and how long both nodes
// received traffic at once.
//
// With -etcd, each flip also does what roled does with the active key:
// delete it when the old node steps down, create it for the new one (the
// new node reports the key's CreateRevision as its epoch).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

type node struct {
	name   string
	active atomic.Bool
	epoch  atomic.Int64
	mu     sync.Mutex
	hits   []time.Time // app requests received while passive
	last   time.Time   // last app request
	first  time.Time   // first app request since reset
}

func (n *node) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/ha-health" {
		role, code := "passive", 503
		if n.active.Load() {
			role, code = "active", 200
		}
		w.Header().Set("X-Hapair-Role", role)
		w.Header().Set("X-Hapair-Epoch", strconv.FormatInt(n.epoch.Load(), 10))
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"node":%q,"role":%q}`, n.name, role)
		return
	}
	now := time.Now()
	n.mu.Lock()
	if !n.active.Load() {
		n.hits = append(n.hits, now)
	}
	if n.first.IsZero() {
		n.first = now
	}
	n.last = now
	n.mu.Unlock()
	w.Header().Set("X-Node", n.name)
	io.WriteString(w, "ok "+n.name+"\n")
}

func (n *node) reset() {
	n.mu.Lock()
	n.hits, n.first = nil, time.Time{}
	n.mu.Unlock()
}

func serve(n *node, addr string) string {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go http.Serve(ln, n)
	return ln.Addr().String()
}

func main() {
	target := flag.String("url", "", "balancer URL to send traffic to")
	addrA := flag.String("a", "127.0.0.1:18081", "listen address of node A")
	addrB := flag.String("b", "127.0.0.1:18082", "listen address of node B")
	flips := flag.Int("flips", 10, "number of role flips")
	settle := flag.Duration("settle", 4*time.Second, "max wait for the new ACTIVE and time between flips")
	workers := flag.Int("workers", 4, "concurrent clients")
	etcdEps := flag.String("etcd", "", "etcd endpoints (comma separated) to drive the active key")
	key := flag.String("key", "/hapair/bench/active", "active key")
	label := flag.String("label", "", "label printed with the summary")
	serveOnly := flag.Bool("serve-only", false, "only print the node addresses and wait (for config generation)")
	flag.Parse()

	a, b := &node{name: "A"}, &node{name: "B"}
	fmt.Printf("nodes A=%s B=%s\n", serve(a, *addrA), serve(b, *addrB))
	if *serveOnly {
		select {}
	}
	var cli *clientv3.Client
	ctx := context.Background()
	if *etcdEps != "" {
		var err error
		cli, err = clientv3.New(clientv3.Config{Endpoints: strings.Split(*etcdEps, ","), DialTimeout: 2 * time.Second})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer cli.Close()
	}
	activate := func(n *node) {
		epoch := time.Now().UnixNano() / 1e6
		if cli != nil {
			v, _ := json.Marshal(map[string]string{"node": n.name, "since": time.Now().UTC().Format(time.RFC3339)})
			resp, err := cli.Put(ctx, *key, string(v))
			if err != nil {
				fmt.Fprintln(os.Stderr, "etcd put:", err)
				os.Exit(1)
			}
			epoch = resp.Header.Revision
		}
		n.epoch.Store(epoch)
		n.active.Store(true)
	}
	deactivate := func(n *node) {
		n.active.Store(false)
		n.epoch.Store(0)
		if cli != nil {
			if _, err := cli.Delete(ctx, *key); err != nil {
				fmt.Fprintln(os.Stderr, "etcd delete:", err)
			}
		}
	}
	if cli != nil {
		cli.Delete(ctx, *key)
	}
	activate(a)

	var failed, total atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: *workers}}
	for range *workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Get(*target + "/app")
				total.Add(1)
				if err != nil || resp.StatusCode != 200 {
					failed.Add(1)
				}
				if resp != nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		}()
	}
	// Wait until A serves.
	deadline := time.Now().Add(30 * time.Second)
	for a.first.IsZero() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}

	nodes := []*node{a, b}
	var switchT, overlapT []time.Duration
	var totalFailed, totalOld int64
	for i := range *flips {
		old, nw := nodes[i%2], nodes[(i+1)%2]
		time.Sleep(*settle / 2)
		old.reset()
		nw.reset()
		f0 := failed.Load()
		flip := time.Now()
		deactivate(old)
		activate(nw)
		for time.Since(flip) < *settle {
			nw.mu.Lock()
			got := !nw.first.IsZero()
			nw.mu.Unlock()
			if got {
				break
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(*settle / 4) // let stragglers to the old node show up
		nw.mu.Lock()
		first := nw.first
		nw.mu.Unlock()
		old.mu.Lock()
		oldHits := append([]time.Time(nil), old.hits...)
		old.mu.Unlock()
		var sw, ov time.Duration = -1, 0
		if !first.IsZero() {
			sw = first.Sub(flip)
		}
		var lastOld time.Time
		for _, h := range oldHits {
			if h.After(flip) && h.After(lastOld) {
				lastOld = h
			}
		}
		if !first.IsZero() && lastOld.After(first) {
			ov = lastOld.Sub(first)
		}
		fl := failed.Load() - f0
		totalFailed += fl
		totalOld += int64(len(oldHits))
		switchT = append(switchT, sw)
		overlapT = append(overlapT, ov)
		fmt.Printf("flip %2d %s→%s: first response from new ACTIVE after %8.1f ms, failed %4d, to old after flip %5d, both in service %7.1f ms\n",
			i+1, old.name, nw.name, ms(sw), fl, len(oldHits), ms(ov))
	}
	close(stop)
	wg.Wait()
	fmt.Printf("SUMMARY %s: switch median %.1f ms max %.1f ms; failed %d of %d; requests to old node after flip %d; overlap median %.1f ms max %.1f ms\n",
		*label, ms(median(switchT)), ms(maxD(switchT)), totalFailed, total.Load(), totalOld, ms(median(overlapT)), ms(maxD(overlapT)))
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func median(v []time.Duration) time.Duration {
	s := append([]time.Duration(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func maxD(v []time.Duration) time.Duration {
	m := v[0]
	for _, x := range v {
		m = max(m, x)
	}
	return m
}
