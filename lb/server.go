package lb

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// AdminState is the operator's runtime setting for a server.
type AdminState uint32

// Admin states (HAProxy's ready/drain/maint).
const (
	AdminReady AdminState = iota // takes traffic when its checks allow
	AdminDrain                   // no new requests; in-flight ones finish
	AdminMaint                   // no traffic, TCP sessions closed
)

func (a AdminState) String() string {
	switch a {
	case AdminDrain:
		return "drain"
	case AdminMaint:
		return "maint"
	default:
		return "ready"
	}
}

// ParseAdminState parses "ready", "drain" or "maint".
func ParseAdminState(s string) (AdminState, bool) {
	switch s {
	case "ready":
		return AdminReady, true
	case "drain":
		return AdminDrain, true
	case "maint":
		return AdminMaint, true
	}
	return AdminReady, false
}

// Server is one backend server with its check state and counters. The data
// path only reads atomics; the group recomputes eligibility under its lock.
type Server struct {
	cfg   ServerConfig
	group *Group
	name  string

	up        atomic.Bool  // active check verdict (or true without checks)
	epoch     atomic.Int64 // X-Hapair-Epoch of the last good check
	confirm   atomic.Bool  // named by a new key: routed only after its next good check
	admin     atomic.Uint32
	failUntil atomic.Int64 // unix nanos; passive failure marking
	active    atomic.Int64 // in-flight requests or TCP sessions
	requests  atomic.Uint64
	errors    atomic.Uint64

	nudge chan int64 // fast-path confirmation: expected epoch (0 = just check now)

	mu         sync.Mutex // guards the fields below
	okRun      int        // consecutive good checks
	failRun    int        // consecutive bad checks
	checkState string     // "up", "down", "init"
	lastReason string
	lastChange time.Time
	lastCheck  time.Time
	role       string
	failCount  int
	failStart  time.Time
	sessions   map[*tcpSession]struct{}

	pool *connPool

	mReq    prometheus.Counter
	mErr    prometheus.Counter
	mResp   [6]prometheus.Counter // by status class 1xx..5xx, index 0 unused
	mChecks [2]prometheus.Counter // fail, ok
}

func newServer(cfg ServerConfig, g *Group) *Server {
	s := &Server{
		cfg:        cfg,
		group:      g,
		name:       cfg.Name,
		nudge:      make(chan int64, 1),
		checkState: "init",
		lastChange: time.Now(),
		sessions:   map[*tcpSession]struct{}{},
	}
	if g.cfg.Kind == KindActivePassive || g.cfg.Kind == KindPool {
		s.pool = newConnPool(g.cfg.IdleConns, g.cfg.IdleConnTimeout, *g.cfg.IdleSurplusTimeout)
	}
	if !g.cfg.Check.ChecksEnabled() {
		s.up.Store(true)
		s.checkState = "no-check"
	}
	m := g.m
	s.mReq = m.requests.WithLabelValues(g.cfg.Name, cfg.Name)
	s.mErr = m.errors.WithLabelValues(g.cfg.Name, cfg.Name)
	for i, c := range []string{"", "1xx", "2xx", "3xx", "4xx", "5xx"} {
		if c != "" {
			s.mResp[i] = m.responses.WithLabelValues(g.cfg.Name, cfg.Name, c)
		}
	}
	s.mChecks[0] = m.checks.WithLabelValues(g.cfg.Name, cfg.Name, "fail")
	s.mChecks[1] = m.checks.WithLabelValues(g.cfg.Name, cfg.Name, "ok")
	return s
}

// Name is the server's configured name.
func (s *Server) Name() string { return s.name }

// Admin returns the runtime admin state.
func (s *Server) Admin() AdminState { return AdminState(s.admin.Load()) }

// passiveFailed reports whether passive failure marking keeps it out now.
func (s *Server) passiveFailed(now int64) bool {
	return s.failUntil.Load() > now
}

