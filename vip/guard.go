package vip

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// KernelSlack is how long before the owner's deadline the kernel lifetime of
// the addresses ends at the latest. It covers the kernel's lifetime worker,
// which runs up to HZ/4 late (round_jiffies_up in devinet.c check_lifetime
// and addrconf_verify), and one netlink call of at most maxCallTime.
const KernelSlack = 500 * time.Millisecond

// maxCallTime bounds one add or refresh: a call that took longer may have
// been paused between reading the clock and the kernel taking the lifetime,
// so the lifetime may end after the deadline; it is redone from a fresh clock.
const maxCallTime = 100 * time.Millisecond

// retryAfter is the wait after a failed netlink call.
const retryAfter = 100 * time.Millisecond

// FenceSlack is how long before the owner's deadline the nftables fence
// (fence: nftables) ends at the latest: one call of at most maxCallTime
// (the element's timeout starts when the kernel takes it) and 50ms for the
// kernel's expiry, measured 0.3-13 ms early and never late.
const FenceSlack = 150 * time.Millisecond

// FenceTimeout is the nftables element timeout to give with rem left before
// the deadline: ending FenceSlack before it, in milliseconds; 0 when none
// fits.
func FenceTimeout(rem time.Duration) time.Duration {
	f := (rem - FenceSlack).Truncate(time.Millisecond)
	if f < time.Millisecond {
		return 0
	}
	return f
}

// Lifetime is the kernel valid lifetime to give the addresses with rem left
// before the deadline: whole seconds (the kernel's unit), ending KernelSlack
// before it; 0 when none fits.
func Lifetime(rem time.Duration) time.Duration {
	l := (rem - KernelSlack).Truncate(time.Second)
	if l < 0 {
		return 0
	}
	return l
}

// link is the interface the addresses live on (vip_linux.go; a fake in tests).
type link interface {
	// replace adds the prefixes, or refreshes them, with this valid and
	// preferred lifetime (whole seconds); where it has nftables tables it
	// first lets them answer for fence (milliseconds) from now, and never
	// from fenceEnd (wall clock) on.
	replace(ps []netip.Prefix, lifetime, fence time.Duration, fenceEnd time.Time) error
	// remove deletes the prefixes and silences them (nftables tables);
	// absent ones are no error.
	remove(ps []netip.Prefix) error
	// announce sends one gratuitous ARP / unsolicited NA per prefix.
	announce(ps []netip.Prefix) error
	close() error
}

// Allow is the owner's fence: the local deadline (on the owner's monotonic
// clock, as returned by now) until which it may hold the addresses, and
// false when it may not hold them at all. It must read atomics only.
type Allow func() (until time.Duration, ok bool)

// Guard holds the addresses exactly while Allow says so. Sync applies the
// fence at once (the owner calls it right after serving 200, and right after
// serving 503 before it releases its key); Kick asks for a refresh after a
// new deadline; Run removes the addresses when the deadline passes and sends
// the announcements.
type Guard struct {
	cfg   Config
	ps    []netip.Prefix
	lk    link
	lg    *zap.Logger
	now   func() time.Duration
	allow Allow
	kick  chan struct{}
	pub   atomic.Pointer[published]
	ctr   counters
	descs descs

	mu           sync.Mutex
	present      bool          // the addresses may be on the interface (true at start: leftovers)
	setUntil     time.Duration // deadline the kernel lifetime was computed from; 0: not held
	expires      time.Duration // now() by which the kernel drops them
	announceLeft int
	nextAnnounce time.Duration
	retryAt      time.Duration
	closed       bool
}

type published struct {
	held    bool
	since   time.Time
	expires time.Duration
}

type counters struct {
	adds, removals, announcements, late atomic.Int64
	errAdd, errRemove, errAnnounce      atomic.Int64
}

// New opens the interface of cfg (in cfg.Netns, when set) for the owner
// whose fence is allow on the clock now. subsystem names the metrics
// (hapair_<subsystem>_vip_*). Nothing is changed on the interface until
// Sync or Run.
func New(cfg Config, subsystem string, lg *zap.Logger, now func() time.Duration, allow Allow) (*Guard, error) {
	lk, err := openLink(cfg, subsystem, lg)
	if err != nil {
		return nil, err
	}
	return newGuard(cfg, lk, subsystem, lg, now, allow), nil
}

func newGuard(cfg Config, lk link, subsystem string, lg *zap.Logger, now func() time.Duration, allow Allow) *Guard {
	g := &Guard{cfg: cfg, ps: cfg.Prefixes(), lk: lk, lg: lg, now: now, allow: allow,
		kick: make(chan struct{}, 1), present: true, descs: newDescs(subsystem)}
	g.pub.Store(&published{})
	return g
}

