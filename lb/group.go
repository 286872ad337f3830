package lb

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Errors returned when no server can take a request.
var (
	ErrNoServer  = errors.New("lb: no eligible server")
	ErrHoldFull  = errors.New("lb: hold queue full")
	ErrHoldTimed = errors.New("lb: hold timeout")
)

// activeKey is what the etcd fast path last read from the active key.
type activeKey struct {
	known bool   // false: etcd not followed or unreachable; checks alone decide
	node  string // "" when the key is absent (no ACTIVE)
	epoch int64  // CreateRevision of the key (0 when absent)
	rev   int64  // etcd revision of this observation
}

// Group is a backend: servers of one kind, their eligibility and selection.
type Group struct {
	cfg BackendConfig
	lg  *zap.Logger
	m   *Metrics

	servers []*Server
	byNode  map[string]*Server

	// eligible is the current routing set; the data path reads it lock-free.
	eligible atomic.Pointer[[]*Server]
	poll     *pollSet // for backend connections' reads (nil: Go's poller)
	waiting  atomic.Int64
	rr       atomic.Uint64

	mu      sync.Mutex // serialises recompute and guards the fields below
	changed chan struct{}
	queue   []*holder // held new requests, oldest first (see hold)
	key     activeKey
	dual    bool

	// onChange, when set (tests), is called under mu for every server whose
	// eligibility changed, right after the new set is published.
	onChange func(server string, eligible bool)
	// onDequeue, when set (tests), is called under mu as a held request
	// leaves the queue.
	onDequeue func(h *holder)
}

func newGroup(cfg BackendConfig, lg *zap.Logger, m *Metrics) *Group {
	g := &Group{cfg: cfg, lg: lg.With(zap.String("backend", cfg.Name)), m: m,
		byNode: map[string]*Server{}, changed: make(chan struct{})}
	for _, sc := range cfg.Servers {
		s := newServer(sc, g)
		g.servers = append(g.servers, s)
		g.byNode[sc.Node] = s
	}
	empty := []*Server{}
	g.eligible.Store(&empty)
	// Create the per-backend series at zero so alerts see them from the start.
	for _, v := range []interface {
		WithLabelValues(...string) prometheus.Counter
	}{m.retries, m.noServer, m.holdTimeouts, m.holdCancelled} {
		v.WithLabelValues(cfg.Name)
	}
	if cfg.Kind == KindActivePassive || cfg.Kind == KindPGPrimary {
		m.dualActive.WithLabelValues(cfg.Name)
	}
	return g
}

// Name is the backend name.
func (g *Group) Name() string { return g.cfg.Name }

// Servers lists the group's servers in configuration order.
func (g *Group) Servers() []*Server { return g.servers }

// server returns the server with the given name, or nil.
func (g *Group) server(name string) *Server {
	for _, s := range g.servers {
		if s.name == name {
			return s
		}
	}
	return nil
}

// recompute publishes the set of servers that may take new traffic. It is
// the single place where the routing rules live.
func (g *Group) recompute(reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	next := g.candidates()
	prev := *g.eligible.Load()
	if sameSet(prev, next) {
		return
	}
	g.eligible.Store(&next)
	close(g.changed)
	g.changed = make(chan struct{})
	for _, s := range g.servers {
		was, is := contains(prev, s), contains(next, s)
		if was == is {
			continue
		}
		g.lg.Info("server eligibility changed", zap.String("server", s.name),
			zap.Bool("eligible", is), zap.String("reason", reason), zap.Int64("epoch", s.epoch.Load()))
		if g.onChange != nil {
			g.onChange(s.name, is)
		}
		if !is && s.Admin() != AdminDrain && (g.cfg.Kind == KindPGPrimary || g.cfg.Kind == KindPGReplicas) {
			// A TCP session to a server that is no longer primary (or in
			// lag bounds) must not keep writing: close it at once.
			if n := s.killSessions(); n > 0 {
				g.m.tcpKilled.WithLabelValues(g.cfg.Name).Add(float64(n))
				g.lg.Info("sessions shut down", zap.String("server", s.name), zap.Int("sessions", n))
			}
		}
		if !is && s.pool != nil {
			s.pool.closeAll(false)
		}
	}
}

