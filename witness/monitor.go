package witness

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.etcd.io/etcd/server/v3/etcdserver/api/membership"
	"go.uber.org/zap"
)

// monitor runs a check now, then every CheckInterval and at every leader
// change, until ctx is done (nil) or etcd stops (an error). While a witness
// holds the leadership it could not hand over, it retries every election
// timeout rather than every CheckInterval.
func (w *Member) monitor(ctx context.Context, e *embed.Etcd, errc <-chan error) error {
	p := &prober{w: w, clients: map[uint64]*probeClient{}}
	defer p.close()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		// Ask for the notification before checking, so a change during the
		// check is not missed.
		changed := e.Server.LeaderChangedNotify()
		pending := w.checkOnce(ctx, e.Server, p)
		w.lastCheck.Store(time.Now().UnixNano())
		next := w.cfg.CheckInterval
		if pending {
			next = min(next, w.cfg.ElectionTimeout)
		}
		t.Reset(next)
		select {
		case <-ctx.Done():
			return nil
		case err := <-e.Err():
			return fmt.Errorf("etcd: %w", err)
		case err := <-errc:
			return err
		case <-e.Server.StopNotify():
			return ErrStopped
		case <-t.C:
		case <-changed:
		}
	}
}

// checkOnce probes the members, updates the gauges and, as a witness that
// is leader, hands the leadership to a healthy data member. It reports
// whether a hand-off is still pending.
func (w *Member) checkOnce(ctx context.Context, srv *etcdserver.EtcdServer, p *prober) (pending bool) {
	members := voters(srv.Cluster().Members())
	healthy := p.probe(ctx, members, w.probeTimeout())
	leader := srv.Leader() == srv.MemberID()

	var nHealthy, nData int
	for _, m := range members {
		if healthy[uint64(m.ID)] {
			nHealthy++
			if !w.cfg.isWitness(m.Name) {
				nData++
			}
		}
	}
	w.m.Members.Set(float64(len(members)))
	w.m.MembersHealthy.Set(float64(nHealthy))
	w.m.DataMembersHealthy.Set(float64(nData))
	w.m.IsLeader.Set(boolGauge(leader))

	if !leader || w.cfg.Role != RoleWitness {
		w.warnedNoTransferee = false
		return false
	}
	return !w.handOff(ctx, srv, members, healthy)
}

// probeTimeout keeps one check shorter than the interval between checks.
func (w *Member) probeTimeout() time.Duration {
	return min(w.cfg.CheckInterval, w.cfg.ElectionTimeout, 2*time.Second)
}

// handOff moves the raft leadership from this witness to the first healthy
// data member, so that writes (Patroni's, roled's) are served by a data node
// and the small VM is never on the write path. It reports success.
func (w *Member) handOff(ctx context.Context, srv *etcdserver.EtcdServer, members []*membership.Member, healthy map[uint64]bool) bool {
	var to *membership.Member
	for _, m := range members {
		if m.ID != srv.MemberID() && m.Name != "" && !w.cfg.isWitness(m.Name) && healthy[uint64(m.ID)] {
			to = m
			break
		}
	}
	if to == nil {
		if !w.warnedNoTransferee {
			w.lg.Warn("witness is raft leader and no data member is healthy; keeping the leadership")
			w.warnedNoTransferee = true
		}
		return false
	}
	// Raft abandons a transfer after an election timeout; give it two.
	tctx, cancel := context.WithTimeout(ctx, 2*w.cfg.ElectionTimeout)
	defer cancel()
	start := time.Now()
	if err := srv.MoveLeader(tctx, uint64(srv.MemberID()), uint64(to.ID)); err != nil {
		w.m.LeaderTransferFailures.Inc()
		w.lg.Warn("leadership hand-off failed", zap.String("to", to.Name), zap.Error(err))
		return false
	}
	// The gauge first: a reader that sees the transfer counted must also
	// see that this member no longer leads.
	w.m.IsLeader.Set(0)
	w.m.LeaderTransfers.Inc()
	w.warnedNoTransferee = false
	w.lg.Info("handed raft leadership to a data member", zap.String("to", to.Name),
		zap.String("to_id", to.ID.String()), zap.Duration("took", time.Since(start)))
	return true
}

func voters(all []*membership.Member) []*membership.Member {
	return slices.DeleteFunc(slices.Clone(all), func(m *membership.Member) bool { return m.IsLearner })
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// prober keeps one client per member, so a probe is a request on an open
// connection rather than a new (TLS) connection every second.
type prober struct {
	w       *Member
	clients map[uint64]*probeClient
}

type probeClient struct {
	urls string
	cli  *clientv3.Client
}

// probe asks every member in parallel for a linearizable read, as etcd's
// /health does: it succeeds only when the member is up and in contact with
// a leader that has the quorum. A member not started yet is not healthy.
func (p *prober) probe(ctx context.Context, members []*membership.Member, timeout time.Duration) map[uint64]bool {
	p.prune(members)
	var mu sync.Mutex
	var wg sync.WaitGroup
	healthy := make(map[uint64]bool, len(members))
	for _, m := range members {
		cli := p.client(m)
		if cli == nil {
			continue
		}
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			_, err := cli.Get(pctx, "health")
			// With auth on, a permission error still proves the member
			// answered after reaching the leader (etcd's /health agrees).
			ok := err == nil || errors.Is(err, rpctypes.ErrPermissionDenied)
			mu.Lock()
			healthy[uint64(m.ID)] = ok
			mu.Unlock()
		})
	}
	wg.Wait()
	return healthy
}

// client returns the member's client, (re)creating it when its URLs changed.
func (p *prober) client(m *membership.Member) *clientv3.Client {
	if len(m.ClientURLs) == 0 {
		return nil
	}
	urls := strings.Join(m.ClientURLs, ",")
	id := uint64(m.ID)
	if pc, ok := p.clients[id]; ok {
		if pc.urls == urls {
			return pc.cli
		}
		_ = pc.cli.Close()
		delete(p.clients, id)
	}
	cli, err := p.w.newProbeClient(m.ClientURLs)
	if err != nil {
		p.w.lg.Warn("cannot create a probe client", zap.String("member", m.Name), zap.Error(err))
		return nil
	}
	p.clients[id] = &probeClient{urls: urls, cli: cli}
	return cli
}

// prune closes the clients of members that left the cluster.
func (p *prober) prune(members []*membership.Member) {
	for id, pc := range p.clients {
		if !slices.ContainsFunc(members, func(m *membership.Member) bool { return uint64(m.ID) == id }) {
			_ = pc.cli.Close()
			delete(p.clients, id)
		}
	}
}

func (p *prober) close() {
	for id, pc := range p.clients {
		_ = pc.cli.Close()
		delete(p.clients, id)
	}
}
