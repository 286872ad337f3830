package roled

import (
	"strings"
	"testing"
	"time"
)

// readyObs is a standby that could take over at time sec(10): nodea, a
// Patroni 3.0.2 replica (`running`), streaming from the leader nodeb's host
// on its timeline, nothing to replay, files in sync.
func readyObs() StandbyObservation {
	return StandbyObservation{
		Patroni:  PatroniView{At: sec(9.8), Code: 503, Role: "replica", State: "running"},
		Postgres: PostgresView{InRecovery: true},
		WAL: WALReceiverView{Checked: true, Status: "streaming", SenderHost: "10.0.0.2", Timeline: 4,
			ReplayLSN: 5000, ReceiveLSN: 5000},
		EtcdAt:  sec(9.5),
		Leader:  KeyView{Exists: true, Value: "nodeb", CreateRev: 50, ModRev: 50, Version: 1},
		Member:  "nodea",
		LeaderM: LeaderMember{Known: true, Host: "10.0.0.2", Timeline: 4, XlogLoc: 4800},
		Optime:  5000,
		Peer:    PeerSync{Known: true, Sending: true, LagSeconds: 0.2},
		Sync:    SyncStandby{Enabled: true, Listening: true},

		MaxEtcdAge: sec(4), MaxPatroniAge: sec(2.5),
		Bounds: DefaultReadiness(),
	}
}

