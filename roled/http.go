package roled

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hapair/hapair/vip"
)

// Status is the JSON of GET /role and the body of GET /ha-health. hapairctl
// decodes it.
type Status struct {
	Node     string          `json:"node"`
	Role     string          `json:"role"` // "active" or "passive", as served right now
	Epoch    int64           `json:"epoch"`
	Since    time.Time       `json:"since"`
	Reason   string          `json:"reason"`
	Patroni  PatroniSummary  `json:"patroni"`
	Postgres PostgresSummary `json:"postgres"`
	Lease    LeaseSummary    `json:"lease"`
	Etcd     EtcdSummary     `json:"etcd"`
	Takeover []TakeoverAlarm `json:"takeover_alarms"`
	Sync     any             `json:"sync,omitempty"`
	VIP      *vip.Status     `json:"vip,omitempty"` // the floating address, when configured
	// Readiness: could this node take over now (readiness.go)?
	Readiness   Readiness    `json:"readiness"`
	StuckLeader *StuckLeader `json:"stuck_leader,omitempty"`
}

// PatroniSummary is the local Patroni as last seen.
type PatroniSummary struct {
	Role     string `json:"role"`
	State    string `json:"state"`
	Timeline int64  `json:"timeline"`
	LagBytes int64  `json:"lag_bytes"`
	Primary  bool   `json:"primary"`
	Code     int    `json:"code"`
	Error    string `json:"error,omitempty"`
}

// PostgresSummary is the local PostgreSQL as last checked.
type PostgresSummary struct {
	Checked    bool   `json:"checked"`
	InRecovery bool   `json:"in_recovery"`
	Error      string `json:"error,omitempty"`
	// Durability is roled's durability setting (async, sync, sync-strict).
	Durability string `json:"durability,omitempty"`
	// Commits is the commit canary (nil when it is off).
	Commits *CommitSummary `json:"commits,omitempty"`
	// Fence is the database fence (nil without postgres.fence.roles).
	Fence *FenceStatus `json:"fence,omitempty"`
	// RewindHold is the rewind hold (nil without postgres.fence.rewind-role).
	RewindHold *RewindHoldStatus `json:"rewind_hold,omitempty"`
}

// LeaseSummary is the fencing lease.
type LeaseSummary struct {
	ID                  string  `json:"id"`
	TTLSeconds          float64 `json:"ttl_seconds"`
	KeepAliveAgeSeconds float64 `json:"keepalive_age_seconds"`
	DeadlineInSeconds   float64 `json:"deadline_in_seconds"`
}

// EtcdSummary is the etcd view.
type EtcdSummary struct {
	Leader          string  `json:"leader"` // member named by Patroni's leader key
	LeaderCreateRev int64   `json:"leader_create_revision"`
	LeaderVersion   int64   `json:"leader_version"`
	ActiveNode      string  `json:"active_node"`
	ActiveEpoch     int64   `json:"active_epoch"`
	ReadAgeSeconds  float64 `json:"read_age_seconds"`
	Revision        int64   `json:"revision"`
}

// Status returns the current status. It reads only atomics.
func (d *Daemon) Status() Status {
	s := d.snap.Load()
	active, epoch := d.activeNow()
	l, ev, lv := d.lease.Load(), d.etcdView.Load(), d.localView.Load()
	now := d.now()
	st := Status{Node: d.cfg.Node, Role: RolePassive.String(), Epoch: epoch, Since: s.since, Reason: string(s.reason),
		Takeover: append([]TakeoverAlarm(nil), ev.alarms...)}
	if active {
		st.Role = RoleActive.String()
	} else if s.role == RoleActive {
		// Published ACTIVE, but fenced before the state loop has run.
		st.Reason = string(ReasonDeadline)
		if l.id != 0 && now < l.deadline && d.quorumLost(now) {
			st.Reason = string(ReasonQuorumLost)
		}
	}
	p := lv.patroni
	st.Patroni = PatroniSummary{Role: p.Role, State: p.State, Timeline: lv.status.Timeline,
		Primary: p.Primary(), Code: p.Code, Error: p.Err}
	if r := lv.status.Xlog.ReplayedLocation; lv.status.Role == "replica" && ev.optime > r && r > 0 {
		st.Patroni.LagBytes = ev.optime - r
	}
	pg := lv.postgres
	st.Postgres = PostgresSummary{Checked: !pg.Disabled && p.At > 0, InRecovery: pg.InRecovery, Error: pg.Err,
		Durability: string(d.cfg.Durability), Commits: d.commitSummary(now)}
	if d.fence != nil {
		fs := d.fence.Status()
		st.Postgres.Fence = &fs
	}
	if d.rewind != nil {
		rs := d.rewind.Status()
		st.Postgres.RewindHold = &rs
	}
	st.Lease = LeaseSummary{ID: leaseHex(l.id), TTLSeconds: l.ttl.Seconds(),
		DeadlineInSeconds: (l.deadline - now).Seconds()}
	if l.lastSent > 0 {
		st.Lease.KeepAliveAgeSeconds = (now - l.lastSent).Seconds()
	}
	st.Etcd = EtcdSummary{Leader: ev.leader.Value, LeaderCreateRev: ev.leader.CreateRev, LeaderVersion: ev.leader.Version,
		ActiveNode: ev.activeNode, ActiveEpoch: ev.active.CreateRev, Revision: ev.rev}
	if ev.at > 0 {
		st.Etcd.ReadAgeSeconds = (now - ev.at).Seconds()
	}
	if t := ev.takeover; t != nil && ev.takeoverBlocks(t.Member) && !hasAlarm(ev.alarms, *t) {
		st.Takeover = append(st.Takeover, *t) // seen, not yet written to etcd
	}
	if st.Takeover == nil {
		st.Takeover = []TakeoverAlarm{}
	}
	if d.sync.Status != nil {
		st.Sync = d.sync.Status()
	}
	st.VIP = d.vipStatus()
	st.Readiness, st.StuckLeader = d.readiness()
	return st
}

