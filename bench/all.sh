#!/usr/bin/env bash
# bench/all.sh (make bench) — every side-by-side benchmark the project has, one
# after another, then one table (bench/report) written to bench/RESULTS.md:
#
#   balancer  bench/lb/run.sh throughput + switch   vs Nginx 1.22 / HAProxy 2.6
#             (cells 100 B, 16 KiB, 100 B over TLS; then 1,000 connections, 100 B)
#   sync      bench/sync/run.sh                      vs lsyncd + rsync
#   witness   bench/witness/bench.sh                 vs stock etcd
#   roled     bench/roled/run.sh                     /ha-health load, idle cost, role flip
#
# BENCH_QUICK=1: a few minutes (1 round, short runs), for a first look;
# default: the full runs the README's figures come from (about 25 min).
# BENCH_PARTS="lb sync witness roled" picks parts; BENCH_OUT=DIR keeps the logs
# (default bin/bench). Run as root: the sync bench needs it, and so does the
# loop-mounted ext4 volume every part's files go on (/var/tmp/hapair-bench.*),
# made here and removed at the end (without root: no volume, no sync part),
# because this VM's root file system gets
# slower with every create/delete cycle (README, syncdir). Serialised with
# flock /tmp/hapair-bench.lock so that no two timing runs share the cores.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PATH="$PATH:/usr/local/go/bin"
QUICK=${BENCH_QUICK:-0}
PARTS=${BENCH_PARTS:-lb sync witness roled}
OUT=${BENCH_OUT:-$ROOT/bin/bench}
ROOTUSER=0; [ "$(id -u)" = 0 ] && ROOTUSER=1
if [ $ROOTUSER = 0 ]; then
	echo "bench/all.sh: not root: no loop-mounted volume (files go to ${TMPDIR:-/tmp}) and no sync part (it needs root)" >&2
	PARTS=${PARTS//sync/}
fi

exec 9>/tmp/hapair-bench.lock
flock -n 9 || { echo "bench/all.sh: waiting for another timing run (/tmp/hapair-bench.lock)" >&2; flock 9; }

[ $ROOTUSER = 1 ] && scripts/deps.sh bench
mkdir -p "$OUT"
rm -f "$OUT"/*.log

IMG=/var/tmp/hapair-bench.img
MNT=/var/tmp/hapair-bench.mnt
cleanup() {
	[ $ROOTUSER = 1 ] || return 0
	cd "$ROOT"
	if mountpoint -q "$MNT"; then umount "$MNT" || umount -l "$MNT" || true; fi
	rmdir "$MNT" 2>/dev/null || true
	rm -f "$IMG"
}
trap cleanup EXIT
if [ $ROOTUSER = 1 ]; then
	cleanup
	mkdir -p "$MNT"
	truncate -s 8G "$IMG"
	mkfs.ext4 -q -F "$IMG"
	mount -o loop "$IMG" "$MNT"
	chmod 1777 "$MNT"
	export TMPDIR=$MNT
	echo "bench: files on $MNT (loop-mounted ext4, default options)"
fi

if [ "$QUICK" = 1 ]; then
	LB_ENV=(DUR=3 ROUNDS=1 FLIPS=4)
	LB_C1000_ROUNDS=1
	SYNC_ARGS=(-rounds 1 -small 5 -slow-small 1 -skip-delay15)
	WIT_ENV=(DURATION=20 JOINS=2)
	ROLED_ENV=(IDLE=10s DURATION=5s FLIPS=5)
else
	LB_ENV=()
	LB_C1000_ROUNDS=2
	SYNC_ARGS=(-rounds 5)
	WIT_ENV=()
	ROLED_ENV=()
fi

failed=()
part() { # part NAME CMD...: runs one benchmark, its output into $OUT/NAME.log
	local name=$1; shift
	echo "== $name: $*"
	local t0=$SECONDS
	if "$@" >"$OUT/$name.log" 2>&1; then
		echo "   done in $((SECONDS - t0)) s"
	else
		echo "   FAILED after $((SECONDS - t0)) s (log: $OUT/$name.log)"; tail -n 20 "$OUT/$name.log" | sed 's/^/   | /'
		failed+=("$name")
	fi
}

for p in $PARTS; do
	case $p in
	lb)
		part lb-throughput env "${LB_ENV[@]}" bench/lb/run.sh throughput
		part lb-c1000 env "${LB_ENV[@]}" CONNS=1000 SIZES=small WORKERS=1 ROUNDS=$LB_C1000_ROUNDS bench/lb/run.sh throughput
		part lb-switch env "${LB_ENV[@]}" bench/lb/run.sh switch ;;
	sync) part sync bench/sync/run.sh -work "$MNT/sync" "${SYNC_ARGS[@]}" ;;
	witness) part witness env "${WIT_ENV[@]}" bench/witness/bench.sh ;;
	roled) part roled env "${ROLED_ENV[@]}" bench/roled/run.sh ;;
	*) echo "bench/all.sh: unknown part $p (lb sync witness roled)" >&2; exit 2 ;;
	esac
done

mode=full; [ "$QUICK" = 1 ] && mode=quick
go run ./bench/report -dir "$OUT" -mode "$mode" -commit "$(git describe --always --dirty 2>/dev/null || echo unknown)" \
	-o bench/RESULTS.md
[ ${#failed[@]} -eq 0 ] || { echo "bench: parts failed: ${failed[*]}" >&2; exit 1; }
