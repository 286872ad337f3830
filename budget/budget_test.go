package budget

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/config"
)

const (
	ms = time.Millisecond
	s  = time.Second
)

// TestDerive: target → every derived timer. The 6.5 s row is worked by
// hand in the README's timing section.
func TestDerive(t *testing.T) {
	type want struct {
		ttl, loop, retry, hb, el, lease, margin, ka, poll, pto, ci, ct, hold, syncMax time.Duration
	}
	for _, tc := range []struct {
		target time.Duration
		want   want
	}{
		{6500 * ms, want{5 * s, 1 * s, 2 * s, 54 * ms, 540 * ms, 3 * s, 600 * ms, 800 * ms, 250 * ms, 1 * s, 320 * ms, 250 * ms, 12 * s, 3200 * ms}},
		{10 * s, want{8 * s, 1 * s, 3 * s, 83 * ms, 830 * ms, 5 * s, 1 * s, 1 * s, 500 * ms, 1 * s, 500 * ms, 400 * ms, 16 * s, 5 * s}},
		{30 * s, want{30 * s, 6 * s, 12 * s, 100 * ms, 1 * s, 5 * s, 1 * s, 1 * s, 500 * ms, 1 * s, 1 * s, 800 * ms, 39 * s, 10 * s}},
	} {
		t.Run(tc.target.String(), func(t *testing.T) {
			p, err := Derive(tc.target)
			if err != nil {
				t.Fatal(err)
			}
			x := p.Timers
			got := want{x.PatroniTTL, x.PatroniLoopWait, x.PatroniRetryTimeout, x.EtcdHeartbeat, x.EtcdElection,
				x.LeaseTTL, x.SafetyMargin, x.KeepAliveInterval, x.PollInterval, x.PatroniTimeout,
				x.CheckInterval, x.CheckTimeout, x.HoldTimeout, x.SyncRetryMax}
			if got != tc.want {
				t.Errorf("Derive(%s):\n got %+v\nwant %+v", tc.target, got, tc.want)
			}
			if x.CheckFall != 2 || x.CheckRise != 2 || !x.FastPath {
				t.Errorf("fall/rise/fast path %d/%d/%v, want 2/2/true", x.CheckFall, x.CheckRise, x.FastPath)
			}
			if err := Check(x); err != nil {
				t.Errorf("derived timers break a rule: %v", err)
			}
			limit := time.Duration(float64(tc.target) * WorstFactor)
			for _, o := range p.Outages {
				if o.Outside == "" && (o.Typical > tc.target || o.Worst > limit) {
					t.Errorf("%s: typical %s worst %s, target %s (worst ≤ %s)", o.Fault, o.Typical, o.Worst, tc.target, limit)
				}
				var sum time.Duration
				for _, st := range o.Steps {
					sum += st.Worst
					if st.Typical > st.Worst {
						t.Errorf("%s %s: typical %s above worst %s", o.Fault, st.Stage, st.Typical, st.Worst)
					}
				}
				if sum != o.Worst {
					t.Errorf("%s: steps add to %s, total says %s", o.Fault, sum, o.Worst)
				}
			}
		})
	}
}

// TestDeriveLowest checks the hand-worked arithmetic of a kill at 6.5 s and
// the lowest target accepted.
func TestDeriveLowest(t *testing.T) {
	if got := Lowest(); got != 6500*ms {
		t.Errorf("Lowest() = %s, want 6.5s", got)
	}
	p, err := Derive(6500 * ms)
	if err != nil {
		t.Fatal(err)
	}
	kill := p.Outages[0]
	if kill.Fault != FaultKill {
		t.Fatalf("first outage %s, want the kill", kill.Fault)
	}
	// detection 5 − 0.5 + 0.25; decision 0.1; promotion 0.5 + 0.025 + 0.1; routing 0.02
	if kill.Typical != 5495*ms {
		t.Errorf("kill typical %s, want 5.495s", kill.Typical)
	}
	// detection 5 + 0.5 + 3 × 0.54; decision 0.3; promotion 1 + 0.25 + 0.05 + 0.1; routing 0.02 + 0.25
	if kill.Worst != 9090*ms {
		t.Errorf("kill worst %s, want 9.09s", kill.Worst)
	}
	if b := p.Binding(); b.Fault != FaultPartition {
		t.Errorf("binding fault %s, want the partition (its checks route when the fast path is cut)", b.Fault)
	}
}

