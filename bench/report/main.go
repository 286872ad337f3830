// Command report turns the logs of bench/all.sh (make bench) into one table:
// component, figure, hapair, peer, ratio, goal, met/missed; printed, and
// written as Markdown with the machine, date and commit.
//
//	go run ./bench/report -dir bin/bench -o bench/RESULTS.md [-mode full|quick] [-commit X]
//
// Each part's log is parsed for the lines its own script prints (the parsers
// are tested against real output in report_test.go); a part that did not run
// or printed nothing usable gives a row "not measured", never a guess.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Verdict says whether a figure meets its goal.
type Verdict int

const (
	NoGoal Verdict = iota // informational: no goal set
	Met
	Missed
	NotMeasured
)

func (v Verdict) String() string {
	return [...]string{"-", "met", "MISSED", "not measured"}[v]
}

// Row is one line of the table. Ratio is hapair ÷ peer (for times and CPU
// lower is better, for throughput higher is better: Goal says which).
type Row struct {
	Component, Figure string
	Hapair, Peer      string
	Ratio             string
	Goal              string
	Verdict           Verdict
}

func main() {
	dir := flag.String("dir", "bin/bench", "directory with the parts' logs")
	out := flag.String("o", "", "write the Markdown report here")
	mode := flag.String("mode", "full", "full or quick (printed in the report)")
	commit := flag.String("commit", "unknown", "commit measured")
	flag.Parse()
	var rows []Row
	for _, p := range parts {
		b, err := os.ReadFile(filepath.Join(*dir, p.log))
		if err != nil {
			rows = append(rows, Row{Component: p.component, Figure: "(" + p.log + " missing: part not run)", Verdict: NotMeasured})
			continue
		}
		rows = append(rows, p.parse(string(b))...)
	}
	writeText(os.Stdout, rows)
	if *out != "" {
		var b strings.Builder
		fmt.Fprintf(&b, "# Benchmark results\n\n")
		fmt.Fprintf(&b, "Made by `make bench` (`bench/all.sh`, %s run) on %s, commit `%s`.\n", *mode, time.Now().UTC().Format("2006-01-02 15:04 MST"), *commit)
		fmt.Fprintf(&b, "Machine: %s. Files on a loop-mounted ext4 volume under /var/tmp. Ratio = hapair ÷ peer.\n\n", machine())
		writeMarkdown(&b, rows)
		fmt.Fprintf(&b, "\nLogs of each part: `%s/*.log` on the machine that ran it. Single runs on 2 shared cores vary; see the README for the spread over repeated runs.\n", *dir)
		if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "report:", err)
			os.Exit(1)
		}
	}
}

func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(l[strings.IndexByte(l, ':')+1:])
				break
			}
		}
	}
	kernel := ""
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = ", Linux " + strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%d cores (%s)%s, %s", runtime.NumCPU(), cpu, kernel, runtime.Version())
}

func writeText(w io.Writer, rows []Row) {
	fmt.Fprintf(w, "%-10s %-44s %14s %14s %7s %-26s %s\n", "COMPONENT", "FIGURE", "HAPAIR", "PEER", "RATIO", "GOAL", "RESULT")
	for _, r := range rows {
		fmt.Fprintf(w, "%-10s %-44s %14s %14s %7s %-26s %s\n", r.Component, r.Figure, r.Hapair, r.Peer, r.Ratio, r.Goal, r.Verdict)
	}
}

func writeMarkdown(w io.Writer, rows []Row) {
	fmt.Fprintln(w, "| component | figure | hapair | peer | ratio | goal | result |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", r.Component, r.Figure, r.Hapair, r.Peer, r.Ratio, r.Goal, r.Verdict)
	}
}

type part struct {
	component, log string
	parse          func(string) []Row
}

var parts = []part{
	{"balancer", "lb-throughput.log", parseLBThroughput},
	{"balancer", "lb-c1000.log", parseLBConns},
	{"balancer", "lb-switch.log", parseLBSwitch},
	{"sync", "sync.log", parseSync},
	{"witness", "witness.log", parseWitness},
	{"roled", "roled.log", parseRoled},
}

func ratio(a, b float64) string {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func atMost(v, bound float64) Verdict {
	if math.IsNaN(v) {
		return NotMeasured
	}
	if v <= bound {
		return Met
	}
	return Missed
}

func atLeast(v, bound float64) Verdict {
	if math.IsNaN(v) {
		return NotMeasured
	}
	if v >= bound {
		return Met
	}
	return Missed
}

func num(s string) float64 {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return math.NaN()
	}
	return f
}

