package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hapair/hapair/roled"
)

// Steps prints timed progress lines relative to a start time.
type Steps struct {
	W     io.Writer
	Start time.Time
}

// Printf prints one step, prefixed with the time since Start.
func (s *Steps) Printf(format string, args ...any) {
	if s.W == nil {
		return
	}
	fmt.Fprintf(s.W, "%+8.3fs  %s\n", time.Since(s.Start).Seconds(), fmt.Sprintf(format, args...))
}

// ErrNotPrimary is returned when no current Patroni leader can be found.
var ErrNotPrimary = errors.New("ctl: no Patroni leader found")

// Leader returns the name of the node whose Patroni holds the leader lock.
func (c *Client) Leader(ctx context.Context) (string, error) {
	for _, m := range c.patroniCluster(ctx) {
		if m.Role == "leader" || m.Role == "master" || m.Role == "primary" {
			for _, n := range c.Cfg.Nodes {
				if n.Member() == m.Name {
					return n.Name, nil
				}
			}
		}
	}
	return "", ErrNotPrimary
}

// leaderSource is how the follow loops learn Patroni's leader while a
// switchover or a failover runs: from Patroni's leader key in etcd, not
// from its REST API. Patroni answers /cluster on Python threads that share
// one interpreter lock with its HA loop (and read etcd for every answer),
// so polling it every 20 ms slowed the very demotion and promotion being
// followed. REST stays the fallback where etcd cannot be reached, or the
// key does not name the leader that REST names (another scope or
// namespace).
type leaderSource struct {
	c   *Client
	cli *clientv3.Client // the caller's; nil: REST only
}

// newLeaderSource checks the leader key, read with cli (may be nil),
// against current, the leader that Patroni's REST API named.
func (c *Client) newLeaderSource(ctx context.Context, cli *clientv3.Client, current string) *leaderSource {
	ls := &leaderSource{c: c}
	if cli == nil {
		return ls
	}
	if l, err := c.keyLeader(ctx, cli); err == nil && l == current {
		ls.cli = cli
	}
	return ls
}

func (ls *leaderSource) leader(ctx context.Context) (string, error) {
	if ls.cli == nil {
		return ls.c.Leader(ctx)
	}
	return ls.c.keyLeader(ctx, ls.cli)
}

// keyLeader names the node whose Patroni member holds the leader key.
func (c *Client) keyLeader(ctx context.Context, cli *clientv3.Client) (string, error) {
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), c.Cfg.Timeout)
	defer cancel()
	r, err := cli.Get(ctx, c.Cfg.LeaderKey())
	if err != nil {
		return "", err
	}
	if len(r.Kvs) == 0 {
		return "", ErrNotPrimary
	}
	member := string(r.Kvs[0].Value)
	for _, n := range c.Cfg.Nodes {
		if n.Member() == member {
			return n.Name, nil
		}
	}
	return "", fmt.Errorf("leader key names member %q, not a configured node", member)
}

// SwitchoverResult are the timings of one planned switchover, from the
// moment the request was sent.
type SwitchoverResult struct {
	From, To      string
	OldPassive    time.Duration // From's roled no longer says active
	PatroniDone   time.Duration // Patroni's REST call returned
	PatroniLeader time.Duration // Patroni's leader key names To
	RoledActive   time.Duration // To's roled says active
	LBServing     time.Duration // the balancer serves only To
	Redundant     time.Duration // From ready to take over again (streaming from To), 0 if not
}

// ErrNotReady is returned when the switchover target is not ready to take
// over and Force is not set.
var ErrNotReady = errors.New("target not ready to take over")

// ErrNotRedundant is returned when the switchover happened but the old
// primary did not become a ready standby within drill.phase-timeout.
var ErrNotRedundant = errors.New("switched over, but not redundant again")

