// Command sync-bench runs syncdir and lsyncd+rsync side by side on the same
// trees, on loopback, and prints each figure for both and the ratio.
// Run it through run.sh, as root (lsyncd needs inotify on the source, the
// rsync daemon writes as root).
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"io/fs"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hapair/hapair/internal/config"
	"github.com/hapair/hapair/syncdir"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

var (
	work      = flag.String("work", "", "scratch directory (default: a new temp dir, removed at the end)")
	smallN    = flag.Int("small", 20, "single small-file repetitions (median)")
	slowSmall = flag.Int("slow-small", 3, "single small-file repetitions for lsyncd at delay=15")
	skipSlow  = flag.Bool("skip-delay15", false, "skip lsyncd at its default delay=15")
	onlyOurs  = flag.Bool("syncdir-only", false, "only the live syncdir figures (for profiling)")
	bulkOnly  = flag.Bool("bulk-only", false, "only the bulk figures (rsync -a, rsync -a --fsync, syncdir)")
	skipBulk  = flag.Bool("skip-bulk", false, "only the live figures")
	cpuProf   = flag.String("cpuprofile", "", "write a CPU profile of the driver (syncdir runs in it) to this file")
	rounds    = flag.Int("rounds", 3, "burst and 256 MiB rounds (median); lsyncd at delay=15 does one")
	syncfsMin = flag.Int("syncfs-min-files", syncdir.DefaultConfig().SyncfsMinFiles, "syncdir's sync.syncfs-min-files (0: fsyncs only)")
	scenario  = flag.String("scenario", "", "with -syncdir-only: run only \"burst\" or \"big\" (default: all live figures)")
	plain     = flag.Bool("insecure", false, "run syncdir without TLS (sync.insecure, labs only): shows what encryption costs")
	traceFile = flag.String("trace", "", "write syncdir's debug timeline (JSON lines, times in ns) and the bench's marks to this file")
)

// lg is the trace logger (a no-op without -trace).
var lg = zap.NewNop()

func openTrace(file string) (func(), error) {
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(zap.DebugLevel)
	cfg.OutputPaths = []string{file}
	cfg.Sampling = nil
	cfg.EncoderConfig.EncodeTime = zapcore.EpochNanosTimeEncoder
	l, err := cfg.Build()
	if err != nil {
		return nil, err
	}
	lg = l
	return func() { l.Sync() }, nil
}

type result struct {
	small      time.Duration
	burst      time.Duration
	burstWrite time.Duration // the writer's own time during the burst
	burstBase  time.Duration // the same writer with nothing watching
	big        time.Duration
	bigPartial bool
}

func main() {
	if len(os.Args) == 4 && os.Args[1] == childArg {
		os.Exit(childWrite(os.Args[2], os.Args[3]))
	}
	flag.Parse()
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "sync-bench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if *traceFile != "" {
		done, err := openTrace(*traceFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "sync-bench:", err)
			os.Exit(1)
		}
		defer done()
	}
	if err := run(); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "sync-bench:", err)
		os.Exit(1)
	}
}