// candidates applies the routing rules; called with mu held.
func (g *Group) candidates() []*Server {
	var c []*Server
	for _, s := range g.servers {
		if !s.up.Load() || s.Admin() != AdminReady {
			continue
		}
		if g.key.known && !g.keyAllows(s) {
			continue
		}
		c = append(c, s)
	}
	exclusive := g.cfg.Kind == KindActivePassive || g.cfg.Kind == KindPGPrimary
	if !exclusive || len(c) <= 1 {
		g.dual = false
		return c
	}
	// Two servers claim the exclusive role. It must never happen; when it
	// does, only the higher epoch gets traffic (none if they are equal).
	if !g.dual {
		g.dual = true
		g.m.dualActive.WithLabelValues(g.cfg.Name).Inc()
		g.lg.Error("several servers claim the active role", zap.Int("servers", len(c)),
			zap.String("first", c[0].name), zap.Int64("first_epoch", c[0].epoch.Load()),
			zap.String("second", c[1].name), zap.Int64("second_epoch", c[1].epoch.Load()))
	}
	best, tie := c[0], false
	for _, s := range c[1:] {
		switch e := s.epoch.Load(); {
		case e > best.epoch.Load():
			best, tie = s, false
		case e == best.epoch.Load():
			tie = true
		}
	}
	if tie || best.epoch.Load() == 0 {
		return nil
	}
	return []*Server{best}
}

// keyAllows: with the etcd key known, only its node may take traffic, and
// only once a check has shown the key's epoch (a node named again by a new
// key is not admitted on its old check state). A server whose epoch is
// newer than our observation proves the key we hold is stale.
func (g *Group) keyAllows(s *Server) bool {
	if g.cfg.Kind == KindPGPrimary {
		// Patroni's leader key carries no epoch: its member is the primary
		// once a /primary check after the key change agrees.
		return g.key.node != "" && s.cfg.Node == g.key.node && !s.confirm.Load()
	}
	e := s.epoch.Load()
	if g.key.node != "" && s.cfg.Node == g.key.node && e >= g.key.epoch {
		return true
	}
	return g.key.rev > 0 && e > g.key.rev
}

// setKey applies an etcd observation and starts the fast confirmation of
// the node it names.
func (g *Group) setKey(k activeKey) {
	g.mu.Lock()
	old := g.key
	g.key = k
	g.mu.Unlock()
	if old == k {
		return
	}
	if s := g.byNode[k.node]; s != nil && k.node != old.node {
		s.confirm.Store(true)
	}
	g.lg.Info("active key changed", zap.Bool("known", k.known), zap.String("node", k.node), zap.Int64("epoch", k.epoch))
	if k.node != "" && g.byNode[k.node] == nil {
		g.lg.Warn("active key names a node that is no server of this backend (set servers[].node)", zap.String("node", k.node))
	}
	g.recompute("etcd active key")
	// Check every server at once: the named one to confirm it (fast
	// interval until it does), the others so no stale "up" outlives the key.
	for _, s := range g.servers {
		want := int64(0)
		if k.known && s.cfg.Node == k.node && k.node != "" {
			want = max(k.epoch, 1)
		}
		select { // replace any pending nudge with the newest one
		case <-s.nudge:
		default:
		}
		s.nudge <- want
	}
}

// acquire picks a server for a new request, waiting up to hold-timeout
// when none is eligible. The caller must call release on the result.
func (g *Group) acquire(ctx context.Context, exclude []*Server) (*Server, error) {
	if s := g.tryPick(exclude); s != nil {
		return s, nil
	}
	if g.saturated(exclude) || g.cfg.MaxConns > 0 && g.waiting.Load() > 0 && len(*g.eligible.Load()) > 0 {
		// Waiting for a slot. Should every server go away meanwhile (a
		// host's death: its slots stay taken by requests that never end,
		// until the checks mark it down), the request is held as one that
		// found no server: the hold, not the queue, is the failover's
		// wait. Without this it was refused at queue-timeout (5 s) in the
		// middle of a failover that the hold (11 s at rto 6.5s) covers.
		return g.wait(ctx, exclude, g.cfg.QueueTimeout, max(g.cfg.QueueTimeout, *g.cfg.HoldTimeout))
	}
	hold := *g.cfg.HoldTimeout
	if len(*g.eligible.Load()) > 0 && g.cfg.Check.ChecksEnabled() {
		// Servers are eligible but this request already failed on them:
		// wait at most one check interval for the checks to decide, not the
		// whole hold (which is for "no ACTIVE node at all").
		hold = min(hold, g.cfg.Check.Interval)
	}
	if hold <= 0 || len(*g.eligible.Load()) > 0 && !g.cfg.Check.ChecksEnabled() {
		return nil, ErrNoServer
	}
	return g.wait(ctx, exclude, hold, hold)
}

