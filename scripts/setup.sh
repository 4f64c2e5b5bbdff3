#!/usr/bin/env bash
# Installs what kvbatch needs on a fresh Debian machine of this kind: the C
# libraries it links (Debian packages), clang for the fuzz build, the Python
# packages the reference tests use, and the default model. Safe to re-run:
# each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PKGS="build-essential cmake pkg-config liblmdb-dev libzstd-dev libsqlite3-dev libjsmn-dev libxxhash-dev clang libclang-rt-14-dev python3-pip man-db"
missing=""
for p in $APT_PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

if ! python3 -c 'import numpy, gguf' 2>/dev/null; then
  echo "setup: installing Python packages numpy and gguf (reference tests)"
  python3 -m pip install --quiet numpy gguf 2>&1 | grep -v "Running pip as the 'root' user" || true
fi

scripts/fetch-model.sh
