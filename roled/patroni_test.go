package roled

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestPatroniClient talks to the fake Patroni's REST API (HTTP/1.0 answers,
// bare status lines for HEAD) in each of its moods.
func TestPatroniClient(t *testing.T) {
	p := newFakePatroni(t, nil, "A", "hapair")
	c := newPatroniClient(p.URL(), 300*time.Millisecond, nil)
	ctx := context.Background()

	code, st, err := c.Primary(ctx)
	if err != nil || code != 503 || st.Role != "replica" || st.State != "running" {
		t.Fatalf("replica: %d %+v %v", code, st, err)
	}
	if code, err := c.Replica(ctx, 64<<20); err != nil || code != 200 {
		t.Fatalf("replica?lag: %d %v", code, err)
	}
	p.set(func(p *fakePatroni) { p.primary = true })
	code, st, err = c.Primary(ctx)
	if err != nil || code != 200 || st.Role != "master" || st.Xlog.Location != 50331744 || st.Timeline != 1 {
		t.Fatalf("primary: %d %+v %v", code, st, err)
	}
	if hc, _, err := c.get(ctx, http.MethodHead, "/primary"); err != nil || hc != 200 {
		t.Fatalf("HEAD /primary (bare status line): %d %v", hc, err)
	}
	if ttl, err := c.TTL(ctx); err != nil || ttl != 10*time.Second {
		t.Fatalf("ttl: %s %v", ttl, err)
	}
	p.set(func(p *fakePatroni) { p.garbage = true })
	if _, _, err := c.Primary(ctx); !errors.Is(err, errGarbage) {
		t.Fatalf("garbage: %v", err)
	}
	p.set(func(p *fakePatroni) { p.garbage, p.hang = false, true })
	start := time.Now()
	if _, _, err := c.Primary(ctx); err == nil || errors.Is(err, errGarbage) {
		t.Fatalf("hang: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second { // ~300 ms measured: a guard against hanging
		t.Fatalf("hung call took %s with a 300ms timeout", d)
	}
}

func TestParsePatroniStatus(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		code       int
		garbage    bool
	}{
		{"newer primary", `{"state":"running","role":"primary","timeline":3}`, 200, false},
		{"not json", `<html>`, 200, true},
		{"json without role", `{"state":"running"}`, 200, true},
		{"redirect", `{}`, 302, true},
		{"huge", `{"state":"running","role":"master","x":"` + strings.Repeat("a", maxPatroniBody) + `"}`, 200, true},
	} {
		srv := newLocalServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.code)
			_, _ = w.Write([]byte(tc.body))
		}))
		_, _, err := newPatroniClient(srv, time.Second, nil).Primary(context.Background())
		if got := errors.Is(err, errGarbage); got != tc.garbage {
			t.Errorf("%s: garbage %v (err %v), want %v", tc.name, got, err, tc.garbage)
		}
	}
	if ttl, err := parsePatroniTTL([]byte(`{"ttl": 30}`)); err != nil || ttl != 30*time.Second {
		t.Fatalf("ttl %s %v", ttl, err)
	}
	if _, err := parsePatroniTTL([]byte(`{"loop_wait": 10}`)); err == nil {
		t.Fatal("want an error without ttl")
	}
}
