#!/usr/bin/env bash
# failures.sh LOG DIR: what failed in a `go test -v` log of the package in
# DIR, in a few lines. make test prints it last when the lab or the
# deployment test fails, because CI keeps only the end of the output and the
# reason is otherwise hundreds of lines above it (a lab scenario's failure is
# followed by every later scenario's report).
#
# It prints the --- FAIL lines, the lines logged by the package's own
# t.Error/t.Fatal calls (found by their file:line in DIR's _test.go files)
# with the two lines after each, and the lab's "FAIL: reason" result lines.
set -uo pipefail
log=$1 dir=$2
[ -r "$log" ] || { echo "failures.sh: $log not readable"; exit 0; }
# file.go:NN: for every t.Error*/t.Fatal* call in the package's tests.
sites=$(grep -n -E '\bt\.(Error|Errorf|Fatal|Fatalf)\(' "$dir"/*_test.go 2>/dev/null |
	awk -F: '{n=split($1, p, "/"); printf "%s:%s: \n", p[n], $2}')
echo "=== what failed (from $log)"
grep -E -- '--- FAIL' "$log" | tail -n 40
if [ -n "$sites" ]; then
	grep -n -F -A2 -f <(printf '%s' "$sites") "$log" | cut -c1-400 | tail -n 60
fi
grep -E '^ +FAIL: ' "$log" | cut -c1-400 | tail -n 40
exit 0