func run() error {
	if !*onlyOurs { // syncdir alone needs neither
		for _, b := range []string{"lsyncd", "rsync"} {
			if _, err := exec.LookPath(b); err != nil {
				return fmt.Errorf("%s not found: apt-get install -y lsyncd rsync", b)
			}
		}
	}
	dir := *work
	if dir == "" {
		d, err := os.MkdirTemp("", "hapair-sync-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	if *onlyOurs {
		r, err := syncdirLive(dir)
		fmt.Printf("syncdir: small %s, burst %s (its writer %s, unwatched %s), 256 MiB %s (partial %v)\n",
			fmtDur(r.small), fmtDur(r.burst), fmtDur(r.burstWrite), fmtDur(r.burstBase), fmtDur(r.big), r.bigPartial)
		return err
	}
	rd, err := startRsyncd(dir)
	if err != nil {
		return err
	}
	defer rd.stop()

	live := map[string]result{}
	names := []string{}
	if *bulkOnly {
		bulk, err := bulkRuns(dir, rd)
		if err != nil {
			return err
		}
		report(nil, nil, bulk)
		return nil
	}
	if !*skipSlow {
		r, err := lsyncdLive(dir, rd, 15, *slowSmall)
		if err != nil {
			return err
		}
		live["lsyncd delay=15"] = r
		names = append(names, "lsyncd delay=15")
	}
	r0, err := lsyncdLive(dir, rd, 0, *smallN)
	if err != nil {
		return err
	}
	live["lsyncd delay=0"], names = r0, append(names, "lsyncd delay=0")
	rs, err := syncdirLive(dir)
	if err != nil {
		return err
	}
	live["syncdir"] = rs

	var bulk []bulk
	if !*skipBulk {
		if bulk, err = bulkRuns(dir, rd); err != nil {
			return err
		}
	}
	report(live, names, bulk)
	return nil
}

// ---- trees and probes ----

func writeSmall(p string, n int) error {
	return os.WriteFile(p, []byte(strings.Repeat("s", n)), 0o644)
}

// waitSize polls until p exists with size want; it reports whether p was
// ever seen with another size (a partial file under its final name).
func waitSize(p string, want int64, limit time.Duration) (time.Duration, bool, error) {
	start := time.Now()
	partial := false
	for {
		fi, err := os.Stat(p)
		if err == nil {
			if fi.Size() == want {
				return time.Since(start), partial, nil
			}
			partial = true
		}
		if time.Since(start) > limit {
			return 0, partial, fmt.Errorf("%s not complete after %s", p, limit)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func countFiles(dir string, size int64) int {
	n := 0
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil && fi.Size() == size {
				n++
			}
		}
		return nil
	})
	return n
}

// liveScenarios runs the three live figures against one running sync from
// src to dst; the burst and the big file are medians of n rounds. Dirty
// pages are written out before each timed step, so no tool pays for the
// previous one's writeback.
func liveScenarios(src, dst string, reps, n int) (result, error) {
	var r result
	var times []time.Duration
	if *scenario != "" {
		reps = 1
	}
	for i := 0; i < reps; i++ {
		name := fmt.Sprintf("small-%d.txt", i)
		start := time.Now()
		if err := writeSmall(filepath.Join(src, name), 100); err != nil {
			return r, err
		}
		if _, _, err := waitSize(filepath.Join(dst, name), 100, 60*time.Second); err != nil {
			return r, err
		}
		times = append(times, time.Since(start))
		time.Sleep(50 * time.Millisecond) // let the tool go idle between samples
	}
	r.small = median(times)

	var bursts, writes, bases, bigs []time.Duration
	for i := 0; i < n; i++ {
		if *scenario != "big" {
			b, w, base, err := burstRound(src, dst, i)
			if err != nil {
				return r, err
			}
			bursts, writes, bases = append(bursts, b), append(writes, w), append(bases, base)
		}
		if *scenario == "burst" {
			continue
		}
		d, partial, err := bigRound(src, dst, i)
		if err != nil {
			return r, err
		}
		bigs = append(bigs, d)
		r.bigPartial = r.bigPartial || partial
	}
	r.burst, r.burstWrite, r.burstBase, r.big = median(bursts), median(writes), median(bases), median(bigs)
	if len(bursts) > 1 || len(bigs) > 1 {
		fmt.Fprintf(os.Stderr, "rounds: burst %s, writer %s; 256 MiB %s\n", fmtDurs(bursts), fmtDurs(writes), fmtDurs(bigs))
	}
	return r, nil
}

// burstRound writes 1,000 files of 4 KiB into a new directory and returns
// the time until all are on the target, the writer's own time, and the
// writer's time into a directory nothing watches (the floor right now).
func burstRound(src, dst string, round int) (time.Duration, time.Duration, time.Duration, error) {
	base := filepath.Join(filepath.Dir(src), fmt.Sprintf("unwatched-%d", round))
	os.Mkdir(base, 0o755)
	syscall.Sync()
	baseline, err := writeChild("burst", base)
	os.RemoveAll(base)
	if err != nil {
		return 0, 0, 0, err
	}
	dir := fmt.Sprintf("burst-%d", round)
	os.Mkdir(filepath.Join(src, dir), 0o755)
	waitDir(filepath.Join(dst, dir), 60*time.Second)
	syscall.Sync()
	time.Sleep(200 * time.Millisecond)
	arr, err := watchArrivals(filepath.Join(dst, dir))
	if err != nil {
		return 0, 0, 0, err
	}
	defer arr.close()
	cpu0 := cpuTime()
	start := time.Now()
	wrote, err := writeChild("burst", filepath.Join(src, dir))
	if err != nil {
		return 0, 0, 0, err
	}
	if err := arr.waitCount(1000, start.Add(2*time.Minute)); err != nil {
		return 0, 0, 0, fmt.Errorf("burst incomplete: %w", err)
	}
	took := time.Since(start)
	if n := countFiles(filepath.Join(dst, dir), 4096); n < 1000 {
		return 0, 0, 0, fmt.Errorf("burst: 1,000 names arrived but only %d files are complete", n)
	}
	lg.Info("bench burst", zap.Int("round", round), zap.Time("start", start), zap.Time("wrote", start.Add(wrote)),
		zap.Time("complete", start.Add(took)), zap.Duration("unwatched", baseline), zap.Duration("cpu", cpuTime()-cpu0))
	return took, wrote, baseline, nil
}

// childArg runs this binary as the writer of a burst or of the 256 MiB
// file, in its own process as an application would be. In the bench's
// process the writer would be one more goroutine on the Ps that syncdir's
// sender and receiver keep busy, queued behind them after each blocking
// file system call; lsyncd and rsync are processes of their own anyway.
const childArg = "-write-child"

// writeChild runs the writer ("burst" into dir, or "big" at path) in a
// child process and returns the writer's own time.
func writeChild(kind, path string) (time.Duration, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	out, err := exec.Command(self, childArg, kind, path).Output()
	if err != nil {
		return 0, fmt.Errorf("writer %s %s: %w", kind, path, err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("writer %s %s: %q: %w", kind, path, out, err)
	}
	return time.Duration(ns), nil
}

// childWrite is the child's side: it writes, prints its time in
// nanoseconds and returns the exit code.
func childWrite(kind, path string) int {
	start := time.Now()
	var err error
	switch kind {
	case "burst":
		err = writeBurst(path)
	case "big":
		err = writeBig(path, bigSize)
	default:
		err = fmt.Errorf("unknown writer %q", kind)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sync-bench writer:", err)
		return 1
	}
	fmt.Println(time.Since(start).Nanoseconds())
	return 0
}

func writeBurst(dir string) error {
	buf := []byte(strings.Repeat("b", 4096))
	for i := 0; i < 1000; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", i)), buf, 0o644); err != nil {
			return err
		}
	}
	return nil
}

