package lab

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestStartDelay: with the jitter soak's proxies in place, a member's new
// connection to another member's etcd port arrives from the client host
// and every round trip takes at least twice the delay; a connection to the
// member's own address is not proxied.
func TestStartDelay(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("iptables missing")
	}
	n := Net{Tag: fmt.Sprintf("%sd%04x", NSPrefix, rand.IntN(1<<16))}
	if err := n.Create(); err != nil {
		_ = n.Destroy()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Destroy(); err != nil {
			t.Error(err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const delay = 50 * time.Millisecond
	stop, err := n.StartDelay(ctx, JitterOptions{Delay: delay})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	// nodea's "etcd": tells each connection the address it came from, then
	// echoes.
	ln, err := n.listenIn(NodeA, net.JoinHostPort(IP(NodeA), "2379"))
	if err != nil {
		t.Fatal(err)
	}
	serveEcho(t, ln, func(c net.Conn) []byte {
		return []byte(c.RemoteAddr().(*net.TCPAddr).IP.String() + "\n")
	})

	roundTrip := func(from string) (peer string, rtt time.Duration) {
		t.Helper()
		c, err := n.DialContext(from)(ctx, "tcp", net.JoinHostPort(IP(NodeA), "2379"))
		if err != nil {
			t.Fatalf("dial from %s: %v", from, err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		r := bufio.NewReader(c)
		first, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("from %s: %v", from, err)
		}
		t0 := time.Now()
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		if echo, err := r.ReadString('\n'); err != nil || echo != "ping\n" {
			t.Fatalf("from %s: echo %q, %v", from, echo, err)
		}
		return strings.TrimSpace(first), time.Since(t0)
	}

	peer, rtt := roundTrip(NodeB)
	if peer != IP(Client) {
		t.Errorf("nodeb → nodea:2379 arrived from %s, want the proxy's host %s", peer, IP(Client))
	}
	if rtt < 2*delay {
		t.Errorf("nodeb → nodea:2379 round trip %s, want at least 2 × %s", rtt, delay)
	}
	if peer, _ := roundTrip(NodeA); peer != IP(NodeA) {
		t.Errorf("nodea → its own 2379 arrived from %s: proxied, want direct", peer)
	}
}
