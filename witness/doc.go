// Package witness runs one embedded etcd member: the third vote that gives a
// two-node hapair cluster its quorum (role witness), or a data node's own
// member (role member).
//
// A member bootstraps a new cluster from a static list (ModeBootstrap), or
// adds itself to a running one (ModeJoin: MemberAdd through the existing
// members, then start with initial state "existing"). A member whose data
// directory already holds a member just restarts from it, whatever the mode.
//
// A witness keeps a small footprint (backend quota, snapshot count, Go memory
// limit) and, whenever it finds itself raft leader while a data member is
// healthy, moves the leadership there, so writes are served by a data node.
// Data members are all voting members not listed in Config.WitnessNames (a
// witness-role member always counts itself as a witness).
//
// Usage:
//
//	cfg := witness.DefaultConfig()
//	cfg.Name = "witness"
//	// ... URLs, initial-cluster, TLS ...
//	reg := prometheus.NewRegistry()
//	m, err := witness.New(cfg, lg, witness.NewMetrics(reg))
//	if err != nil {
//		return err // a *config.FieldError naming the field
//	}
//	go func() { <-m.Ready(); daemon.Ready() }()
//	return m.Run(ctx) // until ctx is done; returns after etcd is closed
//
// The metrics listener (Config.MetricsListen, default :2381) serves etcd's
// /health, /livez, /readyz and /metrics together with hapair_witness_*.
package witness
