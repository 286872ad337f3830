package budget

import (
	"time"
)

// Fault is one failure the budget covers.
type Fault uint8

// The faults of the arithmetic.
const (
	// FaultKill: kill -9 of everything on the primary's node (Patroni,
	// PostgreSQL, roled, its etcd member).
	FaultKill Fault = iota + 1
	// FaultPartition: the primary's node cut off from the other etcd
	// members; the balancer still reaches it.
	FaultPartition
	// FaultFrozenPatroni: the primary's Patroni stops (SIGSTOP, a hung
	// process); without a watchdog its PostgreSQL stays writable.
	FaultFrozenPatroni
	// FaultRoledCrash: roled on the ACTIVE node dies; systemd restarts it;
	// Patroni keeps its primary.
	FaultRoledCrash
	// FaultHostDeath: the primary's host is gone (power, kernel panic, cable):
	// a kill whose host sends no RST, so Patroni's probe of the dead member
	// waits out its fixed timeout. Outside the target (Outage.Outside).
	FaultHostDeath
)

var faultNames = map[Fault]string{
	FaultKill:          "kill of the primary's node",
	FaultPartition:     "partition of the primary's node",
	FaultFrozenPatroni: "frozen Patroni on the primary",
	FaultRoledCrash:    "roled crash on the ACTIVE node",
	FaultHostDeath:     "death of the primary's host (no RST)",
}

func (f Fault) String() string { return faultNames[f] }

// Faults lists every fault in the order they are printed.
var Faults = []Fault{FaultKill, FaultPartition, FaultFrozenPatroni, FaultRoledCrash, FaultHostDeath}

// Stage is one of the four parts of an outage.
type Stage uint8

// The stages, in order.
const (
	StageDetection Stage = iota + 1 // the fault is known to the part that acts (a key expires, a lease ends)
	StageDecision                   // the survivor decides to take over
	StagePromotion                  // its PostgreSQL takes writes and roled holds the active key
	StageRouting                    // the balancer sends users to it
)

func (s Stage) String() string {
	return map[Stage]string{StageDetection: "detection", StageDecision: "decision",
		StagePromotion: "promotion", StageRouting: "routing"}[s]
}

// Costs of steps that no timer sets, from etcd's and Patroni's code and the
// lab's figures. They enter the arithmetic as they are.
const (
	// etcd's lessor looks for expired leases every 500 ms
	// (server/lease/lessor.go runLoop).
	leaseCheck = 500 * time.Millisecond
	// The survivor's Patroni wakes on its watch of the leader key and runs
	// one HA cycle: read the cluster, take the key (a few etcd round trips;
	// the dead primary's member key expired with the same lease, so no
	// member is probed).
	patroniCycleTypical = 100 * time.Millisecond
	patroniCycleWorst   = 300 * time.Millisecond
	// pg_ctl promote until PostgreSQL takes writes (lab: 0.2–0.8 s).
	promoteTypical = 500 * time.Millisecond
	promoteWorst   = time.Second
	// WalRetrieveRetryInterval is the wal_retrieve_retry_interval hapair
	// sets (the lab's and the Ansible role's PostgreSQL parameters): a
	// standby whose primary is gone retries its WAL sources that often. A
	// promote request that arrives just before that wait is not seen until
	// it ends (PostgreSQL 15 xlogrecovery.c, WaitForWALToBecomeAvailable:
	// the wait follows a latch reset that consumed the request's wake-up).
	// With PostgreSQL's default, 5 s, the lab saw a kill take 10.4 s
	// instead of 5: "received promote request" 4.95 s after pg_ctl's
	// "server promoting". 250 ms costs a walreceiver start attempt (and a
	// log line) four times a second while the standby has no primary.
	WalRetrieveRetryInterval = 250 * time.Millisecond
	// roled after Patroni's /primary turns 200: the PostgreSQL check and
	// the active key's transaction (a query and two etcd round trips).
	roledAct = 100 * time.Millisecond
	// The balancer's reaction to the active key's change (watch event,
	// fast-interval, one confirming check answered from memory).
	fastSwitch = 20 * time.Millisecond
	// RestartDelay is systemd's RestartSec in the shipped units plus
	// roled's start-up (FaultRoledCrash).
	RestartDelay = 2500 * time.Millisecond
	// MemberProbe: before it takes the key, the survivor's Patroni asks
	// every member it knows for its status, the dead primary too, with a
	// fixed 2 s timeout (Patroni 3.0.2 ha.py fetch_node_status, timeout=2,
	// not configurable). A killed process's host answers at once with an
	// RST; a dead host does not, and the probe waits it out (lab scenarios
	// 19 and 20: +2 s against 13 and 15).
	MemberProbe = 2 * time.Second
)

// hostDeathOutside says why FaultHostDeath is not held to the target.
const hostDeathOutside = "Patroni's fixed 2 s member probe, which no timer sets, comes on top of a kill"

// Step is one stage of one fault: its typical and worst duration and why.
type Step struct {
	Stage   Stage
	Typical time.Duration
	Worst   time.Duration
	Why     string
}

