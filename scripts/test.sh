#!/usr/bin/env bash
# Runs the whole test suite: sets up what is missing (scripts/setup.sh --test), builds
# (CUDA code too when nvcc is present, so it never rots) and runs ctest.
#   scripts/test.sh           normal build in build/
#   scripts/test.sh --asan    ASan+UBSan build in build-asan/ (CPU only)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test

jobs=$(nproc)
if [ "${1:-}" = "--asan" ]; then
  cmake -S . -B build-asan -DKVBATCH_SANITIZE=ON -DKVBATCH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build-asan -j"$jobs"
  # The Python reference test drives the plain binary; under ASan it would
  # only be slower, not more thorough, so it runs in the normal build.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -E '^pytest_'
else
  cmake -S . -B build >/dev/null
  cmake --build build -j"$jobs"
  ctest --test-dir build --output-on-failure -j"$jobs"
fi
