#!/usr/bin/env bash
# Long context on a sliding-window model: a job of N_REQ prompts of 8,000
# tokens on Gemma 3 270M (15 of its 18 layers attend through a 512-position
# window; scripts/fetch-testdata.sh fetches it) with a KV pool of KV_MEM,
# too small for one such sequence's KV on every layer (18 KiB a token in
# f16: 141 MiB) but enough for two of them on its 3 global layers (23 MiB
# each) and a window and a step on the others (~15 MiB each). Prints the
# run's summary, whose "KV per sequence"
# line says what a sequence held at most, and the arithmetic to compare it
# with. A benchmark (minutes on 2 cores), not a test; test_swa checks the
# same bound and the outputs' bits in CI.
#   scripts/bench-swa.sh [THREADS] [N_REQ] [KV_MEM]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
N_REQ=${2:-2}
KV_MEM=${3:-96M}
BIN=${KVBATCH_BIN:-build/kvbatch}
TD=${KVBATCH_TESTDATA:-$HOME/.cache/kvbatch/testdata}
MODEL=$TD/gemma3/gemma-3-270m-q4_k_m.gguf
[ -x "$BIN" ] || { cmake -S . -B build >/dev/null && cmake --build build -j"$(nproc)" >/dev/null; }
[ -f "$MODEL" ] || scripts/fetch-testdata.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Prompts of ~8,000 tokens: the English text, repeated and shifted per request.
python3 - "$tmp/job.jsonl" "$N_REQ" <<'PY'
import json, sys
words = open("tests/data/ppl-english.txt").read().split()
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        text = " ".join((words[i * 101:] + words) * 2)
        f.write(json.dumps({"custom_id": "long%d" % i, "prompt": text[:38500], "max_tokens": 32, "temperature": 0,
                            "ignore_eos": True}) + "\n")
PY
for i in $(seq 1 "$N_REQ"); do
  n=$(sed -n "${i}p" "$tmp/job.jsonl" | python3 -c "import json,sys; print(json.load(sys.stdin)['prompt'])" |
      "$BIN" tokenize --model "$MODEL" | wc -w)
  echo "prompt $i: $n tokens"
done
"$BIN" info "$MODEL" | sed -n '/^attention/,/^layer/p'
"$BIN" run --model "$MODEL" -i "$tmp/job.jsonl" -o "$tmp/res.jsonl" --metrics "$tmp/m.db" --no-cache \
  --threads "$THREADS" --kv-mem "$KV_MEM" --ctx 8704 2>&1 | grep -v '^\['
python3 - "$tmp/res.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    u = r["response"]["body"]["usage"] if r.get("response") else None
    print("%s: %s" % (r["custom_id"], u if u else r["error"]))
PY
echo "KV of one 8,000-token sequence on every layer: $((8000 * 18 * 2 * 256 * 2 / 1048576)) MiB;" \
     "on the 3 global layers: $((8000 * 3 * 2 * 256 * 2 / 1048576)) MiB, plus a window and a step" \
     "(~1,024 positions) on the 15 others: $((1024 * 15 * 2 * 256 * 2 / 1048576)) MiB; the pool: $KV_MEM"