func missing(component, what string) Row {
	return Row{Component: component, Figure: what + " (not in the log)", Verdict: NotMeasured}
}

// ---- balancer ----

// lbMedian is one row of bench/lb/run.sh's "medians over N rounds" table.
type lbMedian struct{ rps, p99, cpu float64 }

var (
	lbRow     = regexp.MustCompile(`^(direct|nginx|haproxy|hapair-lb|hapair-lb-b)\s+(\d+)\s+(small|big|tls)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s+(\S+)\s+\|`)
	lbMedHead = regexp.MustCompile(`^== medians over \d+ rounds \(wrk -t\d+ -c(\d+) `)
)

// lbMedians reads the medians table: the figures by "kind workers cell",
// hapair-lb's cells ("workers cell") in order, and wrk's connection count.
func lbMedians(log string) (m map[string]lbMedian, cells []string, conns string) {
	m = map[string]lbMedian{}
	inMedians := false
	for _, l := range strings.Split(log, "\n") {
		if f := lbMedHead.FindStringSubmatch(l); f != nil {
			inMedians, conns = true, f[1]
			continue
		}
		if !inMedians {
			continue
		}
		f := lbRow.FindStringSubmatch(l)
		if f == nil {
			continue
		}
		cell := f[2] + " " + f[3]
		if f[1] == "hapair-lb" {
			cells = append(cells, cell)
		}
		m[f[1]+" "+cell] = lbMedian{rps: num(f[4]), p99: num(f[6]), cpu: num(f[8])}
	}
	return m, cells, conns
}

var lbCellName = map[string]string{"small": "HTTP, %s worker(s), 100 B", "big": "HTTP, %s worker(s), 16 KiB",
	"tls": "HTTPS, %s worker(s), 100 B"}

// parseLBThroughput: the plain cells' goals are Nginx's throughput and CPU
// and HAProxy's p99; the TLS cell's (issue 15) HAProxy's throughput and
// 1.2x its p99, CPU shown against Nginx's.
func parseLBThroughput(log string) []Row {
	m, cells, _ := lbMedians(log)
	if len(cells) == 0 {
		return []Row{missing("balancer", "HTTP throughput")}
	}
	var rows []Row
	for _, c := range cells {
		w, size, _ := strings.Cut(c, " ")
		label := fmt.Sprintf(lbCellName[size], w)
		h, n, hp := m["hapair-lb "+c], m["nginx "+c], m["haproxy "+c]
		if size == "tls" {
			rows = append(rows,
				Row{"balancer", label + ": req/s", fmt.Sprintf("%.0f", h.rps), fmt.Sprintf("%.0f haproxy", hp.rps), ratio(h.rps, hp.rps), "≥ 1.00× HAProxy", atLeast(h.rps/hp.rps, 1)},
				Row{"balancer", label + ": CPU µs/req", fmt.Sprintf("%.1f", h.cpu), fmt.Sprintf("%.1f nginx", n.cpu), ratio(h.cpu, n.cpu), "-", NoGoal},
				Row{"balancer", label + ": p99 µs", fmt.Sprintf("%.0f", h.p99), fmt.Sprintf("%.0f haproxy", hp.p99), ratio(h.p99, hp.p99), "≤ 1.20× HAProxy", atMost(h.p99/hp.p99, 1.2)},
			)
			continue
		}
		rows = append(rows,
			Row{"balancer", label + ": req/s", fmt.Sprintf("%.0f", h.rps), fmt.Sprintf("%.0f nginx", n.rps), ratio(h.rps, n.rps), "≥ 1.00× nginx", atLeast(h.rps/n.rps, 1)},
			Row{"balancer", label + ": CPU µs/req", fmt.Sprintf("%.1f", h.cpu), fmt.Sprintf("%.1f nginx", n.cpu), ratio(h.cpu, n.cpu), "≤ 1.00× nginx", atMost(h.cpu/n.cpu, 1)},
			Row{"balancer", label + ": p99 µs", fmt.Sprintf("%.0f", h.p99), fmt.Sprintf("%.0f haproxy", hp.p99), ratio(h.p99, hp.p99), "≤ 1.00× HAProxy", atMost(h.p99/hp.p99, 1)},
		)
	}
	return rows
}