// TestHostDeath: a dead host is a kill plus Patroni's fixed member probe;
// it is shown outside the target (no timer shortens the probe), it never
// binds a plan, and the balancer's hold outlasts its worst case.
func TestHostDeath(t *testing.T) {
	for _, target := range []time.Duration{6500 * ms, 10 * s, 30 * s} {
		p, err := Derive(target)
		if err != nil {
			t.Fatal(err)
		}
		var kill, death Outage
		for _, o := range p.Outages {
			switch o.Fault {
			case FaultKill:
				kill = o
			case FaultHostDeath:
				death = o
			}
		}
		if death.Fault != FaultHostDeath || death.Outside == "" {
			t.Fatalf("%s: host death %+v, want it in the arithmetic, outside the target", target, death)
		}
		if death.Typical != kill.Typical+MemberProbe || death.Worst != kill.Worst+MemberProbe {
			t.Errorf("%s: host death %s / %s, want the kill's %s / %s + %s", target, death.Typical, death.Worst, kill.Typical, kill.Worst, MemberProbe)
		}
		if p.Timers.HoldTimeout <= death.Worst {
			t.Errorf("%s: hold-timeout %s does not outlast a host death's worst %s", target, p.Timers.HoldTimeout, death.Worst)
		}
		if p.Binding().Fault == FaultHostDeath {
			t.Errorf("%s: the host death binds the plan", target)
		}
	}
	// At 6.5 s the host death's typical (7.5 s) is above the target: the
	// plan still meets it, because the probe's 2 s are no timer's.
	if p, err := Derive(6500 * ms); err != nil || !p.Meets() {
		t.Errorf("Derive(6.5s) = %v, meets %v: want accepted", err, p.Meets())
	}
}

func TestDeriveRefused(t *testing.T) {
	for _, tc := range []struct {
		target time.Duration
		reason Reason
	}{
		{0, ReasonNotPositive},
		{-time.Second, ReasonNotPositive},
		{time.Second, ReasonTooFast},
		{4500 * ms, ReasonTooFast},
		{5 * s, ReasonTooFast},
		{6200 * ms, ReasonTooFast},
		{11 * time.Minute, ReasonTooSlow},
	} {
		_, err := Derive(tc.target)
		var re *RefusedError
		if !errors.As(err, &re) || re.Reason != tc.reason {
			t.Errorf("Derive(%s) = %v, want refusal %s", tc.target, err, tc.reason)
			continue
		}
		if tc.reason == ReasonTooFast && (re.Closest == nil || re.Closest.Timers.PatroniTTL != minTTL ||
			!strings.Contains(err.Error(), "ttl 5s")) {
			t.Errorf("Derive(%s): refusal does not show the fastest safe plan: %v", tc.target, err)
		}
	}
}

// TestDefaultsArithmetic: today's shipped timers explain the lab's kill
// figures (9.1 s on a quiet machine, 10–16 s loaded).
func TestDefaultsArithmetic(t *testing.T) {
	kill := Arithmetic(Defaults())[0]
	if kill.Typical < 9*s || kill.Typical > 11*s || kill.Worst < 14*s || kill.Worst > 17*s {
		t.Errorf("defaults: kill typical %s worst %s, want about 10 s / 15 s", kill.Typical, kill.Worst)
	}
	if err := Check(Defaults()); err != nil {
		t.Errorf("defaults break a rule: %v", err)
	}
}

