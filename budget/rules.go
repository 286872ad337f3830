package budget

import (
	"fmt"
	"time"

	"github.com/hapair/hapair/internal/config"
)

// Rule is one relation between timers that a combination must keep.
type Rule uint8

// The rules, each with the failure it prevents.
const (
	// RulePatroniSeconds: Patroni reads ttl, loop_wait and retry_timeout as
	// whole seconds, at least 1 (a fraction would be cut off silently).
	RulePatroniSeconds Rule = iota + 1
	// RulePatroniRetry: retry_timeout ≥ 2 s. Patroni's etcd3 client (3.0.2,
	// patroni/dcs/etcd3.py attempt_to_acquire_leader) refreshes its lease
	// and then refuses to try for the leader key with less than 1 s of
	// retry_timeout left: at 1 s a replica never takes over (the lab's kill
	// at ttl 3 / retry_timeout 1: no leader for a minute).
	RulePatroniRetry
	// RulePatroniFloor: the Patroni release runs ttl, loop_wait and
	// retry_timeout as set (FloorsFor): from 3.2.0 on it raises ttl below
	// 20 s and retry_timeout below 3 s, and the arithmetic, the hold and
	// hapairctl status would speak of timers it does not run.
	RulePatroniFloor
	// RulePatroniLoop: loop_wait + 2 × retry_timeout ≤ ttl, so a primary
	// that cannot reach etcd demotes itself before its key can expire.
	RulePatroniLoop
	// RuleLeaseBelowTTL: lease-ttl − safety-margin < ttl − loop_wait (or
	// lease-ttl < ttl when loop_wait is not known): an isolated roled gives
	// up ACTIVE before Patroni's leader key can move to the peer.
	RuleLeaseBelowTTL
	// RuleKeepAlive: 2 × keepalive-interval ≤ lease-ttl − safety-margin, so
	// one lost keep-alive is survived.
	RuleKeepAlive
	// RuleRoledCalls: patroni.timeout and postgres.timeout below lease-ttl −
	// safety-margin: one slow call must not outlast the local deadline.
	RuleRoledCalls
	// RuleFrozenPatroni: patroni.poll-interval + patroni.timeout < ttl −
	// loop_wait: a frozen Patroni (its PostgreSQL still writable) makes
	// roled PASSIVE before the peer can be promoted.
	RuleFrozenPatroni
	// RuleEtcdElection: election-timeout ≥ 10 × heartbeat-interval (etcd's
	// tuning guide; below it a busy member starts needless elections).
	RuleEtcdElection
	// RuleElectionVsRetry: 2 × election-timeout < retry_timeout: an etcd
	// leader election (up to two election timeouts) must end within
	// Patroni's retries, or a healthy primary demotes (a false failover).
	RuleElectionVsRetry
	// RuleCheckTimeout: check.timeout < check.interval (checks never overlap).
	RuleCheckTimeout
	// RuleCheckVsHold: check.interval × check.fall < hold-timeout (when the
	// hold is on): requests held while the old ACTIVE is being marked down
	// are still answered instead of timing out.
	RuleCheckVsHold
	// RuleCheckVsTTL: check.interval × check.fall < ttl − loop_wait: the
	// balancer has marked a dead ACTIVE down before Patroni can move.
	RuleCheckVsTTL
	// RuleSyncRetry: sync.retry-min ≤ sync.retry-max.
	RuleSyncRetry
	// RuleQuorumLoss: quorum-loss-after < lease-ttl − safety-margin: the
	// quorum check comes first, the lease deadline stays the last line.
	RuleQuorumLoss
	// RuleQuorumCheck: 3 × quorum-check-interval ≤ quorum-loss-after. The
	// probes overlap (roled runProbes), so a healthy node's proof is at
	// most one interval plus one read's latency old: at a third, a read
	// slower than two intervals is survived.
	RuleQuorumCheck
)

