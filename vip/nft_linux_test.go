package vip

import (
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/hapair/hapair/internal/nettest"
)

// fence: nftables, with a real kernel: the owner adds the address (Sync),
// refreshes it once with a later deadline, then does nothing at all, as a
// stopped process would. From a third host, ARP requests every 10 ms are
// answered while the set element lives and never after FenceSlack before
// the deadline; a TCP connection attempt (to a neighbour entry pinned to
// the holder, as a client's still-fresh entry would be) is refused by the
// holder while held and reaches nothing after. A later Sync holds the
// address again (over the expired element), a lost fence silences it at
// once, and Close leaves no table behind.
func TestNftablesFenceSilencesBeforeTheDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("needs network namespaces; skipped with -short")
	}
	l := holderAndClient(t, 82, FenceNftables)
	a, c, v4, cfg := l.a, l.c, l.v4, l.cfg
	start := time.Now()
	now := func() time.Duration { return time.Since(start) }
	var deadline atomic.Int64
	var ok atomic.Bool
	ok.Store(true)
	deadline.Store(int64(900 * time.Millisecond))
	g, err := New(cfg, "test", zaptest.NewLogger(t), now, func() (time.Duration, bool) {
		return time.Duration(deadline.Load()), ok.Load()
	})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			g.Close()
		}
	}()
	pinNeighbour(t, c, v4, a.MAC)
	arp := nettest.WatchARP(t, c, v4, 10*time.Millisecond)
	mac := a.MAC.String()

	g.Sync()
	waitFor(t, 2*time.Second, "an ARP answer from the holder", func() bool { return !arp.LastAnswer(mac).IsZero() })
	if got := dial(t, c, v4); got != dialRefused {
		t.Fatalf("TCP to the held VIP: %s, want refused (the holder's RST)", got)
	}
	l.requireHeld6(t)
	// Refresh before the first deadline: answers go on past it.
	time.Sleep(time.Until(start.Add(400 * time.Millisecond))) // a keep-alive's arrival (scenario)
	const later = 1400 * time.Millisecond
	deadline.Store(int64(later))
	g.Sync()
	// Nothing more from the owner: wait past the later deadline.
	time.Sleep(time.Until(start.Add(later + 300*time.Millisecond))) // the stop outlasts the deadline (scenario)
	last := arp.LastAnswer(mac)
	t.Logf("last ARP answer %s after start; deadlines 900ms then %s", last.Sub(start), later)
	if !last.After(start.Add(900 * time.Millisecond)) {
		t.Errorf("no answer after the first deadline: the refresh did not extend the fence")
	}
	if !last.Before(start.Add(later)) {
		t.Errorf("answered ARP %s after start, past the deadline %s", last.Sub(start), later)
	}
	if held, _ := a.Has(v4); !held {
		t.Error("the address left the interface: with fence nftables it stays until its lifetime, silenced")
	}
	if got := dial(t, c, v4); got != dialTimeout {
		t.Fatalf("TCP to the fenced VIP: %s, want no answer at all", got)
	}
	if held, _ := a.Has(l.v6); !held {
		t.Error("the IPv6 address left the interface: with fence nftables it stays until its lifetime, silenced")
	}
	if got := dial(t, c, l.v6); got != dialTimeout {
		t.Fatalf("TCP to the fenced IPv6 VIP: %s, want no answer at all", got)
	}
	if got := learnedMAC(t, l.d, l.v6); got != nil {
		t.Fatalf("the fenced IPv6 VIP still answers neighbour solicitations (D resolved it to %s)", got)
	}
	_, answered, _, _ := arp.Snapshot()

	// Held again over the expired element; then the fence is lost.
	deadline.Store(int64(now() + 5*time.Second))
	g.Sync()
	waitFor(t, 2*time.Second, "ARP answers again", func() bool { _, n, _, _ := arp.Snapshot(); return n > answered })
	if got := dial(t, c, v4); got != dialRefused {
		t.Fatalf("TCP to the re-held VIP: %s, want refused", got)
	}
	if got := dial(t, c, l.v6); got != dialRefused {
		t.Fatalf("TCP to the re-held IPv6 VIP: %s, want refused", got)
	}
	ok.Store(false)
	g.Sync()
	lost := time.Now()
	time.Sleep(200 * time.Millisecond) // 20 ARP rounds (scenario)
	if l := arp.LastAnswer(mac); l.After(lost.Add(20 * time.Millisecond)) {
		t.Errorf("answered ARP %s after the fence was lost", l.Sub(lost))
	}
	for _, ip := range []netip.Addr{v4, l.v6} {
		if held, _ := a.Has(ip); held {
			t.Errorf("%s stayed on the interface after the fence was lost", ip)
		}
	}
	_, _, doubles, byMAC := arp.Snapshot()
	if doubles != 0 || len(byMAC) != 1 {
		t.Errorf("ARP answers by MAC %v, doubles %d", byMAC, doubles)
	}
	closed = true
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if out := nftList(t, a); strings.Contains(out, "hapair_test_vip") {
		t.Errorf("tables left after Close:\n%s", out)
	}
}

