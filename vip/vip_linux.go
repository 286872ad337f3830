package vip

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// nlLink is an interface reached over netlink (github.com/vishvananda/netlink)
// with an AF_PACKET socket for the announcements, both opened in the
// configured network namespace.
type nlLink struct {
	name string
	// lk is the interface as looked up at open, looked up again after an
	// ENODEV (it was re-created). Cached so that an add or refresh is one
	// netlink call: Guard reads its clock for the lifetime just before
	// replace, and a lookup in between would widen the window in which a
	// pause (SIGSTOP, a frozen VM) makes the kernel take a lifetime
	// counted from before the pause.
	lk  netlink.Link
	h   *netlink.Handle
	pkt int       // AF_PACKET socket, send only
	nft *nftFence // the nftables tables; nil: none
	// nftExtra: the tables sit beside the lifetime fence (fence lifetime)
	// rather than being the fence. A failure there then drops them with a
	// warning and the addresses go on with their lifetime alone: the
	// default fence must not lose the VIP over an extra.
	nftExtra bool
	lg       *zap.Logger
}

// openLink opens cfg's interface; part names the nftables tables
// (hapair_<part>_vip). With fence nftables they are the fence and must
// open. With fence lifetime the address lifetime is the fence, and the
// same tables are opened beside it where the kernel allows (a warning on
// lg where not): their absolute end keeps an address silent that a call
// taken by the kernel after a pause put back (nft_linux.go); nothing else
// about the lifetime fence changes.
func openLink(cfg Config, part string, lg *zap.Logger) (link, error) {
	ns := netns.None()
	if cfg.Netns != "" {
		var err error
		if ns, err = netns.GetFromPath(cfg.Netns); err != nil {
			return nil, fmt.Errorf("vip: network namespace %s: %w", cfg.Netns, err)
		}
		defer ns.Close()
	}
	var h *netlink.Handle
	var err error
	if ns.IsOpen() {
		h, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	if err != nil {
		return nil, fmt.Errorf("vip: netlink: %w", err)
	}
	// Protocol 0: the socket receives nothing, it only sends.
	pkt, err := inNetns(ns, func() (int, error) {
		return unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	})
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("vip: packet socket (needs CAP_NET_RAW): %w", err)
	}
	l := &nlLink{name: cfg.Interface, h: h, pkt: pkt, lg: lg}
	if l.lk, err = h.LinkByName(cfg.Interface); err != nil {
		l.close()
		return nil, fmt.Errorf("vip: interface %s: %w", cfg.Interface, err)
	}
	table := "hapair_" + part + "_vip"
	if cfg.Fence == FenceNftables {
		if l.nft, err = openNftFence(ns, table, cfg.Prefixes()); err != nil {
			l.close()
			return nil, err
		}
		return l, nil
	}
	l.nftExtra = true
	if l.nft, err = openNftFence(ns, table, cfg.Prefixes()); err != nil {
		l.nft = nil
		lg.Warn("VIP without nftables tables beside the address lifetime: an add or refresh that reaches the kernel after a pause can make the address answer until this process removes it",
			zap.String("interface", cfg.Interface), zap.Error(err))
	}
	return l, nil
}

// inNetns runs f on a thread switched into ns (the process's own when ns is
// not open). Sockets keep the namespace they were made in.
func inNetns(ns netns.NsHandle, f func() (int, error)) (int, error) {
	if !ns.IsOpen() {
		return f()
	}
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, err}
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, err}
			return
		}
		fd, ferr := f()
		if err := netns.Set(orig); err != nil {
			// The thread stays locked and dies with this goroutine: it
			// must not run other goroutines in the wrong namespace.
			ch <- result{fd, ferr}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{fd, ferr}
	}()
	r := <-ch
	return r.fd, r.err
}

func nlAddr(p netip.Prefix, lifetime time.Duration) *netlink.Addr {
	a := p.Addr()
	bits := 32
	if a.Is6() {
		bits = 128
	}
	na := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}}
	if lifetime > 0 {
		s := int(lifetime / time.Second)
		na.ValidLft, na.PreferedLft = s, s
	}
	if a.Is6() {
		// Without NODAD the address stays tentative (unusable) for the
		// duplicate address detection time, about a second, after each add.
		na.Flags = unix.IFA_F_NODAD
	}
	return na
}

func (l *nlLink) replace(ps []netip.Prefix, lifetime, fence time.Duration, fenceEnd time.Time) error {
	if l.lk == nil {
		lk, err := l.h.LinkByName(l.name)
		if err != nil {
			return err
		}
		l.lk = lk
	}
	lk := l.lk
	if l.nft != nil {
		// The fence first: an address never answers outside it.
		if err := l.nft.hold(fence, fenceEnd); err != nil {
			if !l.nftExtra {
				return err
			}
			l.dropExtra(err)
		}
	}
	for _, p := range ps {
		if err := l.h.AddrReplace(lk, nlAddr(p, lifetime)); err != nil {
			if errors.Is(err, unix.ENODEV) {
				l.lk = nil // re-created: look it up on the retry
			}
			return fmt.Errorf("add %s: %w", p, err)
		}
	}
	return nil
}

func (l *nlLink) remove(ps []netip.Prefix) error {
	lk, err := l.h.LinkByName(l.name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil // no interface, no address on it
		}
		return err
	}
	var first error
	for _, p := range ps {
		err := l.h.AddrDel(lk, nlAddr(p, 0))
		if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENODEV) && first == nil {
			first = fmt.Errorf("remove %s: %w", p, err)
		}
	}
	if l.nft != nil {
		if err := l.nft.release(); err != nil {
			if l.nftExtra {
				l.dropExtra(err)
			} else if first == nil {
				first = err
			}
		}
	}
	return first
}

// dropExtra deletes the tables beside the lifetime fence after they
// failed: the addresses keep the lifetime fence, as where the kernel
// refused the tables at start.
func (l *nlLink) dropExtra(err error) {
	l.lg.Warn("VIP: the nftables tables beside the address lifetime failed; going on without them",
		zap.String("interface", l.name), zap.Error(err))
	if cerr := l.nft.close(); cerr != nil {
		l.lg.Warn("VIP: deleting the nftables tables", zap.Error(cerr))
	}
	l.nft = nil
}

func (l *nlLink) announce(ps []netip.Prefix) error {
	lk, err := l.h.LinkByName(l.name)
	if err != nil {
		return err
	}
	mac, idx := lk.Attrs().HardwareAddr, lk.Attrs().Index
	if len(mac) != 6 {
		return fmt.Errorf("interface %s has no Ethernet address", l.name)
	}
	for _, p := range ps {
		var frame []byte
		var typ uint16
		if p.Addr().Is6() {
			frame, typ = unsolicitedNA(mac, p.Addr()), etherTypeIPv6
		} else {
			frame, typ = gratuitousARP(mac, p.Addr()), etherTypeARP
		}
		sa := &unix.SockaddrLinklayer{Protocol: htons(typ), Ifindex: idx, Halen: 6}
		copy(sa.Addr[:], frame[0:6])
		if err := unix.Sendto(l.pkt, frame, 0, sa); err != nil {
			return fmt.Errorf("announce %s: %w", p, err)
		}
	}
	return nil
}

func (l *nlLink) close() error {
	var err error
	if l.nft != nil {
		err = l.nft.close()
	}
	l.h.Close()
	if cerr := unix.Close(l.pkt); err == nil {
		err = cerr
	}
	return err
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
