package config

import (
	"fmt"
	"net/url"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Etcd is the client side of etcd, shared by roled, lb and hapairctl.
type Etcd struct {
	// Endpoints are the members' client URLs (default http://127.0.0.1:2379).
	Endpoints []string `yaml:"endpoints"`
	// DialTimeout bounds the first connection (default 2s).
	DialTimeout time.Duration `yaml:"dial-timeout"`
	// TLS for the client connection; required for https:// endpoints with a private CA.
	TLS TLS `yaml:"tls"`
}

// DefaultEtcd is a local member over plain HTTP.
func DefaultEtcd() Etcd {
	return Etcd{Endpoints: []string{"http://127.0.0.1:2379"}, DialTimeout: 2 * time.Second}
}

// Validate checks the endpoints are URLs and the TLS files load.
func (e Etcd) Validate(field string) error {
	if len(e.Endpoints) == 0 {
		return Errorf(Join(field, "endpoints"), nil, "at least one endpoint is required")
	}
	for i, ep := range e.Endpoints {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return Errorf(fmt.Sprintf("%s[%d]", Join(field, "endpoints"), i), ep, "want http://host:port or https://host:port")
		}
	}
	if e.DialTimeout <= 0 {
		return Errorf(Join(field, "dial-timeout"), e.DialTimeout, "must be positive")
	}
	return e.TLS.Validate(Join(field, "tls"))
}

// NewClient connects to etcd. The client logs through lg so that one binary
// has one log pipeline.
func (e Etcd) NewClient(lg *zap.Logger) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:            e.Endpoints,
		DialTimeout:          e.DialTimeout,
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		Logger:               lg,
	}
	if e.TLS.Enabled() {
		tc, err := e.TLS.ClientConfig()
		if err != nil {
			return nil, err
		}
		cfg.TLS = tc
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client for %v: %w", e.Endpoints, err)
	}
	return c, nil
}
