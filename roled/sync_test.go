package roled

import (
	"fmt"
	"math/rand/v2"
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
	// The receivers listen on addresses of their own (sync.listen), so the
	// test picks ports and frees them. It picks them below Linux's
	// ephemeral range (32768-60999): a port the kernel handed out with :0
	// can be taken by any outgoing connection of a test running beside this
	// one before the receiver binds it (seen in CI: bind: address already
	// in use, and the sender talking to a stranger).
	addr := func() string {
		for range 1000 {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000)))
			if err == nil {
				a := ln.Addr().(*net.TCPAddr).String()
				ln.Close()
				return a
			}
		}
		t.Fatal("no free port below the ephemeral range")
		return ""
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
