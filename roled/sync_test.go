package roled

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/etcdtest"
	"github.com/hapair/hapair/syncdir"
)

// TestSyncFollowsRole wires package syncdir as cmd/hapair-roled does: files
// written on the ACTIVE node reach the PASSIVE one, and the direction turns
// with a switchover.
func TestSyncFollowsRole(t *testing.T) {
	skipShort(t)
	c := etcdtest.New(t)
	addr := func() string {
		ln := listenLocal(t)
		a := ln.Addr().(*net.TCPAddr).String()
		ln.Close()
		return a
	}
	pa, pb := addr(), addr()
	roots := map[string]string{"A": t.TempDir(), "B": t.TempDir()}
	syncCfg := func(name, listen, peer string) func(*Config) {
		return func(cfg *Config) {
			s := syncdir.DefaultConfig()
			s.Listen, s.Peer, s.Insecure = listen, peer, true
			s.StateDir = t.TempDir()
			s.ReconcileInterval = time.Second
			s.Roots = []syncdir.Root{{Name: "uploads", Path: roots[name]}}
			cfg.Sync = s
		}
	}
	a := startNode(t, c, "A", syncCfg("A", pa, pb))
	b := startNode(t, c, "B", syncCfg("B", pb, pa))
	a.pat.promote()
	a.waitCode(t, 200, 10*time.Second)
	if err := os.WriteFile(filepath.Join(roots["A"], "from-a.txt"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "from-a.txt on B", func() bool {
		_, err := os.Stat(filepath.Join(roots["B"], "from-a.txt"))
		return err == nil
	})
	if st := a.status(t); st.Sync == nil {
		t.Fatal("no sync status in /role")
	}
	a.pat.demote()
	b.pat.promote()
	b.waitCode(t, 200, 10*time.Second)
	if err := os.WriteFile(filepath.Join(roots["B"], "from-b.txt"), []byte("b"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "from-b.txt on A", func() bool {
		_, err := os.Stat(filepath.Join(roots["A"], "from-b.txt"))
		return err == nil
	})
}
