package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type sample struct {
	Name     string        `yaml:"name"`
	LeaseTTL time.Duration `yaml:"lease-ttl"`
	Verbose  bool          `yaml:"verbose"`
	Etcd     Etcd          `yaml:"etcd"`
	Hooks    []struct {
		Cmd string `yaml:"cmd"`
	} `yaml:"hooks"`
}

func (s *sample) Validate() error {
	if s.Name == "" {
		return Errorf("name", nil, "is required")
	}
	if s.LeaseTTL < time.Second {
		return Errorf("lease-ttl", s.LeaseTTL, "must be at least 1s")
	}
	return s.Etcd.Validate("etcd")
}

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func defaults() *sample { return &sample{LeaseTTL: 5 * time.Second, Etcd: DefaultEtcd()} }

func TestFlagsOverrideFile(t *testing.T) {
	p := write(t, "name: a\nlease-ttl: 3s\netcd:\n  endpoints: [http://10.0.0.1:2379]\n")
	cfg := defaults()
	cmd, err := ParseCommandLine("x", []string{"--lease-ttl", "4s", "--config", p, "--etcd.endpoints", "http://127.0.0.1:1,http://127.0.0.1:2", "--verbose"}, "", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if cmd.ConfigPath != p || cfg.Name != "a" || cfg.LeaseTTL != 4*time.Second || !cfg.Verbose {
		t.Fatalf("got %+v %+v", cmd, cfg)
	}
	if got := strings.Join(cfg.Etcd.Endpoints, ","); got != "http://127.0.0.1:1,http://127.0.0.1:2" {
		t.Fatalf("endpoints %s", got)
	}
}

func TestMissingDefaultFileIsFine(t *testing.T) {
	cfg := defaults()
	cmd, err := ParseCommandLine("x", []string{"--name", "b", "-t"}, "/nonexistent/hapair.yaml", cfg)
	if err != nil || !cmd.CheckOnly || cmd.ConfigPath != "" {
		t.Fatalf("cmd %+v err %v", cmd, err)
	}
}

func TestErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name, file string
		args       []string
		want       string
	}{
		{"unknown key", "name: a\nlease_ttl: 3s\n", nil, "lease_ttl"},
		{"validation", "name: a\nlease-ttl: 10ms\n", nil, "lease-ttl"},
		{"nested", "name: a\netcd:\n  endpoints: [\"10.0.0.1\"]\n", nil, "etcd.endpoints[0]"},
		{"bad flag value", "name: a\n", []string{"--lease-ttl", "soon"}, "lease-ttl"},
		{"missing name", "", nil, "name"},
		{"unreadable tls", "name: a\netcd:\n  tls: {cert-file: /nope.pem, key-file: /nope.key}\n", nil, "etcd.tls.cert-file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"--config", write(t, c.file)}, c.args...)
			_, err := ParseCommandLine("x", args, "", defaults())
			if err == nil || !strings.Contains(err.Error(), c.want) || !IsConfigError(err) {
				t.Fatalf("err = %v, want a config error naming %q", err, c.want)
			}
		})
	}
}

func TestMissingExplicitFile(t *testing.T) {
	_, err := ParseCommandLine("x", []string{"--config", "/nonexistent.yaml"}, "", defaults())
	var le *LoadError
	if !errors.As(err, &le) {
		t.Fatalf("err = %v, want LoadError", err)
	}
}

func TestVersionSkipsValidation(t *testing.T) {
	cmd, err := ParseCommandLine("x", []string{"--version"}, "", defaults())
	if err != nil || !cmd.Version {
		t.Fatalf("cmd %+v err %v", cmd, err)
	}
}

type size int64

func (s *size) UnmarshalText(b []byte) error {
	if string(b) == "64MB" {
		*s = 64 << 20
		return nil
	}
	return errors.New("want 64MB")
}

type withSize struct {
	Max size `yaml:"max"`
}

func (*withSize) Validate() error { return nil }

// A field type that parses its own text is parsed the same way from a flag.
func TestTextUnmarshalerFlag(t *testing.T) {
	cfg := &withSize{}
	if _, err := ParseCommandLine("x", []string{"--max", "64MB"}, "", cfg); err != nil || cfg.Max != 64<<20 {
		t.Fatalf("max=%d err=%v", cfg.Max, err)
	}
	if _, err := ParseCommandLine("x", []string{"--max", "lots"}, "", &withSize{}); err == nil {
		t.Fatal("bad size accepted")
	}
}
