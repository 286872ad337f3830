package lb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// Gatherer, when set before Run, is served on the admin /metrics.
func (l *LB) SetGatherer(g prometheus.Gatherer) {
	l.mu.Lock()
	l.gatherer = g
	l.mu.Unlock()
}

// AdminHandler serves the stats page, JSON, runtime server state and metrics.
func (l *LB) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", l.statsHTML)
	mux.HandleFunc("GET /stats.json", l.statsJSON)
	mux.HandleFunc("POST /servers/{backend}/{server}", l.setServerState)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	l.mu.Lock()
	g, pprofOn := l.gatherer, l.cfg.Admin.Pprof
	l.mu.Unlock()
	if pprofOn {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	if g != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	}
	return mux
}

func (l *LB) serveAdmin(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: l.AdminHandler(), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	l.lg.Info("admin listening", zap.String("addr", ln.Addr().String()))
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Stats is the admin JSON document.
type Stats struct {
	Time     time.Time `json:"time"`
	Backends []Status  `json:"backends"`
	VIP      any       `json:"vip,omitempty"` // *vip.Status of a balancer pair's VIP
	// Banners say, per backend, that nothing can serve it now.
	Banners []string `json:"banners,omitempty"`
}

// Stats returns the state of every backend and server. A server that is
// down only because it said it is PASSIVE is a STANDBY, not a failure.
func (l *LB) Stats() Stats {
	st := Stats{Time: time.Now()}
	if v := l.VIPStatus(); v != nil {
		st.VIP = v
	}
	for _, g := range l.currentGroups() {
		bs := g.Status()
		for i := range bs.Servers {
			if standby(bs.Servers[i]) {
				bs.Servers[i].State = "STANDBY"
			}
		}
		if b := banner(bs, g.cfg); b != "" {
			st.Banners = append(st.Banners, b)
		}
		st.Backends = append(st.Backends, bs)
	}
	return st
}

// standby reports whether a server is down only because its last check was
// a complete answer saying role passive (roled's /ha-health 503 with
// X-Hapair-Role: passive): the node is healthy and waiting, by design. A
// server whose last check failed otherwise (refused, timed out) stays DOWN,
// whatever role it said before.
func standby(s ServerStatus) bool {
	return s.State == "DOWN" && s.Role == "passive" && s.Admin == AdminReady.String() &&
		s.LastReason == (checkResult{status: reasonStatus(s.LastReason), role: "passive"}).reason()
}

// reasonStatus reads the status code back from a check reason ("status 503 …").
func reasonStatus(reason string) int {
	var code int
	if _, err := fmt.Sscanf(reason, "status %d", &code); err != nil {
		return -1
	}
	return code
}

// banner is the page's warning when no server of a backend is eligible:
// what a client gets now.
func banner(bs Status, cfg BackendConfig) string {
	if bs.Eligible > 0 || len(bs.Servers) == 0 {
		return ""
	}
	what := "new requests are answered 503"
	if h := cfg.HoldTimeout; h != nil && *h > 0 {
		what = fmt.Sprintf("new requests are held up to %s, then answered 503 with Retry-After", *h)
	}
	return fmt.Sprintf("NOTHING CAN SERVE %s: no server is eligible (%d waiting); %s", bs.Name, bs.Waiting, what)
}

func (l *LB) statsJSON(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(l.Stats())
}

// setServerState handles POST /servers/<backend>/<server>?state=ready|drain|maint.
func (l *LB) setServerState(w http.ResponseWriter, r *http.Request) {
	state, ok := ParseAdminState(r.FormValue("state"))
	if !ok {
		http.Error(w, "state must be ready, drain or maint", http.StatusBadRequest)
		return
	}
	if err := l.SetServerState(r.PathValue("backend"), r.PathValue("server"), state); err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// SetServerState changes a server's runtime admin state.
func (l *LB) SetServerState(backend, server string, st AdminState) error {
	g := l.Group(backend)
	if g == nil {
		return errors.New("no such backend")
	}
	s := g.server(server)
	if s == nil {
		return errors.New("no such server")
	}
	old := AdminState(s.admin.Swap(uint32(st)))
	s.mu.Lock()
	s.lastReason = "admin: " + st.String()
	s.lastChange = time.Now()
	s.mu.Unlock()
	l.lg.Info("server admin state changed", zap.String("backend", backend), zap.String("server", server),
		zap.Stringer("from", old), zap.Stringer("to", st))
	g.recompute("admin " + st.String())
	if st == AdminMaint {
		s.killSessions() // maint also ends sessions that were drained
	}
	return nil
}

var statsPage = template.Must(template.New("stats").Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>hapair-lb</title>
<meta http-equiv="refresh" content="2">
<style>body{font-family:sans-serif}table{border-collapse:collapse;margin-bottom:1.5em}
td,th{border:1px solid #999;padding:2px 8px;font-size:90%}th{background:#ddd}
.UP{background:#bfb}.DOWN{background:#fbb}.STANDBY{background:#eee}.DRAIN{background:#ffb}.MAINT{background:#bbf}
.banner{background:#c00;color:#fff;font-weight:bold;padding:6px 10px;margin:8px 0}</style>
</head><body><h1>hapair-lb</h1><p>{{.Time.Format "2006-01-02 15:04:05 MST"}}</p>
{{range .Banners}}<p class="banner">{{.}}</p>
{{end}}{{range .Backends}}<h2>{{.Name}} <small>({{.Kind}}, {{.Eligible}} eligible, {{.Waiting}} waiting{{with .Key}}, etcd key: {{if .Known}}{{if .Node}}{{.Node}} epoch {{.Epoch}}{{else}}absent{{end}}{{else}}unknown{{end}}{{end}})</small></h2>
<table><tr><th>server</th><th>address</th><th>state</th><th>admin</th><th>check</th><th>last reason</th><th>last change</th><th>epoch</th><th>active</th><th>requests</th><th>errors</th></tr>
{{range .Servers}}<tr class="{{.State}}"><td>{{.Name}}</td><td>{{.Address}}</td><td>{{.State}}</td><td>{{.Admin}}</td><td>{{.Check}}</td><td>{{.LastReason}}</td><td>{{.LastChange.Format "15:04:05.000"}}</td><td>{{.Epoch}}</td><td>{{.Active}}</td><td>{{.Requests}}</td><td>{{.Errors}}</td></tr>
{{end}}</table>{{end}}
<p>JSON: <a href="stats.json">stats.json</a> · <a href="metrics">metrics</a> · set state: <code>curl -XPOST 'http://ADMIN/servers/BACKEND/SERVER?state=drain'</code></p>
</body></html>`))

func (l *LB) statsHTML(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = statsPage.Execute(w, l.Stats())
}
