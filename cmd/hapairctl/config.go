package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"gopkg.in/yaml.v3"

	"github.com/hapair/hapair/internal/config"
	"github.com/hapair/hapair/roled"
)

// defaultCtlConfig is where hapairctl looks for its configuration.
const defaultCtlConfig = "/etc/hapair/ctl.yaml"

// ctlConfig is /etc/hapair/ctl.yaml. The keys here are the ones check and
// ack need; other subcommands keep their own top-level sections, which land
// in Rest and are decoded with Section (so one strict file serves all).
type ctlConfig struct {
	Cluster   string               `yaml:"cluster"`    // default hapair
	KeyPrefix string               `yaml:"key-prefix"` // default /hapair/<cluster>/
	Roled     string               `yaml:"roled"`      // local roled (default http://127.0.0.1:7400)
	Etcd      config.Etcd          `yaml:"etcd"`
	Rest      map[string]yaml.Node `yaml:",inline"`
}

func defaultCtl() ctlConfig {
	return ctlConfig{Cluster: "hapair", Roled: "http://127.0.0.1:7400", Etcd: config.DefaultEtcd()}
}

// prefix is the etcd key prefix of the cluster.
func (c ctlConfig) prefix() string {
	if c.KeyPrefix != "" {
		return c.KeyPrefix
	}
	return roled.Prefix(c.Cluster)
}

// Section strictly decodes the top-level section key into dst; a missing
// section leaves dst as it is.
func (c ctlConfig) Section(key string, dst any) error {
	n, ok := c.Rest[key]
	if !ok {
		return nil
	}
	b, err := yaml.Marshal(&n)
	if err != nil {
		return err
	}
	return config.Decode(b, dst)
}

// ctlFlags are the flags every etcd-using subcommand shares.
type ctlFlags struct {
	path      string
	endpoints string
	cluster   string
}

func (f *ctlFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&f.path, "config", defaultCtlConfig, "hapairctl configuration (YAML)")
	fs.StringVar(&f.endpoints, "endpoints", "", "etcd endpoints, comma-separated (overrides etcd.endpoints)")
	fs.StringVar(&f.cluster, "cluster", "", "cluster name (overrides cluster)")
}

// load reads the file (a missing default file is fine) and applies flags.
func (f *ctlFlags) load() (ctlConfig, error) {
	cfg := defaultCtl()
	if _, err := os.Stat(f.path); err == nil || f.path != defaultCtlConfig {
		if err := config.Load(f.path, &cfg); err != nil {
			return cfg, err
		}
	}
	if f.endpoints != "" {
		cfg.Etcd.Endpoints = strings.Split(f.endpoints, ",")
	}
	if f.cluster != "" {
		cfg.Cluster = f.cluster
	}
	if cfg.Cluster == "" {
		return cfg, config.Errorf("cluster", cfg.Cluster, "required")
	}
	return cfg, cfg.Etcd.Validate("etcd")
}

// etcdClient connects to etcd with a quiet logger.
func (c ctlConfig) etcdClient() (*clientv3.Client, error) {
	return c.Etcd.NewClient(zap.NewNop())
}

// parseFlags parses args, printing usage for -h. It returns an exit code and
// false when the caller should stop.
func parseFlags(fs *flag.FlagSet, e *env, args []string) (int, bool) {
	fs.SetOutput(e.stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "hapairctl %s: unexpected arguments %v\n", fs.Name(), fs.Args())
		return 2, false
	}
	return 0, true
}
