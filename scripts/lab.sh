#!/usr/bin/env bash
# The main job: start the private servers and compare the backends on this
# machine (throughput and latency, side by side), then stop the servers.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/servers.sh up
trap 'scripts/servers.sh down' EXIT
set -a
# shellcheck disable=SC1091
. target/lockkit-servers/urls.env
set +a
cargo run --release --quiet --features full --example compare -- "$@"
