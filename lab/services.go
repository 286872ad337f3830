package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hapair/hapair/budget"
	"github.com/hapair/hapair/roled"
)

// Process names, as used in pid and log file names.
const (
	ProcEtcd    = "etcd"
	ProcPatroni = "patroni"
	ProcRoled   = "roled"
	ProcApp     = "app"
	ProcLB      = "lb"
)

// DataNodes are the two hosts running PostgreSQL.
var DataNodes = []string{NodeA, NodeB}

// EtcdHosts are the three etcd members' hosts.
var EtcdHosts = []string{NodeA, NodeB, Witness}

// Other returns the other data node.
func Other(node string) string {
	if node == NodeA {
		return NodeB
	}
	return NodeA
}

func etcdCluster() string {
	var p []string
	for _, h := range EtcdHosts {
		p = append(p, h+"=http://"+IP(h)+":2380")
	}
	return strings.Join(p, ",")
}

// EtcdEndpoints are the client URLs of the three members.
func EtcdEndpoints() []string {
	var e []string
	for _, h := range EtcdHosts {
		e = append(e, "http://"+IP(h)+":2379")
	}
	return e
}

// startEtcd runs host's etcd member: hapair-witness when it was built, else
// the lab's embedded fallback member.
func (l *Lab) startEtcd(host string) error {
	dataDir := l.path(host, "etcd")
	state := "new"
	if _, err := os.Stat(dataDir + "/member"); err == nil {
		state = "existing"
	}
	if w := l.Bin(BinWitness); w != "" {
		cfg, err := l.witnessConfig(host, dataDir, state)
		if err == nil {
			_, err = l.Spawn(host, ProcEtcd, baseEnv(), w, "--config", cfg)
			return err
		}
		l.logf("%v; using the lab's embedded etcd member", err)
	}
	_, err := l.Spawn(host, ProcEtcd, baseEnv(), l.Opt.SelfExe, "etcd", "-name", host, "-data-dir", dataDir,
		"-ip", IP(host), "-initial-cluster", etcdCluster(), "-initial-cluster-state", state)
	return err
}

// patroniBin is Options.Patroni, or Debian's for a lab made before it.
func (l *Lab) patroniBin() string {
	if l.Opt.Patroni != "" {
		return l.Opt.Patroni
	}
	return DefaultPatroni
}

// startPatroni runs Patroni as postgres, with LAB.md §8's environment.
func (l *Lab) startPatroni(host string) error {
	cfgPath := l.path(host, "patroni.yml")
	cfg := patroniConfig(host, l.Opt.DCSMode, l.path(host, "pg"), l.path(host, "pgrun"), budget.FileOf(0, l.timers()).Patroni, l.Opt.Durability)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	env := append(baseEnv(), "HOME=/var/lib/postgresql", "USER=postgres", "LOGNAME=postgres")
	_, err := l.Spawn(host, ProcPatroni, env, "setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups",
		l.patroniBin(), cfgPath)
	return err
}

func (l *Lab) startApp(host string) error {
	_, err := l.Spawn(host, ProcApp, baseEnv(), l.Opt.SelfExe, "app", "-node", host,
		"-dir", l.path(host, "files"), "-marker", l.path(host, "state", "active"),
		"-local-writer-log", l.path(host, "state", LocalWriterLog))
	return err
}

// startRoled runs roled (with syncdir) when it was built.
func (l *Lab) startRoled(host string) error {
	bin := l.Bin(BinRoled)
	if bin == "" {
		return nil
	}
	cfg, err := l.roledConfig(host)
	if err != nil {
		return err
	}
	_, err = l.Spawn(host, ProcRoled, baseEnv(), bin, "--config", cfg)
	return err
}

