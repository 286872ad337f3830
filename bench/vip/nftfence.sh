#!/usr/bin/env bash
# bench/vip/nftfence.sh — how precisely an nftables set element's timeout
# fences a VIP: the measurement behind vip.FenceSlack (README, VIP section,
# fence: nftables; vip/nft_linux.go makes the same rules). Namespace hA holds 10.99.0.100; its ARP
# output and its prerouting drop the VIP unless it is in set "held",
# whose element is added with a timeout. hB pings the VIP every 10 ms
# (ping may be slower) and prints when the last reply came relative to
# the add, then checks that ARP goes unanswered after the expiry and is
# answered while the element is present.
#   bench/vip/nftfence.sh          (root; TO=timeout in ms, 1000; N=runs, 10)
# Packages: nftables, arping, iputils-ping.
set -euo pipefail
VIP=10.99.0.100
cleanup() { ip netns del hA 2>/dev/null || true; ip netns del hB 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add hA; ip netns add hB
ip link add vA type veth peer name vB
ip link set vA netns hA; ip link set vB netns hB
ip -n hA addr add 10.99.0.1/24 dev vA; ip -n hA addr add $VIP/24 dev vA
ip -n hB addr add 10.99.0.2/24 dev vB
ip -n hA link set vA up; ip -n hB link set vB up; ip -n hA link set lo up; ip -n hB link set lo up
ip netns exec hA nft -f - <<NFT
table arp hapair_vip {
  set held { type ipv4_addr; flags timeout; }
  chain out { type filter hook output priority 0; arp saddr ip $VIP arp saddr ip != @held drop; }
}
table ip hapair_vip {
  set held { type ipv4_addr; flags timeout; }
  chain pre { type filter hook prerouting priority -300; ip daddr $VIP ip daddr != @held drop; }
}
NFT
TO=${TO:-1000}
for i in $(seq 1 ${N:-10}); do
  ip -n hB neigh flush dev vB
  ip netns exec hA nft add element arp hapair_vip held "{ $VIP timeout ${TO}ms }"
  t0=$(date +%s.%N)
  ip netns exec hA nft add element ip hapair_vip held "{ $VIP timeout ${TO}ms }"
  ip netns exec hB ping -D -n -i 0.01 -W 0.05 -w $(( TO/1000 + 2 )) $VIP > /tmp/spike/ping.$i 2>&1 || true
  last=$(grep 'bytes from' /tmp/spike/ping.$i | tail -1 | sed -E 's/^\[([0-9.]+)\].*/\1/')
  n=$(grep -c 'bytes from' /tmp/spike/ping.$i || true)
  echo "run $i: replies $n, last reply $(python3 -c "print('%.1f ms' % ((float('$last')-float('$t0'))*1000))") after the add (timeout ${TO} ms)"
  # ARP: after expiry, a fresh neighbour lookup from hB must fail
  ip -n hB neigh flush dev vB
  echo "  ARP after expiry: $(ip netns exec hB arping -c 3 -W 0.1 -i vB $VIP 2>&1 | grep -o '[0-9]* packets received' || true)"
  ip netns exec hA nft add element arp hapair_vip held "{ $VIP timeout 1000ms }"
  echo "  ARP while held (control): $(ip netns exec hB arping -c 3 -W 0.1 -i vB $VIP 2>&1 | grep -o '[0-9]* packets received' || true)"
  sleep 1.2
done
