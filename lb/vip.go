package lb

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hapair/hapair/internal/config"
	"github.com/hapair/hapair/vip"
)

// VIPConfig is the `vip` section of hapair-lb: the address part (package
// vip) and the election that decides which balancer of a pair holds it.
type VIPConfig struct {
	vip.Config `yaml:",inline"`
	// Name of the election: the key is /hapair/<cluster>/vip/<name>
	// (default lb). Both balancers of a pair use the same name.
	Name string `yaml:"name"`
	// LeaseTTL is the election lease, whole seconds (default 2s; 1s
	// allowed with fence: nftables). The standby takes over within about
	// this long after the holder dies (+ up to 0.5 s: etcd's lease check).
	// etcd grants no lease below ceil(1.5 × its election-timeout): a 1 s
	// lease needs election-timeout ≤ 666ms, else etcd grants 2 s, the
	// holder still gives up on the 1 s deadline and the takeover takes 2 s
	// (logged at the grant).
	LeaseTTL time.Duration `yaml:"lease-ttl"`
	// SafetyMargin: the holder gives up at last keep-alive sent + lease-ttl
	// - safety-margin (default 250ms; the kernel lifetime of the address
	// ends at least 500ms before that deadline anyway).
	SafetyMargin time.Duration `yaml:"safety-margin"`
	// KeepAliveInterval is the keep-alive period (default 250ms).
	KeepAliveInterval time.Duration `yaml:"keepalive-interval"`
}

// DefaultVIP is the vip section's defaults (disabled).
func DefaultVIP() VIPConfig {
	return VIPConfig{Config: vip.Default(), Name: "lb", LeaseTTL: 2 * time.Second,
		SafetyMargin: 250 * time.Millisecond, KeepAliveInterval: 250 * time.Millisecond}
}

// VIPKey is the election key of a balancer pair.
func VIPKey(cluster, name string) string { return "/hapair/" + cluster + "/vip/" + name }

func (c *Config) validateVIP() error {
	v := c.VIP
	if err := v.Config.Validate("vip"); err != nil || !v.Enabled() {
		return err
	}
	if len(c.Etcd.Endpoints) == 0 {
		return config.Errorf("vip.address", v.Address,
			"needs etcd.endpoints: without etcd no balancer may hold the VIP (two could)")
	}
	if v.Name == "" || strings.ContainsAny(v.Name, "/ \t\n") {
		return config.Errorf("vip.name", v.Name, "required, without '/' or spaces")
	}
	if v.LeaseTTL%time.Second != 0 || v.LeaseTTL < time.Second {
		return config.Errorf("vip.lease-ttl", v.LeaseTTL, "must be whole seconds, at least 1s (etcd leases have 1 s resolution)")
	}
	if v.LeaseTTL < 2*time.Second && v.Fence != vip.FenceNftables {
		return config.Errorf("vip.lease-ttl", v.LeaseTTL, "below 2s needs vip.fence: nftables (the address lifetime fence is whole seconds)")
	}
	if v.SafetyMargin <= 0 || v.SafetyMargin > v.LeaseTTL/2 {
		return config.Errorf("vip.safety-margin", v.SafetyMargin, "must be positive and at most half of vip.lease-ttl (%s)", v.LeaseTTL)
	}
	if v.KeepAliveInterval <= 0 {
		return config.Errorf("vip.keepalive-interval", v.KeepAliveInterval, "must be positive")
	}
	return vip.CheckTiming("vip.lease-ttl", v.Fence, v.LeaseTTL, v.SafetyMargin, v.KeepAliveInterval)
}

// vipHolder runs the election of a balancer pair and holds the VIP while
// it holds the key, with roled's fence: the key is created only if absent,
// on our own lease; our local deadline is counted on the monotonic clock
// from the moment the last successful keep-alive was sent, minus the
// safety margin, so we give up before etcd can expire the lease and hand
// the key to the other balancer. Without etcd nobody holds the VIP.
type vipHolder struct {
	cfg   VIPConfig
	key   string
	etcd  config.Etcd
	lg    *zap.Logger
	start time.Time
	node  string
	guard *vip.Guard

	warnedTTL bool // grant only: etcd's minimum TTL logged once

	lease   atomic.Pointer[vipLease]
	holding atomic.Int64 // the lease on which we hold the key; 0: not held
}

