package witness

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.etcd.io/etcd/server/v3/lease"
	"go.uber.org/zap"
)

// The lease reaper revokes a lease as soon as it has expired, on the member
// that leads raft. etcd's own lessor looks for expired leases only every
// 500 ms (lease/lessor.go runLoop, a constant), so a key bound to a lease
// outlives the lease's TTL by 0–500 ms, 250 ms on average. Patroni's leader
// key is such a key: that lateness is part of every unplanned failover
// (package budget, detection). The reaper does only what the lessor would
// do a little later: it revokes a lease past its expiry, which etcd
// already refuses to renew (lessor.Renew waits for the revocation), and it
// checks its leadership first, as etcdserver's revokeExpiredLeases does.
//
// The server exports no lease expiry with sub-second precision, only
// LeaseTimeToLive's whole seconds (the remaining time truncated). So the
// reaper watches for the moment a lease's TTL reads 0 (less than 1 s left)
// and polls it finely only in its last seconds; a second reading a second
// later that still shows 0 proves there was no renewal in between, and then
// the lease has expired. See decideLease.

// reapReason says why decideLease chose its action, for tests and logs.
type reapReason int

const (
	reapAlive      reapReason = iota // TTL ≥ 2 s left: look again when 1 s is left at the earliest
	reapLastSecond                   // 1–2 s left: poll finely for the moment under 1 s
	reapUnderOne                     // under 1 s left: look again 1 s after that was first seen
	reapExpired                      // no renewal for 1 s since under 1 s was seen: revoke
	reapRestart                      // the second look came too late to rule a renewal out: start over
	reapShortLease                   // granted TTL under 3 s: left to etcd (no second fits, see below)
)

func (r reapReason) String() string {
	switch r {
	case reapAlive:
		return "alive"
	case reapLastSecond:
		return "last_second"
	case reapUnderOne:
		return "under_one_second"
	case reapExpired:
		return "expired"
	case reapRestart:
		return "restart"
	case reapShortLease:
		return "short_lease"
	}
	return "unknown"
}

// leaseReading is one LeaseTimeToLive answer from the raft leader.
type leaseReading struct {
	At      time.Time // when it was read
	TTL     int64     // the remaining time in whole seconds, truncated toward 0
	Granted int64     // the lease's granted TTL, seconds
}

// leaseTrack is what the reaper remembers of one lease.
type leaseTrack struct {
	NextLook time.Time // when to read it again; zero: at once
	Under1At time.Time // when it first read 0 since its last reading ≥ 1; zero: not seen
	Never    bool      // never look again (a short lease)
}

// minReapTTL is the shortest granted TTL the reaper handles. After a
// reading of 0 at time u, a reading of 0 again at u+d proves no renewal in
// between only while a renewal would still show: granted − d ≥ 1 s. The
// lease has expired once d ≥ 1 s. Both hold for some d only if granted ≥ 2 s,
// and with room for a late timer only from 3 s on.
const minReapTTL = 3

// decideLease is the reaper's decision for one reading of one lease: the
// new track, whether to revoke now, and why. fine is the poll interval of
// a lease in its last seconds.
func decideLease(t leaseTrack, r leaseReading, fine time.Duration) (leaseTrack, bool, reapReason) {
	if r.Granted < minReapTTL {
		return leaseTrack{Never: true}, false, reapShortLease
	}
	switch {
	case r.TTL >= 2: // at least TTL s left: 1 s left is TTL−1 s away at the earliest
		return leaseTrack{NextLook: r.At.Add(time.Duration(r.TTL-1) * time.Second)}, false, reapAlive
	case r.TTL == 1:
		return leaseTrack{NextLook: r.At.Add(fine)}, false, reapLastSecond
	}
	// TTL ≤ 0: under 1 s left (or already past its expiry).
	if t.Under1At.IsZero() {
		return leaseTrack{Under1At: r.At, NextLook: r.At.Add(time.Second)}, false, reapUnderOne
	}
	d := r.At.Sub(t.Under1At)
	switch {
	case d < time.Second:
		return leaseTrack{Under1At: t.Under1At, NextLook: t.Under1At.Add(time.Second)}, false, reapUnderOne
	case d <= time.Duration(r.Granted-1)*time.Second:
		// Under 1 s left at Under1At, no renewal since (it would read ≥ 1),
		// and 1 s gone by: expired.
		return t, true, reapExpired
	}
	return leaseTrack{Under1At: r.At, NextLook: r.At.Add(time.Second)}, false, reapRestart
}

// reaper runs decideLease over the leader's leases.
type reaper struct {
	srv      *etcdserver.EtcdServer
	interval time.Duration // the fine poll, and the loop's tick
	lg       *zap.Logger
	m        *Metrics

	leases   map[int64]leaseTrack
	listedAt time.Time
}

