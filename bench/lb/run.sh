#!/usr/bin/env bash
# bench/lb/run.sh — hapair-lb side by side with HAProxy 2.6 and Nginx 1.22
# (Debian packages) and direct to the backend, on loopback, with wrk.
#
#   bench/lb/run.sh [throughput|switch|all]     (default all; run as root or a user that may run nginx)
#
# throughput: 100 B and 16 KiB responses from an Nginx backend (1 worker), each
#   proxy configured alike (keep-alive to the backend, least-connections), with
#   1 then 2 workers/threads (hapair-lb: GOMAXPROCS), ROUNDS rounds alternating
#   the targets. Prints throughput, p50/p99 and proxy CPU per request (from
#   /proc/<pid>/stat deltas, all processes of the proxy), medians and ratios.
#   Cell "tls": the 100 B response over HTTPS (wrk keep-alive), TLS terminated
#   by each proxy with the same ECDSA P-256 certificate, TLS 1.3 with
#   TLS_AES_128_GCM_SHA256 for every peer (what Go picks; OpenSSL would pick
#   AES-256 by the client's order), session resumption off everywhere (nginx
#   ssl_session_cache/ssl_session_tickets off; HAProxy tune.ssl.cachesize 0,
#   no-tls-tickets; hapair-lb tls-session-tickets: false, and Go keeps no
#   session cache), HTTP/2 offered by ALPN (wrk offers none: HTTP/1.1).
#   The 1,000-connection cell is this with CONNS=1000 SIZES=small WORKERS=1
#   (bench/all.sh runs it as its own part, lb-c1000).
# switch: role-switch following (bench/lb/flipper) through HAProxy with
#   `option httpchk GET /ha-health` at inter 2s fall 2 rise 2 and at inter
#   100ms fall 2 rise 1, and through hapair-lb with checks alone (100ms, 2, 1)
#   and with the etcd fast path (Debian etcd-server) at inter 2s fall 2 rise 2.
#
# Knobs: DUR (s per wrk run, 5), ROUNDS (3), CONNS (50), WRK_THREADS (2), FLIPS (10),
#   HLB_ENV (extra environment for hapair-lb, e.g. "GOGC=400"), HLB_CONF (extra
#   top-level lb.yaml lines for hapair-lb, e.g. "event-loop: on"); selection (same
#   method, fewer cells): SIZES ("small big tls"), WORKERS ("1 2"), KINDS ("direct
#   nginx haproxy hapair-lb"; nginx is the ratios' reference; SIZES cells: small
#   big tls). A/B runs: kind
#   "hapair-lb-b" runs HLB_BIN_B (a hapair-lb binary, default the one built)
#   with HLB_ENV_B and HLB_CONF_B instead of HLB_ENV and HLB_CONF, and
#   HLB_TLS_B (fields of its TLS listener, default "tls-session-tickets: false";
#   e.g. "engine: std, tls-session-tickets: false" for net/http's TLS path, ""
#   for a binary older than that field) instead of HLB_TLS_OPTS (the same for A).
# PROXY_CPUS (a taskset CPU list) pins every thread of each proxy there once it
#   listens; with the script itself under `taskset -c 0`, wrk and the backend
#   then share CPU 0 and each proxy has CPU 1 to itself (a diagnostic: is a
#   difference the proxy's own, or how it shares the cores?).
# Each round also prints p99.9 (from a wrk script that only reports; the
#   requests stay wrk's static ones), and a per-round p99 ratio table.
# Packages: nginx-light (or nginx), haproxy, wrk, openssl, etcd-server; Go to build.
set -euo pipefail
PART=${1:-all}
DUR=${DUR:-5}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-50}
WRK_THREADS=${WRK_THREADS:-2}
FLIPS=${FLIPS:-10}
SIZES=${SIZES:-small big tls}
WORKERS=${WORKERS:-1 2}
KINDS=${KINDS:-direct nginx haproxy hapair-lb}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
W=$(mktemp -d "${TMPDIR:-/tmp}/hapair-lb-bench.XXXXXX")
chmod 755 "$W"
PIDS=()

cleanup() {
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
	rm -rf "$W"
}
trap cleanup EXIT

for b in nginx haproxy wrk openssl go; do
	command -v $b >/dev/null || { echo "missing $b (Debian: nginx-light haproxy wrk openssl; Go)" >&2; exit 1; }
done
# Every client connection is a descriptor in wrk and two in each proxy.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" || true

