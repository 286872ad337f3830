// Package ctl is hapairctl's operator logic: the cluster status table, the
// planned switchover that follows the balancer, the failover drill, and the
// certificate authority. It talks to the parts only through their public
// interfaces (etcd keys, Patroni's REST API, roled's /role, the lb admin
// JSON), so it works from any host that reaches them.
package ctl

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/hapair/hapair/internal/config"
)

// DefaultPath is hapairctl's config file.
const DefaultPath = "/etc/hapair/ctl.yaml"

// Config is /etc/hapair/ctl.yaml.
type Config struct {
	Cluster   string        `yaml:"cluster"`
	KeyPrefix string        `yaml:"key-prefix"`
	Roled     string        `yaml:"roled"` // local roled, for hapairctl check
	Scope     string        `yaml:"scope"`
	Namespace string        `yaml:"namespace"`
	Timeout   time.Duration `yaml:"timeout"`
	Etcd      config.Etcd   `yaml:"etcd"`
	// PatroniTLS is for https patroni-url (Patroni's restapi.certfile):
	// ca-file verifies Patroni (the URL's host must be in its certificate),
	// cert-file/key-file are the client certificate that Patroni's
	// verify_client (optional or required) asks for on POST /switchover.
	// Only Patroni's REST API uses it. Default: none (the system's CAs).
	PatroniTLS config.TLS `yaml:"patroni-tls"`
	// WitnessNames are the etcd members that are witnesses (status marks them).
	WitnessNames []string `yaml:"witness-names"`
	Nodes        []Node   `yaml:"nodes"`
	LB           LB       `yaml:"lb"`
	// StepDown: switchover first asks the old ACTIVE's roled to step down
	// (default true), so that requests wait in the balancer's hold for the
	// new node instead of failing on the old one while its PostgreSQL shuts
	// down. With a balancer that does not hold (hold-timeout 0) it only
	// lengthens the outage: turn it off there.
	StepDown bool  `yaml:"step-down"`
	Drill    Drill `yaml:"drill"`
}

// Node is one data node and how to reach its parts.
type Node struct {
	Name          string `yaml:"name"`
	PatroniURL    string `yaml:"patroni-url"`
	PatroniMember string `yaml:"patroni-member"` // default: name
	RoledURL      string `yaml:"roled-url"`
	// Drill actions (sh -c): stop the node hard, bring it back.
	StopCommand  string `yaml:"stop-command"`
	StartCommand string `yaml:"start-command"`
}

// LB is the balancer: its admin JSON and the application URL behind it.
type LB struct {
	AdminURL  string `yaml:"admin-url"`
	Backend   string `yaml:"backend"`    // the active-passive backend (default app)
	URL       string `yaml:"url"`        // the application through the balancer
	WritePath string `yaml:"write-path"` // drill probe: POST <url><write-path>?id=N
	WhoPath   string `yaml:"who-path"`   // answers JSON {"node": ...} (default /health)
	// CheckPath lets the drill prove that no acknowledged write was lost
	// in a takeover: GET <url><check-path>?id=N must answer 200 when write
	// N is present on the node that serves the request and 404 when it is
	// not, with JSON {"node": ...} naming that node (as write-path's
	// answer does). After each takeover the drill checks every write
	// acknowledged before the stop command ran. Default empty: the check is
	// skipped (the drill says so).
	CheckPath string `yaml:"check-path"`
}

// Drill tunes hapairctl drill.
type Drill struct {
	ProbeInterval time.Duration `yaml:"probe-interval"` // write probe period (default 50ms)
	PhaseTimeout  time.Duration `yaml:"phase-timeout"`  // bound on takeover, rejoin and the wait for redundancy (default 90s)
	Settle        time.Duration `yaml:"settle"`         // probing after the rejoin (default 3s)
	// MaxLag is the standby's replication lag bound in bytes (default
	// 1048576, Patroni's maximum_lag_on_failover default): above it the
	// standby is not ready and no phase starts.
	MaxLag int64 `yaml:"max-lag"`
	// ReadyFor is how long the standby must stay ready before it counts
	// (default 1s): a replica that Patroni lists, only to rewind it moments
	// later, must not count as rejoined.
	ReadyFor time.Duration `yaml:"ready-for"`
}

// DefaultConfig is a local two-node cluster.
func DefaultConfig() Config {
	return Config{
		Cluster: "hapair", Roled: "http://127.0.0.1:7400", Scope: "hapair", Namespace: "/service", Timeout: 2 * time.Second,
		Etcd: config.DefaultEtcd(), WitnessNames: []string{"witness"}, StepDown: true,
		LB: LB{AdminURL: "http://127.0.0.1:7480", Backend: "app", WritePath: "/write", WhoPath: "/health"},
		Drill: Drill{ProbeInterval: 50 * time.Millisecond, PhaseTimeout: 90 * time.Second,
			Settle: 3 * time.Second, MaxLag: 1 << 20, ReadyFor: time.Second},
	}
}

