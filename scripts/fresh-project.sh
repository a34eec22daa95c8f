#!/usr/bin/env bash
# Builds a new cargo project the way a user would start one, depending on leasehold by path with the README's
# dependency lines, and runs in it, unchanged: the README's library quickstart (src/main.rs) and every file of
# crates/leasehold/examples/ (copied to its examples/). Part of scripts/test.sh.
#
# The quickstart connects to redis://127.0.0.1:6379 as written. If nothing listens there, a private redis-server is
# started on that port for the run (no persistence, removed afterwards); if a Redis already answers there, it is used
# (the quickstart only touches its own three locks). The examples get a private server through REDIS_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
dir="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

# The project: README's [dependencies] block, with the path made absolute; README's quickstart as main.rs.
mkdir -p "$dir/app/src" "$dir/app/examples"
deps="$(awk '/^## Library quickstart/{q=1} q&&/^```toml/{t=1;next} t&&/^```/{exit} t{print}' README.md)"
code="$(awk '/^## Library quickstart/{q=1} q&&/^```rust/{t=1;next} t&&/^```/{exit} t{print}' README.md)"
if [ -z "$deps" ] || [ -z "$code" ]; then
  echo "fresh-project: the README's quickstart (a toml and a rust block) was not found" >&2
  exit 1
fi
{
  printf '[package]\nname = "fresh-app"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n'
  printf '%s\n' "$deps" | sed "s#path = \"crates/leasehold\"#path = \"$root/crates/leasehold\"#"
  # Only an example needs something more, and leasehold re-exports it (leasehold::redis).
  printf '\n[workspace]\n'
} >"$dir/app/Cargo.toml"
printf '%s\n' "$code" >"$dir/app/src/main.rs"
cp crates/leasehold/examples/*.rs "$dir/app/examples/"
# The same dependency versions as the workspace, so that the build reuses what is compiled already.
cp Cargo.lock "$dir/app/Cargo.lock"
export CARGO_TARGET_DIR="$root/target/fresh-project"

start_redis() { # PORT_ARGS... ; prints nothing, records the pid
  redis-server "$@" --save "" --appendonly no --dir "$dir" >>"$dir/redis.log" 2>&1 &
  pids+=("$!")
}
ready() { # HOST PORT or -s SOCKET
  for _ in $(seq 200); do
    redis-cli "$@" ping >/dev/null 2>&1 && return 0
    sleep 0.05 # readiness poll: redis-server has no other signal for it
  done
  echo "fresh-project: redis-server did not start: $(tail -3 "$dir/redis.log")" >&2
  return 1
}

pong() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = PONG ]; }
if ! pong; then
  if (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
    echo "fresh-project: something on 127.0.0.1:6379 does not answer PING (a Redis with a password, or another" \
      "service); the README quickstart connects there as written, so free the port or open that Redis" >&2
    exit 1
  fi
  start_redis --port 6379 --bind 127.0.0.1
  ready -h 127.0.0.1 -p 6379
fi
start_redis --port 0 --unixsocket "$dir/redis.sock"
ready -s "$dir/redis.sock"

cd "$dir/app"
echo "fresh project: README quickstart" >&2
cargo run -q
export REDIS_URL="unix://$dir/redis.sock"
for example in examples/*.rs; do
  name="$(basename "$example" .rs)"
  args=()
  if [ "$name" = leader ]; then
    args=(2) # two terms, then it steps down (without an argument it leads until stopped)
  fi
  echo "fresh project: example $name ${args[*]}" >&2
  cargo run -q --example "$name" -- "${args[@]}"
done
