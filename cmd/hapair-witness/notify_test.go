package main

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// notifySocket stands in for systemd's NOTIFY_SOCKET: a unixgram socket
// whose datagrams the test reads.
type notifySocket struct {
	addr string
	conn *net.UnixConn
	seen []string
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	addr := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &notifySocket{addr: addr, conn: conn}
}

// expect reads datagrams until one contains msg or timeout passes.
func (n *notifySocket) expect(t *testing.T, msg string, timeout time.Duration) {
	t.Helper()
	for _, s := range n.seen {
		if strings.Contains(s, msg) {
			return
		}
	}
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 4096)
	for {
		_ = n.conn.SetReadDeadline(deadline)
		k, err := n.conn.Read(buf)
		if err != nil {
			t.Fatalf("no %q on the notify socket within %s (got %q): %v", msg, timeout, n.seen, err)
		}
		s := string(buf[:k])
		n.seen = append(n.seen, s)
		if strings.Contains(s, msg) {
			return
		}
	}
}
