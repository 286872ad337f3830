package main

import (
	"fmt"
	"strings"
	"testing"
)

// The samples are in the exact formats the bench scripts print (their
// printf formats), so a change there that the report no longer reads fails.
func lbMedianRow(b *strings.Builder, kind string, w int, size string, rps, p50, p99 float64, cpu string) {
	fmt.Fprintf(b, "%-11s %-3d %-5s %10.0f %9.0f %9.0f %9s %9s | %8s %8s %8s %8s %8s %8s\n", kind, w, size, rps, p50, p99, "900", cpu, "-", "-", "-", "-", "-", "-")
}

func TestParseLBThroughput(t *testing.T) {
	var b strings.Builder
	b.WriteString("hapair-lb   w=1 small round 1: rps  18000.00 ...\n\n== medians over 3 rounds (wrk -t2 -c50 -d5s, loopback, 2 cores shared) ==\n")
	row := func(kind string, w int, size string, rps, p50, p99 float64, cpu string) {
		lbMedianRow(&b, kind, w, size, rps, p50, p99, cpu)
	}
	row("nginx", 1, "small", 16000, 1000, 4000, "50.0")
	row("haproxy", 1, "small", 17000, 1000, 3000, "45.0")
	row("hapair-lb", 1, "small", 18000, 900, 2900, "40.0")
	row("nginx", 1, "tls", 26000, 1000, 4000, "30.0")
	row("haproxy", 1, "tls", 26500, 1000, 4030, "29.0")
	row("hapair-lb", 1, "tls", 20400, 900, 12970, "41.1")
	rows := parseLBThroughput(b.String())
	if len(rows) != 6 {
		t.Fatalf("rows %+v", rows)
	}
	if rows[0].Ratio != "1.12" || rows[0].Verdict != Met || rows[1].Verdict != Met || rows[2].Verdict != Met {
		t.Errorf("rows %+v", rows[:3])
	}
	// TLS: against HAProxy's throughput and 1.2x its p99 (issue 15's
	// figures: missed both); CPU only shown.
	tls := rows[3:]
	if tls[0].Figure != "HTTPS, 1 worker(s), 100 B: req/s" || tls[0].Ratio != "0.77" || tls[0].Verdict != Missed ||
		tls[1].Verdict != NoGoal || tls[1].Ratio != "1.37" || tls[2].Ratio != "3.22" || tls[2].Verdict != Missed {
		t.Errorf("TLS rows %+v", tls)
	}
	if r := parseLBThroughput("nothing"); r[0].Verdict != NotMeasured {
		t.Errorf("empty log: %+v", r)
	}
}

func TestParseLBConns(t *testing.T) {
	var b strings.Builder
	b.WriteString("== medians over 2 rounds (wrk -t2 -c1000 -d5s, loopback, 2 cores shared) ==\n")
	lbMedianRow(&b, "nginx", 1, "small", 13800, 1000, 112800, "50.0")
	lbMedianRow(&b, "haproxy", 1, "small", 10900, 1000, 153100, "45.0")
	lbMedianRow(&b, "hapair-lb", 1, "small", 14300, 900, 180900, "40.0")
	rows := parseLBConns(b.String())
	if len(rows) != 3 || rows[0].Figure != "1000 connections, HTTP, 1 worker(s), 100 B: req/s" {
		t.Fatalf("rows %+v", rows)
	}
	if rows[0].Verdict != Met || rows[1].Verdict != Met || rows[2].Ratio != "1.60" || rows[2].Verdict != Missed ||
		rows[2].Peer != "112800 nginx" {
		t.Errorf("rows %+v", rows)
	}
	if r := parseLBConns(""); r[0].Verdict != NotMeasured {
		t.Errorf("empty log: %+v", r)
	}
}

func TestParseLBSwitch(t *testing.T) {
	line := func(label string, med, max float64, failed, total, old int, omax float64) string {
		return fmt.Sprintf("SUMMARY %s: switch median %.1f ms max %.1f ms; failed %d of %d; requests to old node after flip %d; overlap median %.1f ms max %.1f ms\n",
			label, med, max, failed, total, old, 0.0, omax)
	}
	log := line("haproxy inter 2s fall 2 rise 2", 2505, 2600, 13930, 100000, 0, 0) +
		line("haproxy inter 100ms fall 2 rise 1", 53, 60, 0, 100000, 5, 55) +
		line("hapair-lb checks only, interval 100ms fall 2 rise 1", 12, 24, 0, 100000, 0, 0) +
		line("hapair-lb etcd fast path, interval 2s fall 2 rise 2", 5.8, 18.1, 0, 154098, 0, 0)
	rows := parseLBSwitch(log)
	if len(rows) != 6 {
		t.Fatalf("rows %+v", rows)
	}
	for _, r := range rows {
		if r.Verdict == Missed || r.Verdict == NotMeasured {
			t.Errorf("%+v", r)
		}
	}
	if rows[0].Hapair != "5.8" || rows[0].Peer != "53.0 haproxy 100ms" {
		t.Errorf("first row %+v", rows[0])
	}
}

