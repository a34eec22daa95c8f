#!/usr/bin/env bash
# Makes sure the leasehold-tests PostgreSQL harness can run its servers: a PostgreSQL server under
# /usr/lib/postgresql/<version>/bin (initdb, postgres, pg_isready, psql; the harness takes the newest version there),
# installing Debian's postgresql package with apt-get when there is none. Fast and silent when one is there.
set -euo pipefail
for bin in /usr/lib/postgresql/*/bin; do
  if [ -x "$bin/postgres" ] && [ -x "$bin/initdb" ] && [ -x "$bin/psql" ] && [ -x "$bin/pg_isready" ]; then
    exit 0
  fi
done
echo "no PostgreSQL server under /usr/lib/postgresql: installing postgresql with apt-get" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq postgresql >/dev/null
# The package creates and starts a cluster on 5432 (unless /usr/sbin/policy-rc.d forbids it); the tests run their own
# servers on private ports, as the postgres user the package created.
$sudo systemctl disable --now postgresql >/dev/null 2>&1 || $sudo service postgresql stop >/dev/null 2>&1 || true
ls /usr/lib/postgresql/*/bin/postgres >/dev/null
id postgres >/dev/null