BE=127.0.0.1:18080      # backend
NGX=127.0.0.1:18090     # nginx proxy
HAP=127.0.0.1:18091     # haproxy
HLB=127.0.0.1:18092     # hapair-lb
HLB_B=127.0.0.1:18093   # hapair-lb-b (A/B runs)
BE_TLS=127.0.0.1:18441  # the same, over TLS (cell "tls")
NGX_TLS=127.0.0.1:18443
HAP_TLS=127.0.0.1:18444
HLB_TLS=127.0.0.1:18445
HLB_B_TLS=127.0.0.1:18446
NODE_A=127.0.0.1:18081  # flipper nodes
NODE_B=127.0.0.1:18082
ETCD=127.0.0.1:23790

echo "building hapair-lb and flipper..."
(cd "$ROOT" && go build -o "$W/hapair-lb" ./cmd/hapair-lb && go build -o "$W/flipper" ./bench/lb/flipper)

# One ECDSA P-256 certificate for every TLS listener; HAProxy wants the
# certificate and key in one file.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=127.0.0.1 \
	-addext subjectAltName=IP:127.0.0.1 -keyout "$W/tls.key" -out "$W/tls.crt" 2>/dev/null
cat "$W/tls.crt" "$W/tls.key" >"$W/tls.pem"
chmod 644 "$W/tls.key" "$W/tls.pem" # nginx workers may run as another user
# nginx and HAProxy alike: the cipher Go chooses, no resumption.
NGX_TLS_CONF="ssl_certificate $W/tls.crt; ssl_certificate_key $W/tls.key;
        ssl_protocols TLSv1.2 TLSv1.3; ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256;
        ssl_session_cache off; ssl_session_tickets off;"

start() { # start NAME CMD... ; records PID in var PID_NAME
	local name=$1; shift
	"$@" >"$W/$name.log" 2>&1 &
	local pid=$!
	PIDS+=("$pid")
	printf -v "PID_$name" '%s' "$pid"
}
stop() { # stop PID
	kill "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}
wait_port() {
	for _ in $(seq 200); do
		(exec 3<>"/dev/tcp/${1%:*}/${1#*:}") 2>/dev/null && return 0
		sleep 0.05
	done
	echo "port $1 not up" >&2; return 1
}
pids_of() { # a pid and its children
	echo "$1 $(ps -o pid= --ppid "$1" | tr '\n' ' ')"
}
cpu_ticks() {
	local t=0 p f
	for p in $1; do
		[ -r /proc/$p/stat ] || continue
		f=$(sed 's/^.*) //' /proc/$p/stat)
		set -- $f
		t=$((t + ${12} + ${13})) # utime stime (fields 14, 15 of stat)
	done
	echo $t
}
HZ=$(getconf CLK_TCK)

nginx_conf() { # nginx_conf DIR WORKERS BODY
	mkdir -p "$1/logs" "$1/tmp"
	cat >"$1/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes $2;
pid $1/nginx.pid;
error_log $1/logs/error.log warn;
events { worker_connections 4096; multi_accept on; }
http {
    access_log off;
    client_body_temp_path $1/tmp/body; proxy_temp_path $1/tmp/proxy;
    fastcgi_temp_path $1/tmp/fcgi; uwsgi_temp_path $1/tmp/uwsgi; scgi_temp_path $1/tmp/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 60s;
$3
}
EOF
}

# ---------------------------------------------------------------- backend
setup_backend() {
	mkdir -p "$W/www"
	head -c 99 /dev/zero | tr '\0' 'a' >"$W/www/small"; echo >>"$W/www/small"
	head -c 16383 /dev/zero | tr '\0' 'b' >"$W/www/big"; echo >>"$W/www/big"
	chmod -R a+rX "$W/www"
	nginx_conf "$W/backend" 1 "    server { listen $BE backlog=4096; root $W/www; default_type text/plain; location / { } }
    server { listen $BE_TLS ssl backlog=4096; $NGX_TLS_CONF root $W/www; default_type text/plain; location / { } }"
	start backend nginx -e "$W/backend/logs/error.log" -p "$W/backend" -c "$W/backend/nginx.conf"
	wait_port $BE
}

start_proxy() { # start_proxy KIND WORKERS → sets PROXY_PID, PROXY_ADDR, PROXY_TLS_ADDR
	local kind=$1 n=$2
	case $kind in
	direct) PROXY_PID=""; PROXY_ADDR=$BE; PROXY_TLS_ADDR=$BE_TLS; return ;;
	nginx)
		local loc="location / { proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection \"\";
            proxy_set_header Host \$host; proxy_set_header X-Real-IP \$remote_addr;
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for; proxy_set_header X-Forwarded-Proto \$scheme; }"
		nginx_conf "$W/ngx" "$n" "    upstream be { least_conn; server $BE; keepalive 64; keepalive_requests 1000000; }
    server { listen $NGX backlog=4096; $loc }
    server { listen $NGX_TLS ssl http2 backlog=4096; $NGX_TLS_CONF $loc }"
		start ngx nginx -e "$W/ngx/logs/error.log" -p "$W/ngx" -c "$W/ngx/nginx.conf"
		PROXY_PID=$PID_ngx; PROXY_ADDR=$NGX; PROXY_TLS_ADDR=$NGX_TLS ;;
	haproxy)
		cat >"$W/haproxy.cfg" <<EOF
