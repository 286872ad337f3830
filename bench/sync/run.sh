#!/bin/sh
# Side-by-side benchmark: syncdir vs lsyncd (default.rsync, delay 15 and 0)
# and plain rsync -a / rsync -a --fsync to an rsync daemon, all on loopback.
# Run by hand, as root:  sudo bench/sync/run.sh [-skip-delay15] [-skip-bulk | -bulk-only]
#   [-small 20] [-rounds 3] [-work DIR]   (wrap in flock /tmp/hapair-bench.lock on shared machines)
#   -work DIR: the trees go there (default: a temp dir). Put it on a file system
#   whose create cost is steady, e.g. a loop-mounted ext4 with default options;
#   the README shows a root file system where it was not.
# Profiling syncdir alone: -syncdir-only [-scenario burst|big] [-cpuprofile F]
#   [-trace F: syncdir's debug timeline per request/batch, JSON, ns times]
#   [-syncfs-min-files N] [-insecure: syncdir without TLS, to see what encryption costs]
# Needs Debian packages: lsyncd rsync (and Go to build the driver).
set -eu
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ]; then
	echo "run.sh: run as root (the rsync daemon writes as root; lsyncd watches the source)" >&2
	exit 1
fi
for b in lsyncd rsync go; do
	command -v "$b" >/dev/null || { echo "run.sh: $b missing (apt-get install -y lsyncd rsync)" >&2; exit 1; }
done
echo "lsyncd: $(lsyncd --version 2>&1 | head -1); $(rsync --version | head -1)"
echo "host: $(nproc) cpus, $(uname -r)"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/sync-bench" ./bench/sync
"$bin/sync-bench" "$@"
