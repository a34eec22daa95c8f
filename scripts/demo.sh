#!/usr/bin/env bash
# The main job, on a fresh Debian/Ubuntu machine with Rust: install redis-server when it is missing, build the
# `leasehold` command, and run `leasehold demo` (the oversell story, on a private redis-server it starts and removes).
# Extra arguments go to `leasehold demo` (for example --redis URL, or --json).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-redis.sh
cargo build --release --quiet -p leasehold-cli
exec target/release/leasehold demo "$@"
