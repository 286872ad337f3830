package roled

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdView is the result of one linearizable read of everything roled
// watches, all at one revision.
type etcdView struct {
	at         time.Duration // now() when the read was sent (0: never read)
	rev        int64
	leader     KeyView
	active     KeyView
	activeNode string
	alarms     []TakeoverAlarm
	alarmRev   map[string]int64 // member -> ModRevision of its alarm key
	takeover   *TakeoverAlarm   // detected on the current leader key, nil if none
	unchecked  string           // member named by a leader key whose history could not be read just now
	optime     int64            // Patroni's leader optime (status key), 0 if unknown
	stepDown   bool             // our stepdown key exists
	// For the standby's readiness: the Patroni leader's member key, and
	// the sync part of the ACTIVE peer's heartbeat (the ACTIVE named by the
	// previous read; empty while this node is the ACTIVE).
	leaderMember LeaderMember
	peerSync     PeerSync
	// The ACTIVE peer's epoch and WAL end from its heartbeat (history).
	peerEpoch int64
	peerWAL   *WALPosition
	// Every node's last acquisition of the active key (the takeover
	// guard's proof).
	lastActive []LastActive
}

// activeValue is the JSON of the active key.
type activeValue struct {
	Node  string `json:"node"`
	Since string `json:"since"`
}

func (d *Daemon) activeKey() string             { return d.cfg.prefix() + "active" }
func (d *Daemon) nodeKey() string               { return d.cfg.prefix() + "nodes/" + d.cfg.Node }
func (d *Daemon) stepDownKey() string           { return StepDownKey(d.cfg.prefix(), d.cfg.Node) }
func (d *Daemon) alarmKey(member string) string { return AlarmPrefix(d.cfg.prefix()) + member }

// etcdLoop re-reads on every watch event, on request and every
// reread-interval. The watches only trigger reads: the decision always uses a
// complete view read at one revision.
func (d *Daemon) etcdLoop(ctx context.Context) error {
	done := make(chan struct{})
	go func() { defer close(done); d.watchLoop(ctx) }()
	defer func() { <-done }()
	t := time.NewTicker(d.cfg.RereadInterval)
	defer t.Stop()
	for {
		d.readOnce(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-d.readNow:
		}
	}
}

// watchLoop watches the leader key, the active key and the alarms from the
// revision after the last read. WithRequireLeader makes a watch served by a
// member without quorum fail instead of going silent. A failed watch is
// re-armed after a short backoff from the newest read revision.
func (d *Daemon) watchLoop(ctx context.Context) {
	for ctx.Err() == nil {
		rev := d.etcdView.Load().rev
		if rev == 0 {
			if !sleepCtx(ctx, 100*time.Millisecond) {
				return
			}
			continue
		}
		d.watchFrom(ctx, rev+1)
		nudge(d.readNow)
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return
		}
	}
}

func (d *Daemon) watchFrom(ctx context.Context, rev int64) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wr := clientv3.WithRev(rev)
	leader := d.cli.Watch(wctx, d.cfg.leaderKey(), wr)
	active := d.cli.Watch(wctx, d.activeKey(), wr)
	alarms := d.cli.Watch(wctx, AlarmPrefix(d.cfg.prefix()), wr, clientv3.WithPrefix())
	stepDown := d.cli.Watch(wctx, d.stepDownKey(), wr)
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return
		case resp, ok = <-leader:
		case resp, ok = <-active:
		case resp, ok = <-alarms:
		case resp, ok = <-stepDown:
		}
		if !ok || resp.Err() != nil || resp.Canceled {
			if ctx.Err() == nil {
				d.lg.Debug("etcd watch ended, re-arming", zap.Error(resp.Err()))
			}
			return
		}
		if len(resp.Events) > 0 {
			nudge(d.readNow)
		}
	}
}

