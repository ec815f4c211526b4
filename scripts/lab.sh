#!/usr/bin/env bash
# The main job: start the private servers, build the lab (lockkit-lab) in release mode and
# measure every backend on this machine (`lockkit-lab`): throughput and
# latency against the servers' own bounds and the rslock crate, handoffs,
# memory per held lock, loss detection. Then stop the servers.
#
#   scripts/lab.sh                 full run (several minutes)
#   scripts/lab.sh --quick         short run (under 2 minutes)
#   scripts/lab.sh --backends redis,etcd --out DIR
#
# The report folder (default target/lab-report/) holds report.md,
# report.json and SVG plots.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/servers.sh up
trap 'scripts/servers.sh down' EXIT
set -a
# shellcheck disable=SC1091
. target/lockkit-servers/urls.env
set +a
cargo build --release --quiet -p lock-bench --bin lockkit-lab
"${CARGO_TARGET_DIR:-target}/release/lockkit-lab" "$@"
