#!/bin/sh
# bench-matmul.sh — builds scripts/bench_matmul.c with the matmul sources and
# runs it: per-shape and whole-model timings of the SmolLM2-135M products.
# Usage: scripts/bench-matmul.sh [impl=auto|scalar|avx2|avx512|all] [threads=2] [seconds=0.5]
# Compiled here rather than in CMake so that a benchmark never becomes a test.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${BENCH_BUILD_DIR:-"$root/build-bench"}
mkdir -p "$out"
cc=${CC:-gcc}
# Same flags as the CMake Release build; -iquote so that headers in src/ can
# never shadow system headers of the same name.
cf="-std=c11 -O2 -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter -D_GNU_SOURCE -iquote $root/src"
objs=""
for f in quant matmul matmul_scalar alloc cpu dtype status tpool; do
  $cc $cf -c "$root/src/$f.c" -o "$out/$f.o"
  objs="$objs $out/$f.o"
done
for f in matmul_avx2 dtype_avx2; do
  $cc $cf -mavx2 -mfma -mf16c -c "$root/src/$f.c" -o "$out/$f.o"
  objs="$objs $out/$f.o"
done
for src in "$root"/src/matmul*_avx512.c; do
  f=$(basename "$src" .c)
  $cc $cf -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx2 -mfma -mf16c \
    -c "$src" -o "$out/$f.o"
  objs="$objs $out/$f.o"
done
$cc $cf "$root/scripts/bench_matmul.c" $objs -lpthread -lm -o "$out/bench_matmul"
impl=${1:-auto}
if [ "$impl" = all ]; then
  for i in avx512 avx2 scalar; do "$out/bench_matmul" "$i" "${2:-2}" "${3:-0.5}" || true; echo; done
else
  exec "$out/bench_matmul" "$impl" "${2:-2}" "${3:-0.5}"
fi
