#!/usr/bin/env bash
# Runs every example of the library against a private redis-server (a unix socket in a temporary directory, no TCP
# port, no persistence), so that the examples the README points to are known to work. Part of scripts/test.sh.
# LEASEHOLD_TEST_SERVER names another server program to run instead, as it does for the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$(mktemp -d)"
"${LEASEHOLD_TEST_SERVER:-redis-server}" --port 0 --unixsocket "$dir/redis.sock" --save "" --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 200); do
  [ -S "$dir/redis.sock" ] && break
  sleep 0.05 # readiness poll: redis-server has no other signal for it
done
export REDIS_URL="unix://$dir/redis.sock"
for example in quickstart "leader 2" fenced_write; do
  set -- $example
  echo "example $*:" >&2
  cargo run -q -p leasehold --example "$1" -- "${@:2}"
done
