package roled

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The quorum check makes a node that lost the etcd majority PASSIVE within
// quorum-loss-after, long before its lease deadline (lease-ttl -
// safety-margin). The deadline stays the fence that protects the peer: the
// peer can take the active key only after the lease expired on etcd's side,
// which is later than this node's deadline, so going PASSIVE earlier only
// shortens the time an isolated primary keeps taking writes that a failover
// would rewind away (the loss window in asynchronous replication).
//
// "Lost the majority" is judged from the newest etcd call that succeeded,
// whichever it was (grant, keep-alive, linearizable read, this probe):
// etcdOK holds the monotonic time it was *sent*. A linearizable read or a
// keep-alive only succeeds through a member that is in touch with a leader,
// so a success sent at t proves the majority was reachable at t.

// noteEtcdOK records that a call sent at sent (monotonic) succeeded.
func (d *Daemon) noteEtcdOK(sent time.Duration) {
	for {
		old := d.etcdOK.Load()
		if int64(sent) <= old || d.etcdOK.CompareAndSwap(old, int64(sent)) {
			return
		}
	}
}

// quorumLoop sends a cheap linearizable read every quorum-check-interval, so
// a healthy node always has a success younger than quorum-loss-after, and a
// lost majority shows within that time. It runs on PASSIVE nodes too: a node
// about to become ACTIVE must have proof as fresh as an ACTIVE one.
func (d *Daemon) quorumLoop(ctx context.Context) error {
	if d.cfg.QuorumLossAfter <= 0 {
		return nil
	}
	t := time.NewTicker(d.cfg.QuorumCheckInterval)
	defer t.Stop()
	failing := false
	for {
		sent := d.now()
		// The probe may take up to quorum-loss-after: an answer slower
		// than that cannot keep the node ACTIVE anyway.
		tctx, cancel := context.WithTimeout(ctx, d.cfg.QuorumLossAfter)
		_, err := d.cli.Get(tctx, d.activeKey(), clientv3.WithCountOnly())
		cancel()
		switch {
		case err == nil:
			d.noteEtcdOK(sent)
			if failing {
				d.lg.Info("etcd majority reachable again")
				failing = false
				nudge(d.wake)
			}
		case ctx.Err() != nil:
			return nil
		default:
			d.m.quorumCheckFailures.Inc()
			if !failing {
				d.lg.Warn("etcd quorum check failed", zap.Error(err))
				failing = true
			}
			nudge(d.wake)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// quorumLost reports whether the newest successful etcd call is older than
// quorum-loss-after at now. Handlers check it from the atomic, as they check
// the deadline, so /ha-health answers 503 before the state loop has run.
func (d *Daemon) quorumLost(now time.Duration) bool {
	return d.cfg.QuorumLossAfter > 0 && now-time.Duration(d.etcdOK.Load()) >= d.cfg.QuorumLossAfter
}
