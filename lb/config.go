package lb

import (
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/hapair/hapair/budget"
	"github.com/hapair/hapair/internal/config"
)

// Kind is what a backend group routes to and how it decides who is eligible.
type Kind string

// Backend kinds.
const (
	KindActivePassive Kind = "active-passive"
	KindPool          Kind = "pool"
	KindPGPrimary     Kind = "pg-primary"
	KindPGReplicas    Kind = "pg-replicas"
)

// Balance is the selection policy among several eligible servers.
type Balance string

// Balance policies.
const (
	BalanceLeastConn  Balance = "least-conn"
	BalanceRoundRobin Balance = "round-robin"
)

// Config is the whole hapair-lb configuration (/etc/hapair/lb.yaml).
type Config struct {
	LogLevel        string           `yaml:"log-level"`
	AccessLog       bool             `yaml:"access-log"`
	ShutdownTimeout time.Duration    `yaml:"shutdown-timeout"`
	FIFOReads       string           `yaml:"fifo-reads"` // auto, on or off (see poller); applies at start
	EventLoop       string           `yaml:"event-loop"` // auto, on or off (see eventloop.go); needs fifo-reads; applies at start
	Admin           AdminConfig      `yaml:"admin"`
	Cluster         string           `yaml:"cluster"`
	Etcd            config.Etcd      `yaml:"etcd"` // optional: fast path
	Listeners       []ListenerConfig `yaml:"listeners"`
	Backends        []BackendConfig  `yaml:"backends"`
	// VIP is the floating address of a balancer pair (lb/vip.go): held by
	// the balancer that holds the election key; needs etcd. Applies at start.
	VIP VIPConfig `yaml:"vip"`
}

// AdminConfig is the local admin/stats/metrics listener.
type AdminConfig struct {
	Listen string `yaml:"listen"` // default 127.0.0.1:7480; "" disables
	Pprof  bool   `yaml:"pprof"`  // serve /debug/pprof/ on the admin listener (default false)
}

// ListenerConfig is one client-facing listener bound to one backend.
type ListenerConfig struct {
	Name   string `yaml:"name"`
	Listen string `yaml:"listen"`
	Mode   string `yaml:"mode"` // http or tcp
	// Engine is the HTTP/1.1 implementation: fast (default; hapair's own,
	// plain or over TLS) or std (net/http). On a TLS listener HTTP/2 (ALPN
	// h2) is always net/http's. Applies at start.
	Engine  string     `yaml:"engine"`
	Backend string     `yaml:"backend"`
	TLS     config.TLS `yaml:"tls"`
	// TLSSessionTickets lets TLS clients resume sessions by ticket (default
	// true). false: every new connection makes a full handshake (Go's TLS
	// server keeps no session cache). Applies on reload.
	TLSSessionTickets *bool         `yaml:"tls-session-tickets"`
	MaxHeaderBytes    int           `yaml:"max-header-bytes"`
	MaxHeaderCount    int           `yaml:"max-header-count"`
	ReadHeaderTimeout time.Duration `yaml:"read-header-timeout"`
	IdleTimeout       time.Duration `yaml:"idle-timeout"`
	WriteTimeout      time.Duration `yaml:"write-timeout"`
	// ClientBodyTimeout bounds each read of a request body: the longest
	// wait for the next byte of a body that has started, not for the whole
	// body, like nginx's client_body_timeout (default 60s). A client that
	// stalls part-way gets 408 and is closed. Both engines; applies on reload.
	ClientBodyTimeout time.Duration `yaml:"client-body-timeout"`
}

