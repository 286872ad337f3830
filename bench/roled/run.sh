#!/bin/sh
# Measure hapair-roled by hand: idle CPU and RSS, /ha-health latency at
# 2,000 requests/s, and the role flip (leader-key change → the new ACTIVE's
# 200, two roled on fake Patronis). Needs Debian's etcd (etcd-server) and Go.
# Everything runs on 127.0.0.1 in a temp dir and is stopped at exit.
set -eu
cd "$(dirname "$0")/../.."
RATE=${RATE:-2000} DURATION=${DURATION:-10s} IDLE=${IDLE:-30s} FLIPS=${FLIPS:-20}
T=$(mktemp -d "${TMPDIR:-/tmp}/roledbench.XXXXXX")
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$T"; }
trap cleanup EXIT INT TERM
go build -o "$T/hapair-roled" ./cmd/hapair-roled
go build -o "$T/roledbench" ./bench/roled
etcd --name b1 --data-dir "$T/etcd" --listen-client-urls http://127.0.0.1:12379 \
  --advertise-client-urls http://127.0.0.1:12379 --listen-peer-urls http://127.0.0.1:12380 \
  --initial-advertise-peer-urls http://127.0.0.1:12380 --initial-cluster b1=http://127.0.0.1:12380 \
  --log-level warn >"$T/etcd.log" 2>&1 &
pids="$pids $!"
sleep 2
"$T/roledbench" patroni -listen 127.0.0.1:18008 -etcd http://127.0.0.1:12379 -member A 2>"$T/patroni.log" &
pids="$pids $!"
sleep 1
cat >"$T/roled.yaml" <<YML
node: A
listen: "127.0.0.1:17400"
etcd: {endpoints: ["http://127.0.0.1:12379"]}
patroni: {url: "http://127.0.0.1:18008"}
postgres: {enabled: false}
marker: {path: "$T/active"}
agent: {listen: "127.0.0.1:17401"}
YML
"$T/hapair-roled" --config "$T/roled.yaml" 2>"$T/roled.log" &
rpid=$!
pids="$pids $rpid"
i=0
until curl -fs -o /dev/null http://127.0.0.1:17400/ha-health 2>/dev/null; do
  i=$((i+1)); [ $i -lt 100 ] || { echo "roled not ACTIVE"; cat "$T/roled.log"; exit 1; }; sleep 0.1
done
echo "roled ACTIVE; measuring idle for $IDLE"
"$T/roledbench" idle -pid "$rpid" -duration "$IDLE"
echo "/ha-health at $RATE req/s for $DURATION"
"$T/roledbench" load -url http://127.0.0.1:17400/ha-health -rate "$RATE" -duration "$DURATION"
echo "RSS after load: $(grep VmRSS /proc/$rpid/status)"
kill "$rpid"; wait "$rpid" 2>/dev/null || true
kill $(echo $pids | awk '{print $2}') 2>/dev/null || true # the single-node fake Patroni
mkdir -p "$T/flip"
echo "role flip, $FLIPS flips"
"$T/roledbench" flip -etcd http://127.0.0.1:12379 -roled "$T/hapair-roled" -dir "$T/flip" -flips "$FLIPS"
