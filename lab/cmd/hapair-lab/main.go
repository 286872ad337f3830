// Command hapair-lab runs hapair's end-to-end lab: network namespaces as
// hosts, real Patroni + PostgreSQL 15, the project's binaries, and scenarios.
//
//	hapair-lab up [--dcs remote|all] [--hold 5s] [--rto 5s]   bring a lab up, print status, leave it running
//	                                                 (--rto: every timer derived from the target, as hapairctl plan)
//	hapair-lab status|down [--tag T]                status table / tear down (all labs without --tag)
//	hapair-lab demo                                  up, switchover A→B and back with probes, timings, down
//	hapair-lab test [--run REGEX]                    the scenarios (each on a fresh lab)
//	hapair-lab soak --minutes N                      random faults with the checkers running
//	hapair-lab soak --rto 6.5s --loss 1% --delay 20ms±10ms --minutes 30
//	                                                 no faults: loss, delay and CPU load; any role change fails
//	hapair-lab switchover NODE [--tag T]                 planned switchover through the lab's client host
//	hapair-lab node kill|start|cut|uncut|partition|heal|stop|cont HOST [--tag T]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hapair/hapair/lab"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1], os.Args[2:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "hapair-lab:", err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

func usage() {
	fmt.Fprintln(os.Stderr, `usage: hapair-lab up|down|status|demo|test|soak|node ... (see lab/README.md)`)
}

type common struct {
	root, tag, binDir, dcs, hold, rto, durability, patroni string
	build                                                  bool
}

func flags(name string, c *common) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&c.root, "root", lab.DefaultRoot, "state root")
	fs.StringVar(&c.tag, "tag", "", "lab tag (namespace prefix)")
	fs.StringVar(&c.binDir, "bin-dir", "", "directory of hapair-* binaries (default: build them into <root>/bin)")
	fs.StringVar(&c.dcs, "dcs", lab.DCSRemote, "Patroni etcd hosts: remote (DESIGN.md §3) or all (Patroni default)")
	fs.StringVar(&c.hold, "hold", "", "lb hold timeout (default 5s, or the budget's with --rto; 0s disables)")
	fs.StringVar(&c.rto, "rto", "", "timing budget: derive every timer from this target (e.g. 5s; see hapairctl plan)")
	fs.StringVar(&c.patroni, "patroni-bin", "", "Patroni executable (default "+lab.DefaultPatroni+"); its --version decides the least ttl a budget may set")
	fs.StringVar(&c.durability, "durability", "async", "replication: async, sync (Patroni synchronous_mode) or sync-strict (synchronous_mode_strict); roled's durability")
	fs.BoolVar(&c.build, "build", true, "build the project's binaries first (when --bin-dir is not given)")
	return fs
}

func run(ctx context.Context, cmd string, args []string) error {
	switch cmd {
	case "etcd":
		return lab.RunEtcdMember(ctx, args)
	case "app":
		return lab.RunApp(ctx, args)
	case "up", "demo", "test", "soak":
		return runLab(ctx, cmd, args)
	case "down":
		var c common
		fs := flags(cmd, &c)
		all := fs.Bool("all", false, "also remove labs that a running demo/test/soak owns")
		if err := fs.Parse(args); err != nil {
			return errUsage
		}
		if c.tag == "" {
			return lab.DestroyAll(c.root, *all, os.Stdout)
		}
		l, err := lab.Open(c.root, c.tag, os.Stdout)
		if err != nil {
			l, _ = lab.NewLab(lab.Options{Root: c.root, Tag: c.tag}, os.Stdout)
		}
		return l.Down()
	case "status":
		l, err := openOne(args)
		if err != nil {
			return err
		}
		return l.PrintStatus(ctx, os.Stdout)
	case "node":
		return runNode(args)
	case "switchover":
		if len(args) < 1 {
			return errUsage
		}
		l, err := openOne(args[1:])
		if err != nil {
			return err
		}
		_, err = l.Switchover(ctx, args[0], os.Stdout)
		return err
	}
	usage()
	return errUsage
}

