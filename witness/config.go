package witness

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hapair/hapair/budget"
	"github.com/hapair/hapair/internal/config"
)

// Role is what a member is for: a data node's etcd, or the witness VM's vote.
type Role string

const (
	// RoleMember is the etcd member of a data node (A or B). etcd defaults.
	RoleMember Role = "member"
	// RoleWitness is the third vote on a small VM: small footprint, and it
	// hands raft leadership to a data member whenever it finds itself leader.
	RoleWitness Role = "witness"
)

// Mode says how the member first comes up. It only matters while the data
// directory is empty: a member that already has data always just restarts.
type Mode string

const (
	// ModeBootstrap starts a new cluster from the static InitialCluster list.
	ModeBootstrap Mode = "bootstrap"
	// ModeJoin adds this member to a running cluster (MemberAdd through
	// JoinEndpoints), then starts it with initial state "existing".
	ModeJoin Mode = "join"
)

// Witness-role defaults, chosen for a VM with little memory. The data set is
// Patroni's and roled's keys: a few kilobytes that are rewritten all the time.
const (
	witnessQuotaBytes    = 256 << 20 // 256 MiB; etcd's default is 2 GiB
	witnessSnapshotCount = 2000      // etcd's default is 10000
	witnessCatchUp       = 1000      // raft entries kept after a snapshot (etcd: 5000)
	witnessMemoryLimit   = 40 << 20  // soft Go memory limit (GOMEMLIMIT)
	witnessGCPercent     = 50        // GOGC: a smaller heap for a little more GC work
)

// Config is the configuration of one hapair-witness process. Keys are the
// YAML names; every field can also be set with --<key>.
type Config struct {
	// Name is this member's unique name in the cluster (required).
	Name string `yaml:"name"`
	// Role is "witness" (default) or "member".
	Role Role `yaml:"role"`
	// Mode is "bootstrap" (default) or "join"; see Mode.
	Mode Mode `yaml:"mode"`
	// DataDir holds etcd's WAL and database (default /var/lib/hapair/witness).
	DataDir string `yaml:"data-dir"`

	// ListenPeerURLs are the URLs the raft peer listener binds
	// (default https://0.0.0.0:2380).
	ListenPeerURLs []string `yaml:"listen-peer-urls"`
	// AdvertisePeerURLs are the peer URLs the other members reach this one at
	// (required; exactly what InitialCluster lists for Name).
	AdvertisePeerURLs []string `yaml:"advertise-peer-urls"`
	// ListenClientURLs are the URLs the client listener binds (gRPC and the
	// JSON gateway Patroni uses; default https://0.0.0.0:2379).
	ListenClientURLs []string `yaml:"listen-client-urls"`
	// AdvertiseClientURLs are the client URLs published to clients (required).
	AdvertiseClientURLs []string `yaml:"advertise-client-urls"`

	// InitialCluster is the static member list for ModeBootstrap, one
	// "name=peerURL" per entry, this member included.
	InitialCluster []string `yaml:"initial-cluster"`
	// InitialClusterToken keeps separate clusters from talking to each other
	// by mistake (default "hapair").
	InitialClusterToken string `yaml:"initial-cluster-token"`
	// JoinEndpoints are client URLs of running members, used by ModeJoin.
	JoinEndpoints []string `yaml:"join-endpoints"`
	// WitnessNames lists the members that are witnesses. Every other voting
	// member is a data member, a candidate for the raft leadership. A member
	// with role witness always counts itself as a witness, so with a single
	// witness this can stay empty.
	WitnessNames []string `yaml:"witness-names"`

	// Insecure allows plain http:// URLs. Without it every URL must be https
	// and the matching TLS section must be set.
	Insecure bool `yaml:"insecure"`
	// ClientTLS secures the client listener; with ca-file set, clients must
	// present a certificate signed by it. The same certificate is used as a
	// client certificate to reach the other members (join, health probes),
	// so it needs both the serverAuth and clientAuth key usages.
	ClientTLS config.TLS `yaml:"client-tls"`
	// PeerTLS secures raft traffic; with ca-file set, peers must present a
	// certificate signed by it.
	PeerTLS config.TLS `yaml:"peer-tls"`

	// MetricsListen is the plain-HTTP address serving /health, /livez,
	// /readyz and /metrics (etcd's and hapair_witness_*); "" disables it
	// (default ":2381").
	MetricsListen string `yaml:"metrics-listen"`

	// HeartbeatInterval is raft's heartbeat (default 100ms).
	HeartbeatInterval time.Duration `yaml:"heartbeat-interval"`
	// ElectionTimeout is raft's election timeout, at least 10 heartbeats
	// (default 1s; package budget's rule).
	ElectionTimeout time.Duration `yaml:"election-timeout"`
	// CheckInterval is how often the member probes the other members' health
	// (the members_healthy gauges) and, as a witness, checks whether it must
	// hand the leadership over (default 5s). A leader change triggers a check
	// at once, and a hand-off that could not be done is retried every
	// election timeout, so the interval does not delay a hand-off.
	CheckInterval time.Duration `yaml:"check-interval"`
	// LeaseReapInterval is how often this member, while it leads raft,
	// looks at leases in their last second, to revoke each one as soon as it
	// has expired rather than at etcd's own check, every 500 ms: Patroni's
	// leader key of a dead primary goes 0–500 ms sooner (250 ms on average).
	// Leases granted for less than 3 s are left to etcd. 0 turns it off
	// (default 25ms).
	LeaseReapInterval time.Duration `yaml:"lease-reap-interval"`

	// QuotaBackendBytes caps the database size; 0 means the role's default
	// (witness 256 MiB, member etcd's 2 GiB). The cluster's usable size is the
	// smallest quota of its members: a member over quota blocks all writes.
	QuotaBackendBytes int64 `yaml:"quota-backend-bytes"`
	// SnapshotCount is the number of applied entries between snapshots; 0
	// means the role's default (witness 2000, member etcd's 10000).
	SnapshotCount uint64 `yaml:"snapshot-count"`
	// AutoCompactionRetention keeps this much key history (periodic
	// compaction, run by whichever member is leader); 0 disables it
	// (default 10m).
	AutoCompactionRetention time.Duration `yaml:"auto-compaction-retention"`
	// MemoryLimitBytes is the Go runtime's soft memory limit; 0 means the
	// role's default (witness 40 MiB, member none). A GOMEMLIMIT environment
	// variable wins over it. A witness also runs the GC at GOGC=50 unless
	// the GOGC environment variable is set.
	MemoryLimitBytes int64 `yaml:"memory-limit-bytes"`

	// LogLevel is hapair's log level: debug, info, warn, error (default info).
	LogLevel string `yaml:"log-level"`
	// EtcdLogLevel is the level of the embedded etcd's own logs, which are
	// chatty at info (default warn).
	EtcdLogLevel string `yaml:"etcd-log-level"`
}

