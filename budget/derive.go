package budget

import (
	"fmt"
	"time"
)

// Meaning of a target. The target is the outage an operator sees on a
// typical fault (the median of the lab's runs); the worst case, with every
// timer at its bound and etcd's leader on the failed node, may reach
// WorstFactor × target and no more. At 5 s that is the goal:
// median ≤ 5.0 s, max ≤ 6.0 s… with room to 7.5 s for the rare compound case.
const (
	WorstFactor = 1.5
	// MaxTarget: above this a budget is not a failover budget any more
	// (Patroni's ttl would reach minutes).
	MaxTarget = 10 * time.Minute
)

// Floors below which a timer is not safe, whatever the target.
const (
	// Patroni: retry_timeout of 2 s (RulePatroniRetry) and loop_wait of 1 s
	// make ttl 5 s the least that keeps loop_wait + 2 × retry_timeout ≤ ttl.
	minRetry = 2 * time.Second
	minTTL   = 5 * time.Second
	// etcd: a 30 ms heartbeat is the least that a loaded LAN host keeps
	// (etcd's guide: about the round trip time, with room for fsync).
	minElection = 300 * time.Millisecond
	// roled: etcd leases have whole-second TTLs; 2 s is the least.
	minLease = 2 * time.Second
)

// Reason says why a target was refused.
type Reason uint8

// Refusal reasons.
const (
	ReasonNone Reason = iota
	// ReasonNotPositive: the target is zero or negative.
	ReasonNotPositive
	// ReasonTooFast: even the fastest safe timers (ttl 5 s; 20 s from
	// Patroni 3.2.0 on) miss it.
	ReasonTooFast
	// ReasonTooSlow: above MaxTarget.
	ReasonTooSlow
)

func (r Reason) String() string {
	return map[Reason]string{ReasonNone: "none", ReasonNotPositive: "not-positive",
		ReasonTooFast: "too-fast", ReasonTooSlow: "too-slow"}[r]
}

// RefusedError is a target the budget cannot meet safely.
type RefusedError struct {
	Target time.Duration
	Reason Reason
	// Closest is the fastest safe plan's arithmetic (ReasonTooFast).
	Closest *Plan
}

func (e *RefusedError) Error() string {
	switch e.Reason {
	case ReasonNotPositive:
		return fmt.Sprintf("budget: rto %s: must be positive", e.Target)
	case ReasonTooSlow:
		return fmt.Sprintf("budget: rto %s: above %s, not a failover budget", e.Target, MaxTarget)
	case ReasonTooFast:
		msg := fmt.Sprintf("budget: rto %s cannot be met safely", e.Target)
		if e.Closest != nil {
			o := e.Closest.binding()
			msg += fmt.Sprintf(": the fastest safe timers for Patroni %s (ttl %s, etcd election-timeout %s) give %s typical, %s worst for a %s (want ≤ %s and ≤ %s)",
				e.Closest.Timers.PatroniVersion, e.Closest.Timers.PatroniTTL, e.Closest.Timers.EtcdElection, o.Typical, o.Worst, o.Fault,
				e.Target, time.Duration(float64(e.Target)*WorstFactor))
		}
		return msg
	}
	return "budget: refused"
}

// Plan is a target with the timers derived from it and their arithmetic.
type Plan struct {
	Target  time.Duration
	Timers  Timers
	Outages []Outage
}

// Meets reports whether every fault's typical outage is within the target
// and its worst within WorstFactor × target (faults outside the target
// aside: Outage.Outside).
func (p Plan) Meets() bool {
	limit := time.Duration(float64(p.Target) * WorstFactor)
	for _, o := range p.Outages {
		if o.Outside != "" {
			continue
		}
		if o.Typical > p.Target || o.Worst > limit {
			return false
		}
	}
	return true
}

// binding is the outage closest to its limit: the one that decides ttl.
func (p Plan) binding() Outage {
	var best Outage
	score := -1.0
	for _, o := range p.Outages {
		if o.Outside != "" {
			continue
		}
		s := max(float64(o.Typical)/float64(p.Target), float64(o.Worst)/(float64(p.Target)*WorstFactor))
		if s > score {
			best, score = o, s
		}
	}
	return best
}

// Binding is the fault whose outage decides the plan, and its timer.
func (p Plan) Binding() Outage { return p.binding() }

// Derive is DeriveFor the DefaultPatroni release.
func Derive(target time.Duration) (Plan, error) { return DeriveFor(target, DefaultPatroni) }

