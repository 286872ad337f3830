package roled

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TakeoverAlarm is the value of <prefix>alarm/takeover/<member>: Patroni's
// leader key changed its value without being deleted and re-created (same
// CreateRevision, a later version, another value), the signature of Patroni
// 3.0.2's post-partition overwrite (LAB.md §6). The member that took the key is
// refused ACTIVE until the alarm is acknowledged or the leader key is
// re-created normally. The key has no lease: it survives restarts of every
// roled.
type TakeoverAlarm struct {
	Member         string     `json:"member"`          // Patroni member that took the key (the new value)
	PreviousValue  string     `json:"previous_value"`  // member whose key was overwritten
	LeaderKey      string     `json:"leader_key"`      // Patroni's leader key
	CreateRevision int64      `json:"create_revision"` // of the leader key (unchanged by the overwrite)
	ModRevision    int64      `json:"mod_revision"`    // revision of the overwrite
	Version        int64      `json:"version"`         // leader key version written by the overwrite
	DetectedBy     string     `json:"detected_by"`     // node whose roled raised it
	DetectedAt     time.Time  `json:"detected_at"`
	Acked          bool       `json:"acked"`
	AckedBy        string     `json:"acked_by,omitempty"`
	AckedAt        *time.Time `json:"acked_at,omitempty"`
	// AutoAcked: roled acknowledged it itself, having proved that the
	// taker holds everything the other node acknowledged (Guard, GuardDetail
	// say what). Otherwise Guard says why a person must decide.
	AutoAcked   bool         `json:"auto_acked,omitempty"`
	Guard       GuardVerdict `json:"guard,omitempty"`
	GuardDetail string       `json:"guard_detail,omitempty"`
}

// sameEvent reports whether a and b describe the same overwrite.
func (a TakeoverAlarm) sameEvent(b TakeoverAlarm) bool {
	return a.Member == b.Member && a.CreateRevision == b.CreateRevision && a.ModRevision == b.ModRevision
}

// AlarmPrefix is where takeover alarms live under a cluster prefix.
func AlarmPrefix(prefix string) string { return prefix + "alarm/takeover/" }

// StepDownKey is the key that asks node to stay PASSIVE (on the asker's
// lease, so a crashed asker cannot pin the node down): hapairctl switchover
// writes it before the Patroni switchover, so that the old node stops taking
// user requests before its PostgreSQL starts refusing them, and the balancer
// holds them for the new node instead.
func StepDownKey(prefix, node string) string { return prefix + "stepdown/" + node }

// ErrNoAlarm is returned by AckTakeover when there is nothing to acknowledge.
var ErrNoAlarm = errors.New("roled: no takeover alarm")

// AckTakeover acknowledges the takeover alarm of member (all alarms when
// member is ""), as `hapairctl ack` does. The alarm stays in etcd marked
// acknowledged, so roled does not raise it again for the same overwrite; it is
// deleted when the leader key is next re-created normally. It returns the
// acknowledged alarms.
func AckTakeover(ctx context.Context, cli *clientv3.Client, prefix, member, by string) ([]TakeoverAlarm, error) {
	key := AlarmPrefix(prefix) + member
	opts := []clientv3.OpOption{}
	if member == "" {
		opts = append(opts, clientv3.WithPrefix())
	}
	resp, err := cli.Get(ctx, key, opts...)
	if err != nil {
		return nil, fmt.Errorf("read takeover alarms: %w", err)
	}
	var acked []TakeoverAlarm
	for _, kv := range resp.Kvs {
		var a TakeoverAlarm
		if err := json.Unmarshal(kv.Value, &a); err != nil {
			return acked, fmt.Errorf("alarm %s: %w", kv.Key, err)
		}
		if a.Acked {
			continue
		}
		now := time.Now().UTC()
		a.Acked, a.AckedBy, a.AckedAt = true, by, &now
		b, _ := json.Marshal(a)
		tr, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).
			Then(clientv3.OpPut(string(kv.Key), string(b))).Commit()
		if err != nil {
			return acked, fmt.Errorf("ack %s: %w", kv.Key, err)
		}
		if !tr.Succeeded {
			return acked, fmt.Errorf("ack %s: alarm changed meanwhile, read it again", kv.Key)
		}
		acked = append(acked, a)
	}
	if len(acked) == 0 {
		return nil, ErrNoAlarm
	}
	return acked, nil
}

// ListTakeovers returns every takeover alarm under prefix.
func ListTakeovers(ctx context.Context, cli *clientv3.Client, prefix string) ([]TakeoverAlarm, error) {
	resp, err := cli.Get(ctx, AlarmPrefix(prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read takeover alarms: %w", err)
	}
	return parseAlarms(prefix, resp.Kvs), nil
}

func parseAlarms(prefix string, kvs []*mvccpb.KeyValue) []TakeoverAlarm {
	var out []TakeoverAlarm
	for _, kv := range kvs {
		var a TakeoverAlarm
		if json.Unmarshal(kv.Value, &a) != nil || a.Member == "" {
			// An unreadable alarm still fences the member named by its key.
			a = TakeoverAlarm{Member: strings.TrimPrefix(string(kv.Key), AlarmPrefix(prefix))}
		}
		out = append(out, a)
	}
	return out
}

// takeoverKey identifies one version of the leader key.
type takeoverKey struct{ create, mod int64 }

// findTakeover walks the history of the leader key back from kv while it
// keeps its CreateRevision, and returns the latest version whose value
// differs from the version before it: a takeover without delete and
// re-create. A value rewritten unchanged (Patroni re-putting its own key on a
// new lease) is not a takeover. Results are cached per head version; the
// walk stops after 16 versions. A compacted history gives an error (unknown).
func (d *Daemon) findTakeover(ctx context.Context, kv *mvccpb.KeyValue) (*TakeoverAlarm, error) {
	if kv == nil || kv.Version <= 1 {
		return nil, nil
	}
	head := takeoverKey{kv.CreateRevision, kv.ModRevision}
	if r, ok := d.takeoverCache[head]; ok {
		return r, nil
	}
	cur := kv
	var found *TakeoverAlarm
	for i := 0; i < 16 && cur.Version > 1; i++ {
		resp, err := d.cli.Get(ctx, string(kv.Key), clientv3.WithRev(cur.ModRevision-1))
		if err != nil {
			return nil, fmt.Errorf("leader key history at %d: %w", cur.ModRevision-1, err)
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != cur.CreateRevision {
			break
		}
		prev := resp.Kvs[0]
		if string(prev.Value) != string(cur.Value) {
			found = &TakeoverAlarm{Member: string(cur.Value), PreviousValue: string(prev.Value),
				LeaderKey: string(kv.Key), CreateRevision: cur.CreateRevision,
				ModRevision: cur.ModRevision, Version: cur.Version}
			break
		}
		cur = prev
	}
	if len(d.takeoverCache) > 64 {
		clear(d.takeoverCache)
	}
	d.takeoverCache[head] = found
	return found, nil
}
