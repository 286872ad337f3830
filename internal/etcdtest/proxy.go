package etcdtest

import (
	"net"
	"sync"
	"time"
)

// proxy forwards TCP connections from its own listener to a member's real
// listener. Every byte a member sends to a peer or a client leaves through
// its proxy (peers and clients only know the proxy's address), so pausing
// the proxy mutes the member the way a frozen process looks from outside:
// connections stay open, nothing comes back. A stopped member behind a
// running proxy refuses connections, as a killed process does.
type proxy struct {
	ln net.Listener

	mu     sync.Mutex
	cond   *sync.Cond
	target string // the member's real address; may change between starts
	paused bool
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newProxy() (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) setTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

func (p *proxy) handle(c net.Conn) {
	defer p.wg.Done()
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	b, err := net.DialTimeout("tcp", target, time.Second)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, b) {
		return
	}
	done := make(chan struct{})
	go func() {
		p.pipe(b, c)
		close(done)
	}()
	p.pipe(c, b)
	<-done
	p.untrack(c, b)
}

// track registers the pair, or closes it when the proxy is already closed.
func (p *proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// pipe copies src to dst, holding data while the proxy is paused, and closes
// both ends when either side ends.
func (p *proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitResumed() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitResumed blocks while paused; false means the proxy closed meanwhile.
func (p *proxy) waitResumed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.paused && !p.closed {
		p.cond.Wait()
	}
	return !p.closed
}

func (p *proxy) setPaused(paused bool) {
	p.mu.Lock()
	p.paused = paused
	p.cond.Broadcast()
	p.mu.Unlock()
}

// close stops accepting, drops every connection and waits for its goroutines.
func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
