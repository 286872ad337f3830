package lab

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/hapair/hapair/internal/nettest"
)

// NodeAction runs one fault or repair on a host (the drill's pluggable
// actions call these through "hapair-lab node ...").
func (l *Lab) NodeAction(action, host string) error {
	if !l.Net.Exists(host) {
		return fmt.Errorf("host %s of lab %s does not exist", host, l.Opt.Tag)
	}
	switch action {
	case "kill":
		return l.KillNode(host)
	case "start":
		return l.StartNode(host)
	case "cut":
		return l.Net.SetLink(host, false)
	case "uncut":
		return l.Net.SetLink(host, true)
	case "partition": // from the other etcd hosts (the lb still reaches it)
		var peers []string
		for _, h := range EtcdHosts {
			if h != host {
				peers = append(peers, h)
			}
		}
		return l.Net.Partition(host, peers...)
	case "heal":
		return l.Net.Heal(host)
	case "stop", "cont": // SIGSTOP / SIGCONT Patroni
		sig := syscall.SIGSTOP
		if action == "cont" {
			sig = syscall.SIGCONT
		}
		return l.Signal(host, ProcPatroni, sig)
	}
	return fmt.Errorf("unknown node action %q (kill|start|cut|uncut|partition|heal|stop|cont)", action)
}

// PrintStatus prints the cluster table: hapairctl status (run on the client
// host) when it was built, else the lab's own view.
func (l *Lab) PrintStatus(ctx context.Context, w io.Writer) error {
	if ctl := l.Bin(BinCtl); ctl != "" {
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", l.Net.NS(Client), ctl, "status", "--config", l.path("ctl.yaml"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		_, _ = w.Write(out.Bytes())
		// Exit 1 and 2 are its answers (not redundant, not serving), with
		// the table printed; only a table that is missing needs the lab's.
		if err == nil || strings.HasPrefix(out.String(), "REDUNDANT") || strings.HasPrefix(out.String(), "NOT SERVING") {
			return nil
		}
		fmt.Fprintln(w, "(hapairctl status failed; lab view follows)")
	}
	if err := l.printOwnStatus(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	return l.Ctl().Status(ctx).WriteTable(w)
}

func (l *Lab) printOwnStatus(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tPROCESSES\tPATRONI\tROLE\tAPP\tVIP")
	for _, h := range Hosts {
		procs := ""
		for _, p := range []string{ProcEtcd, ProcPatroni, ProcRoled, ProcApp, ProcLB} {
			if _, ok := l.PID(h, p); ok {
				procs += p + " "
			}
		}
		pat, role, app := "-", "-", "-"
		if h == NodeA || h == NodeB {
			var ps struct {
				Role     string `json:"role"`
				State    string `json:"state"`
				Timeline int    `json:"timeline"`
			}
			if err := l.getJSON(Client, "http://"+IP(h)+":8008/patroni", time.Second, &ps); err == nil {
				pat = fmt.Sprintf("%s/%s tl%d", ps.Role, ps.State, ps.Timeline)
			}
			switch l.httpCode(Client, "http://"+IP(h)+":7400/ha-health", time.Second) {
			case 200:
				role = "ACTIVE"
			case 503:
				role = "PASSIVE"
			}
			if l.httpCode(Client, "http://"+IP(h)+":8080/health", time.Second) == 200 {
				app = "up"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", l.Net.NS(h), procs, pat, role, app, l.vipsOn(h))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if m := l.Missing(); len(m) > 0 {
		fmt.Fprintf(w, "not built (lab runs without): %v\n", m)
	}
	return nil
}

// vipsOn lists which of the lab's floating addresses (the nodes' VIP, the
// balancer pair's) are on h's interfaces now, or "-".
func (l *Lab) vipsOn(h string) string {
	nh, err := nettest.HostAt(h, "/run/netns/"+l.Net.NS(h))
	if err != nil {
		return "?"
	}
	defer nh.Close()
	var on []string
	for _, a := range []string{VIPAddr, LBVIPAddr} {
		if ok, _ := nh.Has(netip.MustParseAddr(a)); ok {
			on = append(on, a)
		}
	}
	if len(on) == 0 {
		return "-"
	}
	return strings.Join(on, ",")
}

// logTail returns the last n bytes of a lab log, for error reports.
func (l *Lab) logTail(host, proc string, n int64) string {
	f, err := os.Open(l.path("log", host+"."+proc+".log"))
	if err != nil {
		return ""
	}
	defer f.Close()
	st, _ := f.Stat()
	if st.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}