// noteFailure counts a failed request for max-fails/fail-timeout marking.
func (s *Server) noteFailure() {
	s.errors.Add(1)
	s.mErr.Inc()
	g := s.group
	if g.cfg.MaxFails <= 0 {
		return
	}
	now := time.Now()
	s.mu.Lock()
	if now.Sub(s.failStart) > g.cfg.FailTimeout {
		s.failStart, s.failCount = now, 0
	}
	s.failCount++
	trip := s.failCount >= g.cfg.MaxFails
	if trip {
		s.failCount = 0
		s.failUntil.Store(now.Add(g.cfg.FailTimeout).UnixNano())
		s.lastReason = "passive: max-fails reached"
	}
	s.mu.Unlock()
	if trip {
		g.lg.Warn("server marked failed", zapServer(s)...)
	}
}

// countResponse records a response status for metrics.
func (s *Server) countResponse(code int) {
	if c := code / 100; c >= 1 && c <= 5 {
		s.mResp[c].Inc()
	}
}

func (s *Server) addSession(t *tcpSession) {
	s.mu.Lock()
	s.sessions[t] = struct{}{}
	s.mu.Unlock()
}

func (s *Server) removeSession(t *tcpSession) {
	s.mu.Lock()
	delete(s.sessions, t)
	s.mu.Unlock()
}

// killSessions closes every TCP session to this server at once
// (HAProxy's on-marked-down shutdown-sessions).
func (s *Server) killSessions() int {
	s.mu.Lock()
	list := make([]*tcpSession, 0, len(s.sessions))
	for t := range s.sessions {
		list = append(list, t)
	}
	s.mu.Unlock()
	for _, t := range list {
		t.kill()
	}
	return len(list)
}

// ServerStatus is the JSON view of a server for the admin API.
type ServerStatus struct {
	Name        string    `json:"name"`
	Address     string    `json:"address"`
	Node        string    `json:"node"`
	Weight      int       `json:"weight"`
	Eligible    bool      `json:"eligible"`
	State       string    `json:"state"`
	Admin       string    `json:"admin"`
	Check       string    `json:"check"`
	LastReason  string    `json:"last_reason"`
	LastChange  time.Time `json:"last_change"`
	LastCheck   time.Time `json:"last_check"`
	Epoch       int64     `json:"epoch"`
	Role        string    `json:"role,omitempty"`
	Active      int64     `json:"active"`
	Requests    uint64    `json:"requests"`
	Errors      uint64    `json:"errors"`
	FailedUntil time.Time `json:"failed_until,omitzero"`
}

func (s *Server) status(eligible bool) ServerStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := ServerStatus{
		Name: s.name, Address: s.cfg.Address, Node: s.cfg.Node, Weight: s.cfg.Weight,
		Eligible: eligible, Admin: s.Admin().String(), Check: s.checkState,
		LastReason: s.lastReason, LastChange: s.lastChange, LastCheck: s.lastCheck,
		Epoch: s.epoch.Load(), Role: s.role, Active: s.active.Load(),
		Requests: s.requests.Load(), Errors: s.errors.Load(),
	}
	if fu := s.failUntil.Load(); fu > time.Now().UnixNano() {
		st.FailedUntil = time.Unix(0, fu)
	}
	switch {
	case s.Admin() == AdminMaint:
		st.State = "MAINT"
	case s.Admin() == AdminDrain:
		st.State = "DRAIN"
	case eligible:
		st.State = "UP"
	case s.up.Load():
		st.State = "STANDBY" // checks pass but it is not routed to (vetoed, lower epoch)
	default:
		st.State = "DOWN"
	}
	return st
}

// idleConn is a pooled keep-alive connection to a backend server.
type idleConn struct {
	bc     *backendConn
	idleAt time.Time
}

// connPool keeps idle keep-alive connections to one server, newest first.
//
// It keeps max of them for up to timeout (idle-conns, idle-conn-timeout).
// Connections beyond max that come back after a burst are kept too, for
// surplus (idle-surplus-timeout) since they went idle, then closed oldest
// first. Why: with more requests in flight than max (1,000 clients), closing
// every connection beyond max at once, as nginx's `keepalive N` does, means
// the next wave dials again; those dials leave the event loop for the
// goroutine path and were what made the 1,000-connection tail 2× nginx's.
// HAProxy keeps such connections too (pool-purge-delay, 5 s).
type connPool struct {
	mu      sync.Mutex
	idle    []idleConn // oldest first
	max     int
	timeout time.Duration
	surplus time.Duration
	closed  bool
	// The trim timer, armed while connections are idle, for the earliest
	// time one of them is due to close (at).
	timer *time.Timer
	at    time.Time
	now   func() time.Time // time.Now; tests set a clock
}