// BackendConfig is a group of servers of one kind.
type BackendConfig struct {
	Name                  string         `yaml:"name"`
	Kind                  Kind           `yaml:"kind"`
	Balance               Balance        `yaml:"balance"`
	HoldTimeout           *time.Duration `yaml:"hold-timeout"` // nil = default 5s
	HoldQueue             int            `yaml:"hold-queue"`
	MaxConns              int            `yaml:"max-conns"`     // per server; 0 = unlimited
	QueueTimeout          time.Duration  `yaml:"queue-timeout"` // wait for a free slot under max-conns
	RetryAfter            time.Duration  `yaml:"retry-after"`
	Retries               *int           `yaml:"retries"`
	MaxFails              int            `yaml:"max-fails"`
	FailTimeout           time.Duration  `yaml:"fail-timeout"`
	EtcdFastPath          bool           `yaml:"etcd-fast-path"`
	PatroniLeaderKey      string         `yaml:"patroni-leader-key"` // pg-primary fast path, e.g. /service/hapair/leader
	FastInterval          time.Duration  `yaml:"fast-interval"`
	ConnectTimeout        time.Duration  `yaml:"connect-timeout"`
	ResponseHeaderTimeout time.Duration  `yaml:"response-header-timeout"`
	ReadTimeout           time.Duration  `yaml:"read-timeout"`         // between two reads of a response body
	IdleConns             int            `yaml:"idle-conns"`           // idle keep-alive connections kept per server (64)
	IdleConnTimeout       time.Duration  `yaml:"idle-conn-timeout"`    // longest a pooled connection stays idle (30s)
	IdleSurplusTimeout    *time.Duration `yaml:"idle-surplus-timeout"` // beyond idle-conns, kept this long after a burst (nil = 5s; 0: closed at once)
	Check                 CheckConfig    `yaml:"check"`
	Servers               []ServerConfig `yaml:"servers"`
}

// CheckConfig is the active health check of every server of a backend,
// with HAProxy's inter/fall/rise meaning.
type CheckConfig struct {
	Enabled          *bool         `yaml:"enabled"` // nil = true
	Method           string        `yaml:"method"`
	Path             string        `yaml:"path"`
	Port             int           `yaml:"port"`
	Interval         time.Duration `yaml:"interval"`
	Timeout          time.Duration `yaml:"timeout"`
	Fall             int           `yaml:"fall"`
	Rise             int           `yaml:"rise"`
	ExpectStatus     int           `yaml:"expect-status"`
	MaxResponseBytes int           `yaml:"max-response-bytes"`
	// TLS: when any file is set, checks speak HTTPS: the server is verified
	// against ca-file (its name or IP must be in the certificate: the check
	// address's host, or server-name), and cert-file/key-file are offered
	// as the client certificate. For Patroni's REST API served over TLS
	// (restapi.certfile). Default: plain HTTP.
	TLS config.TLS `yaml:"tls"`

	// tlsClient is TLS's client side, loaded once by validate.
	tlsClient *tls.Config
}

// ServerConfig is one backend server.
type ServerConfig struct {
	Name         string `yaml:"name"`
	Address      string `yaml:"address"`
	Node         string `yaml:"node"`
	Weight       int    `yaml:"weight"`
	CheckAddress string `yaml:"check-address"`
}

// DefaultConfig returns the defaults every loaded file starts from.
func DefaultConfig() Config {
	return Config{
		LogLevel:        "info",
		ShutdownTimeout: 30 * time.Second,
		FIFOReads:       "auto",
		EventLoop:       "auto",
		Admin:           AdminConfig{Listen: "127.0.0.1:7480"},
		Cluster:         "hapair",
		Etcd:            config.Etcd{DialTimeout: 2 * time.Second},
		VIP:             DefaultVIP(),
	}
}

