package lb

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/etcdtest"
	"github.com/hapair/hapair/internal/nettest"
	"github.com/hapair/hapair/internal/proctest"
)

var pairVIP = netip.MustParseAddr("10.78.0.100")

// lbProcess is hapair-lb running as a real process.
type lbProcess struct {
	name string
	host *nettest.Host
	cmd  *exec.Cmd
	logs *syncBuf
	once sync.Once
}

func startVIPBalancer(t *testing.T, name string, h *nettest.Host, etcd []string, backend string) *lbProcess {
	t.Helper()
	return startVIPBalancerWith(t, name, h, etcd, backend, "  lease-ttl: 2s\n")
}

// startVIPBalancerWith: vipExtra is added to the vip section (YAML lines
// indented by two spaces).
func startVIPBalancerWith(t *testing.T, name string, h *nettest.Host, etcd []string, backend, vipExtra string) *lbProcess {
	t.Helper()
	bin := buildBinary(t)
	yml := lbYAML("127.0.0.1:0", backend) + fmt.Sprintf(`etcd:
  endpoints: ["%s"]
vip:
  address: %s/24
  interface: eth0
  netns: %s
  name: pair
  safety-margin: 250ms
  keepalive-interval: 250ms
`, strings.Join(etcd, `","`), pairVIPOf(h), h.NetnsPath()) + vipExtra
	path := filepath.Join(t.TempDir(), "lb.yaml")
	if err := os.WriteFile(path, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &lbProcess{name: name, host: h, cmd: exec.Command(bin, "--config", path), logs: &syncBuf{}}
	proctest.DieWithTest(p.cmd)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			fmt.Fprintln(p.logs, sc.Text())
		}
	}()
	t.Cleanup(func() { p.stop(t) })
	return p
}

func (p *lbProcess) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to %s: %v", sig, p.name, err)
	}
}

// stop ends the process (SIGTERM; SIGKILL after 10 s) once.
func (p *lbProcess) stop(t *testing.T) {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
			t.Errorf("%s did not stop on SIGTERM; log:\n%s", p.name, p.logs)
		}
	})
}

// kill is SIGKILL: nothing of the process runs after it.
func (p *lbProcess) kill() {
	p.once.Do(func() {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	})
}

