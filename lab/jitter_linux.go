package lab

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
)

// DropRandom makes host drop a share p of its incoming packets (iptables
// statistic, random mode); Heal removes it.
func (n Net) DropRandom(host string, p float64) error {
	// Not on lo: the loss is the network's. Dropping loopback packets made
	// roled's check of its own Patroni (127.0.0.1:8008) fail on a lost SYN
	// (1 s retransmission), a fault no real network has.
	return run("ip", "netns", "exec", n.NS(host), "iptables", "-w", "-A", "INPUT", "!", "-i", "lo", "-m", "statistic",
		"--mode", "random", "--probability", strconv.FormatFloat(p, 'f', 4, 64), "-j", "DROP")
}

// delayBasePort is the first port of the delaying proxies on the client
// host (one per delayed service).
const delayBasePort = 17400

// delayRoute is one member service whose connections from the other
// members go through a DelayProxy.
type delayRoute struct {
	host string
	port int
}

// delayRoutes are the connections between members: etcd's client and peer
// ports on every member, Patroni's REST API on the data nodes.
func delayRoutes() []delayRoute {
	var rs []delayRoute
	for _, h := range EtcdHosts {
		rs = append(rs, delayRoute{h, 2379}, delayRoute{h, 2380})
	}
	for _, h := range DataNodes {
		rs = append(rs, delayRoute{h, PatroniPort})
	}
	return rs
}

// StartDelay puts a DelayProxy (delay ± jitter each way) between every pair
// of members on delayRoutes. The proxies listen on the client host and dial
// from it; each member's namespace DNATs its new connections to another
// member's service to that service's proxy (nat OUTPUT, so it must run
// before the services start: conntrack keeps an established connection on
// its first path). The members then see the client host's address as the
// peer: fine for etcd and Patroni's REST, which the lab runs without
// address checks; PostgreSQL's replication (pg_hba by address) is not
// delayed. A partition's rules match addresses after this DNAT, so the
// jitter soak, which partitions nothing, is the only user. stop closes the
// proxies and waits for their goroutines.
func (n Net) StartDelay(ctx context.Context, jo JitterOptions) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop = func() { cancel(); wg.Wait() }
	sources := []string{NodeA, NodeB, Witness, LB}
	for i, r := range delayRoutes() {
		listen := net.JoinHostPort(IP(Client), strconv.Itoa(delayBasePort+i))
		ln, err := n.listenIn(Client, listen)
		if err != nil {
			stop()
			return nil, err
		}
		p := &DelayProxy{Target: net.JoinHostPort(IP(r.host), strconv.Itoa(r.port)), Delay: jo.Delay, Jitter: jo.Jitter,
			Dial: n.DialContext(Client)}
		wg.Add(1)
		go func() { defer wg.Done(); _ = p.Serve(ctx, ln) }()
		for _, s := range sources {
			if s == r.host {
				continue
			}
			if err := run("ip", "netns", "exec", n.NS(s), "iptables", "-w", "-t", "nat", "-A", "OUTPUT", "-p", "tcp",
				"-d", IP(r.host), "--dport", strconv.Itoa(r.port), "-j", "DNAT", "--to-destination", listen); err != nil {
				stop()
				return nil, err
			}
		}
	}
	return stop, nil
}

// listenIn opens a TCP listener inside host's network namespace.
func (n Net) listenIn(host, addr string) (net.Listener, error) {
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		var r result
		if err := inNS("/run/netns/"+n.NS(host), func() { r.ln, r.err = net.Listen("tcp", addr) }); err != nil {
			r.err = err
		}
		ch <- r
	}()
	r := <-ch
	if r.err != nil {
		return nil, fmt.Errorf("listen %s in %s: %w", addr, host, r.err)
	}
	return r.ln, nil
}
