package lab

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/hapair/hapair/budget"
	"github.com/hapair/hapair/internal/pgtest"
)

// TestLocalWriter: the local writer sets up its role and table on a real
// PostgreSQL 15, writes as that role and logs each acknowledged row; once
// the role is read-only (roled's fence) nothing more is acknowledged.
func TestLocalWriter(t *testing.T) {
	pgtest.Require(t)
	pg, err := pgtest.New(t)
	if err != nil {
		t.Fatal(err)
	}
	admin := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=1", pg.Port)
	dsn := fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=1", LocalWriterRole, pg.Port)
	logPath := filepath.Join(t.TempDir(), LocalWriterLog)
	w, err := newLocalWriter("nodea", admin, dsn, logPath, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	status := func() LocalWriterStatus { w.mu.Lock(); defer w.mu.Unlock(); return w.st }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %+v", what, status())
			}
			time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
		}
	}
	waitFor("5 acknowledged rows", func() bool { return status().Acked >= 5 })

	// The fence as roled sets it.
	for _, q := range []string{"ALTER ROLE " + LocalWriterRole + " SET default_transaction_read_only = on",
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '" + LocalWriterRole + "'"} {
		if err := pg.Run("psql", "-h", pg.Sock, "-p", fmt.Sprint(pg.Port), "-U", "postgres", "-c", q); err != nil {
			t.Fatal(err)
		}
	}
	fenced := status().Acked
	waitFor("refusals behind the fence", func() bool {
		s := status()
		return s.Refused >= 3 && strings.Contains(s.LastError, "read-only")
	})
	// At most the one row in flight when the fence landed.
	if s := status(); s.Acked > fenced+1 {
		t.Fatalf("%d rows acknowledged behind the fence", s.Acked-fenced)
	}
	cancel()
	<-done
	f, err := os.Open(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := int64(0)
	for sc := bufio.NewScanner(f); sc.Scan(); n++ {
		if len(strings.Fields(sc.Text())) != 2 {
			t.Fatalf("log line %q", sc.Text())
		}
	}
	if n != status().Acked {
		t.Fatalf("log has %d rows, status %d", n, status().Acked)
	}
}

// TestPatroniDurability: --durability renders Patroni's synchronous_mode
// keys in the bootstrap DCS config.
func TestPatroniDurability(t *testing.T) {
	for _, tc := range []struct {
		durability   string
		sync, strict bool
	}{{"", false, false}, {"async", false, false}, {"sync", true, false}, {"sync-strict", true, true}} {
		var cfg struct {
			Bootstrap struct {
				DCS struct {
					Sync   bool `yaml:"synchronous_mode"`
					Strict bool `yaml:"synchronous_mode_strict"`
				} `yaml:"dcs"`
			} `yaml:"bootstrap"`
		}
		text := patroniConfig(NodeA, DCSRemote, "/d/pg", "/d/run", budget.FileOf(0, labTimers()).Patroni, tc.durability)
		if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
			t.Fatalf("%s: %v\n%s", tc.durability, err, text)
		}
		if d := cfg.Bootstrap.DCS; d.Sync != tc.sync || d.Strict != tc.strict {
			t.Errorf("%q: synchronous_mode %v, strict %v; want %v, %v", tc.durability, d.Sync, d.Strict, tc.sync, tc.strict)
		}
	}
}