// relistEvery is how often the reaper lists the leases. A new lease with a
// granted TTL of at least minReapTTL has 2 s before its last second, so
// listing every 500 ms finds it in time.
const relistEvery = 500 * time.Millisecond

// runReaper revokes expired leases while this member leads raft, until ctx
// is done or the server stops. interval ≤ 0 turns it off.
func (w *Member) runReaper(ctx context.Context, srv *etcdserver.EtcdServer) {
	if w.cfg.LeaseReapInterval <= 0 {
		return
	}
	rp := &reaper{srv: srv, interval: w.cfg.LeaseReapInterval, lg: w.lg, m: w.m, leases: map[int64]leaseTrack{}}
	t := time.NewTicker(rp.interval)
	defer t.Stop()
	for {
		changed := srv.LeaderChangedNotify()
		var tick <-chan time.Time // nil while not leader: wait for the leadership
		if srv.Leader() == srv.MemberID() {
			rp.pass(ctx)
			tick = t.C
		} else {
			// A new leader's lessor extends every lease (Promote): what was
			// learnt here is stale.
			clear(rp.leases)
			rp.listedAt = time.Time{}
		}
		select {
		case <-ctx.Done():
			return
		case <-srv.StopNotify():
			return
		case <-changed:
		case <-tick:
		}
	}
}

// pass lists the leases when due and reads every lease whose look is due.
func (rp *reaper) pass(ctx context.Context) {
	ctx = rp.srv.AuthStore().WithRoot(ctx)
	now := time.Now()
	if now.Sub(rp.listedAt) >= relistEvery {
		resp, err := rp.srv.LeaseLeases(ctx, &pb.LeaseLeasesRequest{})
		if err != nil {
			return
		}
		rp.listedAt = now
		seen := make(map[int64]bool, len(resp.Leases))
		for _, l := range resp.Leases {
			seen[l.ID] = true
			if _, ok := rp.leases[l.ID]; !ok {
				rp.leases[l.ID] = leaseTrack{}
			}
		}
		for id := range rp.leases {
			if !seen[id] {
				delete(rp.leases, id)
			}
		}
	}
	for id, tr := range rp.leases {
		if tr.Never || time.Now().Before(tr.NextLook) {
			continue
		}
		r, err := rp.read(ctx, id)
		if errors.Is(err, lease.ErrLeaseNotFound) {
			delete(rp.leases, id)
			continue
		}
		if err != nil {
			tr.NextLook = time.Now().Add(rp.interval)
			rp.leases[id] = tr
			continue
		}
		next, revoke, _ := decideLease(tr, r, rp.interval)
		rp.leases[id] = next
		if revoke {
			rp.revoke(ctx, id, tr)
		}
	}
}

func (rp *reaper) read(ctx context.Context, id int64) (leaseReading, error) {
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := rp.srv.LeaseTimeToLive(rctx, &pb.LeaseTimeToLiveRequest{ID: id})
	if err != nil {
		return leaseReading{}, err
	}
	if resp.TTL == -1 { // etcd's "not found" in the answer rather than an error
		return leaseReading{}, lease.ErrLeaseNotFound
	}
	return leaseReading{At: time.Now(), TTL: resp.TTL, Granted: resp.GrantedTTL}, nil
}

// revoke checks that this member still leads (a linearizable read, then the
// leader it knows: a leader cut off from the others must not revoke what a
// new leader has extended) and reads the lease once more before revoking.
func (rp *reaper) revoke(ctx context.Context, id int64, tr leaseTrack) {
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := rp.srv.LinearizableReadNotify(lctx); err != nil || rp.srv.Leader() != rp.srv.MemberID() {
		return
	}
	r, err := rp.read(ctx, id)
	if err != nil {
		return
	}
	if _, ok, _ := decideLease(tr, r, rp.interval); !ok {
		return
	}
	if _, err := rp.srv.LeaseRevoke(lctx, &pb.LeaseRevokeRequest{ID: id}); err != nil {
		if !errors.Is(err, lease.ErrLeaseNotFound) {
			rp.lg.Debug("lease reaper: revoke failed", zap.String("lease", leaseHex(id)), zap.Error(err))
		}
		return
	}
	rp.m.LeasesReaped.Inc()
	delete(rp.leases, id)
	rp.lg.Debug("lease reaper: revoked an expired lease", zap.String("lease", leaseHex(id)),
		zap.Duration("under_1s_for", r.At.Sub(tr.Under1At)))
}

func leaseHex(id int64) string { return fmt.Sprintf("%016x", id) }