// Switchover asks Patroni for a planned switchover to node to and follows it
// until the balancer serves from it, printing each step.
func (c *Client) Switchover(ctx context.Context, to string, w io.Writer) (SwitchoverResult, error) {
	res := SwitchoverResult{To: to}
	target, ok := c.Cfg.Node(to)
	if !ok {
		return res, fmt.Errorf("unknown node %q", to)
	}
	from, err := c.Leader(ctx)
	if err != nil {
		return res, err
	}
	if from == to {
		return res, fmt.Errorf("%s is already the Patroni leader", to)
	}
	res.From = from
	fromNode, _ := c.Cfg.Node(from)
	if reason, detail := c.StandbyReadiness(ctx, target); reason != StandbyReady {
		if !c.Force {
			return res, fmt.Errorf("%w: %s: %s %s (--force to switch over anyway)", ErrNotReady, to, reason, detail)
		}
		fmt.Fprintf(w, "WARNING: --force: %s is not ready to take over (%s %s); writes it lacks will be lost\n", to, reason, detail)
	}
	// One etcd client for the step-down and for following the leader key.
	cli, err := c.Etcd() // nil on error: followed over REST alone
	if err != nil && c.Cfg.StepDown {
		return res, fmt.Errorf("step-down request for %s: %w", from, err)
	}
	if cli != nil {
		defer cli.Close()
	}
	leaders := c.newLeaderSource(ctx, cli, from)
	st := &Steps{W: w, Start: time.Now()}
	if c.Cfg.StepDown {
		release, err := c.stepDown(ctx, cli, fromNode)
		if err != nil {
			return res, err
		}
		defer release()
		st.Printf("asked roled on %s to step down", from)
	}
	// Patroni is asked at once, not after roled has stepped down: it spends
	// 0.3 s or more (member checks, a CHECKPOINT) before it shuts the old
	// PostgreSQL down, and roled steps down in tens of ms. Every ms spent
	// here is a ms more that the balancer holds requests.
	st.Printf("switchover %s -> %s: POST %s/switchover", from, to, redacted(fromNode.PatroniURL))
	done := make(chan error, 1)
	go func() { done <- c.postSwitchover(ctx, fromNode, target) }()
	if err := c.follow(ctx, st, leaders, fromNode, target, done, &res); err != nil {
		return res, err
	}
	// Not "done" while there is no standby: follow the old primary until it
	// streams from the new one.
	ready, err := c.waitReady(ctx, st, fromNode, nil)
	if err != nil {
		st.Printf("NOT redundant: %v", err)
		return res, fmt.Errorf("%w: %v", ErrNotRedundant, err)
	}
	res.Redundant = ready.Sub(st.Start)
	st.Printf("redundant again after %.1f s", res.Redundant.Seconds())
	return res, nil
}

// WaitStandbyReady waits (bounded by drill.phase-timeout) until n is ready
// to take over, printing each change of the reason to w.
func (c *Client) WaitStandbyReady(ctx context.Context, n string, w io.Writer) error {
	node, ok := c.Cfg.Node(n)
	if !ok {
		return fmt.Errorf("unknown node %q", n)
	}
	_, err := c.waitReady(ctx, &Steps{W: w, Start: time.Now()}, node, nil)
	return err
}

// stepDownTTL bounds how long a step-down request outlives a hapairctl that
// died half-way: the key is on a lease of this TTL.
const stepDownTTL = 30 * time.Second

// stepDown asks the old primary's roled to go PASSIVE as Patroni is asked
// to switch over. Its PostgreSQL refuses writes about 1 s before its /primary
// turns 503 (LAB.md §4): without this, requests reaching its application in
// that window fail. With it, the balancer holds new requests (hold-timeout)
// from the step-down until the new node is ACTIVE. The request is a key on a
// lease; release revokes the lease, which ends the request whatever the
// outcome (a refused switchover leaves the old node free to be ACTIVE again).
func (c *Client) stepDown(ctx context.Context, cli *clientv3.Client, from Node) (release func(), err error) {
	var lease clientv3.LeaseID
	for range stepDownAttempts {
		if lease, err = c.stepDownOnce(ctx, cli, from); err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("step-down request for %s (%d tries): %w", from.Name, stepDownAttempts, err)
	}
	return func() {
		rctx, rcancel := context.WithTimeout(context.Background(), c.Cfg.Timeout)
		defer rcancel()
		_, _ = cli.Revoke(rctx, lease)
	}, nil
}

