package roled

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/hapair/hapair/budget"
	"github.com/hapair/hapair/internal/config"
	"github.com/hapair/hapair/syncdir"
	"github.com/hapair/hapair/vip"
)

// Config is the whole configuration of hapair-roled. YAML keys are the ones
// in examples/roled.yaml; DefaultConfig documents the defaults.
type Config struct {
	Node      string `yaml:"node"`       // this node's name (required)
	Cluster   string `yaml:"cluster"`    // cluster name (default hapair)
	KeyPrefix string `yaml:"key-prefix"` // etcd prefix (default /hapair/<cluster>/)
	LogLevel  string `yaml:"log-level"`  // debug, info, warn, error (default info)
	Listen    string `yaml:"listen"`     // HTTP /ha-health, /role, /metrics (default :7400)

	LeaseTTL          time.Duration `yaml:"lease-ttl"`          // fencing lease TTL (default 5s)
	SafetyMargin      time.Duration `yaml:"safety-margin"`      // deadline = last keep-alive sent + TTL - margin (default 1s)
	KeepAliveInterval time.Duration `yaml:"keepalive-interval"` // keep-alive period and timeout (default 1s)
	RereadInterval    time.Duration `yaml:"reread-interval"`    // periodic linearizable re-read (default 1s)
	HeartbeatInterval time.Duration `yaml:"heartbeat-interval"` // nodes/<node> rewrite period (default 5s)
	// QuorumLossAfter: PASSIVE when no etcd call sent within this long has
	// succeeded and no majority of the members has answered a serializable
	// read (this node is cut off: quorum.go), well before the lease
	// deadline; it bounds how long an isolated primary takes writes.
	// Default 800ms: with the balancer's check that keeps the isolated
	// primary's writes through the balancer within 1 s of the cut (the
	// async loss window, issue 19), and it still outlasts a TCP segment
	// lost twice (200 + 400 ms of retransmission timeouts) on the path to
	// the etcd leader. 0 turns it off (the lease deadline alone decides).
	QuorumLossAfter time.Duration `yaml:"quorum-loss-after"`
	// QuorumCheckInterval: period of the linearizable probe that keeps that
	// proof fresh (default 200ms; at most a third of quorum-loss-after).
	// Probes overlap (quorum.go runProbes), so a healthy node stays ACTIVE
	// while each read answers within quorum-loss-after - this interval.
	QuorumCheckInterval time.Duration `yaml:"quorum-check-interval"`
	// EtcdLeader: where roled wants etcd's raft leadership. "standby" (the
	// default): a ready standby asks the leader to hand it to this node's
	// member, so the primary's death never costs an etcd election before
	// its Patroni key can expire (etcdlead.go). "any": roled leaves it
	// alone. Needs three or more etcd endpoints, one per member.
	EtcdLeader EtcdLeaderPolicy `yaml:"etcd-leader"`
	// EtcdMember is this node's etcd member name (default: node).
	EtcdMember string `yaml:"etcd-member"`

	// Durability is the replication promise (DESIGN.md §10): async (the
	// default: Patroni's asynchronous replication, a kill may lose the last
	// commits), sync (Patroni synchronous_mode: an acknowledged commit is on
	// the standby; while the standby is away Patroni drops to async after a
	// few seconds of hung commits) or sync-strict (synchronous_mode_strict:
	// no commit at all while the standby is away). It must match Patroni's
	// dynamic configuration (the Ansible role and the lab render both from
	// one setting). sync and sync-strict turn the commit canary on;
	// sync-strict also makes a node whose commits hang PASSIVE (503).
	Durability Durability `yaml:"durability"`

	Etcd         config.Etcd        `yaml:"etcd"`
	Patroni      PatroniConfig      `yaml:"patroni"`
	Postgres     PostgresConfig     `yaml:"postgres"`
	Marker       MarkerConfig       `yaml:"marker"`
	Hooks        HooksConfig        `yaml:"hooks"`
	Agent        AgentConfig        `yaml:"agent"`
	ReplicaAgent ReplicaAgentConfig `yaml:"replica-agent"`
	PHPFPM       FPMConfig          `yaml:"php-fpm"`
	History      HistoryConfig      `yaml:"history"`
	Readiness    ReadinessConfig    `yaml:"readiness"` // standby readiness bounds, stuck leader (readiness.go)

	// Sync is the file sync (package syncdir), enabled when it lists roots.
	// roled drives its direction; its receiver runs in the same process.
	Sync syncdir.Config `yaml:"sync"`

	// VIP is the floating address that follows ACTIVE (package vip),
	// enabled when vip.address is set. It needs CAP_NET_ADMIN and CAP_NET_RAW.
	VIP vip.Config `yaml:"vip"`
}

