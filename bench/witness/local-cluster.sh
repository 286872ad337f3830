#!/usr/bin/env bash
# local-cluster.sh — start three hapair-witness processes on loopback (two
# data members nodeA/nodeB and one witness), print the member list and
# health, and keep them running until Ctrl-C, then stop them cleanly.
#
#   bench/witness/local-cluster.sh            # ports 23790.. (BASE=23790)
#   BASE=24790 KEEP=0 bench/witness/local-cluster.sh   # KEEP=0: stop after printing
#
# Plain http on 127.0.0.1 only (insecure: true); data in a temp dir removed at exit.
set -euo pipefail

BASE=${BASE:-23790}
KEEP=${KEEP:-1}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d /tmp/hapair-local.XXXXXX)
BIN=${HAPAIR_WITNESS:-$WORK/hapair-witness}
pids=()

cleanup() {
	trap - INT TERM EXIT
	echo "stopping members..."
	# One at a time: a raft leader stopped while its peers are still up hands
	# the leadership over at once; stopped last, it waits for a transfer that
	# cannot happen (several seconds).
	for p in "${pids[@]}"; do
		kill -TERM "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	rm -rf "$WORK"
	echo "stopped"
}
trap cleanup INT TERM EXIT

if [[ ! -x $BIN ]]; then
	(cd "$ROOT" && go build -o "$BIN" ./cmd/hapair-witness)
fi

names=(nodeA nodeB witness)
roles=(member member witness)
cluster=""
for i in 0 1 2; do
	cluster+="${cluster:+,}${names[i]}=http://127.0.0.1:$((BASE + 10 + i))"
done
for i in 0 1 2; do
	n=${names[i]}
	"$BIN" --name "$n" --role "${roles[i]}" --insecure \
		--data-dir "$WORK/$n" \
		--listen-peer-urls "http://127.0.0.1:$((BASE + 10 + i))" \
		--advertise-peer-urls "http://127.0.0.1:$((BASE + 10 + i))" \
		--listen-client-urls "http://127.0.0.1:$((BASE + i))" \
		--advertise-client-urls "http://127.0.0.1:$((BASE + i))" \
		--metrics-listen "127.0.0.1:$((BASE + 20 + i))" \
		--initial-cluster "$cluster" --config /dev/null \
		2>"$WORK/$n.log" &
	pids+=($!)
done

endpoints="http://127.0.0.1:$BASE,http://127.0.0.1:$((BASE + 1)),http://127.0.0.1:$((BASE + 2))"
for _ in $(seq 100); do
	ok=0
	for i in 0 1 2; do
		curl -sf "http://127.0.0.1:$((BASE + 20 + i))/health" >/dev/null && ok=$((ok + 1))
	done
	[[ $ok == 3 ]] && break
	sleep 0.1
done

echo "== members (client endpoints $endpoints)"
curl -s -X POST "http://127.0.0.1:$BASE/v3/cluster/member/list" -d '{}' |
	jq -r '.members[] | "\(.name)\tid=\(.ID)\tpeer=\(.peerURLs | join(","))\tclient=\(.clientURLs | join(","))"'
echo "== health (metrics listeners)"
for i in 0 1 2; do
	printf '%-8s %s  ' "${names[i]}" "$(curl -s "http://127.0.0.1:$((BASE + 20 + i))/health")"
	curl -s "http://127.0.0.1:$((BASE + 20 + i))/metrics" | grep -E '^hapair_witness_(is_leader|members_healthy) ' | tr '\n' ' '
	echo
done
if [[ $KEEP == 1 ]]; then
	echo "running; logs in $WORK/*.log; Ctrl-C stops"
	wait
fi
