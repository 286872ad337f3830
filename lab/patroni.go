package lab

import (
	"fmt"
	"strings"

	"github.com/hapair/hapair/budget"
	"github.com/hapair/hapair/roled"
)

// DCS modes for Patroni's etcd3 section.
const (
	// DCSRemote is DESIGN.md §3: each node lists only the two etcd members not
	// on its own host, with use_proxies, so an isolated node cannot read stale
	// "leader = me" from its own minority member.
	DCSRemote = "remote"
	// DCSAll is Patroni 3.0.2's default usage: all three members (LAB.md §6,
	// scenario 6: the old primary overwrites the leader key after a heal).
	DCSAll = "all"
)

// Scope is the Patroni scope (and so /service/<scope>/ in etcd).
const Scope = "hapair"

// patroniConfig renders the Patroni 3.0.2 YAML for data node host. Paths
// follow LAB.md §8: pgpass and socket dir in a postgres-owned run dir, PGDATA
// inside a postgres-owned parent, bin_dir set, locale C.UTF-8.
// dcs holds ttl, loop_wait and retry_timeout in seconds (the budget's);
// durability (Options.Durability) adds synchronous_mode(_strict).
func patroniConfig(host, mode, dataParent, runDir string, dcs budget.PatroniFile, durability string) string {
	var hosts []string
	for _, h := range []string{NodeA, NodeB, Witness} {
		if mode == DCSRemote && h == host {
			continue
		}
		hosts = append(hosts, "    - "+IP(h)+":2379")
	}
	proxies := ""
	if mode == DCSRemote {
		proxies = "  use_proxies: true\n"
	}
	ip := IP(host)
	return fmt.Sprintf(`scope: %[1]s
namespace: /service/
name: %[2]s
log:
  level: INFO
  format: '%%(asctime)s %%(levelname)s: %%(message)s'
restapi:
  listen: 0.0.0.0:8008
  connect_address: %[3]s:8008
etcd3:
  hosts:
%[4]s
%[5]s  protocol: http
bootstrap:
  dcs:
    ttl: %[9]d
    loop_wait: %[10]d
    retry_timeout: %[11]d
    maximum_lag_on_failover: 1048576
    # A node on an older timeline than the cluster's never races for the
    # leader key (Patroni's default is false): without it, scenario 12 saw
    # nodea, still on timeline 1 after a pg_rewind cut short by nodeb's
    # death, promote itself onto timeline 2 again and lose the 249-292
    # writes nodeb had acknowledged there.
    check_timeline: true
%[12]s    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: 'on'
        wal_log_hints: 'on'
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 128MB
        wal_sender_timeout: 5s
        wal_receiver_timeout: 5s
        # A promote must not wait out PostgreSQL's 5 s default (budget.WalRetrieveRetryInterval).
        wal_retrieve_retry_interval: %[13]s
  initdb:
    - encoding: UTF8
    - locale: C.UTF-8
    - data-checksums
    - auth-local: trust
    - auth-host: scram-sha-256
postgresql:
  listen: 0.0.0.0:5432
  connect_address: %[3]s:5432
  data_dir: %[6]s/pgdata
  bin_dir: /usr/lib/postgresql/15/bin
  pgpass: %[7]s/pgpass
  use_unix_socket: true
  authentication:
    superuser: {username: postgres, password: postgres}
    replication: {username: replicator, password: rep-pass}
    rewind: {username: rewind_user, password: rewind-pass}
  pg_hba:
    - local all all trust
    - host replication replicator %[8]s.0/24 scram-sha-256
    - host all all %[8]s.0/24 scram-sha-256
    - host all all 127.0.0.1/32 trust
    - host replication replicator 127.0.0.1/32 scram-sha-256
  parameters:
    unix_socket_directories: %[7]s
    password_encryption: scram-sha-256
tags: {nofailover: false, noloadbalance: false, clonefrom: false, nosync: false}
`, Scope, host, ip, strings.Join(hosts, "\n"), proxies, dataParent, runDir, Subnet, dcs.TTL, dcs.LoopWait, dcs.RetryTimeout, syncModeLines(durability),
		budget.WalRetrieveRetryInterval)
}

// syncModeLines is the bootstrap DCS part of a durability mode (Patroni's
// dynamic settings; the Ansible role PATCHes the same keys on a running
// cluster).
func syncModeLines(durability string) string {
	switch roled.Durability(durability) {
	case roled.DurabilitySync:
		return "    synchronous_mode: true\n"
	case roled.DurabilitySyncStrict:
		return "    synchronous_mode: true\n    synchronous_mode_strict: true\n"
	}
	return ""
}