// HistoryConfig bounds the failover history under <key-prefix>history/.
type HistoryConfig struct {
	Keep int `yaml:"keep"` // events kept, the newest (default 100)
	// RedundancyTimeout: how long the new ACTIVE waits for a ready standby
	// after a role change before it records "not redundant after …" in the
	// event (default 30m). A newer role change ends the wait earlier.
	RedundancyTimeout time.Duration `yaml:"redundancy-timeout"`
}

// PatroniConfig says where the local Patroni is and how its keys are named.
type PatroniConfig struct {
	URL              string        `yaml:"url"`                // REST API (default http://127.0.0.1:8008)
	Member           string        `yaml:"member"`             // Patroni member name (default: node)
	Scope            string        `yaml:"scope"`              // default hapair
	Namespace        string        `yaml:"namespace"`          // default /service
	PollInterval     time.Duration `yaml:"poll-interval"`      // default 500ms
	FastPollInterval time.Duration `yaml:"fast-poll-interval"` // default 50ms
	Timeout          time.Duration `yaml:"timeout"`            // per call (default 1s)
	TTL              time.Duration `yaml:"ttl"`                // Patroni's ttl when /config is unreadable (default 10s)
	// TLS is for an https url (Patroni's restapi.certfile): ca-file verifies
	// Patroni (the url's host must be in its certificate, or set
	// server-name), cert-file/key-file are offered as the client
	// certificate. Empty with https: the system's CAs. Default: none.
	TLS config.TLS `yaml:"tls"`
}

// PostgresConfig is the direct check of the local PostgreSQL.
type PostgresConfig struct {
	Enabled bool          `yaml:"enabled"` // default true
	DSN     string        `yaml:"dsn"`     // pgx connection string
	Timeout time.Duration `yaml:"timeout"` // connect and query (default 1s)
	// ActiveInterval: while this node holds the active key, PostgreSQL alone
	// is re-checked this often (default 100ms). During a switchover the old
	// primary refuses writes about 1 s before its /primary turns 503; this
	// makes the node PASSIVE within about one interval of that, not one
	// Patroni poll, without polling Patroni's REST API faster.
	ActiveInterval time.Duration `yaml:"active-interval"`
	// Canary is the commit canary (canary.go).
	Canary CanaryConfig `yaml:"canary"`
	// Fence is the database fence (dbfence.go), on when it lists roles.
	Fence FenceConfig `yaml:"fence"`
}

// Durability is the replication promise: async, sync or sync-strict.
type Durability string

// The durability modes, in the words of the inventory and of hapair-lab's
// --durability.
const (
	DurabilityAsync      Durability = "async"
	DurabilitySync       Durability = "sync"
	DurabilitySyncStrict Durability = "sync-strict"
)

// ParseDurability checks a durability word ("" is async).
func ParseDurability(s string) (Durability, error) {
	switch d := Durability(s); d {
	case "":
		return DurabilityAsync, nil
	case DurabilityAsync, DurabilitySync, DurabilitySyncStrict:
		return d, nil
	}
	return "", fmt.Errorf("durability %q: want async, sync or sync-strict", s)
}

// Synchronous reports whether Patroni runs synchronous_mode.
func (d Durability) Synchronous() bool { return d == DurabilitySync || d == DurabilitySyncStrict }

// CanaryConfig is the commit canary: one row of a heartbeat table committed
// on the local primary every interval, to tell "accepts writes" from
// "accepts connections but commits hang".
type CanaryConfig struct {
	// Enabled runs the canary under durability async too (sync and
	// sync-strict always run it). Default false.
	Enabled bool `yaml:"enabled"`
	// Interval between canary commits (default 500ms). One commit runs at a
	// time: a hung one holds one backend, never one per interval.
	Interval time.Duration `yaml:"interval"`
	// HangAfter: a canary commit not complete after this long is cancelled
	// and the node's commits count as hung (default 2s). A hang is thus
	// reported within interval + hang-after of the first hung commit.
	HangAfter time.Duration `yaml:"hang-after"`
	// Table is the heartbeat table, created if missing by roled's own role
	// in the DSN's database, one row per node (default hapair_canary).
	Table string `yaml:"table"`
	// SynchronousCommit is the synchronous_commit the canary commits at: the
	// application's (on, remote_apply, remote_write, local, off). Default ""
	// keeps the server's default, which is what the application gets unless
	// its role or session sets another.
	SynchronousCommit string `yaml:"synchronous-commit"`
}