// openOne opens the lab named by --tag, or the only one there is.
func openOne(args []string) (*lab.Lab, error) {
	var c common
	fs := flags("", &c)
	if err := fs.Parse(args); err != nil {
		return nil, errUsage
	}
	if c.tag == "" {
		tags := lab.Tags()
		if len(tags) != 1 {
			return nil, fmt.Errorf("%d labs running (%v): give --tag", len(tags), tags)
		}
		c.tag = tags[0]
	}
	return lab.Open(c.root, c.tag, os.Stdout)
}

func runNode(args []string) error {
	if len(args) < 2 {
		return errUsage
	}
	action, host := args[0], args[1]
	l, err := openOne(args[2:])
	if err != nil {
		return err
	}
	return l.NodeAction(action, host)
}

func runLab(ctx context.Context, cmd string, args []string) error {
	var c common
	fs := flags(cmd, &c)
	runRe := fs.String("run", "", "test: scenarios to run (regexp on the name)")
	minutes := fs.Float64("minutes", 10, "soak: duration in minutes")
	repeat := fs.Int("repeat", 1, "test: switchover and drill rounds per scenario (medians)")
	vip := fs.Bool("vip", false, "roled holds the lab's VIP "+lab.VIPAddr+" on the ACTIVE node, and a balancer pair (lb, lb2) holds "+lab.LBVIPAddr+" by its etcd election (scenarios 10, 11, 17, 18 and 21-23)")
	vipPeer := fs.String("vip-peer", "", "keepalived: keepalived's VRRP pair holds the VIP instead of roled (implies --vip; issue 20's peer)")
	loss := fs.String("loss", "", "soak: share of packets every host drops (1%): the no-false-failover soak")
	delay := fs.String("delay", "", "soak: one-way delay ± jitter between members (20ms±10ms): the no-false-failover soak")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	opt := lab.Options{Root: c.root, Tag: c.tag, BinDir: c.binDir, DCSMode: c.dcs, Hold: c.hold, RTO: c.rto, Patroni: c.patroni, Repeat: *repeat,
		Owned: cmd != "up", VIP: *vip, VIPPeer: *vipPeer, Durability: c.durability}
	if opt.BinDir == "" {
		opt.BinDir = filepath.Join(c.root, "bin")
		if c.build {
			if err := buildAll(ctx, opt.BinDir); err != nil {
				return err
			}
		}
	}
	switch cmd {
	case "up":
		l, err := lab.NewLab(opt, os.Stdout)
		if err != nil {
			return err
		}
		if err := l.Up(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "up failed, tearing down:", err)
			_ = l.Down()
			return err
		}
		fmt.Printf("\nlab %s is up; hapair-lab status --tag %[1]s; hapair-lab down --tag %[1]s\n", l.Opt.Tag)
		return l.PrintStatus(ctx, os.Stdout)
	case "demo":
		return lab.Demo(ctx, opt, os.Stdout)
	case "test":
		return lab.RunScenarios(ctx, opt, *runRe, os.Stdout)
	case "soak":
		if *loss != "" || *delay != "" {
			jo, err := lab.ParseJitter(*loss, *delay)
			if err != nil {
				return err
			}
			return lab.JitterSoak(ctx, opt, jo, time.Duration(*minutes*float64(time.Minute)), os.Stdout)
		}
		return lab.Soak(ctx, opt, time.Duration(*minutes*float64(time.Minute)), os.Stdout)
	}
	return errUsage
}

func buildAll(ctx context.Context, dir string) error {
	wd, _ := os.Getwd()
	root, err := lab.ModuleRoot(wd)
	if err != nil {
		exe, _ := os.Executable()
		if root, err = lab.ModuleRoot(filepath.Dir(exe)); err != nil {
			return fmt.Errorf("%w: run from the source tree or give --bin-dir", err)
		}
	}
	fmt.Printf("building hapair binaries into %s\n", dir)
	built, failed := lab.Build(ctx, root, dir, os.Stdout)
	fmt.Printf("built: %v; missing: %v\n", built, failed)
	return nil
}
