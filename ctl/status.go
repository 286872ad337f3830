package ctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/hapair/hapair/roled"
)

// Status is the whole cluster as hapairctl sees it (hapairctl status --json).
type Status struct {
	Time       time.Time       `json:"time"`
	Redundancy Redundancy      `json:"redundancy"`
	LeaderRepl []Replication   `json:"patroni_leader_replication,omitempty"`
	Etcd       []EtcdMember    `json:"etcd"`
	EtcdErr    string          `json:"etcd_error,omitempty"`
	Active     *ActiveKey      `json:"active,omitempty"`
	Leader     *LeaderKey      `json:"patroni_leader_key,omitempty"`
	Alarms     []Alarm         `json:"takeover_alarms"`
	Patroni    []PatroniMember `json:"patroni"`
	Roled      []RoledNode     `json:"roled"`
	Backends   []LBServer      `json:"balancer"`
	LBErr      string          `json:"balancer_error,omitempty"`
}

// EtcdMember is one etcd member's health.
type EtcdMember struct {
	Name     string `json:"name"`
	Endpoint string `json:"endpoint"`
	Healthy  bool   `json:"healthy"`
	Leader   bool   `json:"leader"`
	Witness  bool   `json:"witness"`
	RaftTerm uint64 `json:"raft_term,omitempty"`
	Error    string `json:"error,omitempty"`
}

// ActiveKey is /hapair/<cluster>/active.
type ActiveKey struct {
	Node  string `json:"node"`
	Since string `json:"since"`
	Epoch int64  `json:"epoch"`
}

// LeaderKey is Patroni's leader key; Version > 1 with a changed value is
// Patroni 3.0.2's takeover signature.
type LeaderKey struct {
	Member         string `json:"member"`
	CreateRevision int64  `json:"create_revision"`
	Version        int64  `json:"version"`
}

// Alarm is one takeover alarm key.
type Alarm struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Acked reports whether an operator acknowledged the alarm (hapairctl ack):
// the key stays until Patroni re-creates its leader key, but it no longer
// holds anything back.
func (a Alarm) Acked() bool { return a.fields().Acked }

// alarmFields is the part of roled.TakeoverAlarm status reads.
type alarmFields struct {
	Acked       bool      `json:"acked"`
	AckedBy     string    `json:"acked_by"`
	AutoAcked   bool      `json:"auto_acked"`
	Guard       string    `json:"guard"`
	GuardDetail string    `json:"guard_detail"`
	DetectedAt  time.Time `json:"detected_at"`
}

// Guard is the takeover guard's verdict written into the alarm ("" before
// roled wrote one).
func (a Alarm) Guard() string { return a.fields().Guard }

// Members returns the Patroni member that took the key and the one whose
// key it took.
func (a Alarm) Members() (taker, previous string) {
	var v struct {
		Member   string `json:"member"`
		Previous string `json:"previous_value"`
	}
	_ = json.Unmarshal([]byte(a.Value), &v)
	return v.Member, v.Previous
}

// AutoAcked reports whether roled acknowledged the alarm itself, having
// proved that nothing the other node acknowledged is lost.
func (a Alarm) AutoAcked() bool { return a.fields().AutoAcked }

// DetectedAt is when a roled raised the alarm (zero if unreadable).
func (a Alarm) DetectedAt() time.Time { return a.fields().DetectedAt }

func (a Alarm) fields() alarmFields {
	var v alarmFields
	_ = json.Unmarshal([]byte(a.Value), &v)
	return v
}

// PatroniMember is one row of Patroni's /cluster.
type PatroniMember struct {
	Name     string `json:"name"`
	Role     string `json:"role"`
	State    string `json:"state"`
	Timeline int64  `json:"timeline"`
	Lag      any    `json:"lag,omitempty"`
}

