package hosts

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hapair/hapair/ctl"
)

// Where the controller keeps the deployment, as an operator would on a
// workstation: the playbooks, a local build, the certificates, an inventory.
const (
	CtlHome      = "/root/hapair"
	CtlAnsible   = CtlHome + "/ansible"
	CtlDist      = CtlHome + "/dist"
	CtlCerts     = CtlHome + "/certs"
	CtlInventory = CtlHome + "/inventory"
)

// Path is p (absolute, as on the host) under the host's root here.
func (h *Host) Path(p string) string { return filepath.Join(h.Root(), p) }

// WriteFile writes a file on the host (parents created).
func (h *Host) WriteFile(p string, data []byte, mode os.FileMode) error {
	full := h.Path(p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		return err
	}
	return os.WriteFile(full, data, mode)
}

// SetUpSSH makes the controller's key (ssh-keygen in its root, before boot)
// and authorises it for root on every other host.
func (c *Cluster) SetUpSSH(ctx context.Context, controller string) error {
	ctlHost := c.Hosts[controller]
	key := "/root/.ssh/id_ed25519"
	if err := os.MkdirAll(ctlHost.Path("/root/.ssh"), 0o700); err != nil {
		return err
	}
	if err := logged(ctx, c.log, "chroot", ctlHost.Root(), "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hapair-controller", "-f", key); err != nil {
		return err
	}
	pub, err := os.ReadFile(ctlHost.Path(key + ".pub"))
	if err != nil {
		return err
	}
	for name, h := range c.Hosts {
		if name == controller {
			continue
		}
		if err := os.MkdirAll(h.Path("/root/.ssh"), 0o700); err != nil {
			return err
		}
		if err := h.WriteFile("/root/.ssh/authorized_keys", pub, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// CopyTree copies the directory src (on this machine) to dst on the host,
// skipping names in skip (e.g. ".cache").
func (h *Host) CopyTree(src, dst string, skip ...string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		for _, s := range skip {
			if d.Name() == s {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		rel, _ := filepath.Rel(src, p)
		target := h.Path(filepath.Join(dst, rel))
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, info.Mode().Perm())
	})
}

// MakeCerts writes the CA and one certificate per host into the
// controller's CtlCerts, the way `hapairctl certs` does.
func (c *Cluster) MakeCerts(controller string) error {
	var hs []ctl.CertHost
	for name, h := range c.Hosts {
		hs = append(hs, ctl.CertHost{Name: name, SANs: []string{name, h.Addr, "127.0.0.1", "localhost"}})
	}
	_, err := ctl.Certs(c.Hosts[controller].Path(CtlCerts), hs, 7*24*time.Hour, false)
	return err
}

// Play runs ansible-playbook on the controller against inventory (a
// directory or file on the controller), from CtlAnsible, and returns its
// output (also copied to log as it comes).
func (c *Cluster) Play(ctx context.Context, controller, inventory string, log io.Writer, args ...string) (string, error) {
	h := c.Hosts[controller]
	env := []string{
		"ANSIBLE_CONFIG=" + CtlAnsible + "/ansible.cfg",
		"ANSIBLE_HOST_KEY_CHECKING=False",
		"ANSIBLE_NOCOLOR=1",
		"ANSIBLE_FORCE_COLOR=0",
		"PYTHONUNBUFFERED=1",
	}
	cmd, err := h.Command(ctx, env, append([]string{"sh", "-c", `cd "$0" && exec ansible-playbook "$@"`, CtlAnsible, "-i", inventory}, args...)...)
	if err != nil {
		return "", err
	}
	var out strings.Builder
	w := io.MultiWriter(&out, log)
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("ansible-playbook %s: %w", strings.Join(args, " "), err)
	}
	return out.String(), nil
}