// FenceConfig is the database fence: the application's PostgreSQL roles
// are made read-only while this node is not ACTIVE (dbfence.go).
type FenceConfig struct {
	// Roles: the application's roles (login names). Empty (default)
	// disables the fence. Never list Patroni's superuser, replication or
	// rewind user, nor the user of postgres.dsn.
	Roles []string `yaml:"roles"`
	// RetryInterval: how often a fence that could not be set is retried,
	// and a set one re-checked (default 1s); the rewind hold's too.
	RetryInterval time.Duration `yaml:"retry-interval"`
	// RewindRole: Patroni's rewind user (authentication.rewind.username).
	// While a takeover alarm naming this node is held for a person, roled
	// makes it NOLOGIN here, so the other node's Patroni cannot pg_rewind
	// away what that node wrote as ACTIVE before the person decides
	// (rewindhold.go). Empty (default) disables the hold. Must be a
	// dedicated rewind user, never the superuser: Patroni then rewinds as
	// the superuser, whom roled never locks out.
	RewindRole string `yaml:"rewind-role"`
}

// MarkerConfig is the marker file present only while ACTIVE.
type MarkerConfig struct {
	Path string `yaml:"path"` // default /var/lib/app-ha/active; empty disables
}

// HooksConfig are the role hook commands.
type HooksConfig struct {
	OnActive          string        `yaml:"on-active"`
	OnPassive         string        `yaml:"on-passive"`
	Timeout           time.Duration `yaml:"timeout"`             // default 30s
	FailureBackoff    time.Duration `yaml:"failure-backoff"`     // first wait after a failed on-active (default 2s)
	FailureBackoffMax time.Duration `yaml:"failure-backoff-max"` // cap of the doubling (default 60s)
}

// AgentConfig is the HAProxy agent-check listener for the application role.
type AgentConfig struct {
	Listen       string `yaml:"listen"`        // default :7401; empty disables
	PassiveReply string `yaml:"passive-reply"` // down, drain or maint (default down)
}

// ReplicaAgentConfig is the optional HAProxy agent-check for PostgreSQL replicas.
type ReplicaAgentConfig struct {
	Listen              string        `yaml:"listen"`                // empty (default) disables; conventionally :7403
	MaxLag              ByteSize      `yaml:"max-lag"`               // drain above (default 64MB)
	MinWeight           int           `yaml:"min-weight"`            // weight at max-lag, 1..100 (default 5)
	MaxConnectionsRatio float64       `yaml:"max-connections-ratio"` // drain above this share of max_connections (default 0.9)
	PrimaryReply        string        `yaml:"primary-reply"`         // reply on the primary: drain, down, maint, up (default drain)
	Interval            time.Duration `yaml:"interval"`              // refresh (default 1s)
}

// FPMConfig is the optional PHP-FPM status collector.
type FPMConfig struct {
	URL         string        `yaml:"url"` // status page; empty (default) disables
	Interval    time.Duration `yaml:"interval"`
	Timeout     time.Duration `yaml:"timeout"`
	MaxChildren int           `yaml:"max-children"` // pm.max_children; 0: utilisation against total
}