// RoledNode is roled's /role answer (the fields hapairctl shows).
type RoledNode struct {
	Node     string            `json:"node"`
	Role     string            `json:"role"`
	Epoch    int64             `json:"epoch"`
	Since    time.Time         `json:"since"`
	Reason   string            `json:"reason"`
	Takeover []json.RawMessage `json:"takeover_alarms"`
	Sync     struct {
		Sending          bool    `json:"sending"`
		QueueDepth       int     `json:"queue_depth"`
		LagSeconds       float64 `json:"lag_seconds"`
		QuarantinedTotal uint64  `json:"quarantined_total"`
		LastError        string  `json:"last_error"`
		// LastErrorAt and LastReconcile tell a past error from a current
		// one: a full reconcile after it means the peer is in sync again.
		LastErrorAt   *time.Time `json:"last_error_at,omitempty"`
		LastReconcile *time.Time `json:"last_reconcile,omitempty"`
	} `json:"sync"`
	// VIP is the floating address of roled's vip section, nil without one.
	VIP *struct {
		Interface string   `json:"interface"`
		Addresses []string `json:"addresses"`
		Held      []string `json:"held"`
	} `json:"vip,omitempty"`
	// Readiness and StuckLeader are roled's own (nil from a roled that does
	// not publish them).
	Readiness   *roled.Readiness   `json:"readiness,omitempty"`
	StuckLeader *roled.StuckLeader `json:"stuck_leader,omitempty"`
	// Postgres carries the commit canary and the database fence (issue 19).
	Postgres *struct {
		Durability string                  `json:"durability,omitempty"`
		Commits    *roled.CommitSummary    `json:"commits,omitempty"`
		Fence      *roled.FenceStatus      `json:"fence,omitempty"`
		RewindHold *roled.RewindHoldStatus `json:"rewind_hold,omitempty"`
	} `json:"postgres,omitempty"`
	Error string `json:"error,omitempty"`
}

// LBServer is one server of the balancer's active-passive backend.
type LBServer struct {
	Backend    string    `json:"backend"`
	Name       string    `json:"name"`
	State      string    `json:"state"`
	Eligible   bool      `json:"eligible"`
	Epoch      int64     `json:"epoch"`
	LastReason string    `json:"last_reason"`
	LastChange time.Time `json:"last_change"`
	Requests   uint64    `json:"requests"`
}

// Status gathers everything in parallel; unreachable parts show as errors,
// never abort the table.
func (c *Client) Status(ctx context.Context) Status {
	st := Status{Time: time.Now()}
	var g errgroup.Group
	g.Go(func() error { c.etcdStatus(ctx, &st); return nil })
	g.Go(func() error {
		st.Patroni = c.patroniCluster(ctx)
		st.LeaderRepl = c.leaderReplication(ctx, st.Patroni)
		return nil
	})
	g.Go(func() error { st.Roled = c.roledAll(ctx); return nil })
	g.Go(func() error { st.Backends, st.LBErr = c.lbServers(ctx); return nil })
	_ = g.Wait()
	st.Redundancy = c.assess(st)
	return st
}

// assess decides the headline from the snapshot st (no further reads).
func (c *Client) assess(st Status) Redundancy {
	r := assess(st, c.Cfg.Nodes, c.Cfg.LB.Backend, StandbyNotMember, "")
	if r.Level == NotServing {
		return r
	}
	// The standby is the configured node that is not ACTIVE.
	for _, n := range c.Cfg.Nodes {
		if n.Name == r.Active {
			continue
		}
		v := StandbyView{Members: st.Patroni, LeaderRepl: st.LeaderRepl, MaxLag: c.Cfg.Drill.MaxLag}
		var mine *RoledNode
		for i, rn := range st.Roled {
			if rn.Node == n.Name && n.RoledURL != "" {
				v.RoledRole, mine = rn.Role, &st.Roled[i]
			}
		}
		if mine != nil {
			if reason, detail, ok := roledReadiness(*mine); ok {
				if reason != StandbyReady && !mine.Readiness.Since.IsZero() {
					detail += fmt.Sprintf(", for %.1f s", st.Time.Sub(mine.Readiness.Since).Seconds())
				}
				return assess(st, c.Cfg.Nodes, c.Cfg.LB.Backend, reason, detail)
			}
		}
		reason, detail := standbyReady(v, n.Member())
		return assess(st, c.Cfg.Nodes, c.Cfg.LB.Backend, reason, detail)
	}
	return r
}

