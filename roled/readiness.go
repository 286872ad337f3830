package roled

import (
	"encoding/json"
	"fmt"
	"net/url"
	"time"

	"github.com/hapair/hapair/internal/config"
)

// StandbyReason says why this node is not ready to take over, or
// StandbyReady. The set is small and fixed: it labels
// hapair_roled_standby_not_ready_reason and travels in /role and the
// nodes/<node> heartbeat, where hapairctl decodes it (one rule, computed
// here; hapairctl only falls back to its own reading of Patroni when a roled
// does not publish one).
type StandbyReason string

// The reasons, in the order standbyReady checks them.
const (
	StandbyReady          StandbyReason = "ready"
	StandbyUnchecked      StandbyReason = "unchecked"           // postgres.enabled is false: roled cannot see the replica
	StandbyIsActive       StandbyReason = "is_active"           // this node serves: it is not the standby
	StandbyPatroniDown    StandbyReason = "patroni_unreachable" // no fresh, usable answer from the local Patroni
	StandbyNotRunning     StandbyReason = "patroni_not_running" // starting, stopped (rewind, restart), creating replica, bootstrap…
	StandbyNotReplica     StandbyReason = "not_replica"         // Patroni's role is not replica
	StandbyNoFailover     StandbyReason = "tagged_nofailover"   // Patroni will never promote it
	StandbyPendingRestart StandbyReason = "pending_restart"     // a parameter change waits for a restart
	StandbyPostgresDown   StandbyReason = "postgres_unreachable"
	StandbyNotInRecovery  StandbyReason = "postgres_not_in_recovery"
	StandbyEtcdStale      StandbyReason = "etcd_view_stale"
	StandbyNoLeader       StandbyReason = "no_leader"             // no Patroni leader key
	StandbyIsLeader       StandbyReason = "is_leader"             // this member holds the leader key (see stuck leader)
	StandbyLeaderUnknown  StandbyReason = "leader_member_unknown" // the leader's member key is missing or unreadable
	StandbyNotStreaming   StandbyReason = "not_streaming"         // pg_stat_wal_receiver is not 'streaming'
	StandbyWrongSender    StandbyReason = "streaming_from_other_host"
	StandbyTimeline       StandbyReason = "timeline_differs"
	StandbyLagBytes       StandbyReason = "replay_lag_bytes"
	StandbyLagTime        StandbyReason = "replay_lag_seconds"
	StandbySyncReceiver   StandbyReason = "sync_receiver_down"
	StandbyQuarantine     StandbyReason = "sync_quarantine"
	StandbySyncUnknown    StandbyReason = "sync_sender_unknown" // no heartbeat of the ACTIVE's sender
	StandbySyncLag        StandbyReason = "sync_lag"
)

// StandbyReasons lists every reason, so the metric can show each as 0 or 1.
var StandbyReasons = []StandbyReason{StandbyReady, StandbyUnchecked, StandbyIsActive, StandbyPatroniDown,
	StandbyNotRunning, StandbyNotReplica, StandbyNoFailover, StandbyPendingRestart, StandbyPostgresDown,
	StandbyNotInRecovery, StandbyEtcdStale, StandbyNoLeader, StandbyIsLeader, StandbyLeaderUnknown,
	StandbyNotStreaming, StandbyWrongSender, StandbyTimeline, StandbyLagBytes, StandbyLagTime,
	StandbySyncReceiver, StandbyQuarantine, StandbySyncUnknown, StandbySyncLag}

var standbyText = map[StandbyReason]string{
	StandbyReady:          "ready to take over",
	StandbyUnchecked:      "not checked by roled (postgres.enabled is false)",
	StandbyIsActive:       "is the ACTIVE node",
	StandbyPatroniDown:    "Patroni not answering",
	StandbyNotRunning:     "PostgreSQL not running under Patroni",
	StandbyNotReplica:     "not a Patroni replica",
	StandbyNoFailover:     "tagged nofailover",
	StandbyPendingRestart: "restart pending",
	StandbyPostgresDown:   "PostgreSQL not answering",
	StandbyNotInRecovery:  "PostgreSQL not in recovery",
	StandbyEtcdStale:      "etcd view stale",
	StandbyNoLeader:       "no Patroni leader",
	StandbyIsLeader:       "holds the Patroni leader key",
	StandbyLeaderUnknown:  "leader's member key unknown",
	StandbyNotStreaming:   "not streaming from the leader",
	StandbyWrongSender:    "streaming from another host than the leader",
	StandbyTimeline:       "timeline differs from the leader's",
	StandbyLagBytes:       "replay lag above readiness.max-lag-bytes",
	StandbyLagTime:        "replay lag above readiness.max-lag",
	StandbySyncReceiver:   "file sync receiver not listening",
	StandbyQuarantine:     "files waiting in quarantine",
	StandbySyncUnknown:    "ACTIVE's file sync sender unknown",
	StandbySyncLag:        "file sync behind",
}

