// Package lb is hapair's balancer: an HTTP reverse proxy that follows the
// ACTIVE node (health checks plus the etcd active key), least-connections
// Web pools, and Patroni-aware TCP entry points for PostgreSQL.
//
// Routing rules (Group.candidates, the one place they live):
//   - a server takes new traffic only when its checks pass (HAProxy
//     inter/fall/rise; for active-passive and pg-primary an explicit refusal
//     such as 503 from /ha-health or /primary marks it down at once, only
//     errors and timeouts count towards fall) and its admin state is ready;
//   - active-passive and pg-primary are exclusive: if several servers pass,
//     only the highest X-Hapair-Epoch gets traffic (none on a tie), and
//     hapair_lb_dual_active_total counts the event;
//   - with the etcd fast path, only the node the active key names may take
//     traffic, and only once a check showed the key's epoch (CreateRevision);
//     a key change vetoes the old node at once and triggers an immediate
//     check of the new one, repeated every fast-interval until confirmed. A
//     lost watch makes the key unknown and checks alone decide again.
//
// The data path reads the published eligible set lock-free; requests that
// find it empty wait up to hold-timeout for a change (Group.acquire).
package lb

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// LB runs every listener, backend group, checker and the admin endpoint of
// one configuration, and swaps them on Reload.
type LB struct {
	lg *zap.Logger
	m  *Metrics

	ready chan struct{} // closed once listeners are bound

	mu        sync.Mutex
	cfg       Config
	groups    map[string]*Group
	listeners map[string]*listener // by listener name
	keys      map[string]activeKey // last etcd observation per followed key
	runCtx    context.Context      // set by Run; nil before
	genCancel context.CancelFunc   // stops the current generation's checkers
	checkers  sync.WaitGroup
	adminAddr net.Addr
	gatherer  prometheus.Gatherer
	poll      *pollSet   // FIFO read wake-ups for the HTTP/1.1 engine (nil: Go's poller)
	vip       *vipHolder // nil without a vip section
}

// listener is one bound client-facing socket.
type listener struct {
	lc   ListenerConfig
	ln   net.Listener
	srv  *http.Server
	hp   *httpProxy // net/http engine (engine: std; HTTP/2 of a TLS listener)
	h1   *h1Server  // lean HTTP/1.1 engine (engine: fast, plain or TLS)
	tcp  *tcpProxy
	tlsc atomic.Pointer[tls.Config]
	done chan struct{}
	// engine fast with TLS: srv serves the HTTP/2 connections h1 hands
	// over, and h2done is closed when that ends.
	h2done chan struct{}
}

// New builds the balancer; nothing listens or runs until Run.
func New(cfg Config, lg *zap.Logger, m *Metrics) (*LB, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &LB{lg: lg, m: m, ready: make(chan struct{}), listeners: map[string]*listener{}, keys: map[string]activeKey{}}
	l.cfg = cfg
	if modeOn(cfg.FIFOReads) {
		if p, err := newPollSet(runtime.GOMAXPROCS(0)); err != nil {
			lg.Warn("fifo-reads: own poller unavailable; reads wait on Go's poller", zap.Error(err))
		} else {
			l.poll = p
			if modeOn(cfg.EventLoop) {
				m.state.loop = p.loopCounts
			}
		}
	}
	if cfg.VIP.Enabled() {
		h, err := newVIPHolder(cfg, lg.Named("vip"))
		if err != nil {
			return nil, err
		}
		l.vip = h
	}
	l.groups = l.buildGroups(cfg, nil)
	m.state.groups = l.currentGroups
	return l, nil
}

// modeOn reads the auto/on/off switches fifo-reads and event-loop: "auto"
// is on.
//
// fifo-reads: HTTP/1.1 reads wait on our own pollers. With one poller per
// P and reads that skip the EAGAIN attempt after a read that emptied the
// socket, it measured lower p99 and no more CPU than Go's poller at one
// and at two Ps (bench/lb A/B rounds); "off" is the fallback should a
// platform's epoll misbehave.
//
// event-loop: those pollers also serve plain-HTTP/1.1 keep-alive requests
// themselves (eventloop.go); it needs them, so it is off wherever they do
// not run. In same-run A/B rounds on a quiet 2-core machine it lowered CPU
// per request and, at two Ps, brought the p99 to HAProxy's (100 B 1.01
// against 1.31 on the goroutine path, 16 KiB 0.94 against 1.15); at one P
// it was no worse. "off" keeps every request on the goroutine path.
func modeOn(mode string) bool {
	return mode == "on" || mode == "auto"
}

