package vip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// nftFence is the millisecond fence (fence: nftables), and the tables
// beside the address lifetime (fence: lifetime). Tables named
// hapair_<part>_vip, one per family in use (arp and ip for IPv4
// addresses, ip6 for IPv6 ones), each hold a set "held" of addresses whose
// elements time out, and a chain "until" whose one rule drops from an
// absolute wall-clock time on, and drop, for every configured address that
// is not in "held" or once that time has come:
//   - the host's answers for it: ARP output with that sender address, in
//     an output chain of the arp family; neighbour advertisements with
//     that target, in an output chain of the ip6 family;
//   - every packet sent to it, in a prerouting chain at priority -300
//     (before conntrack), so a client whose neighbour entry is still
//     fresh reaches nothing either.
//
// Announcements (gratuitous ARP, unsolicited NA) go out on a packet
// socket, which these hooks do not see; the guard sends them only while
// allowed.
//
// hold puts the addresses in "held" with a timeout that ends before the
// owner's deadline; the kernel drops an element at its timeout on its own
// (measured: answers stop 0.3-13 ms before it, never after;
// bench/vip/nftfence.sh), so a paused or killed owner goes silent on time
// while the address itself may stay on the interface until its lifetime.
//
// The element's timeout counts from when the kernel takes the call, so a
// call issued before a pause and taken after it (the process was stopped
// between reading its clock and the syscall) would open the fence again
// for a deadline long gone. The "until" rule closes that window: hold
// writes the same end as an absolute time (nft's `meta time`, the
// kernel's CLOCK_REALTIME, compared per packet), which a late call cannot
// move past the deadline. Each covers the other's weak point: the
// element does not care about wall-clock steps, the rule does not care
// about pauses.
//
// The rules are what nft(8) makes of the same matches, as `nft
// --debug=netlink` shows them (the IPv4 ones are bench/vip/nftfence.sh's):
// a load of the address checked (see nftFamilies), a compare with the
// address, an inverted lookup in "held", drop; the same load and compare,
// jump to "until"; there `meta time >= END drop`, which nft writes as a
// meta load of time, a byteorder hton of its 8 bytes and a compare. The
// tests read them back with nft(8).
type nftFence struct {
	c      *nftables.Conn
	table  string
	v4, v6 [][]byte // the addresses, as set keys
	tabs   []nftTable
}

// nftTable is one family's table as last installed.
type nftTable struct {
	tab   *nftables.Table
	set   *nftables.Set
	until *nftables.Chain
	keys  []nftables.SetElement
}

// nftHook is one base chain: where it hooks, and the expressions that leave
// the address to check in register 1 (a packet they do not match goes on).
type nftHook struct {
	name string
	hook nftables.ChainHook
	prio nftables.ChainPriority
	load []expr.Any
}

func payload(base expr.PayloadBase, offset, n uint32) *expr.Payload {
	return &expr.Payload{DestRegister: 1, Base: base, Offset: offset, Len: n}
}

// nftFamilies are the tables for IPv4 (v6 false) or IPv6 addresses, with
// the rules nft(8) writes for the same matches.
func nftFamilies(v6 bool) []struct {
	family  nftables.TableFamily
	keyType nftables.SetDatatype
	chains  []nftHook
} {
	type fam = struct {
		family  nftables.TableFamily
		keyType nftables.SetDatatype
		chains  []nftHook
	}
	nh, th := expr.PayloadBaseNetworkHeader, expr.PayloadBaseTransportHeader
	if !v6 {
		return []fam{
			// arp sender protocol address: output, no answer from this host
			{nftables.TableFamilyARP, nftables.TypeIPAddr, []nftHook{{"fence", nfARPOut, 0, []expr.Any{payload(nh, 14, 4)}}}},
			// IPv4 destination
			{nftables.TableFamilyIPv4, nftables.TypeIPAddr, []nftHook{{"fence", *nftables.ChainHookPrerouting, -300, []expr.Any{payload(nh, 16, 4)}}}},
		}
	}
	return []fam{{nftables.TableFamilyIPv6, nftables.TypeIP6Addr, []nftHook{
		// IPv6 destination
		{"fence", *nftables.ChainHookPrerouting, -300, []expr.Any{payload(nh, 24, 16)}},
		// `icmpv6 type nd-neighbor-advert @th,64,128`: the target of a
		// neighbour advertisement this host sends
		{"na", *nftables.ChainHookOutput, 0, []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
			payload(th, 0, 1),
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{136}}, // ND_NEIGHBOR_ADVERT
			payload(th, 8, 16),
		}},
	}}}
}

