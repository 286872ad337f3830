package lb

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/hapair/hapair/internal/etcdtest"
	"github.com/hapair/hapair/internal/pgtest"
)

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// fakePatroni answers like Patroni 3.0.2's REST API: HTTP/1.0, JSON body,
// connection closed after the answer.
type fakePatroni struct {
	ln      net.Listener
	primary atomic.Bool
	lagOK   atomic.Bool
}

func newFakePatroni(t *testing.T, primary bool) *fakePatroni {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &fakePatroni{ln: ln}
	p.primary.Store(primary)
	p.lagOK.Store(true)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.answer(c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return p
}

func (p *fakePatroni) answer(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 4096)
	n, _ := c.Read(buf)
	line, _, _ := strings.Cut(string(buf[:n]), "\r\n")
	f := strings.Fields(line)
	if len(f) < 2 {
		return
	}
	role := "replica"
	if p.primary.Load() {
		role = "master"
	}
	ok := false
	switch {
	case f[1] == "/primary" || f[1] == "/master":
		ok = p.primary.Load()
	case strings.HasPrefix(f[1], "/replica"):
		ok = !p.primary.Load() && (p.lagOK.Load() || !strings.Contains(f[1], "lag="))
	}
	status := "503 Service Unavailable"
	if ok {
		status = "200 OK"
	}
	if f[0] == "HEAD" || f[0] == "OPTIONS" {
		fmt.Fprintf(c, "HTTP/1.0 %s\r\n\r\n", status) // Patroni's bare status line
		return
	}
	fmt.Fprintf(c, "HTTP/1.0 %s\r\nServer: BaseHTTP/0.6 Python/3.11.2\r\nDate: %s\r\nContent-Type: application/json\r\n\r\n"+
		`{"state": "running", "role": %q, "server_version": 150020, "timeline": 1}`,
		status, time.Now().UTC().Format(time.RFC1123), role)
}

func (p *fakePatroni) addr() string { return p.ln.Addr().String() }

// serverPort asks through the balancer which instance answered.
func serverPort(t *testing.T, lbAddr string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=2", lbAddr))
	if err != nil {
		return 0, err
	}
	defer c.Close(ctx)
	var port string
	if err := c.QueryRow(ctx, "select current_setting('port')").Scan(&port); err != nil {
		return 0, err
	}
	return strconv.Atoi(port)
}

// TestTCPPatroni is Must-show 6 against two real PostgreSQL 15 instances
// fronted by fake Patroni REST endpoints.
func TestTCPPatroni(t *testing.T) {
	pgtest.Require(t)
	var pgA, pgB *pgtest.Server
	var errA, errB error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); pgA, errA = pgtest.New(t) }()
	go func() { defer wg.Done(); pgB, errB = pgtest.New(t) }()
	wg.Wait()
	if errA != nil || errB != nil {
		t.Fatalf("postgres did not start: %v %v", errA, errB)
	}
	patA, patB := newFakePatroni(t, true), newFakePatroni(t, false)
	interval := 200 * time.Millisecond
	servers := []ServerConfig{
		{Name: "A", Address: fmt.Sprintf("127.0.0.1:%d", pgA.Port), CheckAddress: patA.addr()},
		{Name: "B", Address: fmt.Sprintf("127.0.0.1:%d", pgB.Port), CheckAddress: patB.addr()},
	}
	cfg := DefaultConfig()
	cfg.Admin.Listen = ""
	cfg.ShutdownTimeout = 2 * time.Second
	cfg.Listeners = []ListenerConfig{
		{Name: "rw", Listen: "127.0.0.1:0", Mode: "tcp", Backend: "pg-primary"},
		{Name: "ro", Listen: "127.0.0.1:0", Mode: "tcp", Backend: "pg-replicas"},
	}
	chk := CheckConfig{Interval: interval, Timeout: 100 * time.Millisecond, Fall: 2, Rise: 1}
	cfg.Backends = []BackendConfig{
		{Name: "pg-primary", Kind: KindPGPrimary, Check: chk, Servers: servers},
		{Name: "pg-replicas", Kind: KindPGReplicas, Check: chk, Balance: BalanceRoundRobin,
			Servers: append([]ServerConfig(nil), servers...)},
	}
	l := startLB(t, cfg, nil)
	rw, ro := l.ListenerAddr("rw").String(), l.ListenerAddr("ro").String()
	waitFor(t, 5*time.Second, "primary A and replica B eligible", func() bool {
		return fmt.Sprint(eligibleNames(l.Group("pg-primary"))) == "[A]" &&
			fmt.Sprint(eligibleNames(l.Group("pg-replicas"))) == "[B]"
	})
	for range 3 {
		if p, err := serverPort(t, rw); err != nil || p != pgA.Port {
			t.Fatalf("rw went to port %d (%v), want primary A %d", p, err, pgA.Port)
		}
		if p, err := serverPort(t, ro); err != nil || p != pgB.Port {
			t.Fatalf("ro went to port %d (%v), want replica B %d", p, err, pgB.Port)
		}
	}

	// A session on the primary is cut once the flip is seen (one check
	// interval, ~200 ms measured); the bound is a regression guard, over 10×.
	ctx := context.Background()
	sess, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", rw))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(ctx)
	patA.primary.Store(false)
	patB.primary.Store(true)
	flipped := time.Now()
	waitFor(t, 5*time.Second, "old session closed", func() bool {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := sess.Exec(qctx, "select 1")
		return err != nil
	})
	if d := time.Since(flipped); d > 15*interval {
		t.Errorf("existing session closed %v after the flip, want about one check interval (%v)", d, interval)
	} else {
		t.Logf("existing session closed %v after the flip", d)
	}
	waitFor(t, 10*time.Second, "new primary B", func() bool {
		p, err := serverPort(t, rw)
		return err == nil && p == pgB.Port
	})

	// Replicas: A (now replica) over the lag bound gets nothing; with no
	// replica qualifying new connections are refused at once.
	patA.lagOK.Store(false)
	waitFor(t, 10*time.Second, "no replica eligible", func() bool { return len(eligibleNames(l.Group("pg-replicas"))) == 0 })
	start := time.Now()
	if _, err := serverPort(t, ro); err == nil {
		t.Error("ro connection succeeded with no replica in lag bounds")
	} else if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("refusal took %v, want at once", d)
	}
	patA.lagOK.Store(true)
	waitFor(t, 10*time.Second, "replica A within lag", func() bool {
		p, err := serverPort(t, ro)
		return err == nil && p == pgA.Port
	})
}

