package lb

import (
	"context"
	"encoding/json"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hapair/hapair/internal/config"
)

// activeValue is the JSON roled stores in /hapair/<cluster>/active.
type activeValue struct {
	Node  string `json:"node"`
	Since string `json:"since"`
}

// keyWatcher follows the active key and hands every observation to sink.
type keyWatcher struct {
	cfg  config.Etcd
	key  string
	lg   *zap.Logger
	m    *Metrics
	sink func(activeKey)

	plain bool // value is a bare node name (Patroni's leader key), not roled's JSON
}

// ActiveKey is the etcd key the fast path follows for a cluster name.
func ActiveKey(cluster string) string { return "/hapair/" + cluster + "/active" }

// run gets the key, then watches from the next revision, with
// WithRequireLeader so a member cut off from quorum ends the watch instead
// of going silent. On any loss the key state becomes unknown (checks alone
// decide) and the loop re-gets after a short back-off.
func (w *keyWatcher) run(ctx context.Context) error {
	cli, err := w.cfg.NewClient(w.lg.Named("etcd-client").WithOptions(zap.IncreaseLevel(zap.WarnLevel)))
	if err != nil {
		return err
	}
	defer cli.Close()
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		if w.follow(ctx, cli) {
			backoff = 100 * time.Millisecond
		}
		w.m.etcdUp.Set(0)
		w.sink(activeKey{})
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
	return nil
}

// follow runs one get+watch cycle; it reports whether the get succeeded.
func (w *keyWatcher) follow(ctx context.Context, cli *clientv3.Client) bool {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	gctx, gcancel := context.WithTimeout(wctx, w.cfg.DialTimeout)
	resp, err := cli.Get(gctx, w.key)
	gcancel()
	if err != nil {
		if ctx.Err() == nil {
			w.lg.Warn("etcd get of active key failed", zap.Error(err))
		}
		return false
	}
	w.m.etcdUp.Set(1)
	if len(resp.Kvs) == 0 {
		w.apply(nil, resp.Header.Revision)
	} else {
		w.apply(resp.Kvs[0], resp.Header.Revision)
	}
	for wr := range cli.Watch(wctx, w.key, clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			w.lg.Warn("etcd watch of active key lost", zap.Error(err))
			return true
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				w.apply(nil, ev.Kv.ModRevision)
			} else {
				w.apply(ev.Kv, ev.Kv.ModRevision)
			}
		}
	}
	if ctx.Err() == nil {
		w.lg.Warn("etcd watch of active key closed")
	}
	return true
}

func (w *keyWatcher) apply(kv *mvccpb.KeyValue, rev int64) {
	if kv == nil {
		w.sink(activeKey{known: true, rev: rev})
		return
	}
	if w.plain {
		// Patroni's leader key: the value is the member name.
		w.m.fastPathEvents.Inc()
		w.sink(activeKey{known: true, node: string(kv.Value), epoch: kv.CreateRevision, rev: rev})
		return
	}
	var v activeValue
	if err := json.Unmarshal(kv.Value, &v); err != nil || v.Node == "" {
		// An unreadable key names nobody we could route to.
		w.lg.Warn("unreadable active key", zap.ByteString("value", kv.Value), zap.Error(err))
		w.sink(activeKey{known: true, epoch: kv.CreateRevision, rev: rev})
		return
	}
	w.m.fastPathEvents.Inc()
	w.sink(activeKey{known: true, node: v.Node, epoch: kv.CreateRevision, rev: rev})
}