// readOnce reads the leader key, the active key, the alarms and Patroni's
// status key in one transaction (linearizable, one revision), checks the
// leader key for a takeover, keeps the alarms in step, and publishes the view.
func (d *Daemon) readOnce(ctx context.Context) {
	sent := d.now()
	tctx, cancel := context.WithTimeout(ctx, d.cfg.opTimeout())
	defer cancel()
	ops := []clientv3.Op{
		clientv3.OpGet(d.cfg.leaderKey()),
		clientv3.OpGet(d.activeKey()),
		clientv3.OpGet(AlarmPrefix(d.cfg.prefix()), clientv3.WithPrefix()),
		clientv3.OpGet(d.cfg.statusKey()),
		clientv3.OpGet(d.stepDownKey(), clientv3.WithCountOnly()),
		clientv3.OpGet(d.cfg.membersPrefix(), clientv3.WithPrefix()),
		clientv3.OpGet(LastActivePrefix(d.cfg.prefix()), clientv3.WithPrefix()),
	}
	if peer := d.etcdView.Load().activeNode; peer != "" && peer != d.cfg.Node {
		ops = append(ops, clientv3.OpGet(d.cfg.prefix()+"nodes/"+peer))
	}
	resp, err := d.cli.Txn(tctx).Then(ops...).Commit()
	if err != nil {
		if ctx.Err() == nil {
			d.m.etcdReadErrors.Inc()
			d.readFailing(err)
		}
		return
	}
	d.readFailing(nil)
	d.noteEtcdOK(sent)
	v := &etcdView{at: sent, rev: resp.Header.Revision, alarmRev: map[string]int64{}}
	r := resp.Responses
	leaderKV := firstKV(r[0].GetResponseRange().Kvs)
	v.leader = keyView(leaderKV)
	v.active = keyView(firstKV(r[1].GetResponseRange().Kvs))
	if v.active.Exists {
		var av activeValue
		_ = json.Unmarshal([]byte(v.active.Value), &av)
		v.activeNode = av.Node
	}
	for _, kv := range r[2].GetResponseRange().Kvs {
		a := parseAlarms(d.cfg.prefix(), []*mvccpb.KeyValue{kv})[0]
		v.alarms = append(v.alarms, a)
		v.alarmRev[a.Member] = kv.ModRevision
	}
	if kv := firstKV(r[3].GetResponseRange().Kvs); kv != nil {
		var st struct {
			Optime int64 `json:"optime"`
		}
		if json.Unmarshal(kv.Value, &st) == nil {
			v.optime = st.Optime
		}
	}
	v.stepDown = r[4].GetResponseRange().Count > 0
	for _, kv := range r[5].GetResponseRange().Kvs {
		if v.leader.Exists && string(kv.Key) == d.cfg.membersPrefix()+v.leader.Value {
			v.leaderMember = parseLeaderMember(kv.Value)
		}
	}
	for _, kv := range r[6].GetResponseRange().Kvs {
		v.lastActive = append(v.lastActive, parseLastActive(string(kv.Key), d.cfg.prefix(), kv.Value, kv.ModRevision))
	}
	if len(r) > 7 {
		if kv := firstKV(r[7].GetResponseRange().Kvs); kv != nil {
			v.peerSync = parsePeerSync(kv.Value)
			v.peerEpoch, v.peerWAL = parsePeerWAL(kv.Value)
		}
	}
	if t, err := d.findTakeover(tctx, leaderKV); err != nil {
		d.lg.Warn("cannot check leader key history for a takeover", zap.Error(err))
		if !errors.Is(err, rpctypes.ErrCompacted) {
			// Transient: until the history is read, the member the key
			// names is treated as a possible taker. A compacted history
			// cannot be read ever again; the alarm, if any, was written
			// by whoever saw the overwrite happen.
			v.unchecked = v.leader.Value
		}
	} else {
		v.takeover = t
	}
	d.syncAlarms(tctx, v)
	d.trackLastActive(tctx, v)
	d.resolveTakeover(tctx, v)
	d.hist.observe(v, time.Now())
	old := d.etcdView.Swap(v)
	nudge(d.wake)
	if old.leader.ModRev != v.leader.ModRev || old.leader.Exists != v.leader.Exists {
		nudge(d.pollNow) // a leader change: ask Patroni now, not at the next poll
		nudge(d.beatNow)
	}
}