func procStateOf(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

func holds(h *nettest.Host) bool { ok, _ := h.Has(pairVIP); return ok }

// pairVIPOf is the pair's VIP on h's LAN: .100 of its /24.
func pairVIPOf(h *nettest.Host) netip.Addr {
	a := h.Addr.Addr().As4()
	a[3] = 100
	return netip.AddrFrom4(a)
}

// Must show (issue 20, the balancer pair): two hapair-lb processes, one
// VIP. The holder is paused past its lease (the kernel drops the VIP before
// its deadline, the standby takes it), stopped gracefully (the VIP moves at
// once), killed (the kernel drops it, the standby takes it after the
// lease); with etcd's quorum gone nobody holds it. Never on two hosts at
// once, by address polling and by ARP from a third host.
func TestVIPBalancerPair(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test (real etcd, processes); skipped with -short")
	}
	lan := nettest.NewLAN(t)
	h1, h2 := lan.AddHost("L1", "10.78.0.1/24"), lan.AddHost("L2", "10.78.0.2/24")
	client := lan.AddHost("C", "10.78.0.3/24")
	c := etcdtest.New(t)
	backend := newFakeNode(t, "app")
	p1 := startVIPBalancer(t, "L1", h1, c.Endpoints(), backend.addr())
	p2 := startVIPBalancer(t, "L2", h2, c.Endpoints(), backend.addr())
	pres := nettest.WatchPresence(t, []*nettest.Host{h1, h2}, pairVIP)
	arp := nettest.WatchARP(t, client, pairVIP, 10*time.Millisecond)
	const ttl, margin = 2 * time.Second, 250 * time.Millisecond

	waitFor(t, 20*time.Second, "one balancer holds the VIP", func() bool { return holds(h1) || holds(h2) })
	holder, standby := p1, p2
	if holds(h2) {
		holder, standby = p2, p1
	}
	t.Logf("%s holds the VIP first", holder.name)

	// 1. SIGSTOP the holder past its lease.
	seen := nettest.WatchLastSeen(t, holder.host, pairVIP)
	holder.signal(t, syscall.SIGSTOP)
	waitFor(t, 5*time.Second, holder.name+" stopped", func() bool { return procStateOf(holder.cmd.Process.Pid) == "T" })
	stopped := time.Now()
	waitFor(t, 15*time.Second, "VIP on the standby "+standby.name, func() bool { return holds(standby.host) })
	took := time.Since(stopped)
	time.Sleep(time.Until(stopped.Add(ttl + 500*time.Millisecond))) // the pause outlasts the lease (scenario)
	if last := seen.Halt(); !last.Before(stopped.Add(ttl - margin)) {
		t.Fatalf("VIP seen on the stopped %s %s after SIGSTOP, past its deadline (< %s)", holder.name, last.Sub(stopped), ttl-margin)
	} else {
		t.Logf("pause: VIP last seen on %s %s after SIGSTOP; on %s %s after it", holder.name, last.Sub(stopped), standby.name, took)
	}
	holder.signal(t, syscall.SIGCONT)
	resumed := time.Now()
	for time.Since(resumed) < 2*time.Second {
		if holds(holder.host) {
			t.Fatalf("the resumed %s holds the VIP again", holder.name)
		}
		time.Sleep(5 * time.Millisecond)
	}
	holder, standby = standby, holder

	// 2. Graceful stop of the holder: removed, key revoked, the standby
	// takes it without waiting for the lease.
	stopAt := time.Now()
	holder.stop(t)
	if holds(holder.host) {
		t.Fatalf("VIP left on %s after a graceful stop", holder.name)
	}
	waitFor(t, 15*time.Second, "VIP on "+standby.name, func() bool { return holds(standby.host) })
	t.Logf("graceful stop of %s: VIP on %s %s after SIGTERM", holder.name, standby.name, time.Since(stopAt))

	// A new standby for the next steps, on the stopped one's host.
	restarted := startVIPBalancer(t, holder.name+"'", holder.host, c.Endpoints(), backend.addr())
	holder, standby = standby, restarted
	time.Sleep(time.Second) // let the new standby campaign and lose (scenario)
	if holds(standby.host) {
		t.Fatal("the new balancer took the VIP from a live holder")
	}

	// 3. Quorum lost: the holder's keep-alives fail, the VIP goes at its
	// deadline, and nobody holds it while etcd is gone.
	c.LoseQuorum() // returns when the members are stopped, which can take seconds
	lost := time.Now()
	waitFor(t, 10*time.Second, "VIP off "+holder.name, func() bool { return !holds(holder.host) })
	t.Logf("no quorum: VIP off %s %s after quorum was lost", holder.name, time.Since(lost))
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if holds(h1) || holds(h2) {
			t.Fatal("a balancer holds the VIP without etcd quorum")
		}
	}
	c.RegainQuorum()
	waitFor(t, 30*time.Second, "a balancer holds the VIP again", func() bool { return holds(h1) || holds(h2) })
	if holds(standby.host) {
		holder, standby = standby, holder
	}

	// 4. SIGKILL of the holder: the kernel drops the VIP before the
	// deadline; the standby takes it after the lease expires.
	seen = nettest.WatchLastSeen(t, holder.host, pairVIP)
	killed := time.Now()
	holder.kill()
	waitFor(t, 15*time.Second, "VIP on "+standby.name, func() bool { return holds(standby.host) })
	t.Logf("kill of %s: VIP on %s %s after SIGKILL", holder.name, standby.name, time.Since(killed))
	if last := seen.Halt(); !last.Before(killed.Add(ttl - margin)) {
		t.Fatalf("VIP seen on the killed %s %s after SIGKILL", holder.name, last.Sub(killed))
	}

	arp.Stop()
	readings, overlaps, seenBy := pres.Stop()
	rounds, answered, doubles, byMAC := arp.Snapshot()
	t.Logf("presence: %d readings, seen %v; ARP: %d rounds, %d answered, by MAC %v", readings, seenBy, rounds, answered, byMAC)
	if overlaps != 0 || doubles != 0 {
		t.Fatalf("two holders at once: %d presence overlaps, %d double ARP rounds", overlaps, doubles)
	}
	if !strings.Contains(p1.logs.String()+p2.logs.String()+restarted.logs.String(), "etcd unreachable") &&
		!strings.Contains(p1.logs.String()+p2.logs.String()+restarted.logs.String(), "keep-alive failing") {
		t.Error("no loud log line while etcd was gone")
	}
}

