package lb

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// get is an idempotent bodiless request's first attempt, failed before
// any response byte on a new connection, with retries left.
func get() attemptResult {
	return attemptResult{out: outNoResponse, idem: true, attempt: 0, retries: 2}
}

// TestDecideRetry walks outcome × method × body × pooled × budget.
func TestDecideRetry(t *testing.T) {
	cases := []struct {
		name   string
		mut    func(*attemptResult)
		act    retryAction
		reason retryReason
	}{
		{"no response, GET: another server", nil, retryNext, reasonReplayable},
		{"no response, GET on a pooled conn: fresh conn, same server", func(a *attemptResult) { a.reused = true }, retryFresh, reasonStalePooled},
		{"no response, GET, budget used", func(a *attemptResult) { a.attempt = 2 }, retryStop, reasonNoBudget},
		{"no response, GET on a pooled conn, budget used: still fresh (not a retry)", func(a *attemptResult) { a.reused = true; a.attempt = 2 }, retryFresh, reasonStalePooled},
		{"no response, POST", func(a *attemptResult) { a.idem = false }, retryStop, reasonNotReplayable},
		{"no response, POST on a pooled conn", func(a *attemptResult) { a.idem = false; a.reused = true }, retryStop, reasonNotReplayable},
		{"no response, PUT with a body", func(a *attemptResult) { a.hasBody = true }, retryStop, reasonNotReplayable},
		{"no response, PUT with a body on a pooled conn (its body is gone)", func(a *attemptResult) { a.hasBody = true; a.reused = true }, retryStop, reasonNotReplayable},
		{"not sent, POST with a body: another server", func(a *attemptResult) { a.out = outNotSent; a.idem = false; a.hasBody = true }, retryNext, reasonNotSent},
		{"not sent, budget used", func(a *attemptResult) { a.out = outNotSent; a.attempt = 2 }, retryStop, reasonNoBudget},
		{"not sent, retries 0", func(a *attemptResult) { a.out = outNotSent; a.retries = 0 }, retryStop, reasonNoBudget},
		{"response bytes then failure", func(a *attemptResult) { a.out = outFailed }, retryStop, reasonResponseStarted},
		{"response started to the client", func(a *attemptResult) { a.out = outAborted }, retryStop, reasonAborted},
		{"client body failed", func(a *attemptResult) { a.out = outBadRequest; a.reused = true }, retryStop, reasonClientBody},
		{"done", func(a *attemptResult) { a.out = outDone }, retryStop, reasonDone},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := get()
			if tc.mut != nil {
				tc.mut(&a)
			}
			act, reason := decideRetry(a)
			if act != tc.act || reason != tc.reason {
				t.Errorf("got %s/%s, want %s/%s", act, reason, tc.act, tc.reason)
			}
		})
	}
}

// TestNoReplayOfABody: a PUT with a body sent on a pooled connection the
// backend has closed is not sent again (its body was read from the client
// and is gone: a replay would take the client's next bytes as the body, or
// wait for them); the client gets 502 at once, on both engines.
func TestNoReplayOfABody(t *testing.T) {
	for _, v := range engines() {
		t.Run(v.String(), func(t *testing.T) {
			be := closingBackend(t)
			cfg := poolConfig(be.Addr().String())
			v.set(t, &cfg)
			cfg.Backends[0].ResponseHeaderTimeout = 5 * time.Second
			l := startLB(t, cfg, nil)
			addr := l.ListenerAddr("web").String()
			// The first request leaves a pooled connection that the
			// backend closes after answering.
			st, _, _ := rawExchange(t, v, addr, "GET /first HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", -1, false)
			if len(st) != 1 || st[0] != 200 {
				t.Fatalf("first request: %v", st)
			}
			st, _, _ = rawExchange(t, v, addr, "PUT /put HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody", -1, false)
			if len(st) != 1 || st[0] == http.StatusGatewayTimeout {
				t.Errorf("PUT on a stale connection: statuses %v, want one answer (200 or 502), not a wait", st)
			}
		})
	}
}

// closingBackend answers each request with keep-alive framing and then
// closes the connection, so the balancer pools a connection that is dead.
func closingBackend(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			br := bufio.NewReader(c)
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			req, err := http.ReadRequest(br)
			if err == nil {
				_, _ = io.Copy(io.Discard, req.Body)
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln
}
