package roled

import (
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// good is an observation under which a node should be ACTIVE at time sec(10).
func good() Observation {
	return Observation{
		LeaseID: 7, Deadline: sec(14),
		EtcdAt: sec(9.5), EtcdOKAt: sec(9.8), QuorumLossAfter: sec(1),
		Leader:  KeyView{Exists: true, Value: "pgA", CreateRev: 5, ModRev: 5, Version: 1, Lease: 99},
		Patroni: PatroniView{At: sec(9.8), Code: 200, Role: "master", State: "running"},
		Member:  "pgA", Node: "A",
		MaxEtcdAge: sec(4), MaxPatroniAge: sec(2.5),
	}
}

func sec(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

// TestDecide walks Patroni view × leader key × lease state × deadline,
// including garbage and timeouts.
func TestDecide(t *testing.T) {
	now := sec(10)
	held := func(o *Observation) { o.Active = KeyView{Exists: true, CreateRev: 42, Lease: 7}; o.Epoch = 42 }
	cases := []struct {
		name   string
		cur    Role
		mut    func(*Observation)
		want   Role
		reason Reason
	}{
		{"all good from passive", RolePassive, nil, RoleActive, ReasonPrimary},
		{"all good, key ours, stays active", RoleActive, held, RoleActive, ReasonPrimary},
		{"newer patroni says primary", RolePassive, func(o *Observation) { o.Patroni.Role = "primary" }, RoleActive, ReasonPrimary},
		{"key already ours from passive (failed release)", RolePassive, held, RoleActive, ReasonPrimary},
		{"stopping", RoleActive, func(o *Observation) { held(o); o.Stopping = true }, RolePassive, ReasonStopping},
		{"no lease", RolePassive, func(o *Observation) { o.LeaseID = 0 }, RolePassive, ReasonNoLease},
		{"deadline passed", RoleActive, func(o *Observation) { held(o); o.Deadline = now }, RolePassive, ReasonDeadline},
		{"deadline long passed (paused process)", RoleActive, func(o *Observation) { held(o); o.Deadline = sec(2) }, RolePassive, ReasonDeadline},
		{"majority out of reach for quorum-loss-after", RoleActive, func(o *Observation) { held(o); o.EtcdOKAt = sec(9) }, RolePassive, ReasonQuorumLost},
		{"majority out of reach, passive stays passive", RolePassive, func(o *Observation) { o.EtcdOKAt = sec(8.5) }, RolePassive, ReasonQuorumLost},
		{"last success just inside quorum-loss-after", RoleActive, func(o *Observation) { held(o); o.EtcdOKAt = sec(9.01) }, RoleActive, ReasonPrimary},
		{"quorum check off: only the deadline", RoleActive, func(o *Observation) { held(o); o.EtcdOKAt = 0; o.QuorumLossAfter = 0 }, RoleActive, ReasonPrimary},
		{"deadline is reported before quorum loss", RoleActive, func(o *Observation) { held(o); o.EtcdOKAt = 0; o.Deadline = now }, RolePassive, ReasonDeadline},
		{"etcd never read", RolePassive, func(o *Observation) { o.EtcdAt = 0 }, RolePassive, ReasonEtcdStale},
		{"etcd view stale", RoleActive, func(o *Observation) { held(o); o.EtcdAt = sec(5) }, RolePassive, ReasonEtcdStale},
		{"takeover alarm", RolePassive, func(o *Observation) { o.TakeoverFor = true }, RolePassive, ReasonTakeover},
		{"takeover check pending", RolePassive, func(o *Observation) { o.TakeoverUnchecked = true }, RolePassive, ReasonTakeoverPending},
		{"step-down requested while active", RoleActive, func(o *Observation) { o.StepDown = true }, RolePassive, ReasonStepDown},
		{"step-down requested while passive", RolePassive, func(o *Observation) { o.StepDown = true }, RolePassive, ReasonStepDown},
		{"takeover alarm while active", RoleActive, func(o *Observation) { held(o); o.TakeoverFor = true }, RolePassive, ReasonTakeover},
		{"patroni never answered", RolePassive, func(o *Observation) { o.Patroni = PatroniView{} }, RolePassive, ReasonPatroniStale},
		{"patroni answer stale", RoleActive, func(o *Observation) { held(o); o.Patroni.At = sec(7) }, RolePassive, ReasonPatroniStale},
		{"patroni timeout", RoleActive, func(o *Observation) {
			held(o)
			o.Patroni = PatroniView{At: now, Err: "context deadline exceeded"}
		}, RolePassive, ReasonPatroniDown},
		{"patroni garbage", RolePassive, func(o *Observation) {
			o.Patroni = PatroniView{At: now, Err: "not json", Garbage: true, Code: 200}
		}, RolePassive, ReasonPatroniGarbage},
		{"patroni 503 replica", RolePassive, func(o *Observation) { o.Patroni.Code = 503; o.Patroni.Role = "replica" }, RolePassive, ReasonPatroniNotLeader},
		{"patroni 200 but role replica", RolePassive, func(o *Observation) { o.Patroni.Role = "replica" }, RolePassive, ReasonPatroniNotLeader},
		{"patroni 503 but role master (demoting)", RoleActive, func(o *Observation) { held(o); o.Patroni.Code = 503 }, RolePassive, ReasonPatroniNotLeader},
		{"patroni state stopping", RoleActive, func(o *Observation) { held(o); o.Patroni.State = "stopping" }, RolePassive, ReasonPatroniNotLeader},
		{"postgres refuses", RoleActive, func(o *Observation) { held(o); o.Postgres.Err = "connection refused" }, RolePassive, ReasonPostgresDown},
		{"postgres in recovery", RolePassive, func(o *Observation) { o.Postgres.InRecovery = true }, RolePassive, ReasonInRecovery},
		{"postgres check disabled", RolePassive, func(o *Observation) { o.Postgres = PostgresView{Disabled: true, InRecovery: true} }, RoleActive, ReasonPrimary},
		{"leader key missing", RolePassive, func(o *Observation) { o.Leader = KeyView{} }, RolePassive, ReasonLeaderMissing},
		{"leader key names peer", RoleActive, func(o *Observation) { held(o); o.Leader.Value = "pgB" }, RolePassive, ReasonLeaderOther},
		{"active key held by peer", RolePassive, func(o *Observation) { o.Active = KeyView{Exists: true, CreateRev: 40, Lease: 8} }, RolePassive, ReasonActiveHeld},
		{"our old key on an old lease", RolePassive, func(o *Observation) {
			o.Active = KeyView{Exists: true, CreateRev: 40, Lease: 3}
			o.ActiveNode = "A"
		}, RolePassive, ReasonActiveHeld},
		{"active key vanished", RoleActive, func(o *Observation) { held(o); o.Active = KeyView{} }, RolePassive, ReasonActiveLost},
		{"active key re-created (other epoch)", RoleActive, func(o *Observation) { held(o); o.Active.CreateRev = 50 }, RolePassive, ReasonActiveLost},
		{"hook backoff", RolePassive, func(o *Observation) { o.HookBackoffUntil = sec(11) }, RolePassive, ReasonHookBackoff},
		{"hook backoff over", RolePassive, func(o *Observation) { o.HookBackoffUntil = sec(10) }, RoleActive, ReasonPrimary},
		{"deadline wins over a good patroni", RolePassive, func(o *Observation) { o.Deadline = sec(9) }, RolePassive, ReasonDeadline},
		{"commits hang, sync-strict: passive (503)", RoleActive, func(o *Observation) {
			held(o)
			o.HoldOnHungCommits, o.Commits = true, CommitView{Checked: true, Hung: true, HungSince: sec(8)}
		}, RolePassive, ReasonCommitsHung},
		{"commits hang, sync-strict, passive stays passive", RolePassive, func(o *Observation) {
			o.HoldOnHungCommits, o.Commits = true, CommitView{Checked: true, Hung: true}
		}, RolePassive, ReasonCommitsHung},
		{"commits hang, sync or async: reported, still active", RoleActive, func(o *Observation) {
			held(o)
			o.Commits = CommitView{Checked: true, Hung: true, HungSince: sec(8)}
		}, RoleActive, ReasonPrimary},
		{"commits complete, sync-strict: active", RolePassive, func(o *Observation) {
			o.HoldOnHungCommits, o.Commits = true, CommitView{Checked: true, LastOK: sec(9.9)}
		}, RoleActive, ReasonPrimary},
		{"postgres down is reported before hung commits", RoleActive, func(o *Observation) {
			held(o)
			o.Postgres.Err = "connection refused"
			o.HoldOnHungCommits, o.Commits = true, CommitView{Checked: true, Hung: true}
		}, RolePassive, ReasonPostgresDown},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := good()
			if tc.mut != nil {
				tc.mut(&o)
			}
			got, reason := decide(tc.cur, o, now)
			if got != tc.want || reason != tc.reason {
				t.Fatalf("decide = %v/%s, want %v/%s", got, reason, tc.want, tc.reason)
			}
		})
	}
}