// Kick asks Run to apply the fence again (a new deadline, a lost lease).
func (g *Guard) Kick() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// Sync applies the fence now: the addresses are added (or their lifetime
// refreshed) when allowed, removed otherwise. It returns when the kernel
// has done it (or the call failed; Run retries).
func (g *Guard) Sync() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.syncLocked()
}

func (g *Guard) syncLocked() {
	for range 3 {
		until, ok := g.allow()
		// The wall clock before the owner's: a pause between the two
		// readings makes fenceEnd below only earlier.
		w0 := time.Now()
		t0 := g.now()
		if !ok || t0 >= until {
			g.removeLocked()
			return
		}
		if g.setUntil == until {
			return // this deadline is already in the kernel
		}
		lft, fence := g.kernelTimes(until - t0)
		if lft <= 0 {
			// Too near the deadline for the kernel fence (a slow
			// keep-alive): add nothing. Addresses already there keep the
			// fence they have, which ends before the earlier deadline; the
			// timer at that deadline looks again.
			return
		}
		// The nftables fence's end as an absolute time, which a call
		// delayed by a pause cannot move (nft_linux.go).
		var fenceEnd time.Time
		if fence > 0 {
			fenceEnd = w0.Add(fence)
		}
		if err := g.lk.replace(g.ps, lft, fence, fenceEnd); err != nil {
			g.ctr.errAdd.Add(1)
			g.lg.Error("cannot add the VIP", zap.String("interface", g.cfg.Interface), zap.Error(err))
			g.present, g.setUntil, g.retryAt = true, 0, g.now()+retryAfter
			return
		}
		t1 := g.now()
		g.present = true
		if t1-t0 > maxCallTime {
			// Paused or stalled inside the call: the lifetime may end after
			// the deadline. Compute it again from a fresh clock.
			g.ctr.late.Add(1)
			g.lg.Warn("VIP call took too long, refreshing from a fresh clock", zap.Duration("took", t1-t0))
			g.setUntil = 0
			continue
		}
		// Fresh also when the kernel dropped them meanwhile (a refresh
		// came too late): the re-added address is announced again.
		fresh := !g.pub.Load().held || t0 >= g.expires
		g.setUntil, g.expires = until, t1+lft
		if g.cfg.Fence == FenceNftables {
			g.expires = t1 + fence // silenced then, the address may stay
		}
		if fresh {
			g.ctr.adds.Add(1)
			g.pub.Store(&published{held: true, since: time.Now(), expires: g.expires})
			g.lg.Info("VIP added", zap.String("interface", g.cfg.Interface), zap.Strings("addresses", g.addrs()),
				zap.Duration("kernel_lifetime", lft), zap.Duration("nftables_timeout", fence), zap.Duration("deadline_in", until-t1))
			g.announceLeft, g.nextAnnounce = g.cfg.AnnounceCount, t1
			g.announceLocked()
		} else {
			g.pub.Store(&published{held: true, since: g.pub.Load().since, expires: g.expires})
		}
		return
	}
	g.removeLocked()
}

// kernelTimes are the address lifetime and the nftables timeout to set
// with rem left before the deadline; lifetime 0: no fence fits. With fence
// nftables the element's timeout is the fence and the lifetime (rem
// rounded up to whole seconds, + 1 s, so that it never lapses between
// refreshes) only clears the silenced address off the interface of an
// owner that stopped.
func (g *Guard) kernelTimes(rem time.Duration) (lifetime, fence time.Duration) {
	if g.cfg.Fence != FenceNftables {
		// The address lifetime is the fence; the nftables timeout, which
		// ends later, is for the tables opened beside it (openLink): they
		// only matter for a call that reaches the kernel late.
		l := Lifetime(rem)
		if l <= 0 {
			return 0, 0
		}
		return l, FenceTimeout(rem)
	}
	f := FenceTimeout(rem)
	if f <= 0 {
		return 0, 0
	}
	return (rem + time.Second - 1).Truncate(time.Second) + time.Second, f
}

// removeLocked deletes the addresses if they may be there.
func (g *Guard) removeLocked() {
	if !g.present {
		return
	}
	if err := g.lk.remove(g.ps); err != nil {
		g.ctr.errRemove.Add(1)
		g.lg.Error("cannot remove the VIP", zap.String("interface", g.cfg.Interface), zap.Error(err))
		g.setUntil, g.retryAt = 0, g.now()+retryAfter
		return
	}
	was := g.pub.Load().held
	g.present, g.setUntil, g.announceLeft = false, 0, 0
	g.pub.Store(&published{})
	if was {
		g.ctr.removals.Add(1)
		g.lg.Info("VIP removed", zap.String("interface", g.cfg.Interface), zap.Strings("addresses", g.addrs()))
	}
}

