#!/usr/bin/env bash
# The main job. Until the lab lands this starts a local three-member cluster of
# hapair-witness processes on loopback and prints its members and health.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x lab/demo.sh ]; then exec lab/demo.sh "$@"; fi
exec bench/witness/local-cluster.sh "$@"