// nameServer accepts TCP connections, writes its name and keeps them open.
func nameServer(t *testing.T, name string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.WriteString(c, name+"\n")
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

func dialName(addr string) (net.Conn, string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	_ = c.SetReadDeadline(time.Time{})
	return c, strings.TrimSpace(line), err
}

// TestPGPrimaryLeaderKey: with Patroni's leader key followed in etcd, a
// leader change moves new connections and closes old sessions at once,
// long before a 2 s check interval would.
func TestPGPrimaryLeaderKey(t *testing.T) {
	ec := etcdtest.New(t)
	cli := ec.Client(t)
	patA, patB := newFakePatroni(t, true), newFakePatroni(t, false)
	key := "/service/t/leader"
	ctx := context.Background()
	if _, err := cli.Put(ctx, key, "A"); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Admin.Listen = ""
	cfg.Etcd.Endpoints = ec.Endpoints()
	cfg.Listeners = []ListenerConfig{{Name: "rw", Listen: "127.0.0.1:0", Backend: "pg"}}
	cfg.Backends = []BackendConfig{{Name: "pg", Kind: KindPGPrimary, EtcdFastPath: true, PatroniLeaderKey: key,
		Check: CheckConfig{Interval: 2 * time.Second, Timeout: 200 * time.Millisecond, Fall: 2, Rise: 2},
		Servers: []ServerConfig{
			{Name: "A", Address: nameServer(t, "A"), CheckAddress: patA.addr()},
			{Name: "B", Address: nameServer(t, "B"), CheckAddress: patB.addr()},
		}}}
	l := startLB(t, cfg, nil)
	g := l.Group("pg")
	// A eligible on a check that came after the watcher's first sight of
	// the key: that sight sends A back to confirmation (keyAllows), and a
	// session dialled in that window is refused (CI hit it under -race).
	waitFor(t, 5*time.Second, "A eligible with the key known", func() bool {
		g.mu.Lock()
		k := g.key
		g.mu.Unlock()
		return k.known && k.node == "A" && fmt.Sprint(eligibleNames(g)) == "[A]"
	})
	rw := l.ListenerAddr("rw").String()
	sess, name, err := dialName(rw)
	if err != nil || name != "A" {
		t.Fatalf("first session on %q (%v), want A", name, err)
	}
	defer sess.Close()

	patA.primary.Store(false)
	patB.primary.Store(true)
	if _, err := cli.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, key, "B"); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	waitFor(t, 5*time.Second, "B eligible", func() bool { return fmt.Sprint(eligibleNames(g)) == "[B]" })
	took := time.Since(changed)
	_ = sess.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := sess.Read(make([]byte, 1)); err == nil {
		t.Error("old session still open after the leader change")
	}
	c, name, err := dialName(rw)
	if err != nil || name != "B" {
		t.Fatalf("new session on %q (%v), want B", name, err)
	}
	c.Close()
	t.Logf("leader key change → B eligible in %v", took)
	// A regression guard (the checks alone poll every interval; the watch
	// takes a few ms): over 10× the measured median.
	if took > time.Second {
		t.Errorf("fast path took %v", took)
	}
}
