package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/hapair/hapair/roled"
)

func init() {
	register(command{name: "ack", summary: "acknowledge a Patroni leader-key takeover alarm so the node may become ACTIVE again", run: runAck})
}

// runAck marks the takeover alarm of --node (all alarms without it) as
// acknowledged in etcd. Exit 0: acknowledged; 1: nothing to acknowledge or an
// etcd error; 2: usage or configuration.
func runAck(ctx context.Context, e *env, args []string) int {
	fs := flag.NewFlagSet("ack", flag.ContinueOnError)
	var f ctlFlags
	f.bind(fs)
	node := fs.String("node", "", "Patroni member (node) whose alarm to acknowledge; empty: all")
	timeout := fs.Duration("timeout", 5*time.Second, "etcd timeout")
	if code, ok := parseFlags(fs, e, args); !ok {
		return code
	}
	cfg, err := f.load()
	if err != nil {
		e.errorf("ack", "%v", err)
		return 2
	}
	cli, err := cfg.etcdClient()
	if err != nil {
		e.errorf("ack", "%v", err)
		return 1
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	by := "hapairctl"
	if h, err := os.Hostname(); err == nil {
		by += "@" + h
	}
	acked, err := roled.AckTakeover(ctx, cli, cfg.prefix(), *node, by)
	if errors.Is(err, roled.ErrNoAlarm) {
		e.errorf("ack", "no unacknowledged takeover alarm under %s", roled.AlarmPrefix(cfg.prefix())+*node)
		return 1
	}
	for _, a := range acked {
		fmt.Fprintf(e.stdout, "acknowledged: %s took Patroni's leader key from %s (%s create_revision=%d mod_revision=%d, detected by %s at %s)\n",
			a.Member, a.PreviousValue, a.LeaderKey, a.CreateRevision, a.ModRevision, a.DetectedBy, a.DetectedAt.Format(time.RFC3339))
	}
	if err != nil {
		e.errorf("ack", "%v", err)
		return 1
	}
	return 0
}