// Ready is closed when every listener is bound and checks have started.
func (l *LB) Ready() <-chan struct{} { return l.ready }

// Run binds the listeners, starts checks, the etcd fast path and the admin
// endpoint, and serves until ctx is done; then it stops accepting, drains
// in-flight requests and sessions up to shutdown-timeout, and returns.
func (l *LB) Run(ctx context.Context) error {
	if l.poll != nil {
		// Stopped last: every connection that waits on it is gone by then.
		pctx, pstop := context.WithCancel(context.Background())
		pdone := make(chan struct{})
		go func() {
			defer close(pdone)
			l.poll.run(pctx)
		}()
		defer func() { pstop(); <-pdone }()
	}
	l.mu.Lock()
	l.runCtx = ctx
	for _, lc := range l.cfg.Listeners {
		ln, err := l.openListener(lc, l.groups[lc.Backend])
		if err != nil {
			l.mu.Unlock()
			l.closeListeners(context.Background(), l.allListeners())
			return err
		}
		l.listeners[lc.Name] = ln
	}
	if left := unclaimedInherited(); len(left) > 0 {
		l.lg.Warn("systemd passed sockets no listener takes: connections to them wait unanswered (remove their socket units or add the listeners)",
			zap.Strings("sockets", left))
	}
	l.startGeneration(ctx, l.groups)
	cfg := l.cfg
	l.mu.Unlock()

	var bg sync.WaitGroup
	adminErr := make(chan error, 1)
	if cfg.Admin.Listen != "" {
		aln, err := net.Listen("tcp", cfg.Admin.Listen)
		if err != nil {
			l.stopAll()
			return fmt.Errorf("admin listen %s: %w", cfg.Admin.Listen, err)
		}
		l.mu.Lock()
		l.adminAddr = aln.Addr()
		l.mu.Unlock()
		bg.Add(1)
		go func() {
			defer bg.Done()
			adminErr <- l.serveAdmin(ctx, aln)
		}()
	}
	for _, w := range l.watchers(cfg) {
		bg.Add(1)
		go func() {
			defer bg.Done()
			if err := w.run(ctx); err != nil {
				l.lg.Error("etcd fast path disabled", zap.String("key", w.key), zap.Error(err))
			}
		}()
	}
	if l.vip != nil {
		bg.Add(1)
		go func() {
			defer bg.Done()
			if err := l.vip.run(ctx); err != nil {
				l.lg.Error("VIP election stopped: this balancer does not hold the VIP", zap.Error(err))
			}
		}()
	}
	close(l.ready)
	l.lg.Info("balancer running", zap.Int("listeners", len(cfg.Listeners)), zap.Int("backends", len(cfg.Backends)))
	var err error
	select {
	case <-ctx.Done():
	case err = <-adminErr:
	}
	l.stopAll()
	bg.Wait()
	return err
}

// stopAll drains listeners and stops checkers.
func (l *LB) stopAll() {
	l.mu.Lock()
	timeout := l.cfg.ShutdownTimeout
	list := l.allListeners()
	l.listeners = map[string]*listener{}
	if l.genCancel != nil {
		l.genCancel()
	}
	l.mu.Unlock()
	dctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	l.closeListeners(dctx, list)
	l.checkers.Wait()
	for _, g := range l.currentGroups() {
		for _, s := range g.servers {
			if s.pool != nil {
				s.pool.closeAll(true)
			}
		}
	}
	l.lg.Info("balancer stopped")
}

func (l *LB) allListeners() []*listener {
	var list []*listener
	for _, ln := range l.listeners {
		list = append(list, ln)
	}
	return list
}