func (d *Daemon) readFailing(err error) {
	if err != nil && !d.readErr {
		d.lg.Warn("etcd read failed", zap.Error(err))
	} else if err == nil && d.readErr {
		d.lg.Info("etcd read recovered")
	}
	d.readErr = err != nil
}

// syncAlarms raises an alarm for a takeover seen on the current leader key
// (unless the same overwrite is already recorded, acknowledged or not) and
// deletes alarms whose leader key has since been re-created normally (another
// CreateRevision, or deleted). Writes are guarded by the alarm key's
// ModRevision as read, so two roleds never fight over one alarm.
func (d *Daemon) syncAlarms(ctx context.Context, v *etcdView) {
	if t := v.takeover; t != nil {
		recorded := false
		for _, a := range v.alarms {
			recorded = recorded || a.sameEvent(*t)
		}
		if !recorded {
			d.raiseAlarm(ctx, v, *t)
		}
	}
	for _, a := range v.alarms {
		if a.CreateRevision == 0 || a.CreateRevision == v.leader.CreateRev {
			continue
		}
		key := d.alarmKey(a.Member)
		_, err := d.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", v.alarmRev[a.Member])).
			Then(clientv3.OpDelete(key)).Commit()
		if err == nil {
			d.lg.Info("takeover alarm cleared: leader key re-created normally",
				zap.String("member", a.Member), zap.Int64("alarm_create_revision", a.CreateRevision),
				zap.Int64("leader_create_revision", v.leader.CreateRev))
		}
	}
}

func (d *Daemon) raiseAlarm(ctx context.Context, v *etcdView, t TakeoverAlarm) {
	tk := takeoverKey{t.CreateRevision, t.ModRevision}
	if !d.reported[tk] {
		d.reported[tk] = true
		d.m.takeovers.Inc()
		d.lg.Error("patroni leader key taken over without delete and re-create: refusing ACTIVE to the taker until `hapairctl ack`",
			zap.String("member", t.Member), zap.String("previous", t.PreviousValue),
			zap.String("leader_key", t.LeaderKey), zap.Int64("create_revision", t.CreateRevision),
			zap.Int64("mod_revision", t.ModRevision), zap.Int64("version", t.Version))
	}
	t.DetectedBy, t.DetectedAt = d.cfg.Node, time.Now().UTC()
	b, _ := json.Marshal(t)
	key := d.alarmKey(t.Member)
	_, err := d.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", v.alarmRev[t.Member])).
		Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil {
		d.lg.Warn("cannot write takeover alarm", zap.String("key", key), zap.Error(err))
	}
}

// takeoverBlocks reports whether a takeover alarm fences member: an
// unacknowledged alarm in etcd, or a takeover seen on the current leader key
// that no acknowledged alarm covers (the local check does not wait for the
// alarm write).
func (v *etcdView) takeoverBlocks(member string) bool {
	var mine *TakeoverAlarm
	for i := range v.alarms {
		if v.alarms[i].Member == member {
			mine = &v.alarms[i]
		}
	}
	if mine != nil && !mine.Acked {
		return true
	}
	if t := v.takeover; t != nil && t.Member == member {
		return mine == nil || !mine.sameEvent(*t)
	}
	return false
}

func firstKV(kvs []*mvccpb.KeyValue) *mvccpb.KeyValue {
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0]
}

func keyView(kv *mvccpb.KeyValue) KeyView {
	if kv == nil {
		return KeyView{}
	}
	return KeyView{Exists: true, Value: string(kv.Value), CreateRev: kv.CreateRevision,
		ModRev: kv.ModRevision, Version: kv.Version, Lease: kv.Lease}
}

