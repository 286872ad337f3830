package roled

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"
)

// serveAgent answers HAProxy agent-checks on ln: one line, then close. The
// reply is computed from atomics only. HAProxy may send an agent-send string
// first; it is not needed and not read.
func (d *Daemon) serveAgent(ctx context.Context, ln net.Listener, agent string, reply func() string) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	go func() { <-ctx.Done(); _ = ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("agent %s accept: %w", agent, err)
		}
		d.m.agentRequests.WithLabelValues(agent).Inc()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte(reply() + "\n"))
		}()
	}
}

// appAgentReply: "up ready 100%" while ACTIVE, the configured passive reply
// (down, drain or maint) otherwise.
func (d *Daemon) appAgentReply() string {
	if ok, _ := d.activeNow(); ok {
		return "up ready 100%"
	}
	return d.cfg.Agent.PassiveReply
}

// replicaState is the replica agent's answer, refreshed by replicaLoop.
type replicaState struct {
	at    time.Duration
	reply string
}

// replicaAgentReply returns the last computed reply, or "down" when it is
// stale (the refresher is stuck on a hung PostgreSQL).
func (d *Daemon) replicaAgentReply() string {
	s := d.replica.Load()
	if s.at == 0 || d.now()-s.at > 3*d.cfg.ReplicaAgent.Interval+d.cfg.Postgres.Timeout {
		return "down"
	}
	return s.reply
}

// replicaLoop refreshes the replica agent's reply every interval, with its
// own PostgreSQL connection.
func (d *Daemon) replicaLoop(ctx context.Context) error {
	pg, err := newPGChecker(d.cfg.Postgres.DSN, d.cfg.Postgres.Timeout)
	if err != nil {
		return err
	}
	defer pg.Close()
	t := time.NewTicker(d.cfg.ReplicaAgent.Interval)
	defer t.Stop()
	last := ""
	for {
		st, err := pg.ReplicaStats(ctx)
		if ctx.Err() != nil {
			return nil
		}
		reply := replicaReply(d.cfg.ReplicaAgent, st, err, d.etcdView.Load().optime)
		d.replica.Store(&replicaState{at: d.now(), reply: reply})
		if reply != last {
			d.lg.Info("replica agent reply changed", zap.String("reply", reply), zap.Error(err))
			last = reply
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// replicaReply maps PostgreSQL's state to an agent reply, using only words
// HAProxy accepts: "down" when PostgreSQL does not answer; primary-reply on a
// primary; "drain" over the lag limit or the connection share; else
// "up ready N%" with N falling linearly from 100 (no lag) to min-weight (at
// max-lag). Lag is the larger of Patroni's leader optime minus the replayed
// position, and received-but-not-replayed WAL.
func replicaReply(cfg ReplicaAgentConfig, st replicaStats, err error, leaderOptime int64) string {
	if err != nil {
		return "down"
	}
	if !st.InRecovery {
		if cfg.PrimaryReply == "up" {
			return "up ready 100%"
		}
		return cfg.PrimaryReply
	}
	lag := st.ReceiveLag
	if leaderOptime > 0 && leaderOptime-st.ReplayLSN > lag {
		lag = leaderOptime - st.ReplayLSN
	}
	if lag > int64(cfg.MaxLag) {
		return "drain"
	}
	if st.MaxConnections > 0 && float64(st.Connections) > cfg.MaxConnectionsRatio*float64(st.MaxConnections) {
		return "drain"
	}
	w := 100 - int64(100-cfg.MinWeight)*lag/int64(cfg.MaxLag)
	w = max(int64(cfg.MinWeight), min(100, w))
	return fmt.Sprintf("up ready %d%%", w)
}