// closeListeners stops accepting and drains in-flight work until ctx ends.
func (l *LB) closeListeners(ctx context.Context, list []*listener) {
	var wg sync.WaitGroup
	for _, ln := range list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ln.shutdown(ctx, l.lg)
		}()
	}
	wg.Wait()
}

// The accept loop must have returned before draining: it adds to the
// WaitGroup the drain waits on, and an Add racing a Wait is a bug.
func (ln *listener) shutdown(ctx context.Context, lg *zap.Logger) {
	switch {
	case ln.h1 != nil && ln.srv != nil: // TLS: HTTP/1.1 here, HTTP/2 in srv
		_ = ln.ln.Close()
		<-ln.done
		var wg sync.WaitGroup
		wg.Go(func() { ln.h1.shutdown(ctx) })
		if err := ln.srv.Shutdown(ctx); err != nil {
			lg.Warn("drain deadline passed, closing connections", zap.String("listener", ln.lc.Name))
			_ = ln.srv.Close()
		}
		wg.Wait()
		<-ln.h2done
	case ln.h1 != nil:
		_ = ln.ln.Close()
		<-ln.done
		ln.h1.shutdown(ctx)
	case ln.srv != nil:
		if err := ln.srv.Shutdown(ctx); err != nil {
			lg.Warn("drain deadline passed, closing connections", zap.String("listener", ln.lc.Name))
			_ = ln.srv.Close()
		}
		<-ln.done
	default:
		_ = ln.ln.Close()
		<-ln.done
		ln.tcp.drain(ctx)
	}
}

// currentGroups lists the live groups (for metrics and status).
func (l *LB) currentGroups() []*Group {
	l.mu.Lock()
	defer l.mu.Unlock()
	var list []*Group
	for _, bc := range l.cfg.Backends {
		list = append(list, l.groups[bc.Name])
	}
	return list
}

// Group returns the live backend group with that name, or nil.
func (l *LB) Group(name string) *Group {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.groups[name]
}

// ListenerAddr returns the bound address of a listener (useful with port 0).
func (l *LB) ListenerAddr(name string) net.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ln := l.listeners[name]; ln != nil {
		return ln.ln.Addr()
	}
	return nil
}

// AdminAddr returns the bound admin address, or nil.
func (l *LB) AdminAddr() net.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.adminAddr
}

// watchers lists the etcd keys to follow: roled's active key for
// active-passive backends and each pg-primary backend's Patroni leader key.
// They are fixed at start (etcd settings change only on restart).
func (l *LB) watchers(cfg Config) []*keyWatcher {
	if len(cfg.Etcd.Endpoints) == 0 {
		return nil
	}
	keys := map[string]bool{}
	var ws []*keyWatcher
	for _, b := range cfg.Backends {
		if !b.EtcdFastPath {
			continue
		}
		key, plain := ActiveKey(cfg.Cluster), false
		if b.Kind == KindPGPrimary {
			key, plain = b.PatroniLeaderKey, true
		}
		if keys[key] {
			continue
		}
		keys[key] = true
		ws = append(ws, &keyWatcher{cfg: cfg.Etcd, key: key, plain: plain, lg: l.lg.Named("etcd"), m: l.m,
			sink: func(k activeKey) { l.setKey(key, k) }})
	}
	return ws
}

// groupKey is the etcd key a group follows, or "".
func groupKey(cfg Config, b BackendConfig) string {
	switch {
	case !b.EtcdFastPath:
		return ""
	case b.Kind == KindPGPrimary:
		return b.PatroniLeaderKey
	default:
		return ActiveKey(cfg.Cluster)
	}
}

// setKey fans an etcd observation out to the groups following that key.
func (l *LB) setKey(key string, k activeKey) {
	l.mu.Lock()
	l.keys[key] = k
	var list []*Group
	for _, g := range l.groups {
		if groupKey(l.cfg, g.cfg) == key {
			list = append(list, g)
		}
	}
	l.mu.Unlock()
	for _, g := range list {
		g.setKey(k)
	}
}

