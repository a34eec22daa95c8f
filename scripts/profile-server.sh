#!/usr/bin/env bash
# Counts the instructions redis-server spends per acquire + release cycle, for the raw floor and for leasehold's
# scripts at several locks per call (coalesced requests), under callgrind: instruction counts are repeatable where
# timings on a shared VM are not. The workload is 64 hot locks, acquired and released in turn, piped with
# `redis-cli --pipe`; the counters are zeroed around the measured part. Needs valgrind and python3 (installs
# valgrind with apt-get when missing). Usage: scripts/profile-server.sh   (about a minute)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-redis.sh
if ! command -v valgrind >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq valgrind >/dev/null
fi
cargo build -q -p leasehold-tests --bin leasehold-worker
worker=target/debug/leasehold-worker
dir="$(mktemp -d)"
port=$((20000 + RANDOM % 20000))
valgrind --tool=callgrind --callgrind-out-file="$dir/cg.%p" redis-server --port "$port" --save "" --appendonly no \
  --dir "$dir" >"$dir/valgrind.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
R=(redis-cli -p "$port")
for _ in $(seq 400); do "${R[@]}" ping >/dev/null 2>&1 && break; sleep 0.05; done # readiness poll: no other signal
"$worker" script-source acquire >"$dir/acquire.lua"
"$worker" script-source release >"$dir/release.lua"
floor_release="if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
ASHA=$("${R[@]}" script load "$(cat "$dir/acquire.lua")")
RSHA=$("${R[@]}" script load "$(cat "$dir/release.lua")")
FSHA=$("${R[@]}" script load "$floor_release")
export ASHA RSHA FSHA

# gen KIND CALLS BATCH > file: KIND floor (SET NX PX + the compare-and-delete script) or leasehold (acquire.lua and
# release.lua, BATCH locks per call). The lock names cycle over 64, as in `leasehold bench`'s uncontended-64.
gen() {
  python3 - "$@" <<'PY'
import os, sys
kind, calls, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = sys.stdout.buffer
def cmd(*args):
    out.write(b"*%d\r\n" % len(args))
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.write(b"$%d\r\n%s\r\n" % (len(a), a))
n = 0
for c in range(calls):
    if kind == "floor":
        name, token = f"bench:{c % 64}", f"floor:{c}"
        cmd("SET", name, token, "NX", "PX", "30000")
        cmd("EVALSHA", os.environ["FSHA"], "1", name, token)
        continue
    acquire_keys, acquire_args = [], ["86400000", "0123456789abcdef0123456789abcdef"]
    release_keys, release_args = [], ["leasehold:wake:", "86400000"]
    for i in range(batch):
        n += 1
        name, token = f"leasehold:{{bench:{(c * batch + i) % 64}}}", f"dl1:{n:032x}"
        acquire_keys += [name, name + ":fence", name + ":queue", name + ":waiters"]
        acquire_args += [token, "30000", "1", "2000", ""]
        release_keys += [name, name + ":queue", name + ":waiters", name + ":released", name + ":fence"]
        release_args += [token]
    cmd("EVALSHA", os.environ["ASHA"], len(acquire_keys), *acquire_keys, *acquire_args)
    cmd("EVALSHA", os.environ["RSHA"], len(release_keys), *release_keys, *release_args)
PY
}

# measure LABEL KIND CALLS BATCH: instructions per cycle over CALLS calls of BATCH locks (after a warm-up).
measure() {
  local label=$1 kind=$2 calls=$3 batch=$4
  "${R[@]}" flushall >/dev/null
  gen "$kind" 64 "$batch" | "${R[@]}" --pipe >/dev/null
  gen "$kind" "$calls" "$batch" >"$dir/work.resp"
  callgrind_control -z "$pid" >/dev/null 2>&1
  "${R[@]}" --pipe <"$dir/work.resp" >/dev/null
  rm -f "$dir"/cg."$pid".*
  callgrind_control -d "$pid" >/dev/null 2>&1
  local dump
  dump=$(ls -t "$dir"/cg."$pid".* | head -1)
  local total
  total=$(grep -E '^(summary|totals):' "$dump" | head -1 | awk '{print $2}')
  awk -v t="$total" -v c="$((calls * batch))" -v l="$label" 'BEGIN { printf "%-40s %8.0f instructions per cycle\n", l, t / c }'
}

measure "floor (SET NX PX + compare-and-delete)" floor 2000 1
measure "leasehold, 1 lock per call" leasehold 2000 1
measure "leasehold, 16 locks per call" leasehold 200 16
measure "leasehold, 64 locks per call" leasehold 50 64
