package lab

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// DelayProxy is a user-space TCP proxy that delays every chunk of data by
// Delay ± Jitter in each direction, keeping the byte order: the kernel here
// has no netem, so latency with jitter between the lab's members (etcd
// client and peer traffic, Patroni's REST) goes through this instead. For
// the jitter soak (hapair-lab soak --delay 20ms±10ms).
type DelayProxy struct {
	Target string        // host:port every connection is forwarded to
	Delay  time.Duration // mean one-way delay added
	Jitter time.Duration // uniform ± around Delay (never below 0)
	// Dial connects to Target (default net.Dialer); the lab dials inside a
	// namespace.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Serve accepts on ln until ctx is done, then closes ln and every
// connection and returns once all its goroutines have stopped.
func (p *DelayProxy) Serve(ctx context.Context, ln net.Listener) error {
	dial := p.Dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); <-ctx.Done(); _ = ln.Close() }()
	var err error
	for {
		var c net.Conn
		c, err = ln.Accept()
		if err != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.handle(ctx, c, dial)
		}()
	}
	cancel()
	wg.Wait()
	if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func (p *DelayProxy) handle(ctx context.Context, c net.Conn, dial func(context.Context, string, string) (net.Conn, error)) {
	defer c.Close()
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	up, err := dial(dctx, "tcp", p.Target)
	cancel()
	if err != nil {
		return
	}
	defer up.Close()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	closed := make(chan struct{})
	go func() { defer close(closed); <-ctx.Done(); _ = c.Close(); _ = up.Close() }()
	// Each direction ends on its own EOF (a half-close passes through);
	// the connection ends when both have, or on cancel.
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(ctx, up, c) }()
	go func() { defer wg.Done(); p.pipe(ctx, c, up) }()
	wg.Wait()
	stop()
	<-closed
}

// chunk is data read at one moment, due for delivery at due.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst, each chunk delivered no earlier than its due time
// and never before the chunk ahead of it (TCP keeps order; so does this).
func (p *DelayProxy) pipe(ctx context.Context, dst io.Writer, src io.Reader) {
	q := make(chan chunk, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range q {
			if d := time.Until(c.due); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
			if _, err := dst.Write(c.b); err != nil {
				return
			}
		}
	}()
	var last time.Time
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			due := time.Now().Add(p.delay())
			if due.Before(last) {
				due = last
			}
			last = due
			select {
			case q <- chunk{buf[:n], due}:
			case <-ctx.Done():
				close(q)
				<-done
				return
			}
		}
		if err != nil {
			break
		}
	}
	close(q)
	<-done
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

func (p *DelayProxy) delay() time.Duration {
	d := p.Delay
	if p.Jitter > 0 {
		d += time.Duration(rand.Int64N(int64(2*p.Jitter)+1)) - p.Jitter
	}
	return max(d, 0)
}