// buildGroups creates groups for cfg, carrying server state over from old
// groups of the same name and kind, so a reload does not reset who is UP.
func (l *LB) buildGroups(cfg Config, old map[string]*Group) map[string]*Group {
	groups := map[string]*Group{}
	for _, bc := range cfg.Backends {
		g := newGroup(bc, l.lg.Named("backend"), l.m)
		g.poll = l.poll
		if og := old[bc.Name]; og != nil && og.cfg.Kind == bc.Kind {
			for _, s := range g.servers {
				if os := og.server(s.name); os != nil && os.cfg.Address == s.cfg.Address {
					s.inherit(os)
				}
			}
		}
		if key := groupKey(cfg, bc); key != "" {
			g.key = l.keys[key]
		}
		g.recompute("configuration")
		groups[bc.Name] = g
	}
	return groups
}

// inherit copies check and admin state from the previous generation.
func (s *Server) inherit(o *Server) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s.up.Store(o.up.Load())
	s.epoch.Store(o.epoch.Load())
	s.admin.Store(o.admin.Load())
	s.failUntil.Store(o.failUntil.Load())
	s.okRun, s.failRun, s.checkState = o.okRun, o.failRun, o.checkState
	s.lastReason, s.lastChange, s.lastCheck, s.role = o.lastReason, o.lastChange, o.lastCheck, o.role
	if !s.group.cfg.Check.ChecksEnabled() {
		s.up.Store(true)
	}
}

// startGeneration starts the checkers of groups; called with mu held.
func (l *LB) startGeneration(ctx context.Context, groups map[string]*Group) {
	gctx, cancel := context.WithCancel(ctx)
	l.genCancel = cancel
	for _, g := range groups {
		if !g.cfg.Check.ChecksEnabled() {
			continue
		}
		for _, s := range g.servers {
			l.checkers.Add(1)
			go func() {
				defer l.checkers.Done()
				s.runChecks(gctx)
			}()
		}
	}
}

// Reload applies a new, already validated configuration: new groups (state
// carried over), routes swapped atomically on existing listeners, new
// listeners bound, removed ones drained. On error nothing changes.
func (l *LB) Reload(cfg Config) error {
	err := l.reload(cfg)
	result := "ok"
	if err != nil {
		result = "error"
	}
	l.m.reloads.WithLabelValues(result).Inc()
	return err
}

func (l *LB) reload(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.runCtx == nil {
		return errors.New("lb: reload before run")
	}
	if fmt.Sprint(cfg.Etcd) != fmt.Sprint(l.cfg.Etcd) || cfg.Admin != l.cfg.Admin || cfg.Cluster != l.cfg.Cluster {
		l.lg.Warn("etcd, cluster and admin settings change only on restart")
	}
	groups := l.buildGroups(cfg, l.groups)
	keep, fresh, err := l.planListeners(cfg, groups)
	if err != nil {
		return err
	}
	var gone []*listener
	for name, ln := range l.listeners {
		if _, ok := keep[name]; !ok {
			gone = append(gone, ln)
		}
	}
	for name, ln := range keep {
		l.swapRoute(ln, ln.lc, cfg.lookupListener(name), groups)
	}
	l.listeners = map[string]*listener{}
	for name, ln := range keep {
		l.listeners[name] = ln
	}
	for name, ln := range fresh {
		l.listeners[name] = ln
	}
	oldCancel, oldGroups := l.genCancel, l.groups
	l.groups, l.cfg = groups, cfg
	l.startGeneration(l.runCtx, groups)
	oldCancel()
	go func() {
		dctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		l.closeListeners(dctx, gone)
		for _, g := range oldGroups {
			for _, s := range g.servers {
				if s.pool != nil {
					s.pool.closeAll(true)
				}
			}
		}
	}()
	l.lg.Info("configuration reloaded", zap.Int("listeners", len(cfg.Listeners)), zap.Int("backends", len(cfg.Backends)))
	return nil
}

func (c *Config) lookupListener(name string) ListenerConfig {
	for _, lc := range c.Listeners {
		if lc.Name == name {
			return lc
		}
	}
	return ListenerConfig{}
}

