package lb

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// checkResult is one health check answer.
type checkResult struct {
	err    error // transport failure or timeout: counts towards fall
	status int
	epoch  int64
	role   string
}

func (r checkResult) reason() string {
	if r.err != nil {
		return r.err.Error()
	}
	s := "status " + strconv.Itoa(r.status)
	if r.role != "" {
		s += " role " + r.role
	}
	return s
}

// runChecks checks one server until ctx is done: once soon (with a small
// random offset so servers are staggered), then every interval, at once on a
// fast-path nudge, and every fast-interval while a new ACTIVE is being
// confirmed. One goroutine per server, so checks never overlap.
func (s *Server) runChecks(ctx context.Context) {
	defer func() {
		if r := recover(); r != nil {
			s.group.lg.Error("health checker panicked", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
		}
	}()
	cc := s.group.cfg.Check
	first := time.Duration(rand.Int64N(int64(min(cc.Interval, 100*time.Millisecond)))) + time.Millisecond
	t := time.NewTimer(first)
	defer t.Stop()
	var want int64          // epoch the fast path expects, 0 when not confirming
	var wantUntil time.Time // give up fast confirmation after this
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case e := <-s.nudge:
			want, wantUntil = e, time.Now().Add(max(*s.group.cfg.HoldTimeout, 5*time.Second))
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
		}
		res := s.checkOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		good := res.err == nil && res.status == cc.ExpectStatus
		confirmed := want != 0 && good && (res.epoch == want || s.group.cfg.Kind == KindPGPrimary)
		if good {
			s.confirm.Store(false)
		}
		s.applyCheck(res, confirmed)
		next := cc.Interval
		if confirmed || time.Now().After(wantUntil) {
			want = 0
		} else if want != 0 {
			next = s.group.cfg.FastInterval
		}
		t.Reset(next)
	}
}

// checkOnce runs one bounded check against the server's check address.
func (s *Server) checkOnce(ctx context.Context) checkResult {
	cc := s.group.cfg.Check
	ctx, cancel := context.WithTimeout(ctx, cc.Timeout)
	defer cancel()
	return httpCheck(ctx, s.cfg.CheckAddress, cc.Method, cc.Path, cc.MaxResponseBytes, cc.tlsClient)
}

// httpCheck sends one HTTP/1.0-compatible request on a fresh connection and
// reads at most limit bytes of the answer. It copes with Patroni's bare
// status line (HEAD/OPTIONS) and with HTTP/1.0 close-delimited answers.
// With tc it speaks HTTPS; a handshake failure (wrong CA, name not in the
// certificate) is a failed check.
func httpCheck(ctx context.Context, addr, method, path string, limit int, tc *tls.Config) checkResult {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return checkResult{err: fmt.Errorf("connect: %w", unwrapOp(err))}
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	host, _, _ := net.SplitHostPort(addr)
	if tc != nil {
		if tc.ServerName == "" {
			tc = tc.Clone()
			tc.ServerName = host
		}
		tlsConn := tls.Client(c, tc)
		if err := tlsConn.HandshakeContext(ctx); err != nil {
			return checkResult{err: fmt.Errorf("tls: %w", unwrapOp(err))}
		}
		c = tlsConn
	}
	req := method + " " + path + " HTTP/1.1\r\nHost: " + host +
		"\r\nUser-Agent: hapair-lb\r\nConnection: close\r\nAccept: */*\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		return checkResult{err: fmt.Errorf("send: %w", unwrapOp(err))}
	}
	br := bufio.NewReaderSize(io.LimitReader(c, int64(limit)), 512)
	return parseCheckResponse(br)
}

// parseCheckResponse reads the status line and headers it cares about.
func parseCheckResponse(br *bufio.Reader) checkResult {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return checkResult{err: fmt.Errorf("read status: %w", unwrapOp(err))}
	}
	f := bytes.Fields(line)
	if len(f) < 2 || !bytes.HasPrefix(f[0], []byte("HTTP/1.")) {
		return checkResult{err: fmt.Errorf("malformed status line %q", trimLine(line))}
	}
	code, err := strconv.Atoi(string(f[1]))
	if err != nil || code < 100 || code > 599 {
		return checkResult{err: fmt.Errorf("malformed status %q", f[1])}
	}
	res := checkResult{status: code}
	for {
		line, err := br.ReadSlice('\n')
		if len(bytes.TrimSpace(line)) == 0 || err != nil {
			// EOF right after the status line is Patroni's bare HEAD answer.
			return res
		}
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		key := strings.ToLower(string(bytes.TrimSpace(k)))
		val := string(bytes.TrimSpace(v))
		switch key {
		case "x-hapair-epoch":
			res.epoch, _ = strconv.ParseInt(val, 10, 64)
		case "x-hapair-role":
			res.role = strings.ToLower(val)
		}
	}
}

func trimLine(b []byte) string {
	if len(b) > 64 {
		b = b[:64]
	}
	return strings.TrimSpace(string(b))
}

// unwrapOp shortens net.OpError chains to their cause for readable reasons.
func unwrapOp(err error) error {
	if oe, ok := err.(*net.OpError); ok && oe.Err != nil {
		return oe.Err
	}
	return err
}

// applyCheck folds a result into the server's rise/fall state. An explicit
// "not me" answer (a complete HTTP response with another status) from an
// exclusive-role backend marks the server down at once: that node itself
// said it is PASSIVE (or not primary). Errors and timeouts count to fall.
func (s *Server) applyCheck(res checkResult, confirmed bool) {
	g := s.group
	cc := g.cfg.Check
	ok := res.err == nil && res.status == cc.ExpectStatus
	exclusive := g.cfg.Kind == KindActivePassive || g.cfg.Kind == KindPGPrimary
	s.mChecks[b2i(ok)].Inc()

	s.mu.Lock()
	s.lastCheck = time.Now()
	if res.role != "" {
		s.role = res.role
	}
	if ok {
		s.okRun, s.failRun = s.okRun+1, 0
	} else {
		s.okRun, s.failRun = 0, s.failRun+1
	}
	wasUp := s.up.Load()
	var nowUp bool
	switch {
	case ok && (wasUp || confirmed || s.okRun >= cc.Rise || s.checkState == "init"):
		// The first answer after start-up or reload is taken as it is, so a
		// fresh balancer does not hold traffic for rise × interval.
		nowUp = true
	case ok:
		nowUp = false // rising, not there yet
	case exclusive && res.err == nil:
		nowUp = false // explicit refusal: down at once
	case wasUp && s.failRun < cc.Fall:
		nowUp = true // falling, not there yet
	}
	if ok {
		s.epoch.Store(res.epoch)
	} else if !nowUp {
		s.epoch.Store(0)
	}
	changed := nowUp != wasUp || s.checkState == "init"
	if changed {
		s.lastChange = time.Now()
		s.lastReason = res.reason()
		if confirmed {
			s.lastReason += " (confirmed by etcd fast path)"
		}
		s.checkState = map[bool]string{true: "up", false: "down"}[nowUp]
	} else if !ok {
		s.lastReason = res.reason()
	}
	s.up.Store(nowUp)
	s.mu.Unlock()
	if changed {
		g.lg.Info("server check state changed", zap.String("server", s.name), zap.Bool("up", nowUp),
			zap.String("reason", res.reason()), zap.Int64("epoch", res.epoch), zap.Bool("fast_path", confirmed))
		g.m.stateChanges.WithLabelValues(g.cfg.Name, s.name).Inc()
	}
	// Epoch changes matter for the dual-claim rule even without a state change.
	g.recompute("health check")
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