// TestStandbyReady walks every reason standbyReady can give, including the
// drill's false "rejoined" of issue 17.
func TestStandbyReady(t *testing.T) {
	now := sec(10)
	cases := []struct {
		name   string
		mut    func(*StandbyObservation)
		want   StandbyReason
		detail string // part of the detail, when it matters
	}{
		{"ready", nil, StandbyReady, ""},
		{"sync standby", func(o *StandbyObservation) { o.Patroni.Role = "sync_standby" }, StandbyReady, ""},
		{"newer patroni says streaming", func(o *StandbyObservation) { o.Patroni.State = "streaming" }, StandbyReady, ""},
		{"no file sync configured", func(o *StandbyObservation) { o.Sync = SyncStandby{}; o.Peer = PeerSync{} }, StandbyReady, ""},
		{"replica ahead of the leader's stale optime", func(o *StandbyObservation) { o.WAL.ReplayLSN = 9000 }, StandbyReady, ""},
		{"lag at the byte bound", func(o *StandbyObservation) { o.Optime = 5000 + 1<<20 }, StandbyReady, ""},

		// Issue 17, the drill's false "rejoined": Patroni 3.0.2 lists the
		// returning old primary as a `running` replica, with a timeline it
		// cached from the leader, seconds before it finds its timeline
		// diverged and stops PostgreSQL for pg_rewind. PostgreSQL is up and
		// in recovery, but no WAL receiver streams: not ready.
		{"running replica, diverged, about to rewind", func(o *StandbyObservation) {
			o.WAL = WALReceiverView{Checked: true, ReplayLSN: 7000, ReceiveLSN: 7000}
		}, StandbyNotStreaming, "no WAL receiver"},
		// The second try of the issue: the receiver starts, but the leader
		// refuses its start point ("requested starting point … is ahead of
		// the WAL flush position"); the receiver keeps restarting.
		{"receiver refused by the leader, retrying", func(o *StandbyObservation) { o.WAL.Status = "starting" }, StandbyNotStreaming, "starting"},
		{"receiver waiting", func(o *StandbyObservation) { o.WAL.Status = "waiting" }, StandbyNotStreaming, "waiting"},
		{"streams from the old primary's host", func(o *StandbyObservation) { o.WAL.SenderHost = "10.0.0.3" }, StandbyWrongSender, "10.0.0.3"},
		{"streams the old timeline", func(o *StandbyObservation) { o.WAL.Timeline = 3 }, StandbyTimeline, "3, leader 4"},

		{"is the ACTIVE node", func(o *StandbyObservation) { o.Active = true }, StandbyIsActive, ""},
		{"postgres check disabled", func(o *StandbyObservation) { o.Postgres = PostgresView{Disabled: true} }, StandbyUnchecked, ""},
		{"patroni never answered", func(o *StandbyObservation) { o.Patroni = PatroniView{} }, StandbyPatroniDown, "ever"},
		{"patroni answer stale", func(o *StandbyObservation) { o.Patroni.At = sec(6) }, StandbyPatroniDown, ""},
		{"patroni unreachable", func(o *StandbyObservation) { o.Patroni.Err = "connection refused" }, StandbyPatroniDown, "refused"},
		{"stopped for pg_rewind", func(o *StandbyObservation) { o.Patroni.State = "stopped" }, StandbyNotRunning, "rewind"},
		{"starting after the rewind", func(o *StandbyObservation) { o.Patroni.State = "starting" }, StandbyNotRunning, "starting"},
		{"re-initialising", func(o *StandbyObservation) { o.Patroni.State = "creating replica" }, StandbyNotRunning, "re-initialising"},
		{"custom bootstrap", func(o *StandbyObservation) { o.Patroni.State = "running custom bootstrap script" }, StandbyNotRunning, "bootstrap"},
		{"restart failed", func(o *StandbyObservation) { o.Patroni.State = "restart failed (stopped)" }, StandbyNotRunning, "restart failed"},
		{"uninitialized", func(o *StandbyObservation) { o.Patroni.Role = "uninitialized" }, StandbyNotReplica, "uninitialized"},
		{"primary", func(o *StandbyObservation) { o.Patroni.Role = "master" }, StandbyNotReplica, "master"},
		{"nofailover tag", func(o *StandbyObservation) { o.Status.Tags = map[string]any{"nofailover": true} }, StandbyNoFailover, ""},
		{"nofailover tag false", func(o *StandbyObservation) { o.Status.Tags = map[string]any{"nofailover": false} }, StandbyReady, ""},
		{"pending restart", func(o *StandbyObservation) { o.Status.PendingRestart = true }, StandbyPendingRestart, ""},
		{"postgres refuses", func(o *StandbyObservation) { o.Postgres = PostgresView{Err: "connection refused"} }, StandbyPostgresDown, "refused"},
		{"postgres promoted", func(o *StandbyObservation) { o.Postgres.InRecovery = false }, StandbyNotInRecovery, ""},
		{"replication query failed", func(o *StandbyObservation) { o.WAL = WALReceiverView{Err: "permission denied"} }, StandbyPostgresDown, "permission"},
		{"replication state not read", func(o *StandbyObservation) { o.WAL = WALReceiverView{} }, StandbyPostgresDown, "not read"},
		{"etcd never read", func(o *StandbyObservation) { o.EtcdAt = 0 }, StandbyEtcdStale, ""},
		{"etcd stale", func(o *StandbyObservation) { o.EtcdAt = sec(5) }, StandbyEtcdStale, ""},
		{"no leader", func(o *StandbyObservation) { o.Leader = KeyView{} }, StandbyNoLeader, ""},
		{"holds the leader key itself", func(o *StandbyObservation) { o.Leader.Value = "nodea" }, StandbyIsLeader, ""},
		{"leader's member key unknown", func(o *StandbyObservation) { o.LeaderM = LeaderMember{} }, StandbyLeaderUnknown, "nodeb"},
		{"replay lag in bytes", func(o *StandbyObservation) { o.Optime = 5000 + 1<<20 + 1 }, StandbyLagBytes, "1048577 bytes"},
		{"lag from the member key's xlog_location", func(o *StandbyObservation) { o.LeaderM.XlogLoc = 5000 + 2<<20 }, StandbyLagBytes, ""},
		{"replay lag in seconds", func(o *StandbyObservation) { o.WAL.ReplayAge = 12.5 }, StandbyLagTime, "12.5 s"},
		{"sync receiver not listening", func(o *StandbyObservation) { o.Sync.Listening = false }, StandbySyncReceiver, ""},
		{"files in quarantine, blocking", func(o *StandbyObservation) { o.Sync.Quarantined = 3; o.Bounds.QuarantineBlocks = true }, StandbyQuarantine, "3 files"},
		{"files in quarantine, reported only", func(o *StandbyObservation) { o.Sync.Quarantined = 3 }, StandbyReady, "3 files in quarantine"},
		{"no heartbeat from the ACTIVE", func(o *StandbyObservation) { o.Peer = PeerSync{} }, StandbySyncUnknown, ""},
		{"the ACTIVE's sender stopped", func(o *StandbyObservation) { o.Peer.Sending = false }, StandbySyncLag, "not running"},
		{"file sync behind", func(o *StandbyObservation) { o.Peer.LagSeconds = 61 }, StandbySyncLag, "61.0 s"},
		// Order: the database comes before the files.
		{"rewinding and files behind", func(o *StandbyObservation) { o.Patroni.State = "stopped"; o.Peer.LagSeconds = 99 }, StandbyNotRunning, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := readyObs()
			if tc.mut != nil {
				tc.mut(&o)
			}
			r := standbyReady(o, now)
			if r.Reason != tc.want || r.Ready != (tc.want == StandbyReady) || !strings.Contains(r.Detail, tc.detail) {
				t.Fatalf("standbyReady = %v/%s (%s), want %s with %q", r.Ready, r.Reason, r.Detail, tc.want, tc.detail)
			}
		})
	}
	for _, r := range StandbyReasons {
		if r.Text() == string(r) {
			t.Errorf("reason %s has no text", r)
		}
	}
}