// Text is the operator's wording of the reason.
func (r StandbyReason) Text() string {
	if t, ok := standbyText[r]; ok {
		return t
	}
	return string(r)
}

// Readiness is the published answer to "could this node take over now?"
// (/role "readiness", heartbeat, metrics).
type Readiness struct {
	Ready  bool          `json:"ready"`
	Reason StandbyReason `json:"reason"`
	Detail string        `json:"detail,omitempty"`
	// Since is when the reason (or readiness) last changed, wall clock.
	Since      time.Time `json:"since"`
	LagBytes   int64     `json:"lag_bytes"`   // replay position behind the leader's optime
	LagSeconds float64   `json:"lag_seconds"` // since the last replayed transaction, 0 when all received WAL is replayed
	Timeline   int64     `json:"timeline"`    // timeline the WAL receiver streams (0: none)
	Sender     string    `json:"sender,omitempty"`
	// Recovery: the not-ready episode in progress, or the last one once
	// ready, split by phase (readiness_phase.go); nil while ACTIVE.
	Recovery *StandbyRecovery `json:"recovery,omitempty"`
}

// Text is "reason (detail)", for logs and hapairctl.
func (r Readiness) Text() string {
	if r.Detail == "" {
		return r.Reason.Text()
	}
	return r.Reason.Text() + " (" + r.Detail + ")"
}

// ReadinessConfig bounds what "ready to take over" means.
type ReadinessConfig struct {
	// MaxLagBytes: replay position at most this far behind the leader's
	// optime (default 1MiB, Patroni's default maximum_lag_on_failover; keep
	// it at or below the cluster's value, or Patroni refuses a candidate
	// roled calls ready).
	MaxLagBytes ByteSize `yaml:"max-lag-bytes"`
	// MaxLag: seconds since the last replayed transaction while received
	// WAL waits to be replayed (default 10s): that WAL must be replayed
	// before a promotion completes.
	MaxLag time.Duration `yaml:"max-lag"`
	// MaxSyncLag: the ACTIVE's file sync may lag at most this much (default
	// 60s, the HapairSyncLagHigh threshold). Only with a sync section.
	MaxSyncLag time.Duration `yaml:"max-sync-lag"`
	// QuarantineBlocks: files waiting in this node's quarantine make it not
	// ready (default false). Those files are this node's own undelivered
	// leftovers from an earlier ACTIVE term: a takeover does not lose them
	// further, and they wait for an operator (HapairQuarantinedFiles), so by
	// default they are reported in the readiness detail without blocking a
	// drill or a switchover until someone merges them.
	QuarantineBlocks bool `yaml:"quarantine-blocks"`
	// StuckLeaderAfter: Patroni holding the leader key for this member while
	// its PostgreSQL accepts no writes for this long is a stuck leader
	// (default 30s: longer than a promotion or a crash recovery of a small
	// database takes, short enough to page before users give up).
	StuckLeaderAfter time.Duration `yaml:"stuck-leader-after"`
}

// DefaultReadiness is the readiness section's defaults.
func DefaultReadiness() ReadinessConfig {
	return ReadinessConfig{MaxLagBytes: 1 << 20, MaxLag: 10 * time.Second, MaxSyncLag: 60 * time.Second,
		StuckLeaderAfter: 30 * time.Second}
}

func (c Config) validateReadiness() error {
	r := c.Readiness
	switch {
	case r.MaxLagBytes <= 0:
		return config.Errorf("readiness.max-lag-bytes", r.MaxLagBytes, "must be positive")
	case r.MaxLag <= 0:
		return config.Errorf("readiness.max-lag", r.MaxLag, "must be positive")
	case r.MaxSyncLag <= 0:
		return config.Errorf("readiness.max-sync-lag", r.MaxSyncLag, "must be positive")
	case r.StuckLeaderAfter <= 0:
		return config.Errorf("readiness.stuck-leader-after", r.StuckLeaderAfter, "must be positive")
	}
	return nil
}

