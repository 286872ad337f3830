package lab

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hapair/hapair/ctl"
)

// soakSamples: one write every 100 ms from t0 for n, failing in the given
// [from, to) millisecond ranges.
func soakSamples(t0 time.Time, n int, fail ...[2]int) []ctl.Sample {
	var out []ctl.Sample
	for ms := 0; ms < n; ms += 100 {
		ok := true
		for _, f := range fail {
			if ms >= f[0] && ms < f[1] {
				ok = false
			}
		}
		s := ctl.Sample{ID: int64(ms), Start: t0.Add(time.Duration(ms) * time.Millisecond),
			End: t0.Add(time.Duration(ms+10) * time.Millisecond), OK: ok, Node: "nodeb"}
		out = append(out, s)
	}
	return out
}

func TestServedAgain(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// Two outages inside the fault's window: served again after the last.
	ss := soakSamples(t0, 10000, [2]int{1000, 2000}, [2]int{3000, 3500})
	if d, ok := servedAgain(ss, at(500), at(6000)); !ok || d != 3010*time.Millisecond {
		t.Errorf("served again = %v %v, want 3.01s", d, ok)
	}
	// No failed write in the window: served throughout.
	if d, ok := servedAgain(ss, at(4000), at(6000)); !ok || d != 0 {
		t.Errorf("no failure: %v %v", d, ok)
	}
	// A write sent just before the next fault (at 6 s) and failed by it
	// belongs to that fault, not to this one.
	late := soakSamples(t0, 10000, [2]int{1000, 2000})
	late = append(late, ctl.Sample{ID: 99, Start: at(5990), End: at(7000), OK: false, Node: "nodeb"})
	if d, ok := servedAgain(late, at(500), at(6000)); !ok || d != 1510*time.Millisecond {
		t.Errorf("write failed after the window: served again = %v %v, want 1.51s", d, ok)
	}
	// The last write failed: never served again.
	if _, ok := servedAgain(soakSamples(t0, 2000, [2]int{1500, 2000}), at(1000), at(3000)); ok {
		t.Error("served again without a successful write after the failure")
	}
}

func TestSummarizeFaults(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	ss := soakSamples(t0, 100000, [2]int{10000, 22000}, [2]int{40000, 55000}, [2]int{70000, 71000})
	runs := []soakFaultRun{
		{Kind: "node kill", Began: at(10), Repaired: at(25), Redundant: at(40)},
		{Kind: "witness kill", Began: at(30), Repaired: at(40), Redundant: at(41)},
		{Kind: "node kill", Began: at(40), Repaired: at(55), Redundant: at(70)},
		{Kind: "node kill", Began: at(69), Repaired: at(84), Stuck: "not settled"},
	}
	ks := summarizeFaults(runs, ss, map[int64]bool{9900: true, 40000: true, 41000: true}, at(100))
	if len(ks) != 2 || ks[0].Kind != "node kill" || ks[1].Kind != "witness kill" {
		t.Fatalf("kinds %+v", ks)
	}
	k := ks[0]
	if k.N != 3 || k.Stuck != 1 || k.NotRedundant != 1 || k.NotServed != 0 || k.LostRows != 2 {
		t.Errorf("node kill: %+v", k)
	}
	// Served again 12.01 s, 15.01 s and 2.01 s after each kill's start:
	// median 12.01, max 15.01; redundant 30 s and 30 s.
	if med, mx, _ := medianMax(k.Served); med != 12010*time.Millisecond || mx != 15010*time.Millisecond {
		t.Errorf("served again median %v max %v", med, mx)
	}
	if med, mx, _ := medianMax(k.Redundant); med != 30*time.Second || mx != 30*time.Second {
		t.Errorf("redundant median %v max %v", med, mx)
	}
	if w := ks[1]; len(w.Served) != 1 || w.Served[0] != 0 || w.Redundant[0] != 11*time.Second {
		t.Errorf("witness kill: %+v", w)
	}
	if _, _, ok := medianMax(nil); ok {
		t.Error("median of nothing")
	}
}

// The summary tells the truth: total, longest and number of outages as its
// headline; an audit that cannot run is unknown and fails the soak; a fault
// that did not settle is named with status's words and fails it.
func TestWriteSoakSummary(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	ss := soakSamples(t0, 60000, [2]int{10000, 22000}, [2]int{40000, 45000})
	base := soakResult{Planned: time.Minute, Ran: time.Minute, Start: t0, End: at(60), Samples: ss, Rounds: 6000,
		Leader: NodeB, Audit: Audit{Acked: len(ss) - 170},
		Runs: []soakFaultRun{{Kind: "node kill", Target: NodeA, Began: at(10), Repaired: at(25), Redundant: at(40)},
			{Kind: "partition", Target: NodeB, Began: at(40), Repaired: at(55), Redundant: at(58)}}}
	var buf bytes.Buffer
	if err := writeSoakSummary(&buf, base); err != nil {
		t.Fatalf("healthy soak failed: %v\n%s", err, buf.String())
	}
	out := buf.String()
	for _, want := range []string{
		"outages through the balancer: 17.0 s in all, longest 12.0 s, 2 outage(s)",
		"faults injected: 2 (1 node kill, 1 partition)",
		"node kill        1  12.0 s / 12.0 s",
		"served again 12.0 s, redundant 30.0 s, acknowledged rows lost 0",
		"bounds: after each fault's repair, settled",
		"audit on nodeb: ", "result: PASS",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}

	r := base
	r.Audit, r.AuditErr = Audit{}, errors.New("FATAL: the database system is starting up")
	buf.Reset()
	if err := writeSoakSummary(&buf, r); err == nil || !strings.Contains(buf.String(), "audit on nodeb: unknown (could not run: FATAL: the database system is starting up)") ||
		strings.Contains(buf.String(), "0 rows lost") || strings.Contains(buf.String(), "rows lost 0") ||
		!strings.Contains(buf.String(), "acknowledged rows lost unknown") {
		t.Errorf("audit that could not run: %v\n%s", err, buf.String())
	}

	r = base
	r.Runs = append([]soakFaultRun(nil), base.Runs...)
	r.Runs[1].Redundant = time.Time{}
	r.Runs[1].Stuck = "not settled within 2m0s; hapairctl status: NOT SERVING — nodea: Patroni holds the leader key but PostgreSQL has not accepted writes for 42 s (in standby mode, waiting for WAL)"
	buf.Reset()
	err := writeSoakSummary(&buf, r)
	if err == nil || !strings.Contains(err.Error(), "not settled after the partition at +0m40s") ||
		!strings.Contains(buf.String(), "NOT SETTLED: not settled within 2m0s; hapairctl status: NOT SERVING — nodea: Patroni holds the leader key") ||
		!strings.Contains(buf.String(), "still not settled at the soak's planned end") {
		t.Errorf("unsettled fault: %v\n%s", err, buf.String())
	}

	r = base
	r.LeaderErr = errors.New("no primary")
	buf.Reset()
	if err := writeSoakSummary(&buf, r); err == nil || !strings.Contains(buf.String(), "audit: unknown (no Patroni leader to audit on: no primary)") {
		t.Errorf("no leader: %v\n%s", err, buf.String())
	}
}
