#!/usr/bin/env bash
# Makes sure etcd and etcdctl (the leasehold-tests etcd harness runs both) and protoc (the build script of the
# etcd-client crate, behind leasehold's `etcd` feature, needs it) are on PATH, installing Debian's packages when they
# are not. Fast and silent when all three are there.
set -euo pipefail
if command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1 && command -v protoc >/dev/null 2>&1; then
  exit 0
fi
echo "etcd, etcdctl or protoc not found: installing etcd-server, etcd-client and protobuf-compiler with apt-get" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq etcd-server etcd-client protobuf-compiler >/dev/null
# The package may start a system-wide etcd on 2379; the tests run their own members on private ports.
$sudo systemctl disable --now etcd >/dev/null 2>&1 || $sudo service etcd stop >/dev/null 2>&1 || true
command -v etcd >/dev/null
command -v etcdctl >/dev/null
command -v protoc >/dev/null
