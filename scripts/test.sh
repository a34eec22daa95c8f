#!/usr/bin/env bash
# Runs every check leasehold has: format, lints, docs, the whole test suite against real redis-server processes, the
# examples, and packaging of the published crates.
# Installs redis-server (Debian/Ubuntu, apt-get) when it is missing. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-redis.sh

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --all-features -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features
cargo test --workspace --all-features
# The examples run against a private redis-server; the published crates package and build on their own.
scripts/examples.sh
cargo package --workspace --exclude leasehold-tests --allow-dirty --quiet
