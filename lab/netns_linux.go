package lab

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Subnet is the one private /24 the lab uses. It exists only on veths inside
// namespaces the lab creates (each lab has its own bridge namespace), never in
// the root namespace.
const Subnet = "10.213.0"

// NSPrefix starts every namespace name the lab creates, so stale labs are
// found by name (hapair-lab down removes all of them).
const NSPrefix = "hpl"

// Hosts of the lab and their addresses on the lab /24.
const (
	NodeA   = "nodea"
	NodeB   = "nodeb"
	Witness = "witness"
	LB      = "lb"
	LB2     = "lb2" // the second balancer of the pair (runs with Options.VIP)
	Client  = "client"
	bridge  = "sw"
)

// Hosts lists every host namespace (not the bridge) in creation order.
var Hosts = []string{NodeA, NodeB, Witness, LB, LB2, Client}

var hostIP = map[string]string{
	NodeA: Subnet + ".11", NodeB: Subnet + ".12", Witness: Subnet + ".13",
	LB: Subnet + ".20", LB2: Subnet + ".21", Client: Subnet + ".30",
}

// IP returns the lab address of host.
func IP(host string) string { return hostIP[host] }

// Net is one lab's set of namespaces, named <tag>-<host>.
type Net struct {
	Tag string
}

// NS returns the namespace name of host.
func (n Net) NS(host string) string { return n.Tag + "-" + host }

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ipns runs "ip -n NS args...".
func (n Net) ipns(host string, args ...string) error {
	return run("ip", append([]string{"-n", n.NS(host)}, args...)...)
}

// Exists reports whether host's namespace exists.
func (n Net) Exists(host string) bool {
	_, err := os.Stat("/run/netns/" + n.NS(host))
	return err == nil
}

// Create builds the bridge namespace and one namespace per host, each with an
// "eth0" veth whose peer sits on the bridge. The veth pairs are created inside
// the bridge namespace, so the root namespace never sees a lab interface.
func (n Net) Create() error {
	if err := run("ip", "netns", "add", n.NS(bridge)); err != nil {
		return err
	}
	steps := [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "br0", "type", "bridge"},
		{"link", "set", "br0", "up"},
	}
	for _, s := range steps {
		if err := n.ipns(bridge, s...); err != nil {
			return err
		}
	}
	for _, h := range Hosts {
		if err := n.addHost(h); err != nil {
			return err
		}
	}
	return nil
}

func (n Net) addHost(h string) error {
	if err := run("ip", "netns", "add", n.NS(h)); err != nil {
		return err
	}
	port := "p-" + h
	if err := n.ipns(bridge, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", n.NS(h)); err != nil {
		return err
	}
	for _, s := range [][]string{{"link", "set", port, "master", "br0"}, {"link", "set", port, "up"}} {
		if err := n.ipns(bridge, s...); err != nil {
			return err
		}
	}
	for _, s := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", IP(h) + "/24", "dev", "eth0"}, {"link", "set", "eth0", "up"}} {
		if err := n.ipns(h, s...); err != nil {
			return err
		}
	}
	return nil
}

// SetLink cuts (up=false) or restores host's cable to the bridge.
func (n Net) SetLink(host string, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	return n.ipns(bridge, "link", "set", "p-"+host, state)
}

