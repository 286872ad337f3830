// Package etcdtest starts a real etcd cluster, embedded in the test process,
// on free loopback ports, and lets a test break it: stop, restart or pause a
// member, take quorum away and give it back. Every hapair integration test
// that needs etcd uses it.
//
// Each member's client and peer traffic goes through a small TCP proxy owned
// by the cluster, so a paused member is mute (nothing it sends arrives) and a
// stopped member refuses connections, while its addresses stay stable across
// restarts. Everything is stopped, and its ports and directories freed, at
// test cleanup.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Cluster is a running embedded etcd cluster.
type Cluster struct {
	t       testing.TB
	opts    options
	token   string
	members []*Member
}

// Member is one etcd member of a Cluster.
type Member struct {
	Name string

	dir        string
	clientAddr string // the member's own listeners; only the proxies dial them
	peerAddr   string
	client     *proxy // what clients and peers are told
	peer       *proxy

	mu   sync.Mutex
	etcd *embed.Etcd // nil while stopped
}

// Endpoint is the member's client URL (through its proxy).
func (m *Member) Endpoint() string { return "http://" + m.client.addr() }

// PeerURL is the member's advertised peer URL (through its proxy).
func (m *Member) PeerURL() string { return "http://" + m.peer.addr() }

// Running reports whether the member's server is started.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.etcd != nil
}

// Etcd returns the embedded server, nil while stopped.
func (m *Member) Etcd() *embed.Etcd {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.etcd
}

type options struct {
	size       int
	tickMs     uint
	electionMs uint
	logger     *zap.Logger
}

// Option changes how New builds the cluster.
type Option func(*options)

// WithSize sets the number of members (default 3).
func WithSize(n int) Option { return func(o *options) { o.size = n } }

// WithTiming sets the raft heartbeat and election timeout (default 100 ms and
// 1 s, etcd's own defaults; faster values make elections flaky on a loaded
// 2-core machine).
func WithTiming(heartbeat, election time.Duration) Option {
	return func(o *options) {
		o.tickMs = uint(heartbeat / time.Millisecond)
		o.electionMs = uint(election / time.Millisecond)
	}
}

// WithLogger sends the members' logs to lg (default: discarded).
func WithLogger(lg *zap.Logger) Option { return func(o *options) { o.logger = lg } }

// startTimeout bounds the wait for a (re)started cluster to have a leader.
const startTimeout = 20 * time.Second

// New starts a cluster and registers its teardown with t.Cleanup. It fails
// the test if the cluster does not come up.
func New(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	o := options{size: 3, tickMs: 100, electionMs: 1000, logger: zap.NewNop()}
	for _, f := range opts {
		f(&o)
	}
	c := &Cluster{t: t, opts: o, token: fmt.Sprintf("etcdtest-%d", time.Now().UnixNano())}
	t.Cleanup(c.terminate)
	base := t.TempDir()
	for i := 0; i < o.size; i++ {
		m, err := newMember(fmt.Sprintf("m%d", i), fmt.Sprintf("%s/m%d", base, i))
		if err != nil {
			t.Fatalf("etcdtest: member %d: %v", i, err)
		}
		c.members = append(c.members, m)
	}
	// Start one after another: a new member asks each peer whether the
	// cluster is already bootstrapped, and a peer that is itself inside
	// StartEtcd accepts the connection without answering, costing a 1 s
	// timeout per peer. A peer not started yet refuses at once.
	for i := range c.members {
		if err := c.start(i, "new"); err != nil {
			t.Fatalf("etcdtest: start member %d: %v", i, err)
		}
	}
	c.WaitLeader(t)
	return c
}

func newMember(name, dir string) (*Member, error) {
	var err error
	m := &Member{Name: name, dir: dir}
	if m.client, err = newProxy(); err != nil {
		return nil, err
	}
	if m.peer, err = newProxy(); err != nil {
		m.client.close()
		return nil, err
	}
	if err := m.repick(); err != nil {
		m.client.close()
		m.peer.close()
		return nil, err
	}
	return m, nil
}

// freeAddr asks the kernel for a free loopback port. The port is released
// before etcd binds it; the window is small, and the proxies that everyone
// talks to hold their own listeners for the cluster's lifetime.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (c *Cluster) initialCluster() string {
	parts := make([]string, len(c.members))
	for i, m := range c.members {
		parts[i] = m.Name + "=" + m.PeerURL()
	}
	return strings.Join(parts, ",")
}

func mustURL(s string) url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return *u
}

// start launches member i's server; state is "new" or "existing". A port
// taken meanwhile by another test (freeAddr's window) is answered with fresh
// ports: nobody but the member's own proxies knows the real ones.
func (c *Cluster) start(i int, state string) error {
	var err error
	for try := 0; try < 5; try++ {
		if err = c.startOnce(i, state); err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			return err
		}
		if err := c.members[i].repick(); err != nil {
			return err
		}
	}
	return err
}

// repick moves the member's real listeners to fresh free ports.
func (m *Member) repick() error {
	ca, err := freeAddr()
	if err != nil {
		return err
	}
	pa, err := freeAddr()
	if err != nil {
		return err
	}
	m.clientAddr, m.peerAddr = ca, pa
	m.client.setTarget(ca)
	m.peer.setTarget(pa)
	return nil
}