// Validate checks the configuration and fills per-item defaults. Every
// error names the field by its full dotted path and the value received.
func (c *Config) Validate() error {
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return config.Errorf("log-level", c.LogLevel, "must be debug, info, warn or error")
	}
	switch c.FIFOReads {
	case "":
		c.FIFOReads = "auto"
	case "auto", "on", "off":
	default:
		return config.Errorf("fifo-reads", c.FIFOReads, "must be auto, on or off")
	}
	switch c.EventLoop {
	case "":
		c.EventLoop = "auto"
	case "auto", "on", "off":
	default:
		return config.Errorf("event-loop", c.EventLoop, "must be auto, on or off")
	}
	if c.EventLoop == "on" && c.FIFOReads == "off" {
		return config.Errorf("event-loop", c.EventLoop, "needs the pollers of fifo-reads (auto or on), which is off")
	}
	if c.ShutdownTimeout < 0 {
		return config.Errorf("shutdown-timeout", c.ShutdownTimeout, "must not be negative")
	}
	if c.Admin.Listen != "" {
		if err := checkHostPort("admin.listen", c.Admin.Listen); err != nil {
			return err
		}
	}
	if c.Cluster == "" || strings.Contains(c.Cluster, "/") {
		return config.Errorf("cluster", c.Cluster, "must be a non-empty name without '/'")
	}
	if err := c.validateEtcd(); err != nil {
		return err
	}
	if err := c.validateVIP(); err != nil {
		return err
	}
	names := map[string]Kind{}
	for i := range c.Backends {
		b := &c.Backends[i]
		if err := b.validate(fmt.Sprintf("backends[%d]", i), len(c.Etcd.Endpoints) > 0); err != nil {
			return err
		}
		if b.Kind == KindActivePassive {
			// The timing budget's relations (package budget), the same
			// rules as hapairctl plan --check applies across every file.
			if err := budget.Check(b.Timers(fmt.Sprintf("backends[%d]", i))); err != nil {
				return err
			}
		}
		if _, dup := names[b.Name]; dup {
			return config.Errorf(fmt.Sprintf("backends[%d].name", i), b.Name, "duplicate backend name")
		}
		names[b.Name] = b.Kind
	}
	if len(c.Listeners) == 0 {
		return config.Errorf("listeners", nil, "at least one listener is required")
	}
	addrs := map[string]bool{}
	lnames := map[string]bool{}
	for i := range c.Listeners {
		l := &c.Listeners[i]
		p := fmt.Sprintf("listeners[%d]", i)
		if err := l.validate(p, names); err != nil {
			return err
		}
		if lnames[l.Name] {
			return config.Errorf(p+".name", l.Name, "duplicate listener name")
		}
		if addrs[l.Listen] && !strings.HasSuffix(l.Listen, ":0") {
			return config.Errorf(p+".listen", l.Listen, "address used by another listener")
		}
		lnames[l.Name], addrs[l.Listen] = true, true
	}
	return nil
}

func (c *Config) validateEtcd() error {
	if len(c.Etcd.Endpoints) == 0 {
		return nil // no fast path: health checks alone decide
	}
	return c.Etcd.Validate("etcd")
}