func hasAlarm(as []TakeoverAlarm, t TakeoverAlarm) bool {
	for _, a := range as {
		if a.sameEvent(t) {
			return true
		}
	}
	return false
}

func (d *Daemon) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/ha-health", d.handleHealth)
	mux.HandleFunc("/role", d.handleRole)
	mux.Handle("/metrics", promhttp.HandlerFor(d.m.reg, promhttp.HandlerOpts{}))
	return mux
}

// handleHealth answers 200 only while ACTIVE and before the local deadline
// (checked here, from atomics, so a resumed process answers 503 before its
// state loop has run).
func (d *Daemon) handleHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	st := d.Status()
	h := w.Header()
	h.Set("X-Hapair-Role", st.Role)
	h.Set("X-Hapair-Epoch", strconv.FormatInt(st.Epoch, 10))
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	code := http.StatusServiceUnavailable
	if st.Role == RoleActive.String() {
		code = http.StatusOK
	}
	w.WriteHeader(code)
	if r.Method == http.MethodGet {
		_ = json.NewEncoder(w).Encode(st)
	}
}

func (d *Daemon) handleRole(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	st := d.Status()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(st)
}

func (d *Daemon) serveHTTP(ctx context.Context) error {
	srv := &http.Server{Handler: d.handler(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 60 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(d.httpLn) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	<-errc
	return nil
}

// heartbeat is the value of nodes/<node>.
type heartbeat struct {
	Node     string         `json:"node"`
	Role     string         `json:"role"`
	Epoch    int64          `json:"epoch"`
	Since    time.Time      `json:"since"`
	Reason   string         `json:"reason"`
	Patroni  PatroniSummary `json:"patroni"`
	Sync     any            `json:"sync,omitempty"`
	Takeover bool           `json:"takeover_alarm"`
	VIP      *vip.Status    `json:"vip,omitempty"`
	Updated  time.Time      `json:"updated"`

	Readiness   Readiness    `json:"readiness"`
	StuckLeader *StuckLeader `json:"stuck_leader,omitempty"`
	// WAL: the primary's WAL end while this node is ACTIVE, for the next
	// ACTIVE's wal_lost_bytes (history_wal.go).
	WAL *WALPosition `json:"wal,omitempty"`
}

// heartbeatLoop writes nodes/<node> on the lease every heartbeat-interval and
// after each role or leader change.
func (d *Daemon) heartbeatLoop(ctx context.Context) error {
	t := time.NewTicker(d.cfg.HeartbeatInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-d.beatNow:
		}
		l := d.lease.Load()
		if l.id == 0 {
			continue
		}
		st := d.Status()
		b, _ := json.Marshal(heartbeat{Node: st.Node, Role: st.Role, Epoch: st.Epoch, Since: st.Since,
			Reason: st.Reason, Patroni: st.Patroni, Sync: st.Sync, VIP: st.VIP,
			Takeover: d.etcdView.Load().takeoverBlocks(d.cfg.member()), Updated: time.Now().UTC(),
			Readiness: st.Readiness, StuckLeader: st.StuckLeader, WAL: d.walPosition(st)})
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := d.cli.Put(tctx, d.nodeKey(), string(b), clientv3.WithLease(clientv3.LeaseID(l.id)))
		cancel()
		if err != nil && !failing && ctx.Err() == nil {
			d.lg.Warn("heartbeat write failed", zap.Error(err))
		}
		failing = err != nil
	}
}
