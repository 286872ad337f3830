// Package budget owns hapair's timing budget: one RTO target from which
// every timer on the failover path is derived (etcd's raft timings,
// Patroni's ttl/loop_wait/retry_timeout, roled's lease and polls, the
// balancer's checks and hold, syncdir's retry), the arithmetic that maps
// each fault to detection + decision + promotion + routing, and the rules a
// hand-set combination must keep. hapairctl plan, every binary's
// --check-config, the Ansible play and the lab use this one package, so a
// rule exists once.
//
// Everything here is pure: no I/O, no clock. Derive is table-tested against
// targets, Check against hand-set combinations.
package budget

import (
	"time"
)

// Key names one timer of Timers. Its String is the field's name in the file
// that sets it (roled.yaml, lb.yaml, witness.yaml, Patroni's dynamic
// configuration); Names in Timers can replace it with a fuller path.
type Key uint8

// The timers on the failover path.
const (
	EtcdHeartbeat Key = iota
	EtcdElection
	PatroniTTL
	PatroniLoopWait
	PatroniRetryTimeout
	LeaseTTL
	SafetyMargin
	KeepAliveInterval
	RereadInterval
	PollInterval
	FastPollInterval
	PatroniTimeout
	PostgresTimeout
	QuorumLossAfter
	QuorumCheckInterval
	CheckInterval
	CheckTimeout
	CheckFall
	CheckRise
	HoldTimeout
	SyncRetryMin
	SyncRetryMax
	numKeys
)

var keyNames = [numKeys]string{
	EtcdHeartbeat:       "heartbeat-interval",
	EtcdElection:        "election-timeout",
	PatroniTTL:          "ttl",
	PatroniLoopWait:     "loop_wait",
	PatroniRetryTimeout: "retry_timeout",
	LeaseTTL:            "lease-ttl",
	SafetyMargin:        "safety-margin",
	KeepAliveInterval:   "keepalive-interval",
	RereadInterval:      "reread-interval",
	PollInterval:        "patroni.poll-interval",
	FastPollInterval:    "patroni.fast-poll-interval",
	PatroniTimeout:      "patroni.timeout",
	PostgresTimeout:     "postgres.timeout",
	QuorumLossAfter:     "quorum-loss-after",
	QuorumCheckInterval: "quorum-check-interval",
	CheckInterval:       "check.interval",
	CheckTimeout:        "check.timeout",
	CheckFall:           "check.fall",
	CheckRise:           "check.rise",
	HoldTimeout:         "hold-timeout",
	SyncRetryMin:        "sync.retry-min",
	SyncRetryMax:        "sync.retry-max",
}

func (k Key) String() string {
	if k < numKeys {
		return keyNames[k]
	}
	return "unknown"
}

// Timers is every timer the budget covers. A zero duration (or count) is
// "not known": a binary checks only the timers its own file sets, and a
// rule whose inputs are not all known is skipped.
type Timers struct {
	// etcd's raft timings, the same on every member (hapair-witness).
	EtcdHeartbeat time.Duration // heartbeat-interval (default 100ms)
	EtcdElection  time.Duration // election-timeout (default 1s)

	// Patroni's dynamic configuration; Patroni takes whole seconds.
	PatroniTTL          time.Duration // ttl: life of the leader key (default 10s in hapair)
	PatroniLoopWait     time.Duration // loop_wait: HA cycle period (default 2s)
	PatroniRetryTimeout time.Duration // retry_timeout: DCS and PostgreSQL retries (default 3s)
	// PatroniVersion is the Patroni release that runs them ("3.0.2"; ""
	// unknown): from 3.2.0 on Patroni raises low values (FloorsFor).
	PatroniVersion string

	// hapair-roled.
	LeaseTTL          time.Duration // lease-ttl: fencing lease (default 5s)
	SafetyMargin      time.Duration // safety-margin: local deadline before the lease ends (default 1s)
	KeepAliveInterval time.Duration // keepalive-interval (default 1s)
	RereadInterval    time.Duration // reread-interval (default 1s)
	PollInterval      time.Duration // patroni.poll-interval (default 500ms)
	FastPollInterval  time.Duration // patroni.fast-poll-interval (default 50ms)
	PatroniTimeout    time.Duration // patroni.timeout: per REST call (default 1s)
	PostgresTimeout   time.Duration // postgres.timeout (default 1s)
	// The fast PASSIVE on a lost etcd majority (0 in roled.yaml: off, here
	// unknown). It bounds the async loss window, not the outage.
	QuorumLossAfter     time.Duration // quorum-loss-after (default 800ms)
	QuorumCheckInterval time.Duration // quorum-check-interval (default 200ms)

	// hapair-lb, the active-passive backend.
	CheckInterval time.Duration // check.interval (default 1s)
	CheckTimeout  time.Duration // check.timeout (default interval/2)
	CheckFall     int           // check.fall (default 2)
	CheckRise     int           // check.rise (default 2)
	HoldTimeout   time.Duration // hold-timeout: 0 disables the hold (default 5s)
	// FastPath: the backend watches the active key in etcd (etcd-fast-path)
	// and switches on its change; without it only the checks route.
	FastPath bool

	// syncdir (inside roled): backoff after a failed request, so the new
	// ACTIVE's sender reaches the returning peer soon after a failover.
	SyncRetryMin time.Duration // sync.retry-min (default 200ms)
	SyncRetryMax time.Duration // sync.retry-max (default 10s)

	// Names replaces a key's name in error messages with where it was read
	// ("roled.yaml: lease-ttl", "backends[0].check.interval").
	Names map[Key]string
}