func (l *ListenerConfig) validate(p string, backends map[string]Kind) error {
	if l.Name == "" {
		return config.Errorf(p+".name", l.Name, "is required")
	}
	if err := checkHostPort(p+".listen", l.Listen); err != nil {
		return err
	}
	kind, ok := backends[l.Backend]
	if !ok {
		return config.Errorf(p+".backend", l.Backend, "no backend of that name")
	}
	if l.Mode == "" {
		l.Mode = "http"
		if kind == KindPGPrimary || kind == KindPGReplicas {
			l.Mode = "tcp"
		}
	}
	switch l.Mode {
	case "http":
		if kind != KindActivePassive && kind != KindPool {
			return config.Errorf(p+".backend", l.Backend, "an http listener needs an active-passive or pool backend, not %s", kind)
		}
	case "tcp":
		if l.TLS.Enabled() {
			return config.Errorf(p+".tls", l.TLS.CertFile, "tls is only supported in http mode")
		}
	default:
		return config.Errorf(p+".mode", l.Mode, "must be http or tcp")
	}
	if l.TLS.Enabled() {
		if l.TLS.CertFile == "" || l.TLS.KeyFile == "" {
			return config.Errorf(p+".tls.cert-file", l.TLS.CertFile, "a TLS listener needs cert-file and key-file")
		}
		if err := l.TLS.Validate(p + ".tls"); err != nil {
			return err
		}
	}
	if l.TLSSessionTickets != nil && !l.TLS.Enabled() {
		return config.Errorf(p+".tls-session-tickets", *l.TLSSessionTickets, "needs tls.cert-file and tls.key-file")
	}
	if l.Engine == "" {
		l.Engine = "fast"
	}
	if l.Engine != "fast" && l.Engine != "std" {
		return config.Errorf(p+".engine", l.Engine, "must be fast or std")
	}
	setDefault(&l.MaxHeaderBytes, 16384)
	setDefault(&l.MaxHeaderCount, 100)
	setDefaultDur(&l.ReadHeaderTimeout, 10*time.Second)
	setDefaultDur(&l.IdleTimeout, 60*time.Second)
	setDefaultDur(&l.ClientBodyTimeout, 60*time.Second)
	if l.MaxHeaderBytes < 1024 || l.MaxHeaderBytes > 1<<20 {
		return config.Errorf(p+".max-header-bytes", l.MaxHeaderBytes, "must be between 1024 and 1048576")
	}
	if l.MaxHeaderCount < 8 || l.MaxHeaderCount > 10000 {
		return config.Errorf(p+".max-header-count", l.MaxHeaderCount, "must be between 8 and 10000")
	}
	if l.ReadHeaderTimeout < 0 || l.IdleTimeout < 0 || l.WriteTimeout < 0 {
		return config.Errorf(p+".read-header-timeout", l.ReadHeaderTimeout, "timeouts must not be negative")
	}
	if l.ClientBodyTimeout < 0 {
		return config.Errorf(p+".client-body-timeout", l.ClientBodyTimeout, "must not be negative")
	}
	return nil
}

