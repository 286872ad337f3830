package witness

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/config"
)

// validConfig is a bootstrap witness on loopback over plain http.
func validConfig() Config {
	c := DefaultConfig()
	c.Name = "witness"
	c.Insecure = true
	c.ListenPeerURLs = []string{"http://127.0.0.1:2380"}
	c.AdvertisePeerURLs = []string{"http://127.0.0.1:2380"}
	c.ListenClientURLs = []string{"http://127.0.0.1:2379"}
	c.AdvertiseClientURLs = []string{"http://127.0.0.1:2379"}
	c.InitialCluster = []string{"nodeA=http://127.0.0.2:2380", "nodeB=http://127.0.0.3:2380", "witness=http://127.0.0.1:2380"}
	return c
}

func TestValidate(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.pem")
	cases := []struct {
		name  string
		edit  func(c *Config)
		field string // "" means valid
	}{
		{"valid", func(c *Config) {}, ""},
		{"valid join", func(c *Config) {
			c.Mode, c.InitialCluster, c.JoinEndpoints = ModeJoin, nil, []string{"http://127.0.0.2:2379"}
		}, ""},
		{"missing name", func(c *Config) { c.Name = "" }, "name"},
		{"name with comma", func(c *Config) { c.Name = "a,b" }, "name"},
		{"bad role", func(c *Config) { c.Role = "arbiter" }, "role"},
		{"bad mode", func(c *Config) { c.Mode = "restore" }, "mode"},
		{"malformed peer URL", func(c *Config) { c.AdvertisePeerURLs = []string{"127.0.0.1:2380"} }, "advertise-peer-urls[0]"},
		{"peer URL without port", func(c *Config) { c.ListenPeerURLs = []string{"http://127.0.0.1"} }, "listen-peer-urls[0]"},
		{"peer URL with path", func(c *Config) { c.ListenPeerURLs = []string{"http://127.0.0.1:1/x"} }, "listen-peer-urls[0]"},
		{"advertise unspecified", func(c *Config) { c.AdvertiseClientURLs = []string{"http://0.0.0.0:2379"} }, "advertise-client-urls[0]"},
		{"http without insecure", func(c *Config) { c.Insecure = false }, "listen-peer-urls[0]"},
		{"https without cert", func(c *Config) { c.ListenClientURLs = []string{"https://127.0.0.1:2379"} }, "client-tls.cert-file"},
		{"unreadable certificate", func(c *Config) { c.PeerTLS = config.TLS{CertFile: missing, KeyFile: missing} }, "peer-tls.cert-file"},
		{"duplicate member name", func(c *Config) {
			c.InitialCluster = append(c.InitialCluster, "nodeA=http://127.0.0.9:2380")
		}, "initial-cluster[3]"},
		{"duplicate peer URL", func(c *Config) {
			c.InitialCluster = append(c.InitialCluster, "nodeC=http://127.0.0.2:2380")
		}, "initial-cluster[3]"},
		{"entry without =", func(c *Config) { c.InitialCluster[0] = "nodeA" }, "initial-cluster[0]"},
		{"self not listed", func(c *Config) { c.InitialCluster = c.InitialCluster[:2] }, "initial-cluster"},
		{"self with other URL", func(c *Config) { c.InitialCluster[2] = "witness=http://127.0.0.1:9999" }, "initial-cluster"},
		{"join without endpoints", func(c *Config) { c.Mode = ModeJoin }, "join-endpoints"},
		{"member named witness", func(c *Config) { c.Role, c.WitnessNames = RoleMember, []string{"witness"} }, "witness-names[0]"},
		{"election too short", func(c *Config) { c.ElectionTimeout = 400 * time.Millisecond }, "election-timeout"},
		{"heartbeat not ms", func(c *Config) { c.HeartbeatInterval = 1500 * time.Microsecond }, "heartbeat-interval"},
		{"lease reaper off", func(c *Config) { c.LeaseReapInterval = 0 }, ""},
		{"lease reaper negative", func(c *Config) { c.LeaseReapInterval = -time.Millisecond }, "lease-reap-interval"},
		{"lease reaper slower than its purpose", func(c *Config) { c.LeaseReapInterval = 2 * time.Second }, "lease-reap-interval"},
		{"negative quota", func(c *Config) { c.QuotaBackendBytes = -1 }, "quota-backend-bytes"},
		{"bad metrics listen", func(c *Config) { c.MetricsListen = "2381" }, "metrics-listen"},
		{"bad log level", func(c *Config) { c.EtcdLogLevel = "loud" }, "etcd-log-level"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.edit(&c)
			err := c.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var fe *config.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("Validate() = %v, want a *config.FieldError for %q", err, tc.field)
			}
			if fe.Field != tc.field {
				t.Fatalf("field = %q, want %q (%v)", fe.Field, tc.field, err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
		})
	}
}

func TestEffectiveTuning(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	c := validConfig()
	quota, snaps, catchUp, mem := c.effective()
	if quota != witnessQuotaBytes || snaps != witnessSnapshotCount || catchUp != witnessCatchUp || mem != witnessMemoryLimit {
		t.Fatalf("witness defaults = %d %d %d %d", quota, snaps, catchUp, mem)
	}
	c.Role = RoleMember
	if quota, snaps, catchUp, mem = c.effective(); quota != 0 || snaps != 0 || catchUp != 0 || mem != 0 {
		t.Fatalf("member defaults = %d %d %d %d, want etcd's (zeros)", quota, snaps, catchUp, mem)
	}
	c.Role, c.SnapshotCount, c.MemoryLimitBytes = RoleWitness, 500, 1<<30
	if _, snaps, catchUp, mem = c.effective(); snaps != 500 || catchUp != 500 || mem != 1<<30 {
		t.Fatalf("explicit values = %d %d %d", snaps, catchUp, mem)
	}
}

func TestIsWitness(t *testing.T) {
	c := validConfig()
	c.WitnessNames = []string{"w2"}
	for name, want := range map[string]bool{"witness": true, "w2": true, "nodeA": false} {
		if got := c.isWitness(name); got != want {
			t.Errorf("isWitness(%q) = %v, want %v", name, got, want)
		}
	}
	c.Role, c.Name = RoleMember, "nodeA"
	if c.isWitness("nodeA") {
		t.Error("a member-role self counted as witness")
	}
}
