package ctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hapair/hapair/roled"
)

// History reads the failover history the ACTIVE nodes' roled recorded,
// oldest first.
func (c *Client) History(ctx context.Context) ([]roled.HistoryEvent, error) {
	cli, err := c.Etcd()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, c.Cfg.Timeout)
	defer cancel()
	r, err := cli.Get(ctx, roled.HistoryPrefix(c.Cfg.Prefix()), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, err
	}
	out := make([]roled.HistoryEvent, 0, len(r.Kvs))
	for _, kv := range r.Kvs {
		var ev roled.HistoryEvent
		if err := json.Unmarshal(kv.Value, &ev); err != nil {
			return out, fmt.Errorf("%s: %w", kv.Key, err)
		}
		out = append(out, ev)
	}
	return out, nil
}

// WriteHistory prints each event as a block: the role change on its first
// line, then every figure with its unit ("-" where it is not known yet).
func WriteHistory(w io.Writer, evs []roled.HistoryEvent) error {
	ts := func(t time.Time) string { return t.Local().Format(time.DateTime + ".000") }
	clock := func(t time.Time) string { return t.Local().Format(time.TimeOnly + ".000") }
	for i, e := range evs {
		if i > 0 {
			fmt.Fprintln(w)
		}
		from := "-"
		if e.From != "" {
			from = fmt.Sprintf("%s (%d)", e.From, e.FromEpoch)
		}
		fmt.Fprintf(w, "%s  %s  %s → %s (%d)\n", ts(e.Served), e.Kind, from, e.To, e.Epoch)
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		line := func(k, v string) { fmt.Fprintf(tw, "  %s\t%s\n", k, v) }
		gap := "-"
		if !e.OldStopped.IsZero() {
			gap = fmt.Sprintf("%.2f s (old ACTIVE stopped %s, new served %s)", e.GapSeconds, clock(e.OldStopped), clock(e.Served))
		}
		line("no ACTIVE for", gap)
		if e.Reason != "" {
			line("old ACTIVE's reason", e.Reason)
		}
		line("WAL lost", fmtWALLoss(e))
		q := "-"
		if e.QuarantinedFiles != nil {
			q = fmt.Sprintf("%d files (the returning node's, under epoch %d)", *e.QuarantinedFiles, e.Epoch)
		}
		line("files quarantined", q)
		line("redundant after", fmtRedundancy(e, clock))
		if r := e.StandbyRecovery; r != nil {
			p := r.Phases
			line("standby recovery", fmt.Sprintf("%.1f s from %s: start %.1f s, rewind %.1f s, WAL catch-up %.1f s, file sync %.1f s, waiting %.1f s",
				r.Seconds, clock(r.Started), p.Start, p.Rewind, p.WALCatchup, p.FileSync, p.Waiting))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func fmtWALLoss(e roled.HistoryEvent) string {
	w := e.WAL
	if e.WALLostBytes == nil {
		switch {
		case w.Basis == "" && e.Kind == roled.KindFirst:
			return "-"
		case w.Basis == "" || w.Basis == roled.WALPending && w.Note == "":
			return "- (not known yet)"
		case w.Basis == roled.WALPending:
			return "- (not known yet: " + w.Note + ")"
		}
		return "unknown: " + w.Note
	}
	s := fmtBytes(*e.WALLostBytes)
	switch w.Basis {
	case roled.WALMeasured:
		s += fmt.Sprintf(" (at least: old ACTIVE at %s on timeline %d, read %s; timeline %d ends at %s on the new primary, now timeline %d)",
			w.OldLSN, w.OldTimeline, w.OldLSNAt.Local().Format(time.TimeOnly+".000"), w.OldTimeline, w.SwitchLSN, w.NewTimeline)
	case roled.WALReturning:
		s += fmt.Sprintf(" (the returning %s's own WAL end %s on timeline %d, read before its rewind; timeline %d ends at %s on the new primary",
			e.From, w.ReturningEnd, w.OldTimeline, w.OldTimeline, w.SwitchLSN)
		if w.OldLSN != "" {
			s += fmt.Sprintf("; its last heartbeat as ACTIVE said %s", w.OldLSN)
		}
		s += ")"
	case roled.WALPlanned:
		s += " (planned switchover)"
	case roled.WALSameNode:
		s += " (same node, same timeline)"
	}
	return s
}

func fmtRedundancy(e roled.HistoryEvent, clock func(time.Time) string) string {
	switch e.Redundancy {
	case roled.RedundancyReached:
		return fmt.Sprintf("%.1f s (%s ready at %s)", e.RedundancySeconds, e.Standby, clock(e.RedundantAt))
	case roled.RedundancyWaiting:
		return "- (waiting for a ready standby)"
	case "":
		return "-"
	}
	return fmt.Sprintf("%s: %s", e.Redundancy, e.RedundancyNote)
}

// fmtBytes shows a byte count with its unit, exact below 1 KiB.
func fmtBytes(b int64) string {
	switch {
	case b < 1<<10:
		return fmt.Sprintf("%d B", b)
	case b < 1<<20:
		return fmt.Sprintf("%.1f KiB (%d B)", float64(b)/(1<<10), b)
	}
	return fmt.Sprintf("%.1f MiB (%d B)", float64(b)/(1<<20), b)
}