// Partition drops all traffic between host and each of peers, inside host's
// namespace (both directions), like LAB.md §6. Other hosts still reach it.
// VRRP adverts (IP protocol 112) go to a multicast group, not to a peer's
// address, so a cut host sends none at all: the peer's keepalived hears
// nothing, as across a real cut (ARP is not IP and is never filtered).
// All rules go in with one iptables-restore, which commits them as one
// transaction: the cut is one instant, as a real one is. Rule by rule, the
// host kept its majority until the last peer's rules were in (four
// commands, 0.1–0.6 s), and every figure timed from the partition grew by
// that.
func (n Net) Partition(host string, peers ...string) error {
	var rules strings.Builder
	rules.WriteString("*filter\n")
	for _, p := range peers {
		fmt.Fprintf(&rules, "-A INPUT -s %s -j DROP\n-A OUTPUT -d %s -j DROP\n", IP(p), IP(p))
	}
	if len(peers) > 0 {
		rules.WriteString("-A OUTPUT -p 112 -j DROP\n")
	}
	rules.WriteString("COMMIT\n")
	cmd := exec.Command("ip", "netns", "exec", n.NS(host), "iptables-restore", "-w", "--noflush")
	cmd.Stdin = strings.NewReader(rules.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore in %s: %v: %s", n.NS(host), err, bytes.TrimSpace(out))
	}
	return nil
}

// Heal removes every partition rule of host.
func (n Net) Heal(host string) error {
	for _, chain := range []string{"INPUT", "OUTPUT"} {
		if err := run("ip", "netns", "exec", n.NS(host), "iptables", "-w", "-F", chain); err != nil {
			return err
		}
	}
	return nil
}

// PIDs lists the processes whose network namespace is host's.
func (n Net) PIDs(host string) []int {
	out, err := exec.Command("ip", "netns", "pids", n.NS(host)).Output()
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids
}

// KillAll sends SIGKILL to every process in host's namespace and waits (up to
// 10 s) until none is left.
func (n Net) KillAll(host string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := n.PIDs(host)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes left in %s: %v", n.NS(host), pids)
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Destroy kills every process in the lab's namespaces and deletes them.
// It is safe on a half-built or already removed lab.
func (n Net) Destroy() error {
	var first error
	for _, h := range append(append([]string{}, Hosts...), bridge) {
		if !n.Exists(h) {
			continue
		}
		if err := n.KillAll(h); err != nil && first == nil {
			first = err
		}
		if err := run("ip", "netns", "del", n.NS(h)); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Tags lists the tags of every lab whose namespaces exist on this machine.
func Tags() []string {
	ents, _ := os.ReadDir("/run/netns")
	seen := map[string]bool{}
	for _, e := range ents {
		name := e.Name()
		i := strings.LastIndex(name, "-")
		if !strings.HasPrefix(name, NSPrefix) || i < 0 {
			continue
		}
		seen[name[:i]] = true
	}
	var tags []string
	for t := range seen {
		tags = append(tags, t)
	}
	sort.Strings(tags)
	return tags
}

// DialContext returns a dial function whose sockets live in host's network
// namespace, so the lab's own probes (running in the root namespace) send
// traffic only from its hosts. The socket is created on a thread switched into
// the namespace; it stays there after the thread switches back.
func (n Net) DialContext(host string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	path := "/run/netns/" + n.NS(host)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("lab host %s is gone: %w", host, err)
		}
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			c, err := dialIn(ctx, path, network, addr)
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

func dialIn(ctx context.Context, nsPath, network, addr string) (c net.Conn, err error) {
	if nerr := inNS(nsPath, func() { c, err = (&net.Dialer{}).DialContext(ctx, network, addr) }); nerr != nil {
		return nil, nerr
	}
	return c, err
}

// inNS runs f on this goroutine's thread switched into the network
// namespace at nsPath; sockets f opens stay in it. Call it on a goroutine of
// its own: if the thread cannot switch back it stays locked, and the
// runtime discards it when that goroutine exits.
func inNS(nsPath string, f func()) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", nsPath, err)
	}
	f()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil // stuck in the lab namespace: stays locked (above)
	}
	runtime.UnlockOSThread()
	return nil
}

// DropPort drops host's outgoing TCP traffic to port (e.g. the lb losing
// etcd while it still reaches the nodes' other ports). Heal removes it.
func (n Net) DropPort(host string, port int) error {
	return run("ip", "netns", "exec", n.NS(host), "iptables", "-w", "-A", "OUTPUT", "-p", "tcp",
		"--dport", strconv.Itoa(port), "-j", "DROP")
}
