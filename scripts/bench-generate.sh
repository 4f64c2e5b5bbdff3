#!/usr/bin/env bash
# Batch-1 speed of the CPU forward pass on the default model: prefill of a
# 512-token prompt and decode of 128 tokens (greedy, EOS ignored), best of
# RUNS runs. Prints tokens/s for each and the reference figures from the issue
# (llama.cpp on the same Q4_1 shape on this kind of machine, 2 threads).
#   scripts/bench-generate.sh [THREADS] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
RUNS=${2:-3}
BIN=${KVBATCH_BIN:-build/kvbatch} # KVBATCH_BIN: another build, for paired before/after runs
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -x "$BIN" ] || { cmake -S . -B build >/dev/null && cmake --build build -j"$(nproc)" >/dev/null; }
[ -f "$MODEL" ] || scripts/fetch-model.sh

# A long English text; its first 512 tokens are the prompt.
text=$(for i in $(seq 1 40); do
  printf 'Section %d. The history of the printing press begins in the fifteenth century, when movable type changed how knowledge travelled across Europe. Printers, scholars and merchants built networks that carried books from Mainz to Venice and beyond. ' "$i"
done)
all_ids=$("$BIN" tokenize --model "$MODEL" "$text")
ids=$(echo "$all_ids" | cut -d' ' -f1-512)
n=$(echo "$ids" | wc -w)
[ "$n" -eq 512 ] || { echo "bench-generate: prompt has $n tokens, expected 512" >&2; exit 1; }

best_p=0; best_d=0
for r in $(seq 1 "$RUNS"); do
  out=$("$BIN" generate --model "$MODEL" --prompt-ids "$ids" -n 128 --temperature 0 --ignore-eos \
        --threads "$THREADS" --print-ids 2>&1 >/dev/null)
  p=$(echo "$out" | sed -n 's/^prefill: .*(\([0-9.]*\) tok\/s)/\1/p')
  d=$(echo "$out" | sed -n 's/^decode: .*(\([0-9.]*\) tok\/s)/\1/p')
  echo "run $r: prefill $p tok/s, decode $d tok/s"
  best_p=$(python3 -c "print(max($best_p, $p))")
  best_d=$(python3 -c "print(max($best_d, $d))")
done
echo "$out" | head -n 1
printf 'prefill (512-token prompt, batch 1, %s threads): %.1f tok/s   (llama.cpp here: ~215; goal 400)\n' "$THREADS" "$best_p"
printf 'decode  (128 tokens, batch 1, %s threads):      %.1f tok/s   (llama.cpp here: ~110; goal 185)\n' "$THREADS" "$best_d"
