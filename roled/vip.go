package roled

import (
	"time"

	"github.com/hapair/hapair/vip"
)

// The VIP follows the role (DESIGN.md §10): added right after 200 is served,
// removed right after 503 is served and before the key is released, and
// never held past the local deadline. Its fence is vipUntil, the same test
// as activeNow, so a resumed process drops the address as it answers 503.

func (c Config) validateVIP() error {
	if !c.VIP.Enabled() {
		return c.VIP.Validate("vip")
	}
	if err := c.VIP.Validate("vip"); err != nil {
		return err
	}
	return vip.CheckTiming("lease-ttl", c.VIP.Fence, c.LeaseTTL, c.SafetyMargin, c.KeepAliveInterval)
}

// newVIP opens the VIP's interface when one is configured.
func (d *Daemon) newVIP() error {
	if !d.cfg.VIP.Enabled() {
		return nil
	}
	g, err := vip.New(d.cfg.VIP, sub, d.lg.Named("vip"), d.now, d.vipUntil)
	if err != nil {
		return err
	}
	d.vip = g
	d.m.reg.MustRegister(g)
	return nil
}

// vipUntil is the VIP's fence: the local deadline while the published role
// is ACTIVE on the lease that still holds.
func (d *Daemon) vipUntil() (time.Duration, bool) {
	s := d.snap.Load()
	if s.role != RoleActive {
		return 0, false
	}
	l := d.lease.Load()
	if l.id == 0 || l.id != s.leaseID {
		return 0, false
	}
	return l.deadline, true
}

// vipSync applies the fence now (after 200 or 503 was published).
func (d *Daemon) vipSync() {
	if d.vip != nil {
		d.vip.Sync()
	}
}

// vipKick refreshes the kernel lifetime after a new deadline or a lost lease.
func (d *Daemon) vipKick() {
	if d.vip != nil {
		d.vip.Kick()
	}
}

func (d *Daemon) vipStatus() *vip.Status {
	if d.vip == nil {
		return nil
	}
	st := d.vip.Status()
	return &st
}