// WALReceiverView is the local replica's own account of its replication
// (pg_stat_wal_receiver and the replay position), read in the same poll as
// Patroni. Patroni 3.0.2 says `running` for a replica that streams and for
// one whose timeline diverged and is about to be rewound; this does not.
type WALReceiverView struct {
	Checked    bool    // the query ran (PostgreSQL answered and is in recovery)
	Err        string  // query error
	Status     string  // pg_stat_wal_receiver.status; "" when no receiver runs
	SenderHost string  // pg_stat_wal_receiver.sender_host
	Timeline   int64   // pg_stat_wal_receiver.received_tli
	ReplayLSN  int64   // pg_last_wal_replay_lsn(), bytes
	ReceiveLSN int64   // pg_last_wal_receive_lsn(), bytes
	ReplayAge  float64 // seconds since the last replayed transaction, 0 when nothing waits; -1 unknown
}

// LeaderMember is the Patroni leader's member key as read from etcd.
type LeaderMember struct {
	Known    bool
	Host     string // host of its conn_url
	Timeline int64
	XlogLoc  int64 // xlog_location
}

// PeerSync is the ACTIVE node's file sync sender, from its heartbeat.
type PeerSync struct {
	Known      bool
	Sending    bool
	LagSeconds float64
}

// SyncStandby is the local file sync's side of readiness.
type SyncStandby struct {
	Enabled     bool
	Listening   bool  // the receiver accepts connections
	Quarantined int64 // files waiting in quarantine now, all roots
}

// StandbyObservation is everything standbyReady looks at; built from the
// pollers' published results, no I/O.
type StandbyObservation struct {
	Active   bool // this node serves now
	Patroni  PatroniView
	Status   PatroniStatus
	Postgres PostgresView
	WAL      WALReceiverView
	EtcdAt   time.Duration
	Leader   KeyView // Patroni's leader key
	Member   string
	LeaderM  LeaderMember
	Optime   int64 // leader optime (status key)
	Peer     PeerSync
	Sync     SyncStandby

	MaxEtcdAge, MaxPatroniAge time.Duration
	Bounds                    ReadinessConfig
}

// standbyReady is the readiness rule as a pure function. Ready only when
// every condition holds; the first failing one is the reason.
func standbyReady(o StandbyObservation, now time.Duration) Readiness {
	r := Readiness{Timeline: o.WAL.Timeline, Sender: o.WAL.SenderHost}
	not := func(reason StandbyReason, format string, args ...any) Readiness {
		r.Reason = reason
		if format != "" {
			r.Detail = fmt.Sprintf(format, args...)
		}
		return r
	}
	p := o.Patroni
	switch {
	case o.Active:
		return not(StandbyIsActive, "")
	case o.Postgres.Disabled:
		return not(StandbyUnchecked, "")
	case p.At == 0 || now-p.At > o.MaxPatroniAge:
		return not(StandbyPatroniDown, "no answer for %s", stale(p.At, now))
	case p.Err != "":
		return not(StandbyPatroniDown, "%s", p.Err)
	case p.State != "running" && p.State != "streaming":
		return not(StandbyNotRunning, "%s", patroniStateText(p.State))
	case p.Role != "replica" && p.Role != "sync_standby":
		return not(StandbyNotReplica, "role %s", p.Role)
	case truthy(o.Status.Tags["nofailover"]):
		return not(StandbyNoFailover, "")
	case o.Status.PendingRestart:
		return not(StandbyPendingRestart, "")
	case o.Postgres.Err != "":
		return not(StandbyPostgresDown, "%s", o.Postgres.Err)
	case !o.Postgres.InRecovery:
		return not(StandbyNotInRecovery, "")
	case o.WAL.Err != "":
		return not(StandbyPostgresDown, "%s", o.WAL.Err)
	case o.EtcdAt == 0 || now-o.EtcdAt > o.MaxEtcdAge:
		return not(StandbyEtcdStale, "")
	case !o.Leader.Exists:
		return not(StandbyNoLeader, "")
	case o.Leader.Value == o.Member:
		return not(StandbyIsLeader, "")
	case !o.LeaderM.Known:
		return not(StandbyLeaderUnknown, "leader %s", o.Leader.Value)
	case !o.WAL.Checked:
		return not(StandbyPostgresDown, "replication state not read")
	case o.WAL.Status == "":
		return not(StandbyNotStreaming, "no WAL receiver (rewinding, or its timeline diverged from %s's)", o.Leader.Value)
	case o.WAL.Status != "streaming":
		return not(StandbyNotStreaming, "WAL receiver %s", o.WAL.Status)
	case o.LeaderM.Host != "" && o.WAL.SenderHost != o.LeaderM.Host:
		return not(StandbyWrongSender, "from %q, leader %s is %q", o.WAL.SenderHost, o.Leader.Value, o.LeaderM.Host)
	case o.LeaderM.Timeline != 0 && o.WAL.Timeline != o.LeaderM.Timeline:
		return not(StandbyTimeline, "%d, leader %d", o.WAL.Timeline, o.LeaderM.Timeline)
	}
	r.LagBytes = max(0, max(o.Optime, o.LeaderM.XlogLoc)-o.WAL.ReplayLSN)
	r.LagSeconds = max(0, o.WAL.ReplayAge)
	switch {
	case r.LagBytes > int64(o.Bounds.MaxLagBytes):
		return not(StandbyLagBytes, "%d bytes, bound %d", r.LagBytes, int64(o.Bounds.MaxLagBytes))
	case r.LagSeconds > o.Bounds.MaxLag.Seconds():
		return not(StandbyLagTime, "%.1f s, bound %s", r.LagSeconds, o.Bounds.MaxLag)
	}
	if s := o.Sync; s.Enabled {
		switch {
		case !s.Listening:
			return not(StandbySyncReceiver, "")
		case s.Quarantined > 0 && o.Bounds.QuarantineBlocks:
			return not(StandbyQuarantine, "%d files", s.Quarantined)
		case !o.Peer.Known:
			return not(StandbySyncUnknown, "")
		case !o.Peer.Sending:
			return not(StandbySyncLag, "the ACTIVE's sender is not running")
		case o.Peer.LagSeconds > o.Bounds.MaxSyncLag.Seconds():
			return not(StandbySyncLag, "%.1f s, bound %s", o.Peer.LagSeconds, o.Bounds.MaxSyncLag)
		}
	}
	r.Ready, r.Reason = true, StandbyReady
	if o.Sync.Enabled && o.Sync.Quarantined > 0 {
		r.Detail = fmt.Sprintf("%d files in quarantine (readiness.quarantine-blocks is false)", o.Sync.Quarantined)
	}
	return r
}