// parseLBConns reads the many-connections run (CONNS=1000 SIZES=small
// WORKERS=1): goal Nginx's throughput, CPU and p99 (issue 15).
func parseLBConns(log string) []Row {
	m, cells, conns := lbMedians(log)
	if len(cells) == 0 {
		return []Row{missing("balancer", "HTTP, 1,000 connections")}
	}
	var rows []Row
	for _, c := range cells {
		w, size, _ := strings.Cut(c, " ")
		label := fmt.Sprintf("%s connections, "+lbCellName[size], conns, w)
		h, n := m["hapair-lb "+c], m["nginx "+c]
		rows = append(rows,
			Row{"balancer", label + ": req/s", fmt.Sprintf("%.0f", h.rps), fmt.Sprintf("%.0f nginx", n.rps), ratio(h.rps, n.rps), "≥ 1.00× nginx", atLeast(h.rps/n.rps, 1)},
			Row{"balancer", label + ": CPU µs/req", fmt.Sprintf("%.1f", h.cpu), fmt.Sprintf("%.1f nginx", n.cpu), ratio(h.cpu, n.cpu), "≤ 1.00× nginx", atMost(h.cpu/n.cpu, 1)},
			Row{"balancer", label + ": p99 µs", fmt.Sprintf("%.0f", h.p99), fmt.Sprintf("%.0f nginx", n.p99), ratio(h.p99, n.p99), "≤ 1.00× nginx", atMost(h.p99/n.p99, 1)},
		)
	}
	return rows
}

// flipper's SUMMARY line, one per configuration.
var flipSummary = regexp.MustCompile(`^SUMMARY (.+): switch median ([\d.]+) ms max ([\d.]+) ms; failed (\d+) of (\d+); requests to old node after flip (\d+); overlap median ([\d.]+) ms max ([\d.]+) ms`)

type flipRes struct{ median, max, failed, total, toOld, overlapMax float64 }

func parseLBSwitch(log string) []Row {
	res := map[string]flipRes{}
	for _, l := range strings.Split(log, "\n") {
		if f := flipSummary.FindStringSubmatch(l); f != nil {
			res[f[1]] = flipRes{num(f[2]), num(f[3]), num(f[4]), num(f[5]), num(f[6]), num(f[8])}
		}
	}
	fast, okF := find(res, "hapair-lb etcd fast path")
	checks, okC := find(res, "hapair-lb checks only")
	hap100, okH := find(res, "haproxy inter 100ms")
	hap2s, okH2 := find(res, "haproxy inter 2s")
	if !okF || !okH {
		return []Row{missing("balancer", "role switch following")}
	}
	rows := []Row{
		{"balancer", "role switch, etcd fast path: median ms", fmt.Sprintf("%.1f", fast.median), fmt.Sprintf("%.1f haproxy 100ms", hap100.median), ratio(fast.median, hap100.median), "≤ 100 ms", atMost(fast.median, 100)},
		{"balancer", "role switch, etcd fast path: max ms", fmt.Sprintf("%.1f", fast.max), fmt.Sprintf("%.1f haproxy 100ms", hap100.max), ratio(fast.max, hap100.max), "-", NoGoal},
		{"balancer", "role switch: both nodes in service, max ms", fmt.Sprintf("%.1f", fast.overlapMax), fmt.Sprintf("%.1f haproxy 100ms", hap100.overlapMax), "-", "0", atMost(fast.overlapMax, 0)},
		// Requests the old node answered after its flip, before the balancer
		// knew (it keeps serving in the bench): the cost of following, not
		// a safety figure; "both in service" is.
		{"balancer", "role switch: answered by the old node after its flip", fmt.Sprintf("%.0f", fast.toOld), fmt.Sprintf("%.0f haproxy 100ms", hap100.toOld), ratio(fast.toOld, hap100.toOld), "-", NoGoal},
	}
	if okH2 {
		rows = append(rows, Row{"balancer", "role switch: failed requests", fmt.Sprintf("%.0f of %.0f", fast.failed, fast.total), fmt.Sprintf("%.0f haproxy 2s", hap2s.failed), "-", "0", atMost(fast.failed, 0)})
	}
	if okC {
		rows = append(rows, Row{"balancer", "role switch, checks only (100 ms): median ms", fmt.Sprintf("%.1f", checks.median), fmt.Sprintf("%.1f haproxy 100ms", hap100.median), ratio(checks.median, hap100.median), "-", NoGoal})
	}
	return rows
}

