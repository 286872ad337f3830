package lab

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/hapair/hapair/ctl"
	"github.com/hapair/hapair/roled"
)

// PrimaryDiesDuringRewind (10, issue 17 scenario (b)): nodea, the primary,
// is killed and nodeb takes over; nodea is started again and, while it
// rejoins (Patroni stops it for pg_rewind, or it is still catching up), the
// new primary nodeb is killed on purpose. Nothing can take over: status must
// say why (nodea's own readiness), and the balancer must hold or answer 503,
// never pass a write to a node whose PostgreSQL is not writable. Once nodeb is
// started again the pair recovers without any operator command, and no write
// acknowledged on nodeb's timeline is lost.
func PrimaryDiesDuringRewind(ctx context.Context, l *Lab, r *Result) {
	if !needParts(l, r, BinLB, BinRoled) {
		return
	}
	c := l.Ctl()
	na, _ := c.Cfg.Node(NodeA)
	nb, _ := c.Cfg.Node(NodeB)
	pr, stop := l.startProbes(ctx, 10*time.Millisecond)
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	if !poll(ctx, 10*time.Second, 20*time.Millisecond, func() bool { return steady(pr.probe.Samples(), 4, 100*time.Millisecond) }) {
		r.note("writes not steady before the kill")
	}

	t0 := time.Now()
	if err := l.KillNode(NodeA); err != nil {
		r.fail("kill nodea: %v", err)
		return
	}
	if !poll(ctx, 60*time.Second, 50*time.Millisecond, func() bool { return c.Roled(ctx, nb).Role == "active" }) {
		r.fail("nodeb did not take over within 60s after nodea was killed")
		return
	}
	r.secs("nodea killed → nodeb ACTIVE", time.Since(t0))

	// nodea comes back; kill nodeb while nodea is not ready, at its
	// rewind when Patroni runs one.
	logOff := l.logSize(NodeA, ProcPatroni)
	t1 := time.Now()
	if err := l.StartNode(NodeA); err != nil {
		r.fail("start nodea: %v", err)
		return
	}
	var rd roled.Readiness
	var rewind bool
	var notReadySince time.Time
	found := poll(ctx, 90*time.Second, 25*time.Millisecond, func() bool {
		rewind = strings.Contains(l.logFrom(NodeA, ProcPatroni, logOff), "pg_rewind")
		rn := c.Roled(ctx, na)
		if rn.Error == "" && rn.Readiness != nil {
			rd = *rn.Readiness
		}
		switch {
		case rewind:
			return true
		case rd.Reason == "" || rd.Ready:
			notReadySince = time.Time{}
			return rd.Ready && time.Since(t1) > 30*time.Second // rejoined without a rewind: give up waiting
		case notReadySince.IsZero():
			notReadySince = time.Now()
		}
		// No rewind in sight: kill while nodea is still rejoining.
		return time.Since(notReadySince) > 20*time.Second
	})
	if !found {
		r.fail("nodea neither rewound nor rejoined within 90s: %s", rd.Text())
		return
	}
	r.note("nodea when nodeb was killed, %.1f s after its start: rewind seen in Patroni's log: %v; roled readiness: %s",
		time.Since(t1).Seconds(), rewind, rd.Text())
	if rd.Ready {
		r.note("nodea had not diverged: it was ready again without a rewind, so this run killed nodeb on a redundant pair")
	}
	t2 := time.Now()
	if err := l.KillNode(NodeB); err != nil {
		r.fail("kill nodeb: %v", err)
		return
	}
	// Killing every process of a host takes a while (list them, then kill):
	// a write sent after t2 may still be acknowledged by nodeb before that
	// ends (CI: one at +0.1 s). Writes acknowledged from here on are after
	// the kill.
	killed := time.Now()

	// While nodeb is down: what status says, every 500 ms for 20 s.
	var lastLine string
	var named bool
	var lines []string
	poll(ctx, 20*time.Second, 500*time.Millisecond, func() bool {
		st := c.Status(ctx)
		line := st.Redundancy.Line()
		if line != lastLine {
			lines = append(lines, fmt.Sprintf("+%.1fs %s", time.Since(t2).Seconds(), line))
			lastLine = line
		}
		if st.Redundancy.Level != ctl.Redundant &&
			(strings.Contains(line, "nodea cannot take over") || strings.Contains(line, "nodea: Patroni holds")) {
			named = true
		}
		return false
	})
	r.note("hapairctl status while nodeb is down:\n%s", strings.Join(lines, "\n"))
	if !named {
		r.fail("status never named why nodea cannot take over")
	}

	// nodeb returns; nobody touches anything else.
	t3 := time.Now()
	if err := l.StartNode(NodeB); err != nil {
		r.fail("start nodeb: %v", err)
		return
	}
	var leader string
	if !poll(ctx, 180*time.Second, 250*time.Millisecond, func() bool {
		var err error
		leader, err = c.Leader(ctx)
		return err == nil && leader != "" && l.settledProblem(leader) == ""
	}) {
		r.fail("not recovered by itself within 180s after nodeb was started: %s", l.settledProblem(leader))
		return
	}
	r.secs("nodeb started → settled again (no operator command)", time.Since(t3))
	r.note("nodea's Patroni from its restart on (decisions only):\n%s", patroniDecisions(l.logFrom(NodeA, ProcPatroni, logOff)))
	r.note("primary after recovery: %s", leader)
	// Recovered means redundant again: the other node's roled says it is
	// ready to take over (streaming from the leader's host on its timeline).
	standby, _ := c.Cfg.Node(Other(leader))
	var srd roled.Readiness
	if poll(ctx, 90*time.Second, 250*time.Millisecond, func() bool {
		if rn := c.Roled(ctx, standby); rn.Error == "" && rn.Readiness != nil {
			srd = *rn.Readiness
		}
		return srd.Ready
	}) {
		r.secs("nodeb started → redundant again ("+standby.Name+" ready by its roled)", time.Since(t3))
	} else {
		r.fail("%s not ready to take over within 90s after settling: %s", standby.Name, srd.Text())
	}
	time.Sleep(time.Second) // writes on the recovered pair
	stop()
	stopped = true

	// The balancer never passed a write to a node whose PostgreSQL was not
	// writable: every write acknowledged after nodeb's kill was served by a
	// node whose own write check (every 50 ms, 1 s of slack) had succeeded
	// by then.
	samples := pr.probe.Samples()
	for _, s := range samples {
		if !s.OK || s.Start.Before(t2) || s.End.Before(killed) {
			continue
		}
		if first, ok := pr.pg.FirstOK(s.Node, t2); !ok || s.End.Before(first.Add(-time.Second)) {
			r.fail("write %d acknowledged by %s at +%.1fs, before its PostgreSQL accepted writes", s.ID, s.Node, s.End.Sub(t2).Seconds())
			break
		}
	}
	rep := ctl.Analyze(samples, t0)
	r.note("writes: %s", rep)
	r.fig("failed writes", float64(rep.Failed), "")
	r.secs("total outage", rep.TotalDown)
	if dual, rounds := pr.ha.Dual(); dual > 0 {
		r.fail("checker saw two ACTIVE nodes in %d of %d rounds", dual, rounds)
	}
	a, err := l.AuditSettled(ctx, leader, samples, 30*time.Second)
	if err != nil {
		r.fail("audit could not run: %v", err) // unknown is not "0 lost"
		return
	}
	r.note("audit: %s", a)
	// Rows acknowledged by nodea just before its kill may be lost
	// (asynchronous replication); rows acknowledged on nodeb's timeline,
	// after the first takeover, must all be there.
	lostOnB := 0
	for _, id := range a.LostRows {
		for _, s := range samples {
			if s.ID == id && s.OK && s.Node == NodeB {
				lostOnB++
			}
		}
	}
	r.fig("acknowledged rows lost", float64(len(a.LostRows)), "")
	r.fig("acknowledged rows of nodeb's timeline lost", float64(lostOnB), "")
	if lostOnB > 0 {
		r.fail("%d writes acknowledged by nodeb (the surviving timeline) lost", lostOnB)
	}
	if len(a.LostRows)-lostOnB > 3 {
		r.fail("%d writes acknowledged by nodea lost at its kill (async replication allows a handful)", len(a.LostRows)-lostOnB)
	}
	var hb bytes.Buffer
	if evs, err := c.History(ctx); err == nil {
		_ = ctl.WriteHistory(&hb, evs[max(0, len(evs)-3):])
		r.note("hapairctl history (last 3):\n%s", hb.String())
	}
}

// logSize is the current size of a lab log.
func (l *Lab) logSize(host, proc string) int64 {
	st, err := os.Stat(l.path("log", host+"."+proc+".log"))
	if err != nil {
		return 0
	}
	return st.Size()
}

// logFrom returns a lab log from byte off on (at most 1 MiB).
func (l *Lab) logFrom(host, proc string, off int64) string {
	f, err := os.Open(l.path("log", host+"."+proc+".log"))
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	return string(b)
}

// patroniDecisions keeps the lines of a Patroni log that say what it
// decided (rewind, leader race, promotion, lag), not its routine loop.
func patroniDecisions(log string) string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		low := strings.ToLower(line)
		for _, k := range []string{"rewind", "promot", "leader lock", "healthiest", "lag", "failover", "timeline", "acquired", "demot"} {
			if strings.Contains(low, k) {
				out = append(out, line)
				break
			}
		}
	}
	if len(out) > 60 {
		out = out[len(out)-60:]
	}
	return strings.Join(out, "\n")
}