// planListeners decides which listeners stay (same name, address, mode) and
// binds the new ones; on a bind error it closes what it bound.
func (l *LB) planListeners(cfg Config, groups map[string]*Group) (keep, fresh map[string]*listener, err error) {
	keep, fresh = map[string]*listener{}, map[string]*listener{}
	byAddr := map[string]*listener{}
	for _, ln := range l.listeners {
		byAddr[ln.lc.Listen] = ln
	}
	for _, lc := range cfg.Listeners {
		old := l.listeners[lc.Name]
		if old != nil && old.lc.Listen == lc.Listen && old.lc.Mode == lc.Mode {
			keep[lc.Name] = old
			continue
		}
		if o := byAddr[lc.Listen]; o != nil {
			err = fmt.Errorf("listener %s: address %s is still used by listener %s (rename or mode change needs a restart)", lc.Name, lc.Listen, o.lc.Name)
			break
		}
		var ln *listener
		if ln, err = l.openListener(lc, groups[lc.Backend]); err != nil {
			break
		}
		fresh[lc.Name] = ln
	}
	if err != nil {
		var list []*listener
		for _, ln := range fresh {
			list = append(list, ln)
		}
		l.closeListeners(context.Background(), list)
		return nil, nil, err
	}
	return keep, fresh, nil
}

// swapRoute points an existing listener at its new backend group.
func (l *LB) swapRoute(ln *listener, old, lc ListenerConfig, groups map[string]*Group) {
	rt := &route{g: groups[lc.Backend], lc: lc}
	if ln.h1 != nil {
		ln.h1.route.Store(rt)
		ln.h1.accessLog.Store(l.cfg.AccessLog)
	}
	if ln.hp != nil {
		ln.hp.route.Store(rt)
		ln.hp.accessLog = l.cfg.AccessLog
	}
	if ln.tcp != nil {
		ln.tcp.route.Store(rt)
	}
	if lc.TLS.Enabled() && ln.tlsc.Load() != nil {
		// New handshakes take the reloaded certificate (GetConfigForClient).
		if tc, err := lc.serverTLS(); err == nil {
			ln.tlsc.Store(tc)
		} else {
			l.lg.Warn("TLS reload failed; keeping the previous certificate", zap.String("listener", lc.Name), zap.Error(err))
		}
	}
	// The fast engine reads limits and timeouts per request from the route;
	// net/http fixes them when the server is created.
	if ln.srv != nil && (old.MaxHeaderBytes != lc.MaxHeaderBytes || old.ReadHeaderTimeout != lc.ReadHeaderTimeout ||
		old.IdleTimeout != lc.IdleTimeout || old.WriteTimeout != lc.WriteTimeout) || old.TLS.Enabled() != lc.TLS.Enabled() ||
		old.Engine != lc.Engine {
		l.lg.Warn("listener engine, TLS on/off and (std engine) timeouts and header size change only on restart",
			zap.String("listener", lc.Name))
	}
	ln.lc.Backend, ln.lc.MaxHeaderCount = lc.Backend, lc.MaxHeaderCount
}

