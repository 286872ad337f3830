package roled

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"

	"github.com/hapair/hapair/internal/etcdtest"
	"github.com/hapair/hapair/internal/pgtest"
)

// newTestReplica makes a streaming replica of primary with pg_basebackup -R
// (a real walreceiver, as Patroni sets one up).
func newTestReplica(t *testing.T, primary *pgtest.Server) *pgtest.Server {
	t.Helper()
	r, err := pgtest.New(t)
	if err != nil {
		t.Fatal(err)
	}
	must(t, r.Stop())
	must(t, os.RemoveAll(r.Data))
	must(t, r.Run("pg_basebackup", "-D", r.Data, "-h", "127.0.0.1", "-p", strconv.Itoa(primary.Port),
		"-U", "postgres", "-R", "-X", "stream", "-c", "fast"))
	must(t, r.Start())
	return r
}

func gaugeValue(t *testing.T, n *node, metric string, label ...string) float64 {
	t.Helper()
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(label) == 0 || hasLabel(m, label[0], label[1]) {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("metric %s%v not exported", metric, label)
	return 0
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k && l.GetValue() == v {
			return true
		}
	}
	return false
}

// TestStandbyReadinessRealReplica runs roled on a real PostgreSQL 15
// replica: ready while its walreceiver streams from the leader's host on the
// leader's timeline; not ready, with the reason, once the primary is gone
// (Patroni 3.0.2 would still say `running`). Then the leader key is made to
// name this member: its PostgreSQL, in standby mode with no WAL source, is a
// stuck leader after readiness.stuck-leader-after.
func TestStandbyReadinessRealReplica(t *testing.T) {
	skipShort(t)
	primary := newTestPG(t)
	replica := newTestReplica(t, primary)
	c := etcdtest.New(t)
	cli := c.Client(t)
	put := func(k, v string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := cli.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	// What Patroni 3.0.2 keeps for the leader A.
	put("/service/hapair/leader", "A")
	put("/service/hapair/members/A", `{"conn_url": "postgres://127.0.0.1:`+strconv.Itoa(primary.Port)+
		`/postgres", "state": "running", "role": "master", "version": "3.0.2", "timeline": 1}`)
	b := startNode(t, c, "B", func(cfg *Config) {
		cfg.Postgres.Enabled = true
		cfg.Postgres.DSN = replica.SocketDSN()
		cfg.Readiness.StuckLeaderAfter = time.Second
	})

	var st Status
	waitFor(t, 30*time.Second, "B ready", func() bool { st = b.status(t); return st.Readiness.Ready })
	if r := st.Readiness; r.Reason != StandbyReady || r.Sender != "127.0.0.1" || r.Timeline != 1 {
		t.Fatalf("readiness %+v", r)
	}
	if v := gaugeValue(t, b, "hapair_roled_standby_ready"); v != 1 {
		t.Fatalf("standby_ready = %v", v)
	}

	// Writes on the primary reach the replica; the lag bound holds.
	conn, err := pgx.Connect(context.Background(), primary.SocketDSN())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), "CREATE TABLE t AS SELECT generate_series(1, 10000) AS i"); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(context.Background())

	must(t, primary.Stop())
	waitFor(t, 30*time.Second, "B not streaming", func() bool {
		st = b.status(t)
		return st.Readiness.Reason == StandbyNotStreaming
	})
	if st.Readiness.Ready || st.Patroni.State != "running" {
		t.Fatalf("readiness %+v with Patroni state %q", st.Readiness, st.Patroni.State)
	}
	if v := gaugeValue(t, b, "hapair_roled_standby_not_ready_reason", "reason", string(StandbyNotStreaming)); v != 1 {
		t.Fatalf("not_ready_reason{not_streaming} = %v", v)
	}
	if v := gaugeValue(t, b, "hapair_roled_standby_ready"); v != 0 {
		t.Fatalf("standby_ready = %v", v)
	}

	// The leader key names B, whose PostgreSQL sits in standby mode.
	put("/service/hapair/leader", "B")
	waitFor(t, 30*time.Second, "B a stuck leader waiting for WAL", func() bool {
		st = b.status(t)
		return st.StuckLeader != nil && st.StuckLeader.Cause == CauseWaitingForWAL
	})
	if st.Role != "passive" || st.Readiness.Reason != StandbyIsLeader {
		t.Fatalf("role %s, readiness %+v", st.Role, st.Readiness)
	}
	if v := gaugeValue(t, b, "hapair_roled_leader_stuck", "cause", string(CauseWaitingForWAL)); v != 1 {
		t.Fatalf("leader_stuck{waiting_for_wal} = %v", v)
	}
	if v := gaugeValue(t, b, "hapair_roled_leader_unwritable_seconds"); v < 1 {
		t.Fatalf("leader_unwritable_seconds = %v", v)
	}
	// The heartbeat carries both.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	waitFor(t, 30*time.Second, "heartbeat with the stuck leader", func() bool {
		r, err := cli.Get(ctx, "/hapair/hapair/nodes/B")
		return err == nil && len(r.Kvs) == 1 && strings.Contains(string(r.Kvs[0].Value), `"stuck_leader"`) &&
			strings.Contains(string(r.Kvs[0].Value), `"is_leader"`)
	})
	// The key moves away: not stuck any more.
	put("/service/hapair/leader", "A")
	waitFor(t, 30*time.Second, "stuck leader cleared", func() bool { return b.status(t).StuckLeader == nil })
}
