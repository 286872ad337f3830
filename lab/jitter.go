package lab

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/hapair/hapair/ctl"
)

// JitterOptions shape the no-false-failover soak (issue 21): a lab left
// alone under packet loss, delay and CPU load, where every role change is
// a false failover.
type JitterOptions struct {
	Loss   float64       // share of packets each host drops on input, 0..1 (iptables statistic)
	Delay  time.Duration // one-way delay between members (DelayProxy)
	Jitter time.Duration // ± around Delay
	// StressEvery: stress-ng --cpu 2 on a data node (alternating) for
	// StressFor, this often; 0 disables.
	StressEvery, StressFor time.Duration
}

// ParseJitter reads the command line's --loss ("1%", "0.01") and --delay
// ("20ms±10ms", "20ms+-10ms", "20ms").
func ParseJitter(loss, delay string) (JitterOptions, error) {
	jo := JitterOptions{StressEvery: 5 * time.Minute, StressFor: time.Minute}
	if loss != "" {
		pct := strings.HasSuffix(loss, "%")
		v, err := strconv.ParseFloat(strings.TrimSuffix(loss, "%"), 64)
		if err != nil {
			return jo, fmt.Errorf("--loss %q: %w", loss, err)
		}
		if pct {
			v /= 100
		}
		if v < 0 || v >= 1 {
			return jo, fmt.Errorf("--loss %q: want a share in [0, 1) or a percentage", loss)
		}
		jo.Loss = v
	}
	if delay != "" {
		mean, jit, _ := strings.Cut(strings.Replace(delay, "+-", "±", 1), "±")
		d, err := time.ParseDuration(mean)
		if err != nil || d < 0 {
			return jo, fmt.Errorf("--delay %q: want 20ms or 20ms±10ms", delay)
		}
		jo.Delay = d
		if jit != "" {
			j, err := time.ParseDuration(jit)
			if err != nil || j < 0 || j > d {
				return jo, fmt.Errorf("--delay %q: the jitter must be a duration up to the delay", delay)
			}
			jo.Jitter = j
		}
	}
	return jo, nil
}

