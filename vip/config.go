// Package vip owns the floating service address: it adds the addresses to an
// interface only while its owner may hold them (roled while ACTIVE, hapair-lb
// while it holds its election key), announces them, and removes them before
// the owner's local deadline passes.
//
// Two fences keep an address off a host that has lost the right to it:
//   - in the process, a timer at the owner's deadline removes the addresses,
//     and every add, refresh and announcement checks the deadline first, so a
//     process resumed from a pause removes them before it does anything else;
//   - in the kernel, every address is added with a valid lifetime that ends
//     before that deadline (valid_lft, refreshed on every new deadline), so a
//     process that is paused, killed or stuck loses the address anyway: the
//     kernel deletes it on time without the process. Lifetimes are whole
//     seconds, so this fence needs a lease of about 2 s or more; with
//     fence: nftables an nftables set element whose timeout (milliseconds)
//     ends before the deadline silences the addresses instead (no ARP or
//     neighbour advertisement answer, no packet in), which allows a 1 s
//     lease (nft_linux.go).
//
// A call that the kernel takes late (the process paused between reading
// its clock and the syscall) re-creates an address that the kernel had
// already deleted, with a lifetime counted from then; the nftables tables
// also carry the end as an absolute time, so with either fence an
// address put back that way stays silent until the process removes it.
package vip

import (
	"net/netip"
	"strings"
	"time"

	"github.com/hapair/hapair/internal/config"
)

// Config is the `vip` section of roled and of hapair-lb.
type Config struct {
	// Address is the floating address with its prefix length, e.g.
	// 10.0.0.100/24 (IPv4) or 2001:db8::100/64 (IPv6). Empty (the default)
	// disables the VIP.
	Address string `yaml:"address"`
	// Interface is the interface the addresses are added to, e.g. eth0
	// (required with address).
	Interface string `yaml:"interface"`
	// Extra are further addresses (same form as address) held and released
	// together with it (default none).
	Extra []string `yaml:"extra"`
	// AnnounceCount is how many gratuitous ARP (IPv4) or unsolicited
	// neighbour advertisement (IPv6) rounds are sent after the addresses are
	// added, 0..20 (default 3). The first is sent at once.
	AnnounceCount int `yaml:"announce-count"`
	// AnnounceInterval is the time between announcement rounds (default 200ms).
	AnnounceInterval time.Duration `yaml:"announce-interval"`
	// Fence is the kernel fence for an owner that stops while it holds the
	// addresses (paused, killed, stuck): "lifetime" (the default) deletes
	// them at their kernel valid lifetime, whole seconds ending KernelSlack
	// (500ms) before the deadline, so the lease must leave at least 1 s of
	// it, and where the kernel allows also opens the tables below, only
	// so that a call taken late cannot make them answer (a warning when it
	// cannot); "nftables" installs nftables tables hapair_<part>_vip (arp
	// and ip families for IPv4 addresses, ip6 for IPv6 ones) that drop the
	// host's ARP answers and neighbour advertisements for the addresses
	// and every packet to them once a set element, refreshed with each
	// deadline, times out FenceSlack (150ms) before it: millisecond
	// precision, for leases down to 1 s; the same end is also written as
	// an absolute (wall-clock) time, so a refresh that reaches the kernel
	// late, after a pause, cannot make the addresses answer again.
	// nftables needs nf_tables in the kernel (CAP_NET_ADMIN, as the
	// addresses do).
	Fence Fence `yaml:"fence"`
	// Netns is the path of the network namespace that holds the interface,
	// e.g. /run/netns/front (default "": the process's own). For containers
	// and tests; the process still talks to etcd from its own namespace.
	Netns string `yaml:"netns"`
}

// Fence names the kernel fence (Config.Fence).
type Fence string

const (
	// FenceLifetime: the addresses' kernel valid lifetime (whole seconds).
	FenceLifetime Fence = "lifetime"
	// FenceNftables: an nftables set element's timeout (milliseconds).
	FenceNftables Fence = "nftables"
)

// Default returns the defaults of the section (disabled).
func Default() Config {
	return Config{AnnounceCount: 3, AnnounceInterval: 200 * time.Millisecond, Fence: FenceLifetime}
}