// TestCheck: hand-set combinations → the broken rule and the field named.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		set   func(*Timers)
		rule  Rule
		field string
	}{
		{"ttl not whole seconds", func(x *Timers) { x.PatroniTTL = 3500 * ms }, RulePatroniSeconds, "ttl"},
		{"retry_timeout below 2 s", func(x *Timers) { x.PatroniRetryTimeout = 1 * s }, RulePatroniRetry, "retry_timeout"},
		{"ttl that Patroni 3.2 raises", func(x *Timers) { x.PatroniVersion = "3.2.2" }, RulePatroniFloor, "ttl"},
		{"retry_timeout that Patroni 4 raises", func(x *Timers) {
			x.PatroniVersion, x.PatroniTTL, x.PatroniRetryTimeout, x.EtcdElection, x.EtcdHeartbeat = "patroni 4.0.4", 20*s, 2*s, 900*ms, 90*ms
		}, RulePatroniFloor, "retry_timeout"},
		{"loop_wait + 2 × retry above ttl", func(x *Timers) { x.PatroniRetryTimeout = 5 * s }, RulePatroniLoop, "ttl"},
		{"lease longer than ttl", func(x *Timers) { x.LeaseTTL = 12 * s; x.SafetyMargin = 2 * s; x.KeepAliveInterval = 2 * s },
			RuleLeaseBelowTTL, "lease-ttl"},
		{"lease − margin reaches ttl − loop_wait", func(x *Timers) { x.LeaseTTL = 9 * s }, RuleLeaseBelowTTL, "lease-ttl"},
		{"lease not below ttl, loop_wait unknown", func(x *Timers) { x.PatroniLoopWait = 0; x.PatroniRetryTimeout = 0; x.LeaseTTL = 10 * s },
			RuleLeaseBelowTTL, "lease-ttl"},
		{"keepalive too slow", func(x *Timers) { x.KeepAliveInterval = 3 * s }, RuleKeepAlive, "keepalive-interval"},
		{"patroni timeout outlasts the deadline", func(x *Timers) { x.PatroniTimeout = 4 * s }, RuleRoledCalls, "patroni.timeout"},
		{"postgres timeout outlasts the deadline", func(x *Timers) { x.PostgresTimeout = 5 * s }, RuleRoledCalls, "postgres.timeout"},
		{"frozen Patroni noticed too late", func(x *Timers) {
			x.PatroniTTL, x.PatroniLoopWait, x.PatroniRetryTimeout = 5*s, 1*s, 2*s
			x.LeaseTTL, x.SafetyMargin, x.KeepAliveInterval, x.EtcdElection, x.EtcdHeartbeat = 2*s, 500*ms, 500*ms, 400*ms, 40*ms
			x.PatroniTimeout, x.PostgresTimeout, x.PollInterval, x.CheckInterval = 700*ms, 700*ms, 3500*ms, 250*ms
		}, RuleFrozenPatroni, "patroni.poll-interval"},
		{"election below 10 heartbeats", func(x *Timers) { x.EtcdElection = 500 * ms }, RuleEtcdElection, "election-timeout"},
		{"election outlasts retry_timeout", func(x *Timers) { x.EtcdElection = 1500 * ms }, RuleElectionVsRetry, "election-timeout"},
		{"check timeout not below interval", func(x *Timers) { x.CheckTimeout = x.CheckInterval }, RuleCheckTimeout, "check.timeout"},
		{"check interval × fall above hold-timeout", func(x *Timers) { x.CheckFall = 6 }, RuleCheckVsHold, "check.interval"},
		{"check interval × fall above ttl − loop_wait", func(x *Timers) { x.HoldTimeout = 0; x.CheckFall = 9 }, RuleCheckVsTTL, "check.interval"},
		{"sync retry-min above retry-max", func(x *Timers) { x.SyncRetryMin = 20 * s }, RuleSyncRetry, "sync.retry-max"},
		{"quorum-loss-after reaches the deadline", func(x *Timers) { x.QuorumLossAfter = 4 * s }, RuleQuorumLoss, "quorum-loss-after"},
		{"quorum probe slower than a third", func(x *Timers) { x.QuorumCheckInterval = 300 * ms }, RuleQuorumCheck, "quorum-check-interval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := Defaults()
			tc.set(&x)
			err := Check(x)
			var v *Violation
			if !errors.As(err, &v) {
				t.Fatalf("Check = %v, want a violation of %s", err, tc.rule)
			}
			if v.Rule != tc.rule || v.Err.Field != tc.field {
				t.Errorf("Check = %v (rule %s, field %q), want rule %s naming %q", err, v.Rule, v.Err.Field, tc.rule, tc.field)
			}
			if !config.IsConfigError(err) {
				t.Errorf("%v is not a configuration error (binaries would not exit 2)", err)
			}
		})
	}
}