// openListener binds one listener and starts serving it.
func (l *LB) openListener(lc ListenerConfig, g *Group) (*listener, error) {
	nl, fromSystemd, err := listen(lc)
	if err != nil {
		return nil, fmt.Errorf("listener %s: %w", lc.Name, err)
	}
	if fromSystemd {
		l.lg.Info("listener socket from systemd (socket activation)", zap.String("listener", lc.Name), zap.String("addr", nl.Addr().String()))
	}
	ln := &listener{lc: lc, ln: nl, done: make(chan struct{})}
	rt := &route{g: g, lc: lc}
	lg := l.lg.With(zap.String("listener", lc.Name))
	if lc.Mode == "tcp" {
		ln.tcp = &tcpProxy{lg: lg}
		ln.tcp.route.Store(rt)
		go func() {
			defer close(ln.done)
			if err := ln.tcp.serve(nl); err != nil {
				lg.Error("accept failed", zap.Error(err))
			}
		}()
		lg.Info("listening", zap.String("addr", nl.Addr().String()), zap.String("mode", "tcp"))
		return ln, nil
	}
	var tlsBase *tls.Config
	if lc.TLS.Enabled() {
		tc, err := lc.serverTLS()
		if err != nil {
			_ = nl.Close()
			return nil, fmt.Errorf("listener %s: %w", lc.Name, err)
		}
		ln.tlsc.Store(tc)
		// Every handshake takes the current certificate (swapped on reload).
		tlsBase = &tls.Config{NextProtos: []string{"h2", "http/1.1"},
			GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return ln.tlsc.Load(), nil }}
	}
	if lc.Engine == "fast" {
		ln.h1 = &h1Server{lg: lg.Named("access"), poll: l.poll, loop: l.poll != nil && modeOn(l.cfg.EventLoop)}
		ln.h1.route.Store(rt)
		ln.h1.accessLog.Store(l.cfg.AccessLog)
		if lc.TLS.Enabled() {
			ln.h1.tlsc = tlsBase
			ln.h1.h2 = newConnQueue(nl.Addr())
			ln.hp = &httpProxy{lg: lg.Named("access"), accessLog: l.cfg.AccessLog, tls: true}
			ln.hp.route.Store(rt)
			ln.srv = stdServer(lc, ln.hp, lg)
			ln.h2done = make(chan struct{})
			go func() {
				defer close(ln.h2done)
				// No TLSConfig: Serve then sets HTTP/2 up for the
				// *tls.Conn it gets with h2 negotiated.
				if err := ln.srv.Serve(ln.h1.h2); err != nil && !errors.Is(err, http.ErrServerClosed) {
					lg.Error("HTTP/2 serve failed", zap.Error(err))
				}
			}()
		}
		go func() {
			defer close(ln.done)
			if err := ln.h1.serve(nl); err != nil {
				lg.Error("accept failed", zap.Error(err))
			}
		}()
		lg.Info("listening", zap.String("addr", nl.Addr().String()), zap.String("mode", "http"), zap.String("engine", "fast"),
			zap.Bool("tls", lc.TLS.Enabled()))
		return ln, nil
	}
	ln.hp = &httpProxy{lg: lg.Named("access"), accessLog: l.cfg.AccessLog, tls: lc.TLS.Enabled()}
	ln.hp.route.Store(rt)
	ln.srv = stdServer(lc, ln.hp, lg)
	if lc.TLS.Enabled() {
		ln.srv.TLSConfig = tlsBase
	}
	go func() {
		defer close(ln.done)
		var err error
		if lc.TLS.Enabled() {
			err = ln.srv.ServeTLS(nl, "", "")
		} else {
			err = ln.srv.Serve(nl)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			lg.Error("serve failed", zap.Error(err))
		}
	}()
	lg.Info("listening", zap.String("addr", nl.Addr().String()), zap.String("mode", "http"), zap.String("engine", "std"),
		zap.Bool("tls", lc.TLS.Enabled()))
	return ln, nil
}

// stdServer is the net/http server of a listener (engine std, or the
// HTTP/2 side of a TLS listener).
func stdServer(lc ListenerConfig, hp *httpProxy, lg *zap.Logger) *http.Server {
	errLog, _ := zap.NewStdLogAt(lg.Named("http"), zapcore.DebugLevel)
	return &http.Server{Handler: hp, ReadHeaderTimeout: lc.ReadHeaderTimeout, IdleTimeout: lc.IdleTimeout,
		WriteTimeout: lc.WriteTimeout, MaxHeaderBytes: lc.MaxHeaderBytes, ErrorLog: errLog}
}

// serverTLS is the TLS server configuration of a listener: its
// certificate, HTTP/2 and HTTP/1.1 offered by ALPN, session tickets as
// configured.
func (lc ListenerConfig) serverTLS() (*tls.Config, error) {
	tc, err := lc.TLS.ServerConfig()
	if err != nil {
		return nil, err
	}
	tc.NextProtos = []string{"h2", "http/1.1"}
	tc.SessionTicketsDisabled = lc.TLSSessionTickets != nil && !*lc.TLSSessionTickets
	return tc, nil
}
