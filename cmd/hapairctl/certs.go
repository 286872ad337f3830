package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/hapair/hapair/ctl"
)

func init() {
	register(command{name: "certs", summary: "create a CA and per-host certificates (etcd, sync receiver, balancer checks)", run: runCerts})
}

// runCerts creates a CA and one certificate per host (server + client use):
//
//	hapairctl certs --dir /etc/hapair/tls nodeA=10.0.0.11 nodeB=10.0.0.12 witness=10.0.0.13 lb=10.0.0.20
func runCerts(_ context.Context, e *env, args []string) int {
	fs := flag.NewFlagSet("certs", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	dir := fs.String("dir", "/etc/hapair/tls", "output directory (ca.pem, ca-key.pem, <host>.pem, <host>-key.pem)")
	validity := fs.Duration("validity", 10*365*24*time.Hour, "certificate lifetime")
	force := fs.Bool("force", false, "re-issue host certificates that already exist (the CA is kept)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 {
		e.errorf("certs", "hosts needed: name=ip-or-dns,... (e.g. nodeA=10.0.0.11)")
		return 2
	}
	var hosts []ctl.CertHost
	for _, a := range fs.Args() {
		h, err := ctl.ParseCertHost(a)
		if err != nil {
			e.errorf("certs", "%v", err)
			return 2
		}
		hosts = append(hosts, h)
	}
	written, err := ctl.Certs(*dir, hosts, *validity, *force)
	for _, w := range written {
		fmt.Fprintln(e.stdout, "wrote", w)
	}
	if err != nil {
		e.errorf("certs", "%v", err)
		return 1
	}
	return 0
}