// announceLocked sends the next announcement round if one is due, and only
// while still allowed: a resumed process must not advertise an address it
// has lost.
func (g *Guard) announceLocked() {
	if g.announceLeft <= 0 || !g.present || g.setUntil == 0 || g.now() < g.nextAnnounce {
		return
	}
	if until, ok := g.allow(); !ok || g.now() >= until {
		return
	}
	g.announceLeft--
	g.nextAnnounce = g.now() + g.cfg.AnnounceInterval
	if err := g.lk.announce(g.ps); err != nil {
		g.ctr.errAnnounce.Add(1)
		g.lg.Warn("VIP announcement failed", zap.String("interface", g.cfg.Interface), zap.Error(err))
		return
	}
	g.ctr.announcements.Add(1)
}

// Run applies the fence on every Kick, removes the addresses when the
// deadline passes (a process resumed from a pause does that first: its
// timer is already due), retries failed calls and sends the remaining
// announcements. It returns when ctx is done; the owner then calls Close.
func (g *Guard) Run(ctx context.Context) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-g.kick:
		case <-t.C:
		}
		g.mu.Lock()
		g.syncLocked()
		g.announceLocked()
		next := g.nextWakeLocked()
		g.mu.Unlock()
		t.Stop()
		t.Reset(next)
	}
}

func (g *Guard) nextWakeLocked() time.Duration {
	now := g.now()
	w := now + time.Second
	if g.setUntil != 0 {
		w = min(w, g.setUntil)
	}
	if g.announceLeft > 0 {
		w = min(w, g.nextAnnounce)
	}
	if g.retryAt > now {
		w = min(w, g.retryAt)
	}
	return max(w-now, time.Millisecond)
}

// Close removes the addresses whatever the fence says (the owner has
// stopped) and releases the interface.
func (g *Guard) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	g.present = true
	g.removeLocked()
	return g.lk.close()
}

// Status is the VIP as shown in /role, the heartbeat and the admin page.
type Status struct {
	Interface string   `json:"interface"`
	Addresses []string `json:"addresses"` // configured
	Held      []string `json:"held"`      // on the interface, put there by this process, now
	// Since is when this process added them; zero when not held.
	Since time.Time `json:"since,omitzero"`
	// KernelExpiresInSeconds is when the kernel deletes them (fence
	// lifetime) or silences them (fence nftables) unless refreshed.
	KernelExpiresInSeconds float64 `json:"kernel_expires_in_seconds,omitempty"`
}

// Status reads atomics only.
func (g *Guard) Status() Status {
	p := g.pub.Load()
	st := Status{Interface: g.cfg.Interface, Addresses: g.addrs(), Held: []string{}}
	if now := g.now(); p.held && now < p.expires {
		st.Held, st.Since, st.KernelExpiresInSeconds = g.addrs(), p.since, (p.expires - now).Seconds()
	}
	return st
}

// Held reports whether this process holds the addresses now.
func (g *Guard) Held() bool { p := g.pub.Load(); return p.held && g.now() < p.expires }

func (g *Guard) addrs() []string {
	s := make([]string, len(g.ps))
	for i, p := range g.ps {
		s[i] = p.String()
	}
	return s
}

type descs struct {
	held, adds, removals, announcements, late, errors *prometheus.Desc
}

func newDescs(sub string) descs {
	d := func(n, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("hapair", sub, n), help, labels, nil)
	}
	return descs{
		held:          d("vip_held", "1 while this process holds the address on the interface.", "address", "interface"),
		adds:          d("vip_adds_total", "Times the addresses were added."),
		removals:      d("vip_removals_total", "Times held addresses were removed."),
		announcements: d("vip_announcements_total", "Gratuitous ARP / unsolicited NA rounds sent."),
		late:          d("vip_late_calls_total", "Adds or refreshes redone because the call took longer than 100ms (a pause)."),
		errors:        d("vip_errors_total", "Failed interface operations, by op (add, remove, announce).", "op"),
	}
}

// Describe implements prometheus.Collector.
func (g *Guard) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(g, ch) }

// Collect implements prometheus.Collector; it reads atomics only.
func (g *Guard) Collect(ch chan<- prometheus.Metric) {
	held := 0.0
	if g.Held() {
		held = 1
	}
	for _, a := range g.addrs() {
		ch <- prometheus.MustNewConstMetric(g.descs.held, prometheus.GaugeValue, held, a, g.cfg.Interface)
	}
	c := func(d *prometheus.Desc, v *atomic.Int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v.Load()), labels...)
	}
	c(g.descs.adds, &g.ctr.adds)
	c(g.descs.removals, &g.ctr.removals)
	c(g.descs.announcements, &g.ctr.announcements)
	c(g.descs.late, &g.ctr.late)
	c(g.descs.errors, &g.ctr.errAdd, "add")
	c(g.descs.errors, &g.ctr.errRemove, "remove")
	c(g.descs.errors, &g.ctr.errAnnounce, "announce")
}
