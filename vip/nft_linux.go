package vip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// nftFence is the millisecond fence (fence: nftables). Two tables, one in
// the arp family and one in the ip family, both named hapair_<part>_vip,
// hold a set "held" of addresses whose elements time out, and a chain
// "until" whose one rule drops from an absolute wall-clock time on, and
// drop, for every configured address that is not in "held" or once that
// time has come:
//   - the host's ARP output with that sender address (no ARP answer, no
//     gratuitous ARP), in an output chain of the arp family;
//   - every packet sent to it, in a prerouting chain at priority -300
//     (before conntrack), so a client whose neighbour entry is still
//     fresh reaches nothing either.
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
// These are the rules bench/vip/nftfence.sh makes with nft(8), as
// `nft --debug=netlink` shows them: a payload load of the sender (arp,
// network header + 14) or destination (ip, network header + 16) address,
// a compare with the address, an inverted lookup in "held", drop; the
// same load and compare, jump to "until"; there `meta time >= END drop`,
// which nft writes as a meta load of time, a byteorder hton of its 8
// bytes and a compare.
type nftFence struct {
	c      *nftables.Conn
	table  string
	tabs   []*nftables.Table
	sets   []*nftables.Set
	untils []*nftables.Chain
	keys   []nftables.SetElement
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
		a := p.Addr().As4()
		f.keys = append(f.keys, nftables.SetElement{Key: a[:]})
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
	f.tabs, f.sets, f.untils = nil, nil, nil
	arpHook, preHook := nftables.ChainHook(nfARPOut), *nftables.ChainHookPrerouting
	arpPrio, prePrio := nftables.ChainPriority(0), nftables.ChainPriority(-300)
	for _, fam := range []struct {
		family nftables.TableFamily
		hook   *nftables.ChainHook
		prio   *nftables.ChainPriority
		offset uint32 // of the address checked, from the network header
	}{
		{nftables.TableFamilyARP, &arpHook, &arpPrio, 14},  // ARP sender protocol address
		{nftables.TableFamilyIPv4, &preHook, &prePrio, 16}, // IPv4 destination
	} {
		tab := &nftables.Table{Name: f.table, Family: fam.family}
		c.AddTable(tab)
		c.DelTable(tab)
		c.AddTable(tab)
		set := &nftables.Set{Table: tab, Name: "held", KeyType: nftables.TypeIPAddr, HasTimeout: true}
		if err := c.AddSet(set, nil); err != nil {
			return fmt.Errorf("nftables set: %w", err)
		}
		accept := nftables.ChainPolicyAccept
		until := c.AddChain(&nftables.Chain{Name: "until", Table: tab})
		c.AddRule(untilRule(until, time.Time{}))
		ch := c.AddChain(&nftables.Chain{Name: "fence", Table: tab, Type: nftables.ChainTypeFilter,
			Hooknum: fam.hook, Priority: fam.prio, Policy: &accept})
		for _, k := range f.keys {
			addr := func(e ...expr.Any) []expr.Any {
				return append([]expr.Any{
					&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: fam.offset, Len: 4},
					&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: k.Key},
				}, e...)
			}
			c.AddRule(&nftables.Rule{Table: tab, Chain: ch, Exprs: addr(
				&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: true},
				&expr.Verdict{Kind: expr.VerdictDrop})})
			c.AddRule(&nftables.Rule{Table: tab, Chain: ch, Exprs: addr(
				&expr.Verdict{Kind: expr.VerdictJump, Chain: until.Name})})
		}
		f.tabs, f.sets, f.untils = append(f.tabs, tab), append(f.sets, set), append(f.untils, until)
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
// rule (end; drop everything when zero) of both tables in one transaction.
func (f *nftFence) apply(d time.Duration, end time.Time) error {
	for i, s := range f.sets {
		if err := f.batch(s, d); err != nil {
			return err
		}
		f.c.FlushChain(f.untils[i])
		f.c.AddRule(untilRule(f.untils[i], end))
	}
	if err := f.c.Flush(); err != nil {
		return fmt.Errorf("nftables fence: %w", err)
	}
	return nil
}

// batch queues the element changes of one set: present afterwards with
// timeout d, or absent when d is 0.
func (f *nftFence) batch(s *nftables.Set, d time.Duration) error {
	tmp := make([]nftables.SetElement, len(f.keys))
	for i, k := range f.keys {
		tmp[i] = nftables.SetElement{Key: k.Key, Timeout: time.Millisecond}
	}
	if err := f.c.SetAddElements(s, tmp); err != nil {
		return err
	}
	if err := f.c.SetDeleteElements(s, f.keys); err != nil {
		return err
	}
	if d == 0 {
		return nil
	}
	els := make([]nftables.SetElement, len(f.keys))
	for i, k := range f.keys {
		els[i] = nftables.SetElement{Key: k.Key, Timeout: d}
	}
	return f.c.SetAddElements(s, els)
}

// close deletes the tables: the addresses are gone by then (Guard.Close).
func (f *nftFence) close() error {
	for _, t := range f.tabs {
		f.c.DelTable(t)
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
