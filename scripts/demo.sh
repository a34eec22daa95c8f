#!/usr/bin/env bash
# The main job, on a fresh Debian/Ubuntu machine with Rust: install redis-server when it is missing, build the
# `leasehold` command, and run `leasehold demo` (the oversell story, on a private redis-server it starts and removes).
# Extra arguments go to `leasehold demo` (for example --redis URL, or --json).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-redis.sh
# Cargo's own progress lines (and its progress bar, on a terminal) show what a first build does for its minutes.
echo "demo.sh: building the leasehold command (release; a first build takes a few minutes)..." >&2
cargo build --release -p leasehold-cli
echo "demo.sh: running leasehold demo" >&2
exec target/release/leasehold demo "$@"