func newConnPool(max int, timeout, surplus time.Duration) *connPool {
	return &connPool{max: max, timeout: timeout, surplus: surplus, now: time.Now}
}

// get returns the most recently used idle connection that has not expired.
func (p *connPool) get() *backendConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	for n := len(p.idle); n > 0; n = len(p.idle) {
		ic := p.idle[n-1]
		p.idle[n-1] = idleConn{}
		p.idle = p.idle[:n-1]
		if now.Sub(ic.idleAt) < p.timeout {
			return ic.bc
		}
		ic.bc.close()
	}
	return nil
}

// getFor is get, preferring a recent connection whose reads the poller p
// watches (the event loop can use it without moving it).
func (p *connPool) getFor(pw *poller) *backendConn {
	p.mu.Lock()
	now := p.now()
	for i := len(p.idle) - 1; i >= 0; i-- {
		ic := p.idle[i]
		if ic.bc.sock.pw != pw {
			continue
		}
		if now.Sub(ic.idleAt) >= p.timeout {
			break // get drops it and the older ones
		}
		p.idle = slices.Delete(p.idle, i, i+1)
		p.mu.Unlock()
		return ic.bc
	}
	p.mu.Unlock()
	return p.get()
}

// put returns a healthy connection to the pool, or closes it when the pool
// is full and keeps no surplus.
func (p *connPool) put(bc *backendConn) {
	at := bc.sock.now // read when the response was awaited: recent enough
	p.mu.Lock()
	if at.IsZero() {
		at = p.now()
	}
	if p.closed || len(p.idle) >= p.max && p.surplus <= 0 {
		p.mu.Unlock()
		bc.close()
		return
	}
	p.idle = append(p.idle, idleConn{bc: bc, idleAt: at})
	drop := p.trimLocked(at)
	p.armLocked(at)
	p.mu.Unlock()
	closeIdle(drop)
}

// dueLocked is when the oldest idle connection is to close: idle-conn-timeout
// after it went idle, or idle-surplus-timeout while more than max are idle.
func (p *connPool) dueLocked() time.Time {
	oldest := p.idle[0].idleAt
	if len(p.idle) > p.max {
		return oldest.Add(min(p.surplus, p.timeout))
	}
	return oldest.Add(p.timeout)
}

// trimLocked takes out the connections due to close at now, oldest first,
// and returns them for closeIdle (closed outside the lock).
func (p *connPool) trimLocked(now time.Time) []idleConn {
	n := 0
	for n < len(p.idle) {
		age := now.Sub(p.idle[n].idleAt)
		if age < p.timeout && (len(p.idle)-n <= p.max || age < p.surplus) {
			break
		}
		n++
	}
	if n == 0 {
		return nil
	}
	drop := slices.Clone(p.idle[:n])
	clear(p.idle[:n])
	p.idle = append(p.idle[:0], p.idle[n:]...)
	return drop
}

// armLocked sets the trim timer for the next connection due, if sooner than
// it is set for.
func (p *connPool) armLocked(now time.Time) {
	if len(p.idle) == 0 || p.closed {
		return
	}
	due := p.dueLocked()
	if p.timer != nil && !p.at.IsZero() && !due.Before(p.at) {
		return
	}
	p.at = due
	if p.timer == nil {
		p.timer = time.AfterFunc(due.Sub(now), p.onTimer)
		return
	}
	p.timer.Reset(due.Sub(now))
}

// onTimer closes what is due and sets the timer for the next one.
func (p *connPool) onTimer() {
	p.mu.Lock()
	now := p.now()
	p.at = time.Time{}
	drop := p.trimLocked(now)
	p.armLocked(now)
	p.mu.Unlock()
	closeIdle(drop)
}

func closeIdle(list []idleConn) {
	for _, ic := range list {
		ic.bc.close()
	}
}

// closeAll drops every idle connection (server removed or marked down).
func (p *connPool) closeAll(final bool) {
	p.mu.Lock()
	list := p.idle
	p.idle = nil
	if final {
		p.closed = true
		if p.timer != nil {
			p.timer.Stop()
		}
	}
	p.mu.Unlock()
	closeIdle(list)
}