// TestFloorsFor: Patroni 3.2.0 and later raise ttl and retry_timeout
// (patroni/config.py _validate_and_adjust_timeouts; its 3.2.2 code, given
// 5/1/2, runs 20/1/3); earlier releases run what they are given, and the
// floors are hapair's own rules.
func TestFloorsFor(t *testing.T) {
	for _, tc := range []struct {
		in               string
		ttl, loop, retry time.Duration
		raises           bool
		release          string
	}{
		{"3.0.2", 5 * s, 1 * s, 2 * s, false, "3.0.2"},
		{"patroni 3.1.2", 5 * s, 1 * s, 2 * s, false, "3.1.2"},
		{"3.2.0", 20 * s, 1 * s, 3 * s, true, "3.2.0"},
		{"v3.2.2", 20 * s, 1 * s, 3 * s, true, "3.2.2"},
		{"patroni 4.0.4\n", 20 * s, 1 * s, 3 * s, true, "4.0.4"},
		{"3.3", 20 * s, 1 * s, 3 * s, true, "3.3.0"},
		{"2.1.7", 5 * s, 1 * s, 2 * s, false, "2.1.7"},
		{"__main__.py 3.2.2", 20 * s, 1 * s, 3 * s, true, "3.2.2"}, // python3 -m patroni --version
	} {
		f, err := FloorsFor(tc.in)
		if err != nil {
			t.Errorf("FloorsFor(%q): %v", tc.in, err)
			continue
		}
		if f.TTL != tc.ttl || f.LoopWait != tc.loop || f.Retry != tc.retry || f.Raises != tc.raises || f.Release != tc.release {
			t.Errorf("FloorsFor(%q) = %+v, want %s/%s/%s raises %v release %s", tc.in, f, tc.ttl, tc.loop, tc.retry, tc.raises, tc.release)
		}
	}
	for _, bad := range []string{"", "x", "3", "3.x.1", "1.2.3.4", "-1.2.3"} {
		if _, err := FloorsFor(bad); err == nil {
			t.Errorf("FloorsFor(%q) accepted", bad)
		}
	}
}