type vipLease struct {
	id       int64
	deadline time.Duration // on now()
}

func newVIPHolder(cfg Config, lg *zap.Logger) (*vipHolder, error) {
	host, _ := os.Hostname()
	h := &vipHolder{cfg: cfg.VIP, key: VIPKey(cfg.Cluster, cfg.VIP.Name), etcd: cfg.Etcd, lg: lg,
		start: time.Now(), node: host}
	h.lease.Store(&vipLease{})
	g, err := vip.New(cfg.VIP.Config, "lb", lg, h.now, h.allow)
	if err != nil {
		return nil, err
	}
	h.guard = g
	return h, nil
}

func (h *vipHolder) now() time.Duration { return time.Since(h.start) }

// allow is the fence: the deadline of the lease that holds the key.
func (h *vipHolder) allow() (time.Duration, bool) {
	l := h.lease.Load()
	if l.id == 0 || h.holding.Load() != l.id {
		return 0, false
	}
	return l.deadline, true
}

// run holds the VIP while elected until ctx is done; then it removes the
// VIP first and revokes the lease (releasing the key) after.
func (h *vipHolder) run(ctx context.Context) error {
	gctx, stopGuard := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = h.guard.Run(gctx) }()
	cli, err := h.etcd.NewClient(h.lg.Named("etcd-client").WithOptions(zap.IncreaseLevel(zap.WarnLevel)))
	if err != nil {
		stopGuard()
		wg.Wait()
		_ = h.guard.Close()
		return err
	}
	defer func() {
		h.holding.Store(0)
		h.guard.Sync() // the VIP goes before the key
		stopGuard()
		wg.Wait()
		_ = h.guard.Close()
		if l := h.lease.Load(); l.id != 0 {
			rctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = cli.Revoke(rctx, clientv3.LeaseID(l.id))
			cancel()
		}
		cli.Close()
	}()
	h.lg.Info("VIP election", zap.String("key", h.key), zap.Strings("addresses", h.guard.Status().Addresses))
	loud := true
	for ctx.Err() == nil {
		id, err := h.grant(ctx, cli)
		if err != nil {
			if loud && ctx.Err() == nil {
				h.lg.Error("etcd unreachable: this balancer does not hold the VIP (no etcd, no VIP anywhere)", zap.Error(err))
				loud = false
			}
			if !sleepCtx(ctx, h.cfg.KeepAliveInterval) {
				break
			}
			continue
		}
		loud = true
		lctx, lcancel := context.WithCancel(ctx)
		lost := make(chan struct{})
		go func() { defer close(lost); h.keepAlive(lctx, cli, id) }()
		h.elect(lctx, cli, id, lost)
		lcancel()
		<-lost
		h.holding.Store(0)
		h.guard.Sync()
	}
	return nil
}

func (h *vipHolder) grant(ctx context.Context, cli *clientv3.Client) (int64, error) {
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	sent := h.now()
	resp, err := cli.Grant(tctx, int64(h.cfg.LeaseTTL/time.Second))
	if err != nil {
		return 0, err
	}
	if got := time.Duration(resp.TTL) * time.Second; got > h.cfg.LeaseTTL && !h.warnedTTL {
		h.warnedTTL = true
		h.lg.Warn("etcd granted a longer lease than vip.lease-ttl (its minimum is ceil(1.5 × election-timeout)): the holder keeps to lease-ttl, a takeover waits for etcd's",
			zap.Duration("lease_ttl", h.cfg.LeaseTTL), zap.Duration("granted", got))
	}
	h.publish(int64(resp.ID), resp.TTL, sent)
	return int64(resp.ID), nil
}

func (h *vipHolder) publish(id, ttlSec int64, sent time.Duration) {
	ttl := min(time.Duration(ttlSec)*time.Second, h.cfg.LeaseTTL) // never trust a longer TTL than asked for
	h.lease.Store(&vipLease{id: id, deadline: sent + ttl - h.cfg.SafetyMargin})
	h.guard.Kick()
}

