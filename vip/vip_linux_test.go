package vip

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"

	"github.com/hapair/hapair/internal/nettest"
)

// The kernel fence alone: the owner adds the addresses once (Sync) and then
// does nothing at all, as a stopped or killed process would; the kernel
// deletes them before the owner's deadline. IPv4 and IPv6 (added without
// duplicate address detection, so usable at once), on a real veth in a
// namespace the test makes, reached through vip.netns.
func TestKernelDropsTheAddressBeforeTheDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("needs network namespaces; skipped with -short")
	}
	lan := nettest.NewLAN(t)
	h := lan.AddHost("A", "10.80.0.1/24")
	cfg := Default()
	cfg.Address, cfg.Interface, cfg.Netns = "10.80.0.100/24", "eth0", h.NetnsPath()
	cfg.Extra = []string{"2001:db8::100/64"}
	start := time.Now()
	now := func() time.Duration { return time.Since(start) }
	const deadline = 2600 * time.Millisecond // Lifetime(2.6s - a little) = 2s
	g, err := New(cfg, "test", zaptest.NewLogger(t), now, func() (time.Duration, bool) { return deadline, true })
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	g.Sync()
	added := now()
	v4, v6 := netip.MustParseAddr("10.80.0.100"), netip.MustParseAddr("2001:db8::100")
	for _, ip := range []netip.Addr{v4, v6} {
		if ok, err := h.Has(ip); err != nil || !ok {
			t.Fatalf("%s not on eth0 after Sync (err %v)", ip, err)
		}
	}
	if !tentativeFree(t, h, v6) {
		t.Fatal("the IPv6 VIP is tentative (DAD): unusable for a second after each move")
	}
	if g.ctr.announcements.Load() != 1 || g.ctr.errAnnounce.Load() != 0 {
		t.Fatalf("announcements %d, errors %d", g.ctr.announcements.Load(), g.ctr.errAnnounce.Load())
	}
	seen4 := nettest.WatchLastSeen(t, h, v4)
	seen6 := nettest.WatchLastSeen(t, h, v6)
	for end := start.Add(deadline + 2*time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		a, _ := h.Has(v4)
		b, _ := h.Has(v6)
		if !a && !b {
			break
		}
	}
	l4, l6 := seen4.Halt(), seen6.Halt()
	t.Logf("added %s after start; last seen: IPv4 %s, IPv6 %s after start; deadline %s",
		added, l4.Sub(start), l6.Sub(start), deadline)
	for ip, last := range map[netip.Addr]time.Time{v4: l4, v6: l6} {
		if !last.Before(start.Add(deadline)) {
			t.Errorf("%s still on the interface %s after start, past the deadline %s", ip, last.Sub(start), deadline)
		}
		if ok, _ := h.Has(ip); ok {
			t.Errorf("%s never removed by the kernel", ip)
		}
	}
}

func tentativeFree(t *testing.T, h *nettest.Host, ip netip.Addr) bool {
	as, err := h.H.AddrList(nil, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if b, ok := netip.AddrFromSlice(a.IP); ok && b == ip {
			return a.Flags&0x40 == 0 // IFA_F_TENTATIVE
		}
	}
	return false
}