// nftMetaTimeNS is NFT_META_TIME_NS (linux/netfilter/nf_tables.h, kernel
// 5.4+): nanoseconds since the epoch, in host byte order.
const nftMetaTimeNS = expr.MetaKey(30)

// nfARPOut is the arp family's output hook (NF_ARP_OUT); the inet hooks'
// numbering does not apply to it.
const nfARPOut = 1

// nftMu serialises install: the library numbers new sets from a package
// counter it does not guard across connections.
var nftMu sync.Mutex

func openNftFence(ns netns.NsHandle, table string, ps []netip.Prefix) (*nftFence, error) {
	opts := []nftables.ConnOption{nftables.AsLasting()}
	if ns.IsOpen() {
		opts = append(opts, nftables.WithNetNSFd(int(ns)))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("vip: nftables: %w", err)
	}
	f := &nftFence{c: c, table: table}
	for _, p := range ps {
		if a := p.Addr(); a.Is4() {
			f.v4 = append(f.v4, a.AsSlice())
		} else {
			f.v6 = append(f.v6, a.AsSlice())
		}
	}
	if err := f.install(); err != nil {
		c.CloseLasting()
		return nil, fmt.Errorf("vip: %w", err)
	}
	return f, nil
}

// install makes the tables, fresh: nothing answers until hold. Add (a
// no-op when present) then delete then add, in one transaction: a table
// left by a process that died goes, with whatever it held. At open, and
// again when the tables were deleted under the process (hold).
func (f *nftFence) install() error {
	nftMu.Lock()
	defer nftMu.Unlock()
	c := f.c
	f.tabs = nil
	for _, v6 := range []bool{false, true} {
		addrs := f.v4
		if v6 {
			addrs = f.v6
		}
		if len(addrs) == 0 {
			continue
		}
		var keys []nftables.SetElement
		for _, a := range addrs {
			keys = append(keys, nftables.SetElement{Key: a})
		}
		for _, fam := range nftFamilies(v6) {
			tab := &nftables.Table{Name: f.table, Family: fam.family}
			c.AddTable(tab)
			c.DelTable(tab)
			c.AddTable(tab)
			set := &nftables.Set{Table: tab, Name: "held", KeyType: fam.keyType, HasTimeout: true}
			if err := c.AddSet(set, nil); err != nil {
				return fmt.Errorf("nftables set: %w", err)
			}
			until := c.AddChain(&nftables.Chain{Name: "until", Table: tab})
			c.AddRule(untilRule(until, time.Time{}))
			accept := nftables.ChainPolicyAccept
			for _, h := range fam.chains {
				ch := c.AddChain(&nftables.Chain{Name: h.name, Table: tab, Type: nftables.ChainTypeFilter,
					Hooknum: &h.hook, Priority: &h.prio, Policy: &accept})
				for _, k := range keys {
					match := append(slices.Clip(h.load), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: k.Key})
					c.AddRule(&nftables.Rule{Table: tab, Chain: ch, Exprs: append(slices.Clip(match),
						&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: true},
						&expr.Verdict{Kind: expr.VerdictDrop})})
					c.AddRule(&nftables.Rule{Table: tab, Chain: ch, Exprs: append(slices.Clip(match),
						&expr.Verdict{Kind: expr.VerdictJump, Chain: until.Name})})
				}
			}
			f.tabs = append(f.tabs, nftTable{tab: tab, set: set, until: until, keys: keys})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables tables %s (needs CAP_NET_ADMIN and nf_tables): %w", f.table, err)
	}
	return nil
}