func (c *Client) etcdStatus(ctx context.Context, st *Status) {
	cli, err := c.Etcd()
	if err != nil {
		st.EtcdErr = err.Error()
		return
	}
	defer cli.Close()
	lctx, cancel := context.WithTimeout(ctx, c.Cfg.Timeout)
	ml, err := cli.MemberList(lctx)
	cancel()
	if err != nil {
		st.EtcdErr = "member list: " + err.Error()
	} else {
		// Each member is asked on its own, with its own timeout: a dead
		// member must not use up the others' time and make them look
		// unhealthy.
		st.Etcd = make([]EtcdMember, len(ml.Members))
		var g errgroup.Group
		for i, m := range ml.Members {
			em := &st.Etcd[i]
			*em = EtcdMember{Name: m.Name, Witness: slices.Contains(c.Cfg.WitnessNames, m.Name)}
			if len(m.ClientURLs) == 0 {
				em.Error = "no client URL (not started yet?)"
				continue
			}
			em.Endpoint = m.ClientURLs[0]
			g.Go(func() error {
				mctx, cancel := context.WithTimeout(ctx, c.Cfg.Timeout)
				defer cancel()
				if s, err := cli.Status(mctx, em.Endpoint); err != nil {
					em.Error = err.Error()
				} else {
					em.Healthy = len(s.Errors) == 0
					em.Leader = s.Leader == m.ID
					em.RaftTerm = s.RaftTerm
					if !em.Healthy {
						em.Error = strings.Join(s.Errors, "; ")
					}
				}
				return nil
			})
		}
		_ = g.Wait()
		sort.Slice(st.Etcd, func(i, j int) bool { return st.Etcd[i].Name < st.Etcd[j].Name })
	}
	kctx, cancel := context.WithTimeout(ctx, c.Cfg.Timeout)
	defer cancel()
	c.readKeys(kctx, cli, st)
}

func (c *Client) readKeys(ctx context.Context, cli *clientv3.Client, st *Status) {
	if r, err := cli.Get(ctx, c.Cfg.Prefix()+"active"); err == nil && len(r.Kvs) == 1 {
		var a ActiveKey
		_ = json.Unmarshal(r.Kvs[0].Value, &a)
		a.Epoch = r.Kvs[0].CreateRevision
		st.Active = &a
	}
	if r, err := cli.Get(ctx, c.Cfg.LeaderKey()); err == nil && len(r.Kvs) == 1 {
		kv := r.Kvs[0]
		st.Leader = &LeaderKey{Member: string(kv.Value), CreateRevision: kv.CreateRevision, Version: kv.Version}
	}
	if r, err := cli.Get(ctx, c.Cfg.Prefix()+"alarm/", clientv3.WithPrefix()); err == nil {
		for _, kv := range r.Kvs {
			st.Alarms = append(st.Alarms, Alarm{Key: string(kv.Key), Value: string(kv.Value)})
		}
	}
}

func (c *Client) getJSON(ctx context.Context, url string, v any) error {
	return getJSONVia(ctx, c.HTTP, url, v)
}

// getPatroniJSON reads Patroni's REST API (through patroni-tls).
func (c *Client) getPatroniJSON(ctx context.Context, url string, v any) error {
	return getJSONVia(ctx, c.Patroni, url, v)
}

func getJSONVia(ctx context.Context, hc *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(v)
}

func (c *Client) patroniCluster(ctx context.Context) []PatroniMember {
	for _, n := range c.Cfg.Nodes {
		var cl struct {
			Members []PatroniMember `json:"members"`
		}
		if err := c.getPatroniJSON(ctx, strings.TrimSuffix(n.PatroniURL, "/")+"/cluster", &cl); err == nil {
			return cl.Members
		}
	}
	return nil
}

// Roled reads one node's /role.
func (c *Client) Roled(ctx context.Context, n Node) RoledNode {
	var r RoledNode
	if n.RoledURL == "" {
		return RoledNode{Node: n.Name, Role: "n/a", Error: "roled-url not configured"}
	}
	if err := c.getJSON(ctx, strings.TrimSuffix(n.RoledURL, "/")+"/role", &r); err != nil {
		return RoledNode{Node: n.Name, Role: "unknown", Error: err.Error()}
	}
	return r
}

func (c *Client) roledAll(ctx context.Context) []RoledNode {
	out := make([]RoledNode, len(c.Cfg.Nodes))
	var g errgroup.Group
	for i, n := range c.Cfg.Nodes {
		g.Go(func() error { out[i] = c.Roled(ctx, n); return nil })
	}
	_ = g.Wait()
	return out
}