func (b *BackendConfig) validate(p string, haveEtcd bool) error {
	if b.Name == "" {
		return config.Errorf(p+".name", b.Name, "is required")
	}
	switch b.Kind {
	case KindActivePassive, KindPool, KindPGPrimary, KindPGReplicas:
	default:
		return config.Errorf(p+".kind", b.Kind, "must be active-passive, pool, pg-primary or pg-replicas")
	}
	if b.Balance == "" {
		b.Balance = BalanceLeastConn
	}
	if b.Balance != BalanceLeastConn && b.Balance != BalanceRoundRobin {
		return config.Errorf(p+".balance", b.Balance, "must be least-conn or round-robin")
	}
	if b.HoldTimeout == nil {
		d := 5 * time.Second
		if b.Kind == KindPGPrimary || b.Kind == KindPGReplicas {
			d = 0 // refuse at once when none qualifies
		}
		b.HoldTimeout = &d
	}
	if *b.HoldTimeout < 0 {
		return config.Errorf(p+".hold-timeout", *b.HoldTimeout, "must not be negative (0 disables)")
	}
	setDefault(&b.HoldQueue, 1024)
	if b.MaxConns < 0 {
		return config.Errorf(p+".max-conns", b.MaxConns, "must not be negative (0: no limit)")
	}
	setDefaultDur(&b.QueueTimeout, 5*time.Second)
	if b.QueueTimeout < 0 {
		return config.Errorf(p+".queue-timeout", b.QueueTimeout, "must not be negative")
	}
	setDefaultDur(&b.RetryAfter, time.Second)
	if b.Retries == nil {
		n := 2
		b.Retries = &n
	}
	if *b.Retries < 0 || *b.Retries > 10 {
		return config.Errorf(p+".retries", *b.Retries, "must be between 0 and 10")
	}
	if b.MaxFails < 0 {
		return config.Errorf(p+".max-fails", b.MaxFails, "must not be negative (0 disables)")
	}
	setDefaultDur(&b.FailTimeout, 10*time.Second)
	setDefaultDur(&b.FastInterval, 10*time.Millisecond)
	setDefaultDur(&b.ConnectTimeout, 2*time.Second)
	setDefaultDur(&b.ResponseHeaderTimeout, 30*time.Second)
	setDefaultDur(&b.ReadTimeout, 60*time.Second)
	for _, t := range []struct {
		name string
		d    time.Duration
	}{{"connect-timeout", b.ConnectTimeout}, {"response-header-timeout", b.ResponseHeaderTimeout}, {"read-timeout", b.ReadTimeout}} {
		if t.d < 0 {
			return config.Errorf(p+"."+t.name, t.d, "must not be negative")
		}
	}
	setDefault(&b.IdleConns, 64)
	setDefaultDur(&b.IdleConnTimeout, 30*time.Second)
	if b.IdleSurplusTimeout == nil {
		d := 5 * time.Second // HAProxy's pool-purge-delay
		b.IdleSurplusTimeout = &d
	}
	if *b.IdleSurplusTimeout < 0 {
		return config.Errorf(p+".idle-surplus-timeout", *b.IdleSurplusTimeout, "must not be negative (0 closes them at once)")
	}
	if b.EtcdFastPath && !haveEtcd {
		return config.Errorf(p+".etcd-fast-path", b.EtcdFastPath, "needs etcd.endpoints")
	}
	if b.EtcdFastPath && b.Kind != KindActivePassive && b.Kind != KindPGPrimary {
		return config.Errorf(p+".etcd-fast-path", b.EtcdFastPath, "only for active-passive and pg-primary backends")
	}
	if b.EtcdFastPath && b.Kind == KindPGPrimary && !strings.HasPrefix(b.PatroniLeaderKey, "/") {
		return config.Errorf(p+".patroni-leader-key", b.PatroniLeaderKey, "pg-primary fast path needs Patroni's leader key (/service/<scope>/leader)")
	}
	if b.PatroniLeaderKey != "" && b.Kind != KindPGPrimary {
		return config.Errorf(p+".patroni-leader-key", b.PatroniLeaderKey, "only for pg-primary backends")
	}
	if err := b.Check.validate(p+".check", b.Kind); err != nil {
		return err
	}
	if len(b.Servers) == 0 {
		return config.Errorf(p+".servers", nil, "at least one server is required")
	}
	seen := map[string]bool{}
	for i := range b.Servers {
		s := &b.Servers[i]
		sp := fmt.Sprintf("%s.servers[%d]", p, i)
		if err := s.validate(sp, b.Check.Port); err != nil {
			return err
		}
		if seen[s.Name] {
			return config.Errorf(sp+".name", s.Name, "duplicate server name")
		}
		seen[s.Name] = true
	}
	return nil
}

// Timers is this backend's part of the timing budget (after validate filled
// the defaults), each field named by its path p.
func (b BackendConfig) Timers(p string) budget.Timers {
	t := budget.Timers{CheckInterval: b.Check.Interval, CheckTimeout: b.Check.Timeout,
		CheckFall: b.Check.Fall, CheckRise: b.Check.Rise, FastPath: b.EtcdFastPath,
		Names: map[budget.Key]string{}}
	if b.HoldTimeout != nil {
		t.HoldTimeout = *b.HoldTimeout
	}
	for _, k := range []budget.Key{budget.CheckInterval, budget.CheckTimeout, budget.CheckFall, budget.CheckRise, budget.HoldTimeout} {
		t.Names[k] = p + "." + k.String()
	}
	return t
}

// ChecksEnabled reports whether active checks run for this backend.
func (c CheckConfig) ChecksEnabled() bool { return c.Enabled == nil || *c.Enabled }

