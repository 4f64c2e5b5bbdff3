#!/bin/sh
# bench-matmul.sh — builds bench/bench_matmul.c (CMake target bench_matmul) and
# runs it: per-shape and whole-model timings of the SmolLM2-135M products.
# Usage: scripts/bench-matmul.sh [impl=auto|scalar|avx2|avx512|all] [threads=2] [seconds=0.5]
#        scripts/bench-matmul.sh types [impl|all] [threads=2] [seconds=4]
#          each weight type against Q4_K on one shape, interleaved (bench_types)
#        LLAMA_CPP_BIN=DIR scripts/bench-matmul.sh llama [threads=1] [rounds=3]
#          kvbatch against DIR's llama-bench, prefill and decode, on one random llama made
#          into each type by DIR's llama-quantize (bench/bench_types_llama.py). Skips (77)
#          without LLAMA_CPP_BIN.
# The target is outside `all` and no test runs it: a benchmark is never a test.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${BENCH_BUILD_DIR:-"$root/build"}
[ -f "$out/CMakeCache.txt" ] || cmake -S "$root" -B "$out" >/dev/null
cmake --build "$out" --target bench_matmul -j"$(nproc)" >/dev/null
if [ "${1:-}" = llama ]; then
  [ -n "${LLAMA_CPP_BIN:-}" ] && [ -x "$LLAMA_CPP_BIN/llama-quantize" ] && [ -x "$LLAMA_CPP_BIN/llama-bench" ] ||
    { echo "bench-matmul llama: set LLAMA_CPP_BIN to a directory with llama-quantize and llama-bench" >&2; exit 77; }
  cmake --build "$out" --target kvbatch -j"$(nproc)" >/dev/null
  exec python3 "$root/bench/bench_types_llama.py" "$LLAMA_CPP_BIN" "$out/kvbatch" "${2:-1}" "${3:-3}"
fi
if [ "${1:-}" = types ]; then
  impl=${2:-auto} threads=${3:-2} secs=${4:-4} # before set -- replaces the arguments
  if [ "$impl" = all ]; then set -- avx512 avx2; else set -- "$impl"; fi
  for i in "$@"; do "$out/bench_matmul" types "$i" "$threads" "$secs" || true; echo; done
  exit 0
fi
impl=${1:-auto}
if [ "$impl" = all ]; then
  for i in avx512 avx2 scalar; do "$out/bench_matmul" "$i" "${2:-2}" "${3:-0.5}" || true; echo; done
else
  exec "$out/bench_matmul" "$impl" "${2:-2}" "${3:-0.5}"
fi
