// Package nettest makes throw-away hosts for tests: network namespaces on one
// bridge, held by file descriptors only (nothing mounted under /run/netns),
// gone when the test ends. It also has the checkers of a floating address:
// who has it on an interface, and who answers ARP for it.
package nettest

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// LAN is a bridge in its own namespace with hosts attached to it.
type LAN struct {
	t   testing.TB
	hub *Host
	br  netlink.Link
	n   int
}

// Host is one network namespace with eth0 on the LAN.
type Host struct {
	Name string
	NS   netns.NsHandle
	H    *netlink.Handle
	Addr netip.Prefix     // eth0's address
	MAC  net.HardwareAddr // eth0's
}

// NewLAN makes the bridge's namespace; it skips the test unless it runs as
// root and namespaces can be made.
func NewLAN(t testing.TB) *LAN {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	hub, err := newHost("hub")
	if err != nil {
		t.Skipf("cannot make a network namespace: %v", err)
	}
	t.Cleanup(hub.close)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := hub.H.LinkAdd(br); err != nil {
		t.Skipf("cannot make a bridge: %v", err)
	}
	if err := hub.H.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	return &LAN{t: t, hub: hub, br: br}
}

func newHost(name string) (*Host, error) {
	ns, err := newNS()
	if err != nil {
		return nil, err
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		ns.Close()
		return nil, err
	}
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		h.Close()
		ns.Close()
		return nil, err
	}
	return &Host{Name: name, NS: ns, H: h}, nil
}

// newNS makes a namespace on a locked thread and returns to the original.
func newNS() (netns.NsHandle, error) {
	type res struct {
		ns  netns.NsHandle
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- res{netns.None(), err}
			return
		}
		defer orig.Close()
		ns, err := netns.New()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- res{netns.None(), err}
			return
		}
		if err := netns.Set(orig); err != nil {
			ch <- res{ns, err} // the thread dies locked
			return
		}
		runtime.UnlockOSThread()
		ch <- res{ns, nil}
	}()
	r := <-ch
	return r.ns, r.err
}

// InNS runs f on a thread switched into h's namespace (sockets made there
// stay there).
func (h *Host) InNS(f func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(h.NS); err != nil {
			runtime.UnlockOSThread()
			ch <- err
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			ch <- err
			return
		}
		runtime.UnlockOSThread()
		ch <- ferr
	}()
	return <-ch
}

func (h *Host) close() {
	h.H.Close()
	h.NS.Close()
}

// AddHost makes a namespace with eth0 (address addr, e.g. 10.77.0.1/24) on
// the bridge.
func (l *LAN) AddHost(name, addr string) *Host {
	l.t.Helper()
	h, err := newHost(name)
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(h.close)
	l.n++
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("port%d", l.n), MasterIndex: l.br.Attrs().Index},
		PeerName: "eth0", PeerNamespace: netlink.NsFd(int(h.NS))}
	if err := l.hub.H.LinkAdd(v); err != nil {
		l.t.Fatalf("veth for %s: %v", name, err)
	}
	if err := l.hub.H.LinkSetUp(v); err != nil {
		l.t.Fatal(err)
	}
	eth, err := h.H.LinkByName("eth0")
	if err != nil {
		l.t.Fatal(err)
	}
	p := netip.MustParsePrefix(addr)
	if err := h.H.AddrAdd(eth, &netlink.Addr{IPNet: ipnet(p)}); err != nil {
		l.t.Fatal(err)
	}
	if err := h.H.LinkSetUp(eth); err != nil {
		l.t.Fatal(err)
	}
	h.Addr, h.MAC = p, eth.Attrs().HardwareAddr
	// Frames sent before the kernel's link watcher has activated the device
	// (up to a second after carrier) are dropped: wait until it is up.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		e, err := h.H.LinkByName("eth0")
		if err == nil && e.Attrs().OperState == netlink.OperUp {
			break
		}
		if time.Now().After(end) {
			l.t.Fatalf("eth0 of %s not up: %v", name, err)
		}
	}
	return h
}

func ipnet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

