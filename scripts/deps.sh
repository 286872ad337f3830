#!/usr/bin/env bash
# Installs the Debian packages hapair's tests (default), lab or benchmarks need.
# Usage: scripts/deps.sh [test|lab|deploy|bench]...   Idempotent: installs only what is missing.
set -euo pipefail
declare -A sets=(
  [test]="postgresql-15 haproxy prometheus ansible ansible-lint systemd iproute2 iptables patroni python3-etcd keepalived nftables"
  [lab]="postgresql-15 patroni python3-etcd iproute2 iptables procps"
  # deploy/hosts: a Debian rootfs (debootstrap), systemd containers (nspawn), nsenter.
  [deploy]="debootstrap systemd-container util-linux iproute2"
  [bench]="haproxy nginx-light wrk openssl etcd-server etcd-client rsync lsyncd procps jq bc curl prometheus e2fsprogs util-linux"
)
want=()
for s in "${@:-test}"; do
  [ -n "${sets[$s]+x}" ] || { echo "deps.sh: unknown set $s (test, lab, deploy, bench)" >&2; exit 2; }
  want+=(${sets[$s]})
done
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "deps.sh: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
