package roled

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/hapair/hapair/internal/etcdtest"
)

// TestRewindHold: while a takeover alarm naming this node is held for a
// person, Patroni's rewind user cannot log in to this node's PostgreSQL (the
// other node's Patroni cannot pg_rewind its data away before the person
// decides) and its open session is ended; the superuser is unaffected. Once
// the alarm is acknowledged, the rewind user logs in again. Real etcd, real
// PostgreSQL 15, fake Patroni.
func TestRewindHold(t *testing.T) {
	skipShort(t)
	pg := newTestPG(t)
	dsn := func(user string) string {
		return fmt.Sprintf("host=%s port=%d user=%s dbname=postgres sslmode=disable", pg.Sock, pg.Port, user)
	}
	connect := func(user string) (*pgx.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return pgx.Connect(ctx, dsn(user))
	}
	refused := func(err error) bool {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && pe.Code == "28000" // invalid_authorization_specification: not permitted to log in
	}
	su, err := connect("postgres")
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(context.Background())
	if _, err := su.Exec(context.Background(), "CREATE ROLE rewind_user LOGIN"); err != nil {
		t.Fatal(err)
	}
	c := etcdtest.New(t)
	a := startNode(t, c, "A", func(cfg *Config) {
		cfg.Postgres.Enabled = true
		cfg.Postgres.DSN = pg.SocketDSN()
		cfg.Postgres.Fence = FenceConfig{RewindRole: "rewind_user", RetryInterval: 200 * time.Millisecond}
	})
	b := startNode(t, c, "B", nil)
	hold := func() RewindHoldStatus {
		t.Helper()
		h := a.status(t).Postgres.RewindHold
		if h == nil {
			t.Fatal("no rewind_hold in /role")
		}
		return *h
	}
	waitFor(t, 5*time.Second, "hold off at start", func() bool { return hold().State == RewindHoldOff })
	a.pat.promote()
	a.waitCode(t, 200, 10*time.Second)
	// B takes over and serves; A's Patroni overwrites B's key: B was
	// ACTIVE after A, so the guard holds the alarm for a person.
	a.pat.dropKey()
	b.pat.promote()
	b.waitCode(t, 200, 10*time.Second)
	a.waitCode(t, 503, 10*time.Second)
	open, err := connect("rewind_user") // a rewind in progress
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close(context.Background())
	b.pat.set(func(p *fakePatroni) { p.primary = false })
	overwrite := time.Now()
	a.pat.overwrite()
	waitFor(t, 5*time.Second, "rewind hold set", func() bool { return hold().State == RewindHoldSet })
	took := time.Since(overwrite)
	t.Logf("rewind hold set %v after the overwrite (Patroni's rewind came 2.6-3.6 s after it in the soaks)", took)
	if _, err := connect("rewind_user"); !refused(err) {
		t.Fatalf("rewind user login while held: %v, want refused (28000)", err)
	}
	if err := open.Ping(context.Background()); err == nil {
		t.Fatal("the rewind user's open session survived the hold")
	}
	if err := su.Ping(context.Background()); err != nil {
		t.Fatalf("superuser session: %v", err)
	}
	waitFor(t, 5*time.Second, "the alarm held with "+string(GuardOtherActiveLater), func() bool {
		st := a.status(t)
		return len(st.Takeover) == 1 && st.Takeover[0].Guard == GuardOtherActiveLater
	})
	if h := hold(); h.State != RewindHoldSet {
		t.Fatalf("hold %+v while the alarm is held", h)
	}
	// The person keeps A: the rewind may go ahead.
	if _, err := AckTakeover(context.Background(), c.Client(t), Prefix("hapair"), "A", "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "rewind hold lifted", func() bool { return hold().State == RewindHoldOff })
	conn, err := connect("rewind_user")
	if err != nil {
		t.Fatalf("rewind user after the ack: %v", err)
	}
	conn.Close(context.Background())
	a.waitCode(t, 200, 10*time.Second)
}
