package lab

import (
	"fmt"
	"os"
	"os/exec"
)

// VIPPeerKeepalived is Options.VIPPeer's one value: keepalived holds the VIP
// instead of roled (issue 20's peer, set up as operators do it).
const VIPPeerKeepalived = "keepalived"

// ProcKeepalived is keepalived's name in pid and log files.
const ProcKeepalived = "keepalived"

// keepalivedConfig is the VRRP pair the way operators put keepalived beside
// a Patroni-driven application: both nodes start as BACKUP, nodea with the
// higher priority (preempting), advert_int 1, and a vrrp_script that asks
// the local roled whether it is ACTIVE (`hapairctl check`): a failing
// script puts the instance in FAULT, which drops the VIP. interval 1,
// fall 1, rise 1 is the fastest the script can be asked (operators often
// use fall 2 / rise 2): the peer's best figures, not its typical ones.
func keepalivedConfig(host, ctlBin string) string {
	prio := 100
	if host == NodeA {
		prio = 150
	}
	return keepalivedGlobals(host) + fmt.Sprintf(`vrrp_script chk_hapair {
  script "%[1]s check -q --url http://%[2]s:%[3]d --timeout 500ms"
  interval 1
  timeout 1
  fall 1
  rise 1
}
vrrp_instance VI_1 {
  state BACKUP
  interface eth0
  virtual_router_id 51
  priority %[4]d
  advert_int 1
  virtual_ipaddress {
    %[5]s/24 dev eth0
  }
  track_script {
    chk_hapair
  }
}
`, ctlBin, IP(host), RoledPort, prio, VIPAddr)
}

// keepalivedLBConfig is the VRRP pair the way operators put keepalived in
// front of two balancers: both BACKUP with nopreempt (a balancer that comes
// back does not take the address back), lb with the higher priority,
// advert_int 1, a vrrp_script that asks the local balancer's admin
// /healthz with a 500 ms limit (interval 1, fall 1, rise 1, as for the
// nodes), and its own virtual_router_id: the nodes' pair shares the LAN.
func keepalivedLBConfig(host string) string {
	prio := 100
	if host == LB {
		prio = 150
	}
	return keepalivedGlobals(host) + fmt.Sprintf(`vrrp_script chk_lb {
  script "/usr/bin/curl -sf -m 0.5 -o /dev/null http://%[1]s:%[2]d/healthz"
  interval 1
  timeout 1
  fall 1
  rise 1
}
vrrp_instance VI_LB {
  state BACKUP
  nopreempt
  interface eth0
  virtual_router_id 52
  priority %[3]d
  advert_int 1
  virtual_ipaddress {
    %[4]s/24 dev eth0
  }
  track_script {
    chk_lb
  }
}
`, IP(host), LBAdminPort, prio, LBVIPAddr)
}

// startKeepalived runs keepalived's VRRP process on a data node (the
// nodes' VIP) or on a balancer of the pair (LBVIPAddr) when the lab was
// built with VIPPeer keepalived (no-op otherwise). Its own pid files: the
// hosts share the mount namespace.
func (l *Lab) startKeepalived(host string) error {
	if l.Opt.VIPPeer != VIPPeerKeepalived {
		return nil
	}
	bin, err := exec.LookPath("keepalived")
	if err != nil {
		return fmt.Errorf("vip peer keepalived: %w (Debian package keepalived)", err)
	}
	ctlBin := l.Bin(BinCtl)
	if ctlBin == "" {
		return fmt.Errorf("vip peer keepalived: %s not built (its vrrp_script)", BinCtl)
	}
	conf := keepalivedConfig(host, ctlBin)
	if host == LB || host == LB2 {
		conf = keepalivedLBConfig(host)
	}
	// A rebooted host starts with an empty /run: no pid file of a killed
	// keepalived (it refused to start, "daemon is already running").
	for _, f := range []string{"keepalived.pid", "keepalived-vrrp.pid"} {
		_ = os.Remove(l.path(host, f))
	}
	path := l.path(host, "keepalived.conf")
	if err := os.MkdirAll(l.path(host), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return err
	}
	_, err = l.Spawn(host, ProcKeepalived, baseEnv(), bin, "-n", "-l", "-D", "-P", "-f", path,
		"-p", l.path(host, "keepalived.pid"), "-r", l.path(host, "keepalived-vrrp.pid"))
	return err
}

// keepalivedGlobals is both pairs' global_defs: scripts run as root, and
// keepalived refuses scripts that others could change.
func keepalivedGlobals(host string) string {
	return fmt.Sprintf("global_defs {\n  router_id %s\n  script_user root\n  enable_script_security\n}\n", host)
}