// startLB runs hapair-lb on host (LB, or LB2 of the pair) when it was
// built, and keepalived beside it when keepalived holds the VIPs.
func (l *Lab) startLB(host string) error {
	bin := l.Bin(BinLB)
	if bin == "" {
		return nil
	}
	cfg, err := l.lbConfig(host)
	if err != nil {
		return err
	}
	if _, err = l.Spawn(host, ProcLB, baseEnv(), bin, "--config", cfg); err != nil {
		return err
	}
	return l.startKeepalived(host)
}

// balancers are the hosts that run hapair-lb: LB, and with Options.VIP the
// pair's LB2 (issue 20's balancer pair behind LBVIPAddr).
func (l *Lab) balancers() []string {
	if l.Opt.VIP {
		return []string{LB, LB2}
	}
	return []string{LB}
}

// Up creates the lab and starts everything, in LAB.md's order: etcd, the
// primary's Patroni, the replica's Patroni, then roled, the app and the lb.
func (l *Lab) Up(ctx context.Context) error {
	t0 := time.Now()
	if err := l.Create(); err != nil {
		return err
	}
	l.logf("lab %s: namespaces up (%s), state in %s", l.Opt.Tag, time.Since(t0).Round(time.Millisecond), l.Dir)
	if l.beforeServices != nil {
		if err := l.beforeServices(); err != nil {
			return err
		}
	}
	if m := l.Missing(); len(m) > 0 {
		l.logf("not built, running without: %s", strings.Join(m, ", "))
	}
	if err := l.writeCtlConfig(); err != nil {
		return err
	}
	for _, h := range EtcdHosts {
		if err := l.startEtcd(h); err != nil {
			return err
		}
	}
	if !poll(ctx, 60*time.Second, 100*time.Millisecond, l.etcdHealthy) {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted: %w", ctx.Err())
		}
		return fmt.Errorf("etcd not healthy after 60s (logs: %s)", l.path("log"))
	}
	l.logf("etcd healthy (%s)", time.Since(t0).Round(time.Millisecond))
	if err := l.startPatroni(NodeA); err != nil {
		return err
	}
	if !l.waitPatroni(ctx, NodeA, "/primary", 90*time.Second) {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted: %w", ctx.Err())
		}
		return fmt.Errorf("nodea never became Patroni primary (log %s)", l.path("log", "nodea.patroni.log"))
	}
	l.logf("nodea Patroni primary (%s)", time.Since(t0).Round(time.Millisecond))
	if err := l.startPatroni(NodeB); err != nil {
		return err
	}
	if !l.waitPatroni(ctx, NodeB, "/replica", 90*time.Second) {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted: %w", ctx.Err())
		}
		return fmt.Errorf("nodeb never became Patroni replica (log %s)", l.path("log", "nodeb.patroni.log"))
	}
	l.logf("nodeb Patroni replica (%s)", time.Since(t0).Round(time.Millisecond))
	for _, h := range DataNodes {
		if err := l.startApp(h); err != nil {
			return err
		}
		if err := l.startRoled(h); err != nil {
			return err
		}
		if err := l.startKeepalived(h); err != nil {
			return err
		}
	}
	for _, h := range l.balancers() {
		if err := l.startLB(h); err != nil {
			return err
		}
	}
	if err := l.WaitSettled(ctx, NodeA, 60*time.Second); err != nil {
		return err
	}
	l.logf("lab ready in %s: nodea primary+ACTIVE, nodeb replica+PASSIVE", time.Since(t0).Round(time.Millisecond))
	return nil
}

func (l *Lab) etcdHealthy() bool {
	for _, h := range EtcdHosts {
		if l.httpCode(Client, "http://"+IP(h)+":2379/health", time.Second) != 200 {
			return false
		}
	}
	return true
}

func (l *Lab) waitPatroni(ctx context.Context, host, path string, timeout time.Duration) bool {
	dead := false
	ok := poll(ctx, timeout, 200*time.Millisecond, func() bool {
		if _, alive := l.PID(host, ProcPatroni); !alive {
			dead = true
			return true
		}
		return l.httpCode(Client, "http://"+IP(host)+":8008"+path, time.Second) == 200
	})
	if dead {
		l.logf("Patroni on %s exited:\n%s", host, l.logTail(host, ProcPatroni, 2000))
		return false
	}
	return ok
}

