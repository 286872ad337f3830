package roled

import "time"

// Role is the application role of this node.
type Role uint8

// The roles. The zero value is PASSIVE: when in doubt, a node is PASSIVE.
const (
	RolePassive Role = iota
	RoleActive
)

func (r Role) String() string {
	if r == RoleActive {
		return "active"
	}
	return "passive"
}

// Reason says why decide chose a role. Reasons are a small fixed set, so they
// can label metrics.
type Reason string

// The reasons, in the order decide checks them.
const (
	ReasonStopping         Reason = "stopping"
	ReasonNoLease          Reason = "no_lease"
	ReasonDeadline         Reason = "local_deadline_passed"
	ReasonQuorumLost       Reason = "etcd_quorum_lost"
	ReasonEtcdStale        Reason = "etcd_view_stale"
	ReasonTakeover         Reason = "takeover_alarm"
	ReasonTakeoverPending  Reason = "takeover_check_pending"
	ReasonStepDown         Reason = "step_down_requested"
	ReasonPatroniDown      Reason = "patroni_unreachable"
	ReasonPatroniGarbage   Reason = "patroni_garbage"
	ReasonPatroniStale     Reason = "patroni_stale"
	ReasonPatroniNotLeader Reason = "patroni_not_primary"
	ReasonPostgresDown     Reason = "postgres_unreachable"
	ReasonInRecovery       Reason = "postgres_in_recovery"
	ReasonCommitsHung      Reason = "postgres_commits_hung" // durability sync-strict only
	ReasonLeaderMissing    Reason = "leader_key_missing"
	ReasonLeaderOther      Reason = "leader_key_names_other"
	ReasonActiveHeld       Reason = "active_key_held_by_other"
	ReasonActiveLost       Reason = "active_key_lost"
	ReasonHookBackoff      Reason = "on_active_backoff"
	ReasonHookFailed       Reason = "on_active_failed"
	ReasonFenceLift        Reason = "db_fence_lift_failed"
	ReasonAcquireFailed    Reason = "acquire_failed"
	ReasonStarting         Reason = "starting"
	ReasonPrimary          Reason = "primary"
)

// PatroniView is what the local Patroni said at its last poll.
type PatroniView struct {
	At      time.Duration // monotonic time of the answer (0: never)
	Err     string        // "" or why the answer was unusable
	Garbage bool          // answered, but not a Patroni status document
	Code    int           // HTTP status of GET /primary
	Role    string        // "master", "primary", "replica", ...
	State   string        // "running", ...
}

// Primary is Patroni's own claim: GET /primary is 200, the role is
// master/primary and PostgreSQL is running.
func (p PatroniView) Primary() bool {
	return p.Err == "" && p.Code == 200 && (p.Role == "master" || p.Role == "primary") && p.State == "running"
}

// PostgresView is the direct check of the local PostgreSQL.
type PostgresView struct {
	Disabled   bool   // postgres.enabled is false
	Err        string // connect or query error
	Code       string // SQLSTATE of a refusal ("57P03": starting up), "" otherwise
	InRecovery bool   // pg_is_in_recovery()
}

// KeyView is one etcd key as last read (linearizably).
type KeyView struct {
	Exists    bool
	Value     string
	CreateRev int64
	ModRev    int64
	Version   int64
	Lease     int64
}

