package ctl

import "testing"

func TestStandbyReady(t *testing.T) {
	leader := PatroniMember{Name: "nodeb", Role: "leader", State: "running", Timeline: 3}
	replica := func(mod func(m *PatroniMember)) []PatroniMember {
		m := PatroniMember{Name: "nodea", Role: "replica", State: "running", Timeline: 3, Lag: float64(0)}
		if mod != nil {
			mod(&m)
		}
		return []PatroniMember{leader, m}
	}
	streaming := []Replication{{ApplicationName: "nodea", State: "streaming"}}
	cases := []struct {
		name string
		v    StandbyView
		want StandbyReason
	}{
		{"ready", StandbyView{Members: replica(nil), LeaderRepl: streaming, RoledRole: "passive", MaxLag: 1 << 20}, StandbyReady},
		{"ready, roled not configured", StandbyView{Members: replica(nil), LeaderRepl: streaming}, StandbyReady},
		{"no leader", StandbyView{Members: replica(nil)[1:], LeaderRepl: streaming}, StandbyNoLeader},
		{"not listed", StandbyView{Members: []PatroniMember{leader}, LeaderRepl: streaming}, StandbyNotMember},
		{"is the leader", StandbyView{Members: []PatroniMember{{Name: "nodea", Role: "master", State: "running", Timeline: 3}}}, StandbyIsLeader},
		// The drill's false "rejoined": Patroni lists the returning node as a
		// running replica on the old timeline number, seconds before it finds
		// the timelines diverged and stops it for pg_rewind. The leader has no
		// walsender for it.
		{"running replica, diverged, about to rewind", StandbyView{Members: replica(nil), RoledRole: "passive"}, StandbyNotStreaming},
		{"walsender still starting", StandbyView{Members: replica(nil), LeaderRepl: []Replication{{ApplicationName: "nodea", State: "startup"}}}, StandbyNotStreaming},
		{"another replica streams", StandbyView{Members: replica(nil), LeaderRepl: []Replication{{ApplicationName: "nodec", State: "streaming"}}}, StandbyNotStreaming},
		{"older timeline", StandbyView{Members: replica(func(m *PatroniMember) { m.Timeline = 2 }), LeaderRepl: streaming}, StandbyTimeline},
		{"stopped for rewind", StandbyView{Members: replica(func(m *PatroniMember) { m.State = "stopped" }), LeaderRepl: streaming}, StandbyNotRunning},
		{"starting", StandbyView{Members: replica(func(m *PatroniMember) { m.State = "starting" }), LeaderRepl: streaming}, StandbyNotRunning},
		{"uninitialized role", StandbyView{Members: replica(func(m *PatroniMember) { m.Role = "uninitialized" }), LeaderRepl: streaming}, StandbyNotReplica},
		{"lag above bound", StandbyView{Members: replica(func(m *PatroniMember) { m.Lag = float64(2 << 20) }), LeaderRepl: streaming, MaxLag: 1 << 20}, StandbyLagging},
		{"lag unknown", StandbyView{Members: replica(func(m *PatroniMember) { m.Lag = "unknown" }), LeaderRepl: streaming, MaxLag: 1 << 20}, StandbyLagging},
		{"lag ignored without a bound", StandbyView{Members: replica(func(m *PatroniMember) { m.Lag = float64(2 << 20) }), LeaderRepl: streaming}, StandbyReady},
		{"sync standby", StandbyView{Members: replica(func(m *PatroniMember) { m.Role = "sync_standby" }), LeaderRepl: streaming}, StandbyReady},
		{"roled still active", StandbyView{Members: replica(nil), LeaderRepl: streaming, RoledRole: "active"}, StandbyNotPassive},
		{"roled unreachable", StandbyView{Members: replica(nil), LeaderRepl: streaming, RoledRole: "unknown"}, StandbyNotPassive},
	}
	for _, c := range cases {
		got, detail := standbyReady(c.v, "nodea")
		if got != c.want {
			t.Errorf("%s: %v (%s), want %v", c.name, got, detail, c.want)
		}
	}
	if s := StandbyNotStreaming.String(); s != "not streaming from the leader" {
		t.Errorf("String: %q", s)
	}
}