// wait queues a request: while no server may take traffic (the
// switchover hold) or while every eligible one is at max-conns. It gives
// up timeout after it came, or orphaned after it came when at that time
// no server is eligible at all (orphaned ≥ timeout).
func (g *Group) wait(ctx context.Context, exclude []*Server, timeout, orphaned time.Duration) (*Server, error) {
	if g.waiting.Add(1) > int64(g.cfg.HoldQueue) {
		g.waiting.Add(-1)
		return nil, ErrHoldFull
	}
	defer g.waiting.Add(-1)
	dl := &waitDeadline{g: g, t: time.NewTimer(timeout), start: time.Now(), orphaned: orphaned}
	defer dl.t.Stop()
	s, err := g.hold(ctx, exclude, dl)
	g.m.holdWait.WithLabelValues(g.cfg.Name).Observe(time.Since(dl.start).Seconds())
	switch {
	case errors.Is(err, ErrHoldTimed):
		g.m.holdTimeouts.WithLabelValues(g.cfg.Name).Inc()
	case err != nil && ctx.Err() != nil:
		g.m.holdCancelled.WithLabelValues(g.cfg.Name).Inc() // the client went away
	}
	return s, err
}

// waitDeadline is a waiting request's limit (see wait).
type waitDeadline struct {
	g        *Group
	t        *time.Timer
	start    time.Time
	orphaned time.Duration
	extended bool
}

// expired is called when t fires: true when the request gives up; false
// when it was extended to orphaned (t is re-armed) because no server is
// eligible now.
func (d *waitDeadline) expired(now time.Time) bool {
	end := d.start.Add(d.orphaned)
	if d.extended || !now.Before(end) || len(*d.g.eligible.Load()) > 0 {
		return true
	}
	d.extended = true
	d.t.Reset(end.Sub(now))
	return false
}

// holder is one held request's place in the queue; turn is closed when it
// reaches the front.
type holder struct{ turn chan struct{} }