func find(m map[string]flipRes, prefix string) (flipRes, bool) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if strings.HasPrefix(k, prefix) {
			return m[k], true
		}
	}
	return flipRes{}, false
}

// ---- sync ----

var syncRow = regexp.MustCompile(`^(\S.*?)\s{2,}(\S+)\s+(\S+)\s+(\S+)$`)

// parseDur reads bench/sync's fmtDur: "61µs", "2.9ms", "1.91s".
func parseDur(s string) float64 {
	for _, u := range []struct {
		suffix string
		scale  float64
	}{{"µs", 1e-3}, {"ms", 1}, {"s", 1e3}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			return num(v) * u.scale
		}
	}
	return math.NaN()
}

func fmtMs(ms float64) string {
	switch {
	case math.IsNaN(ms):
		return "-"
	case ms < 1000:
		return fmt.Sprintf("%.1f ms", ms)
	}
	return fmt.Sprintf("%.2f s", ms/1000)
}

func parseSync(log string) []Row {
	type pair struct{ peer, ours float64 }
	rows := map[string]pair{}
	partial := ""
	for _, l := range strings.Split(log, "\n") {
		l = strings.TrimRight(l, " ")
		if strings.HasPrefix(l, "  partial file visible [lsyncd delay=0]") {
			partial = l
		}
		f := syncRow.FindStringSubmatch(l)
		if f == nil {
			continue
		}
		rows[strings.TrimSpace(f[1])] = pair{parseDur(f[2]), parseDur(f[3])}
	}
	get := func(k string) (pair, bool) { p, ok := rows[k]; return p, ok }
	var out []Row
	add := func(key, figure, peer, goal string, verdict func(p pair) Verdict) {
		p, ok := get(key)
		if !ok {
			out = append(out, missing("sync", figure))
			return
		}
		out = append(out, Row{"sync", figure, fmtMs(p.ours), fmtMs(p.peer) + " " + peer, ratio(p.ours, p.peer), goal, verdict(p)})
	}
	add("small file, median [lsyncd delay=0]", "one small file", "lsyncd 0", "< 10 ms, ≤ 0.20× lsyncd", func(p pair) Verdict {
		if atMost(p.ours, 10) == Met && atMost(p.ours/p.peer, 0.2) == Met {
			return Met
		}
		return Missed
	})
	if _, ok := get("small file, median [lsyncd delay=15]"); ok {
		add("small file, median [lsyncd delay=15]", "one small file vs lsyncd's default", "lsyncd 15", "≤ 1/1500× lsyncd", func(p pair) Verdict { return atMost(p.ours/p.peer, 1.0/1500) })
	}
	add("1,000 x 4 KiB burst [lsyncd delay=0]", "1,000 × 4 KiB burst", "lsyncd 0", "< 200 ms", func(p pair) Verdict { return atMost(p.ours, 200) })
	add("256 MiB file [lsyncd delay=0]", "256 MiB file", "lsyncd 0", "≤ 1.00× lsyncd", func(p pair) Verdict { return atMost(p.ours/p.peer, 1) })
	add("initial [rsync -a --fsync]", "initial tree (10,000 + 20 × 16 MiB)", "rsync --fsync", "≤ 1.00× rsync --fsync", func(p pair) Verdict { return atMost(p.ours/p.peer, 1) })
	if _, ok := get("initial [rsync -a]"); ok {
		add("initial [rsync -a]", "initial tree vs plain rsync (stretch)", "rsync -a", "≤ 1.00× rsync -a", func(p pair) Verdict { return atMost(p.ours/p.peer, 1) })
	}
	add("no-change re-run [rsync -a --fsync]", "no-change re-run", "rsync --fsync", "≤ 1.00× rsync", func(p pair) Verdict { return atMost(p.ours/p.peer, 1) })
	if partial != "" {
		f := strings.Fields(partial)
		lsyncd, ours := f[len(f)-2], f[len(f)-1]
		v := Met
		if ours != "false" {
			v = Missed
		}
		out = append(out, Row{"sync", "partial file visible under its name", ours, lsyncd + " lsyncd 0", "-", "never", v})
	}
	return out
}

// ---- witness ----

