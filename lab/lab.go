// Package lab is hapair's end-to-end lab: network namespaces as hosts
// (nodea, nodeb, witness, lb, client) on a bridge of their own, real
// PostgreSQL 15 under real Patroni 3.0.2 on the data nodes, the project's
// binaries (witness, roled with syncdir, lb) as they exist, a small test
// application, and the scenarios that check the whole system.
package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hapair/hapair/budget"
	"github.com/hapair/hapair/roled"
)

// DefaultRoot holds every lab's state directory (<root>/<tag>).
const DefaultRoot = "/var/tmp/hapair-lab"

// Options choose how a lab is built.
type Options struct {
	Root    string `json:"root"`     // state root, default DefaultRoot
	Tag     string `json:"tag"`      // namespace prefix; random when empty
	BinDir  string `json:"bin_dir"`  // hapair-* binaries; missing ones are left out
	DCSMode string `json:"dcs_mode"` // DCSRemote (default) or DCSAll
	Hold    string `json:"hold"`     // lb hold timeout ("5s"; "0s" disables; default 5s, or the budget's with RTO)
	// RTO is a timing budget's target ("5s", package budget): every timer
	// of the lab is derived from it. Empty: the lab's fixed timers.
	RTO string `json:"rto,omitempty"`
	// Patroni is the Patroni executable (default /usr/bin/patroni, Debian's);
	// PatroniRelease is what its --version said, the release a budget is
	// derived for (budget.DeriveFor; "" when not asked: budget.DefaultPatroni).
	Patroni        string `json:"patroni,omitempty"`
	PatroniRelease string `json:"patroni_release,omitempty"`
	SelfExe        string `json:"self_exe"` // the hapair-lab binary (app and fallback etcd)
	Repeat         int    `json:"repeat"`   // switchover/drill rounds per scenario (medians), default 1
	// VIP gives roled a vip section (VIPAddr on eth0): the service address
	// follows ACTIVE (issue 20; scenarios 10, 11, 17, 18). It also runs the
	// balancer pair: hapair-lb on lb and lb2, LBVIPAddr held by the one
	// that holds the pair's etcd election (scenarios 21–23).
	VIP bool `json:"vip"`
	// VIPPeer "keepalived" (VIPPeerKeepalived; implies VIP): keepalived's
	// VRRP pair holds the VIP instead of roled, for the side-by-side runs.
	// Empty: roled.
	VIPPeer string `json:"vip_peer,omitempty"`
	// Durability is async (default), sync or sync-strict (roled's words):
	// Patroni's synchronous_mode(_strict) in the bootstrap DCS config and
	// roled's durability (commit canary; sync-strict holds on hung commits).
	Durability string `json:"durability,omitempty"`
	// Owned marks a lab whose creating process tears it down itself (demo,
	// test, soak): "down" leaves it alone while that process lives.
	Owned bool `json:"owned"`
}

// Lab is one running (or stopped) lab, with its state on disk so separate
// command invocations (up, node kill, down) act on the same lab.
type Lab struct {
	Opt Options
	Net Net
	Dir string
	Out io.Writer // progress lines; never nil
	// beforeServices runs in Up once the namespaces exist, before the first
	// service starts (the jitter soak's delaying proxies: their DNAT rules
	// must see every connection from its first packet).
	beforeServices func() error
}

// Binaries the lab looks for in BinDir.
const (
	BinWitness = "hapair-witness"
	BinRoled   = "hapair-roled"
	BinLB      = "hapair-lb"
	BinCtl     = "hapairctl"
)

// NewLab prepares (does not start) a lab.
func NewLab(opt Options, out io.Writer) (*Lab, error) {
	if opt.Root == "" {
		opt.Root = DefaultRoot
	}
	if opt.DCSMode == "" {
		opt.DCSMode = DCSRemote
	}
	if opt.DCSMode != DCSRemote && opt.DCSMode != DCSAll {
		return nil, fmt.Errorf("dcs mode %q: want %q or %q", opt.DCSMode, DCSRemote, DCSAll)
	}
	if opt.Repeat < 1 {
		opt.Repeat = 1
	}
	switch opt.VIPPeer {
	case "":
	case VIPPeerKeepalived:
		opt.VIP = true
	default:
		return nil, fmt.Errorf("vip peer %q: want %q or none", opt.VIPPeer, VIPPeerKeepalived)
	}
	dur, err := roled.ParseDurability(opt.Durability)
	if err != nil {
		return nil, err
	}
	opt.Durability = string(dur)
	if opt.Patroni == "" {
		opt.Patroni = DefaultPatroni
	}
	if opt.RTO != "" || opt.Patroni != DefaultPatroni {
		// The release decides the least ttl it runs (budget.FloorsFor).
		if opt.PatroniRelease, err = patroniRelease(opt.Patroni); err != nil {
			return nil, err
		}
	}
	if opt.RTO != "" {
		hold, err := checkRTO(opt.RTO, opt.PatroniRelease)
		if err != nil {
			return nil, err
		}
		if opt.Hold == "" {
			opt.Hold = hold
		}
	}
	if opt.Hold == "" {
		opt.Hold = "5s"
	}
	if opt.Tag == "" {
		b := make([]byte, 2)
		_, _ = rand.Read(b)
		opt.Tag = NSPrefix + hex.EncodeToString(b)
	}
	if !strings.HasPrefix(opt.Tag, NSPrefix) {
		return nil, fmt.Errorf("tag %q must start with %q", opt.Tag, NSPrefix)
	}
	if opt.SelfExe == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		opt.SelfExe = exe
	}
	if out == nil {
		out = io.Discard
	}
	return &Lab{Opt: opt, Net: Net{Tag: opt.Tag}, Dir: filepath.Join(opt.Root, opt.Tag), Out: out}, nil
}

