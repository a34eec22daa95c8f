#!/usr/bin/env bash
# Counts the instructions the client spends per lock + release cycle (one task, one lock, a private redis-server),
# for leasehold's mutex and for the best Rust peer's recipe (rslock's: SET NX PX, then an owner-checked delete
# script) on the same client library, under callgrind: instruction counts are repeatable where timings on a shared VM
# are not. Each recipe runs twice (FEW and MANY cycles); the difference divided by the difference in cycles leaves
# out what does not repeat per cycle (start-up, connecting). Needs valgrind (installed with apt-get when missing).
# Usage: scripts/profile-client.sh [FEW MANY]   (defaults 300 1500; about a minute). The callgrind files of the MANY
# runs are kept in the directory printed at the end, for callgrind_annotate. To compare builds, point WORKER at
# another build's leasehold-worker (a copy of target/release/leasehold-worker from before a change).
set -euo pipefail
cd "$(dirname "$0")/.."
few="${1:-300}"
many="${2:-1500}"
scripts/ensure-redis.sh
if ! command -v valgrind >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq valgrind >/dev/null
fi
worker="${WORKER:-target/release/leasehold-worker}"
[ -n "${WORKER:-}" ] || cargo build -q --release -p leasehold-tests --bin leasehold-worker
dir="$(mktemp -d)"
port=$((20000 + RANDOM % 20000))
redis-server --port "$port" --save "" --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 400); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done # readiness poll
url="redis://127.0.0.1:$port"

# instructions RECIPE CYCLES: the client's instruction count for that many cycles.
instructions() {
  valgrind --tool=callgrind --callgrind-out-file="$dir/cg.$1.$2" "$worker" cycles "$url" "$1" "$2" \
    >"$dir/valgrind.$1.$2.log" 2>&1 || { cat "$dir/valgrind.$1.$2.log" >&2; exit 1; }
  grep -oP 'Collected : \K[0-9]+' "$dir/valgrind.$1.$2.log"
}
printf '%-10s %s\n' recipe "client instructions per cycle"
for recipe in peer leasehold; do
  a=$(instructions "$recipe" "$few")
  b=$(instructions "$recipe" "$many")
  printf '%-10s %d\n' "$recipe" $(((b - a) / (many - few)))
done
echo "callgrind files: $dir/cg.<recipe>.$many"