// trackLastActive writes this node's "tracking" last-active record once, if
// it has none: from then on every acquisition of the active key by this node
// is on record (written in acquire's transaction), which the other node's
// takeover proof needs before it can rule this node out.
func (d *Daemon) trackLastActive(ctx context.Context, v *etcdView) {
	if d.tracking {
		return
	}
	for _, la := range v.lastActive {
		if la.Node == d.cfg.Node {
			d.tracking = true
			return
		}
	}
	key := lastActiveKey(d.cfg.prefix(), d.cfg.Node)
	b, _ := json.Marshal(lastActiveValue{Node: d.cfg.Node, Member: d.cfg.member(), Kind: "tracking"})
	if _, err := d.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(b))).Commit(); err != nil {
		d.lg.Warn("cannot write last-active record", zap.String("key", key), zap.Error(err))
		return
	}
	d.tracking = true
}

// resolveTakeover runs the takeover guard's proof (proveTakeover) for an
// unacknowledged alarm that names this member, and acknowledges the alarm
// itself when the proof holds. Otherwise it writes the verdict into the
// alarm, so `hapairctl status` says why a person must decide. The writes
// are guarded by the alarm's and every last-active record's ModRevision as
// read: an acquisition by anyone in between voids the proof.
func (d *Daemon) resolveTakeover(ctx context.Context, v *etcdView) {
	var a *TakeoverAlarm
	for i := range v.alarms {
		if v.alarms[i].Member == d.cfg.member() && !v.alarms[i].Acked && v.alarms[i].CreateRevision != 0 {
			a = &v.alarms[i]
		}
	}
	// The rewind hold follows the alarm: held while an alarm names us and
	// is not acknowledged (raised just now, held, or about to be proved:
	// holding a moment too long only delays the other node's rewind).
	held := a != nil || (v.takeover != nil && v.takeover.Member == d.cfg.member() && v.takeoverBlocks(d.cfg.member()))
	if d.rewind != nil {
		d.rewind.Set(held)
	}
	if a == nil {
		return
	}
	q := int64(0)
	if d.sync.Quarantined != nil {
		q = d.sync.Quarantined()
	}
	verdict, detail := proveTakeover(GuardProof{Self: d.cfg.Node, Records: v.lastActive, Quarantined: q})
	if verdict != GuardProved && verdict == a.Guard && detail == a.GuardDetail {
		return // already recorded
	}
	next := *a
	next.Guard, next.GuardDetail = verdict, detail
	if verdict == GuardProved {
		now := time.Now().UTC()
		next.Acked, next.AckedBy, next.AckedAt, next.AutoAcked = true, "roled:"+d.cfg.Node, &now, true
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(d.alarmKey(a.Member)), "=", v.alarmRev[a.Member])}
	for _, la := range v.lastActive {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(lastActiveKey(d.cfg.prefix(), la.Node)), "=", la.Rev))
	}
	b, _ := json.Marshal(next)
	resp, err := d.cli.Txn(ctx).If(cmps...).Then(clientv3.OpPut(d.alarmKey(a.Member), string(b))).Commit()
	switch {
	case err != nil:
		d.lg.Warn("cannot record the takeover guard's verdict", zap.Error(err))
		return
	case !resp.Succeeded:
		return // something changed: the next read decides again
	}
	if verdict == GuardProved {
		d.m.takeoverAutoAcks.Inc()
		d.lg.Warn("takeover alarm acknowledged by roled: nothing the other node acknowledged can be lost",
			zap.String("member", a.Member), zap.String("previous", a.PreviousValue), zap.String("proof", detail))
		nudge(d.readNow)
		return
	}
	d.lg.Error(fmt.Sprintf("takeover alarm held for a person (`hapairctl ack` after checking the data): %s", verdict),
		zap.String("member", a.Member), zap.String("previous", a.PreviousValue), zap.String("why", detail))
}