// Validate checks every field, naming it on error.
func (c *Config) Validate() error {
	if c.Cluster == "" {
		return config.Errorf("cluster", c.Cluster, "must not be empty")
	}
	if c.KeyPrefix != "" && !strings.HasSuffix(c.KeyPrefix, "/") {
		return config.Errorf("key-prefix", c.KeyPrefix, "must end with /")
	}
	if c.Timeout <= 0 {
		return config.Errorf("timeout", c.Timeout, "must be positive")
	}
	if err := c.Etcd.Validate("etcd"); err != nil {
		return err
	}
	if err := c.PatroniTLS.Validate("patroni-tls"); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i, n := range c.Nodes {
		f := fmt.Sprintf("nodes[%d]", i)
		if n.Name == "" || seen[n.Name] {
			return config.Errorf(f+".name", n.Name, "must be set and unique")
		}
		seen[n.Name] = true
		if err := checkURL(f+".patroni-url", n.PatroniURL, true); err != nil {
			return err
		}
		if err := checkURL(f+".roled-url", n.RoledURL, false); err != nil {
			return err
		}
	}
	if err := checkURL("lb.admin-url", c.LB.AdminURL, false); err != nil {
		return err
	}
	if err := checkURL("lb.url", c.LB.URL, false); err != nil {
		return err
	}
	if c.LB.CheckPath != "" && !strings.HasPrefix(c.LB.CheckPath, "/") {
		return config.Errorf("lb.check-path", c.LB.CheckPath, "must start with /")
	}
	if c.Drill.ProbeInterval <= 0 {
		return config.Errorf("drill.probe-interval", c.Drill.ProbeInterval, "must be positive")
	}
	if c.Drill.PhaseTimeout <= 0 {
		return config.Errorf("drill.phase-timeout", c.Drill.PhaseTimeout, "must be positive")
	}
	if c.Drill.MaxLag < 0 {
		return config.Errorf("drill.max-lag", c.Drill.MaxLag, "must not be negative")
	}
	if c.Drill.ReadyFor < 0 {
		return config.Errorf("drill.ready-for", c.Drill.ReadyFor, "must not be negative")
	}
	return nil
}

func checkURL(field, v string, required bool) error {
	if v == "" {
		if required {
			return config.Errorf(field, v, "is required")
		}
		return nil
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return config.Errorf(field, v, "want http(s)://host:port")
	}
	return nil
}

// Prefix is the hapair key prefix in etcd.
func (c *Config) Prefix() string {
	if c.KeyPrefix != "" {
		return c.KeyPrefix
	}
	return "/hapair/" + c.Cluster + "/"
}

// LeaderKey is Patroni's leader key.
func (c *Config) LeaderKey() string {
	return strings.TrimSuffix(c.Namespace, "/") + "/" + c.Scope + "/leader"
}

// Node returns the named node.
func (c *Config) Node(name string) (Node, bool) {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return Node{}, false
}

// Member is the node's Patroni member name.
func (n Node) Member() string {
	if n.PatroniMember != "" {
		return n.PatroniMember
	}
	return n.Name
}

// Dialer opens connections; the lab passes one that dials from inside a
// network namespace. nil means the ordinary dialer.
type Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// Client is hapairctl's access to the cluster.
type Client struct {
	Cfg Config
	// Force lets Switchover go to a target that is not ready to take over
	// (hapairctl switchover --force): the operator accepts losing what the
	// target lacks.
	Force bool
	HTTP  *http.Client
	// Patroni is HTTP with patroni-tls: for Patroni's REST API only, so
	// that the cluster's CA is not what an https balancer URL is checked
	// against.
	Patroni *http.Client
	dial    Dialer
	lg      *zap.Logger
}

// NewClient builds a client; dial may be nil. cfg has been validated
// (patroni-tls's files read); should they fail now, https calls to Patroni
// fail verification and say so.
func NewClient(cfg Config, dial Dialer, lg *zap.Logger) *Client {
	if lg == nil {
		lg = zap.NewNop()
	}
	transport := func() *http.Transport {
		tr := &http.Transport{DisableKeepAlives: true}
		if dial != nil {
			tr.DialContext = dial
		}
		return tr
	}
	ptr := transport()
	if cfg.PatroniTLS.Enabled() {
		tc, err := cfg.PatroniTLS.ClientConfig()
		if err != nil {
			lg.Error("patroni-tls", zap.Error(err))
		}
		ptr.TLSClientConfig = tc
	}
	return &Client{Cfg: cfg, HTTP: &http.Client{Transport: transport(), Timeout: cfg.Timeout},
		Patroni: &http.Client{Transport: ptr, Timeout: cfg.Timeout}, dial: dial, lg: lg}
}

// Etcd connects to etcd (through the client's dialer).
func (c *Client) Etcd() (*clientv3.Client, error) {
	e := c.Cfg.Etcd
	cc := clientv3.Config{Endpoints: e.Endpoints, DialTimeout: e.DialTimeout, Logger: c.lg,
		DialKeepAliveTime: 2 * time.Second, DialKeepAliveTimeout: 2 * time.Second}
	if e.TLS.Enabled() {
		tc, err := e.TLS.ClientConfig()
		if err != nil {
			return nil, err
		}
		cc.TLS = tc
	}
	if c.dial != nil {
		d := c.dial
		cc.DialOptions = append(cc.DialOptions, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d(ctx, "tcp", addr)
		}))
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("etcd %v: %w", e.Endpoints, err)
	}
	return cli, nil
}