func stale(at, now time.Duration) string {
	if at == 0 {
		return "ever"
	}
	return (now - at).Round(time.Millisecond).String()
}

// patroniStateText says what a Patroni state means for a standby.
func patroniStateText(s string) string {
	switch s {
	case "stopped":
		return "stopped: rewind, restart or crash"
	case "creating replica":
		return "creating replica: re-initialising from the leader"
	case "starting":
		return "starting: recovery or after a rewind"
	case "running custom bootstrap script":
		return "running custom bootstrap script"
	case "":
		return "no state"
	}
	return s
}

// truthy follows Patroni's bool(tags.get(...)): true, a non-empty string
// or a non-zero number.
func truthy(v any) bool {
	switch t := v.(type) {
	case bool:
		return t
	case string:
		return t != ""
	case float64:
		return t != 0
	}
	return false
}

// parseLeaderMember reads a Patroni member key value (3.0.x: conn_url,
// timeline, xlog_location).
func parseLeaderMember(b []byte) LeaderMember {
	var m struct {
		ConnURL  string `json:"conn_url"`
		Timeline int64  `json:"timeline"`
		Xlog     int64  `json:"xlog_location"`
	}
	if json.Unmarshal(b, &m) != nil {
		return LeaderMember{}
	}
	lm := LeaderMember{Known: true, Timeline: m.Timeline, XlogLoc: m.Xlog}
	if u, err := url.Parse(m.ConnURL); err == nil {
		lm.Host = u.Hostname()
	}
	return lm
}

// parsePeerSync reads the sync part of a heartbeat (nodes/<node>).
func parsePeerSync(b []byte) PeerSync {
	var hb struct {
		Sync *struct {
			Sending    bool    `json:"sending"`
			LagSeconds float64 `json:"lag_seconds"`
		} `json:"sync"`
	}
	if json.Unmarshal(b, &hb) != nil || hb.Sync == nil {
		return PeerSync{}
	}
	return PeerSync{Known: true, Sending: hb.Sync.Sending, LagSeconds: hb.Sync.LagSeconds}
}

// StuckCause says what the PostgreSQL of a leader-key holder is doing
// instead of accepting writes.
type StuckCause string

// The causes.
const (
	CauseInRecovery    StuckCause = "in_recovery"     // in recovery, replaying from a WAL receiver
	CauseWaitingForWAL StuckCause = "waiting_for_wal" // in standby mode with no WAL source
	CauseStarting      StuckCause = "starting"        // refuses connections while starting up
	CauseDown          StuckCause = "down"            // does not answer
	CausePatroni       StuckCause = "patroni_not_primary"
)