func TestStandbyReadyLag(t *testing.T) {
	o := readyObs()
	o.Optime, o.WAL.ReplayLSN, o.WAL.ReplayAge = 9000, 5000, 1.5
	r := standbyReady(o, sec(10))
	if !r.Ready || r.LagBytes != 4000 || r.LagSeconds != 1.5 || r.Timeline != 4 || r.Sender != "10.0.0.2" {
		t.Fatalf("readiness %+v", r)
	}
}

func TestParseLeaderMember(t *testing.T) {
	// A Patroni 3.0.2 member key.
	m := parseLeaderMember([]byte(`{"conn_url": "postgres://10.200.0.2:5432/postgres", "api_url": "http://10.200.0.2:8008/patroni",
		"state": "running", "role": "master", "version": "3.0.2", "xlog_location": 67108864, "timeline": 3}`))
	if m != (LeaderMember{Known: true, Host: "10.200.0.2", Timeline: 3, XlogLoc: 67108864}) {
		t.Fatalf("member %+v", m)
	}
	if parseLeaderMember([]byte("garbage")).Known {
		t.Fatal("garbage parsed")
	}
	p := parsePeerSync([]byte(`{"node":"b","role":"active","sync":{"sending":true,"lag_seconds":2.5}}`))
	if p != (PeerSync{Known: true, Sending: true, LagSeconds: 2.5}) {
		t.Fatalf("peer %+v", p)
	}
	if parsePeerSync([]byte(`{"node":"b","role":"active"}`)).Known {
		t.Fatal("heartbeat without sync counted as known")
	}
}

