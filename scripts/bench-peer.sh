#!/usr/bin/env bash
# The three figures of issue 26, kvbatch (AMX and AVX-512 kernels) against llama.cpp, on one
# Llama-3.2-3B-shaped Q4_0 file (random weights, SmolLM2's tokenizer: scripts/bench-model.py
# writes it to ~/.cache/kvbatch/bench/ the first time), interleaved rep by rep, medians:
#   1. prefill of a 512-token prompt at batch 1 (tok/s);
#   2. batch-1 decode (tok/s), with the DRAM bound measured in the same run (the memory read
#      rate of `bench_amx bw` over the bytes of weights a token reads: the whole file, as the
#      output head is the tied embedding);
#   3. 32 sequences sharing a 256-token prompt, 64 greedy tokens each, EOS ignored (output tok/s):
#      `kvbatch run` on a 32-line job; llama.cpp's llama-server with 32 slots and 32 requests
#      sent at once.
# Also checks that the AMX and AVX-512 runs give the same tokens. A benchmark, not a test.
#   scripts/bench-peer.sh [THREADS] [REPS]
# Environment: LLAMA_CPP_BIN (default /work/scratch/llama.cpp/build/bin; without llama-bench there
# the llama.cpp column is skipped), LLAMA_ARGS (extra llama.cpp arguments; if a llama.cpp run fails
# as it is, it is retried once with --repack 0 / --no-repack and that is said), BENCH_MODEL (another
# GGUF), KVBATCH_BIN, KERNELS (default "amx avx512"), N_GEN (decode tokens, default 64).
set -uo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
REPS=${2:-3}
BIN=${KVBATCH_BIN:-build/kvbatch}
LL=${LLAMA_CPP_BIN:-/work/scratch/llama.cpp/build/bin}
MODEL=${BENCH_MODEL:-$HOME/.cache/kvbatch/bench/llama3b-shape-q4_0.gguf}
KERNELS=${KERNELS:-amx avx512}
N_GEN=${N_GEN:-64}
PY=python3
[ -x "$HOME/.cache/kvbatch-venv/bin/python" ] && PY=$HOME/.cache/kvbatch-venv/bin/python
[ -x "$BIN" ] || { cmake -S . -B build >/dev/null && cmake --build build -j"$(nproc)" >/dev/null; }
cmake --build "$(dirname "$BIN")" --target bench_amx -j"$(nproc)" >/dev/null 2>&1 || true
BW="$(dirname "$BIN")/bench_amx"
[ -f "$MODEL" ] || "$PY" scripts/bench-model.py "$MODEL" || exit 1
for k in $KERNELS; do
  "$BIN" generate --model "$MODEL" --kernels "$k" -p a -n 1 -q >/dev/null 2>&1 ||
    { echo "bench-peer: --kernels $k cannot run here, left out"; KERNELS=$(echo " $KERNELS " | sed "s/ $k / /"); }
done
have_ll=1
[ -x "$LL/llama-bench" ] || { echo "bench-peer: no llama.cpp at $LL (set LLAMA_CPP_BIN): its column is skipped"; have_ll=0; }
tmp=$(mktemp -d)
srv=""
trap '[ -n "$srv" ] && kill "$srv" 2>/dev/null; rm -rf "$tmp"' EXIT

text=$(for i in $(seq 1 60); do
  printf 'Section %d. The history of the printing press begins in the fifteenth century, when movable type changed how knowledge travelled across Europe. Printers, scholars and merchants built networks that carried books from Mainz to Venice and beyond. ' "$i"
done)
all=$("$BIN" tokenize --model "$MODEL" "$text")
ids512=$(echo "$all" | cut -d' ' -f1-512)
ids256=$(echo "$all" | cut -d' ' -f1-256)
ids16=$(echo "$all" | cut -d' ' -f1-16)
"$PY" - "$tmp" "$ids256" "$N_GEN" <<'PY'
import json, sys
tmp, ids, n = sys.argv[1], [int(x) for x in sys.argv[2].split()], int(sys.argv[3])
with open(f"{tmp}/job.jsonl", "w") as f:
    for i in range(32):
        f.write(json.dumps({"custom_id": f"s{i}", "body": {"prompt": ids, "max_tokens": n, "temperature": 0,
                                                           "ignore_eos": True}}) + "\n")
