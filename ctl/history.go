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

// WriteHistory prints the events as a table.
func WriteHistory(w io.Writer, evs []roled.HistoryEvent) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVED\tKIND\tFROM\tTO\tEPOCH\tNO ACTIVE FOR\tOLD ACTIVE'S REASON")
	for _, e := range evs {
		from, gap, reason := "-", "-", "-"
		if e.From != "" {
			from = fmt.Sprintf("%s (%d)", e.From, e.FromEpoch)
		}
		if e.GapSeconds > 0 {
			gap = fmt.Sprintf("%.2f s", e.GapSeconds)
		}
		if e.Reason != "" {
			reason = e.Reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", e.Served.Local().Format(time.DateTime+".000"), e.Kind, from, e.To, e.Epoch, gap, reason)
	}
	return tw.Flush()
}