// Name is the field name of k in errors.
func (t Timers) Name(k Key) string {
	if n, ok := t.Names[k]; ok {
		return n
	}
	return k.String()
}

// Keys lists every key in order.
func Keys() []Key {
	out := make([]Key, 0, numKeys)
	for k := Key(0); k < numKeys; k++ {
		out = append(out, k)
	}
	return out
}

// IsCount reports whether k is a count (fall, rise), not a duration.
func (k Key) IsCount() bool { return k == CheckFall || k == CheckRise }

// Set stores d as timer k (a count as a plain number).
func (t *Timers) Set(k Key, d time.Duration) {
	p := map[Key]*time.Duration{EtcdHeartbeat: &t.EtcdHeartbeat, EtcdElection: &t.EtcdElection,
		PatroniTTL: &t.PatroniTTL, PatroniLoopWait: &t.PatroniLoopWait, PatroniRetryTimeout: &t.PatroniRetryTimeout,
		LeaseTTL: &t.LeaseTTL, SafetyMargin: &t.SafetyMargin, KeepAliveInterval: &t.KeepAliveInterval,
		RereadInterval: &t.RereadInterval, PollInterval: &t.PollInterval, FastPollInterval: &t.FastPollInterval,
		PatroniTimeout: &t.PatroniTimeout, PostgresTimeout: &t.PostgresTimeout, QuorumLossAfter: &t.QuorumLossAfter,
		QuorumCheckInterval: &t.QuorumCheckInterval, CheckInterval: &t.CheckInterval,
		CheckTimeout: &t.CheckTimeout, HoldTimeout: &t.HoldTimeout, SyncRetryMin: &t.SyncRetryMin,
		SyncRetryMax: &t.SyncRetryMax}[k]
	switch {
	case p != nil:
		*p = d
	case k == CheckFall:
		t.CheckFall = int(d)
	case k == CheckRise:
		t.CheckRise = int(d)
	}
}

// Get returns timer k as a duration (counts as plain numbers) and whether
// it is known.
func (t Timers) Get(k Key) (time.Duration, bool) { return t.get(k) }

func (t Timers) get(k Key) (time.Duration, bool) {
	var d time.Duration
	switch k {
	case EtcdHeartbeat:
		d = t.EtcdHeartbeat
	case EtcdElection:
		d = t.EtcdElection
	case PatroniTTL:
		d = t.PatroniTTL
	case PatroniLoopWait:
		d = t.PatroniLoopWait
	case PatroniRetryTimeout:
		d = t.PatroniRetryTimeout
	case LeaseTTL:
		d = t.LeaseTTL
	case SafetyMargin:
		d = t.SafetyMargin
	case KeepAliveInterval:
		d = t.KeepAliveInterval
	case RereadInterval:
		d = t.RereadInterval
	case PollInterval:
		d = t.PollInterval
	case FastPollInterval:
		d = t.FastPollInterval
	case PatroniTimeout:
		d = t.PatroniTimeout
	case PostgresTimeout:
		d = t.PostgresTimeout
	case QuorumLossAfter:
		d = t.QuorumLossAfter
	case QuorumCheckInterval:
		d = t.QuorumCheckInterval
	case CheckInterval:
		d = t.CheckInterval
	case CheckTimeout:
		d = t.CheckTimeout
	case CheckFall:
		d = time.Duration(t.CheckFall)
	case CheckRise:
		d = time.Duration(t.CheckRise)
	case HoldTimeout:
		d = t.HoldTimeout
	case SyncRetryMin:
		d = t.SyncRetryMin
	case SyncRetryMax:
		d = t.SyncRetryMax
	}
	return d, d != 0
}