// Open loads the lab with tag from its state file.
func Open(root, tag string, out io.Writer) (*Lab, error) {
	if root == "" {
		root = DefaultRoot
	}
	b, err := os.ReadFile(filepath.Join(root, tag, "state.json"))
	if err != nil {
		return nil, fmt.Errorf("lab %s: %w", tag, err)
	}
	var opt Options
	if err := json.Unmarshal(b, &opt); err != nil {
		return nil, fmt.Errorf("lab %s state: %w", tag, err)
	}
	return NewLab(opt, out)
}

func (l *Lab) logf(format string, args ...any) {
	fmt.Fprintf(l.Out, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

// Bin returns the path of a project binary, or "" when it was not built.
func (l *Lab) Bin(name string) string {
	if l.Opt.BinDir == "" {
		return ""
	}
	p := filepath.Join(l.Opt.BinDir, name)
	if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
		return p
	}
	return ""
}

// Missing names the project binaries the lab runs without.
func (l *Lab) Missing() []string {
	var m []string
	for _, b := range []string{BinWitness, BinRoled, BinLB, BinCtl} {
		if l.Bin(b) == "" {
			m = append(m, b)
		}
	}
	return m
}

func (l *Lab) path(parts ...string) string {
	return filepath.Join(append([]string{l.Dir}, parts...)...)
}

// Create makes the namespaces and the state directory. On error everything
// made so far is removed.
func (l *Lab) Create() (err error) {
	if err := checkTools(l.Opt.Patroni); err != nil {
		return err
	}
	if l.Net.Exists(bridge) {
		return fmt.Errorf("lab %s already exists (hapair-lab down --tag %s)", l.Opt.Tag, l.Opt.Tag)
	}
	defer func() {
		if err != nil {
			_ = l.Destroy()
		}
	}()
	if err := os.MkdirAll(l.path("log"), 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(l.Opt, "", "  ")
	if err := os.WriteFile(l.path("state.json"), b, 0o644); err != nil {
		return err
	}
	if err := l.writeOwner(); err != nil {
		return err
	}
	if err := l.Net.Create(); err != nil {
		return err
	}
	if err := l.makeCerts(); err != nil {
		return err
	}
	return l.prepareDirs()
}

func (l *Lab) prepareDirs() error {
	pg, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("user postgres (package postgresql-15): %w", err)
	}
	uid, _ := strconv.Atoi(pg.Uid)
	gid, _ := strconv.Atoi(pg.Gid)
	if err := os.Chmod(l.Dir, 0o755); err != nil {
		return err
	}
	for _, h := range []string{NodeA, NodeB} {
		if err := os.MkdirAll(l.path(h), 0o755); err != nil {
			return err
		}
		for _, d := range []string{l.path(h, "pg"), l.path(h, "pgrun")} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				return err
			}
			if err := os.Chown(d, uid, gid); err != nil {
				return err
			}
		}
		for _, d := range []string{l.path(h, "files"), l.path(h, "state")} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
	}
	return nil
}

// ownerDir records which process owns each lab (tag → pid), whatever its
// state root, so "down" can tell a stale lab from one a test is using.
const ownerDir = "/run/hapair-lab"

func (l *Lab) writeOwner() error {
	pid := 0
	if l.Opt.Owned {
		pid = os.Getpid()
	}
	if err := os.MkdirAll(ownerDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(ownerDir, l.Opt.Tag), []byte(strconv.Itoa(pid)), 0o644)
}

// Owner returns the live process that owns the lab with tag, or 0.
func Owner(tag string) int {
	b, err := os.ReadFile(filepath.Join(ownerDir, tag))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 || pid == os.Getpid() || syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}