PY
model_bytes=$(stat -c %s "$MODEL")
echo "bench-peer: $(basename "$MODEL") ($((model_bytes / 1000000)) MB), $THREADS threads, $REPS reps, kernels: $KERNELS"

# llama.cpp: llama-bench for prefill and decode; one retry with repacking off if a run fails
ll_bench() { # args -> tok/s of the one test it runs, or nothing
  local out
  if ! out=$("$LL/llama-bench" -m "$MODEL" -t "$THREADS" -r 1 -o json ${LLAMA_ARGS:-} "$@" 2>/dev/null); then
    out=$("$LL/llama-bench" -m "$MODEL" -t "$THREADS" -r 1 -o json --repack 0 ${LLAMA_ARGS:-} "$@" 2>/dev/null) || return 0
    echo "(llama-bench failed with weight repacking on; retried with --repack 0)" >&2
  fi
  echo "$out" | "$PY" -c "import json,sys; print(json.load(sys.stdin)[0]['avg_ts'])" 2>/dev/null
}

ll_server_job() { # -> output tok/s of 32 requests at once on a 32-slot llama-server, or nothing
  local port=18321 args=(-m "$MODEL" -t "$THREADS" -np 32 -c $((32 * (256 + N_GEN + 16))) --port 18321)
  "$LL/llama-server" "${args[@]}" ${LLAMA_ARGS:-} >"$tmp/server.log" 2>&1 &
  srv=$!
  for _ in $(seq 1 300); do
    curl -sf "localhost:$port/health" >/dev/null 2>&1 && break
    kill -0 "$srv" 2>/dev/null || break
    sleep 1
  done
  if ! kill -0 "$srv" 2>/dev/null; then # crashed: once more without repacking
    "$LL/llama-server" "${args[@]}" --no-repack ${LLAMA_ARGS:-} >"$tmp/server.log" 2>&1 &
    srv=$!
    echo "(llama-server retried with --no-repack)" >&2
    for _ in $(seq 1 300); do curl -sf "localhost:$port/health" >/dev/null 2>&1 && break; sleep 1; done
  fi
  "$PY" - "$port" "$ids256" "$N_GEN" <<'PY' || true
import json, sys, threading, time, urllib.request
port, ids, n = int(sys.argv[1]), [int(x) for x in sys.argv[2].split()], int(sys.argv[3])
done = []
def one():
    body = json.dumps({"prompt": ids, "n_predict": n, "temperature": 0, "ignore_eos": True, "cache_prompt": True})
    r = urllib.request.urlopen(urllib.request.Request(f"http://localhost:{port}/completion", body.encode(),
                                                      {"Content-Type": "application/json"}), timeout=3600)
    done.append(json.load(r)["tokens_predicted"])
ts = [threading.Thread(target=one) for _ in range(32)]
t0 = time.time()
for t in ts: t.start()
for t in ts: t.join()
if len(done) == 32: print(sum(done) / (time.time() - t0))
PY
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  srv=""
}

gen() { # kernel ids n -> "prefill_tok/s decode_tok/s" and the ids in $tmp/ids-KERNEL-n
  local err
  err=$("$BIN" generate --model "$MODEL" --kernels "$1" --prompt-ids "$2" -n "$3" --temperature 0 --ignore-eos \
    --threads "$THREADS" --print-ids 2>&1 >"$tmp/ids-$1-$3")
  echo "$(echo "$err" | sed -n 's/^prefill: .*(\([0-9.]*\) tok\/s)/\1/p') $(echo "$err" | sed -n 's/^decode: .*(\([0-9.]*\) tok\/s)/\1/p')"
}