global
    nbthread $n
    maxconn 4096
    tune.ssl.cachesize 0
    ssl-default-bind-ciphersuites TLS_AES_128_GCM_SHA256
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
    option forwardfor
    http-reuse always
frontend fe
    bind $HAP
    bind $HAP_TLS ssl crt $W/tls.pem alpn h2,http/1.1 no-tls-tickets
    default_backend be
backend be
    balance leastconn
    server s1 $BE
EOF
		start hap haproxy -db -f "$W/haproxy.cfg"
		PROXY_PID=$PID_hap; PROXY_ADDR=$HAP; PROXY_TLS_ADDR=$HAP_TLS ;;
	hapair-lb)
		hlb_yaml "$HLB" "$HLB_TLS" "${HLB_CONF:-}" "${HLB_TLS_OPTS-tls-session-tickets: false}" >"$W/lb.yaml"
		start hlb env GOMAXPROCS="$n" ${HLB_ENV:-} "$W/hapair-lb" --config "$W/lb.yaml"
		PROXY_PID=$PID_hlb; PROXY_ADDR=$HLB; PROXY_TLS_ADDR=$HLB_TLS ;;
	hapair-lb-b)
		hlb_yaml "$HLB_B" "$HLB_B_TLS" "${HLB_CONF_B:-}" "${HLB_TLS_B-tls-session-tickets: false}" >"$W/lb-b.yaml"
		start hlbb env GOMAXPROCS="$n" ${HLB_ENV_B:-} "${HLB_BIN_B:-$W/hapair-lb}" --config "$W/lb-b.yaml"
		PROXY_PID=$PID_hlbb; PROXY_ADDR=$HLB_B; PROXY_TLS_ADDR=$HLB_B_TLS ;;
	esac
	wait_port "$PROXY_ADDR"
	wait_port "$PROXY_TLS_ADDR"
	if [ -n "${PROXY_CPUS:-}" ] && [ -n "$PROXY_PID" ]; then
		for p in $(pids_of "$PROXY_PID"); do taskset -a -p -c "$PROXY_CPUS" "$p" >/dev/null; done
	fi
}

hlb_yaml() { # hlb_yaml LISTEN TLS-LISTEN EXTRA-LINES TLS-FIELDS: the hapair-lb config, alike for A and B
	cat <<EOF
log-level: warn
admin: {listen: ""}
$3
listeners:
  - {name: web, listen: "$1", backend: be}
  - {name: web-tls, listen: "$2", backend: be, tls: {cert-file: "$W/tls.crt", key-file: "$W/tls.key"}${4:+, $4}}
backends:
  - name: be
    kind: pool
    balance: least-conn
    check: {enabled: false}
    servers:
      - {name: s1, address: "$BE"}
EOF
}

to_us() { # wrk latency "1.23ms" → µs
	awk -v v="$1" 'BEGIN{ n=v+0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n*1000; else if (v ~ /s$/) print n*1000000; else print n }'
}

cell_url() { # cell_url CELL → what wrk loads for that cell on the current proxy
	case $1 in
	tls) echo "https://$PROXY_TLS_ADDR/small" ;;
	*) echo "http://$PROXY_ADDR/$1" ;;
	esac
}

