#!/usr/bin/env bash
# bench/witness/bench.sh — footprint of hapair-witness against Debian's stock
# etcd (package etcd-server), side by side in the same run. Run by hand:
#
#   bench/witness/bench.sh                  # DURATION=60 JOINS=5 BASE=25790
#   HAPAIR_ENV="GOGC=50" bench/witness/bench.sh   # extra env for hapair only
#
# It measures:
#   1. binary size of hapair-witness, stripped (-ldflags "-s -w") and not;
#   2. idle RSS (VmRSS, median of samples every 2 s) and CPU (utime+stime
#      over DURATION s, as % of one core) of every member of two three-member
#      clusters running at the same time on loopback: hapair-witness (nodeA,
#      nodeB role member, witness role witness) and stock `etcd` with its
#      default settings (only names, URLs and data dirs given);
#   3. time from process start to "member ready" (/health 200 on its metrics
#      listener) for a witness joining the running cluster in join mode, JOINS
#      times (each time the witness is removed and its data dir wiped first).
# Plain http on 127.0.0.1 only; everything in a temp dir removed at exit.
set -euo pipefail

DURATION=${DURATION:-60}
JOINS=${JOINS:-5}
BASE=${BASE:-25790}
EBASE=$((BASE + 1000))
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hapair-bench.XXXXXX")
ETCD=${ETCD:-/usr/bin/etcd}
declare -A PID
TICK=$(getconf CLK_TCK)

cleanup() {
	trap - INT TERM EXIT
	for p in "${PID[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${PID[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$WORK"
}
trap cleanup INT TERM EXIT

[[ -x $ETCD ]] || { echo "stock etcd not found at $ETCD: apt-get install etcd-server" >&2; exit 1; }

echo "== build"
(cd "$ROOT" && go build -o "$WORK/hapair-witness.full" ./cmd/hapair-witness &&
	go build -ldflags "-s -w" -o "$WORK/hapair-witness" ./cmd/hapair-witness)
full=$(stat -c %s "$WORK/hapair-witness.full")
stripped=$(stat -c %s "$WORK/hapair-witness")
printf 'hapair-witness binary: %.1f MiB (%d B) stripped, %.1f MiB unstripped; stock etcd %s: %.1f MiB\n' \
	"$(echo "$stripped/1048576" | bc -l)" "$stripped" "$(echo "$full/1048576" | bc -l)" \
	"$($ETCD --version | head -1 | awk '{print $3}')" "$(echo "$(stat -c %s "$ETCD")/1048576" | bc -l)"

names=(nodeA nodeB witness)
roles=(member member witness)
hcluster="" ecluster=""
for i in 0 1 2; do
	hcluster+="${hcluster:+,}${names[i]}=http://127.0.0.1:$((BASE + 10 + i))"
	ecluster+="${ecluster:+,}etcd$i=http://127.0.0.1:$((EBASE + 10 + i))"
done

# start_hapair i mode: one hapair-witness member (mode bootstrap or join).
start_hapair() {
	local i=$1 mode=$2 n=${names[$1]}
	local extra=(--initial-cluster "$hcluster")
	[[ $mode == join ]] && extra=(--join-endpoints "http://127.0.0.1:$BASE,http://127.0.0.1:$((BASE + 1))")
	env ${HAPAIR_ENV:-} "$WORK/hapair-witness" --config /dev/null --name "$n" --role "${roles[i]}" --mode "$mode" --insecure \
		--data-dir "$WORK/h-$n" \
		--listen-peer-urls "http://127.0.0.1:$((BASE + 10 + i))" --advertise-peer-urls "http://127.0.0.1:$((BASE + 10 + i))" \
		--listen-client-urls "http://127.0.0.1:$((BASE + i))" --advertise-client-urls "http://127.0.0.1:$((BASE + i))" \
		--metrics-listen "127.0.0.1:$((BASE + 20 + i))" "${extra[@]}" 2>>"$WORK/h-$n.log" &
	PID[h$i]=$!
}

start_etcd() {
	local i=$1
	"$ETCD" --name "etcd$i" --data-dir "$WORK/e-$i" \
		--listen-peer-urls "http://127.0.0.1:$((EBASE + 10 + i))" --initial-advertise-peer-urls "http://127.0.0.1:$((EBASE + 10 + i))" \
		--listen-client-urls "http://127.0.0.1:$((EBASE + i))" --advertise-client-urls "http://127.0.0.1:$((EBASE + i))" \
		--initial-cluster "$ecluster" --initial-cluster-state new 2>>"$WORK/e-$i.log" &
	PID[e$i]=$!
}

