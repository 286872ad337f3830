package lab

import (
	"strconv"
)

// DropRandom makes host drop a share p of its incoming packets (iptables
// statistic, random mode); Heal removes it.
func (n Net) DropRandom(host string, p float64) error {
	// Not on lo: the loss is the network's. Dropping loopback packets made
	// roled's check of its own Patroni (127.0.0.1:8008) fail on a lost SYN
	// (1 s retransmission), a fault no real network has.
	return run("ip", "netns", "exec", n.NS(host), "iptables", "-w", "-A", "INPUT", "!", "-i", "lo", "-m", "statistic",
		"--mode", "random", "--probability", strconv.FormatFloat(p, 'f', 4, 64), "-j", "DROP")
}
