#!/usr/bin/env bash
# Runs the torture test (crates/leasehold-tests/tests/torture/) for longer than CI does: worker processes loop on one lock
# while faults are injected at random, and the checker prints one line. Installs redis-server when it is missing.
# Usage: scripts/torture.sh [SECONDS] [SEED]     (defaults: 600 s, a seed drawn from the clock; the seed is printed)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-redis.sh
export TORTURE_SECONDS="${1:-600}"
if [ -n "${2:-}" ]; then
  export TORTURE_SEED="$2"
fi
exec cargo test --release -q -p leasehold-tests --test torture -- --nocapture the_lock_keeps_its_contract_under_random_faults