// Destroy kills every lab process, deletes the namespaces and the state dir.
// The logs are kept in <root>/logs/<tag> for post-mortems.
func (l *Lab) Destroy() error {
	err := l.Net.Destroy()
	_ = os.Remove(filepath.Join(ownerDir, l.Opt.Tag))
	if _, serr := os.Stat(l.path("log")); serr == nil {
		keep := filepath.Join(l.Opt.Root, "logs", l.Opt.Tag)
		_ = os.MkdirAll(filepath.Dir(keep), 0o755)
		_ = os.RemoveAll(keep)
		_ = os.Rename(l.path("log"), keep)
	}
	if l.Opt.Root != "" && l.Opt.Tag != "" && strings.HasPrefix(filepath.Base(l.Dir), NSPrefix) {
		if rerr := os.RemoveAll(l.Dir); rerr != nil && err == nil {
			err = rerr
		}
	}
	return err
}

// DestroyAll tears down every lab found on this machine: those left by
// "up" and stale ones whose owner died. A lab a live demo/test/soak process
// owns is skipped unless force is set.
func DestroyAll(root string, force bool, out io.Writer) error {
	if root == "" {
		root = DefaultRoot
	}
	var errs []error
	tags := Tags()
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), NSPrefix) {
			tags = append(tags, e.Name())
		}
	}
	done := map[string]bool{}
	for _, t := range tags {
		if done[t] {
			continue
		}
		done[t] = true
		if pid := Owner(t); pid != 0 && !force {
			fmt.Fprintf(out, "skipping lab %s: in use by pid %d (--all removes it)\n", t, pid)
			continue
		}
		fmt.Fprintf(out, "removing lab %s\n", t)
		l := &Lab{Opt: Options{Root: root, Tag: t}, Net: Net{Tag: t}, Dir: filepath.Join(root, t)}
		if err := l.Destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DefaultPatroni is Debian's Patroni executable.
const DefaultPatroni = "/usr/bin/patroni"

// patroniRelease asks a Patroni executable its version ("patroni 3.0.2").
func patroniRelease(bin string) (string, error) {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	f, err := budget.FloorsFor(string(out))
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	return f.Release, nil
}

func checkTools(patroni string) error {
	if os.Geteuid() != 0 {
		return errors.New("the lab needs root (network namespaces)")
	}
	if patroni == "" {
		patroni = DefaultPatroni
	}
	for _, p := range []string{patroni, "/usr/lib/postgresql/15/bin/postgres", "/usr/sbin/iptables"} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s missing (apt-get install patroni postgresql-15 iptables): %w", p, err)
		}
	}
	return nil
}

// Spawn starts argv inside host's namespace as a detached process (own
// session, output to log/<host>.<name>.log) and records its pid. ip netns exec
// execs argv, so the recorded pid is the program's.
func (l *Lab) Spawn(host, name string, env []string, argv ...string) (int, error) {
	if !l.Net.Exists(host) {
		return 0, fmt.Errorf("lab host %s does not exist", l.Net.NS(host))
	}
	lf, err := os.OpenFile(l.path("log", host+"."+name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer lf.Close()
	args := append([]string{"netns", "exec", l.Net.NS(host)}, argv...)
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s on %s: %w", name, host, err)
	}
	pid := cmd.Process.Pid
	go func() { _ = cmd.Wait() }() // reap it while this process lives
	err = os.WriteFile(l.path("log", host+"."+name+".pid"), []byte(strconv.Itoa(pid)), 0o644)
	return pid, err
}

// PID returns the recorded pid of a lab process if it is still running.
func (l *Lab) PID(host, name string) (int, bool) {
	b, err := os.ReadFile(l.path("log", host+"."+name+".pid"))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || syscall.Kill(pid, 0) != nil {
		return 0, false
	}
	st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if i := strings.LastIndexByte(string(st), ')'); i > 0 && strings.HasPrefix(string(st[i+1:]), " Z") {
		return 0, false
	}
	return pid, true
}

// Signal sends sig to a recorded lab process.
func (l *Lab) Signal(host, name string, sig syscall.Signal) error {
	pid, ok := l.PID(host, name)
	if !ok {
		return fmt.Errorf("%s on %s is not running", name, host)
	}
	return syscall.Kill(pid, sig)
}

// baseEnv is a clean environment: nothing like PGPASSWORD leaks into Patroni
// (LAB.md §8.5).
func baseEnv() []string {
	return []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "LC_ALL=C.UTF-8"}
}

// HTTPClient returns a client whose connections start in host's namespace.
func (l *Lab) HTTPClient(host string, timeout time.Duration) *http.Client {
	tr := &http.Transport{DialContext: l.Net.DialContext(host), DisableKeepAlives: true}
	return &http.Client{Transport: tr, Timeout: timeout}
}

// poll calls f every interval until it returns true or timeout passes.
func poll(ctx context.Context, timeout, interval time.Duration, f func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if f() {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(interval):
		}
	}
}

// httpCode GETs url from host and returns the status code (0 on error).
func (l *Lab) httpCode(host, url string, timeout time.Duration) int {
	resp, err := l.HTTPClient(host, timeout).Get(url)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode
}

// getJSON GETs url from host into v.
func (l *Lab) getJSON(host, url string, timeout time.Duration, v any) error {
	resp, err := l.HTTPClient(host, timeout).Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(v)
}
