package ctl

import (
	"context"
	"fmt"
	"strings"

	"github.com/hapair/hapair/roled"
)

// StandbyReason says why a node is not ready to take over; StandbyReady when
// it is. Patroni 3.0.2 lists a replica as `running` even while it is about to
// find its timeline diverged and shut down for pg_rewind, so "running replica"
// alone is not readiness: the leader must see it streaming, on its timeline.
type StandbyReason int

const (
	StandbyReady        StandbyReason = iota
	StandbyNoLeader                   // no Patroni leader in /cluster
	StandbyIsLeader                   // the node is the leader itself
	StandbyNotMember                  // not listed by Patroni
	StandbyNotReplica                 // listed, but not as a replica
	StandbyNotRunning                 // its PostgreSQL is not running (starting, stopped, rewinding…)
	StandbyTimeline                   // on another timeline than the leader
	StandbyNotStreaming               // the leader has no streaming walsender for it
	StandbyLagging                    // replay lag above the bound
	StandbyNotPassive                 // roled on it is not PASSIVE
	// StandbyRoled: roled on the standby computed its own readiness
	// (roled/readiness.go) and says not ready; the detail is its reason.
	StandbyRoled
)

var standbyReasonText = [...]string{
	StandbyReady:        "ready",
	StandbyNoLeader:     "no Patroni leader",
	StandbyIsLeader:     "is the leader",
	StandbyNotMember:    "not a Patroni member",
	StandbyNotReplica:   "not a replica",
	StandbyNotRunning:   "PostgreSQL not running",
	StandbyTimeline:     "timeline differs from the leader's",
	StandbyNotStreaming: "not streaming from the leader",
	StandbyLagging:      "replication lag above the bound",
	StandbyNotPassive:   "roled not PASSIVE",
	StandbyRoled:        "not ready (roled)",
}

func (r StandbyReason) String() string {
	if int(r) < len(standbyReasonText) {
		return standbyReasonText[r]
	}
	return fmt.Sprintf("StandbyReason(%d)", int(r))
}

// Replication is one walsender row of the leader's Patroni /patroni answer
// (pg_stat_replication).
type Replication struct {
	ApplicationName string `json:"application_name"`
	State           string `json:"state"`
}

// StandbyView is what standbyReady decides on: Patroni's /cluster, the
// leader's walsenders and roled's role on the standby ("" when roled is not
// configured for it).
type StandbyView struct {
	Members    []PatroniMember
	LeaderRepl []Replication
	RoledRole  string
	MaxLag     int64 // bytes; 0: no bound
}

// standbyReady is the pure decision: is member ready to take over?
func standbyReady(v StandbyView, member string) (StandbyReason, string) {
	var leader, self *PatroniMember
	for i := range v.Members {
		m := &v.Members[i]
		if isLeaderRole(m.Role) {
			leader = m
		}
		if m.Name == member {
			self = m
		}
	}
	switch {
	case leader == nil:
		return StandbyNoLeader, ""
	case self == nil:
		return StandbyNotMember, ""
	case self == leader:
		return StandbyIsLeader, ""
	case self.Role != "replica" && self.Role != "sync_standby":
		return StandbyNotReplica, self.Role
	case self.State != "running" && self.State != "streaming":
		return StandbyNotRunning, self.State
	case self.Timeline != leader.Timeline:
		return StandbyTimeline, fmt.Sprintf("%d vs %d", self.Timeline, leader.Timeline)
	}
	streaming := false
	for _, r := range v.LeaderRepl {
		if r.ApplicationName == member && r.State == "streaming" {
			streaming = true
		}
	}
	if !streaming {
		return StandbyNotStreaming, ""
	}
	if lag, ok := lagBytes(self.Lag); v.MaxLag > 0 && (!ok || lag > v.MaxLag) {
		return StandbyLagging, fmt.Sprintf("%v bytes", self.Lag)
	}
	if v.RoledRole != "" && v.RoledRole != "passive" {
		return StandbyNotPassive, v.RoledRole
	}
	return StandbyReady, ""
}

func isLeaderRole(role string) bool {
	return role == "leader" || role == "standby_leader" || role == "master" || role == "primary"
}

// lagBytes reads Patroni's lag field: a number of bytes, or "unknown".
func lagBytes(v any) (int64, bool) {
	switch l := v.(type) {
	case nil:
		return 0, true
	case float64:
		return int64(l), true
	}
	return 0, false
}

// leaderReplication reads the walsenders of the Patroni leader among members
// from its own /patroni (nil when no configured node is the leader).
func (c *Client) leaderReplication(ctx context.Context, members []PatroniMember) []Replication {
	for _, m := range members {
		if !isLeaderRole(m.Role) {
			continue
		}
		for _, ln := range c.Cfg.Nodes {
			if ln.Member() == m.Name && ln.PatroniURL != "" {
				var st struct {
					Replication []Replication `json:"replication"`
				}
				if err := c.getPatroniJSON(ctx, strings.TrimSuffix(ln.PatroniURL, "/")+"/patroni", &st); err == nil {
					return st.Replication
				}
			}
		}
	}
	return nil
}

// roledReadiness is the readiness roled computed on the node itself, which
// sees what Patroni and the leader cannot (its own pg_stat_wal_receiver,
// files in quarantine). ok is false when roled did not publish one (an older
// roled, unreachable, or postgres.enabled false there): then hapairctl falls
// back to standbyReady on Patroni's /cluster.
func roledReadiness(rn RoledNode) (reason StandbyReason, detail string, ok bool) {
	r := rn.Readiness
	switch {
	case rn.Error != "" || r == nil || r.Reason == "" || r.Reason == roled.StandbyUnchecked:
		return 0, "", false
	case r.Ready:
		return StandbyReady, "", true
	}
	return StandbyRoled, r.Text(), true
}

// StandbyReadiness says whether n could take over now: roled's own
// readiness when it publishes one, else standbyReady on what Patroni and
// roled show from outside.
func (c *Client) StandbyReadiness(ctx context.Context, n Node) (StandbyReason, string) {
	var rn RoledNode
	if n.RoledURL != "" {
		rn = c.Roled(ctx, n)
		if reason, detail, ok := roledReadiness(rn); ok {
			return reason, detail
		}
	}
	v := StandbyView{Members: c.patroniCluster(ctx), MaxLag: c.Cfg.Drill.MaxLag, RoledRole: rn.Role}
	v.LeaderRepl = c.leaderReplication(ctx, v.Members)
	return standbyReady(v, n.Member())
}
