#!/usr/bin/env bash
# Makes sure redis-server is on PATH, installing Debian's package when it is not.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
echo "redis-server not found: installing it with apt-get" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq redis-server >/dev/null
# The package starts a system-wide server; leasehold's tests and demo run their own on private ports.
$sudo systemctl disable --now redis-server >/dev/null 2>&1 || $sudo service redis-server stop >/dev/null 2>&1 || true
command -v redis-server >/dev/null
