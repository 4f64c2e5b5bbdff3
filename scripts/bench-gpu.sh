#!/usr/bin/env bash
# bench-gpu.sh — the GPU benchmark of issue 5 on a Llama-3-8B-shaped model
# (32 layers, hidden 4096, 32 heads / 8 KV heads, FFN 14336, vocab 128256)
# with random bf16 weights made in memory on the spot (kernels/bench_gpu.c:
# no download, no file, ~3 GB of host memory).
#   scripts/bench-gpu.sh DIR [BUILD_DIR]
# Prints (and writes to DIR/bench.txt) the bf16 GEMM rate of this GPU,
# prefill tokens/s (8 x 512 tokens per step) against it, and the decode step
# time at batch 1 and 256 (context 512) against the HBM bound (bytes read
# per step / 4.8 TB/s); then the same with --deterministic unless
# BENCH_DET=0. Result lines start with "figure:". BENCH_LAYERS=N uses N
# layers instead of 32 (the output then says by how much to scale).
#
# What it does not cover: the scheduler, sampling and the 1,000-request job
# (scripts/gpu-check.sh runs a job through `kvbatch run --device cuda`).
# Needs a CUDA build (cmake -DKVBATCH_CUDA=ON) with bench_gpu in BUILD_DIR
# (default build-gpu).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:?usage: scripts/bench-gpu.sh DIR [BUILD_DIR]}
build=${2:-$root/build-gpu}
mkdir -p "$dir"
bench=$build/bench_gpu
[ -x "$bench" ] || { echo "bench-gpu: $bench not built (configure with -DKVBATCH_CUDA=ON)"; exit 1; }
det=--deterministic
[ "${BENCH_DET:-1}" = 0 ] && det=
"$bench" bench --layers "${BENCH_LAYERS:-32}" --embd 4096 --ff 14336 --heads 32 --kv-heads 8 --vocab 128256 \
  --ctx 512 --batch 256 --prefill-seqs 8 --prefill-len 512 --steps 10 $det | tee "$dir/bench.txt"
exit "${PIPESTATUS[0]}"