// Outage is the arithmetic of one fault.
type Outage struct {
	Fault   Fault
	Steps   []Step
	Typical time.Duration // sum of the steps' typical durations
	Worst   time.Duration // sum of the steps' worst durations
	// Outside, when set, says why this fault is shown but not held to the
	// target (Plan.Meets): a cost that no timer can shorten. The balancer's
	// hold still covers its worst case (Derive).
	Outside string
}

// Arithmetic maps every fault to detection + decision + promotion + routing
// for the timers t (unknown timers from Defaults). "Typical" has every timer
// at its mean phase (a key refreshed half a loop_wait before the fault) and
// etcd's leader elsewhere; "worst" has each at its bound and, for a kill or
// a partition, etcd's raft leader on the failed node too.
func Arithmetic(t Timers) []Outage {
	t = t.Merge(Defaults()).Running()
	// Patroni's leader key lives on a lease of ttl seconds, kept alive once
	// per HA cycle: it expires ttl after the last keep-alive.
	keyTyp := t.PatroniTTL - t.PatroniLoopWait/2 + leaseCheck/2
	keyWorst := t.PatroniTTL + leaseCheck
	// When the failed node led etcd: the others notice after a randomized
	// election timeout (up to 2×), and the new leader extends every lease by
	// one more election timeout (etcd's lessor Promote).
	leaderLost := 3 * t.EtcdElection
	decision := Step{StageDecision, patroniCycleTypical, patroniCycleWorst,
		"the survivor's Patroni wakes on its watch of the leader key; one HA cycle takes the key"}
	promotion := Step{StagePromotion, promoteTypical + t.FastPollInterval/2 + roledAct,
		promoteWorst + WalRetrieveRetryInterval + t.FastPollInterval + roledAct,
		"pg_ctl promote (worst: seen after one wal_retrieve_retry_interval); roled sees /primary within patroni.fast-poll-interval, checks PostgreSQL, takes the active key"}
	routeFast := Step{StageRouting, fastSwitch, fastSwitch + t.CheckTimeout,
		"the balancer watches the active key and switches with one confirming check"}
	// Without the fast path the new ACTIVE needs rise good checks.
	rise := time.Duration(t.CheckRise)
	routeChecks := Step{StageRouting, (rise-1)*t.CheckInterval + t.CheckInterval/2, rise*t.CheckInterval + t.CheckTimeout,
		"check.rise good checks of the new ACTIVE (no fast path)"}
	route := routeFast
	if !t.FastPath {
		route = routeChecks
	}
	// A partition may leave the balancer's etcd client on the cut-off
	// member: its fast path goes silent, and the checks route (worst case).
	routePart := Step{StageRouting, route.Typical, max(route.Worst, routeChecks.Worst),
		"fast path, or check.rise checks when the balancer's etcd member is the cut-off one"}

	kill := []Step{
		{StageDetection, keyTyp, keyWorst + leaderLost,
			"Patroni's leader key expires ttl after its last keep-alive (+ etcd's 0.5 s lease check); worst: the node also led etcd (+3 × election-timeout)"},
		decision, promotion, route,
	}
	part := []Step{
		{StageDetection, keyTyp, keyWorst + leaderLost,
			"as a kill: the key expires on the majority side; roled on the cut-off node is PASSIVE after lease-ttl − safety-margin, sooner"},
		decision, promotion, routePart,
	}
	frozen := []Step{
		{StageDetection, keyTyp, keyWorst,
			"the frozen Patroni keeps no lease alive: its key expires ttl later; roled there is PASSIVE after poll-interval + patroni.timeout"},
		decision, promotion, route,
	}
	// A crashed roled's active key lives until its lease ends; the restarted
	// roled (PASSIVE at start) can only create the key after that.
	leaseTyp := t.LeaseTTL - t.KeepAliveInterval/2 + leaseCheck/2
	crash := []Step{
		{StageDetection, max(leaseTyp, RestartDelay), max(t.LeaseTTL+leaseCheck, RestartDelay),
			"the old active key expires with the dead process's lease-ttl; systemd restarts roled meanwhile"},
		{StageDecision, t.PollInterval / 2, t.PollInterval,
			"the restarted roled's next Patroni poll finds its node still primary"},
		{StagePromotion, roledAct, roledAct + t.PostgresTimeout/2,
			"no promotion: PostgreSQL check and the active key's transaction"},
		route,
	}
	death := []Step{kill[0],
		{StageDecision, patroniCycleTypical + MemberProbe, patroniCycleWorst + MemberProbe,
			"the survivor's Patroni probes every member before it takes the key: the dead host's REST API answers nothing for Patroni's fixed 2 s"},
		promotion, route,
	}
	var out []Outage
	for _, f := range Faults {
		steps := map[Fault][]Step{FaultKill: kill, FaultPartition: part, FaultFrozenPatroni: frozen, FaultRoledCrash: crash, FaultHostDeath: death}[f]
		o := Outage{Fault: f, Steps: steps}
		if f == FaultHostDeath {
			o.Outside = hostDeathOutside
		}
		for _, s := range steps {
			o.Typical += s.Typical
			o.Worst += s.Worst
		}
		out = append(out, o)
	}
	return out
}