run_wrk() { # run_wrk URL PIDS → "rps p50us p99us cpu_us_per_req p999us"
	local t0 t1 out
	# warm-up (connections, pools)
	wrk -t"$WRK_THREADS" -c"$CONNS" -d1s "$1" >/dev/null 2>&1 || true
	t0=$(cpu_ticks "$2")
	out=$(wrk -t"$WRK_THREADS" -c"$CONNS" -d"${DUR}s" --latency -s "$W/p999.lua" "$1")
	t1=$(cpu_ticks "$2")
	local rps reqs p50 p99 errs
	rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
	reqs=$(awk '/requests in/ {print $1}' <<<"$out")
	p50=$(to_us "$(awk '$1=="50%" {print $2}' <<<"$out")")
	p99=$(to_us "$(awk '$1=="99%" {print $2}' <<<"$out")")
	local p999; p999=$(awk '$1=="P999" {print $2}' <<<"$out")
	errs=$(awk '/Non-2xx|Socket errors/ {print}' <<<"$out" | tr '\n' ' ')
	[ -n "$errs" ] && echo "   wrk: $errs" >&2
	local cpu="-"
	[ -n "$2" ] && cpu=$(awk -v d=$((t1 - t0)) -v hz="$HZ" -v r="$reqs" 'BEGIN{printf "%.1f", d*1e6/hz/r}')
	echo "$rps $p50 $p99 $cpu ${p999:--}"
}