// HostAt opens an existing namespace (e.g. the lab's /run/netns/<tag>-client)
// as a Host with eth0 as its LAN interface, for the checkers below; Close
// releases it.
func HostAt(name, nsPath string) (*Host, error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, err
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		ns.Close()
		return nil, err
	}
	host := &Host{Name: name, NS: ns, H: h}
	eth, err := h.LinkByName("eth0")
	if err != nil {
		host.close()
		return nil, err
	}
	host.MAC = eth.Attrs().HardwareAddr
	if as, err := h.AddrList(eth, netlink.FAMILY_V4); err == nil && len(as) > 0 {
		if a, ok := netip.AddrFromSlice(as[0].IP.To4()); ok {
			ones, _ := as[0].Mask.Size()
			host.Addr = netip.PrefixFrom(a, ones)
		}
	}
	return host, nil
}

// Close releases a Host from HostAt.
func (h *Host) Close() { h.close() }

// NetnsPath is a path to h's namespace that another process (or vip.netns)
// can open: this process's descriptor for it.
func (h *Host) NetnsPath() string { return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(h.NS)) }

// Has reports whether ip is on any interface of h.
func (h *Host) Has(ip netip.Addr) (bool, error) {
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	as, err := h.H.AddrList(nil, fam)
	if err != nil {
		return false, err
	}
	for _, a := range as {
		if b, ok := netip.AddrFromSlice(a.IP); ok && b.Unmap() == ip {
			return true, nil
		}
	}
	return false, nil
}

// Presence polls the hosts' addresses in turn and counts the times ip was
// on two at once. A reading counts as "both" only when the same host was
// seen holding ip on both sides of the other's reading (A, B, A all
// present), so a move between two readings is not mistaken for an overlap.
type Presence struct {
	mu       sync.Mutex
	Readings int
	Overlaps int
	Seen     map[string]int // readings with ip present, by host
	first    time.Time      // when the first overlap was counted (zero: none)
	errs     int
	stop     context.CancelFunc
	done     chan struct{}
}

// WatchPresence starts polling; Stop ends it (and the test's cleanup, before
// the hosts go).
func WatchPresence(t testing.TB, hosts []*Host, ip netip.Addr) *Presence {
	p := StartPresence(hosts, ip)
	t.Cleanup(func() { p.Stop() })
	return p
}

// StartPresence starts polling (for the lab; Stop ends it).
func StartPresence(hosts []*Host, ip netip.Addr) *Presence {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Presence{Seen: map[string]int{}, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		var hist [3]int // indexes of the last three readings' hosts with ip present, -1 if absent
		hist = [3]int{-1, -1, -1}
		for i := 0; ctx.Err() == nil; i++ {
			k := i % len(hosts)
			ok, err := hosts[k].Has(ip)
			who := -1
			if ok {
				who = k
			}
			p.mu.Lock()
			if err != nil {
				p.errs++
			}
			p.Readings++
			if ok {
				p.Seen[hosts[k].Name]++
			}
			hist = [3]int{hist[1], hist[2], who}
			if hist[0] >= 0 && hist[1] >= 0 && hist[2] >= 0 && hist[0] == hist[2] && hist[1] != hist[0] {
				p.Overlaps++
				if p.first.IsZero() {
					p.first = time.Now()
				}
			}
			p.mu.Unlock()
		}
	}()
	return p
}

// FirstOverlap is when the first overlap was counted; zero when none was.
func (p *Presence) FirstOverlap() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.first
}

// Stop ends the polling and returns readings and overlaps.
func (p *Presence) Stop() (readings, overlaps int, seen map[string]int) {
	p.stop()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.Readings, p.Overlaps, p.Seen
}

// ARPWatch sends an ARP request for a target from a host every interval and
// records every MAC that answers, per round (the answers received before
// the next request).
type ARPWatch struct {
	mu       sync.Mutex
	Rounds   int
	Answered int            // rounds with at least one answer
	Doubles  int            // rounds answered by two or more MACs
	ByMAC    map[string]int // answers by MAC
	last     map[string]time.Time
	lastMACs map[string]bool
	stop     context.CancelFunc
	done     chan struct{}
}

// WatchARP starts the prober on h for target; the test's cleanup stops it.
func WatchARP(t testing.TB, h *Host, target netip.Addr, every time.Duration) *ARPWatch {
	t.Helper()
	w, err := StartARP(h, target, every)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return w
}