// keepAlive sends KeepAliveOnce every interval (not clientv3's stream,
// which hides when a keep-alive was sent) until the lease is lost or ctx is
// done. A failed keep-alive leaves the deadline where it was: the guard
// removes the VIP when it passes.
func (h *vipHolder) keepAlive(ctx context.Context, cli *clientv3.Client, id int64) {
	t := time.NewTicker(h.cfg.KeepAliveInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sent := h.now()
		tctx, cancel := context.WithTimeout(ctx, h.cfg.KeepAliveInterval*2)
		resp, err := cli.KeepAliveOnce(tctx, clientv3.LeaseID(id))
		cancel()
		switch {
		case err == nil && resp.TTL > 0:
			if failing {
				h.lg.Info("VIP lease keep-alive recovered")
				failing = false
			}
			h.publish(id, resp.TTL, sent)
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && resp.TTL <= 0):
			h.lg.Warn("VIP lease lost")
			h.lease.Store(&vipLease{})
			h.guard.Kick()
			return
		default:
			if ctx.Err() != nil {
				return
			}
			if !failing {
				h.lg.Error("VIP lease keep-alive failing: the VIP goes at the deadline", zap.Error(err))
				failing = true
			}
		}
	}
}

// elect campaigns (create the key if absent, on our lease), holds or
// stands by, and campaigns again whenever the key changes, until the lease
// is lost or ctx is done.
func (h *vipHolder) elect(ctx context.Context, cli *clientv3.Client, id int64, lost <-chan struct{}) {
	val, _ := json.Marshal(map[string]string{"holder": h.node, "since": time.Now().UTC().Format(time.RFC3339Nano)})
	for ctx.Err() == nil {
		select {
		case <-lost:
			return
		default:
		}
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := cli.Txn(tctx).If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", 0)).
			Then(clientv3.OpPut(h.key, string(val), clientv3.WithLease(clientv3.LeaseID(id)))).
			Else(clientv3.OpGet(h.key)).Commit()
		cancel()
		if err != nil {
			h.lg.Warn("VIP campaign failed", zap.Error(err))
			if !sleepCtx(ctx, h.cfg.KeepAliveInterval) {
				return
			}
			continue
		}
		held := resp.Succeeded
		if !held {
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 && kvs[0].Lease == id {
				held = true // ours from before
			}
		}
		was := h.holding.Load() == id
		if held {
			h.holding.Store(id)
		} else {
			h.holding.Store(0)
		}
		if held != was {
			h.lg.Info("VIP election", zap.Bool("holder", held), zap.String("key", h.key))
		}
		h.guard.Sync()
		if !h.waitChange(ctx, cli, id, resp.Header.Revision, lost) {
			return
		}
	}
}

// waitChange watches the key from rev+1 and returns true when it changed
// (or the watch broke: campaign again), false when the lease was lost or
// ctx is done. A delete or another lease's key ends our hold at once.
func (h *vipHolder) waitChange(ctx context.Context, cli *clientv3.Client, id, rev int64, lost <-chan struct{}) bool {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := cli.Watch(wctx, h.key, clientv3.WithRev(rev+1))
	// A periodic re-read covers a watch that stays silent.
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-lost:
			return false
		case <-t.C:
			return true
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				sleepCtx(ctx, h.cfg.KeepAliveInterval)
				return true
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE || ev.Kv.Lease != id {
					if h.holding.Load() == id {
						h.holding.Store(0)
						h.guard.Sync()
					}
					return true
				}
			}
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// VIPStatus is the VIP as shown in the admin JSON; nil without a vip section.
func (l *LB) VIPStatus() *vip.Status {
	if l.vip == nil {
		return nil
	}
	st := l.vip.guard.Status()
	return &st
}

// VIPCollector exports the VIP metrics (hapair_lb_vip_*); nil without a vip
// section.
func (l *LB) VIPCollector() prometheus.Collector {
	if l.vip == nil {
		return nil
	}
	return l.vip.guard
}