// StuckCauses lists every cause, for the metric.
var StuckCauses = []StuckCause{CauseInRecovery, CauseWaitingForWAL, CauseStarting, CauseDown, CausePatroni}

var causeText = map[StuckCause]string{
	CauseInRecovery:    "in recovery",
	CauseWaitingForWAL: "in standby mode, waiting for WAL",
	CauseStarting:      "starting up (refuses connections)",
	CauseDown:          "down (not answering)",
	CausePatroni:       "not running as primary under Patroni",
}

// Text is the operator's wording of the cause.
func (c StuckCause) Text() string {
	if t, ok := causeText[c]; ok {
		return t
	}
	return string(c)
}

// sqlstateCannotConnectNow is PostgreSQL's "the database system is starting
// up" (and "… is shutting down"): the server runs but refuses sessions.
const sqlstateCannotConnectNow = "57P03"

// leaderWritable says whether the local PostgreSQL accepts writes and, if
// not, what it is doing. Pure.
func leaderWritable(p PatroniView, pg PostgresView, wal WALReceiverView) (bool, StuckCause) {
	switch {
	case pg.Disabled:
		if p.Primary() {
			return true, ""
		}
		return false, CausePatroni
	case pg.Code == sqlstateCannotConnectNow:
		return false, CauseStarting
	case pg.Err != "":
		return false, CauseDown
	case pg.InRecovery && wal.Checked && wal.Status == "":
		return false, CauseWaitingForWAL
	case pg.InRecovery:
		return false, CauseInRecovery
	}
	return true, ""
}

// StuckLeader is published while Patroni holds the leader key for this
// member and its PostgreSQL has accepted no writes for at least
// readiness.stuck-leader-after: no node can be ACTIVE, and Patroni will not
// hand the key over by itself (it renews it "during restarting after
// failure").
type StuckLeader struct {
	Node    string     `json:"node"`
	Member  string     `json:"member"`
	Cause   StuckCause `json:"cause"`
	Since   time.Time  `json:"since"`
	Seconds float64    `json:"seconds"`
	Remedy  string     `json:"remedy"`
}

// Text is the one-line account for status and logs.
func (s StuckLeader) Text() string {
	return fmt.Sprintf("%s: Patroni holds the leader key but PostgreSQL has not accepted writes for %.0f s (%s)",
		s.Node, s.Seconds, s.Cause.Text())
}

// stuckRemedy is what the operator does; hapair itself does not act (README,
// "Stuck leader"): releasing the key is only safe once the peer provably has
// every acknowledged write, and that proof needs the WAL end of a PostgreSQL
// that is not answering.
func stuckRemedy(node string, c StuckCause) string {
	switch c {
	case CauseWaitingForWAL, CauseInRecovery:
		return fmt.Sprintf("if the other node is ready (hapairctl status: streaming, same timeline, lag 0), restart Patroni on %s "+
			"(systemctl restart patroni) so it releases the leader key and the other node is promoted; otherwise read "+
			"PostgreSQL's log on %s (restore_command, recovery target, pg_wal space) and fix its recovery", node, node)
	case CauseStarting:
		return fmt.Sprintf("crash recovery may still be running: watch PostgreSQL's log on %s; if it makes no progress and "+
			"the other node is ready, restart Patroni on %s (systemctl restart patroni)", node, node)
	}
	return fmt.Sprintf("check PostgreSQL and Patroni on %s (journalctl -u patroni); if the other node is ready, stop Patroni "+
		"on %s (systemctl stop patroni) so the leader key expires and the other node is promoted", node, node)
}

// stuckTracker follows how long the leader-key holder has been unwritable;
// owned by the poll goroutine.
type stuckTracker struct {
	since     time.Duration // now() when it became unwritable as leader; 0: not
	sinceWall time.Time
}

// track folds one observation in and returns the stuck leader to publish
// (nil: not stuck). holder: the leader key names this member.
func (t *stuckTracker) track(holder, writable bool, cause StuckCause, after, now time.Duration, wall time.Time,
	node, member string) *StuckLeader {
	if !holder || writable {
		t.since = 0
		return nil
	}
	if t.since == 0 {
		t.since, t.sinceWall = now, wall
	}
	d := now - t.since
	if d < after {
		return nil
	}
	return &StuckLeader{Node: node, Member: member, Cause: cause, Since: t.sinceWall, Seconds: d.Seconds(),
		Remedy: stuckRemedy(node, cause)}
}
