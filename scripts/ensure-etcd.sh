#!/usr/bin/env bash
# Makes sure etcd and etcdctl (the leasehold-tests etcd harness runs both) are on PATH, installing Debian's packages
# when they are not. Fast and silent when both are there. (No protoc: leasehold's etcd gRPC code is checked in.)
set -euo pipefail
if command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1; then
  exit 0
fi
echo "etcd or etcdctl not found: installing etcd-server and etcd-client with apt-get" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq etcd-server etcd-client >/dev/null
# The package may start a system-wide etcd on 2379; the tests run their own members on private ports.
$sudo systemctl disable --now etcd >/dev/null 2>&1 || $sudo service etcd stop >/dev/null 2>&1 || true
command -v etcd >/dev/null
command -v etcdctl >/dev/null