// LBServers reads the balancer's servers ("" or the error text).
func (c *Client) LBServers(ctx context.Context) ([]LBServer, string) { return c.lbServers(ctx) }

func (c *Client) lbServers(ctx context.Context) ([]LBServer, string) {
	if c.Cfg.LB.AdminURL == "" {
		return nil, "lb.admin-url not configured"
	}
	var stats struct {
		Backends []struct {
			Name    string     `json:"name"`
			Servers []LBServer `json:"servers"`
		} `json:"backends"`
	}
	if err := c.getJSON(ctx, strings.TrimSuffix(c.Cfg.LB.AdminURL, "/")+"/stats.json", &stats); err != nil {
		return nil, err.Error()
	}
	var out []LBServer
	for _, b := range stats.Backends {
		for _, s := range b.Servers {
			s.Backend = b.Name
			out = append(out, s)
		}
	}
	return out, ""
}

// Serving returns the server names of the active-passive backend the
// balancer would send a request to now.
func (s Status) Serving(backend string) []string {
	var out []string
	for _, b := range s.Backends {
		if b.Backend == backend && b.Eligible {
			out = append(out, b.Name)
		}
	}
	return out
}

// WriteTable renders the status as the operator's table.
func (s Status) WriteTable(w io.Writer) error {
	fmt.Fprintln(w, s.Redundancy.Line())
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ETCD MEMBER\tENDPOINT\tHEALTH\tLEADER\tWITNESS")
	if s.EtcdErr != "" {
		fmt.Fprintf(tw, "(error)\t%s\t\t\t\n", s.EtcdErr)
	}
	for _, m := range s.Etcd {
		h := "healthy"
		if !m.Healthy {
			h = "UNHEALTHY " + m.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Name, m.Endpoint, h, yes(m.Leader), yes(m.Witness))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PATRONI MEMBER\tROLE\tSTATE\tTIMELINE\tLAG")
	for _, p := range s.Patroni {
		lag := "-"
		if p.Lag != nil {
			lag = fmtLag(p.Lag)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", p.Name, p.Role, p.State, p.Timeline, lag)
	}
	if s.Leader != nil {
		fmt.Fprintf(tw, "leader key\t%s\tcreate_rev=%d\tversion=%d\t\n", s.Leader.Member, s.Leader.CreateRevision, s.Leader.Version)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ROLED NODE\tROLE\tEPOCH\tSINCE\tSYNC LAG\tQUARANTINED\tALARM\tREADY TO TAKE OVER")
	for _, r := range s.Roled {
		since := "-"
		if !r.Since.IsZero() {
			since = r.Since.Format(time.RFC3339)
		}
		role := strings.ToUpper(r.Role)
		if r.Error != "" {
			role = "unreachable"
		}
		alarm := "-"
		if len(r.Takeover) > 0 {
			alarm = fmt.Sprintf("TAKEOVER (%d)", len(r.Takeover))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.1fs\t%d\t%s\t%s\n", r.Node, role, r.Epoch, since, r.Sync.LagSeconds,
			r.Sync.QuarantinedTotal, alarm, readyCell(r))
	}
	for _, r := range s.Roled {
		if line := durabilityLine(r); line != "" {
			fmt.Fprintf(tw, "postgres\t%s\t\t\t\t\t\t\n", line)
		}
	}
	for _, r := range s.Roled {
		if r.VIP != nil && len(r.VIP.Held) > 0 {
			fmt.Fprintf(tw, "vip\t%s\ton %s (%s)\t\t\t\t\n", strings.Join(r.VIP.Held, " "), r.Node, r.VIP.Interface)
		}
	}
	if s.Active != nil {
		fmt.Fprintf(tw, "active key\t%s\t%d\t%s\t\t\t\t\n", s.Active.Node, s.Active.Epoch, s.Active.Since)
	} else {
		fmt.Fprintln(tw, "active key\t(none)\t\t\t\t\t\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, a := range s.Alarms {
		f := a.fields()
		switch {
		case f.AutoAcked:
			fmt.Fprintf(w, "ALARM %s acknowledged by %s itself: %s (the key goes when Patroni re-creates its leader key)\n", a.Key, f.AckedBy, f.GuardDetail)
		case f.Acked:
			fmt.Fprintf(w, "ALARM %s acknowledged %s (the key goes when Patroni re-creates its leader key)\n", a.Key, a.Value)
		case f.Guard != "":
			fmt.Fprintf(w, "ALARM %s %s\n  held for a person, roled cannot prove nothing is lost: %s: %s (after checking the data: hapairctl ack)\n",
				a.Key, a.Value, f.Guard, f.GuardDetail)
		default:
			fmt.Fprintf(w, "ALARM %s %s (after checking the data: hapairctl ack)\n", a.Key, a.Value)
		}
	}
	for _, n := range s.Roled {
		if n.Postgres != nil && n.Postgres.RewindHold != nil && n.Postgres.RewindHold.State == roled.RewindHoldSet {
			fmt.Fprintf(w, "REWIND HOLD on %s: Patroni's rewind user %q cannot log in there while the takeover alarm is held, so the other node keeps what it wrote (not rewound; its PostgreSQL stays up read-only) until you decide: `hapairctl ack` keeps %s and lets the rewind go ahead\n",
				n.Node, n.Postgres.RewindHold.Role, n.Node)
		}
	}
	for _, sl := range s.Redundancy.Stuck {
		fmt.Fprintf(w, "STUCK LEADER %s\n  remedy: %s\n", sl.Text(), sl.Remedy)
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BALANCER BACKEND\tSERVER\tSTATE\tSERVING\tEPOCH\tLAST CHANGE\tREASON")
	if s.LBErr != "" {
		fmt.Fprintf(tw, "(error)\t%s\t\t\t\t\t\n", s.LBErr)
	}
	for _, b := range s.Backends {
		lc := "-"
		if !b.LastChange.IsZero() {
			lc = b.LastChange.Format("15:04:05.000")
		}
		state := b.State
		if !b.Eligible && s.passive(b.Name) {
			// The PASSIVE node answers 503 on purpose: a standby, not a failure.
			state = "STANDBY"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", b.Backend, b.Name, state, yes(b.Eligible), b.Epoch, lc, b.LastReason)
	}
	return tw.Flush()
}

// durabilityLine reports what needs a person's eye: commits that hang on a
// node's primary, a database fence set or still pending. "" otherwise.
func durabilityLine(r RoledNode) string {
	p := r.Postgres
	if r.Error != "" || p == nil {
		return ""
	}
	var parts []string
	if c := p.Commits; c != nil && c.Hung {
		s := fmt.Sprintf("COMMITS HANG on %s for %.1f s (durability %s)", r.Node, c.HungForSeconds, p.Durability)
		if c.HoldsRole {
			s += ", held PASSIVE"
		}
		parts = append(parts, s)
	}
	if f := p.Fence; f != nil {
		switch f.State {
		case roled.FenceSet:
			parts = append(parts, fmt.Sprintf("db fence set on %s (%s read-only, %.2f s after leaving ACTIVE)",
				r.Node, strings.Join(f.Roles, ", "), f.SetAfterSeconds))
		case roled.FencePending:
			parts = append(parts, fmt.Sprintf("DB FENCE PENDING on %s (%d attempts: %s)", r.Node, f.Attempts, f.Error))
		}
	}
	return strings.Join(parts, "; ")
}

// readyCell is roled's own readiness for the table: "yes", the reason with
// its lag, or "-" where roled publishes none (ACTIVE, older roled).
func readyCell(r RoledNode) string {
	rd := r.Readiness
	switch {
	case r.Error != "" || rd == nil || rd.Reason == roled.StandbyIsActive:
		return "-"
	case rd.Ready:
		return fmt.Sprintf("yes (lag %s, %.1f s)", fmtLag(float64(rd.LagBytes)), rd.LagSeconds)
	}
	return "no: " + rd.Text()
}

// passive reports whether roled on node says PASSIVE (and was reachable).
func (s Status) passive(node string) bool {
	for _, r := range s.Roled {
		if r.Node == node {
			return r.Role == "passive" && r.Error == ""
		}
	}
	return false
}

// fmtLag shows Patroni's lag (bytes, or "unknown") with its unit.
func fmtLag(v any) string {
	b, ok := lagBytes(v)
	switch {
	case !ok:
		return fmt.Sprint(v)
	case b < 1<<10:
		return fmt.Sprintf("%d B", b)
	case b < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "-"
}