// Observation is everything decide looks at. It is built by the state loop
// from the latest results of the pollers; decide itself does no I/O.
type Observation struct {
	Stopping bool

	// Lease and local deadline (monotonic). LeaseID 0: no lease.
	LeaseID  int64
	Deadline time.Duration

	// etcd view from the last linearizable read, and when it was read.
	EtcdAt time.Duration
	// When the newest successful etcd call (any kind) was sent, and how old
	// it may be before the majority counts as lost (0: no such check).
	EtcdOKAt        time.Duration
	QuorumLossAfter time.Duration
	Leader          KeyView // Patroni's leader key
	Active          KeyView // our active key
	ActiveNode      string  // node named in the active key
	TakeoverFor     bool    // an unacknowledged takeover alarm names this member
	// The leader key names this member but its history could not be read
	// (transient error): a takeover cannot be ruled out yet.
	TakeoverUnchecked bool
	// An operator (hapairctl switchover) asked this node to step down before
	// a planned Patroni switchover: its key under stepdown/ exists.
	StepDown bool

	Patroni  PatroniView
	Postgres PostgresView
	// Commits is the commit canary's verdict; HoldOnHungCommits (durability
	// sync-strict) makes hung commits a reason for PASSIVE: 503 lets the
	// balancer hold requests instead of piling them up on a primary where
	// no commit can complete until the standby is back.
	Commits           CommitView
	HoldOnHungCommits bool

	Member string // this node's Patroni member name
	Node   string // this node's name
	Epoch  int64  // epoch held now (CreateRevision of our active key), 0 if none

	HookBackoffUntil time.Duration // no new on-active attempt before this

	MaxEtcdAge    time.Duration // older etcd views are not trusted
	MaxPatroniAge time.Duration // older Patroni answers are not trusted
}

// decide is the role rule of DESIGN.md section 2 as a pure function: no I/O,
// no clock (now is monotonic time passed in). It returns RoleActive only when
// every condition holds; the first failing condition is the reason for
// PASSIVE. Acquiring the key, hooks and the marker are the caller's job;
// decide only says which role the node should have.
func decide(cur Role, o Observation, now time.Duration) (Role, Reason) {
	if r, ok := fenced(o, now); !ok {
		return RolePassive, r
	}
	if r, ok := patroniAndPostgres(o, now); !ok {
		return RolePassive, r
	}
	if !o.Leader.Exists {
		return RolePassive, ReasonLeaderMissing
	}
	if o.Leader.Value != o.Member {
		return RolePassive, ReasonLeaderOther
	}
	if o.Active.Exists && o.Active.Lease != o.LeaseID {
		// Someone else's key, or our own from an earlier process on an old
		// lease: either way wait until it is deleted or expires.
		return RolePassive, ReasonActiveHeld
	}
	if cur == RoleActive {
		if !o.Active.Exists || o.Active.CreateRev != o.Epoch {
			return RolePassive, ReasonActiveLost
		}
		return RoleActive, ReasonPrimary
	}
	if now < o.HookBackoffUntil {
		return RolePassive, ReasonHookBackoff
	}
	return RoleActive, ReasonPrimary
}

// fenced checks the etcd side: stopping, lease, local deadline, freshness of
// the etcd view, takeover alarm.
func fenced(o Observation, now time.Duration) (Reason, bool) {
	switch {
	case o.Stopping:
		return ReasonStopping, false
	case o.LeaseID == 0:
		return ReasonNoLease, false
	case now >= o.Deadline:
		return ReasonDeadline, false
	case o.QuorumLossAfter > 0 && now-o.EtcdOKAt >= o.QuorumLossAfter:
		return ReasonQuorumLost, false
	case o.EtcdAt == 0 || now-o.EtcdAt > o.MaxEtcdAge:
		return ReasonEtcdStale, false
	case o.TakeoverFor:
		return ReasonTakeover, false
	case o.TakeoverUnchecked:
		return ReasonTakeoverPending, false
	case o.StepDown:
		return ReasonStepDown, false
	}
	return "", true
}

// patroniAndPostgres checks the local side: Patroni claims the primary and
// PostgreSQL itself is writable. A timeout or garbage is "not primary".
func patroniAndPostgres(o Observation, now time.Duration) (Reason, bool) {
	p := o.Patroni
	switch {
	case p.At == 0 || now-p.At > o.MaxPatroniAge:
		return ReasonPatroniStale, false
	case p.Garbage:
		return ReasonPatroniGarbage, false
	case p.Err != "":
		return ReasonPatroniDown, false
	case !p.Primary():
		return ReasonPatroniNotLeader, false
	}
	pg := o.Postgres
	switch {
	case pg.Disabled:
	case pg.Err != "":
		return ReasonPostgresDown, false
	case pg.InRecovery:
		return ReasonInRecovery, false
	case o.HoldOnHungCommits && o.Commits.Hung:
		return ReasonCommitsHung, false
	}
	return "", true
}
