package lab

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/hapair/hapair/internal/pgtest"
)

// TestAppPoolRefills: the test application keeps its pool at full size,
// also after the database restarted and every pooled connection died (a
// pool stuck at one connection made the first writes on a new primary open
// cold connections, which is not what the lab means to measure).
func TestAppPoolRefills(t *testing.T) {
	pgtest.Require(t)
	pg, err := pgtest.New(t)
	if err != nil {
		t.Fatal(err)
	}
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=1", pg.Port)
	a := &App{dsn: dsn, conns: make(chan *pgx.Conn, 4), slots: make(chan struct{}, 4)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.keepWarm(ctx, 20*time.Millisecond) }()
	t.Cleanup(func() { cancel(); <-done })

	full := func(what string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for len(a.conns) != cap(a.conns) || a.open.Load() != int32(cap(a.conns)) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d idle, %d open; want %d", what, len(a.conns), a.open.Load(), cap(a.conns))
			}
			time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
		}
	}
	full("at start")
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	// Every pooled connection is dead now; the refresh replaces them all.
	deadline := time.Now().Add(15 * time.Second)
	for {
		full("after the restart")
		live := 0
		for range cap(a.conns) {
			a.slots <- struct{}{}
			c := <-a.conns
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			if c.Ping(pctx) == nil {
				live++
			}
			pcancel()
			a.conns <- c
			<-a.slots
		}
		if live == cap(a.conns) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pooled connections live after the restart", live, cap(a.conns))
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
}