var ruleNames = map[Rule]string{
	RulePatroniSeconds:  "patroni-whole-seconds",
	RulePatroniRetry:    "patroni-retry-2s",
	RulePatroniFloor:    "patroni-release-floor",
	RulePatroniLoop:     "patroni-loop",
	RuleLeaseBelowTTL:   "lease-below-ttl",
	RuleKeepAlive:       "keepalive",
	RuleRoledCalls:      "roled-call-timeouts",
	RuleFrozenPatroni:   "frozen-patroni",
	RuleEtcdElection:    "etcd-election",
	RuleElectionVsRetry: "election-within-retry",
	RuleCheckTimeout:    "check-timeout",
	RuleCheckVsHold:     "check-within-hold",
	RuleCheckVsTTL:      "check-within-ttl",
	RuleSyncRetry:       "sync-retry",
	RuleQuorumLoss:      "quorum-before-deadline",
	RuleQuorumCheck:     "quorum-check-interval",
}

func (r Rule) String() string {
	if n, ok := ruleNames[r]; ok {
		return n
	}
	return fmt.Sprintf("rule(%d)", uint8(r))
}

// Violation is a broken rule. It unwraps to the *config.FieldError naming
// the field, so every binary reports it (and exits) like any other
// configuration error.
type Violation struct {
	Rule Rule
	Err  *config.FieldError
}

func (v *Violation) Error() string { return v.Err.Error() + " [" + v.Rule.String() + "]" }

// Unwrap returns the field error.
func (v *Violation) Unwrap() error { return v.Err }

func (t Timers) violation(r Rule, k Key, value any, format string, args ...any) *Violation {
	return &Violation{Rule: r, Err: &config.FieldError{Field: t.Name(k), Value: value, Msg: fmt.Sprintf(format, args...)}}
}

// Check returns the first broken rule, or nil. Rules whose timers are not
// all known are skipped: each binary checks what its own file sets, and
// hapairctl plan --check every file together.
func Check(t Timers) error {
	if vs := Violations(t); len(vs) > 0 {
		return vs[0]
	}
	return nil
}