func TestParseSync(t *testing.T) {
	var b strings.Builder
	r := func(name, other, ours, ratio string) {
		fmt.Fprintf(&b, "%-34s %14s %14s %10s\n", name, other, ours, ratio)
	}
	r("small file, median [lsyncd delay=0]", "61.0ms", "2.9ms", "21.0x")
	r("1,000 x 4 KiB burst [lsyncd delay=0]", "1.91s", "185.0ms", "10.3x")
	r("  its writer [lsyncd delay=0]", "70.0ms", "100.0ms", "0.7x")
	r("256 MiB file [lsyncd delay=0]", "1.14s", "1.07s", "1.1x")
	fmt.Fprintf(&b, "%-34s %14v %14v\n", "  partial file visible [lsyncd delay=0]", true, false)
	r("initial [rsync -a]", "2.05s", "2.58s", "0.8x")
	r("no-change re-run [rsync -a]", "238.0ms", "213.0ms", "1.1x")
	r("initial [rsync -a --fsync]", "11.40s", "2.58s", "4.4x")
	r("no-change re-run [rsync -a --fsync]", "240.0ms", "213.0ms", "1.1x")
	rows := parseSync(b.String())
	want := map[string]Verdict{"one small file": Met, "1,000 × 4 KiB burst": Met, "256 MiB file": Met,
		"initial tree (10,000 + 20 × 16 MiB)": Met, "initial tree vs plain rsync (stretch)": Missed,
		"no-change re-run": Met, "partial file visible under its name": Met}
	if len(rows) != len(want) {
		t.Fatalf("rows %+v", rows)
	}
	for _, r := range rows {
		if v, ok := want[r.Figure]; !ok || v != r.Verdict {
			t.Errorf("%+v, want %v", r, v)
		}
	}
	if d := parseDur("61µs"); d != 0.061 {
		t.Errorf("parseDur µs: %v", d)
	}
}

func TestParseWitness(t *testing.T) {
	var b strings.Builder
	fmt.Fprintf(&b, "hapair-witness binary: %.1f MiB (%d B) stripped, %.1f MiB unstripped; stock etcd %s: %.1f MiB\n", 23.0, 24117248, 34.0, "3.4.23", 20.5)
	m := func(label string, rss, cpu float64) {
		fmt.Fprintf(&b, "%-26s %12.1f %12.1f %14.1f %10.2f\n", label, rss, rss+1, rss-10, cpu)
	}
	m("hapair nodeA (member)", 40, 1.5)
	m("hapair witness (witness)", 31.9, 1.42)
	m("stock etcd0", 28.8, 1.42)
	m("stock etcd1", 37.2, 1.52)
	m("stock etcd2", 38.3, 1.75)
	b.WriteString("join start→ready ms: 210 221 230; median 221 ms\n")
	rows := parseWitness(b.String())
	if len(rows) != 4 || rows[0].Verdict != Met || rows[0].Peer != "37.2 stock etcd" || rows[1].Verdict != Missed ||
		rows[2].Hapair != "23.0" || rows[3].Hapair != "221.0 ms" {
		t.Errorf("rows %+v", rows)
	}
}

func TestParseRoled(t *testing.T) {
	log := "pid 12 over 30s: CPU 0.85% of one core, VmRSS 24576 kB, threads 9\n" +
		"latency p50 335µs p90 1ms p99 5.1ms p99.9 9ms max 20ms\n" +
		"SUMMARY roled flip: median 163.0 ms max 585.0 ms over 20 flips; both 200 in 0 polls\n"
	rows := parseRoled(log)
	if len(rows) != 6 || rows[1].Hapair != "24.0" || rows[2].Hapair != "0.3 ms / 5.1 ms" || rows[5].Verdict != Met {
		t.Errorf("rows %+v", rows)
	}
}
