#!/usr/bin/env bash
# Runs the test suite (scripts/test.sh's `cargo test --workspace --all-features`, or the cargo test arguments given)
# with two CPU-bound processes beside it, as on a shared CI runner: a test that fails here and passes alone is a flaky
# test (margins tied to the machine's speed, or a sleep standing in for an event). The busy processes end with it.
# Usage: scripts/test-under-load.sh [CARGO TEST ARGUMENTS...]
#   scripts/test-under-load.sh                      the whole suite
#   scripts/test-under-load.sh -p leasehold-tests --test it quorum
# LOAD_PROCESSES sets how many busy processes run (default 2: one per core of the CI machines).
set -euo pipefail
cd "$(dirname "$0")/.."
busy=()
stop_busy() {
    if [ "${#busy[@]}" -gt 0 ]; then
        kill "${busy[@]}" 2>/dev/null || true
    fi
}
trap stop_busy EXIT
for _ in $(seq "${LOAD_PROCESSES:-2}"); do
    # A pure CPU loop (no I/O, no memory): the kind of neighbour a shared runner has.
    sh -c 'while :; do :; done' &
    busy+=("$!")
done
echo "test-under-load: ${#busy[@]} busy processes beside the suite (pids ${busy[*]})" >&2
if [ "$#" -eq 0 ]; then
    set -- --workspace --all-features
fi
cargo test "$@"