// Enabled reports whether an address is configured.
func (c Config) Enabled() bool { return c.Address != "" }

// Prefixes returns address and extra, parsed. Call after Validate.
func (c Config) Prefixes() []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range append([]string{c.Address}, c.Extra...) {
		if p, err := netip.ParsePrefix(s); err == nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// Validate checks the section; errors name prefix.field. A disabled section
// is valid whatever else it holds.
func (c Config) Validate(prefix string) error {
	if !c.Enabled() {
		if len(c.Extra) > 0 {
			return config.Errorf(config.Join(prefix, "extra"), c.Extra, "needs address")
		}
		return nil
	}
	seen := map[netip.Addr]bool{}
	check := func(field, s string) error {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return config.Errorf(config.Join(prefix, field), s, "want an address with its prefix length, e.g. 10.0.0.100/24")
		}
		a := p.Addr()
		if a.Zone() != "" || a.IsLoopback() || a.IsUnspecified() || a.IsMulticast() || a.IsLinkLocalUnicast() {
			return config.Errorf(config.Join(prefix, field), s, "must be a unicast address, not loopback, link-local or multicast")
		}
		if seen[a] {
			return config.Errorf(config.Join(prefix, field), s, "address listed twice")
		}
		seen[a] = true
		return nil
	}
	if err := check("address", c.Address); err != nil {
		return err
	}
	for i, e := range c.Extra {
		if err := check("extra["+itoa(i)+"]", e); err != nil {
			return err
		}
	}
	if c.Interface == "" || len(c.Interface) > 15 || strings.ContainsAny(c.Interface, "/ \t\n") {
		return config.Errorf(config.Join(prefix, "interface"), c.Interface, "required with address: an interface name of at most 15 characters")
	}
	if c.AnnounceCount < 0 || c.AnnounceCount > 20 {
		return config.Errorf(config.Join(prefix, "announce-count"), c.AnnounceCount, "must be 0..20")
	}
	if c.AnnounceCount > 1 && (c.AnnounceInterval <= 0 || c.AnnounceInterval > 10*time.Second) {
		return config.Errorf(config.Join(prefix, "announce-interval"), c.AnnounceInterval, "must be positive and at most 10s")
	}
	switch c.Fence {
	case FenceLifetime, "", FenceNftables:
	default:
		return config.Errorf(config.Join(prefix, "fence"), c.Fence, "must be lifetime or nftables")
	}
	if c.Netns != "" && !strings.HasPrefix(c.Netns, "/") {
		return config.Errorf(config.Join(prefix, "netns"), c.Netns, "must be an absolute path")
	}
	return nil
}

// CheckTiming refuses a lease whose deadline leaves no room for the kernel
// fence. The fence is set when a keep-alive answer arrives, up to one
// keep-alive period (taken as the round trip allowed) after the deadline's
// base, and must outlast the next refresh. With fence lifetime the
// lifetime is whole seconds ending KernelSlack before the deadline, so
// Lifetime(lease-ttl - safety-margin - keepalive-interval) must be at least
// 1s and longer than keepalive-interval; with fence nftables the element's
// timeout, ending FenceSlack before the deadline, must be longer than
// keepalive-interval. field names the setting to change (e.g. "lease-ttl").
func CheckTiming(field string, fence Fence, ttl, margin, keepalive time.Duration) error {
	if fence == FenceNftables {
		if f := FenceTimeout(ttl - margin - keepalive); f <= keepalive {
			return config.Errorf(field, ttl,
				"with vip fence nftables, lease-ttl - safety-margin - keepalive-interval (%s) must leave an nftables timeout ending %s before the deadline and longer than keepalive-interval (%s); got %s",
				ttl-margin-keepalive, FenceSlack, keepalive, f)
		}
		return nil
	}
	if l := Lifetime(ttl - margin - keepalive); l < time.Second || l <= keepalive {
		return config.Errorf(field, ttl,
			"with vip, lease-ttl - safety-margin - keepalive-interval (%s) must leave a whole-second kernel address lifetime ending %s before the deadline and longer than keepalive-interval (%s); got %s",
			ttl-margin-keepalive, KernelSlack, keepalive, l)
	}
	return nil
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}
