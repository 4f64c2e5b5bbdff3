#!/bin/sh
# bench-matmul.sh — builds bench/bench_matmul.c (CMake target bench_matmul) and
# runs it: per-shape and whole-model timings of the SmolLM2-135M products.
# Usage: scripts/bench-matmul.sh [impl=auto|scalar|avx2|avx512|all] [threads=2] [seconds=0.5]
# The target is outside `all` and no test runs it: a benchmark is never a test.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${BENCH_BUILD_DIR:-"$root/build"}
[ -f "$out/CMakeCache.txt" ] || cmake -S "$root" -B "$out" >/dev/null
cmake --build "$out" --target bench_matmul -j"$(nproc)" >/dev/null
impl=${1:-auto}
if [ "$impl" = all ]; then
  for i in avx512 avx2 scalar; do "$out/bench_matmul" "$i" "${2:-2}" "${3:-0.5}" || true; echo; done
else
  exec "$out/bench_matmul" "$impl" "${2:-2}" "${3:-0.5}"
fi