throughput() {
	setup_backend
	# Reports p99.9 at the end of a run; defines no request/response hook, so
	# wrk keeps sending its static request and does not parse bodies.
	echo 'done = function(s, latency, r) io.write(string.format("P999 %d\n", latency:percentile(99.9))) end' >"$W/p999.lua"
	local res="$W/results.txt"; : >"$res"
	for n in $WORKERS; do
		for round in $(seq "$ROUNDS"); do
			for kind in $KINDS; do
				start_proxy $kind $n
				local pids=""
				[ -n "$PROXY_PID" ] && pids=$(pids_of "$PROXY_PID")
				for size in $SIZES; do
					r=$(run_wrk "$(cell_url "$size")" "$pids")
					printf '%-11s w=%d %-5s round %d: rps %9s p50 %7sus p99 %7sus cpu/req %6sus p99.9 %7sus\n' $kind $n $size $round $r
					echo "$kind $n $size $round $r" >>"$res"
				done
				[ -n "$PROXY_PID" ] && stop "$PROXY_PID"
			done
		done
	done
	echo
	echo "== medians over $ROUNDS rounds (wrk -t$WRK_THREADS -c$CONNS -d${DUR}s, loopback, 2 cores shared) =="
	awk -v kinds="$KINDS" -v workers="$WORKERS" -v sizes="$SIZES" '
	function median(s,   a, n, i, j, t) { n = split(s, a, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }; return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
	function ratio(a, b) { return (b + 0 > 0 && a != "-") ? sprintf("%.2f", a / b) : "-" }
	{ k = $1 " " $2 " " $3; rps[k] = rps[k] " " $5; p50[k] = p50[k] " " $6; p99[k] = p99[k] " " $7; cpu[k] = cpu[k] " " $8
	  p999[k] = p999[k] " " $9; keys[k] = 1; rp99[k " " $4] = $7; if ($4 > nr) nr = $4 }
	END {
		nk = split(kinds, kind, " "); nw = split(workers, wk, " "); ns = split(sizes, sz, " ")
		printf "%-11s %-3s %-5s %10s %9s %9s %9s %9s | %8s %8s %8s %8s %8s %8s\n", "target", "w", "size", "req/s", "p50 us", "p99 us", "p99.9 us", "cpu us/r", "thr/ngx", "thr/dir", "cpu/ngx", "p99/ngx", "p99/hap", "thr/hap"
		for (w = 1; w <= nw; w++) for (s = 1; s <= ns; s++) {
			n = wk[w]; size = sz[s]
			ng = "nginx " n " " size; di = "direct " n " " size; hp = "haproxy " n " " size
			for (i = 1; i <= nk; i++) {
				k = kind[i] " " n " " size
				if (!(k in keys)) continue
				r = median(rps[k]); c = (cpu[k] ~ /-/) ? "-" : median(cpu[k]); q = (p999[k] ~ /-/) ? "-" : median(p999[k])
				printf "%-11s %-3d %-5s %10.0f %9.0f %9.0f %9s %9s | %8s %8s %8s %8s %8s %8s\n", kind[i], n, size, r, median(p50[k]), median(p99[k]), q, c,
					ratio(r, median(rps[ng])), ratio(r, median(rps[di])), ratio(c, median(cpu[ng])), ratio(median(p99[k]), median(p99[ng])), ratio(median(p99[k]), median(p99[hp])),
					ratio(r, median(rps[hp]))
			}
		}
		# The p99 ratio of each round (same round, so the same machine load).
		print ""
		print "p99 ratio per round (vs nginx / vs haproxy):"
		for (w = 1; w <= nw; w++) for (s = 1; s <= ns; s++) for (i = 1; i <= nk; i++) {
			if (kind[i] !~ /^hapair/) continue
			n = wk[w]; size = sz[s]; k = kind[i] " " n " " size
			if (!(k in keys)) continue
			line = sprintf("  %-11s w=%d %-5s", kind[i], n, size)
			for (r = 1; r <= nr; r++) line = line sprintf("  %s/%s", ratio(rp99[k " " r], rp99["nginx " n " " size " " r]), ratio(rp99[k " " r], rp99["haproxy " n " " size " " r]))
			print line
		}
	}' "$res"
	stop "$PID_backend"
}

# ---------------------------------------------------------------- role switch
haproxy_switch() { # haproxy_switch INTER FALL RISE
	cat >"$W/hap-switch.cfg" <<EOF
global
    nbthread 1
defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 30s
frontend fe
    bind $HAP
    default_backend be
backend be
    balance leastconn
    option httpchk GET /ha-health
    http-check expect status 200
    server A $NODE_A check inter $1 fall $2 rise $3
    server B $NODE_B check inter $1 fall $2 rise $3
EOF
	start hsw haproxy -db -f "$W/hap-switch.cfg"
	wait_port $HAP
}

hapair_switch() { # hapair_switch INTERVAL FALL RISE ETCD(0|1)
	local etcd_eps="[]" fast=false
	if [ "$4" = 1 ]; then etcd_eps="[http://$ETCD]"; fast=true; fi
	cat >"$W/lb-switch.yaml" <<EOF
log-level: warn
admin: {listen: ""}
cluster: bench
etcd: {endpoints: $etcd_eps}
listeners:
  - {name: web, listen: "$HLB", backend: app}
backends:
  - name: app
    kind: active-passive
    hold-timeout: 5s
    etcd-fast-path: $fast
    check: {path: /ha-health, interval: $1, timeout: 80ms, fall: $2, rise: $3}
    servers:
      - {name: A, address: "$NODE_A"}
      - {name: B, address: "$NODE_B"}
EOF
	start hlbsw "$W/hapair-lb" --config "$W/lb-switch.yaml"
	wait_port $HLB
}

switch() {
	local have_etcd=0
	if command -v etcd >/dev/null; then
		start etcd etcd --name bench --data-dir "$W/etcd" --listen-client-urls "http://$ETCD" \
			--advertise-client-urls "http://$ETCD" --listen-peer-urls http://127.0.0.1:23800 \
			--initial-advertise-peer-urls http://127.0.0.1:23800 --initial-cluster bench=http://127.0.0.1:23800
		wait_port $ETCD && have_etcd=1
	fi
	echo "== role switch following, $FLIPS flips each =="
	haproxy_switch 2s 2 2
	"$W/flipper" -url "http://$HAP" -a $NODE_A -b $NODE_B -flips "$FLIPS" -settle 6s -label "haproxy inter 2s fall 2 rise 2"
	stop "$PID_hsw"
	haproxy_switch 100ms 2 1
	"$W/flipper" -url "http://$HAP" -a $NODE_A -b $NODE_B -flips "$FLIPS" -settle 2s -label "haproxy inter 100ms fall 2 rise 1"
	stop "$PID_hsw"
	hapair_switch 100ms 2 1 0
	"$W/flipper" -url "http://$HLB" -a $NODE_A -b $NODE_B -flips "$FLIPS" -settle 2s -label "hapair-lb checks only, interval 100ms fall 2 rise 1"
	stop "$PID_hlbsw"
	if [ $have_etcd = 1 ]; then
		hapair_switch 2s 2 2 1
		"$W/flipper" -url "http://$HLB" -a $NODE_A -b $NODE_B -flips "$FLIPS" -settle 2s -etcd "http://$ETCD" \
			-key /hapair/bench/active -label "hapair-lb etcd fast path, interval 2s fall 2 rise 2"
		stop "$PID_hlbsw"
	else
		echo "(etcd not installed: Debian etcd-server; fast-path run skipped)"
	fi
}

case $PART in
throughput) throughput ;;
switch) switch ;;
all) throughput; echo; switch ;;
*) echo "usage: $0 [throughput|switch|all]" >&2; exit 2 ;;
esac
