package syncdir

import (
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/hapair/hapair/internal/config"
)

// Config is the `sync:` section of roled.yaml.
type Config struct {
	// Node is this node's name, sent with every request (default: hostname;
	// roled sets it to its own node name).
	Node string `yaml:"node"`
	// Listen is the receiver's TLS address.
	Listen string `yaml:"listen"`
	// Peer is the other node's receiver (host:port); roots may override it.
	Peer string `yaml:"peer"`
	// StateDir keeps the highest epoch seen and the record of synced files.
	StateDir string `yaml:"state-dir"`
	// TLS: cert-file/key-file serve the receiver and authenticate the sender;
	// ca-file makes the receiver require client certificates signed by it.
	TLS config.TLS `yaml:"tls"`
	// TokenFile holds a shared bearer token, an alternative (or addition) to
	// client certificates.
	TokenFile string `yaml:"token-file"`
	// Insecure allows a receiver without authentication (and without TLS
	// when no certificate is set). For labs only.
	Insecure bool `yaml:"insecure"`
	// Debounce is how long a path must be quiet before it is sent.
	Debounce time.Duration `yaml:"debounce"`
	// ReconcileInterval is the period of the full compare with the peer.
	ReconcileInterval time.Duration `yaml:"reconcile-interval"`
	// Concurrency is the number of requests in flight at once.
	Concurrency int `yaml:"concurrency"`
	// SyncfsMinFiles: the receiver makes a batch of at least this many small
	// files durable with one syncfs(2) of the root's filesystem (one journal
	// commit) instead of one fsync per file. syncfs also flushes whatever
	// else is dirty on that filesystem: set 0 (fsyncs only) where the root
	// shares a filesystem with a busy database.
	SyncfsMinFiles int `yaml:"syncfs-min-files"`
	// Owners makes the receiver give files the owner (uid, gid) the sender
	// sent (default false: files belong to the user roled runs as). Only
	// effective when roled runs as root.
	Owners bool `yaml:"owners"`
	// RootOwner lets Owners give a file to uid 0 or gid 0 (default false:
	// such a file keeps the receiver's user, as with Owners off).
	RootOwner bool `yaml:"root-owner"`
	// ModeMask is the set of permission bits kept from the mode the sender
	// sent, as an octal number of at most 0777 (default 0777: rwx for
	// user, group and others as sent). Setuid, setgid and sticky bits are
	// never applied, whatever the mask.
	ModeMask uint32 `yaml:"mode-mask"`
	// ManifestMaxEntries is the most entries the receiver takes in one
	// manifest (a full compare lists every path of the root; default
	// 8,000,000). A bigger one is refused with 413 once the limit is read.
	ManifestMaxEntries int `yaml:"manifest-max-entries"`
	// ManifestMaxBytes is the largest manifest body the receiver reads, in
	// bytes (default 268435456, 256 MiB). Manifests are decoded one entry
	// at a time, so the receiver holds the paths it needs, not the body.
	ManifestMaxBytes int64 `yaml:"manifest-max-bytes"`
	// RetryMin and RetryMax bound the backoff after a failed request.
	RetryMin time.Duration `yaml:"retry-min"`
	RetryMax time.Duration `yaml:"retry-max"`
	// Roots are the synced directory trees.
	Roots []Root `yaml:"roots"`
}

// Root is one synced tree. Both nodes must configure the same name.
type Root struct {
	// Name identifies the root on the wire (default: base name of Path).
	Name string `yaml:"name"`
	// Path is the absolute local directory.
	Path string `yaml:"path"`
	// Exclude lists globs: "*.tmp" matches a base name at any depth, "cache/"
	// a directory name at any depth, "a/b/*.log" a path from the root.
	Exclude []string `yaml:"exclude"`
	// Peer overrides the top-level peer for this root.
	Peer string `yaml:"peer"`
}

// DefaultExcludes are applied to a root that lists no excludes.
var DefaultExcludes = []string{"*.tmp", "*.swp", "cache/", "tmp/", "logs/"}

// DefaultConfig returns the defaults; roots and peer must be filled in.
func DefaultConfig() Config {
	return Config{
		Listen:             ":7402",
		StateDir:           "/var/lib/hapair/sync",
		Debounce:           2 * time.Millisecond,
		ReconcileInterval:  10 * time.Minute,
		Concurrency:        32,
		SyncfsMinFiles:     16,
		ModeMask:           0o777,
		ManifestMaxEntries: 8_000_000,
		ManifestMaxBytes:   256 << 20,
		RetryMin:           200 * time.Millisecond,
		RetryMax:           10 * time.Second,
	}
}

// prefix is where roled embeds this section.
const prefix = "sync"

func field(f string) string { return config.Join(prefix, f) }

// Enabled reports whether any root is configured; without roots the sync
// is off and Run only waits for its context.
func (c *Config) Enabled() bool { return len(c.Roots) > 0 }

