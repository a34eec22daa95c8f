#!/usr/bin/env bash
# Runs the torture test (crates/leasehold-tests/tests/torture/) for longer than CI does: worker processes loop on one lock
# while faults are injected at random, and the checker prints one line per lock kind. Installs redis-server, etcd,
# ZooKeeper (with java), PostgreSQL and MariaDB when they are missing.
# Usage: scripts/torture.sh [SECONDS] [SEED] [KINDS] [TOPOLOGY]
#   SECONDS  per kind (default 600); SEED drawn from the clock when absent (it is printed);
#   KINDS    comma-separated, from mutex, fair, semaphore:N, rw, reentrant, multi (two mutexes taken as one set),
#            election (a campaign whose leader proclaims new values) (default: all seven, semaphore:2);
#   TOPOLOGY where the lock lives: single (one redis-server, the default), cluster (3 primaries + 3 replicas, with
#            failovers, slot migrations and killed primaries among the faults), quorum (5 independent redis-servers,
#            Redlock, with faults of one or two nodes at a time; mutex and rw only, other kinds are skipped), etcd (one
#            etcd member, restarted with its data, stopped, its history compacted, the workers' paths cut, slowed and
#            reset), etcd3 (three members, one at a time, the leader among them, killed and restarted or stopped), zk
#            (one standalone ZooKeeper server, killed and restarted with its data or stopped, the workers' paths cut,
#            slowed and reset, a worker's session expired by cutting it off past its timeout), zk3 (an ensemble of
#            three servers, one at a time, the leader among them, killed and restarted or stopped), pg (one PostgreSQL
#            server, killed and restarted with its data or stopped, the workers' paths cut, slowed and reset, every
#            connection of a worker killed server-side, a worker's session expired by cutting it off past its TTL),
#            mysql (the same on one MariaDB server), or a list such as single,cluster,quorum,etcd,etcd3,zk,zk3,pg,mysql
#            for each in turn. On etcd, ZooKeeper, PostgreSQL and MariaDB each worker's session TTL (ZooKeeper's
#            session timeout) is 2 s and a semaphore grant is one permit.
# An empty argument takes its default: scripts/torture.sh 60 "" "" cluster
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-redis.sh
# etcd for the etcd and etcd3 topologies (fast and silent when it is there).
scripts/ensure-etcd.sh
# ZooKeeper and java for the zk and zk3 topologies (fast and silent when they are there).
scripts/ensure-zookeeper.sh
# PostgreSQL and MariaDB for the pg and mysql topologies (the same).
scripts/ensure-postgres.sh
scripts/ensure-mariadb.sh
export TORTURE_SECONDS="${1:-600}"
if [ -n "${2:-}" ]; then
  export TORTURE_SEED="$2"
fi
if [ -n "${3:-}" ]; then
  export TORTURE_KINDS="$3"
fi
if [ -n "${4:-}" ]; then
  export TORTURE_TOPOLOGY="$4"
fi
exec cargo test --release -q -p leasehold-tests --test torture -- --nocapture the_lock_keeps_its_contract_under_random_faults