// WaitSettled waits until primary is Patroni primary (and ACTIVE, when roled
// runs), the other node a streaming replica (and PASSIVE), the app answers on
// both, and the lb (when it runs) serves from primary.
func (l *Lab) WaitSettled(ctx context.Context, primary string, timeout time.Duration) error {
	var last string
	ok := poll(ctx, timeout, 200*time.Millisecond, func() bool {
		last = l.settledProblem(primary)
		return last == ""
	})
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
	if !ok {
		return fmt.Errorf("lab not settled with %s primary after %s: %s", primary, timeout, last)
	}
	return nil
}

func (l *Lab) settledProblem(primary string) string {
	replica := Other(primary)
	if l.httpCode(Client, "http://"+IP(primary)+":8008/primary", time.Second) != 200 {
		return primary + " not Patroni primary"
	}
	if l.httpCode(Client, "http://"+IP(replica)+":8008/replica", time.Second) != 200 {
		return replica + " not Patroni replica"
	}
	// In synchronous mode Patroni fails over only to the standby it has
	// registered as synchronous (its /sync key); until the new leader's next
	// loop has done that, a fault of the leader gets no failover at all
	// (measured: a freeze 1 s after a switchover, no takeover for 20 s).
	if roled.Durability(l.Opt.Durability).Synchronous() &&
		l.httpCode(Client, "http://"+IP(replica)+":8008/sync", time.Second) != 200 {
		return replica + " not yet Patroni's synchronous standby"
	}
	for _, h := range DataNodes {
		if l.httpCode(Client, "http://"+IP(h)+":8080/health", time.Second) != 200 {
			return h + " app not answering"
		}
	}
	if l.Bin(BinRoled) != "" {
		if l.httpCode(Client, "http://"+IP(primary)+":7400/ha-health", time.Second) != 200 {
			return primary + " not ACTIVE"
		}
		if l.httpCode(Client, "http://"+IP(replica)+":7400/ha-health", time.Second) != 503 {
			return replica + " not PASSIVE"
		}
	}
	if l.Bin(BinLB) != "" {
		var h struct{ Node string }
		if err := l.getJSON(Client, "http://"+IP(LB)+":80/health", time.Second, &h); err != nil || h.Node != primary {
			return fmt.Sprintf("lb not serving from %s (got %q, %v)", primary, h.Node, err)
		}
	}
	return ""
}

// KillNode stops a host hard: SIGKILL to every process in its namespace.
func (l *Lab) KillNode(host string) error {
	l.logf("kill -9 everything on %s", host)
	return l.Net.KillAll(host)
}

// StartNode starts a host's processes again (after KillNode).
func (l *Lab) StartNode(host string) error {
	l.logf("start %s", host)
	switch host {
	case Witness:
		return l.startEtcd(host)
	case LB, LB2:
		return l.startLB(host)
	case NodeA, NodeB:
		if err := l.removeStalePostmaster(host); err != nil {
			return err
		}
		for _, f := range []func(string) error{l.startEtcd, l.startPatroni, l.startApp, l.startRoled, l.startKeepalived} {
			if err := f(host); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown host %q", host)
}

// removeStalePostmaster makes sure no postmaster of host survives (its pid
// file would otherwise confuse Patroni's start).
func (l *Lab) removeStalePostmaster(host string) error {
	b, err := os.ReadFile(l.path(host, "pg", "pgdata", "postmaster.pid"))
	if err != nil {
		return nil
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil || syscall.Kill(pid, 0) != nil {
		return nil
	}
	return errors.New("postmaster of " + host + " still running")
}

// Down stops everything and removes the lab.
func (l *Lab) Down() error {
	l.logf("tearing down lab %s", l.Opt.Tag)
	return l.Destroy()
}
