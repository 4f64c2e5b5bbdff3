#!/usr/bin/env bash
# A longer sweep of damage to the persistent cache's file than the test suite
# runs: every page of a small cache overwritten with zeros and with SEEDS
# different random patterns, and truncations at every page boundary and
# inside pages, each opened, read, written, verified and trimmed in a child
# process (tests/test_pstore_damage.c). Fails on any crash, any result that
# differs, any damage not caught or any sound file moved aside.
#   scripts/cache-damage-sweep.sh [SEEDS] [BUILD_DIR]    (default 20, build)
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-20}
build=${2:-build}
if ! [[ "$seeds" =~ ^[0-9]+$ ]] || [ "$seeds" -lt 1 ]; then
  echo "usage: scripts/cache-damage-sweep.sh [SEEDS] [BUILD_DIR]" >&2
  exit 2
fi
[ -d "$build" ] || cmake -S . -B "$build" -DKVBATCH_CUDA=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target test_pstore_damage
KVB_DAMAGE_SEEDS=$seeds "$build/test_pstore_damage"