const bigSize = 256 << 20

func bigRound(src, dst string, round int) (time.Duration, bool, error) {
	name := fmt.Sprintf("big-%d.bin", round)
	syscall.Sync()
	time.Sleep(200 * time.Millisecond)
	done := make(chan error, 1)
	cpu0 := cpuTime()
	start := time.Now()
	var wrote time.Time
	go func() { _, err := writeChild("big", filepath.Join(src, name)); wrote = time.Now(); done <- err }()
	d, partial, err := waitSize(filepath.Join(dst, name), bigSize, 3*time.Minute)
	if werr := <-done; werr != nil {
		return 0, false, werr
	}
	lg.Info("bench big", zap.Int("round", round), zap.Time("start", start), zap.Time("wrote", wrote), zap.Time("complete", start.Add(d)),
		zap.Duration("cpu", cpuTime()-cpu0))
	if err != nil {
		return 0, false, err
	}
	// Free the space: three rounds of two tools would fill a small disk.
	os.Remove(filepath.Join(src, name))
	return d, partial, nil
}

// cpuTime is the CPU time used by this process (syncdir's sender and
// receiver, which run in it; the writer is a child): the polling is cheap next to it.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func waitDir(p string, limit time.Duration) {
	start := time.Now()
	for time.Since(start) < limit {
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// writeBig writes a file in place, 1 MiB at a time, as an application would.
func writeBig(p string, size int) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	mrand.NewChaCha8([32]byte{7}).Read(buf)
	for i := 0; i < size/len(buf); i++ {
		buf[0], buf[1] = byte(i), byte(i>>8)
		if _, err := f.Write(buf); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

func fmtDurs(ds []time.Duration) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = fmtDur(d)
	}
	return strings.Join(s, " ")
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration{}, d...)
	sort.Slice(s, func(a, b int) bool { return s[a] < s[b] })
	return s[len(s)/2]
}

