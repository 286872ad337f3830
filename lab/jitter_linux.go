package lab

import (
	"strconv"
)

// DropRandom makes host drop a share p of its incoming packets (iptables
// statistic, random mode); Heal removes it.
func (n Net) DropRandom(host string, p float64) error {
	return run("ip", "netns", "exec", n.NS(host), "iptables", "-w", "-A", "INPUT", "-m", "statistic",
		"--mode", "random", "--probability", strconv.FormatFloat(p, 'f', 4, 64), "-j", "DROP")
}
