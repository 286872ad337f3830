package lab

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// RunEtcdMember is the lab's fallback etcd member ("hapair-lab etcd"), used
// only while hapair-witness does not build: one embedded member with the
// JSON gateway on (Patroni's etcd3 client needs it, LAB.md §2).
func RunEtcdMember(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	name := fs.String("name", "", "member name")
	dir := fs.String("data-dir", "", "data directory")
	ip := fs.String("ip", "", "this member's address")
	cluster := fs.String("initial-cluster", "", "name=peerURL,...")
	state := fs.String("initial-cluster-state", "new", "new|existing")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = *name, *dir
	client, _ := url.Parse("http://" + *ip + ":2379")
	local, _ := url.Parse("http://127.0.0.1:2379")
	peer, _ := url.Parse("http://" + *ip + ":2380")
	cfg.ListenClientUrls = []url.URL{*client, *local}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.InitialCluster = *cluster
	cfg.ClusterState = *state
	cfg.InitialClusterToken = "hapair-lab"
	cfg.LogLevel = "warn"
	cfg.EnableGRPCGateway = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("etcd member %s not ready after 2m", *name)
	case <-ctx.Done():
		return nil
	}
	select {
	case err := <-e.Err():
		return err
	case <-ctx.Done():
		return nil
	}
}
