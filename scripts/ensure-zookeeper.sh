#!/usr/bin/env bash
# Makes sure the leasehold-tests ZooKeeper harness can run its servers: Debian's ZooKeeper 3.8.0
# (/usr/share/java/zookeeper.jar, from the zookeeper package), slf4j-simple (/usr/share/java/slf4j-simple.jar, from
# libslf4j-java: without it ZooKeeper logs nothing) and `java` on PATH, installing the packages with apt-get when one
# is missing. Fast and silent when all three are there.
set -euo pipefail
if [ -f /usr/share/java/zookeeper.jar ] && [ -f /usr/share/java/slf4j-simple.jar ] && command -v java >/dev/null 2>&1; then
  exit 0
fi
echo "ZooKeeper, slf4j-simple or java not found: installing zookeeper and libslf4j-java with apt-get" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq zookeeper libslf4j-java >/dev/null
# The zookeeper package starts no server (zookeeperd would), but stop one that runs on 2181 all the same: the tests
# run their own servers on private ports.
$sudo systemctl disable --now zookeeper >/dev/null 2>&1 || $sudo service zookeeper stop >/dev/null 2>&1 || true
test -f /usr/share/java/zookeeper.jar
test -f /usr/share/java/slf4j-simple.jar
command -v java >/dev/null