// TestTakeoverBlocks covers alarm and local detection, acknowledged or not.
func TestTakeoverBlocks(t *testing.T) {
	tk := &TakeoverAlarm{Member: "pgA", CreateRevision: 32, ModRevision: 67}
	cases := []struct {
		name string
		v    etcdView
		want bool
	}{
		{"nothing", etcdView{}, false},
		{"detected, not yet written", etcdView{takeover: tk}, true},
		{"detected for the peer", etcdView{takeover: &TakeoverAlarm{Member: "pgB"}}, false},
		{"alarm in etcd", etcdView{alarms: []TakeoverAlarm{*tk}}, true},
		{"alarm acked, same event", etcdView{takeover: tk, alarms: []TakeoverAlarm{{Member: "pgA", CreateRevision: 32, ModRevision: 67, Acked: true}}}, false},
		{"alarm acked, new overwrite", etcdView{takeover: &TakeoverAlarm{Member: "pgA", CreateRevision: 32, ModRevision: 90},
			alarms: []TakeoverAlarm{{Member: "pgA", CreateRevision: 32, ModRevision: 67, Acked: true}}}, true},
		{"alarm for the peer", etcdView{alarms: []TakeoverAlarm{{Member: "pgB"}}}, false},
	}
	for _, tc := range cases {
		if got := tc.v.takeoverBlocks("pgA"); got != tc.want {
			t.Errorf("%s: takeoverBlocks = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestReplicaReply(t *testing.T) {
	cfg := DefaultConfig().ReplicaAgent
	cases := []struct {
		name   string
		st     replicaStats
		err    bool
		optime int64
		want   string
	}{
		{"unreachable", replicaStats{}, true, 0, "down"},
		{"primary", replicaStats{InRecovery: false}, false, 0, "drain"},
		{"no lag", replicaStats{InRecovery: true, ReplayLSN: 1000, MaxConnections: 100}, false, 1000, "up ready 100%"},
		{"half lag", replicaStats{InRecovery: true, ReplayLSN: 0, MaxConnections: 100}, false, 32 << 20, "up ready 53%"},
		{"at max lag", replicaStats{InRecovery: true, ReceiveLag: 64 << 20}, false, 0, "up ready 5%"},
		{"over max lag", replicaStats{InRecovery: true, ReceiveLag: 64<<20 + 1}, false, 0, "drain"},
		{"too many connections", replicaStats{InRecovery: true, Connections: 91, MaxConnections: 100}, false, 0, "drain"},
	}
	for _, tc := range cases {
		var err error
		if tc.err {
			err = errGarbage
		}
		if got := replicaReply(cfg, tc.st, err, tc.optime); got != tc.want {
			t.Errorf("%s: reply %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestConfig(t *testing.T) {
	var c Config = DefaultConfig()
	if err := yaml.Unmarshal([]byte("node: A\nreplica-agent: {max-lag: 16MB}\n"), &c); err != nil {
		t.Fatal(err)
	}
	if c.ReplicaAgent.MaxLag != 16<<20 {
		t.Fatalf("max-lag = %d, want %d", c.ReplicaAgent.MaxLag, 16<<20)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := []func(*Config){
		func(c *Config) { c.Node = "" },
		func(c *Config) { c.LeaseTTL = 10 * time.Second },
		func(c *Config) { c.LeaseTTL = 2500 * time.Millisecond },
		func(c *Config) { c.SafetyMargin = 4 * time.Second },
		func(c *Config) { c.KeepAliveInterval = 3 * time.Second },
		func(c *Config) { c.Agent.PassiveReply = "stop" },
		func(c *Config) { c.Patroni.URL = "localhost:8008" },
		func(c *Config) { c.ReplicaAgent.Listen = ":7403"; c.ReplicaAgent.MinWeight = 0 },
	}
	for i, f := range bad {
		c := DefaultConfig()
		c.Node = "A"
		f(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("case %d: want a config error", i)
		}
	}
}

// TestQuorumConfig: the quorum check's fields are validated against the lease,
// and each error names its field.
func TestQuorumConfig(t *testing.T) {
	cases := []struct {
		name  string
		mut   func(*Config)
		field string // "" for valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"off", func(c *Config) { c.QuorumLossAfter = 0; c.QuorumCheckInterval = 0 }, ""},
		{"negative", func(c *Config) { c.QuorumLossAfter = -time.Second }, "quorum-loss-after"},
		{"as long as the deadline", func(c *Config) { c.QuorumLossAfter = 4 * time.Second }, "quorum-loss-after"},
		{"probe too slow to survive one miss", func(c *Config) { c.QuorumCheckInterval = 500 * time.Millisecond }, "quorum-check-interval"},
		{"probe period zero", func(c *Config) { c.QuorumCheckInterval = 0 }, "quorum-check-interval"},
		{"unknown etcd-leader word", func(c *Config) { c.EtcdLeader = "witness" }, "etcd-leader"},
	}
	for _, tc := range cases {
		c := DefaultConfig()
		c.Node = "A"
		tc.mut(&c)
		err := c.Validate()
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.field != "" && (err == nil || !strings.Contains(err.Error(), tc.field)):
			t.Errorf("%s: error %v, want one naming %s", tc.name, err, tc.field)
		}
	}
}