// DefaultConfig returns a witness-role configuration with the defaults
// documented on Config. Name and the advertised URLs have no default.
func DefaultConfig() Config {
	return Config{
		Role:                    RoleWitness,
		Mode:                    ModeBootstrap,
		DataDir:                 "/var/lib/hapair/witness",
		ListenPeerURLs:          []string{"https://0.0.0.0:2380"},
		ListenClientURLs:        []string{"https://0.0.0.0:2379"},
		InitialClusterToken:     "hapair",
		MetricsListen:           ":2381",
		HeartbeatInterval:       100 * time.Millisecond,
		ElectionTimeout:         time.Second,
		CheckInterval:           5 * time.Second,
		LeaseReapInterval:       25 * time.Millisecond,
		AutoCompactionRetention: 10 * time.Minute,
		LogLevel:                "info",
		EtcdLogLevel:            "warn",
	}
}

// Validate checks the configuration without touching the data directory, so
// a bad file never leaves a half-made member behind. Errors name the field.
func (c *Config) Validate() error {
	checks := []func() error{
		c.validateIdentity,
		c.validateURLs,
		c.validateTLS,
		c.validateMode,
		c.validateWitnessNames,
		c.validateTuning,
	}
	for _, check := range checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

func (c *Config) validateIdentity() error {
	if c.Name == "" {
		return config.Errorf("name", nil, "is required")
	}
	if strings.ContainsAny(c.Name, "=, \t") {
		return config.Errorf("name", c.Name, "must not contain '=', ',' or blanks")
	}
	if c.Role != RoleMember && c.Role != RoleWitness {
		return config.Errorf("role", c.Role, "must be %q or %q", RoleWitness, RoleMember)
	}
	if c.Mode != ModeBootstrap && c.Mode != ModeJoin {
		return config.Errorf("mode", c.Mode, "must be %q or %q", ModeBootstrap, ModeJoin)
	}
	if c.DataDir == "" {
		return config.Errorf("data-dir", nil, "is required")
	}
	if c.InitialClusterToken == "" {
		return config.Errorf("initial-cluster-token", nil, "is required")
	}
	return nil
}

func (c *Config) validateURLs() error {
	lists := []struct {
		field     string
		urls      []string
		advertise bool
	}{
		{"listen-peer-urls", c.ListenPeerURLs, false},
		{"advertise-peer-urls", c.AdvertisePeerURLs, true},
		{"listen-client-urls", c.ListenClientURLs, false},
		{"advertise-client-urls", c.AdvertiseClientURLs, true},
	}
	for _, l := range lists {
		if len(l.urls) == 0 {
			return config.Errorf(l.field, nil, "at least one URL is required")
		}
		for i, u := range l.urls {
			if err := c.checkURL(fmt.Sprintf("%s[%d]", l.field, i), u, l.advertise); err != nil {
				return err
			}
		}
	}
	if c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			return config.Errorf("metrics-listen", c.MetricsListen, "must be host:port: %v", err)
		}
	}
	return nil
}