// hold waits for a server. New requests (nothing to exclude) queue: only
// the oldest waits for a server and the next is let go when it has one, so
// when a node becomes ACTIVE the requests reach it in the order they came
// and the one that waited longest is not served last behind a burst. A
// retry (exclude set) waits outside the queue: it must not block the queue
// on a server only it refuses.
func (g *Group) hold(ctx context.Context, exclude []*Server, dl *waitDeadline) (*Server, error) {
	if len(exclude) == 0 {
		h := g.enqueue()
		defer g.dequeue(h)
	queued:
		for {
			select {
			case <-h.turn:
				break queued
			case now := <-dl.t.C:
				if dl.expired(now) {
					return nil, ErrHoldTimed
				}
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	for {
		g.mu.Lock()
		ch := g.changed
		g.mu.Unlock()
		if s := g.pick(exclude); s != nil {
			return s, nil
		}
		select {
		case <-ch:
		case now := <-dl.t.C:
			if dl.expired(now) {
				return nil, ErrHoldTimed
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (g *Group) enqueue() *holder {
	h := &holder{turn: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, h)
	if len(g.queue) == 1 {
		close(h.turn)
	}
	g.mu.Unlock()
	return h
}

// dequeue removes h (served, timed out or gone) and lets the next one go
// when h was at the front.
func (g *Group) dequeue(h *holder) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, q := range g.queue {
		if q != h {
			continue
		}
		g.queue = append(g.queue[:i], g.queue[i+1:]...)
		if g.onDequeue != nil {
			g.onDequeue(h)
		}
		if i == 0 && len(g.queue) > 0 {
			close(g.queue[0].turn)
		}
		return
	}
}

// tryPick is pick for a request that has not waited yet: under max-conns
// it does not overtake queued requests (a slot that frees goes to the
// oldest waiter).
func (g *Group) tryPick(exclude []*Server) *Server {
	if g.cfg.MaxConns > 0 && len(exclude) == 0 && g.waiting.Load() > 0 {
		return nil
	}
	return g.pick(exclude)
}

// pick chooses among eligible servers and counts the request on it.
func (g *Group) pick(exclude []*Server) *Server {
	list := *g.eligible.Load()
	// A server chosen as below max-conns can fill up before take: pick
	// again (a few times; then the caller queues).
	for try := 0; try < 4; try++ {
		var s *Server
		switch {
		case len(list) == 0:
			return nil
		case len(list) == 1 && g.cfg.MaxFails == 0 && len(exclude) == 0:
			s = list[0]
		default:
			s = g.pickPolicy(list, exclude, true)
			if s == nil && g.cfg.MaxFails > 0 {
				// Every server is marked failed: like Nginx, try them anyway
				// rather than refuse everything.
				s = g.pickPolicy(list, exclude, false)
			}
		}
		if s == nil {
			return nil
		}
		if g.take(s) {
			s.requests.Add(1)
			s.mReq.Inc()
			return s
		}
	}
	return nil
}

func (g *Group) pickPolicy(list, exclude []*Server, honourFails bool) *Server {
	now := int64(0)
	if honourFails && g.cfg.MaxFails > 0 {
		now = time.Now().UnixNano()
	}
	if g.cfg.Balance == BalanceRoundRobin {
		return g.pickRR(list, exclude, now)
	}
	return g.pickLeast(list, exclude, now)
}

// usable: not already tried by this request, not passively marked failed
// (now == 0 skips that test).
func (g *Group) usable(s *Server, exclude []*Server, now int64) bool {
	return !contains(exclude, s) && (now == 0 || !s.passiveFailed(now)) &&
		(g.cfg.MaxConns == 0 || s.active.Load() < int64(g.cfg.MaxConns))
}

// pickLeast: fewest in-flight requests per weight, ties broken at random.
func (g *Group) pickLeast(list, exclude []*Server, now int64) *Server {
	var best *Server
	var bestScore int64
	ties := 0
	for _, s := range list {
		if !g.usable(s, exclude, now) {
			continue
		}
		score := (s.active.Load() + 1) * 256 / int64(s.cfg.Weight)
		switch {
		case best == nil || score < bestScore:
			best, bestScore, ties = s, score, 1
		case score == bestScore:
			ties++
			if rand.IntN(ties) == 0 {
				best = s
			}
		}
	}
	return best
}

// pickRR: weighted round-robin over the eligible list.
func (g *Group) pickRR(list, exclude []*Server, now int64) *Server {
	total := 0
	for _, s := range list {
		total += s.cfg.Weight
	}
	start := int(g.rr.Add(1) % uint64(total))
	for try := 0; try < total; try++ {
		n := (start + try) % total
		for _, s := range list {
			if n < s.cfg.Weight {
				if g.usable(s, exclude, now) {
					return s
				}
				break
			}
			n -= s.cfg.Weight
		}
	}
	return nil
}

// release ends a request or session started by acquire. Under max-conns
// it wakes the queue: the freed slot may be the one its front waits for.
func (s *Server) release() {
	s.active.Add(-1)
	if g := s.group; g.cfg.MaxConns > 0 && g.waiting.Load() > 0 {
		g.wake()
	}
}

// wake tells waiters to look again (eligibility changed or a slot freed).
func (g *Group) wake() {
	g.mu.Lock()
	close(g.changed)
	g.changed = make(chan struct{})
	g.mu.Unlock()
}

// saturated: some eligible server this request may use exists, but every
// such server is at max-conns.
func (g *Group) saturated(exclude []*Server) bool {
	if g.cfg.MaxConns == 0 {
		return false
	}
	found := false
	for _, s := range *g.eligible.Load() {
		if contains(exclude, s) {
			continue
		}
		if s.active.Load() < int64(g.cfg.MaxConns) {
			return false
		}
		found = true
	}
	return found
}

// take counts a request on s unless s is at max-conns.
func (g *Group) take(s *Server) bool {
	if g.cfg.MaxConns == 0 {
		s.active.Add(1)
		return true
	}
	for {
		n := s.active.Load()
		if n >= int64(g.cfg.MaxConns) {
			return false
		}
		if s.active.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Status is the JSON view of a backend.
type Status struct {
	Name     string         `json:"name"`
	Kind     Kind           `json:"kind"`
	Waiting  int64          `json:"waiting"`
	Key      *KeyStatus     `json:"etcd_key,omitempty"`
	Servers  []ServerStatus `json:"servers"`
	Eligible int            `json:"eligible"`
}

// KeyStatus is the fast path's view of the active key.
type KeyStatus struct {
	Known bool   `json:"known"`
	Node  string `json:"node"`
	Epoch int64  `json:"epoch"`
}

// Status returns the current state of the group and its servers.
func (g *Group) Status() Status {
	list := *g.eligible.Load()
	st := Status{Name: g.cfg.Name, Kind: g.cfg.Kind, Waiting: g.waiting.Load(), Eligible: len(list)}
	if g.cfg.EtcdFastPath {
		g.mu.Lock()
		st.Key = &KeyStatus{Known: g.key.known, Node: g.key.node, Epoch: g.key.epoch}
		g.mu.Unlock()
	}
	for _, s := range g.servers {
		st.Servers = append(st.Servers, s.status(contains(list, s)))
	}
	return st
}

func contains(list []*Server, s *Server) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func sameSet(a, b []*Server) bool {
	if len(a) != len(b) {
		return false
	}
	for _, s := range a {
		if !contains(b, s) {
			return false
		}
	}
	return true
}

func zapServer(s *Server) []zap.Field {
	return []zap.Field{zap.String("server", s.name), zap.String("address", s.cfg.Address)}
}
