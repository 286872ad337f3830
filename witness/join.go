package witness

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// joinTimeout bounds the member list and MemberAdd calls of a join. A cluster
// that cannot answer within it is not one to join; the unit restarts us.
const joinTimeout = 30 * time.Second

// join adds this member to the running cluster (unless a previous run already
// did) and returns the initial-cluster text to start it with.
//
// Re-running after a crash half-way is safe: MemberAdd registers the member
// without a name until it first starts, so a nameless member with exactly our
// peer URLs is our own earlier attempt and we just start.
func (w *Member) join(ctx context.Context) (string, error) {
	cli, err := w.newClient(w.cfg.JoinEndpoints, 5*time.Second, zap.WarnLevel)
	if err != nil {
		return "", fmt.Errorf("join: %w", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, joinTimeout)
	defer cancel()

	list, err := cli.MemberList(ctx)
	if err != nil {
		return "", fmt.Errorf("join: member list from %v: %w", w.cfg.JoinEndpoints, err)
	}
	id, add, err := planJoin(list.Members, w.cfg.Name, w.cfg.AdvertisePeerURLs)
	if err != nil {
		return "", err
	}
	members := list.Members
	if add {
		resp, err := w.memberAdd(ctx, cli)
		if err != nil {
			return "", err
		}
		id, members = resp.Member.ID, resp.Members
		w.lg.Info("added this member to the cluster", zap.String("id", fmt.Sprintf("%x", id)),
			zap.Strings("peer_urls", w.cfg.AdvertisePeerURLs))
	} else {
		w.lg.Info("this member was already added, starting it", zap.String("id", fmt.Sprintf("%x", id)))
	}
	return initialClusterFor(members, id, w.cfg.Name), nil
}

// memberAdd adds this member, retrying while etcd refuses because the
// cluster is "unhealthy": with strict reconfiguration checks (the default)
// etcd refuses any MemberAdd until every member has been connected for 5 s,
// so a cluster that just started or just lost a member says no for a while.
func (w *Member) memberAdd(ctx context.Context, cli *clientv3.Client) (*clientv3.MemberAddResponse, error) {
	for {
		resp, err := cli.MemberAdd(ctx, w.cfg.AdvertisePeerURLs)
		if err == nil {
			return resp, nil
		}
		if !errors.Is(err, rpctypes.ErrUnhealthy) {
			return nil, fmt.Errorf("join: member add: %w", err)
		}
		w.lg.Info("cluster not ready to add a member yet, retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("join: member add: %w (last: %v)", ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// planJoin decides, from the current member list, whether to add a member
// with name and peerURLs (add), or that it was already added and not yet
// started (id of that member). It refuses what would corrupt the cluster.
func planJoin(members []*etcdserverpb.Member, name string, peerURLs []string) (id uint64, add bool, err error) {
	for _, m := range members {
		same := sameSet(m.PeerURLs, peerURLs)
		switch {
		case m.Name == name && !same:
			return 0, false, fmt.Errorf("join: a member named %q (id %x) already exists with peer URLs %v, not %v: remove it first (etcdctl member remove %x) or pick another name",
				name, m.ID, m.PeerURLs, peerURLs, m.ID)
		case m.Name == name:
			// Started before, yet our data dir is empty: its data was lost.
			// Starting afresh under the same ID would forget raft votes.
			return 0, false, fmt.Errorf("join: member %q (id %x) has already started but data-dir is empty: remove it (etcdctl member remove %x) and join again",
				name, m.ID, m.ID)
		case m.Name == "" && same:
			return m.ID, false, nil
		case overlaps(m.PeerURLs, peerURLs):
			return 0, false, fmt.Errorf("join: peer URLs %v overlap those of member %q (id %x): %v",
				peerURLs, m.Name, m.ID, m.PeerURLs)
		}
	}
	return 0, true, nil
}

// initialClusterFor writes the member list as etcd's initial-cluster text,
// with self named name. Other members not started yet have no name; etcd
// only matches them by peer URL, so a placeholder does.
func initialClusterFor(members []*etcdserverpb.Member, self uint64, name string) string {
	var parts []string
	for _, m := range members {
		n := m.Name
		switch {
		case m.ID == self:
			n = name
		case n == "":
			n = fmt.Sprintf("unstarted-%x", m.ID)
		}
		for _, u := range m.PeerURLs {
			parts = append(parts, n+"="+u)
		}
	}
	return strings.Join(parts, ",")
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func overlaps(a, b []string) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return true
		}
	}
	return false
}

// newProbeClient returns a client that connects in the background, so a
// member that is down costs a probe timeout, not a dial timeout.
func (w *Member) newProbeClient(endpoints []string) (*clientv3.Client, error) {
	return w.newClient(endpoints, 0, zap.ErrorLevel)
}

// newClient returns an etcd client for endpoints, with our client
// certificate when any endpoint is https. Its logs are kept at level or above:
// a probe client retrying a member that is down would fill the journal.
func (w *Member) newClient(endpoints []string, dialTimeout time.Duration, level zapcore.Level) (*clientv3.Client, error) {
	var tc *tls.Config
	if slices.ContainsFunc(endpoints, func(e string) bool { return strings.HasPrefix(e, "https://") }) {
		var err error
		if tc, err = w.cfg.ClientTLS.ClientConfig(); err != nil {
			return nil, err
		}
	}
	return clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: dialTimeout,
		TLS:         tc,
		Logger:      w.lg.Named("client").WithOptions(zap.IncreaseLevel(level)),
	})
}
