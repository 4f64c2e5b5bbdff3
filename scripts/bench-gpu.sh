#!/usr/bin/env bash
# bench-gpu.sh — the GPU benchmark of issue 5 on a Llama-3-8B-shaped model
# (32 layers, hidden 4096, 32 heads / 8 KV heads, FFN 14336, vocab 128256)
# with random bf16 weights made in memory on the spot (kernels/bench/:
# no download, no file, ~3 GB of host memory).
#   scripts/bench-gpu.sh DIR [BUILD_DIR]
# Prints (and writes to DIR/bench.txt):
#  - `bench_gpu bench`: the bf16 GEMM rate of this GPU; one layer's
#    attention by the f32 kernel and on tensor cores (prefill and decode
#    shapes below); prefill tokens/s
#    (8 x 512 tokens per step) against it, and the decode step time at batch
#    1 and 256 (context 512) against the HBM bound (bytes read per step /
#    4.8 TB/s); then the same with --deterministic unless BENCH_DET=0;
#  - `bench_gpu job`: the offline job — BENCH_REQUESTS (default 1000)
#    requests of 512 prompt tokens sharing a 256-token prefix, 128 output
#    tokens each, greedy — through the scheduler: output and total tokens/s;
#    then the persistent cache cold vs warm on 64 prompts of 512 tokens, for
#    this shape and for SmolLM2-135M's and Llama-3.2-1B's (where the store
#    stops paying).
# Decode steps are timed without and with CUDA graphs. Result lines start
# with "figure:". BENCH_LAYERS=N uses N layers instead of 32 (the output
# then says by how much to scale); BENCH_JOB=0 skips the job,
# BENCH_JOB_GRAPHS=1 runs it with --cuda-graphs.
#
# Needs a CUDA build (cmake -DKVBATCH_CUDA=ON) with bench_gpu in BUILD_DIR
# (default build-gpu). The tokenizer and JSONL handling of `kvbatch run` are
# not in these figures (scripts/gpu-check.sh runs a job through it).
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
rc=${PIPESTATUS[0]}
if [ "${BENCH_JOB:-1}" != 0 ]; then
  "$bench" job --layers "${BENCH_LAYERS:-32}" --embd 4096 --ff 14336 --heads 32 --kv-heads 8 --vocab 128256 \
    --requests "${BENCH_REQUESTS:-1000}" --prompt 512 --prefix 256 --gen 128 --max-batch 256 --cache-requests 64 \
    $([ "${BENCH_JOB_GRAPHS:-0}" = 1 ] && echo --cuda-graphs) \
    | tee -a "$dir/bench.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  # Restoring a block costs its KV bytes, computing it the model's FLOPs:
  # the cache pair again at two smaller sizes says where the store stops
  # paying on this GPU (SmolLM2-135M's and Llama-3.2-1B's shapes).
  for shape in "--layers 30 --embd 576 --ff 1536 --heads 9 --kv-heads 3 --vocab 49152" \
               "--layers 16 --embd 2048 --ff 8192 --heads 32 --kv-heads 8 --vocab 128256"; do
    # shellcheck disable=SC2086
    "$bench" job $shape --requests 0 --prompt 512 --cache-requests 64 | tee -a "$dir/bench.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  done
fi
exit "$rc"
