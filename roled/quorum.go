package roled

import (
	"context"
	"errors"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The quorum check makes a node cut off from the etcd majority PASSIVE
// within quorum-loss-after, long before its lease deadline (lease-ttl -
// safety-margin). The deadline stays the fence that protects the peer: the
// peer can take the active key only after the lease expired on etcd's side,
// which is later than this node's deadline, so going PASSIVE earlier only
// shortens the time an isolated primary keeps taking writes that a failover
// would rewind away (the loss window in asynchronous replication).
//
// "Cut off" is judged from the newest proof of the contrary: etcdOK holds
// the monotonic time the newest proof was *sent*. Two kinds count:
//   - any etcd call that succeeded (grant, keep-alive, linearizable read,
//     the linearizable probe): it only succeeds through a member in touch
//     with a leader, so a success sent at t proves the majority reachable;
//   - a majority of the members answering a serializable read (each member
//     answers from its own store, with or without a leader): this node is
//     then not on the minority side of a partition, whatever raft is doing.
//
// The second kind is what keeps an ACTIVE node ACTIVE while etcd has no
// leader for a moment: the PASSIVE node's member led raft and died (the
// survivors wait an election timeout, 1 s by default, then elect), or it is
// starved of CPU (ReadIndex rounds of 300–500 ms were seen in the jitter
// soak). Linearizable reads fail or stall then, on every node alike; a
// partition is told apart by the members that stop answering. In that window
// the lease deadline still decides, as it did before the quorum check.
// With fewer than three endpoints configured there is no majority to ask, and
// only the first kind counts.

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
// lost majority shows within that time; beside it, with three or more
// endpoints, the members' answers (majorityProbe). It runs on PASSIVE nodes
// too: a node about to become ACTIVE must have proof as fresh as an ACTIVE
// one (and becoming ACTIVE is a transaction, which needs a leader anyway).
func (d *Daemon) quorumLoop(ctx context.Context) error {
	if d.cfg.QuorumLossAfter <= 0 {
		return nil
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	if eps := d.cfg.Etcd.Endpoints; len(eps) >= 3 {
		members := make([]*clientv3.Client, 0, len(eps))
		defer func() {
			for _, c := range members {
				c.Close()
			}
		}()
		for _, ep := range eps {
			one := d.cfg.Etcd
			one.Endpoints = []string{ep}
			c, err := one.NewClient(d.lg.Named("etcd-member"))
			if err != nil {
				return err
			}
			members = append(members, c)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.majorityLoop(ctx, members)
		}()
		if d.cfg.EtcdLeader == EtcdLeaderStandby {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.leadLoop(ctx, members)
			}()
		}
	}
	failing := false
	probe := func(ctx context.Context) error {
		_, err := d.cli.Get(ctx, d.activeKey(), clientv3.WithCountOnly())
		return err
	}
	runProbes(ctx, d.cfg.QuorumCheckInterval, d.cfg.QuorumLossAfter, d.now, probe, func(sent time.Duration, err error) {
		if err == nil {
			d.noteEtcdOK(sent)
			if failing {
				d.lg.Info("etcd majority reachable again")
				failing = false
				nudge(d.wake)
			}
			return
		}
		d.m.quorumCheckFailures.Inc()
		if !failing {
			d.lg.Warn("etcd quorum check failed", zap.Error(err))
			failing = true
		}
		nudge(d.wake)
	})
	return nil
}

// majorityLoop asks the members (one client each) every
// quorum-check-interval; a majority's answers are a proof.
func (d *Daemon) majorityLoop(ctx context.Context, members []*clientv3.Client) {
	failing := false
	probe := majorityProbe(members, d.activeKey())
	runProbes(ctx, d.cfg.QuorumCheckInterval, d.cfg.QuorumLossAfter, d.now, probe, func(sent time.Duration, err error) {
		if err == nil {
			d.noteEtcdOK(sent)
			if failing {
				d.lg.Info("a majority of etcd members answer again")
				failing = false
			}
			return
		}
		if !failing {
			d.lg.Warn("fewer than a majority of etcd members answer", zap.Error(err))
			failing = true
		}
		nudge(d.wake)
	})
}

// majorityProbe sends a serializable count-only read to every member at once
// and succeeds as soon as a majority has answered; it fails once a majority
// can no longer answer, with the last error. Every read has stopped when it
// returns.
func majorityProbe(members []*clientv3.Client, key string) func(context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		answers := make(chan error, len(members))
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		for _, c := range members {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := c.Get(ctx, key, clientv3.WithSerializable(), clientv3.WithCountOnly())
				answers <- err
			}()
		}
		need := len(members)/2 + 1
		ok, failed := 0, 0
		for range members {
			err := <-answers
			if err == nil {
				if ok++; ok >= need {
					return nil
				}
				continue
			}
			if failed++; failed > len(members)-need {
				return err
			}
		}
		return errNoMajority // not reached: ok + failed = len(members)
	}
}

var errNoMajority = errors.New("fewer than a majority of etcd members answered")

// runProbes starts probe every interval, each with its own timeout, without
// waiting for the one before to answer, and hands each result (with the
// monotonic time the probe was sent) to done, one at a time, from this
// goroutine. Overlap is the point: a member that answers every read in L
// (a leader busy on a loaded CPU: ReadIndex rounds of 300–500 ms were seen
// in the jitter soak) leaves the newest proof at most interval + L old. One
// probe after another left it up to 2 L + interval old, so two slow reads in
// a row turned a healthy node PASSIVE though every read succeeded. The
// timeout bounds the probes in flight to timeout / interval. It returns when
// ctx is done and every probe has stopped; results after that are dropped.
func runProbes(ctx context.Context, interval, timeout time.Duration, now func() time.Duration,
	probe func(context.Context) error, done func(sent time.Duration, err error)) {
	type result struct {
		sent time.Duration
		err  error
	}
	results := make(chan result)
	var wg sync.WaitGroup
	defer wg.Wait()
	start := func() {
		sent := now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, timeout)
			err := probe(pctx)
			cancel()
			select {
			case results <- result{sent, err}:
			case <-ctx.Done():
			}
		}()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	start()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			start()
		case r := <-results:
			if ctx.Err() != nil {
				return // a probe cut short by the cancel proves nothing
			}
			done(r.sent, r.err)
		}
	}
}

// quorumLost reports whether the newest successful etcd call is older than
// quorum-loss-after at now. Handlers check it from the atomic, as they check
// the deadline, so /ha-health answers 503 before the state loop has run.
func (d *Daemon) quorumLost(now time.Duration) bool {
	return d.cfg.QuorumLossAfter > 0 && now-time.Duration(d.etcdOK.Load()) >= d.cfg.QuorumLossAfter
}