// DeriveFor turns a target into every timer for the Patroni release
// patroni, choosing the slowest (most tolerant of jitter and load) timers
// that still meet it: Patroni's ttl is tried from the target down to the
// release's floor (FloorsFor), and every other timer follows from ttl and
// the target by the rules in Check.
func DeriveFor(target time.Duration, patroni string) (Plan, error) {
	fl, err := FloorsFor(patroni)
	if err != nil {
		return Plan{}, err
	}
	switch {
	case target <= 0:
		return Plan{}, &RefusedError{Target: target, Reason: ReasonNotPositive}
	case target > MaxTarget:
		return Plan{}, &RefusedError{Target: target, Reason: ReasonTooSlow}
	}
	var last Plan
	for ttl := max(target.Truncate(time.Second), fl.TTL); ttl >= fl.TTL; ttl -= time.Second {
		p := Plan{Target: target, Timers: timersFor(target, ttl, fl)}
		p.Outages = Arithmetic(p.Timers)
		if p.Meets() {
			if err := Check(p.Timers); err != nil {
				// A derivation that breaks a rule is a bug here, not the
				// operator's mistake.
				panic(fmt.Sprintf("budget: derived timers for %s break a rule: %v", target, err))
			}
			return p, nil
		}
		last = p
	}
	return Plan{}, &RefusedError{Target: target, Reason: ReasonTooFast, Closest: &last}
}

// Lowest is the smallest target Derive accepts, to 100 ms.
func Lowest() time.Duration { return LowestFor(DefaultPatroni) }

// LowestFor is the smallest target DeriveFor accepts for a Patroni
// release, to 100 ms (MaxTarget for a version it cannot read).
func LowestFor(patroni string) time.Duration {
	fl, err := FloorsFor(patroni)
	if err != nil {
		return MaxTarget
	}
	// From well below the floor: a slow loop_wait puts the typical kill
	// under ttl.
	for d := fl.TTL / 2; d <= MaxTarget; d += 100 * time.Millisecond {
		if _, err := DeriveFor(d, patroni); err == nil {
			return d
		}
	}
	return MaxTarget
}

// timersFor derives every timer from Patroni's ttl and the target.
func timersFor(target, ttl time.Duration, fl PatroniFloors) Timers {
	t := Defaults()
	t.PatroniVersion = fl.Release
	t.PatroniTTL = ttl
	// Patroni's own ratio is 30/10/10; hapair's 10/2/3 keeps more room for
	// retries: loop_wait a fifth of ttl, retry_timeout all that is left.
	t.PatroniLoopWait = max(fl.LoopWait, (ttl / 5).Truncate(time.Second))
	t.PatroniRetryTimeout = max(fl.Retry, ((ttl - t.PatroniLoopWait) / 2).Truncate(time.Second))
	// An etcd election (≤ 2 election timeouts) must end within
	// retry_timeout, with 200 ms to spare; etcd's 1 s default above that;
	// and a kill of the node that leads etcd costs 3 election timeouts
	// more, kept within a quarter of the target.
	el := min(time.Second, (t.PatroniRetryTimeout-200*time.Millisecond)/2, target/12)
	t.EtcdElection = max(minElection, el.Truncate(10*time.Millisecond))
	t.EtcdHeartbeat = (t.EtcdElection / 10).Truncate(time.Millisecond)
	// roled gives up (lease − margin) before Patroni's key can move
	// (ttl − loop_wait), with a second to spare; 5 s (today's) at most.
	t.LeaseTTL = max(minLease, min(5*time.Second, ttl-t.PatroniLoopWait-time.Second))
	t.SafetyMargin = max(500*time.Millisecond, min(time.Second, (t.LeaseTTL/5).Truncate(100*time.Millisecond)))
	usable := t.LeaseTTL - t.SafetyMargin
	t.KeepAliveInterval = min(time.Second, (usable / 3).Truncate(100*time.Millisecond))
	t.RereadInterval = t.KeepAliveInterval
	t.PatroniTimeout = min(time.Second, (usable / 2).Truncate(100*time.Millisecond))
	t.PostgresTimeout = t.PatroniTimeout
	if ttl < 6*time.Second {
		t.PollInterval = 250 * time.Millisecond
	}
	// The balancer: checks a twentieth of the target (100 ms … 1 s), fall
	// and rise 2; the hold outlasts the worst kill, a host's death included
	// (outside the target, but users wait through it all the same), so a
	// request that arrives at the fault is answered once the survivor serves.
	t.CheckInterval = max(100*time.Millisecond, min(time.Second, (target/20).Truncate(10*time.Millisecond)))
	t.CheckTimeout = (t.CheckInterval * 4 / 5).Truncate(10 * time.Millisecond)
	t.CheckFall, t.CheckRise = 2, 2
	t.FastPath = true
	t.HoldTimeout = 0
	for _, o := range Arithmetic(t) {
		if o.Fault == FaultKill || o.Fault == FaultHostDeath {
			t.HoldTimeout = max(t.HoldTimeout, 5*time.Second, o.Worst.Truncate(time.Second)+time.Second)
		}
	}
	// quorum-loss-after and its probe keep their defaults (800 ms / 200 ms)
	// at every target: they bound how long an isolated primary takes writes
	// (the async loss window, ≤ 1 s through the balancer), which the RTO does
	// not change, and the least lease (2 s − 0.5 s margin) stays above them.
	// The new ACTIVE's sender retries the returning peer at least every
	// half target, so file sync resumes soon after a failover.
	t.SyncRetryMax = max(time.Second, min(10*time.Second, (target/2).Truncate(100*time.Millisecond)))
	return t
}
