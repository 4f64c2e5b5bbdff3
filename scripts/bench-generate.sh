#!/usr/bin/env bash
# Batch-1 speed of the CPU forward pass on the default model: prefill of a
# 512-token prompt and decode of 128 tokens (greedy, EOS ignored), best and
# median of RUNS runs, for each CPU kernel side by side (KERNELS, default
# "avx512 amx" where the CPU has AMX, else auto), the kernels interleaved run
# by run (the machine is shared and noisy), with their ratio to the first and
# a check that they generate the same tokens. Also prints the reference
# figures from the issue (llama.cpp on the same Q4_1 shape on this kind of
# machine, 2 threads). BENCH_MODEL: another GGUF (e.g. the 3B-shaped file of
# scripts/bench-model.py); N_GEN: decode tokens (default 128).
#   scripts/bench-generate.sh [THREADS] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
RUNS=${2:-3}
N_GEN=${N_GEN:-128}
BIN=${KVBATCH_BIN:-build/kvbatch} # KVBATCH_BIN: another build, for paired before/after runs
MODEL=${BENCH_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -x "$BIN" ] || { cmake -S . -B build >/dev/null && cmake --build build -j"$(nproc)" >/dev/null; }
[ -f "$MODEL" ] || scripts/fetch-model.sh
if [ -z "${KERNELS:-}" ]; then
  KERNELS=auto
  "$BIN" generate --model "$MODEL" --kernels amx -p a -n 1 -q >/dev/null 2>&1 && KERNELS="avx512 amx"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A long English text; its first 512 tokens are the prompt.
text=$(for i in $(seq 1 40); do
  printf 'Section %d. The history of the printing press begins in the fifteenth century, when movable type changed how knowledge travelled across Europe. Printers, scholars and merchants built networks that carried books from Mainz to Venice and beyond. ' "$i"
done)
all_ids=$("$BIN" tokenize --model "$MODEL" "$text")
ids=$(echo "$all_ids" | cut -d' ' -f1-512)
n=$(echo "$ids" | wc -w)
[ "$n" -eq 512 ] || { echo "bench-generate: prompt has $n tokens, expected 512" >&2; exit 1; }

for r in $(seq 1 "$RUNS"); do
  for k in $KERNELS; do
    out=$("$BIN" generate --model "$MODEL" --kernels "$k" --prompt-ids "$ids" -n "$N_GEN" --temperature 0 --ignore-eos \
          --threads "$THREADS" --print-ids 2>&1 >"$tmp/ids-$k")
    p=$(echo "$out" | sed -n 's/^prefill: .*(\([0-9.]*\) tok\/s)/\1/p')
    d=$(echo "$out" | sed -n 's/^decode: .*(\([0-9.]*\) tok\/s)/\1/p')
    echo "run $r, $k: prefill $p tok/s, decode $d tok/s"
    echo "$p $d" >>"$tmp/fig-$k"
  done
done
echo "$out" | head -n 1
N_GEN=$N_GEN python3 - "$tmp" "$THREADS" "$KERNELS" "$MODEL" <<'PY'
import os, statistics, sys
tmp, threads, kernels, model = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4]
fig = {k: [tuple(map(float, l.split())) for l in open(os.path.join(tmp, "fig-" + k))] for k in kernels}
for i, what in ((0, "prefill (512-token prompt, batch 1, %s threads)" % threads), (1, "decode  (%s tokens, batch 1)" % os.environ.get("N_GEN", "128"))):
    best = {k: max(v[i] for v in fig[k]) for k in kernels}
    med = {k: statistics.median(v[i] for v in fig[k]) for k in kernels}
    line = "   ".join(f"{k} {best[k]:.1f} best / {med[k]:.1f} median" for k in kernels)
    if len(kernels) > 1:
        line += "   " + ", ".join(f"{k}/{kernels[0]} {med[k] / med[kernels[0]]:.2f}x (medians)" for k in kernels[1:])
    print(f"{what}: {line} tok/s")
if os.path.basename(model).startswith("SmolLM2-135M"):
    print("reference (llama.cpp here on this shape): prefill ~215, decode ~110 tok/s; goals 400 and 185")
PY
set -- $KERNELS
same=1
for k in "$@"; do cmp -s "$tmp/ids-$1" "$tmp/ids-$k" || same=0; done
[ $# -lt 2 ] || { [ $same = 1 ] && echo "generated tokens identical across kernels ($KERNELS)" || echo "WARNING: generated tokens differ across kernels"; }
