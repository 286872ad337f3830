package lb

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// renderStats renders the stats page through the admin handler.
func renderStats(t *testing.T, l *testLB) string {
	t.Helper()
	rec := httptest.NewRecorder()
	l.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	b, _ := io.ReadAll(rec.Result().Body)
	return string(b)
}

func serverState(l *testLB, name string) string {
	for _, b := range l.Stats().Backends {
		for _, s := range b.Servers {
			if s.Name == name {
				return s.State
			}
		}
	}
	return ""
}

// TestStatsPageStandby: the PASSIVE node (its /ha-health answers 503 with
// X-Hapair-Role: passive, on purpose) is a STANDBY on the stats page and in
// stats.json, not a red DOWN; a node that stops answering is DOWN whatever
// it said before; with no eligible server the page says nothing can serve.
func TestStatsPageStandby(t *testing.T) {
	a, b := newFakeNode(t, "a"), newFakeNode(t, "b")
	a.setActive(7)
	l := startLB(t, apConfig(a, b), nil)
	waitFor(t, 10*time.Second, "a UP, b STANDBY", func() bool {
		return serverState(l, "a") == "UP" && serverState(l, "b") == "STANDBY"
	})
	page := renderStats(t, l)
	if !strings.Contains(page, `<tr class="STANDBY"><td>b</td>`) || strings.Contains(page, `class="DOWN"`) {
		t.Fatalf("page does not show b as STANDBY:\n%s", page)
	}
	if strings.Contains(page, "NOTHING CAN SERVE") || len(l.Stats().Banners) != 0 {
		t.Fatal("banner while a serves")
	}

	// Both PASSIVE (a switchover in progress): both STANDBY, and the banner.
	a.setPassive()
	waitFor(t, 10*time.Second, "a STANDBY", func() bool { return serverState(l, "a") == "STANDBY" })
	page = renderStats(t, l)
	if !strings.Contains(page, `class="banner">NOTHING CAN SERVE app: no server is eligible`) ||
		!strings.Contains(page, "held up to 5s, then answered 503 with Retry-After") {
		t.Fatalf("no banner:\n%s", page)
	}

	// b's node dies: its last check failed without an answer, so DOWN,
	// although the last role it reported was passive.
	_ = b.srv.Close()
	waitFor(t, 10*time.Second, "b DOWN", func() bool { return serverState(l, "b") == "DOWN" })
	if page = renderStats(t, l); !strings.Contains(page, `<tr class="DOWN"><td>b</td>`) {
		t.Fatalf("dead b not DOWN:\n%s", page)
	}
}

func TestStandbyRule(t *testing.T) {
	passive := ServerStatus{State: "DOWN", Role: "passive", Admin: AdminReady.String(), LastReason: "status 503 role passive"}
	cases := []struct {
		name string
		mut  func(*ServerStatus)
		want bool
	}{
		{"passive answer", nil, true},
		{"refused after saying passive", func(s *ServerStatus) { s.LastReason = "connection refused" }, false},
		{"timeout after saying passive", func(s *ServerStatus) { s.LastReason = "i/o timeout" }, false},
		{"500 from a passive node", func(s *ServerStatus) { s.LastReason = "status 500" }, false},
		{"in maintenance", func(s *ServerStatus) { s.Admin = AdminMaint.String(); s.State = "MAINT" }, false},
		{"never said a role", func(s *ServerStatus) { s.Role = "" }, false},
		{"already up", func(s *ServerStatus) { s.State = "UP" }, false},
	}
	for _, c := range cases {
		s := passive
		if c.mut != nil {
			c.mut(&s)
		}
		if got := standby(s); got != c.want {
			t.Errorf("%s: standby = %v, want %v", c.name, got, c.want)
		}
	}
}
