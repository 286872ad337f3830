package ctl

import (
	"fmt"
	"strings"

	"github.com/hapair/hapair/roled"
)

// Level is the answer to the operator's first question after an incident.
// Its value is hapairctl status's exit code.
type Level int

const (
	Redundant  Level = 0 // serving, and the standby could take over now
	Degraded   Level = 1 // serving, but one more failure loses the service
	NotServing Level = 2 // no node is ACTIVE (or nothing can tell)
)

func (l Level) String() string {
	switch l {
	case Redundant:
		return "yes"
	case Degraded:
		return "no"
	}
	return "NOT SERVING"
}

// Redundancy is status's headline: the level and every reason it is not
// better, each naming the part.
type Redundancy struct {
	Level   Level    `json:"level"`
	Verdict string   `json:"verdict"` // yes, no, NOT SERVING
	Active  string   `json:"active,omitempty"`
	Standby string   `json:"standby,omitempty"`
	Reasons []string `json:"reasons,omitempty"`
	// Stuck lists leader-key holders whose PostgreSQL accepts no writes
	// (roled's stuck-leader detection), each with its remedy.
	Stuck []roled.StuckLeader `json:"stuck_leaders,omitempty"`
}

// Line is the first line of hapairctl status.
func (r Redundancy) Line() string {
	switch r.Level {
	case Redundant:
		return fmt.Sprintf("REDUNDANT yes — %s ACTIVE, %s ready to take over", r.Active, r.Standby)
	case Degraded:
		return "REDUNDANT no — " + strings.Join(r.Reasons, "; ")
	}
	return "NOT SERVING — " + strings.Join(r.Reasons, "; ")
}

// assess is the pure decision behind the headline: Status plus the standby's
// readiness (standbyReady, computed by the caller from the same snapshot).
func assess(s Status, nodes []Node, backend string, standby StandbyReason, standbyDetail string) Redundancy {
	var r Redundancy
	active, withRoled := 0, 0
	for _, n := range s.Roled {
		if n.Role == "n/a" { // roled-url not configured for this node
			continue
		}
		withRoled++
		if n.Role == "active" && n.Error == "" {
			active++
			r.Active = n.Node
		}
	}
	if withRoled == 0 && s.Leader != nil { // no roled configured: Patroni's leader serves
		for _, n := range nodes {
			if n.Member() == s.Leader.Member {
				r.Active, active = n.Name, 1
			}
		}
	}
	switch {
	case active == 0:
		r.Reasons = append(r.Reasons, "no node is ACTIVE")
	case active > 1:
		r.Reasons = append(r.Reasons, "more than one roled says ACTIVE")
	}
	if s.LBErr == "" && len(s.Backends) > 0 && r.Active != "" && !contains(s.Serving(backend), r.Active) {
		r.Reasons = append(r.Reasons, "the balancer does not serve from "+r.Active)
	}
	for _, a := range s.Alarms {
		if !a.Acked() {
			r.Reasons = append(r.Reasons, "takeover alarm "+a.Key)
		}
	}
	for _, n := range s.Roled {
		if n.StuckLeader != nil && n.Error == "" {
			r.Reasons = append(r.Reasons, n.StuckLeader.Text())
			r.Stuck = append(r.Stuck, *n.StuckLeader)
		}
	}
	if len(r.Reasons) > 0 {
		if active == 0 {
			// Why no failover happens: what each node's roled says about
			// its readiness to take over.
			for _, n := range s.Roled {
				if rd := n.Readiness; n.Error == "" && rd != nil && !rd.Ready && n.StuckLeader == nil &&
					rd.Reason != roled.StandbyUnchecked && rd.Reason != roled.StandbyIsActive {
					r.Reasons = append(r.Reasons, n.Node+" cannot take over: "+rd.Text())
				}
			}
		}
		r.Level, r.Verdict = NotServing, NotServing.String()
		return r
	}
	for _, n := range nodes {
		if n.Name != r.Active {
			r.Standby = n.Name
		}
	}
	for _, m := range s.Etcd {
		if !m.Healthy {
			r.Reasons = append(r.Reasons, fmt.Sprintf("etcd member %s down (%s)", m.Name, m.Error))
		}
	}
	if s.EtcdErr != "" {
		r.Reasons = append(r.Reasons, "etcd: "+s.EtcdErr)
	} else if len(s.Etcd) < 3 {
		r.Reasons = append(r.Reasons, fmt.Sprintf("%d etcd members, want 3", len(s.Etcd)))
	}
	switch {
	case r.Standby == "":
		r.Reasons = append(r.Reasons, "no second node configured")
	case standby == StandbyRoled: // roled's own words
		r.Reasons = append(r.Reasons, r.Standby+": "+standbyDetail)
	case standby != StandbyReady:
		msg := r.Standby + ": " + standby.String()
		if standbyDetail != "" {
			msg += " (" + standbyDetail + ")"
		}
		r.Reasons = append(r.Reasons, msg)
	}
	for _, n := range s.Roled {
		if n.Node == r.Active && syncErrorCurrent(n) { // the ACTIVE's sender
			r.Reasons = append(r.Reasons, r.Active+" → "+r.Standby+" file sync: "+n.Sync.LastError)
		}
	}
	if len(r.Reasons) > 0 {
		r.Level, r.Verdict = Degraded, Degraded.String()
		return r
	}
	r.Level, r.Verdict = Redundant, Redundant.String()
	return r
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// syncErrorCurrent: the ACTIVE's sender reports an error that no full
// reconcile has come after. roled keeps its last error; one from before a
// successful reconcile is over (a fresh deployment's first node starts
// before its peer's receiver listens: that error stayed and status said
// REDUNDANT no for good; found by TestDeploySystemd).
func syncErrorCurrent(n RoledNode) bool {
	if n.Sync.LastError == "" {
		return false
	}
	if n.Sync.LastErrorAt == nil || n.Sync.LastReconcile == nil {
		return true
	}
	return !n.Sync.LastReconcile.After(*n.Sync.LastErrorAt)
}