// A table left by a process that died goes when the next one opens, with
// what it held: nothing answers until the new owner holds the address.
func TestNftablesFenceReplacesLeftovers(t *testing.T) {
	if testing.Short() {
		t.Skip("needs network namespaces; skipped with -short")
	}
	lan := nettest.NewLAN(t)
	a := lan.AddHost("A", "10.83.0.1/24")
	cfg := Default()
	cfg.Address, cfg.Interface, cfg.Netns, cfg.Fence = "10.83.0.100/24", "eth0", a.NetnsPath(), FenceNftables
	l1, err := openLink(cfg, "test", zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := l1.replace(cfg.Prefixes(), 10*time.Second, 10*time.Second, time.Now().Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	// l1 "dies": its socket closes, its tables stay.
	n := l1.(*nlLink)
	if err := n.nft.c.CloseLasting(); err != nil {
		t.Fatal(err)
	}
	if out := nftList(t, a); !strings.Contains(out, "10.83.0.100") {
		t.Fatalf("the held element is not in the set:\n%s", out)
	}
	l2, err := openLink(cfg, "test", zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	out := nftList(t, a)
	if strings.Count(out, "table arp hapair_test_vip") != 1 || strings.Contains(out, "elements") {
		t.Errorf("after a new open, want fresh empty tables:\n%s", out)
	}
	if err := l2.remove(cfg.Prefixes()); err != nil {
		t.Fatal(err)
	}
	if err := l2.close(); err != nil {
		t.Fatal(err)
	}
}

func TestFenceValidation(t *testing.T) {
	cfg := Default()
	cfg.Address, cfg.Interface, cfg.Fence = "10.0.0.100/24", "eth0", FenceNftables
	cfg.Extra = []string{"2001:db8::100/64"}
	if err := cfg.Validate("vip"); err != nil {
		t.Fatalf("IPv6 with fence nftables (its ip6 table): %v", err)
	}
	cfg.Extra, cfg.Fence = nil, "bpf"
	if err := cfg.Validate("vip"); err == nil || !strings.Contains(err.Error(), "vip.fence") {
		t.Fatalf("unknown fence: %v, want an error naming vip.fence", err)
	}
}

func waitFor(t *testing.T, d time.Duration, what string, f func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !f(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no %s within %s", what, d)
		}
	}
}

// pinNeighbour makes h's neighbour entry for ip permanent (no ARP needed).
func pinNeighbour(t *testing.T, h *nettest.Host, ip netip.Addr, mac net.HardwareAddr) {
	t.Helper()
	eth, err := h.H.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	if err := h.H.NeighSet(&netlink.Neigh{LinkIndex: eth.Attrs().Index, Family: fam,
		State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: mac}); err != nil {
		t.Fatal(err)
	}
}

type dialResult string

const (
	dialRefused dialResult = "refused"
	dialTimeout dialResult = "no answer"
)

// dial tries TCP port 9 (nothing listens) of ip from h, for up to 300 ms.
func dial(t *testing.T, h *nettest.Host, ip netip.Addr) dialResult {
	t.Helper()
	var got dialResult
	err := h.InNS(func() error {
		conn, err := net.DialTimeout("tcp", netip.AddrPortFrom(ip, 9).String(), 300*time.Millisecond)
		switch {
		case err == nil:
			conn.Close()
			got = "connected"
		case errors.Is(err, syscall.ECONNREFUSED):
			got = dialRefused
		case errors.Is(err, syscall.ETIMEDOUT) || isTimeout(err):
			got = dialTimeout
		default:
			got = dialResult(err.Error())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func nftList(t *testing.T, h *nettest.Host) string {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft(8) not installed (Debian package nftables)")
	}
	out, err := exec.Command("nsenter", "--net="+h.NetnsPath(), "nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list ruleset: %v\n%s", err, out)
	}
	return string(out)
}

// pausedLink stands for an owner stopped inside an add or refresh: before
// runs between the guard reading its clocks and the call reaching the
// kernel, after runs once the kernel has taken it, before the guard looks
// at its clock again.
type pausedLink struct {
	link
	before, after func()
}

func (p *pausedLink) replace(ps []netip.Prefix, lifetime, fence time.Duration, end time.Time) error {
	if p.before != nil {
		p.before()
	}
	err := p.link.replace(ps, lifetime, fence, end)
	if p.after != nil {
		p.after()
	}
	return err
}

// A refresh computed before a pause and taken by the kernel after the
// deadline (SIGSTOP between the clock and the syscall), with a real
// kernel: the kernel puts the address back (an absent address is created)
// and gives the set element a fresh timeout, yet the address stays silent,
// because the same end is also in the tables as an absolute time. Then the
// guard sees the late call and removes the address. With fence nftables
// the tables are the fence; with fence lifetime they are opened beside the
// address lifetime for exactly this.
func TestNftablesFenceLateRefreshStaysSilent(t *testing.T) {
	if testing.Short() {
		t.Skip("needs network namespaces; skipped with -short")
	}
	const ms = time.Millisecond
	for i, c := range []struct {
		fence                 Fence
		first, later, pauseTo time.Duration // deadlines, and when the pause ends, from the start
	}{
		{FenceNftables, 600 * ms, 1400 * ms, 1500 * ms},
		// Whole-second lifetimes: 1 s after the first add, 2 s after the
		// refresh, had it come in time.
		{FenceLifetime, 1600 * ms, 2600 * ms, 3000 * ms},
	} {
		t.Run(string(c.fence), func(t *testing.T) {
			l := holderAndClient(t, 84, c.fence)
			a, cl, v4, cfg := l.a, l.c, l.v4, l.cfg
			lk, err := openLink(cfg, "test"+itoa(i), zaptest.NewLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			if lk.(*nlLink).nft == nil {
				t.Fatal("no nftables tables opened")
			}
			pl := &pausedLink{link: lk}
			g := startGuard(t, cfg, pl, c.first)
			start, deadline := g.start, &g.deadline
			pinNeighbour(t, cl, v4, a.MAC)
			arp := nettest.WatchARP(t, cl, v4, 10*time.Millisecond)
			mac := a.MAC.String()

			g.Sync()
			waitFor(t, 2*time.Second, "an ARP answer from the holder", func() bool { return !arp.LastAnswer(mac).IsZero() })
			if out := nftList(t, a); strings.Count(out, "meta time >= ") != 3 {
				t.Fatalf("want one absolute end per table (arp, ip, ip6), as nft(8) reads it:\n%s", out)
			}
			l.requireHeld6(t)

			// A keep-alive's answer moves the deadline on; the owner reads
			// its clocks, then stops until past it before its call reaches
			// the kernel.
			deadline.Store(int64(c.later))
			var stale, stale6 dialResult
			var lateAnswers time.Time
			var back, back6 bool
			var learned6 net.HardwareAddr
			pl.before = func() {
				pl.before = nil
				time.Sleep(time.Until(start.Add(c.pauseTo))) // the pause (scenario)
			}
			pl.after = func() {
				pl.after = nil
				// The kernel took the stale call: the address is back, and
				// its element lives on. Nothing may answer meanwhile.
				took := time.Now()
				back, _ = a.Has(v4)
				back6, _ = a.Has(l.v6)
				stale = dial(t, cl, v4)
				stale6 = dial(t, cl, l.v6)
				learned6 = learnedMAC(t, l.d, l.v6)
				time.Sleep(200 * time.Millisecond) // 20 ARP rounds (scenario)
				if l := arp.LastAnswer(mac); l.After(took) {
					lateAnswers = l
				}
			}
			g.Sync()
			if !back || !back6 {
				t.Errorf("the late call did not put the addresses back (IPv4 %v, IPv6 %v): the test shows nothing", back, back6)
			}
			if stale != dialTimeout || stale6 != dialTimeout {
				t.Errorf("TCP to the VIP after a late refresh: IPv4 %s, IPv6 %s; want no answer at all", stale, stale6)
			}
			if learned6 != nil {
				t.Errorf("after the late refresh a neighbour advertisement resolved the IPv6 VIP to %s", learned6)
			}
			if !lateAnswers.IsZero() {
				t.Errorf("ARP answered %s after the start, after the late refresh reached the kernel (%s after the deadline)",
					lateAnswers.Sub(start), lateAnswers.Sub(start)-c.later)
			}
			for _, ip := range []netip.Addr{v4, l.v6} {
				if held, _ := a.Has(ip); held {
					t.Errorf("%s stayed on the interface after the late call was seen", ip)
				}
			}
			if n := g.ctr.late.Load(); n != 1 {
				t.Errorf("late calls counted: %d, want 1", n)
			}
			_, _, doubles, byMAC := arp.Snapshot()
			if doubles != 0 || len(byMAC) != 1 {
				t.Errorf("ARP answers by MAC %v, doubles %d", byMAC, doubles)
			}
		})
	}
}

// An operator reloads the firewall with `nft flush ruleset` (Debian's
// /etc/nftables.conf starts with it) under a running holder: the fence's
// tables are gone, and the next refresh makes them again and holds the
// address in them, instead of failing until the deadline takes the
// address away for good.
func TestNftablesFenceSurvivesARulesetFlush(t *testing.T) {
	if testing.Short() {
		t.Skip("needs network namespaces; skipped with -short")
	}
	l := holderAndClient(t, 86, FenceNftables)
	a, c, v4, cfg := l.a, l.c, l.v4, l.cfg
	g := startGuard(t, cfg, nil, time.Minute)
	deadline := &g.deadline
	pinNeighbour(t, c, v4, a.MAC)
	g.Sync()
	if got := dial(t, c, v4); got != dialRefused {
		t.Fatalf("TCP to the held VIP: %s, want refused (the holder's RST)", got)
	}
	nftList(t, a) // skips without nft(8)
	if out, err := exec.Command("nsenter", "--net="+a.NetnsPath(), "nft", "flush", "ruleset").CombinedOutput(); err != nil {
		t.Fatalf("nft flush ruleset: %v\n%s", err, out)
	}
	deadline.Store(int64(2 * time.Minute)) // the next keep-alive
	g.Sync()
	if n := g.ctr.errAdd.Load(); n != 0 {
		t.Errorf("refresh after the flush: %d add errors, want 0", n)
	}
	out := nftList(t, a)
	for _, want := range []string{"table arp hapair_test_vip", "table ip hapair_test_vip", "10.86.0.100 timeout", "meta time >= "} {
		if !strings.Contains(out, want) {
			t.Errorf("after the refresh the ruleset lacks %q:\n%s", want, out)
		}
	}
	if got := dial(t, c, v4); got != dialRefused {
		t.Errorf("TCP to the VIP after the refresh: %s, want refused (held)", got)
	}
	// And the fence works again: lost, silent at once.
	deadline.Store(0)
	g.Sync()
	if got := dial(t, c, v4); got != dialTimeout {
		t.Errorf("TCP to the VIP after the fence was lost: %s, want no answer", got)
	}
}

// fenceLAN is a LAN 10.<subnet>.0.0/24 and 2001:db8:<subnet>::/64 with a
// holder A (.1, ::1) and clients C (.3, ::3) and D (.4, ::4), and the
// config of a VIP on A's eth0: v4 (.100) with the IPv6 v6 (::100) as its
// extra address.
type fenceLAN struct {
	a, c, d *nettest.Host
	v4, v6  netip.Addr
	cfg     Config
}

func holderAndClient(t *testing.T, subnet int, fence Fence) fenceLAN {
	t.Helper()
	base, base6 := "10."+itoa(subnet)+".0.", "2001:db8:"+itoa(subnet)+"::"
	lan := nettest.NewLAN(t)
	l := fenceLAN{a: lan.AddHost("A", base+"1/24"), c: lan.AddHost("C", base+"3/24"), d: lan.AddHost("D", base+"4/24"),
		v4: netip.MustParseAddr(base + "100"), v6: netip.MustParseAddr(base6 + "100")}
	for h, a := range map[*nettest.Host]string{l.a: "1", l.c: "3", l.d: "4"} {
		addV6(t, h, netip.MustParsePrefix(base6+a+"/64"))
	}
	l.cfg = Default()
	l.cfg.Address, l.cfg.Interface, l.cfg.Netns, l.cfg.Fence = base+"100/24", "eth0", l.a.NetnsPath(), fence
	l.cfg.Extra = []string{base6 + "100/64"}
	return l
}

// requireHeld6 checks that the IPv6 VIP answers from A: D resolves it to
// A's MAC, and C, its neighbour entry pinned to A (a still-fresh entry),
// gets A's RST.
func (l fenceLAN) requireHeld6(t *testing.T) {
	t.Helper()
	pinNeighbour(t, l.c, l.v6, l.a.MAC)
	if got := learnedMAC(t, l.d, l.v6); got.String() != l.a.MAC.String() {
		t.Fatalf("IPv6 VIP held: D resolved it to %v, want A's %s", got, l.a.MAC)
	}
	if got := dial(t, l.c, l.v6); got != dialRefused {
		t.Fatalf("TCP to the held IPv6 VIP: %s, want refused (the holder's RST)", got)
	}
}

// addV6 gives h's eth0 the address p, usable at once (no DAD).
func addV6(t *testing.T, h *nettest.Host, p netip.Prefix) {
	t.Helper()
	eth, err := h.H.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 128)}, Flags: unix.IFA_F_NODAD}
	if err := h.H.AddrAdd(eth, a); err != nil {
		t.Fatal(err)
	}
}

// learnedMAC asks h's kernel to resolve ip afresh (its neighbour entry
// deleted, then a TCP attempt) and returns the MAC a neighbour
// advertisement gave it, nil when none came.
func learnedMAC(t *testing.T, h *nettest.Host, ip netip.Addr) net.HardwareAddr {
	t.Helper()
	eth, err := h.H.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	_ = h.H.NeighDel(&netlink.Neigh{LinkIndex: eth.Attrs().Index, Family: netlink.FAMILY_V6, IP: ip.AsSlice()})
	dial(t, h, ip)
	ns, err := h.H.NeighList(eth.Attrs().Index, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.IP.Equal(ip.AsSlice()) && n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE) != 0 {
			return n.HardwareAddr
		}
	}
	return nil
}

// With fence lifetime the tables are an extra: when they fail, they go
// (with a warning) and the address is added with its lifetime all the
// same. The failure here is a timeout below the kernel's unit, which the
// guard never asks for; any other error takes the same path.
func TestExtraTablesFailingDoNotCostTheAddress(t *testing.T) {
	if testing.Short() {
		t.Skip("needs network namespaces; skipped with -short")
	}
	l := holderAndClient(t, 87, FenceLifetime)
	a, v4, cfg := l.a, l.v4, l.cfg
	lk, err := openLink(cfg, "test", zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.close()
	n := lk.(*nlLink)
	if n.nft == nil || !n.nftExtra {
		t.Fatal("fence lifetime opened no tables beside the lifetime")
	}
	if err := lk.replace(cfg.Prefixes(), 2*time.Second, 0, time.Now().Add(time.Second)); err != nil {
		t.Fatalf("add with failing tables: %v, want the address added all the same", err)
	}
	if held, _ := a.Has(v4); !held {
		t.Fatal("the address was not added")
	}
	if n.nft != nil {
		t.Error("the failed tables were kept")
	}
	if out := nftList(t, a); strings.Contains(out, "hapair_test_vip") {
		t.Errorf("the failed tables are still in the kernel:\n%s", out)
	}
	if err := lk.remove(cfg.Prefixes()); err != nil {
		t.Fatal(err)
	}
	// With fence nftables the tables are the fence: the same failure fails the add.
	cfg.Fence = FenceNftables
	lk2, err := openLink(cfg, "test", zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer lk2.close()
	if err := lk2.replace(cfg.Prefixes(), 2*time.Second, 0, time.Now().Add(time.Second)); err == nil {
		t.Error("fence nftables: an add whose fence failed succeeded")
	}
	if held, _ := a.Has(v4); held {
		t.Error("fence nftables: the address was added without its fence")
	}
}
