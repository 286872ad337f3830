package hosts

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Host is one systemd container: an overlay over the image, booted with
// systemd-nspawn inside its own network namespace.
type Host struct {
	Name, Addr string
	ns         string // network namespace
	dir        string // upper, work, merged, console.log
	image      string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	pid1   int           // the container's systemd, as seen from here

	// Degraded lists the units that had failed when the last boot ended,
	// each with the end of its journal (FailedUnitsScript; empty:
	// is-system-running said running).
	Degraded string
}

// Root is the host's root directory as seen from this machine: files
// written there before boot (or while it runs) are the host's.
func (h *Host) Root() string { return filepath.Join(h.dir, "merged") }

// mount puts the host's overlay together over the image.
func (h *Host) mount() error {
	for _, d := range []string{"upper", "work", "merged"} {
		if err := os.MkdirAll(filepath.Join(h.dir, d), 0o755); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", h.image, filepath.Join(h.dir, "upper"), filepath.Join(h.dir, "work"))
	if err := syscall.Mount("overlay", h.Root(), "overlay", 0, opts); err != nil {
		return fmt.Errorf("%s: mount overlay: %w", h.Name, err)
	}
	// A machine-id of its own (the image's would be shared by all hosts).
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	return os.WriteFile(filepath.Join(h.Root(), "etc/machine-id"), []byte(hex.EncodeToString(id)+"\n"), 0o444)
}

// Boot starts the container and waits until its systemd reports the boot
// finished (is-system-running: running, or degraded with the failed units
// in Degraded).
func (h *Host) Boot(ctx context.Context, timeout time.Duration) error {
	h.mu.Lock()
	if h.cmd != nil {
		h.mu.Unlock()
		return fmt.Errorf("%s: already running", h.Name)
	}
	logf, err := os.OpenFile(filepath.Join(h.dir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		h.mu.Unlock()
		return err
	}
	// --register=no --keep-unit: there is no machined or system bus on the
	// machine; --console=pipe: the container's console goes to the log.
	cmd := exec.Command("systemd-nspawn", "--register=no", "--keep-unit", "-q", "-D", h.Root(), "-M", h.Name,
		"--network-namespace-path=/run/netns/"+h.ns, "--console=pipe", "-b")
	cmd.Stdout, cmd.Stderr = logf, logf
	// A test killed on the spot still halts its containers; the next
	// run's Sweep removes what is left. HAPAIR_DEPLOY_KEEP (a developer
	// keeping a failed run to look into) leaves them running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The container would otherwise keep every descriptor this process
	// inherited: with HAPAIR_DEPLOY_KEEP the kept hosts held the caller's
	// `flock /work/heavy.lock` for as long as they ran (seen here).
	closeInheritedOnExec()
	if os.Getenv("HAPAIR_DEPLOY_KEEP") == "" {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		h.mu.Unlock()
		return fmt.Errorf("%s: systemd-nspawn: %w", h.Name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	h.cmd, h.exited, h.pid1 = cmd, exited, 0
	h.mu.Unlock()

	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-exited:
			return fmt.Errorf("%s: systemd-nspawn exited during boot (see %s)", h.Name, filepath.Join(h.dir, "console.log"))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if h.findPID1() != 0 {
			out, _ := h.Exec(ctx, "systemctl", "is-system-running")
			switch strings.TrimSpace(out) {
			case "running":
				return nil
			case "degraded":
				// Booted, with a unit of the image failed (a container
				// lacks some hardware a host unit expects): the boot is
				// done; which units failed, and why, is kept for the test
				// to show.
				failed, _ := h.Exec(ctx, "sh", "-c", FailedUnitsScript)
				h.mu.Lock()
				h.Degraded = strings.TrimSpace(failed)
				h.mu.Unlock()
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not running after %v (see %s)", h.Name, timeout, filepath.Join(h.dir, "console.log"))
		}
	}
}

// FailedUnitsScript, run by sh inside a host, lists its failed units and
// the last 20 lines of this boot's journal of each: the unit's state alone
// does not say why it failed (a boot whose systemd-tmpfiles-setup failed
// once left PostgreSQL without its socket directory, and the state was all
// the test kept).
const FailedUnitsScript = `systemctl --failed --no-legend --plain
for u in $(systemctl --failed --no-legend --plain | cut -d' ' -f1); do
	echo "--- journal of $u"
	journalctl -b --no-pager -n 20 -u "$u"
done`

// Running reports whether the container is up.
func (h *Host) Running() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cmd == nil {
		return false
	}
	select {
	case <-h.exited:
		return false
	default:
		return true
	}
}

// findPID1 finds the container's systemd: the descendant of
// systemd-nspawn that is PID 1 of its own PID namespace.
func (h *Host) findPID1() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pid1 != 0 || h.cmd == nil {
		return h.pid1
	}
	for _, pid := range descendants(h.cmd.Process.Pid) {
		if nsPID(pid) == 1 {
			h.pid1 = pid
			break
		}
	}
	return h.pid1
}

// descendants lists every process below pid (from /proc).
func descendants(pid int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp := ppid(p); pp > 0 {
			children[pp] = append(children[pp], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

func ppid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may hold spaces and parentheses: fields start
	// after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	p, _ := strconv.Atoi(f[1])
	return p
}

// nsPID is pid's number in its innermost PID namespace.
func nsPID(pid int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
			fs := strings.Fields(rest)
			if len(fs) == 0 {
				return 0
			}
			n, _ := strconv.Atoi(fs[len(fs)-1])
			return n
		}
	}
	return 0
}

// hostEnv is the environment of commands run on a host.
var hostEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8", "TERM=dumb"}

// Command returns a command that runs on the host, in all its namespaces
// (nsenter into its systemd), as root; env is added to a clean
// environment.
func (h *Host) Command(ctx context.Context, env []string, args ...string) (*exec.Cmd, error) {
	pid := h.findPID1()
	if pid == 0 || !h.Running() {
		return nil, fmt.Errorf("%s: not running", h.Name)
	}
	a := append([]string{"-t", strconv.Itoa(pid), "-a", "--", "/usr/bin/env", "-i"}, hostEnv...)
	a = append(a, env...)
	a = append(a, args...)
	cmd := exec.CommandContext(ctx, "nsenter", a...)
	cmd.Dir = "/"
	return cmd, nil
}

// Exec runs a command on the host and returns its combined output.
func (h *Host) Exec(ctx context.Context, args ...string) (string, error) {
	cmd, err := h.Command(ctx, nil, args...)
	if err != nil {
		return "", err
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %s: %w: %s", h.Name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Stop halts the container cleanly (SIGTERM to systemd-nspawn, which
// asks the container's systemd to power off), or hard after timeout.
func (h *Host) Stop(timeout time.Duration) error {
	h.mu.Lock()
	cmd, exited := h.cmd, h.exited
	h.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(timeout):
		// What kept it up, taken before the power-off removes it: the
		// processes still there and the console's last lines (systemd
		// names the stop jobs it waits for there).
		why := h.haltReport(cmd.Process.Pid)
		if err := h.PowerOff(timeout); err != nil {
			return err
		}
		return fmt.Errorf("%s: did not halt within %v, powered off\n%s", h.Name, timeout, why)
	}
	h.reset()
	return nil
}

// haltReport lists the processes still running below pid (the nspawn
// process) and the last lines of the host's console.
func (h *Host) haltReport(pid int) string {
	var b strings.Builder
	b.WriteString("processes still running:\n")
	for _, p := range descendants(pid) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		fmt.Fprintf(&b, "  %d %s\n", p, strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	console, _ := os.ReadFile(filepath.Join(h.dir, "console.log"))
	lines := strings.Split(strings.TrimRight(string(console), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	b.WriteString("console, last lines:\n  ")
	b.WriteString(strings.Join(lines, "\n  "))
	return b.String()
}

// PowerOff stops the container at once, like pulling the plug: SIGKILL to
// its systemd ends every process of its PID namespace.
func (h *Host) PowerOff(timeout time.Duration) error {
	h.mu.Lock()
	cmd, exited := h.cmd, h.exited
	h.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if pid := h.findPID1(); pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	select {
	case <-exited:
	case <-time.After(timeout):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(timeout):
			return errors.New(h.Name + ": systemd-nspawn does not exit")
		}
	}
	h.reset()
	return nil
}

func (h *Host) reset() {
	h.mu.Lock()
	h.cmd, h.exited, h.pid1 = nil, nil, 0
	h.mu.Unlock()
}

// unmount removes the overlay (the container must be stopped).
func (h *Host) unmount() error {
	if err := syscall.Unmount(h.Root(), 0); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("%s: umount: %w", h.Name, err)
	}
	return nil
}

// closeInheritedOnExec marks every descriptor above stderr close-on-exec.
// Go opens its own that way; the ones it inherited (a lock held by the
// command that started the test, say) are not, and would pass on to every
// systemd-nspawn started.
func closeInheritedOnExec() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 {
			continue
		}
		_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
	}
}