func TestLeaderWritable(t *testing.T) {
	primary := PatroniView{At: 1, Code: 200, Role: "master", State: "running"}
	cases := []struct {
		name  string
		p     PatroniView
		pg    PostgresView
		wal   WALReceiverView
		ok    bool
		cause StuckCause
	}{
		{"writable", primary, PostgresView{}, WALReceiverView{}, true, ""},
		// The soak of issue 17: after crash recovery PostgreSQL sat in
		// standby mode "waiting for WAL to become available" while Patroni
		// kept renewing the leader key.
		{"standby mode, no WAL source", primary, PostgresView{InRecovery: true}, WALReceiverView{Checked: true}, false, CauseWaitingForWAL},
		{"in recovery, replaying", primary, PostgresView{InRecovery: true}, WALReceiverView{Checked: true, Status: "streaming"}, false, CauseInRecovery},
		{"in recovery, receiver not read", primary, PostgresView{InRecovery: true}, WALReceiverView{Err: "x"}, false, CauseInRecovery},
		{"starting up", primary, PostgresView{Err: "the database system is starting up", Code: "57P03"}, WALReceiverView{}, false, CauseStarting},
		{"down", primary, PostgresView{Err: "connection refused"}, WALReceiverView{}, false, CauseDown},
		{"check disabled, patroni primary", primary, PostgresView{Disabled: true}, WALReceiverView{}, true, ""},
		{"check disabled, patroni restarting", PatroniView{At: 1, Code: 200, Role: "master", State: "restarting"},
			PostgresView{Disabled: true}, WALReceiverView{}, false, CausePatroni},
	}
	for _, c := range cases {
		ok, cause := leaderWritable(c.p, c.pg, c.wal)
		if ok != c.ok || cause != c.cause {
			t.Errorf("%s: %v %s, want %v %s", c.name, ok, cause, c.ok, c.cause)
		}
	}
}

// TestStuckTracker: a leader-key holder that is unwritable for less than the
// bound (a promotion, a short crash recovery) is not stuck; past the bound it
// is, with the cause and a remedy; writable again or the key gone clears it.
func TestStuckTracker(t *testing.T) {
	var tr stuckTracker
	after := 30 * time.Second
	wall := time.Date(2026, 12, 1, 23, 0, 0, 0, time.UTC)
	step := func(holder, writable bool, at float64) *StuckLeader {
		return tr.track(holder, writable, CauseWaitingForWAL, after, sec(at), wall.Add(sec(at)), "nodea", "nodea")
	}
	if s := step(true, true, 1); s != nil {
		t.Fatal("writable leader reported stuck")
	}
	if s := step(false, false, 2); s != nil {
		t.Fatal("unwritable non-holder reported stuck")
	}
	if s := step(true, false, 10); s != nil {
		t.Fatal("stuck at once")
	}
	if s := step(true, false, 39.9); s != nil {
		t.Fatal("stuck before the bound")
	}
	s := step(true, false, 40)
	if s == nil || s.Cause != CauseWaitingForWAL || s.Seconds != 30 || !s.Since.Equal(wall.Add(sec(10))) {
		t.Fatalf("stuck = %+v", s)
	}
	if !strings.Contains(s.Remedy, "restart Patroni on nodea") || !strings.Contains(s.Text(), "has not accepted writes for 30 s") {
		t.Fatalf("remedy %q, text %q", s.Remedy, s.Text())
	}
	if s := step(true, true, 41); s != nil {
		t.Fatal("still stuck after a write became possible")
	}
	if s := step(true, false, 50); s != nil {
		t.Fatal("the clock did not restart")
	}
	if s := step(false, false, 90); s != nil {
		t.Fatal("stuck without the key")
	}
	for _, c := range StuckCauses {
		if c.Text() == string(c) || stuckRemedy("n", c) == "" {
			t.Errorf("cause %s lacks text or remedy", c)
		}
	}
}

func TestReadinessConfig(t *testing.T) {
	bad := []func(*Config){
		func(c *Config) { c.Readiness.MaxLagBytes = 0 },
		func(c *Config) { c.Readiness.MaxLag = 0 },
		func(c *Config) { c.Readiness.MaxSyncLag = -time.Second },
		func(c *Config) { c.Readiness.StuckLeaderAfter = 0 },
	}
	for i, f := range bad {
		c := DefaultConfig()
		c.Node = "A"
		f(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), "readiness.") {
			t.Errorf("case %d: error %v, want one naming readiness.*", i, err)
		}
	}
}
