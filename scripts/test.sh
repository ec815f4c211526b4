#!/usr/bin/env bash
# The whole test suite, as CI runs it: start the private servers, check
# formatting, run clippy with warnings as errors, run every test with every
# backend enabled, build the docs without warnings, stop the servers.
#
# With LOCKKIT_REQUIRE_SERVERS=1 a backend whose server is missing FAILS its
# tests instead of skipping them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/servers.sh up
trap 'scripts/servers.sh down' EXIT
set -a
# shellcheck disable=SC1091
. target/lockkit-servers/urls.env
set +a
export LOCKKIT_REQUIRE_SERVERS=1
# A fresh clone builds once: incremental state would only take disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

step() { printf '\n== %s\n' "$*"; }

step "rustfmt"
cargo fmt --all -- --check

step "clippy (warnings are errors)"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "tests, every backend"
cargo test --workspace --all-features

step "fault lab, smoke schedule (fails only on a safety violation predicted impossible, or a harness error)"
scripts/faults.sh --smoke

step "lab, quick mode (checks only that every backend produced figures)"
cargo run --quiet -p lock-bench --bin lockkit-lab -- --quick --out target/lab-smoke

step "examples, run as a user would (memory://, then each server)"
for url in memory:// "$LOCKKIT_REDIS_URL" "$LOCKKIT_REDLOCK_URL" "$LOCKKIT_ETCD_URL" "$LOCKKIT_POSTGRES_URL"; do
    LOCK_URL="$url" cargo run --quiet -p lockkit --all-features --example nightly_job
done
LOCK_URL=memory:// DATABASE_URL="$LOCKKIT_POSTGRES_URL" cargo run --quiet -p lockkit --all-features --example fenced_write

step "docs (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --quiet

step "packages, as crates.io would take them (manifests and contents; the tests above built the code)"
cargo publish --workspace --dry-run --no-verify --allow-dirty --quiet

step "all green"
