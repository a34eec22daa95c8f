#!/usr/bin/env bash
# Starts a throwaway local Redis Cluster (3 primaries + 3 replicas on 127.0.0.1, no persistence) for
# `leasehold bench --redis URL` and friends, and stops it again.
#
#   scripts/local-cluster.sh [start] [--dir DIR] [PORT ×6]   prints the redis+cluster:// URL on stdout
#   scripts/local-cluster.sh stop DIR                       kills the nodes (by their pid files), removes DIR
#
# The nodes run redis-server, or the program LEASEHOLD_TEST_SERVER names (valkey-server, for instance); the cluster is
# created with redis-cli either way.
# Without ports, six free ones are chosen (a node's cluster bus uses port + 10000, which must be free too). Without
# --dir, a new temporary directory holds the nodes' files; it is named on stderr, with the command that stops them.
# Ready means: every node reports cluster_state:ok and every replica's link to its primary is up.
# Example:
#   dir=$(mktemp -d); url=$(scripts/local-cluster.sh start --dir "$dir")
#   target/release/leasehold bench --redis "$url" --duration 3s; scripts/local-cluster.sh stop "$dir"
set -euo pipefail

NODES=6
MARK=leasehold-local-cluster # in DIR: what `stop` checks before it removes anything
BUS_OFFSET=10000
READY_TIMEOUT_S=30
SERVER="${LEASEHOLD_TEST_SERVER:-redis-server}"

die() {
  echo "local-cluster: $*" >&2
  exit 1
}

# Whether something listens on 127.0.0.1:$1.
listening() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Polls `$@` every 50 ms until it succeeds, for at most READY_TIMEOUT_S: a cluster announces nothing.
poll() {
  local what=$1
  shift
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "local-cluster: timed out waiting for $what" >&2; return 1; }
    sleep 0.05
  done
}

# kill_nodes DIR: SIGKILL to every node started in DIR (by the pid files written at start), and waits until they
# are gone.
kill_nodes() {
  local dir=$1
  local pids=()
  for pidfile in "$dir"/*/redis.pid; do
    [ -f "$pidfile" ] || continue
    pids+=("$(cat "$pidfile")")
  done
  # SIGKILL: nothing here is worth saving, and a primary's SHUTDOWN waits up to 10 s for its replicas.
  for pid in "${pids[@]}"; do
    kill -9 "$pid" 2>/dev/null || true
    # Reaps it when this shell started it (a failed start); returns at once otherwise.
    wait "$pid" 2>/dev/null || true
  done
  gone() {
    for pid in "${pids[@]}"; do
      ! kill -0 "$pid" 2>/dev/null || return 1
    done
  }
  poll "the nodes to exit" gone
}

stop() {
  local dir=$1
  [ -f "$dir/$MARK" ] || die "$dir is not a directory this script made (no $MARK in it)"
  kill_nodes "$dir"
  rm -rf "$dir"
}

all_ok() {
  for port in "${ports[@]}"; do
    redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
    local replication
    replication=$(redis-cli -p "$port" info replication 2>/dev/null) || return 1
    if grep -q '^role:slave' <<<"$replication"; then
      grep -q '^master_link_status:up' <<<"$replication" || return 1
    fi
  done
}

start() {
  local dir=""
  ports=()
  while [ $# -gt 0 ]; do
    case $1 in
      --dir) dir=${2:?--dir needs a directory}; shift 2 ;;
      *[!0-9]* | "") die "not a port: $1" ;;
      *) ports+=("$1"); shift ;;
    esac
  done
  command -v "$SERVER" >/dev/null && command -v redis-cli >/dev/null ||
    die "$SERVER and redis-cli must be found (scripts/ensure-redis.sh installs redis-server and redis-cli)"
  if [ ${#ports[@]} -eq 0 ]; then
    local port=$((20000 + RANDOM % 9000))
    while [ ${#ports[@]} -lt $NODES ]; do
      if ! listening "$port" && ! listening $((port + BUS_OFFSET)); then
        ports+=("$port")
      fi
      port=$((port + 1))
    done
  fi
  [ ${#ports[@]} -eq $NODES ] || die "give $NODES ports, or none"
  if [ -z "$dir" ]; then
    dir=$(mktemp -d "${TMPDIR:-/tmp}/leasehold-cluster.XXXXXX")
  fi
  mkdir -p "$dir"
  touch "$dir/$MARK"
  # Whatever happens from here on, a failed start leaves nothing running (and keeps the logs).
  trap 'kill_nodes "$dir" || true; echo "local-cluster: start failed; the logs are in $dir" >&2' ERR
  trap 'kill_nodes "$dir" || true; echo "local-cluster: interrupted; the logs are in $dir" >&2; exit 130' INT TERM

  local addrs=()
  for port in "${ports[@]}"; do
    if listening "$port"; then
      echo "local-cluster: port $port is taken" >&2
      false
    fi
    mkdir -p "$dir/$port"
    # In the background rather than --daemonize: its pid is known before it runs, so no failure can orphan it. No
    # output to the caller's stdout either, or `url=$(…)` would wait for the nodes to exit.
    "$SERVER" --port "$port" --bind 127.0.0.1 --dir "$dir/$port" \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
      --repl-diskless-sync-delay 0 --save "" --appendonly no </dev/null >>"$dir/$port/redis.log" 2>&1 &
    echo $! >"$dir/$port/redis.pid"
    addrs+=("127.0.0.1:$port")
  done
  for port in "${ports[@]}"; do
    poll "node $port to answer" redis-cli -p "$port" ping >/dev/null
  done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 ||
    { cat "$dir/create.log" >&2; false; }
  poll "cluster_state:ok on every node and every replica's link" all_ok
  trap - ERR INT TERM

  local IFS=,
  echo "redis+cluster://${addrs[*]}"
  echo "local-cluster: nodes in $dir; stop them with: $0 stop $dir" >&2
}

case ${1:-start} in
  start) shift || true; start "$@" ;;
  stop) stop "${2:?usage: $0 stop DIR}" ;;
  [0-9]* | --dir) start "$@" ;;
  *) die "usage: $0 [start] [--dir DIR] [PORT ×6] | $0 stop DIR" ;;
esac
