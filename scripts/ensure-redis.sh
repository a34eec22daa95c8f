#!/usr/bin/env bash
# Makes sure redis-server and redis-cli (which creates the test clusters) are on PATH, installing Debian's package
# when they are not.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
  exit 0
fi
echo "redis-server or redis-cli not found: installing them with apt-get" >&2
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
command -v redis-cli >/dev/null
