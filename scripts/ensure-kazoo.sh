#!/usr/bin/env bash
# Prints the path of a Python interpreter that can `import kazoo` (the reference ZooKeeper client, for interop tests):
# target/kazoo-python, a wrapper that runs python3 with kazoo installed (from PyPI, `pip install --target`) in
# target/kazoo-lib. No virtualenv: Debian ships `venv` apart from Python (python3-venv), pip is enough. Fast and silent
# when it is there.
# Usage: python=$(scripts/ensure-kazoo.sh)     (PYTHON names another interpreter than python3)
set -euo pipefail
cd "$(dirname "$0")/.."
base="${PYTHON:-python3}"
lib="$PWD/target/kazoo-lib"
wrapper="$PWD/target/kazoo-python"
wanted="kazoo==2.*"

if ! "$wrapper" -c 'import kazoo' >/dev/null 2>&1; then
  echo "ensure-kazoo: no kazoo in $lib: installing $wanted there" >&2
  log="$(mktemp)"
  trap 'rm -f "$log"' EXIT
  mkdir -p target
  # A library left half made by an interrupted run is made again from scratch.
  rm -rf "$lib"
  if ! "$base" -m pip install --quiet --disable-pip-version-check --target "$lib" "$wanted" >"$log" 2>&1; then
    cat "$log" >&2
    echo "ensure-kazoo: could not install $wanted with $base -m pip" >&2
    exit 1
  fi
  printf '#!/bin/sh\nPYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH} exec %s "$@"\n' "$lib" "$(command -v "$base")" >"$wrapper"
  chmod +x "$wrapper"
  "$wrapper" -c 'import kazoo' >/dev/null
fi
echo "$wrapper"
