#!/usr/bin/env bash
# Makes sure the leasehold-tests MariaDB harness can run its servers: mariadbd (/usr/sbin/mariadbd), mariadb-install-db
# and the mariadb client, from Debian's mariadb-server and mariadb-client (10.11 on bookworm), and the mysql user the
# servers run as. Installs the packages with apt-get when one is missing; fast and silent when all is there.
set -euo pipefail
if [ -x /usr/sbin/mariadbd ] && command -v mariadb-install-db >/dev/null 2>&1 && command -v mariadb >/dev/null 2>&1 &&
  id mysql >/dev/null 2>&1; then
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
if [ ! -x /usr/sbin/mariadbd ] || ! command -v mariadb-install-db >/dev/null 2>&1 || ! command -v mariadb >/dev/null 2>&1; then
  echo "mariadbd, mariadb-install-db or mariadb not found: installing mariadb-server and mariadb-client with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq mariadb-server mariadb-client >/dev/null
  # Without /usr/sbin/policy-rc.d the package starts a system-wide MariaDB on 3306; the tests run their own servers on
  # private ports.
  $sudo systemctl disable --now mariadb >/dev/null 2>&1 || $sudo service mariadb stop >/dev/null 2>&1 || true
fi
# The package creates the mysql user; a server installed some other way may not have.
if ! id mysql >/dev/null 2>&1; then
  $sudo useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin --user-group mysql
fi
test -x /usr/sbin/mariadbd
command -v mariadb-install-db >/dev/null
command -v mariadb >/dev/null