// DefaultConfig returns the defaults listed in examples/roled.yaml.
func DefaultConfig() Config {
	return Config{
		Cluster:             "hapair",
		LogLevel:            "info",
		Listen:              ":7400",
		LeaseTTL:            5 * time.Second,
		SafetyMargin:        time.Second,
		KeepAliveInterval:   time.Second,
		RereadInterval:      time.Second,
		HeartbeatInterval:   5 * time.Second,
		QuorumLossAfter:     800 * time.Millisecond,
		QuorumCheckInterval: 200 * time.Millisecond,
		EtcdLeader:          EtcdLeaderStandby,
		Etcd:                config.DefaultEtcd(),
		Patroni: PatroniConfig{
			URL:              "http://127.0.0.1:8008",
			Scope:            "hapair",
			Namespace:        "/service",
			PollInterval:     500 * time.Millisecond,
			FastPollInterval: 50 * time.Millisecond,
			Timeout:          time.Second,
			TTL:              10 * time.Second,
		},
		Postgres: PostgresConfig{
			Enabled:        true,
			DSN:            "host=/var/run/postgresql port=5432 user=postgres dbname=postgres sslmode=disable",
			Timeout:        time.Second,
			ActiveInterval: 100 * time.Millisecond,
			Canary: CanaryConfig{Interval: 500 * time.Millisecond, HangAfter: 2 * time.Second,
				Table: "hapair_canary"},
			Fence: FenceConfig{RetryInterval: time.Second},
		},
		Durability: DurabilityAsync,
		Marker:     MarkerConfig{Path: "/var/lib/app-ha/active"},
		Hooks: HooksConfig{
			Timeout:           30 * time.Second,
			FailureBackoff:    2 * time.Second,
			FailureBackoffMax: 60 * time.Second,
		},
		Agent: AgentConfig{Listen: ":7401", PassiveReply: "down"},
		ReplicaAgent: ReplicaAgentConfig{
			MaxLag:              64 << 20,
			MinWeight:           5,
			MaxConnectionsRatio: 0.9,
			PrimaryReply:        "drain",
			Interval:            time.Second,
		},
		PHPFPM:    FPMConfig{Interval: 5 * time.Second, Timeout: time.Second},
		History:   HistoryConfig{Keep: 100, RedundancyTimeout: 30 * time.Minute},
		Readiness: DefaultReadiness(),
		Sync:      syncdir.DefaultConfig(),
		VIP:       vip.Default(),
	}
}

// SyncEnabled reports whether the sync section lists roots.
func (c Config) SyncEnabled() bool { return len(c.Sync.Roots) > 0 }

// SyncConfig is the sync section with the node name defaulted to ours.
func (c Config) SyncConfig() syncdir.Config {
	s := c.Sync
	if s.Node == "" {
		s.Node = c.Node
	}
	return s
}

// Validate checks every field and the relations between them. Errors name the
// full YAML path and the value received.
func (c Config) Validate() error {
	checks := []func() error{c.validateTop, c.validateTiming, c.validatePatroni, c.validateDurability,
		c.validateOutputs, c.validateAgents, c.validateReadiness}
	for _, f := range checks {
		if err := f(); err != nil {
			return err
		}
	}
	// The timing budget's relations (package budget), the same rules as
	// hapairctl plan --check applies across every file.
	if err := budget.Check(c.Timers()); err != nil {
		return err
	}
	if c.EtcdLeader != EtcdLeaderStandby && c.EtcdLeader != EtcdLeaderAny {
		return config.Errorf("etcd-leader", c.EtcdLeader, "want %q or %q", EtcdLeaderStandby, EtcdLeaderAny)
	}
	if err := c.Etcd.Validate("etcd"); err != nil {
		return err
	}
	if err := c.validateVIP(); err != nil {
		return err
	}
	if c.SyncEnabled() {
		s := c.SyncConfig()
		return s.Validate()
	}
	return nil
}

func (c Config) validateTop() error {
	if c.Node == "" || strings.ContainsAny(c.Node, "/ \t\n") {
		return config.Errorf("node", c.Node, "required, without '/' or spaces")
	}
	if c.Cluster == "" || strings.Contains(c.Cluster, "/") {
		return config.Errorf("cluster", c.Cluster, "required, without '/'")
	}
	if c.KeyPrefix != "" && (!strings.HasPrefix(c.KeyPrefix, "/") || !strings.HasSuffix(c.KeyPrefix, "/")) {
		return config.Errorf("key-prefix", c.KeyPrefix, "must start and end with '/'")
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return config.Errorf("log-level", c.LogLevel, "want debug, info, warn or error")
	}
	return checkAddr("listen", c.Listen, false)
}