// Validate checks the section; errors name the field as "sync.<key>".
// Authentication and the peer are only required once a root is configured.
func (c *Config) Validate() error {
	if c.Node != "" && !validNode(c.Node) {
		return config.Errorf(field("node"), c.Node, "must be 1-253 printable characters without spaces")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return config.Errorf(field("listen"), c.Listen, "must be host:port: %v", err)
	}
	if c.Peer != "" {
		if _, _, err := net.SplitHostPort(c.Peer); err != nil {
			return config.Errorf(field("peer"), c.Peer, "must be host:port: %v", err)
		}
	}
	if !filepath.IsAbs(c.StateDir) {
		return config.Errorf(field("state-dir"), c.StateDir, "must be an absolute path")
	}
	if err := c.validateTimings(); err != nil {
		return err
	}
	if !c.Enabled() {
		return c.TLS.Validate(field("tls"))
	}
	if err := c.validateAuth(); err != nil {
		return err
	}
	return c.validateRoots()
}

func (c *Config) validateAuth() error {
	if err := c.TLS.Validate(field("tls")); err != nil {
		return err
	}
	if c.TokenFile != "" {
		if _, err := readToken(c.TokenFile); err != nil {
			return config.Errorf(field("token-file"), c.TokenFile, "%v", err)
		}
	}
	if c.Insecure {
		return nil
	}
	if c.TLS.CertFile == "" {
		return config.Errorf(field("tls.cert-file"), "", "the receiver needs TLS: set tls.cert-file and tls.key-file (or insecure: true for a lab)")
	}
	if c.TLS.CAFile == "" && c.TokenFile == "" {
		return config.Errorf(field("tls.ca-file"), "", "no authentication: set tls.ca-file (client certificates) or token-file (or insecure: true for a lab)")
	}
	return nil
}

func (c *Config) validateTimings() error {
	if c.Debounce < 0 || c.Debounce > 10*time.Second {
		return config.Errorf(field("debounce"), c.Debounce, "must be between 0 and 10s")
	}
	if c.ReconcileInterval < time.Second {
		return config.Errorf(field("reconcile-interval"), c.ReconcileInterval, "must be at least 1s")
	}
	if c.Concurrency < 1 || c.Concurrency > 200 {
		return config.Errorf(field("concurrency"), c.Concurrency, "must be between 1 and 200")
	}
	if c.SyncfsMinFiles < 0 {
		return config.Errorf(field("syncfs-min-files"), c.SyncfsMinFiles, "must be 0 (never) or more")
	}
	if c.ModeMask > 0o777 {
		return config.Errorf(field("mode-mask"), fmt.Sprintf("%#o", c.ModeMask), "must be permission bits only (at most 0777)")
	}
	if c.ManifestMaxEntries < 1 {
		return config.Errorf(field("manifest-max-entries"), c.ManifestMaxEntries, "must be at least 1")
	}
	if c.ManifestMaxBytes < 1<<10 {
		return config.Errorf(field("manifest-max-bytes"), c.ManifestMaxBytes, "must be at least 1024 (bytes)")
	}
	if c.RetryMin <= 0 {
		return config.Errorf(field("retry-min"), c.RetryMin, "must be positive")
	}
	if c.RetryMax < c.RetryMin {
		return config.Errorf(field("retry-max"), c.RetryMax, "must not be below retry-min (%s)", c.RetryMin)
	}
	return nil
}

func (c *Config) validateRoots() error {
	names := map[string]int{}
	for i := range c.Roots {
		r := &c.Roots[i]
		f := fmt.Sprintf("%s[%d]", field("roots"), i)
		if !filepath.IsAbs(r.Path) || filepath.Clean(r.Path) != r.Path || r.Path == "/" {
			return config.Errorf(f+".path", r.Path, "must be a clean absolute directory path other than /")
		}
		name := r.name()
		if !validRootName(name) {
			return config.Errorf(f+".name", name, "must be letters, digits, '-', '_' or '.'")
		}
		if j, dup := names[name]; dup {
			return config.Errorf(f+".name", name, "same name as %s[%d]", field("roots"), j)
		}
		names[name] = i
		for k, g := range r.Exclude {
			if _, err := path.Match(strings.TrimSuffix(g, "/"), "x"); err != nil || g == "" {
				return config.Errorf(fmt.Sprintf("%s.exclude[%d]", f, k), g, "bad glob")
			}
		}
		peer := r.Peer
		if peer == "" {
			peer = c.Peer
		}
		if peer == "" {
			return config.Errorf(field("peer"), "", "required: the other node's receiver (host:port)")
		}
		if _, _, err := net.SplitHostPort(peer); err != nil {
			return config.Errorf(f+".peer", r.Peer, "must be host:port: %v", err)
		}
	}
	return nil
}

func (r Root) name() string {
	if r.Name != "" {
		return r.Name
	}
	return filepath.Base(r.Path)
}

func (r Root) excludes() []string {
	if r.Exclude == nil {
		return DefaultExcludes
	}
	return r.Exclude
}

func validRootName(s string) bool {
	if s == "" || s == "." || s == ".." || len(s) > 64 {
		return false
	}
	for _, c := range s {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
		if !ok {
			return false
		}
	}
	return true
}

func validNode(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, c := range s {
		if c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

func readToken(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("cannot read token: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if len(t) < 16 {
		return "", fmt.Errorf("token must be at least 16 characters")
	}
	return t, nil
}
