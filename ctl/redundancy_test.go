package ctl

import (
	"strings"
	"testing"
	"time"

	"github.com/hapair/hapair/roled"
)

func TestAssess(t *testing.T) {
	nodes := []Node{{Name: "a"}, {Name: "b"}}
	etcd := []EtcdMember{{Name: "a", Healthy: true}, {Name: "b", Healthy: true}, {Name: "witness", Healthy: true}}
	roles := func(a, b string) []RoledNode { return []RoledNode{{Node: "a", Role: a}, {Node: "b", Role: b}} }
	lb := []LBServer{{Backend: "app", Name: "a", Eligible: true}, {Backend: "app", Name: "b"}}
	base := func() Status { return Status{Etcd: etcd, Roled: roles("active", "passive"), Backends: lb} }
	cases := []struct {
		name    string
		st      func() Status
		standby StandbyReason
		want    Level
		reason  string
	}{
		{"redundant", base, StandbyReady, Redundant, ""},
		{"standby rewinding", base, StandbyNotRunning, Degraded, "b: PostgreSQL not running"},
		{"etcd member down", func() Status {
			s := base()
			s.Etcd = []EtcdMember{etcd[0], etcd[1], {Name: "witness", Error: "context deadline exceeded"}}
			return s
		}, StandbyReady, Degraded, "etcd member witness down (context deadline exceeded)"},
		{"two etcd members only", func() Status { s := base(); s.Etcd = etcd[:2]; return s }, StandbyReady, Degraded, "2 etcd members"},
		{"sender failing", func() Status {
			s := base()
			s.Roled[0].Sync.LastError = "peer refused"
			return s
		}, StandbyReady, Degraded, "file sync: peer refused"},
		{"no ACTIVE", func() Status { s := base(); s.Roled = roles("passive", "passive"); return s }, StandbyReady, NotServing, "no node is ACTIVE"},
		{"ACTIVE unreachable", func() Status {
			s := base()
			s.Roled[0].Error = "connection refused"
			return s
		}, StandbyReady, NotServing, "no node is ACTIVE"},
		{"balancer elsewhere", func() Status {
			s := base()
			s.Backends = []LBServer{{Backend: "app", Name: "a"}, {Backend: "app", Name: "b"}}
			return s
		}, StandbyReady, NotServing, "balancer does not serve from a"},
		{"takeover alarm", func() Status { s := base(); s.Alarms = []Alarm{{Key: "/hapair/x/alarm/takeover/a"}}; return s }, StandbyReady, NotServing, "takeover alarm"},
		// An acknowledged alarm stays in etcd until Patroni re-creates its
		// leader key; the node it let through serves meanwhile.
		{"takeover alarm acknowledged", func() Status {
			s := base()
			s.Alarms = []Alarm{{Key: "/hapair/x/alarm/takeover/a", Value: `{"node":"a","acked":true,"acked_by":"ops"}`}}
			return s
		}, StandbyReady, Redundant, ""},
		{"no roled: the Patroni leader serves", func() Status {
			s := base()
			s.Roled = []RoledNode{{Node: "a", Role: "n/a"}, {Node: "b", Role: "n/a"}}
			s.Leader = &LeaderKey{Member: "a"}
			return s
		}, StandbyReady, Redundant, ""},
	}
	rewinding := &roled.Readiness{Reason: roled.StandbyNotRunning, Detail: "stopped: rewind, restart or crash"}
	cases = append(cases, []struct {
		name    string
		st      func() Status
		standby StandbyReason
		want    Level
		reason  string
	}{
		{"roled's own reason", base, StandbyRoled, Degraded, "b: not streaming from the leader (no WAL receiver)"},
		// Issue 17 scenario (b): the primary died while the other node
		// rewinds: status names why nothing takes over.
		{"no failover candidate", func() Status {
			s := base()
			s.Roled = roles("unknown", "passive")
			s.Roled[0].Error = "connection refused"
			s.Roled[1].Readiness = rewinding
			return s
		}, StandbyReady, NotServing, "no node is ACTIVE; b cannot take over: PostgreSQL not running under Patroni (stopped: rewind"},
		{"stuck leader", func() Status {
			s := base()
			s.Roled = roles("passive", "passive")
			s.Roled[0].StuckLeader = &roled.StuckLeader{Node: "a", Cause: roled.CauseStarting, Seconds: 31}
			s.Roled[0].Readiness = &roled.Readiness{Reason: roled.StandbyIsLeader}
			return s
		}, StandbyReady, NotServing, "a: Patroni holds the leader key but PostgreSQL has not accepted writes for 31 s (starting up"},
	}...)
	for _, c := range cases {
		detail := ""
		if c.standby == StandbyRoled {
			detail = "not streaming from the leader (no WAL receiver)"
		}
		r := assess(c.st(), nodes, "app", c.standby, detail)
		if r.Level != c.want || !strings.Contains(r.Line(), c.reason) {
			t.Errorf("%s: %v %q, want %v with %q", c.name, r.Level, r.Line(), c.want, c.reason)
		}
	}
}

// TestSyncErrorCurrent: a sync error followed by a full reconcile is over.
func TestSyncErrorCurrent(t *testing.T) {
	t0 := time.Now()
	t1 := t0.Add(time.Second)
	var n RoledNode
	if syncErrorCurrent(n) {
		t.Error("no error counted as current")
	}
	n.Sync.LastError = "dial tcp: connection refused"
	if !syncErrorCurrent(n) {
		t.Error("an error without times is current")
	}
	n.Sync.LastErrorAt, n.Sync.LastReconcile = &t0, &t1
	if syncErrorCurrent(n) {
		t.Error("an error before a successful reconcile counted as current")
	}
	n.Sync.LastErrorAt, n.Sync.LastReconcile = &t1, &t0
	if !syncErrorCurrent(n) {
		t.Error("an error after the last reconcile is current")
	}
}
