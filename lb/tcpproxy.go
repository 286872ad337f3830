package lb

import (
	"context"
	"net"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
)

// tcpSession is one forwarded client connection.
type tcpSession struct {
	client  net.Conn
	backend net.Conn
	once    sync.Once
}

// kill closes both sides at once.
func (t *tcpSession) kill() {
	t.once.Do(func() {
		_ = t.client.Close()
		_ = t.backend.Close()
	})
}

// tcpProxy serves one TCP listener.
type tcpProxy struct {
	route atomic.Pointer[route]
	lg    *zap.Logger
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{} // client conns not yet forwarded or in session
}

// serve accepts until the listener is closed. Sessions keep running; the
// caller drains them with wait/closeAll.
func (p *tcpProxy) serve(ln net.Listener) error {
	return acceptLoop(ln, func(c net.Conn) {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	})
}

// handle picks a server and splices the connection. pg-primary never
// redispatches: if the primary refuses the connect, so does the balancer.
func (p *tcpProxy) handle(c net.Conn) {
	p.track(c, true)
	defer p.track(c, false)
	defer c.Close()
	rt := p.route.Load()
	g := rt.g
	var tried []*Server
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := g.acquire(ctx, tried)
		cancel()
		if err != nil {
			g.m.tcpRefused.WithLabelValues(g.cfg.Name).Inc()
			return
		}
		bc, err := dialServer(context.Background(), s)
		if err != nil {
			s.release()
			s.noteFailure()
			g.lg.Debug("connect failed", zap.String("server", s.name), zap.Error(err))
			if g.cfg.Kind == KindPGPrimary || attempt >= *g.cfg.Retries {
				g.m.tcpRefused.WithLabelValues(g.cfg.Name).Inc()
				return
			}
			g.m.retries.WithLabelValues(g.cfg.Name).Inc()
			tried = append(tried, s)
			continue
		}
		p.session(c, bc, s)
		return
	}
}

func (p *tcpProxy) session(c, bc net.Conn, s *Server) {
	defer s.release()
	t := &tcpSession{client: c, backend: bc}
	s.addSession(t)
	defer s.removeSession(t)
	defer t.kill()
	s.group.m.tcpSessions.WithLabelValues(s.group.cfg.Name, s.name).Inc()
	// The server may have been marked down between pick and registration.
	if !contains(*s.group.eligible.Load(), s) && s.Admin() != AdminDrain {
		return
	}
	pipe(c, c, bc, bc) // TCPConn→TCPConn io.Copy uses splice(2) on Linux
}

func (p *tcpProxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		p.conns = map[net.Conn]struct{}{}
	}
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

// drain waits for sessions to end until ctx is done, then closes the rest.
func (p *tcpProxy) drain(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	<-done
}
