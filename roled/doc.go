// Package roled decides whether the application on this data node is ACTIVE
// or PASSIVE, and makes "never two ACTIVE nodes" true (DESIGN.md section 2).
//
// A node is ACTIVE only while all hold: its local Patroni claims the primary
// (GET /primary 200, role master/primary, running); its PostgreSQL answers
// and pg_is_in_recovery() is false; Patroni's leader key in etcd names its
// member (linearizable read, and compared again inside the acquiring
// transaction); no unacknowledged takeover alarm names it; and it holds the
// active key <prefix>active on its live lease, before its local deadline.
// The epoch is the active key's CreateRevision.
//
// The local deadline is the monotonic time the last successful keep-alive
// was sent, plus the lease TTL, minus a safety margin. /ha-health, the
// agent-check, the marker write and the file sync's ActiveEpoch all check it
// themselves, so a process resumed after SIGSTOP answers PASSIVE at once.
//
// The decision is the pure function decide; one goroutine (stateLoop) owns
// the role and performs the transitions in DESIGN.md's order:
//
//	to ACTIVE:  take key (txn) -> on_active -> marker -> serve 200 -> start sync sender
//	to PASSIVE: serve 503 -> stop sync sender -> remove marker -> delete key -> on_passive
//
// Usage:
//
//	reg := prometheus.NewRegistry()
//	d, err := roled.New(cfg, lg, roled.NewMetrics(reg)) // binds the listeners
//	if err != nil { ... }
//	d.SetSync(roled.SyncHooks{SetActive: s.SetActive, SetPassive: s.SetPassive})
//	err = d.Run(ctx) // until ctx is done; steps down and revokes the lease first
//
// Keys (prefix default /hapair/<cluster>/): active (JSON {"node","since"}, on
// the lease), nodes/<node> (heartbeat, on the lease), alarm/takeover/<member>
// (no lease; hapairctl ack marks it acknowledged).
package roled