// ---- rsync daemon and lsyncd ----

type rsyncd struct {
	cmd  *exec.Cmd
	port int
	root string
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func startRsyncd(dir string) (*rsyncd, error) {
	root := filepath.Join(dir, "rsyncd")
	os.MkdirAll(root, 0o755)
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "rsyncd.conf")
	body := fmt.Sprintf("use chroot = no\nuid = root\ngid = root\npid file = %s/rsyncd.pid\n[t]\n  path = %s\n  read only = no\n", dir, root)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command("rsync", "--daemon", "--no-detach", "--config="+conf, "--address=127.0.0.1", fmt.Sprintf("--port=%d", port))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	r := &rsyncd{cmd: cmd, port: port, root: root}
	for i := 0; i < 100; i++ {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return r, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.stop()
	return nil, fmt.Errorf("rsync daemon did not start")
}

func (r *rsyncd) stop() {
	r.cmd.Process.Signal(syscall.SIGTERM)
	r.cmd.Wait()
}

func (r *rsyncd) url(sub string) string {
	return fmt.Sprintf("rsync://127.0.0.1:%d/t/%s/", r.port, sub)
}

func lsyncdLive(dir string, rd *rsyncd, delay, reps int) (result, error) {
	sub := fmt.Sprintf("lsyncd-%d", delay)
	src, dst := filepath.Join(dir, sub+"-src"), filepath.Join(rd.root, sub)
	os.MkdirAll(src, 0o755)
	os.MkdirAll(dst, 0o755)
	conf := filepath.Join(dir, sub+".lua")
	lua := fmt.Sprintf(`settings { logfile = %q, nodaemon = true, insist = true }
sync { default.rsync, source = %q, target = %q, delay = %d }
`, filepath.Join(dir, sub+".log"), src, rd.url(sub), delay)
	if err := os.WriteFile(conf, []byte(lua), 0o644); err != nil {
		return result{}, err
	}
	cmd := exec.Command("lsyncd", conf)
	if err := cmd.Start(); err != nil {
		return result{}, err
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	// Wait for its start-up full sync: a marker written before start arrives.
	time.Sleep(2 * time.Second)
	fmt.Fprintf(os.Stderr, "lsyncd delay=%d: running\n", delay)
	n := *rounds
	if delay > 0 {
		n = 1
	}
	r, err := liveScenarios(src, dst, reps, n)
	if err != nil {
		return r, fmt.Errorf("lsyncd delay=%d: %w", delay, err)
	}
	return r, nil
}

// ---- syncdir ----

type fence struct{}

func (fence) Holding() bool              { return false }
func (fence) ActiveEpoch() (int64, bool) { return 1, true }

type passive struct{}

func (passive) Holding() bool              { return false }
func (passive) ActiveEpoch() (int64, bool) { return 0, false }

type pair struct {
	snd, rcv *syncdir.Syncer
	cancel   context.CancelFunc
	done     chan struct{}
	src, dst string
}

func startPair(dir, name string, tlsc config.TLS, src string) (*pair, error) {
	p := &pair{src: src, dst: filepath.Join(dir, name+"-dst")}
	if src == "" {
		p.src = filepath.Join(dir, name+"-src")
	}
	os.MkdirAll(p.src, 0o755)
	os.MkdirAll(p.dst, 0o755)
	pr, err := freePort()
	if err != nil {
		return nil, err
	}
	ps, err := freePort()
	if err != nil {
		return nil, err
	}
	mk := func(node, root string, listen, peer int) (*syncdir.Syncer, error) {
		cfg := syncdir.DefaultConfig()
		cfg.Node = node
		cfg.Listen = fmt.Sprintf("127.0.0.1:%d", listen)
		cfg.Peer = fmt.Sprintf("127.0.0.1:%d", peer)
		cfg.StateDir = filepath.Join(dir, name+"-state-"+node)
		cfg.TLS = tlsc
		if *plain {
			cfg.TLS, cfg.Insecure = config.TLS{}, true
		}
		cfg.SyncfsMinFiles = *syncfsMin
		cfg.Roots = []syncdir.Root{{Name: "data", Path: root, Exclude: []string{}}}
		var f syncdir.Fence = passive{}
		if node == "sender" {
			f = fence{}
		}
		return syncdir.New(cfg, lg.Named(node), nil, f)
	}
	if p.snd, err = mk("sender", p.src, ps, pr); err != nil {
		return nil, err
	}
	if p.rcv, err = mk("receiver", p.dst, pr, ps); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel, p.done = cancel, make(chan struct{})
	go func() {
		defer close(p.done)
		errs := make(chan error, 2)
		go func() { errs <- p.rcv.Run(ctx) }()
		go func() { errs <- p.snd.Run(ctx) }()
		for i := 0; i < 2; i++ {
			if err := <-errs; err != nil {
				fmt.Fprintln(os.Stderr, "syncdir:", err)
			}
		}
	}()
	return p, waitListen(pr)
}

func waitListen(port int) error {
	for i := 0; i < 200; i++ {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("syncdir receiver did not listen")
}

func (p *pair) stop() {
	p.cancel()
	<-p.done
}

// waitIdle waits until the sender has reconciled after since and has
// nothing queued.
func (p *pair) waitIdle(since time.Time, limit time.Duration) error {
	start := time.Now()
	for {
		st := p.snd.Status()
		if st.LastReconcile != nil && st.LastReconcile.After(since) && st.QueueDepth == 0 {
			return nil
		}
		if time.Since(start) > limit {
			return fmt.Errorf("syncdir not idle after %s: %+v", limit, st)
		}
		time.Sleep(500 * time.Microsecond)
	}
}

func syncdirLive(dir string) (result, error) {
	tlsc, err := makePKI(dir)
	if err != nil {
		return result{}, err
	}
	p, err := startPair(dir, "live", tlsc, "")
	if err != nil {
		return result{}, err
	}
	defer p.stop()
	t0 := time.Now()
	p.snd.SetActive(1)
	if err := p.waitIdle(t0, time.Minute); err != nil {
		return result{}, err
	}
	fmt.Fprintln(os.Stderr, "syncdir: running")
	return liveScenarios(p.src, p.dst, *smallN, *rounds)
}

// ---- bulk ----

type bulk struct {
	name         string
	first, rerun time.Duration
}

func makeBulkTree(src string) (int, error) {
	buf := []byte(strings.Repeat("t", 4096))
	n := 0
	for d := 0; d < 100; d++ {
		dir := filepath.Join(src, fmt.Sprintf("d%03d", d))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return 0, err
		}
		for i := 0; i < 100; i++ {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", i)), buf, 0o644); err != nil {
				return 0, err
			}
			n++
		}
	}
	for i := 0; i < 20; i++ {
		if err := writeBig(filepath.Join(src, fmt.Sprintf("big-%02d.bin", i)), 16<<20); err != nil {
			return 0, err
		}
		n++
	}
	return n, nil
}

func rsyncRun(src, url string, extra ...string) (time.Duration, error) {
	args := append([]string{"-a"}, extra...)
	args = append(args, src+"/", url)
	start := time.Now()
	out, err := exec.Command("rsync", args...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("rsync %v: %v: %s", args, err, out)
	}
	return time.Since(start), nil
}

func bulkRuns(dir string, rd *rsyncd) ([]bulk, error) {
	src := filepath.Join(dir, "bulk-src")
	n, err := makeBulkTree(src)
	if err != nil {
		return nil, err
	}
	syscall.Sync()
	fmt.Fprintf(os.Stderr, "bulk tree: %d files\n", n)
	var out []bulk
	for _, v := range []struct {
		name  string
		extra []string
	}{{"rsync -a", nil}, {"rsync -a --fsync", []string{"--fsync"}}} {
		sub := strings.ReplaceAll(strings.ReplaceAll(v.name, " ", ""), "-", "")
		os.MkdirAll(filepath.Join(rd.root, sub), 0o755)
		first, err := rsyncRun(src, rd.url(sub), v.extra...)
		if err != nil {
			return nil, err
		}
		syscall.Sync()
		again, err := rsyncRun(src, rd.url(sub), v.extra...)
		if err != nil {
			return nil, err
		}
		out = append(out, bulk{name: v.name, first: first, rerun: again})
	}
	b, err := syncdirBulk(dir, src)
	if err != nil {
		return nil, err
	}
	return append(out, b), nil
}

func syncdirBulk(dir, src string) (bulk, error) {
	tlsc, err := makePKI(dir)
	if err != nil {
		return bulk{}, err
	}
	p, err := startPair(dir, "bulk", tlsc, src)
	if err != nil {
		return bulk{}, err
	}
	defer p.stop()
	b := bulk{name: "syncdir"}
	t0 := time.Now()
	p.snd.SetActive(1)
	if err := p.waitIdle(t0, 10*time.Minute); err != nil {
		return b, err
	}
	b.first = time.Since(t0)
	if n, want := countFiles(p.dst, 4096)+countFiles(p.dst, 16<<20), countFiles(src, 4096)+countFiles(src, 16<<20); n != want {
		return b, fmt.Errorf("syncdir bulk: %d of %d files on the target", n, want)
	}
	syscall.Sync()
	p.snd.SetPassive()
	t1 := time.Now()
	p.snd.SetActive(1)
	if err := p.waitIdle(t1, time.Minute); err != nil {
		return b, err
	}
	b.rerun = time.Since(t1)
	return b, nil
}

// ---- report ----

func report(live map[string]result, lsyncdNames []string, bulks []bulk) {
	s := live["syncdir"]
	if live != nil {
		fmt.Println()
		fmt.Printf("live sync (write on the source -> complete on the target), loopback; burst and 256 MiB: median of %d rounds (lsyncd delay=15: 1)\n", *rounds)
		fmt.Printf("%-34s %14s %14s %10s\n", "figure", "lsyncd+rsync", "syncdir", "ratio")
		for _, n := range lsyncdNames {
			l := live[n]
			row(fmt.Sprintf("small file, median [%s]", n), l.small, s.small)
			row(fmt.Sprintf("1,000 x 4 KiB burst [%s]", n), l.burst, s.burst)
			row(fmt.Sprintf("  its writer [%s]", n), l.burstWrite, s.burstWrite)
			row(fmt.Sprintf("  writer, unwatched dir [%s]", n), l.burstBase, s.burstBase)
			row(fmt.Sprintf("256 MiB file [%s]", n), l.big, s.big)
			fmt.Printf("%-34s %14v %14v\n", fmt.Sprintf("  partial file visible [%s]", n), l.bigPartial, s.bigPartial)
		}
	}
	if len(bulks) == 0 {
		return
	}
	fmt.Println()
	fmt.Println("bulk: 10,000 x 4 KiB + 20 x 16 MiB into an empty target, then a no-change re-run")
	var sd bulk
	for _, b := range bulks {
		if b.name == "syncdir" {
			sd = b
		}
	}
	for _, b := range bulks {
		if b.name == "syncdir" {
			continue
		}
		row("initial ["+b.name+"]", b.first, sd.first)
		row("no-change re-run ["+b.name+"]", b.rerun, sd.rerun)
	}
	fmt.Println("ratio = lsyncd+rsync time / syncdir time (above 1: syncdir is faster)")
}

func row(name string, other, ours time.Duration) {
	ratio := "-"
	if ours > 0 {
		ratio = fmt.Sprintf("%.1fx", float64(other)/float64(ours))
	}
	fmt.Printf("%-34s %14s %14s %10s\n", name, fmtDur(other), fmtDur(ours), ratio)
}

func fmtDur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// ---- TLS ----

func makePKI(dir string) (config.TLS, error) {
	d := filepath.Join(dir, "pki")
	if _, err := os.Stat(filepath.Join(d, "ca.pem")); err == nil {
		return config.TLS{CertFile: filepath.Join(d, "node.pem"), KeyFile: filepath.Join(d, "node-key.pem"), CAFile: filepath.Join(d, "ca.pem")}, nil
	}
	os.MkdirAll(d, 0o700)
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bench-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	if err != nil {
		return config.TLS{}, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "node"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &k.PublicKey, caKey)
	if err != nil {
		return config.TLS{}, err
	}
	kb, _ := x509.MarshalECPrivateKey(k)
	write := func(n, typ string, b []byte) {
		os.WriteFile(filepath.Join(d, n), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600)
	}
	write("ca.pem", "CERTIFICATE", caDER)
	write("node.pem", "CERTIFICATE", der)
	write("node-key.pem", "EC PRIVATE KEY", kb)
	return makePKI(dir)
}