// stepDownAttempts: how many times the step-down request is tried, each
// try bounded by timeout. One request can stall on a member that accepts
// connections and does not answer (a paused one, or one busy rejoining)
// while the others would serve it; the client sends the next request to
// another member. The lab met it: a switchover asked right after a
// partition healed failed with "context deadline exceeded".
const stepDownAttempts = 3

// stepDownOnce writes the step-down key on a new lease. A lease granted by
// a try whose write then failed expires by itself (stepDownTTL) with no
// key on it.
func (c *Client) stepDownOnce(ctx context.Context, cli *clientv3.Client, from Node) (clientv3.LeaseID, error) {
	tctx, cancel := context.WithTimeout(ctx, c.Cfg.Timeout)
	defer cancel()
	lease, err := cli.Grant(tctx, int64(stepDownTTL/time.Second))
	if err != nil {
		return 0, err
	}
	_, err = cli.Put(tctx, roled.StepDownKey(c.Cfg.Prefix(), from.Name), "hapairctl switchover", clientv3.WithLease(lease.ID))
	return lease.ID, err
}

func (c *Client) postSwitchover(ctx context.Context, from, to Node) error {
	body, _ := json.Marshal(map[string]string{"leader": from.Member(), "candidate": to.Member()})
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(from.PatroniURL, "/")+"/switchover",
		strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	hc := *c.Patroni
	hc.Timeout = 30 * time.Second
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("patroni switchover: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("patroni switchover: %d %s", resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	return nil
}

// follow polls Patroni, roled and the balancer until the target serves.
func (c *Client) follow(ctx context.Context, st *Steps, leaders *leaderSource, from, to Node, done chan error, res *SwitchoverResult) error {
	deadline := time.Now().Add(c.Cfg.Drill.PhaseTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var restDone bool
	for {
		select {
		case err := <-done:
			if err != nil {
				st.Printf("Patroni refused: %v", err)
				return err
			}
			restDone = true
			res.PatroniDone = time.Since(st.Start)
			st.Printf("Patroni REST call returned 200")
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if res.PatroniLeader == 0 {
			if l, err := leaders.leader(ctx); err == nil && l == to.Name {
				res.PatroniLeader = time.Since(st.Start)
				st.Printf("Patroni leader is %s", to.Name)
			}
		}
		if res.OldPassive == 0 && from.RoledURL != "" {
			if r := c.Roled(ctx, from); r.Role == "passive" {
				res.OldPassive = time.Since(st.Start)
				st.Printf("roled on %s %s", from.Name, strings.ToUpper(r.Role))
			}
		}
		if res.RoledActive == 0 && to.RoledURL != "" {
			if r := c.Roled(ctx, to); r.Role == "active" {
				res.RoledActive = time.Since(st.Start)
				st.Printf("roled on %s ACTIVE (epoch %d)", to.Name, r.Epoch)
			}
		}
		if res.LBServing == 0 && c.lbServesOnly(ctx, to.Name) {
			res.LBServing = time.Since(st.Start)
			st.Printf("balancer serves from %s", to.Name)
		}
		if restDone && res.PatroniLeader > 0 && (res.RoledActive > 0 || to.RoledURL == "") && res.LBServing > 0 {
			st.Printf("%s serves", to.Name)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("switchover to %s not complete after %s", to.Name, c.Cfg.Drill.PhaseTimeout)
		}
	}
}

// lbServesOnly reports whether the balancer's active-passive backend has
// exactly node eligible (true when no balancer is configured).
func (c *Client) lbServesOnly(ctx context.Context, node string) bool {
	if c.Cfg.LB.AdminURL == "" {
		return true
	}
	servers, errMsg := c.lbServers(ctx)
	if errMsg != "" {
		return false
	}
	st := Status{Backends: servers}
	s := st.Serving(c.Cfg.LB.Backend)
	return len(s) == 1 && s[0] == node
}

// redacted is u without its password (ctl.yaml may carry Patroni's REST
// API credentials in the URL, which hapairctl must not print).
func redacted(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return p.Redacted()
}