// JitterSoak brings a lab up (with opt.RTO's budget), injects jo for d and
// reports role changes, Patroni leader changes, dual-ACTIVE rounds and
// failed writes; any of the first three fails it. The loss is iptables'
// (Net.DropRandom), the delay a DelayProxy on every member-to-member etcd
// and Patroni REST connection (Net.StartDelay), the CPU load stress-ng.
func JitterSoak(ctx context.Context, opt Options, jo JitterOptions, d time.Duration, w io.Writer) error {
	l, err := NewLab(opt, w)
	if err != nil {
		return err
	}
	defer l.Down()
	stopDelay := func() {}
	defer func() { stopDelay() }() // before Down: the proxies' sockets live in the client's namespace
	if jo.Delay > 0 {
		l.beforeServices = func() error {
			stop, err := l.Net.StartDelay(ctx, jo)
			if err != nil {
				return err
			}
			stopDelay = stop
			l.logf("jitter soak: etcd and Patroni REST between members through delaying proxies, %s ± %s each way", jo.Delay, jo.Jitter)
			return nil
		}
	}
	if err := l.Up(ctx); err != nil {
		return err
	}
	if jo.Loss > 0 {
		for _, h := range Hosts {
			if err := l.Net.DropRandom(h, jo.Loss); err != nil {
				return err
			}
		}
		l.logf("jitter soak: every host drops %.2f%% of its input", 100*jo.Loss)
	}
	before, err := l.keysNow(ctx)
	if err != nil {
		return err
	}
	pr, stop := l.startProbes(ctx, 10*time.Millisecond)
	start, end := time.Now(), time.Now().Add(d)
	stressed := 0
	for next := start.Add(time.Minute); time.Now().Before(end) && ctx.Err() == nil; {
		if jo.StressEvery > 0 && !time.Now().Before(next) {
			l.stress(ctx, DataNodes[stressed%2], jo.StressFor)
			stressed++
			next = next.Add(jo.StressEvery)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	stop()
	// A role change is a node answering 503 and later 200. The checker's
	// own requests cross the lossy network too: "unreachable" then 200
	// again is a lost packet on the checker's path, not a change of role,
	// and is counted apart.
	changes, blips := 0, 0
	answered := map[string]string{} // last state the node itself answered
	for _, t := range pr.ha.Transitions() {
		last := answered[t.Node]
		if t.State != "unreachable" {
			answered[t.Node] = t.State
		}
		if !t.At.After(start) || t.State != "active" {
			continue
		}
		if last == "active" {
			blips++
		} else if last != "" {
			changes++
		}
	}
	dual, rounds := pr.ha.Dual()
	rep := ctl.Analyze(pr.probe.Samples(), start)
	after, err := l.keysNow(ctx)
	if err != nil {
		return err // unknown is not "no change"
	}
	// The leader key is created anew by every leader change, and the
	// active key (the epoch) by every role change: a revision that moved
	// is a change the 10 ms checker may have missed.
	leaderChanged := before.leaderRev != after.leaderRev || before.leader != after.leader
	fmt.Fprintf(w, "\n=== jitter soak summary (%s, rto %q, loss %.2f%%, %d stress periods)\n", d, opt.RTO, 100*jo.Loss, stressed)
	if jo.Delay > 0 {
		fmt.Fprintf(w, "delay: %s ± %s each way on etcd (client, peer) and Patroni REST between members\n", jo.Delay, jo.Jitter)
	}
	fmt.Fprintf(w, "role changes (a node answering 503, then 200): %d\nchecker blips (no answer, then 200: its own lost packets): %d\n", changes, blips)
	fmt.Fprintf(w, "Patroni leader: %s → %s; active key: %s → %s\n", before.leaderString(), after.leaderString(), before.activeString(), after.activeString())
	fmt.Fprintf(w, "dual-ACTIVE rounds: %d of %d\nprobe: %s\n", dual, rounds, rep)
	if changes > 0 || dual > 0 || leaderChanged || before.epoch != after.epoch {
		return fmt.Errorf("jitter soak: %d role changes, leader changed %v, epoch %d → %d, %d dual-ACTIVE rounds",
			changes, leaderChanged, before.epoch, after.epoch, dual)
	}
	return nil
}

// keys is the Patroni leader key and the active key at one moment.
type keys struct {
	leader    string
	leaderRev int64
	active    string
	epoch     int64
}

// keysNow reads both keys, retrying for up to 30 s: on a lossy network one
// status read may miss one, and a missing key must not read as a change.
func (l *Lab) keysNow(ctx context.Context) (keys, error) {
	var k keys
	ok := poll(ctx, 30*time.Second, 250*time.Millisecond, func() bool {
		st := l.Ctl().Status(ctx)
		if st.Leader == nil || st.Active == nil {
			return false
		}
		k = keys{st.Leader.Member, st.Leader.CreateRevision, st.Active.Node, st.Active.Epoch}
		return true
	})
	if !ok {
		return k, fmt.Errorf("jitter soak: no Patroni leader key and active key read within 30 s")
	}
	return k, nil
}

func (k keys) leaderString() string { return fmt.Sprintf("%s (create_rev %d)", k.leader, k.leaderRev) }
func (k keys) activeString() string { return fmt.Sprintf("%s (epoch %d)", k.active, k.epoch) }

// stress keeps both cores busy inside host's namespace for d (stress-ng,
// when installed).
func (l *Lab) stress(ctx context.Context, host string, d time.Duration) {
	if _, err := exec.LookPath("stress-ng"); err != nil {
		l.logf("jitter soak: stress-ng not installed, no CPU load")
		return
	}
	l.logf("jitter soak: stress-ng --cpu 2 on %s for %s", host, d)
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", l.Net.NS(host), "stress-ng", "--cpu", "2", "--timeout", strconv.Itoa(int(d.Seconds()))+"s")
	_ = cmd.Run()
}
