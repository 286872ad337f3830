package hosts

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Subnet is the hosts' private /24. It exists only on veths inside the
// namespaces a run creates (a bridge namespace of its own), never in the
// machine's root namespace; it differs from the lab's 10.213.0 so both can
// run side by side.
const Subnet = "10.214.0"

// nsPrefix starts every namespace name a run creates: <prefix><tag>-<host>.
const nsPrefix = "hpd"

const bridgeHost = "sw"

func sh(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// network is one run's namespaces.
type network struct{ tag string }

func (n network) ns(host string) string { return nsPrefix + n.tag + "-" + host }

func (n network) ip(host string, args ...string) error {
	return sh("ip", append([]string{"-n", n.ns(host)}, args...)...)
}

// create builds the bridge namespace and one namespace per host with an
// eth0 whose veth peer is on the bridge. The pairs are made inside the
// bridge namespace, so the root namespace never sees them.
func (n network) create(hosts map[string]string) error {
	if err := sh("ip", "netns", "add", n.ns(bridgeHost)); err != nil {
		return err
	}
	for _, s := range [][]string{{"link", "set", "lo", "up"}, {"link", "add", "br0", "type", "bridge"}, {"link", "set", "br0", "up"}} {
		if err := n.ip(bridgeHost, s...); err != nil {
			return err
		}
	}
	for h, addr := range hosts {
		if err := sh("ip", "netns", "add", n.ns(h)); err != nil {
			return err
		}
		port := "p-" + h
		if err := n.ip(bridgeHost, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", n.ns(h)); err != nil {
			return err
		}
		for _, s := range [][]string{{"link", "set", port, "master", "br0"}, {"link", "set", port, "up"}} {
			if err := n.ip(bridgeHost, s...); err != nil {
				return err
			}
		}
		for _, s := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", addr + "/24", "dev", "eth0"}, {"link", "set", "eth0", "up"}} {
			if err := n.ip(h, s...); err != nil {
				return err
			}
		}
	}
	return nil
}

// destroy deletes every namespace of the run that exists.
func (n network) destroy() error {
	ents, _ := os.ReadDir("/run/netns")
	var first error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), nsPrefix+n.tag+"-") {
			if err := sh("ip", "netns", "del", e.Name()); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}
