#!/usr/bin/env bash
# Decode speed of a mixture-of-experts model: a random-weight Qwen3-30B-A3B-shaped
# qwen3moe file (Q4_K, 320-token vocabulary; scripts/moe-bench-model.py writes it
# into ~/.cache/kvbatch/bench once), decode tokens/s at batch 1 and at batch 32,
# kvbatch beside llama.cpp on the same file, runs interleaved (the machine is
# shared: a slow spell should land on both). A benchmark, not a test.
#   [LLAMA_CPP_BIN=DIR] [N_LAYERS=12] [REPS=2] [N_GEN=64] [BATCH=32] [THREAD_SET="1 2"]
#   [N_CPU=32] [CPU_REPS=2] scripts/bench-moe.sh
# N_LAYERS: the model's 48 layers are ~17 GB at Q4_K; the default 12 (4.2 GB)
# leaves a shared 24 GiB machine its memory (per-layer work is the same, so
# tokens/s scale as 1/layers). LLAMA_CPP_BIN: a directory with llama-bench and
# llama-server (llama.cpp built outside the repository); without it, kvbatch alone.
# kvbatch: batch 1 is `generate` (its decode line); batch BATCH is `run` on BATCH
# requests at once (--max-batch BATCH), each a 9-token prompt and N_GEN tokens
# (ignore_eos), and the decode rate is the sum over requests of 1 / their time
# per output token (the requests decode side by side, so that is tokens/s of
# the whole step). llama.cpp: batch 1 is llama-bench's tg figure; batch BATCH is
# llama-server with BATCH slots and BATCH concurrent requests of the same shape,
# the sum of their predicted_per_second. Both with --repack 0: llama.cpp's
# repacking routes matrices to its AMX kernels, which die on this machine
# (SIGILL in ggml_backend_amx_mul_mat); kvbatch does not repack Q4_K either.
# Each tool runs at each thread count of THREAD_SET (default 1 and nproc) and
# keeps its best: on an oversubscribed machine llama.cpp's spinning threads
# can run several times slower on 2 threads than on 1 (seen here: 8.6 vs 61
# tok/s), and a figure that measures that says nothing about either tool.
# Then decode tokens per CPU-second on one thread (scripts/moe-bench-cpu.py:
# the user CPU time of 1 + N_CPU tokens less that of 1 token, least of
# CPU_REPS; user time because kvbatch's load has seconds of varying system
# time, its copy of the experts into huge pages):
# on a loaded machine the wall-clock rates swing several-fold between runs,
# the CPU time charged for a step much less, so that ratio is the one to read
# there. CPU_REPS=0 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
THREAD_SET=${THREAD_SET:-$( (echo 1; nproc) | sort -un | tr '\n' ' ')}
N_LAYERS=${N_LAYERS:-12}
REPS=${REPS:-2}
N_GEN=${N_GEN:-64}
B=${BATCH:-32}
BIN=${KVBATCH_BIN:-build/kvbatch}
PY=${KVBATCH_VENV:-$HOME/.cache/kvbatch-venv}/bin/python
[ -x "$PY" ] || PY=python3
MODEL=${BENCH_MODEL:-$HOME/.cache/kvbatch/bench/qwen3moe-a3b-shape-${N_LAYERS}l-q4k.gguf}
[ -x "$BIN" ] || { cmake -S . -B build >/dev/null && cmake --build build -j"$(nproc)" >/dev/null; }
if [ ! -f "$MODEL" ]; then
  mkdir -p "$(dirname "$MODEL")"
  "$PY" scripts/moe-bench-model.py "$MODEL.tmp" "$N_LAYERS" && mv "$MODEL.tmp" "$MODEL"
fi
LL=""
if [ -n "${LLAMA_CPP_BIN:-}" ] && [ -x "$LLAMA_CPP_BIN/llama-bench" ] && [ -x "$LLAMA_CPP_BIN/llama-server" ]; then
  LL=$LLAMA_CPP_BIN
else
  echo "bench-moe: LLAMA_CPP_BIN not set (or no llama-bench/llama-server there): kvbatch alone"
fi
tmp=$(mktemp -d)
server_pid=""
trap '[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; rm -rf "$tmp"' EXIT

# The prompts: 9 byte tokens each (the vocabulary has no merges for these).
"$PY" - "$tmp" "$B" "$N_GEN" <<'PY'
import json, sys
tmp, b, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(f"{tmp}/job.jsonl", "w") as f:
    for i in range(b):
        f.write(json.dumps({"custom_id": f"r{i}", "prompt": f"Job {i:04d}:", "max_tokens": n, "temperature": 0,
                            "ignore_eos": True}) + "\n")
PY
ids=$("$BIN" tokenize --model "$MODEL" "Job 0000:")