// checkURL accepts scheme://host:port with nothing after it. Plain http needs
// Insecure: a member that silently talks in clear text is worse than one that
// refuses to start.
func (c *Config) checkURL(field, raw string, advertise bool) error {
	u, err := url.Parse(raw)
	if err != nil {
		return config.Errorf(field, raw, "not a URL: %v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return config.Errorf(field, raw, "scheme must be https (or http with insecure: true)")
	}
	if u.Scheme == "http" && !c.Insecure {
		return config.Errorf(field, raw, "plain http needs insecure: true; use https with tls")
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || port == "" {
		return config.Errorf(field, raw, "must be scheme://host:port")
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return config.Errorf(field, raw, "must be scheme://host:port with no path")
	}
	if ip := net.ParseIP(host); advertise && (host == "" || ip != nil && ip.IsUnspecified()) {
		return config.Errorf(field, raw, "an advertised URL needs a reachable host, not %q", host)
	}
	return nil
}

func (c *Config) validateTLS() error {
	sections := []struct {
		field string
		tls   config.TLS
		urls  []string
	}{
		{"client-tls", c.ClientTLS, append(slices.Clone(c.ListenClientURLs), c.AdvertiseClientURLs...)},
		{"peer-tls", c.PeerTLS, append(slices.Clone(c.ListenPeerURLs), c.AdvertisePeerURLs...)},
	}
	for _, s := range sections {
		if err := s.tls.Validate(s.field); err != nil {
			return err
		}
		for _, raw := range s.urls {
			u, _ := url.Parse(raw) // already checked
			if u.Scheme == "https" && s.tls.CertFile == "" {
				return config.Errorf(config.Join(s.field, "cert-file"), nil, "is required for %s", raw)
			}
			if u.Scheme == "http" && s.tls.Enabled() {
				return config.Errorf(s.field, raw, "is set but the URL is plain http")
			}
		}
	}
	return nil
}

func (c *Config) validateMode() error {
	if c.Mode == ModeJoin {
		if len(c.JoinEndpoints) == 0 {
			return config.Errorf("join-endpoints", nil, "at least one client URL is required with mode join")
		}
		for i, u := range c.JoinEndpoints {
			if err := c.checkURL(fmt.Sprintf("join-endpoints[%d]", i), u, true); err != nil {
				return err
			}
		}
		return nil
	}
	members, err := c.initialMembers()
	if err != nil {
		return err
	}
	own, ok := members[c.Name]
	if !ok {
		return config.Errorf("initial-cluster", strings.Join(c.InitialCluster, ","), "must list this member (name %q)", c.Name)
	}
	if !slices.Contains(c.AdvertisePeerURLs, own) {
		return config.Errorf("initial-cluster", own, "lists %q with a peer URL that is not in advertise-peer-urls %v", c.Name, c.AdvertisePeerURLs)
	}
	return nil
}

// initialMembers parses InitialCluster into name → peer URL. One peer URL per
// member: a name given twice is a mistake (a copy-paste of a line), not a
// second URL.
func (c *Config) initialMembers() (map[string]string, error) {
	if len(c.InitialCluster) == 0 {
		return nil, config.Errorf("initial-cluster", nil, "is required with mode bootstrap (name=peerURL,...)")
	}
	names := map[string]string{}
	urls := map[string]string{}
	for i, entry := range c.InitialCluster {
		field := fmt.Sprintf("initial-cluster[%d]", i)
		name, peer, ok := strings.Cut(entry, "=")
		if !ok || name == "" {
			return nil, config.Errorf(field, entry, "must be name=peerURL")
		}
		if err := c.checkURL(field, peer, true); err != nil {
			return nil, err
		}
		if _, dup := names[name]; dup {
			return nil, config.Errorf(field, entry, "duplicate member name %q", name)
		}
		if other, dup := urls[peer]; dup {
			return nil, config.Errorf(field, entry, "peer URL already used by member %q", other)
		}
		names[name], urls[peer] = peer, name
	}
	return names, nil
}

func (c *Config) validateWitnessNames() error {
	for i, n := range c.WitnessNames {
		field := fmt.Sprintf("witness-names[%d]", i)
		if n == "" {
			return config.Errorf(field, n, "must not be empty")
		}
		if n == c.Name && c.Role == RoleMember {
			return config.Errorf(field, n, "names this member, whose role is member")
		}
	}
	return nil
}

func (c *Config) validateTuning() error {
	hb, el := c.HeartbeatInterval, c.ElectionTimeout
	switch {
	case hb < 10*time.Millisecond || hb%time.Millisecond != 0:
		return config.Errorf("heartbeat-interval", hb, "must be a whole number of milliseconds, at least 10ms")
	case el%time.Millisecond != 0:
		return config.Errorf("election-timeout", el, "must be whole milliseconds")
	case el > 50*time.Second:
		return config.Errorf("election-timeout", el, "must be at most 50s")
	}
	// The timing budget's rule (package budget): election ≥ 10 heartbeats.
	if err := budget.Check(budget.Timers{EtcdHeartbeat: hb, EtcdElection: el}); err != nil {
		return err
	}
	switch {
	case c.CheckInterval <= 0:
		return config.Errorf("check-interval", c.CheckInterval, "must be positive")
	case c.LeaseReapInterval < 0 || c.LeaseReapInterval > time.Second:
		return config.Errorf("lease-reap-interval", c.LeaseReapInterval, "must be between 0 (off) and 1s")
	case c.QuotaBackendBytes < 0:
		return config.Errorf("quota-backend-bytes", c.QuotaBackendBytes, "must not be negative")
	case c.MemoryLimitBytes < 0:
		return config.Errorf("memory-limit-bytes", c.MemoryLimitBytes, "must not be negative")
	case c.AutoCompactionRetention < 0:
		return config.Errorf("auto-compaction-retention", c.AutoCompactionRetention, "must not be negative")
	}
	for _, l := range []struct{ field, level string }{{"log-level", c.LogLevel}, {"etcd-log-level", c.EtcdLogLevel}} {
		if !slices.Contains([]string{"debug", "info", "warn", "error"}, l.level) {
			return config.Errorf(l.field, l.level, "must be debug, info, warn or error")
		}
	}
	return nil
}

// isWitness reports whether the member called name is a witness, that is not
// a candidate for the raft leadership.
func (c *Config) isWitness(name string) bool {
	return (name == c.Name && c.Role == RoleWitness) || slices.Contains(c.WitnessNames, name)
}

// effective returns the role-dependent tuning with zero values resolved.
func (c *Config) effective() (quota int64, snapshots, catchUp uint64, memLimit int64) {
	quota, snapshots, memLimit = c.QuotaBackendBytes, c.SnapshotCount, c.MemoryLimitBytes
	if c.Role != RoleWitness {
		return quota, snapshots, 0, memLimit
	}
	if quota == 0 {
		quota = witnessQuotaBytes
	}
	if snapshots == 0 {
		snapshots = witnessSnapshotCount
	}
	if memLimit == 0 && os.Getenv("GOMEMLIMIT") == "" {
		memLimit = witnessMemoryLimit
	}
	return quota, snapshots, min(witnessCatchUp, snapshots), memLimit
}