func (c Config) validateTiming() error {
	if c.LeaseTTL < 2*time.Second || c.LeaseTTL%time.Second != 0 {
		return config.Errorf("lease-ttl", c.LeaseTTL, "must be whole seconds, at least 2s (etcd leases have 1 s resolution)")
	}
	if c.SafetyMargin <= 0 || c.SafetyMargin > c.LeaseTTL/2 {
		return config.Errorf("safety-margin", c.SafetyMargin, "must be positive and at most half of lease-ttl (%s)", c.LeaseTTL)
	}
	if c.KeepAliveInterval <= 0 || 2*c.KeepAliveInterval > c.LeaseTTL-c.SafetyMargin {
		return config.Errorf("keepalive-interval", c.KeepAliveInterval,
			"must be positive and at most half of lease-ttl - safety-margin (%s), so one lost keep-alive is survived", c.LeaseTTL-c.SafetyMargin)
	}
	if c.RereadInterval <= 0 {
		return config.Errorf("reread-interval", c.RereadInterval, "must be positive")
	}
	if c.HeartbeatInterval <= 0 {
		return config.Errorf("heartbeat-interval", c.HeartbeatInterval, "must be positive")
	}
	// Their relations to each other and to the lease are the budget's
	// (RuleQuorumLoss, RuleQuorumCheck), checked in Validate.
	if c.QuorumLossAfter < 0 {
		return config.Errorf("quorum-loss-after", c.QuorumLossAfter, "must be 0 (off) or positive")
	}
	if c.QuorumLossAfter > 0 && c.QuorumCheckInterval <= 0 {
		return config.Errorf("quorum-check-interval", c.QuorumCheckInterval, "must be positive while quorum-loss-after is on")
	}
	return nil
}

func (c Config) validatePatroni() error {
	p := c.Patroni
	u, err := url.Parse(p.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return config.Errorf("patroni.url", p.URL, "want http://host:port or https://host:port")
	}
	if p.TLS.Enabled() {
		if u.Scheme != "https" {
			return config.Errorf("patroni.tls", p.TLS.CAFile, "needs an https patroni.url (%s)", p.URL)
		}
		if err := p.TLS.Validate("patroni.tls"); err != nil {
			return err
		}
	}
	if strings.Contains(p.Member, "/") {
		return config.Errorf("patroni.member", p.Member, "must not contain '/'")
	}
	if p.Scope == "" || strings.Contains(p.Scope, "/") {
		return config.Errorf("patroni.scope", p.Scope, "required, without '/'")
	}
	if !strings.HasPrefix(p.Namespace, "/") {
		return config.Errorf("patroni.namespace", p.Namespace, "must start with '/'")
	}
	if p.PollInterval <= 0 {
		return config.Errorf("patroni.poll-interval", p.PollInterval, "must be positive")
	}
	if p.FastPollInterval <= 0 || p.FastPollInterval > p.PollInterval {
		return config.Errorf("patroni.fast-poll-interval", p.FastPollInterval, "must be positive and at most poll-interval (%s)", p.PollInterval)
	}
	if p.Timeout <= 0 || p.Timeout >= c.LeaseTTL-c.SafetyMargin {
		return config.Errorf("patroni.timeout", p.Timeout, "must be positive and below lease-ttl - safety-margin")
	}
	if p.TTL <= c.LeaseTTL {
		return config.Errorf("patroni.ttl", p.TTL, "must be above lease-ttl (%s): roled must give up before Patroni's leader key can move", c.LeaseTTL)
	}
	if c.Postgres.Enabled && c.Postgres.DSN == "" {
		return config.Errorf("postgres.dsn", c.Postgres.DSN, "required while postgres.enabled")
	}
	if c.Postgres.Timeout <= 0 || c.Postgres.Timeout >= c.LeaseTTL-c.SafetyMargin {
		return config.Errorf("postgres.timeout", c.Postgres.Timeout, "must be positive and below lease-ttl - safety-margin")
	}
	if c.Postgres.ActiveInterval <= 0 || c.Postgres.ActiveInterval > c.Patroni.PollInterval {
		return config.Errorf("postgres.active-interval", c.Postgres.ActiveInterval, "must be positive and at most patroni.poll-interval (%s)", c.Patroni.PollInterval)
	}
	return nil
}

// CanaryOn reports whether the commit canary runs.
func (c Config) CanaryOn() bool {
	return c.Postgres.Enabled && (c.Durability.Synchronous() || c.Postgres.Canary.Enabled)
}

