package hosts

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RunsDir holds one directory per run (overlays, consoles, an owner file).
const RunsDir = "/var/tmp/hapair-hosts"

// nspawnRun is where systemd-nspawn keeps mount propagation state; it must
// be a tmpfs of its own, or nspawn refuses to clean it up ("Attempted to
// remove disk file system under /run/systemd/nspawn/propagate").
const nspawnRun = "/run/systemd/nspawn"

// Cluster is one run's hosts on their bridge.
type Cluster struct {
	Tag   string
	Dir   string
	Hosts map[string]*Host
	net   network
	log   io.Writer
}

// New prepares the hosts (name -> address on Subnet) over image: the
// namespaces, the bridge, one overlay each. Nothing boots yet; files put
// under each Host.Root() now are there at its first boot. On error what was
// made is removed.
func New(image string, addrs map[string]string, log io.Writer) (*Cluster, error) {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	tag := hex.EncodeToString(b)
	c := &Cluster{Tag: tag, Dir: filepath.Join(RunsDir, tag), Hosts: map[string]*Host{}, net: network{tag}, log: log}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "owner"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return nil, err
	}
	err := c.setup(image, addrs)
	if err != nil {
		_ = c.Down()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) setup(image string, addrs map[string]string) error {
	if err := ensureNspawnRun(); err != nil {
		return err
	}
	if err := c.net.create(addrs); err != nil {
		return err
	}
	for name, addr := range addrs {
		h := &Host{Name: name, Addr: addr, ns: c.net.ns(name), dir: filepath.Join(c.Dir, name), image: image}
		c.Hosts[name] = h
		if err := h.mount(); err != nil {
			return err
		}
		if err := writeNetworkFiles(h, addrs); err != nil {
			return err
		}
	}
	return nil
}

// writeNetworkFiles gives the host its name and the others' names.
func writeNetworkFiles(h *Host, addrs map[string]string) error {
	var b strings.Builder
	b.WriteString("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n")
	names := make([]string, 0, len(addrs))
	for n := range addrs {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(&b, "%s %s\n", addrs[n], n)
	}
	if err := os.WriteFile(filepath.Join(h.Root(), "etc/hosts"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(h.Root(), "etc/hostname"), []byte(h.Name+"\n"), 0o644)
}

// ensureNspawnRun mounts a tmpfs on /run/systemd/nspawn unless one is
// there. It is left mounted: it holds nothing once the containers are gone,
// and another nspawn user of the machine may rely on it.
func ensureNspawnRun() error {
	if err := os.MkdirAll(nspawnRun, 0o755); err != nil {
		return err
	}
	if isMountpoint(nspawnRun) {
		return nil
	}
	return syscall.Mount("tmpfs", nspawnRun, "tmpfs", 0, "mode=0755")
}

func isMountpoint(p string) bool {
	for _, m := range mounts() {
		if m == p {
			return true
		}
	}
	return false
}

// mounts lists the mount points of this mount namespace, in mount order.
func mounts() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 4 {
			out = append(out, strings.ReplaceAll(fs[4], `\040`, " "))
		}
	}
	return out
}

// Boot boots the named hosts in parallel (all when none are named).
func (c *Cluster) Boot(ctx context.Context, timeout time.Duration, names ...string) error {
	if len(names) == 0 {
		for n := range c.Hosts {
			names = append(names, n)
		}
	}
	errs := make(chan error, len(names))
	for _, n := range names {
		go func() { errs <- c.Hosts[n].Boot(ctx, timeout) }()
	}
	var all []error
	for range names {
		if err := <-errs; err != nil {
			all = append(all, err)
		}
	}
	return errors.Join(all...)
}

// Down halts every host (in parallel, cleanly, hard after 60 s), unmounts
// the overlays, deletes the namespaces and the run directory. Safe on a
// half-built run and to call twice.
func (c *Cluster) Down() error {
	var wg sync.WaitGroup
	errs := make(chan error, len(c.Hosts))
	for _, h := range c.Hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.Stop(60 * time.Second); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	for _, h := range c.Hosts {
		if err := h.unmount(); err != nil {
			all = append(all, err)
		}
	}
	if err := c.net.destroy(); err != nil {
		all = append(all, err)
	}
	if err := removeRunDir(c.Dir); err != nil {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// removeRunDir deletes a run directory after checking nothing is mounted
// below it (RemoveAll would walk into a mounted overlay's files).
func removeRunDir(dir string) error {
	for _, m := range mounts() {
		if strings.HasPrefix(m, dir+"/") {
			return fmt.Errorf("%s still mounted: run directory kept", m)
		}
	}
	return os.RemoveAll(dir)
}

// Sweep removes what earlier runs left behind when their test process
// died: containers, overlay mounts, namespaces, run directories. A run
// whose owner process still lives is left alone.
func Sweep(log io.Writer) error {
	ents, _ := os.ReadDir(RunsDir)
	live := map[string]bool{}
	var all []error
	for _, e := range ents {
		dir := filepath.Join(RunsDir, e.Name())
		if ownerAlive(dir) {
			live[e.Name()] = true
			continue
		}
		fmt.Fprintf(log, "sweep: removing stale run %s\n", dir)
		killContainers(dir)
		ms := mounts()
		for i := len(ms) - 1; i >= 0; i-- {
			if strings.HasPrefix(ms[i], dir+"/") {
				if err := syscall.Unmount(ms[i], syscall.MNT_DETACH); err != nil {
					all = append(all, fmt.Errorf("umount %s: %w", ms[i], err))
				}
			}
		}
		if err := (network{e.Name()}).destroy(); err != nil {
			all = append(all, err)
		}
		if err := removeRunDir(dir); err != nil {
			all = append(all, err)
		}
	}
	// Namespaces whose run directory is gone.
	nss, _ := os.ReadDir("/run/netns")
	for _, e := range nss {
		name := e.Name()
		tag, _, ok := strings.Cut(strings.TrimPrefix(name, nsPrefix), "-")
		if !strings.HasPrefix(name, nsPrefix) || !ok || live[tag] || len(tag) != 6 {
			continue
		}
		if _, err := os.Stat(filepath.Join(RunsDir, tag)); err == nil {
			continue
		}
		fmt.Fprintf(log, "sweep: deleting namespace %s\n", name)
		if err := sh("ip", "netns", "del", name); err != nil {
			all = append(all, err)
		}
	}
	return errors.Join(all...)
}

func ownerAlive(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "owner"))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return false
	}
	return syscall.Kill(pid, 0) == nil
}

// killContainers ends every systemd-nspawn whose root is under dir, and
// the containers below them.
func killContainers(dir string) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) == 0 || filepath.Base(args[0]) != "systemd-nspawn" || !slices.ContainsFunc(args, func(a string) bool {
			return strings.HasPrefix(a, dir+"/")
		}) {
			continue
		}
		kids := descendants(pid)
		for _, k := range kids {
			if nsPID(k) == 1 {
				_ = syscall.Kill(k, syscall.SIGKILL)
			}
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) && syscall.Kill(pid, 0) == nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
}