job() { # kernel -> output tok/s of the 32-sequence job; results in $tmp/out-KERNEL.jsonl
  rm -f "$tmp/m-$1.db"*
  "$BIN" run --model "$MODEL" --kernels "$1" -i "$tmp/job.jsonl" -o "$tmp/out-$1.jsonl" --metrics "$tmp/m-$1.db" \
    --threads "$THREADS" --no-cache --quiet || return 0
  "$PY" -c "import sqlite3,sys; w,g=sqlite3.connect(sys.argv[1]).execute('select wall_seconds, completion_tokens from runs').fetchone(); print(g/w)" "$tmp/m-$1.db"
}

add() { echo "$2" >>"$tmp/fig-$1"; } # figure-column value
for r in $(seq 1 "$REPS"); do
  add bw "$("$BW" bw "$THREADS" 2048 2>/dev/null | sed -n 's/^memory read: \([0-9.]*\) GB.*/\1/p')"
  for k in $KERNELS; do
    read -r p _ <<<"$(gen "$k" "$ids512" 1)"
    add "prefill-$k" "$p"
    read -r _ d <<<"$(gen "$k" "$ids16" "$N_GEN")"
    add "decode-$k" "$d"
    add "job-$k" "$(job "$k")"
  done
  if [ $have_ll = 1 ]; then
    add prefill-llama.cpp "$(ll_bench -p 512 -n 0)"
    add decode-llama.cpp "$(ll_bench -p 0 -n "$N_GEN")"
    [ -x "$LL/llama-server" ] && add job-llama.cpp "$(ll_server_job)"
  fi
  echo "  rep $r done"
done

"$PY" - "$tmp" "$model_bytes" "$KERNELS" $have_ll <<'PY'
import os, statistics, sys
tmp, mbytes, kernels, have_ll = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4] == "1"
def med(name):
    p = os.path.join(tmp, "fig-" + name)
    v = [float(x) for x in open(p).read().split()] if os.path.exists(p) else []
    return (statistics.median(v), len(v)) if v else (None, 0)
cols = kernels + (["llama.cpp"] if have_ll else [])
bw, _ = med("bw")
print(f"\n{'figure (median)':<44}" + "".join(f"{c:>12}" for c in cols))
for fig, label in (("prefill", "prefill, 512-token prompt, batch 1 (tok/s)"), ("decode", "decode, batch 1 (tok/s)"),
                   ("job", "32 seqs sharing 256 tokens (out tok/s)")):
    vals = {c: med(f"{fig}-{c}")[0] for c in cols}
    print(f"{label:<44}" + "".join(f"{vals[c]:>12.2f}" if vals[c] else f"{'-':>12}" for c in cols))
    k0 = kernels[0] if kernels else None
    ratios = []
    for c in cols[1:]:
        if vals.get(k0) and vals.get(c):
            ratios.append(f"{k0}/{c} {vals[k0] / vals[c]:.2f}x")
    if ratios:
        print(f"{'':<44}  " + ", ".join(ratios))
    if fig == "decode" and bw:
        bound = bw * 1e9 / mbytes
        print(f"{'':<44}  DRAM bound {bound:.2f} tok/s ({bw:.1f} GB/s over {mbytes / 1e9:.2f} GB): "
              + ", ".join(f"{c} {100 * vals[c] / bound:.0f}%" for c in cols if vals[c]))
PY
# the same tokens with every kernel
ok=1
set -- $KERNELS
for k in "$@"; do
  cmp -s "$tmp/ids-$1-1" "$tmp/ids-$k-1" && cmp -s "$tmp/ids-$1-$N_GEN" "$tmp/ids-$k-$N_GEN" || ok=0
  [ -f "$tmp/out-$k.jsonl" ] && ! "$PY" - "$tmp/out-$1.jsonl" "$tmp/out-$k.jsonl" <<'PY' && ok=0
import json, sys
a, b = ({d["custom_id"]: d["response"]["body"]["choices"][0]["text"] for d in map(json.loads, open(p))} for p in sys.argv[1:3])
sys.exit(a != b)
PY
done
[ $ok = 1 ] && echo "tokens and job outputs identical across kernels ($KERNELS)" || echo "WARNING: outputs differ across kernels"
