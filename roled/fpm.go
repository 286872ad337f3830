package roled

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// fpmStatus is a PHP-FPM pool status page read with ?json.
type fpmStatus struct {
	OK                 bool
	Pool               string `json:"pool"`
	AcceptedConn       int64  `json:"accepted conn"`
	ListenQueue        int64  `json:"listen queue"`
	MaxListenQueue     int64  `json:"max listen queue"`
	ListenQueueLen     int64  `json:"listen queue len"`
	IdleProcesses      int64  `json:"idle processes"`
	ActiveProcesses    int64  `json:"active processes"`
	TotalProcesses     int64  `json:"total processes"`
	MaxActiveProcesses int64  `json:"max active processes"`
	MaxChildrenReached int64  `json:"max children reached"`
	SlowRequests       int64  `json:"slow requests"`
}

// fpmLoop reads the status page every interval.
func (d *Daemon) fpmLoop(ctx context.Context) error {
	u, err := url.Parse(d.cfg.PHPFPM.URL)
	if err != nil {
		return err
	}
	q := u.Query()
	q.Set("json", "")
	u.RawQuery = q.Encode()
	hc := &http.Client{Timeout: d.cfg.PHPFPM.Timeout}
	t := time.NewTicker(d.cfg.PHPFPM.Interval)
	defer t.Stop()
	failing := false
	for {
		st, err := readFPM(ctx, hc, u.String())
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			d.m.fpmErrors.Inc()
			if !failing {
				d.lg.Warn("php-fpm status read failed", zap.Error(err))
			}
			st = &fpmStatus{}
		}
		failing = err != nil
		d.fpm.Store(st)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func readFPM(ctx context.Context, hc *http.Client, u string) (*fpmStatus, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("php-fpm status: %s", resp.Status)
	}
	var st fpmStatus
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil {
		return nil, fmt.Errorf("php-fpm status json: %w", err)
	}
	st.OK = true
	return &st, nil
}

type fpmDescs struct {
	up, active, idle, total, maxChildren, queue, queueLen, slow, accepted, maxReached, util *prometheus.Desc
}

func newFPMDescs() fpmDescs {
	g := func(n, help string) *prometheus.Desc { return prometheus.NewDesc(name(n), help, nil, nil) }
	return fpmDescs{
		up:          g("fpm_up", "1 when the last read of the PHP-FPM status page succeeded."),
		active:      g("fpm_active_processes", "PHP-FPM processes serving a request."),
		idle:        g("fpm_idle_processes", "Idle PHP-FPM processes."),
		total:       g("fpm_processes", "All PHP-FPM processes of the pool."),
		maxChildren: g("fpm_max_children", "pm.max_children as configured in roled (0: unknown)."),
		queue:       g("fpm_listen_queue", "Requests waiting in the pool's listen queue."),
		queueLen:    g("fpm_listen_queue_length", "Size of the pool's listen queue."),
		slow:        g("fpm_slow_requests_total", "Requests slower than request_slowlog_timeout."),
		accepted:    g("fpm_accepted_connections_total", "Connections accepted by the pool."),
		maxReached:  g("fpm_max_children_reached_total", "Times the pool hit pm.max_children."),
		util:        g("fpm_utilisation_ratio", "Active processes / max_children (or / total when max_children is unknown)."),
	}
}

func (f fpmDescs) collect(ch chan<- prometheus.Metric, st *fpmStatus, maxChildren int) {
	g := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	c := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	ch <- prometheus.MustNewConstMetric(f.up, prometheus.GaugeValue, b2f(st.OK))
	if !st.OK {
		return
	}
	g(f.active, st.ActiveProcesses)
	g(f.idle, st.IdleProcesses)
	g(f.total, st.TotalProcesses)
	g(f.maxChildren, int64(maxChildren))
	g(f.queue, st.ListenQueue)
	g(f.queueLen, st.ListenQueueLen)
	c(f.slow, st.SlowRequests)
	c(f.accepted, st.AcceptedConn)
	c(f.maxReached, st.MaxChildrenReached)
	den := int64(maxChildren)
	if den == 0 {
		den = st.TotalProcesses
	}
	u := 0.0
	if den > 0 {
		u = float64(st.ActiveProcesses) / float64(den)
	}
	ch <- prometheus.MustNewConstMetric(f.util, prometheus.GaugeValue, u)
}
