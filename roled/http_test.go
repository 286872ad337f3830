package roled

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// newIdleDaemon is a Daemon that was never Run, published ACTIVE by hand:
// enough to exercise the handlers.
func newIdleDaemon(t testing.TB) *Daemon {
	cfg := DefaultConfig()
	cfg.Node = "A"
	cfg.Listen = "127.0.0.1:0"
	cfg.Agent.Listen = ""
	d, err := New(cfg, zap.NewNop(), NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	d.lease.Store(&leaseState{id: 7, ttl: 5 * time.Second, lastSent: d.now(), deadline: d.now() + time.Hour})
	d.snap.Store(&snapshot{role: RoleActive, epoch: 42, leaseID: 7, since: time.Now(), reason: ReasonPrimary})
	return d
}

func TestHealthHandler(t *testing.T) {
	d := newIdleDaemon(t)
	h := d.handler()
	for _, m := range []string{http.MethodGet, http.MethodHead} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(m, "/ha-health", nil))
		if rec.Code != 200 || rec.Header().Get("X-Hapair-Role") != "active" || rec.Header().Get("X-Hapair-Epoch") != "42" {
			t.Fatalf("%s active: %d %v", m, rec.Code, rec.Header())
		}
		if m == http.MethodHead && rec.Body.Len() != 0 {
			t.Fatalf("HEAD has a body")
		}
	}
	// Past the deadline the handler answers 503 by itself, before the state
	// loop has changed anything (a process resumed after SIGSTOP).
	d.lease.Store(&leaseState{id: 7, deadline: d.now() - time.Millisecond})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ha-health", nil))
	if rec.Code != 503 || rec.Header().Get("X-Hapair-Role") != "passive" || rec.Header().Get("X-Hapair-Epoch") != "0" {
		t.Fatalf("past deadline: %d %v", rec.Code, rec.Header())
	}
	if _, ok := d.ActiveEpoch(); ok {
		t.Fatal("ActiveEpoch true past the deadline")
	}
	if got := d.appAgentReply(); got != "down" {
		t.Fatalf("agent reply past deadline %q", got)
	}
	// Another lease than the one the key was made on: 503 as well.
	d.lease.Store(&leaseState{id: 8, deadline: d.now() + time.Hour})
	if ok, _ := d.activeNow(); ok {
		t.Fatal("active on a new lease")
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/ha-health", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d", rec.Code)
	}
}

// BenchmarkHealthHandler is the server-side cost of one GET /ha-health.
func BenchmarkHealthHandler(b *testing.B) {
	d := newIdleDaemon(b)
	h := d.handler()
	req := httptest.NewRequest(http.MethodGet, "/ha-health", nil)
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
	}
}