func (c *Cluster) startOnce(i int, state string) error {
	m := c.members[i]
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = m.dir
	// No fsync: members stop and restart inside this process, so the page
	// cache keeps what they wrote, and a test's timings (a watch event
	// within milliseconds of a put) must not wait on a busy disk's flush;
	// the parallel packages of `make test` made one take 170 ms.
	cfg.UnsafeNoFsync = true
	cfg.ListenPeerUrls = []url.URL{mustURL("http://" + m.peerAddr)}
	cfg.AdvertisePeerUrls = []url.URL{mustURL(m.PeerURL())}
	cfg.ListenClientUrls = []url.URL{mustURL("http://" + m.clientAddr)}
	cfg.AdvertiseClientUrls = []url.URL{mustURL(m.Endpoint())}
	cfg.InitialCluster = c.initialCluster()
	cfg.InitialClusterToken = c.token
	cfg.ClusterState = state
	cfg.TickMs = c.opts.tickMs
	cfg.ElectionMs = c.opts.electionMs
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(c.opts.logger.Named(m.Name))
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.etcd = e
	m.mu.Unlock()
	return nil
}

// Size is the number of members.
func (c *Cluster) Size() int { return len(c.members) }

// Member returns member i.
func (c *Cluster) Member(i int) *Member { return c.members[i] }

// Endpoints are the client URLs of all members, stopped ones included.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.Endpoint()
	}
	return eps
}

// Client returns a client of all members, closed at test cleanup.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	return c.client(t, c.Endpoints())
}

// MemberClient returns a client of member i only, closed at test cleanup.
func (c *Cluster) MemberClient(t testing.TB, i int) *clientv3.Client {
	t.Helper()
	return c.client(t, []string{c.members[i].Endpoint()})
}

func (c *Cluster) client(t testing.TB, eps []string) *clientv3.Client {
	cli, err := newClient(eps)
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func newClient(eps []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:            eps,
		DialTimeout:          2 * time.Second,
		DialKeepAliveTime:    time.Second,
		DialKeepAliveTimeout: time.Second,
		Logger:               zap.NewNop(),
	})
}

// Stop stops member i abruptly, like a killed process: no leadership
// transfer, connections refused from now on.
func (c *Cluster) Stop(i int) {
	m := c.members[i]
	m.mu.Lock()
	e := m.etcd
	m.etcd = nil
	m.mu.Unlock()
	if e == nil {
		return
	}
	hardClose(e)
}

// hardClose stops e without the leadership transfer a graceful stop attempts
// (which takes seconds when the peers are gone).
func hardClose(e *embed.Etcd) {
	e.Server.HardStop()
	e.Close()
}

// Restart starts a stopped member again on its old data and addresses.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if c.members[i].Running() {
		return
	}
	if err := c.start(i, "existing"); err != nil {
		c.t.Fatalf("etcdtest: restart member %d: %v", i, err)
	}
}

// Pause mutes member i: it keeps running, but nothing it sends reaches a
// peer or a client until Resume.
func (c *Cluster) Pause(i int) {
	c.members[i].client.setPaused(true)
	c.members[i].peer.setPaused(true)
}

// Resume lets member i's traffic flow again.
func (c *Cluster) Resume(i int) {
	c.members[i].client.setPaused(false)
	c.members[i].peer.setPaused(false)
}

// LoseQuorum stops members, highest index first, until fewer than a majority
// run, and returns the ones it stopped.
func (c *Cluster) LoseQuorum() []int {
	var stopped []int
	for i := len(c.members) - 1; i >= 0 && c.running() > len(c.members)/2; i-- {
		if c.members[i].Running() {
			c.Stop(i)
			stopped = append(stopped, i)
		}
	}
	return stopped
}

// RegainQuorum restarts every stopped member and waits for a leader.
func (c *Cluster) RegainQuorum() {
	c.t.Helper()
	for i, m := range c.members {
		if !m.Running() {
			c.Restart(i)
		}
	}
	c.WaitLeader(c.t)
}

func (c *Cluster) running() int {
	n := 0
	for _, m := range c.members {
		if m.Running() {
			n++
		}
	}
	return n
}

// Leader returns the index of the member that believes it leads, or -1.
func (c *Cluster) Leader() int {
	for i, m := range c.members {
		if e := m.Etcd(); e != nil && e.Server.Leader() == e.Server.MemberID() && e.Server.Leader() != 0 {
			return i
		}
	}
	return -1
}

// WaitLeader waits until a member leads and a linearizable read through the
// proxies succeeds, and returns the leader's index.
func (c *Cluster) WaitLeader(t testing.TB) int {
	t.Helper()
	deadline := time.Now().Add(startTimeout)
	cli, err := newClient(c.Endpoints())
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	defer cli.Close()
	for time.Now().Before(deadline) {
		if l := c.Leader(); l >= 0 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := cli.Get(ctx, "etcdtest-probe")
			cancel()
			if err == nil {
				return l
			}
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
	t.Fatalf("etcdtest: no leader within %v", startTimeout)
	return -1
}

// terminate stops every member in parallel, then the proxies.
func (c *Cluster) terminate() {
	var wg sync.WaitGroup
	for i := range c.members {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c.Stop(i)
		}(i)
	}
	wg.Wait()
	for _, m := range c.members {
		m.client.close()
		m.peer.close()
	}
}
