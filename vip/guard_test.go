package vip

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/hapair/hapair/internal/config"
)

// fakeLink records calls; its clock is the test's.
type fakeLink struct {
	mu        sync.Mutex
	present   bool
	lifetime  time.Duration
	calls     []string
	announces int
	onReplace func() // runs inside replace (a pause in the call)
	failAdd   bool
}

func (f *fakeLink) replace(_ []netip.Prefix, l, _ time.Duration, _ time.Time) error {
	if f.onReplace != nil {
		f.onReplace()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAdd {
		return errFake
	}
	f.present, f.lifetime = true, l
	f.calls = append(f.calls, "replace "+l.String())
	return nil
}

func (f *fakeLink) remove([]netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.present = false
	f.calls = append(f.calls, "remove")
	return nil
}

func (f *fakeLink) announce([]netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.announces++
	return nil
}

func (f *fakeLink) close() error { return nil }

func (f *fakeLink) state() (bool, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.present, f.lifetime
}

type fakeErr string

func (e fakeErr) Error() string { return string(e) }

const errFake = fakeErr("fake failure")

// owner is a fake fence: allowed until deadline while ok.
type owner struct {
	clock    atomic.Int64
	deadline atomic.Int64
	ok       atomic.Bool
}

func (o *owner) now() time.Duration { return time.Duration(o.clock.Load()) }
func (o *owner) allow() (time.Duration, bool) {
	return time.Duration(o.deadline.Load()), o.ok.Load()
}
func (o *owner) set(now, deadline time.Duration, ok bool) {
	o.clock.Store(int64(now))
	o.deadline.Store(int64(deadline))
	o.ok.Store(ok)
}

func testGuard(t *testing.T) (*Guard, *fakeLink, *owner) {
	cfg := Default()
	cfg.Address, cfg.Interface = "10.0.0.100/24", "eth0"
	f, o := &fakeLink{}, &owner{}
	return newGuard(cfg, f, "test", zaptest.NewLogger(t), o.now, o.allow), f, o
}

func TestLifetimeEndsBeforeDeadline(t *testing.T) {
	for _, c := range []struct{ rem, want time.Duration }{
		{4 * time.Second, 3 * time.Second},
		{3500 * time.Millisecond, 3 * time.Second},
		{3499 * time.Millisecond, 2 * time.Second},
		{1500 * time.Millisecond, time.Second},
		{1400 * time.Millisecond, 0},
		{-time.Second, 0},
	} {
		if got := Lifetime(c.rem); got != c.want {
			t.Errorf("Lifetime(%s) = %s, want %s", c.rem, got, c.want)
		}
		if got := Lifetime(c.rem); got > 0 && got+KernelSlack > c.rem {
			t.Errorf("Lifetime(%s) = %s ends less than %s before the deadline", c.rem, got, KernelSlack)
		}
	}
}

func TestGuardFollowsTheFence(t *testing.T) {
	g, f, o := testGuard(t)
	// At start: not allowed, leftovers removed.
	g.Sync()
	if p, _ := f.state(); p || len(f.calls) != 1 || f.calls[0] != "remove" {
		t.Fatalf("start: present %v, calls %v; want one remove", p, f.calls)
	}
	// Allowed with 4 s to the deadline: added with 3 s, announced once at once.
	o.set(10*time.Second, 14*time.Second, true)
	g.Sync()
	if p, l := f.state(); !p || l != 3*time.Second {
		t.Fatalf("allowed: present %v lifetime %s; want true 3s", p, l)
	}
	if f.announces != 1 || !g.Held() || len(g.Status().Held) != 1 {
		t.Fatalf("announces %d, held %v %v", f.announces, g.Held(), g.Status())
	}
	// The same deadline again: no call.
	n := len(f.calls)
	g.Sync()
	if len(f.calls) != n {
		t.Fatalf("no new deadline, yet calls %v", f.calls[n:])
	}
	// A new deadline: refreshed, not announced again.
	o.set(11*time.Second, 15*time.Second, true)
	g.Sync()
	if len(f.calls) != n+1 || f.announces != 1 {
		t.Fatalf("refresh: calls %v announces %d", f.calls[n:], f.announces)
	}
	// A new deadline too near for a whole second before it (a slow
	// keep-alive): nothing is changed, the kernel lifetime set from the
	// earlier deadline stands.
	n = len(f.calls)
	o.set(13600*time.Millisecond, 15*time.Second, true)
	g.Sync()
	if p, l := f.state(); !p || l != 3*time.Second || len(f.calls) != n {
		t.Fatalf("near the deadline: present %v lifetime %s calls %v; want untouched", p, l, f.calls[n:])
	}
	// Past the deadline: removed.
	o.set(15*time.Second, 15*time.Second, true)
	g.Sync()
	if p, _ := f.state(); p || g.Held() {
		t.Fatal("at the deadline the address is still there")
	}
	// Passive: removed (already), and held addresses removed on a change.
	o.set(20*time.Second, 24*time.Second, true)
	g.Sync()
	o.set(20*time.Second, 24*time.Second, false)
	g.Sync()
	if p, _ := f.state(); p || g.Held() {
		t.Fatal("not allowed, still present")
	}
}

// A pause inside the add (between reading the clock and the kernel taking
// the lifetime) is noticed and the lifetime recomputed; past the deadline
// the address goes.
func TestGuardRedoesALateCall(t *testing.T) {
	g, f, o := testGuard(t)
	o.set(10*time.Second, 14*time.Second, true)
	paused := false
	f.onReplace = func() {
		if !paused {
			paused = true
			o.clock.Store(int64(12 * time.Second)) // a 2 s pause inside the first call
		}
	}
	g.Sync()
	if p, l := f.state(); !p || l != time.Second {
		t.Fatalf("after a 2 s pause: present %v lifetime %s, want the lifetime recomputed to 1s", p, l)
	}
	if g.ctr.late.Load() != 1 {
		t.Fatalf("late calls %d, want 1", g.ctr.late.Load())
	}
	// A pause past the deadline: removed.
	g2, f2, o2 := testGuard(t)
	o2.set(10*time.Second, 14*time.Second, true)
	f2.onReplace = func() { o2.clock.Add(int64(5 * time.Second)) }
	g2.Sync()
	if p, _ := f2.state(); p || g2.Held() {
		t.Fatalf("paused past the deadline inside the call, still present; calls %v", f2.calls)
	}
}

// Run removes the address when the deadline passes without a new one, on
// the real clock.
func TestGuardRunRemovesAtDeadline(t *testing.T) {
	cfg := Default()
	cfg.Address, cfg.Interface = "10.0.0.100/24", "eth0"
	f := &fakeLink{}
	start := time.Now()
	now := func() time.Duration { return time.Since(start) }
	var deadline atomic.Int64
	deadline.Store(int64(2 * time.Second))
	g := newGuard(cfg, f, "test", zaptest.NewLogger(t), now,
		func() (time.Duration, bool) { return time.Duration(deadline.Load()), true })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitUntil(t, 5*time.Second, func() bool { p, _ := f.state(); return p })
	waitUntil(t, 10*time.Second, func() bool { p, _ := f.state(); return !p })
	if el := now(); el < 1500*time.Millisecond {
		t.Fatalf("removed at %s, before the deadline could have been near", el)
	}
	f.mu.Lock()
	ann := f.announces
	f.mu.Unlock()
	if ann != cfg.AnnounceCount {
		t.Fatalf("%d announcements, want %d", ann, cfg.AnnounceCount)
	}
}

func waitUntil(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatal("condition not reached")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	ok := Default()
	ok.Address, ok.Interface = "10.0.0.100/24", "eth0"
	if err := ok.Validate("vip"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		field string
		mod   func(*Config)
	}{
		{"vip.address", func(c *Config) { c.Address = "10.0.0.100" }},
		{"vip.address", func(c *Config) { c.Address = "127.0.0.2/8" }},
		{"vip.address", func(c *Config) { c.Address = "fe80::1/64" }},
		{"vip.interface", func(c *Config) { c.Interface = "" }},
		{"vip.extra[1]", func(c *Config) { c.Extra = []string{"10.0.0.101/24", "10.0.0.100/24"} }},
		{"vip.announce-count", func(c *Config) { c.AnnounceCount = 21 }},
		{"vip.announce-interval", func(c *Config) { c.AnnounceInterval = 0 }},
		{"vip.netns", func(c *Config) { c.Netns = "ns" }},
	} {
		cfg := ok
		c.mod(&cfg)
		err := cfg.Validate("vip")
		var fe *config.FieldError
		if err == nil || !strings.Contains(err.Error(), c.field) || !asField(err, &fe) || fe.Field != c.field {
			t.Errorf("want an error naming %s, got %v", c.field, err)
		}
	}
	if err := CheckTiming("lease-ttl", FenceLifetime, 5*time.Second, time.Second, time.Second); err != nil {
		t.Errorf("defaults refused: %v", err)
	}
	if err := CheckTiming("lease-ttl", FenceLifetime, 2*time.Second, 500*time.Millisecond, 250*time.Millisecond); err == nil {
		t.Error("a 1.5 s deadline with 250ms keep-alives accepted: the lifetime set after a keep-alive is 0")
	}
	if err := CheckTiming("vip.lease-ttl", FenceLifetime, 2*time.Second, 250*time.Millisecond, 250*time.Millisecond); err != nil {
		t.Errorf("hapair-lb's defaults refused: %v", err)
	}
}

// The kernel fence's times, both fences: the lifetime ends KernelSlack
// before the deadline in whole seconds; the nftables timeout ends
// FenceSlack before it in milliseconds, and the lifetime then outlasts it.
func TestKernelTimes(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		fence          Fence
		rem            time.Duration
		lifetime, nftT time.Duration
	}{
		{FenceLifetime, 2600 * ms, 2 * time.Second, 2450 * ms},
		{FenceLifetime, 1400 * ms, 0, 0},
		{FenceNftables, 1400 * ms, 3 * time.Second, 1250 * ms},
		{FenceNftables, 500 * ms, 2 * time.Second, 350 * ms},
		{FenceNftables, 150 * ms, 0, 0},
		{FenceNftables, 2 * time.Second, 3 * time.Second, 1850 * ms},
	} {
		g := &Guard{cfg: Config{Fence: c.fence}}
		if l, f := g.kernelTimes(c.rem); l != c.lifetime || f != c.nftT {
			t.Errorf("%s, %s left: lifetime %s, nftables %s; want %s, %s", c.fence, c.rem, l, f, c.lifetime, c.nftT)
		}
	}
	// hapair-lb with a 1 s lease and its default margin and keep-alive:
	// the nftables timeout after a keep-alive is 350ms, above 250ms.
	if err := CheckTiming("vip.lease-ttl", FenceNftables, time.Second, 250*ms, 250*ms); err != nil {
		t.Errorf("1 s lease with fence nftables refused: %v", err)
	}
	if err := CheckTiming("vip.lease-ttl", FenceLifetime, time.Second, 250*ms, 250*ms); err == nil {
		t.Error("1 s lease with fence lifetime accepted")
	}
	if err := CheckTiming("vip.lease-ttl", FenceNftables, time.Second, 250*ms, 400*ms); err == nil {
		t.Error("1 s lease with 400ms keep-alives accepted: the timeout set after one (200ms) lapses before the next")
	}
}

func asField(err error, fe **config.FieldError) bool {
	f, ok := err.(*config.FieldError)
	*fe = f
	return ok
}

func TestFrames(t *testing.T) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	arp := gratuitousARP(mac, netip.MustParseAddr("10.0.0.100"))
	if len(arp) != 42 || binary.BigEndian.Uint16(arp[12:]) != etherTypeARP ||
		binary.BigEndian.Uint16(arp[20:]) != 1 || string(arp[28:32]) != string(arp[38:42]) {
		t.Fatalf("bad gratuitous ARP % x", arp)
	}
	ip6 := netip.MustParseAddr("2001:db8::100")
	na := unsolicitedNA(mac, ip6)
	m := na[54:]
	if m[0] != 136 || m[4] != 0x20 || na[21] != 255 {
		t.Fatalf("bad NA % x", na)
	}
	// The checksum over the message with its checksum field is zero.
	src, dst := ip6.As16(), netip.IPv6LinkLocalAllNodes().As16()
	if c := icmpv6Checksum(src, dst, m); c != 0 {
		t.Fatalf("NA checksum does not verify: %#04x", c)
	}
}
