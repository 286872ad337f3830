package vip

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Ethernet types.
const (
	etherTypeARP  = 0x0806
	etherTypeIPv6 = 0x86dd
)

// gratuitousARP is the Ethernet frame announcing that ip is at mac: a
// broadcast ARP request whose sender and target address are both ip (RFC
// 5227 §3 "ARP Announcement"; what keepalived and arping -U send).
func gratuitousARP(mac net.HardwareAddr, ip netip.Addr) []byte {
	b := make([]byte, 14+28)
	copy(b[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(b[6:12], mac)
	binary.BigEndian.PutUint16(b[12:14], etherTypeARP)
	a := b[14:]
	binary.BigEndian.PutUint16(a[0:2], 1)      // Ethernet
	binary.BigEndian.PutUint16(a[2:4], 0x0800) // IPv4
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:8], 1) // request
	ip4 := ip.As4()
	copy(a[8:14], mac)
	copy(a[14:18], ip4[:])
	// target hardware address stays zero
	copy(a[24:28], ip4[:])
	return b
}

// unsolicitedNA is the Ethernet frame of an unsolicited neighbour
// advertisement for ip at mac to all nodes (RFC 4861 §7.2.6): override set,
// solicited clear, the target link-layer address option, hop limit 255,
// sent from ip itself.
func unsolicitedNA(mac net.HardwareAddr, ip netip.Addr) []byte {
	const icmpLen = 24 + 8
	b := make([]byte, 14+40+icmpLen)
	copy(b[0:6], []byte{0x33, 0x33, 0, 0, 0, 1})
	copy(b[6:12], mac)
	binary.BigEndian.PutUint16(b[12:14], etherTypeIPv6)
	h := b[14:54]
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:6], icmpLen)
	h[6], h[7] = 58, 255 // ICMPv6, hop limit
	src, dst := ip.As16(), netip.IPv6LinkLocalAllNodes().As16()
	copy(h[8:24], src[:])
	copy(h[24:40], dst[:])
	m := b[54:]
	m[0] = 136  // neighbour advertisement
	m[4] = 0x20 // override
	copy(m[8:24], src[:])
	m[24], m[25] = 2, 1 // target link-layer address, 8 bytes
	copy(m[26:32], mac)
	binary.BigEndian.PutUint16(m[2:4], icmpv6Checksum(src, dst, m))
	return b
}

// icmpv6Checksum is the Internet checksum over the IPv6 pseudo-header and msg.
func icmpv6Checksum(src, dst [16]byte, msg []byte) uint16 {
	var sum uint32
	add := func(p []byte) {
		for i := 0; i+1 < len(p); i += 2 {
			sum += uint32(p[i])<<8 | uint32(p[i+1])
		}
		if len(p)%2 == 1 {
			sum += uint32(p[len(p)-1]) << 8
		}
	}
	add(src[:])
	add(dst[:])
	var ph [8]byte
	binary.BigEndian.PutUint32(ph[0:4], uint32(len(msg)))
	ph[7] = 58
	add(ph[:])
	add(msg)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