func (c *CheckConfig) validate(p string, kind Kind) error {
	if !c.ChecksEnabled() {
		if kind != KindPool {
			return config.Errorf(p+".enabled", false, "only pool backends may run without active checks")
		}
	}
	if c.Method == "" {
		c.Method = "GET"
	}
	if c.Method != "GET" && c.Method != "HEAD" && c.Method != "OPTIONS" {
		return config.Errorf(p+".method", c.Method, "must be GET, HEAD or OPTIONS")
	}
	if c.Path == "" {
		c.Path = map[Kind]string{KindActivePassive: "/ha-health", KindPool: "/",
			KindPGPrimary: "/primary", KindPGReplicas: "/replica?lag=64MB"}[kind]
	}
	if !strings.HasPrefix(c.Path, "/") || strings.ContainsAny(c.Path, " \r\n") {
		return config.Errorf(p+".path", c.Path, "must start with / and contain no spaces")
	}
	if c.Port == 0 && (kind == KindPGPrimary || kind == KindPGReplicas) {
		c.Port = 8008
	}
	if c.Port < 0 || c.Port > 65535 {
		return config.Errorf(p+".port", c.Port, "must be a TCP port (0 = server port)")
	}
	setDefaultDur(&c.Interval, time.Second)
	setDefaultDur(&c.Timeout, c.Interval/2)
	setDefault(&c.Fall, 2)
	setDefault(&c.Rise, 2)
	setDefault(&c.ExpectStatus, 200)
	setDefault(&c.MaxResponseBytes, 8192)
	if c.Interval < 10*time.Millisecond {
		return config.Errorf(p+".interval", c.Interval, "must be at least 10ms")
	}
	if c.Timeout <= 0 || c.Timeout >= c.Interval {
		return config.Errorf(p+".timeout", c.Timeout, "must be positive and below check.interval (%s)", c.Interval)
	}
	if c.Fall < 1 || c.Rise < 1 {
		return config.Errorf(p+".fall", c.Fall, "fall and rise must be at least 1 (rise %d)", c.Rise)
	}
	if c.ExpectStatus < 100 || c.ExpectStatus > 599 {
		return config.Errorf(p+".expect-status", c.ExpectStatus, "must be an HTTP status code")
	}
	if c.MaxResponseBytes < 256 || c.MaxResponseBytes > 1<<20 {
		return config.Errorf(p+".max-response-bytes", c.MaxResponseBytes, "must be between 256 and 1048576")
	}
	c.tlsClient = nil
	if c.TLS.Enabled() {
		if err := c.TLS.Validate(p + ".tls"); err != nil {
			return err
		}
		tc, err := c.TLS.ClientConfig()
		if err != nil {
			return config.Errorf(p+".tls", c.TLS.CertFile, "%v", err)
		}
		c.tlsClient = tc
	}
	return nil
}

func (s *ServerConfig) validate(p string, checkPort int) error {
	if s.Name == "" || strings.ContainsAny(s.Name, "/ \t") {
		return config.Errorf(p+".name", s.Name, "is required and must not contain '/' or spaces")
	}
	if err := checkHostPort(p+".address", s.Address); err != nil {
		return err
	}
	if s.Node == "" {
		s.Node = s.Name
	}
	setDefault(&s.Weight, 1)
	if s.Weight < 1 || s.Weight > 256 {
		return config.Errorf(p+".weight", s.Weight, "must be between 1 and 256")
	}
	if s.CheckAddress == "" {
		s.CheckAddress = s.Address
		if checkPort != 0 {
			host, _, _ := net.SplitHostPort(s.Address)
			s.CheckAddress = net.JoinHostPort(host, strconv.Itoa(checkPort))
		}
	}
	return checkHostPort(p+".check-address", s.CheckAddress)
}

func checkHostPort(field, v string) error {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return config.Errorf(field, v, "must be host:port")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		// Port 0 (any free port) is fine for our own listeners, not for servers.
		if !(n == 0 && err == nil && host != "" && (strings.HasPrefix(field, "listeners") || field == "admin.listen")) {
			return config.Errorf(field, v, "port must be 1..65535")
		}
	}
	return nil
}

func setDefault(v *int, d int) {
	if *v == 0 {
		*v = d
	}
}

func setDefaultDur(v *time.Duration, d time.Duration) {
	if *v == 0 {
		*v = d
	}
}