// The balancer pair with fence: nftables and a 1 s lease (etcd with a
// 600 ms election timeout grants 1 s leases): the holder SIGSTOPped past its
// lease stops answering for the VIP before its deadline and the standby
// takes it; the resumed one stays silent; the new holder SIGKILLed goes
// silent before its deadline too. Watched by ARP from a third host every
// 10 ms: never two answers in one round. The takeover times are logged
// (the lab measures them); nothing here depends on them.
func TestVIPBalancerPairNftablesFence(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test (real etcd, processes); skipped with -short")
	}
	lan := nettest.NewLAN(t)
	h1, h2 := lan.AddHost("L1", "10.79.0.1/24"), lan.AddHost("L2", "10.79.0.2/24")
	client := lan.AddHost("C", "10.79.0.3/24")
	v := pairVIPOf(h1)
	c := etcdtest.New(t, etcdtest.WithTiming(60*time.Millisecond, 600*time.Millisecond))
	backend := newFakeNode(t, "app")
	const extra = "  lease-ttl: 1s\n  fence: nftables\n"
	p1 := startVIPBalancerWith(t, "L1", h1, c.Endpoints(), backend.addr(), extra)
	p2 := startVIPBalancerWith(t, "L2", h2, c.Endpoints(), backend.addr(), extra)
	arp := nettest.WatchARP(t, client, v, 10*time.Millisecond)
	const deadline = time.Second - 250*time.Millisecond // lease-ttl - safety-margin, after the last keep-alive sent
	mac := map[*lbProcess]string{p1: h1.MAC.String(), p2: h2.MAC.String()}
	answers := func(p *lbProcess, since time.Time) bool { return arp.LastAnswer(mac[p]).After(since) }

	var holder, standby *lbProcess
	waitFor(t, 20*time.Second, "one balancer answering for the VIP", func() bool {
		now := time.Now().Add(-50 * time.Millisecond)
		a, b := answers(p1, now), answers(p2, now)
		switch {
		case a && !b:
			holder, standby = p1, p2
		case b && !a:
			holder, standby = p2, p1
		}
		return a != b
	})
	t.Logf("%s holds the VIP first", holder.name)

	// 1. SIGSTOP the holder past its lease.
	holder.signal(t, syscall.SIGSTOP)
	waitFor(t, 5*time.Second, holder.name+" stopped", func() bool { return procStateOf(holder.cmd.Process.Pid) == "T" })
	stopped := time.Now()
	waitFor(t, 15*time.Second, "ARP answers from the standby "+standby.name, func() bool { return answers(standby, stopped) })
	took := arp.LastAnswer(mac[standby]).Sub(stopped)
	time.Sleep(time.Until(stopped.Add(2 * time.Second))) // the pause outlasts the lease (scenario)
	last := arp.LastAnswer(mac[holder])
	if !last.Before(stopped.Add(deadline)) {
		t.Fatalf("the stopped %s answered for the VIP %s after SIGSTOP, past its deadline (< %s)", holder.name, last.Sub(stopped), deadline)
	}
	t.Logf("pause: last answer from %s %s after SIGSTOP; first from %s %s after it", holder.name, last.Sub(stopped), standby.name, took)
	holder.signal(t, syscall.SIGCONT)
	resumed := time.Now()
	time.Sleep(time.Second) // the resumed one stays silent (scenario)
	if answers(holder, resumed) {
		t.Fatalf("the resumed %s answers for the VIP again", holder.name)
	}
	holder, standby = standby, holder

	// 2. SIGKILL the new holder: silent before its deadline, the standby
	// answers after the lease expires.
	killed := time.Now()
	holder.kill()
	waitFor(t, 15*time.Second, "ARP answers from "+standby.name, func() bool { return answers(standby, killed) })
	took = arp.LastAnswer(mac[standby]).Sub(killed)
	if last := arp.LastAnswer(mac[holder]); !last.Before(killed.Add(deadline)) {
		t.Fatalf("the killed %s answered %s after SIGKILL, past its deadline", holder.name, last.Sub(killed))
	}
	t.Logf("kill of %s: first answer from %s %s after SIGKILL", holder.name, standby.name, took)

	arp.Stop()
	rounds, answered, doubles, byMAC := arp.Snapshot()
	t.Logf("ARP: %d rounds, %d answered, by MAC %v", rounds, answered, byMAC)
	if doubles != 0 {
		t.Fatalf("two balancers answered for the VIP in %d rounds", doubles)
	}
	if logs := p1.logs.String() + p2.logs.String(); strings.Contains(logs, "granted a longer lease") {
		t.Errorf("etcd granted a longer lease than 1 s:\n%s", logs)
	}
}