func (c Config) validateDurability() error {
	if _, err := ParseDurability(string(c.Durability)); err != nil {
		return config.Errorf("durability", c.Durability, "want async, sync or sync-strict")
	}
	if c.Durability.Synchronous() && !c.Postgres.Enabled {
		return config.Errorf("durability", c.Durability, "needs postgres.enabled (the commit canary)")
	}
	k := c.Postgres.Canary
	if c.CanaryOn() {
		if k.Interval <= 0 {
			return config.Errorf("postgres.canary.interval", k.Interval, "must be positive")
		}
		if k.HangAfter < 100*time.Millisecond || k.HangAfter >= c.LeaseTTL {
			return config.Errorf("postgres.canary.hang-after", k.HangAfter, "must be at least 100ms and below lease-ttl (%s)", c.LeaseTTL)
		}
		if k.Table == "" || strings.ContainsAny(k.Table, "\x00") {
			return config.Errorf("postgres.canary.table", k.Table, "required")
		}
	}
	switch k.SynchronousCommit {
	case "", "on", "remote_apply", "remote_write", "local", "off":
	default:
		return config.Errorf("postgres.canary.synchronous-commit", k.SynchronousCommit, "want on, remote_apply, remote_write, local or off")
	}
	f := c.Postgres.Fence
	own := ""
	if cc, err := pgx.ParseConfig(c.Postgres.DSN); err == nil {
		own = cc.User
	}
	if r := f.RewindRole; r != "" {
		switch {
		case !c.Postgres.Enabled:
			return config.Errorf("postgres.fence.rewind-role", r, "needs postgres.enabled")
		case r == own || r == "postgres" || slices.Contains(f.Roles, r):
			return config.Errorf("postgres.fence.rewind-role", r,
				"must be Patroni's dedicated rewind user: not the superuser, not roled's own user (%q), not a fenced role", own)
		case f.RetryInterval <= 0:
			return config.Errorf("postgres.fence.retry-interval", f.RetryInterval, "must be positive")
		}
	}
	if len(f.Roles) == 0 {
		return nil
	}
	if !c.Postgres.Enabled {
		return config.Errorf("postgres.fence.roles", f.Roles, "needs postgres.enabled")
	}
	if f.RetryInterval <= 0 {
		return config.Errorf("postgres.fence.retry-interval", f.RetryInterval, "must be positive")
	}
	for _, r := range f.Roles {
		if r == "" || r == own {
			return config.Errorf("postgres.fence.roles", f.Roles,
				"must not be empty nor name roled's own user (%q, postgres.dsn): roled's canary and fence use it", own)
		}
	}
	return nil
}

func (c Config) validateOutputs() error {
	h := c.Hooks
	if h.Timeout <= 0 {
		return config.Errorf("hooks.timeout", h.Timeout, "must be positive")
	}
	if h.FailureBackoff <= 0 {
		return config.Errorf("hooks.failure-backoff", h.FailureBackoff, "must be positive")
	}
	if h.FailureBackoffMax < h.FailureBackoff {
		return config.Errorf("hooks.failure-backoff-max", h.FailureBackoffMax, "must be at least failure-backoff (%s)", h.FailureBackoff)
	}
	if c.Marker.Path != "" && !strings.HasPrefix(c.Marker.Path, "/") {
		return config.Errorf("marker.path", c.Marker.Path, "must be absolute")
	}
	if c.History.Keep < 1 {
		return config.Errorf("history.keep", c.History.Keep, "must be at least 1")
	}
	if c.History.RedundancyTimeout <= 0 {
		return config.Errorf("history.redundancy-timeout", c.History.RedundancyTimeout, "must be positive")
	}
	f := c.PHPFPM
	if f.URL != "" {
		if u, err := url.Parse(f.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return config.Errorf("php-fpm.url", f.URL, "want http://host/status-path")
		}
		if f.Interval <= 0 {
			return config.Errorf("php-fpm.interval", f.Interval, "must be positive")
		}
		if f.Timeout <= 0 || f.Timeout > f.Interval {
			return config.Errorf("php-fpm.timeout", f.Timeout, "must be positive and at most interval")
		}
	}
	if f.MaxChildren < 0 {
		return config.Errorf("php-fpm.max-children", f.MaxChildren, "must not be negative")
	}
	return nil
}

