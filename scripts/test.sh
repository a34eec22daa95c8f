#!/usr/bin/env bash
# Runs every check leasehold has: format, lints, docs, and the whole test suite against real redis-server processes.
# Installs redis-server (Debian/Ubuntu, apt-get) when it is missing. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-redis.sh

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --all-features -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features
cargo test --workspace --all-features