// Violations returns every broken rule, in the order of the Rule constants.
func Violations(t Timers) []*Violation {
	var out []*Violation
	add := func(v *Violation) {
		if v != nil {
			out = append(out, v)
		}
	}
	for _, k := range []Key{PatroniTTL, PatroniLoopWait, PatroniRetryTimeout} {
		if d, ok := t.get(k); ok && (d < time.Second || d%time.Second != 0) {
			add(t.violation(RulePatroniSeconds, k, d, "Patroni takes whole seconds, at least 1s"))
		}
	}
	ttl, okTTL := t.get(PatroniTTL)
	loop, okLoop := t.get(PatroniLoopWait)
	retry, okRetry := t.get(PatroniRetryTimeout)
	if okRetry && retry >= time.Second && retry < minRetry {
		add(t.violation(RulePatroniRetry, PatroniRetryTimeout, retry,
			"must be at least %s: Patroni's etcd3 client will not try for the leader key with less than 1 s of it left after refreshing its lease, so a replica would never take over", minRetry))
	}
	out = append(out, t.floorViolations()...)
	if okTTL && okLoop && okRetry && loop+2*retry > ttl {
		add(t.violation(RulePatroniLoop, PatroniTTL, ttl,
			"must be at least %s + 2 × %s (%s): a primary cut off from etcd must demote before its key expires",
			t.Name(PatroniLoopWait), t.Name(PatroniRetryTimeout), loop+2*retry))
	}
	lease, okLease := t.get(LeaseTTL)
	margin, okMargin := t.get(SafetyMargin)
	if okLease && okTTL {
		switch {
		case okLoop && okMargin && lease-margin >= ttl-loop:
			add(t.violation(RuleLeaseBelowTTL, LeaseTTL, lease,
				"%s − %s (%s) must be below Patroni's ttl − loop_wait (%s): roled must give up ACTIVE before the leader key can move",
				t.Name(LeaseTTL), t.Name(SafetyMargin), lease-margin, ttl-loop))
		case !okLoop && lease >= ttl:
			add(t.violation(RuleLeaseBelowTTL, LeaseTTL, lease,
				"must be below Patroni's ttl (%s = %s): roled must give up ACTIVE before the leader key can move", t.Name(PatroniTTL), ttl))
		}
	}
	if ka, ok := t.get(KeepAliveInterval); ok && okLease && okMargin && 2*ka > lease-margin {
		add(t.violation(RuleKeepAlive, KeepAliveInterval, ka,
			"must be at most half of %s − %s (%s), so one lost keep-alive is survived", t.Name(LeaseTTL), t.Name(SafetyMargin), lease-margin))
	}
	for _, k := range []Key{PatroniTimeout, PostgresTimeout} {
		if d, ok := t.get(k); ok && okLease && okMargin && d >= lease-margin {
			add(t.violation(RuleRoledCalls, k, d, "must be below %s − %s (%s): one slow call must not outlast the local deadline",
				t.Name(LeaseTTL), t.Name(SafetyMargin), lease-margin))
		}
	}
	poll, okPoll := t.get(PollInterval)
	pto, okPTO := t.get(PatroniTimeout)
	if okPoll && okPTO && okTTL && okLoop && poll+pto >= ttl-loop {
		add(t.violation(RuleFrozenPatroni, PollInterval, poll,
			"%s + %s (%s) must be below Patroni's ttl − loop_wait (%s): a frozen Patroni must make roled PASSIVE before the peer is promoted",
			t.Name(PollInterval), t.Name(PatroniTimeout), poll+pto, ttl-loop))
	}
	hb, okHB := t.get(EtcdHeartbeat)
	el, okEl := t.get(EtcdElection)
	if okHB && okEl && el < 10*hb {
		add(t.violation(RuleEtcdElection, EtcdElection, el, "must be at least 10 × %s (%s)", t.Name(EtcdHeartbeat), 10*hb))
	}
	if okEl && okRetry && 2*el >= retry {
		add(t.violation(RuleElectionVsRetry, EtcdElection, el,
			"2 × %s (%s) must be below Patroni's retry_timeout (%s): an etcd election must end before a healthy primary gives up and demotes",
			t.Name(EtcdElection), 2*el, retry))
	}
	ci, okCI := t.get(CheckInterval)
	ct, okCT := t.get(CheckTimeout)
	fall, okFall := t.get(CheckFall)
	if okCI && okCT && ct >= ci {
		add(t.violation(RuleCheckTimeout, CheckTimeout, ct, "must be below %s (%s)", t.Name(CheckInterval), ci))
	}
	if hold, ok := t.get(HoldTimeout); ok && okCI && okFall && ci*fall >= hold {
		add(t.violation(RuleCheckVsHold, CheckInterval, ci,
			"%s × %s (%s) must be below %s (%s): requests held while the old ACTIVE is marked down must not time out first",
			t.Name(CheckInterval), t.Name(CheckFall), ci*fall, t.Name(HoldTimeout), hold))
	}
	if okCI && okFall && okTTL && okLoop && ci*fall >= ttl-loop {
		add(t.violation(RuleCheckVsTTL, CheckInterval, ci,
			"%s × %s (%s) must be below Patroni's ttl − loop_wait (%s): the balancer must mark a dead ACTIVE down before Patroni moves",
			t.Name(CheckInterval), t.Name(CheckFall), ci*fall, ttl-loop))
	}
	rmin, okMin := t.get(SyncRetryMin)
	rmax, okMax := t.get(SyncRetryMax)
	if okMin && okMax && rmin > rmax {
		add(t.violation(RuleSyncRetry, SyncRetryMax, rmax, "must be at least %s (%s)", t.Name(SyncRetryMin), rmin))
	}
	qla, okQLA := t.get(QuorumLossAfter)
	if okQLA && okLease && okMargin && qla >= lease-margin {
		add(t.violation(RuleQuorumLoss, QuorumLossAfter, qla,
			"must be 0 (off) or below %s − %s (%s): the lease deadline is the last line, not the first",
			t.Name(LeaseTTL), t.Name(SafetyMargin), lease-margin))
	}
	if qci, ok := t.get(QuorumCheckInterval); ok && okQLA && 3*qci > qla {
		add(t.violation(RuleQuorumCheck, QuorumCheckInterval, qci,
			"must be at most a third of %s (%s), so a read slower than two intervals is survived", t.Name(QuorumLossAfter), qla))
	}
	return out
}