// untilRule drops everything from end on (wall clock, to the nanosecond);
// from the start when end is zero.
func untilRule(ch *nftables.Chain, end time.Time) *nftables.Rule {
	drop := &expr.Verdict{Kind: expr.VerdictDrop}
	if end.IsZero() {
		return &nftables.Rule{Table: ch.Table, Chain: ch, Exprs: []expr.Any{drop}}
	}
	be := binary.BigEndian.AppendUint64(nil, uint64(end.UnixNano()))
	return &nftables.Rule{Table: ch.Table, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: nftMetaTimeNS, Register: 1},
		// The compare is bytewise: big-endian orders like the number.
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 8, Size: 8},
		&expr.Cmp{Op: expr.CmpOpGte, Register: 1, Data: be},
		drop,
	}}
}

// hold makes the addresses answer for d from now (the kernel's now), and
// never from end on (the wall clock). One transaction per call: add (a
// no-op for a present element), delete, add with the new timeout, and the
// "until" rule replaced, so lookups see the old state or the new one,
// never none.
//
// Tables deleted under the process (`nft flush ruleset`, which a firewall
// reload such as Debian's nftables.service runs first) make the call fail
// with ENOENT: hold makes them again and holds in them. Until then the
// address answers unfenced, as with no fence; that lasts at most one
// keep-alive, the next refresh.
func (f *nftFence) hold(d time.Duration, end time.Time) error {
	if d < time.Millisecond {
		return errors.New("nftables fence: timeout below 1ms")
	}
	if end.IsZero() {
		return errors.New("nftables fence: no end time")
	}
	d = d.Truncate(time.Millisecond) // the kernel's unit; never round up
	err := f.apply(d, end)
	if errors.Is(err, unix.ENOENT) {
		if err = f.install(); err != nil {
			return fmt.Errorf("nftables fence: tables gone, making them again: %w", err)
		}
		err = f.apply(d, end)
	}
	return err
}

// release silences the addresses now. Tables that are gone (ENOENT)
// silence nothing, but the caller has deleted the addresses first, so
// nothing answers; the next hold makes them again.
func (f *nftFence) release() error {
	if err := f.apply(0, time.Time{}); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// apply sets the elements (timeout d; absent when d is 0) and the "until"
// rule (end; drop everything when zero) of every table in one transaction.
func (f *nftFence) apply(d time.Duration, end time.Time) error {
	for _, t := range f.tabs {
		if err := f.batch(t, d); err != nil {
			return err
		}
		f.c.FlushChain(t.until)
		f.c.AddRule(untilRule(t.until, end))
	}
	if err := f.c.Flush(); err != nil {
		return fmt.Errorf("nftables fence: %w", err)
	}
	return nil
}

// batch queues the element changes of one table's set: present afterwards
// with timeout d, or absent when d is 0.
func (f *nftFence) batch(t nftTable, d time.Duration) error {
	tmp := make([]nftables.SetElement, len(t.keys))
	for i, k := range t.keys {
		tmp[i] = nftables.SetElement{Key: k.Key, Timeout: time.Millisecond}
	}
	if err := f.c.SetAddElements(t.set, tmp); err != nil {
		return err
	}
	if err := f.c.SetDeleteElements(t.set, t.keys); err != nil {
		return err
	}
	if d == 0 {
		return nil
	}
	els := make([]nftables.SetElement, len(t.keys))
	for i, k := range t.keys {
		els[i] = nftables.SetElement{Key: k.Key, Timeout: d}
	}
	return f.c.SetAddElements(t.set, els)
}

// close deletes the tables: the addresses are gone by then (Guard.Close).
func (f *nftFence) close() error {
	for _, t := range f.tabs {
		f.c.DelTable(t.tab)
	}
	err := f.c.Flush()
	if cerr := f.c.CloseLasting(); err == nil {
		err = cerr
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("nftables fence: %w", err)
	}
	return nil
}
