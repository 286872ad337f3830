package roled

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// leaseLoop keeps one lease alive for the life of the process. It does not use
// concurrency.Session or clientv3's KeepAlive stream, whose loops hide when a
// keep-alive was sent: the local deadline must be counted from the moment the
// last successful keep-alive was *sent* (before etcd could have processed it),
// so it can never be later than the lease's real expiry on the etcd side.
func (d *Daemon) leaseLoop(ctx context.Context) error {
	for ctx.Err() == nil {
		id, err := d.grant(ctx)
		if err != nil {
			d.m.keepaliveFailures.Inc()
			d.lg.Warn("lease grant failed", zap.Error(err))
			if !sleepCtx(ctx, d.cfg.KeepAliveInterval) {
				break
			}
			continue
		}
		d.keepAlive(ctx, id)
	}
	return nil
}

func (d *Daemon) grant(ctx context.Context) (int64, error) {
	tctx, cancel := context.WithTimeout(ctx, d.cfg.opTimeout())
	defer cancel()
	sent := d.now()
	resp, err := d.cli.Grant(tctx, int64(d.cfg.LeaseTTL/time.Second))
	if err != nil {
		return 0, err
	}
	d.m.leaseGrants.Inc()
	d.noteEtcdOK(sent)
	d.publishLease(int64(resp.ID), resp.TTL, sent)
	d.lg.Info("lease granted", zap.String("lease", leaseHex(int64(resp.ID))), zap.Int64("ttl", resp.TTL))
	return int64(resp.ID), nil
}

// keepAlive sends a keep-alive every keepalive-interval until the lease is
// lost (then the caller grants a new one) or ctx is done. A failed or slow
// keep-alive only leaves the deadline where it was.
func (d *Daemon) keepAlive(ctx context.Context, id int64) {
	t := time.NewTicker(d.cfg.KeepAliveInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sent := d.now()
		tctx, cancel := context.WithTimeout(ctx, d.cfg.opTimeout())
		resp, err := d.cli.KeepAliveOnce(tctx, clientv3.LeaseID(id))
		cancel()
		switch {
		case err == nil && resp.TTL > 0:
			if failing {
				d.lg.Info("lease keep-alive recovered", zap.String("lease", leaseHex(id)))
				failing = false
			}
			d.noteEtcdOK(sent)
			d.publishLease(id, resp.TTL, sent)
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && resp.TTL <= 0):
			d.lg.Warn("lease lost", zap.String("lease", leaseHex(id)))
			d.m.keepaliveFailures.Inc()
			d.lease.Store(&leaseState{})
			d.vipKick()
			nudge(d.wake)
			return
		default:
			if ctx.Err() != nil {
				return
			}
			d.m.keepaliveFailures.Inc()
			if !failing {
				d.lg.Warn("lease keep-alive failed", zap.String("lease", leaseHex(id)), zap.Error(err))
				failing = true
			}
			nudge(d.wake)
		}
	}
}

func (d *Daemon) publishLease(id, ttlSec int64, sent time.Duration) {
	ttl := time.Duration(ttlSec) * time.Second
	if ttl > d.cfg.LeaseTTL {
		ttl = d.cfg.LeaseTTL // never trust a longer TTL than asked for
	}
	d.lease.Store(&leaseState{id: id, ttl: ttl, lastSent: sent, deadline: sent + ttl - d.cfg.SafetyMargin})
	d.vipKick()
	nudge(d.wake)
}

func leaseHex(id int64) string { return fmt.Sprintf("%016x", id) }

// sleepCtx waits d or until ctx is done; false when ctx is done.
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