kvb_b1() {
  "$BIN" generate --model "$MODEL" --prompt-ids "$ids" -n "$N_GEN" --temperature 0 --ignore-eos --threads "$1" \
    --print-ids 2>&1 >/dev/null | sed -n 's/^decode: .*(\([0-9.]*\) tok\/s)/\1/p'
}
kvb_bn() {
  rm -f "$tmp"/m.db*
  "$BIN" run --model "$MODEL" -i "$tmp/job.jsonl" -o "$tmp/out.jsonl" --metrics "$tmp/m.db" --threads "$1" \
    --max-batch "$B" --quiet --no-cache
  "$PY" - "$tmp/m.db" <<'PY'
import sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute("select tpot_s from requests").fetchall()
print("%.2f" % sum(1 / r[0] for r in rows if r[0]))
PY
}
ll_b1() {
  "$LL/llama-bench" -m "$MODEL" -p 0 -n "$N_GEN" -t "$1" -r 1 --repack 0 -o jsonl 2>/dev/null |
    "$PY" -c 'import json, sys; print("%.2f" % [json.loads(l) for l in sys.stdin if l.strip()][-1]["avg_ts"])'
}
ll_bn() {
  local port=$((20000 + RANDOM % 20000))
  "$LL/llama-server" -m "$MODEL" --host 127.0.0.1 --port "$port" -t "$1" -np "$B" \
    -c $((B * (N_GEN + 32))) --no-repack --log-disable >"$tmp/server.log" 2>&1 &
  server_pid=$!
  "$PY" - "$port" "$B" "$N_GEN" "$ids" <<'PY' || { kill "$server_pid"; server_pid=""; return 1; }
import concurrent.futures, json, sys, time, urllib.request
port, b, n, ids = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), [int(x) for x in sys.argv[4].split()]
url = f"http://127.0.0.1:{port}"
for _ in range(600):  # the model loads
    try:
        urllib.request.urlopen(url + "/health", timeout=2)
        break
    except Exception:
        time.sleep(0.5)
else:
    sys.exit("llama-server did not come up")
def one(i):
    body = {"prompt": ids[:-1] + [ids[-1] + i % 8], "n_predict": n, "ignore_eos": True, "temperature": 0,
            "cache_prompt": False}
    req = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=3600).read())["timings"]["predicted_per_second"]
with concurrent.futures.ThreadPoolExecutor(b) as ex:
    print("%.2f" % sum(ex.map(one, range(b))))
PY
  kill "$server_pid" 2>/dev/null
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

echo "bench-moe: $("$BIN" info "$MODEL" | sed -n 's/^name: *//p'), $(du -h "$MODEL" | cut -f1), threads $THREAD_SET," \
  "decode of $N_GEN tokens, best of $REPS (interleaved)"
kb1=0; kbn=0; lb1=0; lbn=0
best() { "$PY" -c "import sys; print(max(float(sys.argv[1]), float(sys.argv[2] or 0)))" "$1" "$2"; }
for r in $(seq 1 "$REPS"); do
  for t in $THREAD_SET; do
    v=$(kvb_b1 "$t"); echo "  run $r, $t threads: kvbatch batch 1: $v tok/s"; kb1=$(best "$kb1" "$v")
    if [ -n "$LL" ]; then
      v=$(ll_b1 "$t" || echo 0); echo "  run $r, $t threads: llama.cpp batch 1: $v tok/s"; lb1=$(best "$lb1" "$v")
    fi
    v=$(kvb_bn "$t"); echo "  run $r, $t threads: kvbatch batch $B: $v tok/s"; kbn=$(best "$kbn" "$v")
    if [ -n "$LL" ]; then
      v=$(ll_bn "$t" || echo 0); echo "  run $r, $t threads: llama.cpp batch $B: $v tok/s"; lbn=$(best "$lbn" "$v")
    fi
  done
done
"$PY" - "$kb1" "$lb1" "$kbn" "$lbn" "$B" <<'PY'
import sys
kb1, lb1, kbn, lbn = map(float, sys.argv[1:5])
b = sys.argv[5]
def ratio(k, l):
    return "%.2fx" % (k / l) if l > 0 else "-"
print("%-9s %12s %12s %8s" % ("decode", "kvbatch", "llama.cpp", "ratio"))
print("%-9s %12.2f %12s %8s" % ("batch 1", kb1, "%.2f" % lb1 if lb1 else "-", ratio(kb1, lb1)))
print("%-9s %12.2f %12s %8s" % ("batch " + b, kbn, "%.2f" % lbn if lbn else "-", ratio(kbn, lbn)))
print("tokens/s of the whole step (batch %s: summed over the sequences), each tool at its best thread count;"
      " goal: kvbatch >= 1.2x llama.cpp" % b)
PY
CPU_REPS=${CPU_REPS:-2}
N_CPU=${N_CPU:-32}
if [ "$CPU_REPS" -gt 0 ]; then
  echo "decode tokens per CPU-second, 1 thread ($N_CPU tokens after the first, least user CPU time of $CPU_REPS, interleaved):"
  for b in 1 "$B"; do
    "$PY" scripts/moe-bench-cpu.py "$BIN" "$MODEL" "${LL:--}" "$b" "$N_CPU" "$ids" "$CPU_REPS"
  done | "$PY" -c '
import sys
r = {}
for line in sys.stdin:
    name, b, v = line.split()
    r.setdefault(b, {})[name] = float(v)
print("%-9s %12s %12s %8s" % ("decode", "kvbatch", "llama.cpp", "ratio"))
for b, v in r.items():
    k, l = v.get("kvbatch", 0), v.get("llama.cpp", 0)
    print("%-9s %12.2f %12s %8s" % ("batch " + b, k, "%.2f" % l if l else "-", "%.2fx" % (k / l) if l else "-"))
print("tokens per CPU-second of the decode steps on one thread; goal: kvbatch >= 1.2x llama.cpp")'
fi