var (
	witnessMember = regexp.MustCompile(`^(hapair \S+ \((\w+)\)|stock etcd\d)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$`)
	witnessBinary = regexp.MustCompile(`^hapair-witness binary: ([\d.]+) MiB .* stock etcd \S+: ([\d.]+) MiB`)
	witnessJoin   = regexp.MustCompile(`^join start→ready ms: .*; median ([\d.]+) ms`)
)

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func parseWitness(log string) []Row {
	var wRSS, wCPU float64 = math.NaN(), math.NaN()
	var eRSS, eCPU []float64
	var rows []Row
	binH, binE, join := math.NaN(), math.NaN(), math.NaN()
	for _, l := range strings.Split(log, "\n") {
		l = strings.TrimSpace(l)
		if f := witnessMember.FindStringSubmatch(l); f != nil {
			switch {
			case f[2] == "witness":
				wRSS, wCPU = num(f[3]), num(f[6])
			case strings.HasPrefix(f[1], "stock"):
				eRSS, eCPU = append(eRSS, num(f[3])), append(eCPU, num(f[6]))
			}
		}
		if f := witnessBinary.FindStringSubmatch(l); f != nil {
			binH, binE = num(f[1]), num(f[2])
		}
		if f := witnessJoin.FindStringSubmatch(l); f != nil {
			join = num(f[1])
		}
	}
	if math.IsNaN(wRSS) {
		return []Row{missing("witness", "idle footprint")}
	}
	er, ec := median(eRSS), median(eCPU)
	rssV := Missed
	if wRSS <= 40 && wRSS <= er {
		rssV = Met
	}
	rows = append(rows,
		Row{"witness", "idle RSS, MiB (median of samples)", fmt.Sprintf("%.1f", wRSS), fmt.Sprintf("%.1f stock etcd", er), ratio(wRSS, er), "≤ 40 MiB and ≤ stock", rssV},
		Row{"witness", "idle CPU, % of a core", fmt.Sprintf("%.2f", wCPU), fmt.Sprintf("%.2f stock etcd", ec), ratio(wCPU, ec), "< 1 %", atMost(wCPU, 1-1e-9)},
		Row{"witness", "binary, stripped, MiB", fmt.Sprintf("%.1f", binH), fmt.Sprintf("%.1f stock etcd", binE), ratio(binH, binE), "-", NoGoal},
		Row{"witness", "join a running cluster: start → ready", fmtMs(join), "-", "-", "-", NoGoal},
	)
	return rows
}

// ---- roled ----

var (
	roledLatency = regexp.MustCompile(`^latency p50 (\S+) p90 (\S+) p99 (\S+) p99\.9 (\S+) max (\S+)`)
	roledIdle    = regexp.MustCompile(`^pid \d+ over \S+: CPU ([\d.]+)% of one core, VmRSS (\d+) kB`)
	roledFlip    = regexp.MustCompile(`^SUMMARY roled flip: median ([\d.]+) ms max ([\d.]+) ms over (\d+) flips; both 200 in (\d+) polls`)
)

func goDurMs(s string) float64 {
	d, err := time.ParseDuration(s)
	if err != nil {
		return math.NaN()
	}
	return float64(d) / 1e6
}

func parseRoled(log string) []Row {
	var rows []Row
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if f := roledIdle.FindStringSubmatch(l); f != nil {
			rows = append(rows,
				Row{"roled", "idle CPU, % of a core", f[1], "-", "-", "-", NoGoal},
				Row{"roled", "idle RSS, MiB", fmt.Sprintf("%.1f", num(f[2])/1024), "-", "-", "-", NoGoal})
		}
		if f := roledLatency.FindStringSubmatch(l); f != nil {
			rows = append(rows, Row{"roled", "/ha-health at 2,000 req/s: p50 / p99", fmtMs(goDurMs(f[1])) + " / " + fmtMs(goDurMs(f[3])), "-", "-", "-", NoGoal})
		}
		if f := roledFlip.FindStringSubmatch(l); f != nil {
			rows = append(rows,
				Row{"roled", "role flip: leader key → new ACTIVE's 200, median", f[1] + " ms", "-", "-", "-", NoGoal},
				Row{"roled", "role flip: max (" + f[3] + " flips)", f[2] + " ms", "-", "-", "-", NoGoal},
				Row{"roled", "role flip: polls with both nodes 200", f[4], "-", "-", "0", atMost(num(f[4]), 0)})
		}
	}
	if len(rows) == 0 {
		return []Row{missing("roled", "load, idle and flip")}
	}
	return rows
}