// Defaults are the timers hapair ships without a target (the binaries'
// DefaultConfig, the Patroni role's 10/2/3, the lab's balancer checks are
// faster than these). The arithmetic of a partial set fills the rest from
// here.
func Defaults() Timers {
	return Timers{
		EtcdHeartbeat:       100 * time.Millisecond,
		EtcdElection:        time.Second,
		PatroniTTL:          10 * time.Second,
		PatroniLoopWait:     2 * time.Second,
		PatroniRetryTimeout: 3 * time.Second,
		LeaseTTL:            5 * time.Second,
		SafetyMargin:        time.Second,
		KeepAliveInterval:   time.Second,
		RereadInterval:      time.Second,
		PollInterval:        500 * time.Millisecond,
		FastPollInterval:    50 * time.Millisecond,
		PatroniTimeout:      time.Second,
		PostgresTimeout:     time.Second,
		QuorumLossAfter:     800 * time.Millisecond,
		QuorumCheckInterval: 200 * time.Millisecond,
		CheckInterval:       time.Second,
		CheckTimeout:        500 * time.Millisecond,
		CheckFall:           2,
		CheckRise:           2,
		HoldTimeout:         5 * time.Second,
		FastPath:            true,
		SyncRetryMin:        200 * time.Millisecond,
		SyncRetryMax:        10 * time.Second,
	}
}

// Merge returns t with every unknown timer taken from d; Names and FastPath
// are t's. A hold-timeout of 0 is "disabled", not "unknown", once t names
// where it was read (Names[HoldTimeout]), and is then kept.
func (t Timers) Merge(d Timers) Timers {
	out := t
	fill := func(dst *time.Duration, src time.Duration) {
		if *dst == 0 {
			*dst = src
		}
	}
	fill(&out.EtcdHeartbeat, d.EtcdHeartbeat)
	fill(&out.EtcdElection, d.EtcdElection)
	fill(&out.PatroniTTL, d.PatroniTTL)
	fill(&out.PatroniLoopWait, d.PatroniLoopWait)
	fill(&out.PatroniRetryTimeout, d.PatroniRetryTimeout)
	fill(&out.LeaseTTL, d.LeaseTTL)
	fill(&out.SafetyMargin, d.SafetyMargin)
	fill(&out.KeepAliveInterval, d.KeepAliveInterval)
	fill(&out.RereadInterval, d.RereadInterval)
	fill(&out.PollInterval, d.PollInterval)
	fill(&out.FastPollInterval, d.FastPollInterval)
	fill(&out.PatroniTimeout, d.PatroniTimeout)
	fill(&out.PostgresTimeout, d.PostgresTimeout)
	fill(&out.QuorumLossAfter, d.QuorumLossAfter)
	fill(&out.QuorumCheckInterval, d.QuorumCheckInterval)
	fill(&out.CheckInterval, d.CheckInterval)
	fill(&out.CheckTimeout, d.CheckTimeout)
	if out.CheckFall == 0 {
		out.CheckFall = d.CheckFall
	}
	if out.CheckRise == 0 {
		out.CheckRise = d.CheckRise
	}
	if _, named := t.Names[HoldTimeout]; !named {
		fill(&out.HoldTimeout, d.HoldTimeout)
	}
	fill(&out.SyncRetryMin, d.SyncRetryMin)
	fill(&out.SyncRetryMax, d.SyncRetryMax)
	if out.PatroniVersion == "" {
		out.PatroniVersion = d.PatroniVersion
	}
	return out
}
