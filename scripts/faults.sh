#!/usr/bin/env bash
# The fault lab: inject real faults (paused and killed holders, killed,
# restarted and paused servers, a delayed or cut network, a jumping server
# clock) under a lock workload of client processes, on private servers of
# its own, and check the recorded history. Prints the fault matrix and
# writes it to target/lockkit-faults/<run>/ (matrix.md, matrix.json,
# histories).
#
#   scripts/faults.sh --smoke            # 9 cells, under 3 minutes (CI)
#   scripts/faults.sh [--full]           # every fault on every backend; also
#                                        # regenerates docs/faults/decision-matrix.md
#   scripts/faults.sh --full --seed 7    # another reproducible schedule
#   scripts/faults.sh --only semaphore,read-write --modes-into docs/faults/fault-matrix.md
#                                        # only the semaphore and read-write cells;
#                                        # replaces their section of the page
#
# Exit status: 0 as predicted; 1 a safety violation in a cell predicted
# safe; 2 a harness error. Timing never fails it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

args=("$@")
full=1
# A partial run (--only) never rewrites the generated pages.
for a in "$@"; do [[ $a == --smoke || $a == --only ]] && full=0; done
if ((full)); then args+=(--decision docs/faults/decision-matrix.md); fi
# The servers (and libfaketime, for the clock-jump cells) come from Debian;
# the lab starts private instances of its own, never the shared ones.
scripts/servers.sh install
cargo build --quiet -p lock-faults
status=0
"${CARGO_TARGET_DIR:-target}/debug/lock-faults" run "${args[@]}" || status=$?
if ((full)) && ((status != 2)); then
    # The guide's measured decision matrix is the generated one.
    page=docs/guide/measurements.md
    awk -v generated=docs/faults/decision-matrix.md '
        /<!-- faults:begin -->/ { print; while ((getline line < generated) > 0) { gsub(/\(fault-matrix\.md\)/, "(../faults/fault-matrix.md)", line); print line }; skip = 1; next }
        /<!-- faults:end -->/ { skip = 0 }
        !skip { print }' "$page" >"$page.new" && mv "$page.new" "$page"
fi
exit "$status"
