package config

import (
	"fmt"
	"net/url"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// reconnectBackoff caps gRPC's reconnection backoff at a second. etcd's
// client waits for a ready connection (WaitForReady), and gRPC's default
// backoff grows to 120 s: a client whose member was down for 20 s may stay
// disconnected for many seconds after the member is back. roled's quorum
// check keeps one client per member and needs a majority of them answering
// (quorum.go): in the lab, a witness restarted just before the standby's
// death left nodea's client to it in backoff, and nodea saw no majority.
var reconnectBackoff = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	// gRPC's floor for one connection attempt; the dial timeout bounds
	// the first connection separately.
	MinConnectTimeout: time.Second,
})

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
		DialOptions:          []grpc.DialOption{reconnectBackoff},
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
