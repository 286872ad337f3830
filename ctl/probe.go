package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Sample is one probe write through the balancer.
type Sample struct {
	ID    int64     `json:"id"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	OK    bool      `json:"ok"`
	Code  int       `json:"code"`
	Node  string    `json:"node"`
	Err   string    `json:"error,omitempty"`
}

// Probe writes through the balancer at a fixed rate; each write carries a
// unique id so the lab can later check which acknowledged writes survived.
type Probe struct {
	c        *Client
	interval time.Duration
	timeout  time.Duration
	hc       *http.Client // no client-wide timeout: the balancer may hold a request for seconds
	next     atomic.Int64
	mu       sync.Mutex
	samples  []Sample
}

// NewProbe prepares a probe; Run starts it.
func (c *Client) NewProbe(interval time.Duration) *Probe {
	p := &Probe{c: c, interval: interval, timeout: 10 * time.Second,
		hc: &http.Client{Transport: c.HTTP.Transport}}
	p.next.Store(time.Now().UnixMilli() * 1000)
	return p
}

// Run sends one write every interval (each in its own goroutine, so a
// request held by the balancer does not delay the next) until ctx ends, then
// waits for the requests in flight.
func (p *Probe) Run(ctx context.Context) {
	var wg sync.WaitGroup
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		wg.Add(1)
		go func() { defer wg.Done(); p.one() }()
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-t.C:
		}
	}
}

func (p *Probe) one() {
	id := p.next.Add(1)
	s := Sample{ID: id, Start: time.Now()}
	target := fmt.Sprintf("%s%s?id=%d", strings.TrimSuffix(p.c.Cfg.LB.URL, "/"), p.c.Cfg.LB.WritePath, id)
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, target, nil)
	resp, err := p.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL holds the unique id; keep messages countable
		}
		s.Err = err.Error()
	} else {
		var body struct {
			Node  string `json:"node"`
			Error string `json:"error"`
		}
		_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&body)
		resp.Body.Close()
		s.Code, s.Node, s.Err = resp.StatusCode, body.Node, body.Error
		s.OK = resp.StatusCode == http.StatusOK
	}
	s.End = time.Now()
	p.mu.Lock()
	p.samples = append(p.samples, s)
	p.mu.Unlock()
}

// Samples returns the samples so far, ordered by start.
func (p *Probe) Samples() []Sample {
	p.mu.Lock()
	out := append([]Sample(nil), p.samples...)
	p.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// ProbeReport sums up a probe run.
type ProbeReport struct {
	Total, Failed int
	// Downtime is the first outage only: from the first failed request's
	// start to the end of the first of three consecutive successes after
	// it. Where a run may have more than one outage, report TotalDown,
	// Longest and Outages (String does).
	Downtime time.Duration
	MaxWait  time.Duration // longest successful request
	// FirstOK is, per node, the end of the first successful write it served
	// (relative to the report's origin).
	FirstOK map[string]time.Duration
	// LastOK is, per node, the end of its last successful write.
	LastOK  map[string]time.Duration
	PerNode map[string]int
	// Outages is the number of separate failure windows; TotalDown sums
	// them, Longest is the longest (Downtime is only the first).
	Outages   int
	TotalDown time.Duration
	Longest   time.Duration
	// Errors counts failures by node and message (first 60 bytes).
	Errors map[string]int
}

// Analyze reports on samples, times relative to origin.
func Analyze(samples []Sample, origin time.Time) ProbeReport {
	r := ProbeReport{FirstOK: map[string]time.Duration{}, LastOK: map[string]time.Duration{}, PerNode: map[string]int{},
		Errors: map[string]int{}}
	firstFail := -1
	for i, s := range samples {
		r.Total++
		if !s.OK {
			r.Failed++
			msg := fmt.Sprintf("%s %d %s", s.Node, s.Code, s.Err)
			if len(msg) > 80 {
				msg = msg[:80]
			}
			r.Errors[msg]++
			if firstFail < 0 {
				firstFail = i
			}
			continue
		}
		if w := s.End.Sub(s.Start); w > r.MaxWait {
			r.MaxWait = w
		}
		r.PerNode[s.Node]++
		if _, ok := r.FirstOK[s.Node]; !ok {
			r.FirstOK[s.Node] = s.End.Sub(origin)
		}
		r.LastOK[s.Node] = s.End.Sub(origin)
	}
	if firstFail < 0 {
		return r
	}
	for start := firstFail; start >= 0; {
		d, next := window(samples, start)
		if r.Outages == 0 {
			r.Downtime = d
		}
		r.Outages++
		r.TotalDown += d
		r.Longest = max(r.Longest, d)
		start = next
	}
	return r
}

// window measures the failure window starting at samples[start]: until the
// end of the first of three consecutive successes. It returns the index of
// the next failure after the window (-1 when none).
func window(samples []Sample, start int) (time.Duration, int) {
	for i := start + 1; i < len(samples); i++ {
		if i+2 < len(samples) && samples[i].OK && samples[i+1].OK && samples[i+2].OK {
			d := samples[i].End.Sub(samples[start].Start)
			for j := i + 3; j < len(samples); j++ {
				if !samples[j].OK {
					return d, j
				}
			}
			return d, -1
		}
	}
	return samples[len(samples)-1].End.Sub(samples[start].Start), -1
}

// String is a one-line summary. Its headline is the total outage, the
// longest outage and their number: the first outage alone (Downtime) once
// read as the whole ("visible downtime 8.908s" beside 531.756 s in all).
func (r ProbeReport) String() string {
	s := fmt.Sprintf("%d writes, %d failed; outage %.3fs in all, longest %.3fs, %d outage(s); max wait %.3fs, per node %v",
		r.Total, r.Failed, r.TotalDown.Seconds(), r.Longest.Seconds(), r.Outages, r.MaxWait.Seconds(), r.PerNode)
	if len(r.Errors) > 0 {
		s += fmt.Sprintf(", errors %v", r.Errors)
	}
	return s
}

// WriteSamples prints one line per sample (times relative to origin), for
// post-mortems.
func WriteSamples(w io.Writer, samples []Sample, origin time.Time) {
	for _, s := range samples {
		fmt.Fprintf(w, "%+9.3f %+9.3f %d ok=%v code=%d node=%s %s\n", s.Start.Sub(origin).Seconds(),
			s.End.Sub(origin).Seconds(), s.ID, s.OK, s.Code, s.Node, s.Err)
	}
}
