#!/usr/bin/env bash
# Prints the path of a Python interpreter that can `import kazoo` (the reference ZooKeeper client, for interop tests):
# the one of a virtualenv at target/kazoo-venv, created with `python3 -m venv` and `pip install kazoo` when it is
# missing or lacks kazoo. Fast and silent when it is there.
# Usage: python=$(scripts/ensure-kazoo.sh)     (PYTHON names another interpreter than python3 to create it with)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$PWD/target/kazoo-venv"
python="$venv/bin/python"
wanted="kazoo==2.*"

if ! "$python" -c 'import kazoo' >/dev/null 2>&1; then
  echo "ensure-kazoo: no kazoo in $venv: creating it with $wanted" >&2
  log="$(mktemp)"
  trap 'rm -f "$log"' EXIT
  mkdir -p target
  # A venv left half made by an interrupted run is made again from scratch.
  rm -rf "$venv"
  if ! "${PYTHON:-python3}" -m venv "$venv" >"$log" 2>&1 \
    || ! "$python" -m pip install --quiet --disable-pip-version-check "$wanted" >"$log" 2>&1; then
    cat "$log" >&2
    echo "ensure-kazoo: could not create $venv with $wanted" >&2
    exit 1
  fi
  "$python" -c 'import kazoo' >/dev/null
fi
echo "$python"
