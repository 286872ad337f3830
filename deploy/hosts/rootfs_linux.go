package hosts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// Image describes the cached root filesystem every host boots from.
type Image struct {
	// Suite and Mirror are debootstrap's (bookworm, the Debian archive).
	Suite, Mirror string
	// Boot are the packages debootstrap installs itself (what a host needs
	// to boot and be reached: systemd, dbus, sshd, python3 for Ansible).
	Boot []string
	// Packages are installed next with apt-get inside the new root: what
	// the roles would install (so the hosts need no network) and the
	// controller's Ansible.
	Packages []string
}

// recipe is bumped when the build steps change, so an old cache is not
// reused under the same package list.
const recipe = "2"

// DefaultImage is Debian 12 with what the hapair roles and the controller
// need.
func DefaultImage() Image {
	return Image{
		Suite:  "bookworm",
		Mirror: "http://deb.debian.org/debian",
		Boot:   []string{"systemd", "systemd-sysv", "dbus", "iproute2", "openssh-server", "python3"},
		Packages: []string{
			// Ansible's modules on every host: sudo for become_user,
			// python3-apt for the apt module.
			"sudo", "python3-apt", "procps",
			// hapair_patroni's hapair_patroni_packages.
			"postgresql-15", "patroni", "python3-etcd",
			// The controller.
			"ansible-core", "openssh-client",
		},
	}
}

// Key is the cache key: a hash of everything that shapes the image.
func (im Image) Key() string {
	boot, pk := slices.Clone(im.Boot), slices.Clone(im.Packages)
	slices.Sort(boot)
	slices.Sort(pk)
	h := sha256.Sum256([]byte(strings.Join([]string{recipe, im.Suite, im.Mirror, strings.Join(boot, ","), strings.Join(pk, ",")}, "\n")))
	return hex.EncodeToString(h[:6])
}

// CacheDir is where the image lives.
func (im Image) CacheDir() string {
	return filepath.Join("/var/tmp", "hapair-rootfs-"+im.Suite+"-"+im.Key())
}

// Ensure returns the cached image, building it first when it is missing.
// Builds are serialised by a lock file, and a build lands with one rename,
// so a half-built image is never used (a killed build leaves a .tmp-*
// directory, removed by the next build).
func (im Image) Ensure(ctx context.Context, log io.Writer) (string, error) {
	dir := im.CacheDir()
	if done(dir) {
		return dir, nil
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing releases it too
	if done(dir) {
		return dir, nil
	}
	stale, _ := filepath.Glob(dir + ".tmp-*")
	for _, s := range stale {
		if err := removeBuild(s); err != nil {
			return "", err
		}
	}
	tmp := fmt.Sprintf("%s.tmp-%d", dir, os.Getpid())
	if err := im.build(ctx, tmp, log); err != nil {
		_ = removeBuild(tmp)
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tmp, ".hapair-image"), []byte(im.Key()+"\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// removeBuild deletes a build directory. A debootstrap that was killed
// leaves its /proc (and more) mounted inside the new root: those are
// unmounted first (seen here: a killed build kept tmp/proc mounted, and a
// plain RemoveAll walked into it).
func removeBuild(dir string) error {
	ms := mounts()
	for i := len(ms) - 1; i >= 0; i-- {
		if strings.HasPrefix(ms[i], dir+"/") {
			if err := syscall.Unmount(ms[i], syscall.MNT_DETACH); err != nil {
				return fmt.Errorf("umount %s: %w", ms[i], err)
			}
		}
	}
	return os.RemoveAll(dir)
}

func done(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, ".hapair-image"))
	return err == nil
}

func (im Image) build(ctx context.Context, dir string, log io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := logged(ctx, log, "debootstrap", "--variant=minbase", "--include="+strings.Join(im.Boot, ","),
		im.Suite, dir, im.Mirror); err != nil {
		return err
	}
	// Debian's postgresql-common would create a "main" cluster on 5432;
	// Patroni owns PostgreSQL on these hosts (the role writes the same
	// setting before it installs the package).
	cc := filepath.Join(dir, "etc/postgresql-common/createcluster.d")
	if err := os.MkdirAll(cc, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cc, "hapair.conf"), []byte("create_main_cluster = false\n"), 0o644); err != nil {
		return err
	}
	// No service starts inside the build root.
	prc := filepath.Join(dir, "usr/sbin/policy-rc.d")
	if err := os.WriteFile(prc, []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		return err
	}
	// nspawn wants its propagation directory on a tmpfs of its own, or it
	// complains at exit ("Attempted to remove disk file system under
	// /run/systemd/nspawn/propagate/...", seen on a fresh machine).
	if err := ensureNspawnRun(); err != nil {
		return err
	}
	// systemd-nspawn without -b runs apt-get with /proc, /sys and /dev set
	// up and the machine's network, and mounts nothing on this side.
	args := []string{"--register=no", "--keep-unit", "-q", "-D", dir, "--setenv=DEBIAN_FRONTEND=noninteractive",
		"/bin/sh", "-c", "apt-get update -qq && apt-get install -y -qq --no-install-recommends " +
			strings.Join(im.Packages, " ") + " && apt-get clean"}
	if err := logged(ctx, log, "systemd-nspawn", args...); err != nil {
		return err
	}
	return os.Remove(prc)
}

// logged runs a command with its output going to log.
func logged(ctx context.Context, log io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}