// StartARP starts the prober on h for target (for the lab; Stop ends it).
func StartARP(h *Host, target netip.Addr, every time.Duration) (*ARPWatch, error) {
	var fd int
	err := h.InNS(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP)))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("ARP socket: %w", err)
	}
	eth, err := h.H.LinkByName("eth0")
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	idx := eth.Attrs().Index
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: idx}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 20000})
	ctx, cancel := context.WithCancel(context.Background())
	w := &ARPWatch{ByMAC: map[string]int{}, last: map[string]time.Time{}, lastMACs: map[string]bool{},
		stop: cancel, done: make(chan struct{})}
	req := arpRequest(h.MAC, h.Addr.Addr(), target)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // sender: closes a round, then asks again
		defer wg.Done()
		tk := time.NewTicker(every)
		defer tk.Stop()
		sa := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: idx, Halen: 6}
		copy(sa.Addr[:], req[0:6])
		for {
			w.mu.Lock()
			w.Rounds++
			w.lastMACs = map[string]bool{}
			w.mu.Unlock()
			_ = unix.Sendto(fd, req, 0, sa)
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
		}
	}()
	go func() { // receiver
		defer wg.Done()
		buf := make([]byte, 128)
		for ctx.Err() == nil {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil || n < 42 {
				continue
			}
			a := buf[14:42]
			if binary.BigEndian.Uint16(buf[12:14]) != unix.ETH_P_ARP || binary.BigEndian.Uint16(a[6:8]) != 2 {
				continue
			}
			spa, _ := netip.AddrFromSlice(a[14:18])
			if spa != target {
				continue
			}
			mac := net.HardwareAddr(append([]byte(nil), a[8:14]...)).String()
			w.mu.Lock()
			w.ByMAC[mac]++
			w.last[mac] = time.Now()
			if len(w.lastMACs) == 0 {
				w.Answered++
			}
			if !w.lastMACs[mac] {
				w.lastMACs[mac] = true
				if len(w.lastMACs) == 2 {
					w.Doubles++
				}
			}
			w.mu.Unlock()
		}
	}()
	go func() { wg.Wait(); unix.Close(fd); close(w.done) }()
	return w, nil
}

// Stop ends the prober (idempotent).
func (w *ARPWatch) Stop() {
	w.stop()
	<-w.done
}

// Snapshot returns the counters so far.
func (w *ARPWatch) Snapshot() (rounds, answered, doubles int, byMAC map[string]int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := map[string]int{}
	for k, v := range w.ByMAC {
		m[k] = v
	}
	return w.Rounds, w.Answered, w.Doubles, m
}

// LastAnswer is when mac last answered (zero: never).
func (w *ARPWatch) LastAnswer(mac string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last[mac]
}

// arpRequest is a broadcast "who has target, tell ip".
func arpRequest(mac net.HardwareAddr, ip, target netip.Addr) []byte {
	b := make([]byte, 42)
	copy(b[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(b[6:12], mac)
	binary.BigEndian.PutUint16(b[12:14], unix.ETH_P_ARP)
	a := b[14:]
	binary.BigEndian.PutUint16(a[0:2], 1)
	binary.BigEndian.PutUint16(a[2:4], unix.ETH_P_IP)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:8], 1)
	s, d := ip.As4(), target.As4()
	copy(a[8:14], mac)
	copy(a[14:18], s[:])
	copy(a[24:28], d[:])
	return b
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// LastSeen polls one host and keeps the start time of the last reading that
// found ip: ip was there at some instant after that time, so "last seen
// before T" proves it was gone by T however slowly the poller ran.
type LastSeen struct {
	mu   sync.Mutex
	at   time.Time
	stop context.CancelFunc
	done chan struct{}
}

// WatchLastSeen starts the poller; Halt (or the test's cleanup) ends it.
func WatchLastSeen(t testing.TB, h *Host, ip netip.Addr) *LastSeen {
	w := StartLastSeen(h, ip)
	t.Cleanup(func() { w.Halt() })
	return w
}

// StartLastSeen starts the poller (for the lab; Halt ends it).
func StartLastSeen(h *Host, ip netip.Addr) *LastSeen {
	ctx, cancel := context.WithCancel(context.Background())
	w := &LastSeen{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tk := time.NewTicker(time.Millisecond)
		defer tk.Stop()
		for {
			at := time.Now()
			if ok, _ := h.Has(ip); ok {
				w.mu.Lock()
				w.at = at
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
		}
	}()
	return w
}

// Last returns the last time ip was seen so far (zero: never).
func (w *LastSeen) Last() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.at
}

// Halt stops the poller and returns the last time ip was seen (zero: never).
func (w *LastSeen) Halt() time.Time {
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.at
}