wait_health() { # url timeout_s
	local deadline=$((SECONDS + $2))
	until curl -sf "$1" >/dev/null 2>&1; do
		((SECONDS < deadline)) || { echo "not healthy: $1" >&2; return 1; }
		sleep 0.01
	done
}

printf 'load average at start: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
for i in 0 1 2; do start_hapair "$i" bootstrap; start_etcd "$i"; done
for i in 0 1 2; do
	wait_health "http://127.0.0.1:$((BASE + 20 + i))/health" 30
	wait_health "http://127.0.0.1:$((EBASE + i))/health" 30
done
echo "== both clusters healthy; settling 10 s, then sampling ${DURATION} s"
sleep 10

cputicks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
anon_kib() { awk '/^RssAnon/ {print $2}' "/proc/$1/status"; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

declare -A T0 SAMPLES ANON
for k in "${!PID[@]}"; do T0[$k]=$(cputicks "${PID[$k]}"); SAMPLES[$k]=""; ANON[$k]=""; done
for ((s = 0; s < DURATION; s += 2)); do
	for k in "${!PID[@]}"; do
		SAMPLES[$k]+="$(rss_kib "${PID[$k]}") "
		ANON[$k]+="$(anon_kib "${PID[$k]}") "
	done
	sleep 2
done
# RSS = anonymous memory (heap, stacks) + mapped file pages (mostly the
# binary's own text and data, which the kernel can drop under pressure).
printf '%-26s %12s %12s %14s %10s\n' member "RSS med MiB" "RSS max MiB" "anon med MiB" "CPU %core"
for k in h0 h1 h2 e0 e1 e2; do
	t1=$(cputicks "${PID[$k]}")
	med=$(tr ' ' '\n' <<<"${SAMPLES[$k]}" | grep . | median)
	max=$(tr ' ' '\n' <<<"${SAMPLES[$k]}" | grep . | sort -n | tail -1)
	anon=$(tr ' ' '\n' <<<"${ANON[$k]}" | grep . | median)
	cpu=$(echo "($t1 - ${T0[$k]}) * 100 / $TICK / $DURATION" | bc -l)
	case $k in
	h*) label="hapair ${names[${k#h}]} (${roles[${k#h}]})" ;;
	e*) label="stock etcd${k#e}" ;;
	esac
	printf '%-26s %12.1f %12.1f %14.1f %10.2f\n' "$label" "$(echo "$med/1024" | bc -l)" "$(echo "$max/1024" | bc -l)" \
		"$(echo "$anon/1024" | bc -l)" "$cpu"
done
# etcd's own metrics draw promtool warnings (etcd_debugging_*_total gauges);
# only ours are judged here.
lint=$(curl -s "http://127.0.0.1:$((BASE + 22))/metrics" | promtool check metrics 2>&1 | grep hapair_ || true)
echo "promtool check metrics, hapair_witness_*: ${lint:-ok}"

echo "== join: witness removed, data dir wiped, rejoined ${JOINS} times"
ids() { curl -s -X POST "http://127.0.0.1:$BASE/v3/cluster/member/list" -d '{}' | jq -r '.members[] | select(.peerURLs[0] == "'"http://127.0.0.1:$((BASE + 12))"'") | .ID'; }
times=()
for ((j = 0; j < JOINS; j++)); do
	kill -TERM "${PID[h2]}"; wait "${PID[h2]}" 2>/dev/null || true
	id=$(ids)
	hex=$(python3 -c "print('%x' % $id)")
	ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$BASE" member remove "$hex" >/dev/null
	rm -rf "$WORK/h-witness"
	# etcd refuses MemberAdd until every member has been connected for 5 s;
	# wait that out so the figure is the join itself.
	sleep 6
	t0=$(date +%s%N)
	start_hapair 2 join
	wait_health "http://127.0.0.1:$((BASE + 22))/health" 60
	t1=$(date +%s%N)
	times+=("$(((t1 - t0) / 1000000))")
done
printf 'join start→ready ms: %s; median %s ms\n' "${times[*]}" "$(printf '%s\n' "${times[@]}" | median)"
printf 'load average at end: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