// The announcements are frames the neighbours act on: a host whose
// neighbour entries for the VIP (IPv4 and IPv6) still point at an old MAC
// updates them to the new holder's on the gratuitous ARP and the unsolicited
// NA alone, without asking (a wrong checksum or layout would be dropped).
func TestAnnouncementsUpdateNeighbours(t *testing.T) {
	if testing.Short() {
		t.Skip("needs network namespaces; skipped with -short")
	}
	lan := nettest.NewLAN(t)
	a, b := lan.AddHost("A", "10.81.0.1/24"), lan.AddHost("B", "10.81.0.2/24")
	v4, v6 := netip.MustParseAddr("10.81.0.100"), netip.MustParseAddr("2001:db8:81::100")
	for _, h := range []*nettest.Host{a, b} { // B needs an IPv6 address on the prefix to take the NA
		eth, err := h.H.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		ip := "2001:db8:81::1/64"
		if h == b {
			ip = "2001:db8:81::2/64"
		}
		if err := h.H.AddrAdd(eth, nlAddr(netip.MustParsePrefix(ip), 0)); err != nil {
			t.Fatal(err)
		}
	}
	beth, err := b.H.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	old := []byte{0x02, 0, 0, 0, 0xde, 0xad}
	for _, ip := range []netip.Addr{v4, v6} {
		fam := netlink.FAMILY_V4
		if ip.Is6() {
			fam = netlink.FAMILY_V6
		}
		// STALE: a real entry from the old holder, still trusted until
		// re-checked; what a client has right after a move.
		if err := b.H.NeighSet(&netlink.Neigh{LinkIndex: beth.Attrs().Index, Family: fam, State: netlink.NUD_STALE,
			IP: ip.AsSlice(), HardwareAddr: old}); err != nil {
			t.Fatal(err)
		}
	}
	// The kernel overrides an entry changed less than its locktime (1 s)
	// ago only for a reply it trusts; a client's entry at a failover is
	// older than that (the scenario, not a sync point).
	time.Sleep(1100 * time.Millisecond)
	cfg := Default()
	cfg.Address, cfg.Interface, cfg.Netns = "10.81.0.100/24", "eth0", a.NetnsPath()
	cfg.Extra = []string{"2001:db8:81::100/64"}
	start := time.Now()
	g, err := New(cfg, "test", zaptest.NewLogger(t), func() time.Duration { return time.Since(start) },
		func() (time.Duration, bool) { return time.Since(start) + 10*time.Second, true })
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	g.Sync() // adds and sends the first round only: no Run, no further rounds
	mac := func(ip netip.Addr) string {
		fam := netlink.FAMILY_V4
		if ip.Is6() {
			fam = netlink.FAMILY_V6
		}
		ns, err := b.H.NeighList(beth.Attrs().Index, fam)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			if x, ok := netip.AddrFromSlice(n.IP); ok && x.Unmap() == ip {
				return n.HardwareAddr.String()
			}
		}
		return ""
	}
	for _, ip := range []netip.Addr{v4, v6} {
		deadline := time.Now().Add(5 * time.Second)
		for mac(ip) != a.MAC.String() {
			if time.Now().After(deadline) {
				t.Fatalf("B's neighbour entry for %s is %s, want A's %s", ip, mac(ip), a.MAC)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// The interface is deleted and made again under a running guard (a
// network restart): the link looked up at open is gone, the next refresh
// fails with ENODEV, and the retry looks the interface up again and puts
// the address on the new one.
func TestGuardFollowsARecreatedInterface(t *testing.T) {
	if testing.Short() {
		t.Skip("needs network namespaces; skipped with -short")
	}
	lan := nettest.NewLAN(t)
	h := lan.AddHost("A", "10.85.0.1/24")
	mkDummy := func() {
		t.Helper()
		// A veth pair: this kernel may have no dummy driver.
		d := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vip0"}, PeerName: "vip0p"}
		if err := h.H.LinkAdd(d); err != nil {
			t.Fatal(err)
		}
		if err := h.H.LinkSetUp(d); err != nil {
			t.Fatal(err)
		}
	}
	mkDummy()
	cfg := Default()
	cfg.Address, cfg.Interface, cfg.Netns = "10.85.0.100/24", "vip0", h.NetnsPath()
	g := startGuard(t, cfg, nil, time.Hour)
	deadline := &g.deadline
	v4 := netip.MustParseAddr("10.85.0.100")
	g.Sync()
	if ok, err := h.Has(v4); err != nil || !ok {
		t.Fatalf("VIP not on vip0 after Sync (err %v)", err)
	}
	old, err := h.H.LinkByName("vip0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.H.LinkDel(old); err != nil {
		t.Fatal(err)
	}
	mkDummy()
	deadline.Store(int64(2 * time.Hour)) // a new deadline: a refresh
	g.Sync()
	if n := g.ctr.errAdd.Load(); n != 1 {
		t.Fatalf("add errors after the interface went: %d, want 1 (ENODEV on the old link)", n)
	}
	g.Sync() // Run's retry
	lk, err := h.H.LinkByName("vip0")
	if err != nil {
		t.Fatal(err)
	}
	as, err := h.H.AddrList(lk, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != 1 || !as[0].IP.Equal(v4.AsSlice()) {
		t.Fatalf("addresses on the new vip0 (index %d, was %d): %v, want %s",
			lk.Attrs().Index, old.Attrs().Index, as, v4)
	}
	if n := g.ctr.errAdd.Load(); n != 1 {
		t.Fatalf("add errors after the retry: %d, want still 1", n)
	}
}

// kernelGuard is a guard whose owner may always hold the addresses, until a
// deadline the test sets (on a clock that starts at start).
type kernelGuard struct {
	*Guard
	deadline atomic.Int64
	start    time.Time
}

// startGuard opens cfg's link (or uses lk) for a guard with deadline first;
// the test's cleanup closes it.
func startGuard(t *testing.T, cfg Config, lk link, first time.Duration) *kernelGuard {
	t.Helper()
	tg := &kernelGuard{start: time.Now()}
	tg.deadline.Store(int64(first))
	now := func() time.Duration { return time.Since(tg.start) }
	allow := func() (time.Duration, bool) { return time.Duration(tg.deadline.Load()), true }
	if lk == nil {
		var err error
		if lk, err = openLink(cfg, "test", zaptest.NewLogger(t)); err != nil {
			t.Fatal(err)
		}
	}
	tg.Guard = newGuard(cfg, lk, "test", zaptest.NewLogger(t), now, allow)
	t.Cleanup(func() { tg.Close() })
	return tg
}