func (c Config) validateAgents() error {
	if err := checkAddr("agent.listen", c.Agent.Listen, true); err != nil {
		return err
	}
	switch c.Agent.PassiveReply {
	case "down", "drain", "maint":
	default:
		return config.Errorf("agent.passive-reply", c.Agent.PassiveReply, "want down, drain or maint")
	}
	r := c.ReplicaAgent
	if err := checkAddr("replica-agent.listen", r.Listen, true); err != nil {
		return err
	}
	if r.Listen == "" {
		return nil
	}
	if !c.Postgres.Enabled {
		return config.Errorf("replica-agent.listen", r.Listen, "needs postgres.enabled")
	}
	if r.MaxLag <= 0 {
		return config.Errorf("replica-agent.max-lag", r.MaxLag, "must be positive")
	}
	if r.MinWeight < 1 || r.MinWeight > 100 {
		return config.Errorf("replica-agent.min-weight", r.MinWeight, "want 1..100")
	}
	if r.MaxConnectionsRatio <= 0 || r.MaxConnectionsRatio > 1 {
		return config.Errorf("replica-agent.max-connections-ratio", r.MaxConnectionsRatio, "want a share in (0, 1]")
	}
	switch r.PrimaryReply {
	case "drain", "down", "maint", "up":
	default:
		return config.Errorf("replica-agent.primary-reply", r.PrimaryReply, "want drain, down, maint or up")
	}
	if r.Interval <= 0 {
		return config.Errorf("replica-agent.interval", r.Interval, "must be positive")
	}
	return nil
}

func checkAddr(field, addr string, optional bool) error {
	if addr == "" && optional {
		return nil
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return config.Errorf(field, addr, "want host:port or :port")
	}
	return nil
}

// Timers is this file's part of the timing budget, named by roled.yaml's keys.
func (c Config) Timers() budget.Timers {
	t := budget.Timers{
		PatroniTTL: c.Patroni.TTL, LeaseTTL: c.LeaseTTL, SafetyMargin: c.SafetyMargin,
		KeepAliveInterval: c.KeepAliveInterval, RereadInterval: c.RereadInterval,
		PollInterval: c.Patroni.PollInterval, FastPollInterval: c.Patroni.FastPollInterval,
		PatroniTimeout: c.Patroni.Timeout, PostgresTimeout: c.Postgres.Timeout,
		Names: map[budget.Key]string{budget.PatroniTTL: "patroni.ttl"},
	}
	if c.QuorumLossAfter > 0 {
		t.QuorumLossAfter, t.QuorumCheckInterval = c.QuorumLossAfter, c.QuorumCheckInterval
	}
	if c.SyncEnabled() {
		t.SyncRetryMin, t.SyncRetryMax = c.Sync.RetryMin, c.Sync.RetryMax
	}
	return t
}

// opTimeout bounds each etcd call: long enough for a loaded machine, short
// enough that two failed calls still fit before the local deadline.
func (c Config) opTimeout() time.Duration {
	return min(time.Second, (c.LeaseTTL-c.SafetyMargin)/2)
}

// member is the Patroni member name of this node.
func (c Config) member() string {
	if c.Patroni.Member != "" {
		return c.Patroni.Member
	}
	return c.Node
}

// prefix is the etcd key prefix, ending in "/".
func (c Config) prefix() string {
	if c.KeyPrefix != "" {
		return c.KeyPrefix
	}
	return Prefix(c.Cluster)
}

// Prefix is the default etcd key prefix of a cluster.
func Prefix(cluster string) string { return "/hapair/" + cluster + "/" }

// leaderKey is Patroni's leader key.
func (c Config) leaderKey() string {
	return strings.TrimSuffix(c.Patroni.Namespace, "/") + "/" + c.Patroni.Scope + "/leader"
}

// statusKey is Patroni's status key (leader optime).
func (c Config) statusKey() string {
	return strings.TrimSuffix(c.Patroni.Namespace, "/") + "/" + c.Patroni.Scope + "/status"
}

// patroniConfigKey holds Patroni's dynamic configuration (ttl).
func (c Config) patroniConfigKey() string {
	return strings.TrimSuffix(c.Patroni.Namespace, "/") + "/" + c.Patroni.Scope + "/config"
}

// ByteSize is a size in bytes; YAML and flags accept 1048576, "64MB",
// "64MiB", "512kB", "1GB" (k/M/G are 1024-based, as in Patroni and PostgreSQL).
type ByteSize int64

// UnmarshalText parses a size.
func (b *ByteSize) UnmarshalText(text []byte) error {
	s := strings.TrimSpace(string(text))
	mult := int64(1)
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"kB", 1 << 10}, {"KB", 1 << 10},
		{"MB", 1 << 20}, {"GB", 1 << 30}, {"B", 1}}
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return fmt.Errorf("size %q: want a number with an optional kB/MB/GB suffix", string(text))
	}
	*b = ByteSize(n * mult)
	return nil
}

// String formats the size in bytes.
func (b ByteSize) String() string { return strconv.FormatInt(int64(b), 10) }