// TestDeriveForPatroni: a plan for a release that raises low timers never
// sets them, and the targets it cannot reach are refused with the
// release's fastest plan.
func TestDeriveForPatroni(t *testing.T) {
	p, err := DeriveFor(6500*ms, DefaultPatroni)
	if err != nil || p.Timers.PatroniVersion != "3.0.2" || p.Timers.PatroniTTL != 5*s {
		t.Errorf("DeriveFor(6.5s, 3.0.2) = ttl %s version %q, %v; want Derive's plan", p.Timers.PatroniTTL, p.Timers.PatroniVersion, err)
	}
	_, err = DeriveFor(6500*ms, "3.2.2")
	var re *RefusedError
	if !errors.As(err, &re) || re.Reason != ReasonTooFast || re.Closest.Timers.PatroniTTL != 20*s {
		t.Fatalf("DeriveFor(6.5s, 3.2.2) = %v, want too-fast with ttl 20s the closest", err)
	}
	if !strings.Contains(err.Error(), "Patroni 3.2.2") {
		t.Errorf("refusal %q does not name the release", err)
	}
	// ttl 20 / loop_wait 4: the typical kill is 20 − 2 + 0.25 + 0.745 s.
	low := LowestFor("3.2.2")
	if low != 19*s {
		t.Errorf("LowestFor(3.2.2) = %s, want 19s", low)
	}
	for _, target := range []time.Duration{low, 30 * s, time.Minute} {
		p, err := DeriveFor(target, "3.2.2")
		if err != nil {
			t.Fatalf("DeriveFor(%s, 3.2.2): %v", target, err)
		}
		x := p.Timers
		if x.PatroniTTL < 20*s || x.PatroniRetryTimeout < 3*s || x.PatroniVersion != "3.2.2" {
			t.Errorf("DeriveFor(%s, 3.2.2) = %s/%s/%s %q: below the release's floors", target, x.PatroniTTL, x.PatroniLoopWait, x.PatroniRetryTimeout, x.PatroniVersion)
		}
		if err := Check(x); err != nil {
			t.Errorf("DeriveFor(%s, 3.2.2) breaks a rule: %v", target, err)
		}
	}
	// The arithmetic of hand-set timers speaks of what the release runs.
	x := Defaults()
	x.PatroniVersion = "3.2.2"
	if k, k0 := Arithmetic(x)[0], Arithmetic(Defaults())[0]; k.Typical != k0.Typical+10*s {
		t.Errorf("kill on Patroni 3.2.2 with ttl 10 set: typical %s, want %s + 10s (it runs ttl 20)", k.Typical, k0.Typical)
	}
	if _, err := DeriveFor(30*s, "latest"); err == nil {
		t.Error("DeriveFor with an unreadable version accepted")
	}
}

// TestCheckPartial: a binary checks only what its own file sets.
func TestCheckPartial(t *testing.T) {
	lb := Timers{CheckInterval: time.Second, CheckTimeout: 500 * ms, CheckFall: 6, HoldTimeout: 5 * s,
		Names: map[Key]string{CheckInterval: "backends[1].check.interval"}}
	err := Check(lb)
	var v *Violation
	if !errors.As(err, &v) || v.Rule != RuleCheckVsHold || v.Err.Field != "backends[1].check.interval" {
		t.Errorf("lb-only check = %v, want check-within-hold naming backends[1].check.interval", err)
	}
	if err := Check(Timers{LeaseTTL: 20 * s}); err != nil {
		t.Errorf("a lease alone breaks nothing: %v", err)
	}
	lb.HoldTimeout = 0 // hold disabled: no hold to outlast
	if err := Check(lb); err != nil {
		t.Errorf("hold disabled: %v", err)
	}
}

// TestFileRoundTrip: plan --json's output reads back to the same timers,
// and a hand-edited file's error names its section.
func TestFileRoundTrip(t *testing.T) {
	p, err := Derive(6500 * ms)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(p.File())
	if err != nil {
		t.Fatal(err)
	}
	var f File
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	back, err := f.Timers("plan.json")
	if err != nil {
		t.Fatal(err)
	}
	back.Names = nil
	if !reflect.DeepEqual(back, p.Timers) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, p.Timers)
	}
	f.Roled.LeaseTTL = Duration(5 * s)
	x, _ := f.Timers("plan.json")
	var v *Violation
	if err := Check(x); !errors.As(err, &v) || v.Err.Field != "plan.json: roled.lease-ttl" {
		t.Errorf("edited lease: %v, want an error naming plan.json: roled.lease-ttl", err)
	}
	if !strings.Contains(string(b), `"ttl":5`) || !strings.Contains(string(b), `"lease-ttl":"3s"`) {
		t.Errorf("json lacks Patroni's ttl in seconds or roled's lease: %s", b)
	}
}
