#!/usr/bin/env bash
# Embeddings throughput and the warm rerun of a RAG corpus, side by side
# with llama.cpp's llama-embedding.
#   scripts/bench-embed.sh [N_CHUNKS] [THREADS]
# N_CHUNKS (default 10000) chunks of about 200 tokens each are embedded by
# two random-weight models of real shapes, written as llama.cpp's converter
# writes them: BERT-base (12 layers, 768 wide, 12 heads, FFN 3072, the
# bge WordPiece vocabulary, mean pooling) and Qwen3-0.6B (28 layers, 1024
# wide, 16 query / 8 KV heads of 128, FFN 3072, last-token pooling; a small
# byte-level BPE vocabulary: the layers, not the vocabulary, cost the time).
# Weights are F16 (WTYPE=q8_0 for Q8_0). For each model, interleaved:
#   1. kvbatch, an empty cache (cold): every chunk computed;
#   2. llama-embedding on the same file and chunks (when $LLAMA_CPP_BIN, the
#      directory of llama.cpp's binaries built outside the repository, has
#      it; skipped otherwise), with its repacked weights off (--no-repack:
#      its AMX path crashes on some machines);
#   3. kvbatch again on the same cache after changing 2 % of the chunks
#      (warm): only those are computed, the rest come from the results
#      cache.
# Prints chunks/s and tokens/s of each, kvbatch / llama.cpp, and the warm
# run's share of the cold run's time; beside the wall-clock seconds, the CPU
# seconds each process used (user + system, by /usr/bin/time when there is
# one), the fairer measure on a machine other work shares. Goals: kvbatch
# >= 2x llama.cpp; warm <= 5 % of cold. Not a test: the figures are
# printed, not judged.
# MODELS="bert qwen3" chooses the models. KERNELS="amx avx512" runs the cold
# pass once per kernel set named (KVBATCH_KERNELS, each on an empty cache),
# interleaved with llama-embedding; the first set named runs the warm pass.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10000}
THREADS=${2:-$(nproc)}
BIN=build/kvbatch
MODELS=${MODELS:-bert qwen3}
WTYPE=${WTYPE:-f16}
KERNELS=${KERNELS:-auto}
PY=${KVBATCH_VENV:-$HOME/.cache/kvbatch-venv}/bin/python
[ -x "$PY" ] || PY=python3
LLAMA_EMB=${LLAMA_CPP_BIN:+$LLAMA_CPP_BIN/llama-embedding}
[ -x "$BIN" ] || { cmake -S . -B build >/dev/null && cmake --build build -j"$(nproc)" >/dev/null; }
VOCAB=${KVBATCH_TESTDATA:-$HOME/.cache/kvbatch/testdata}/tokenizer/ggml-vocab-bert-bge.gguf
[ -f "$VOCAB" ] || scripts/fetch-testdata.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The models (random weights, real shapes) and the corpus: for each model
# the chunks as a kvbatch job, as llama-embedding's prompt file (one a
# line), and with 2 % of them changed.
"$PY" - "$tmp" "$N" "$VOCAB" "$WTYPE" "$BIN" "$MODELS" <<'PY'
import json, os, random, subprocess, sys
import numpy as np
import gguf
tmp, n, vocab_path, wtype, kvb, models = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6].split()
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import hfref_gguf
rng = np.random.default_rng(0)
QT = gguf.GGMLQuantizationType

def tensor(w, name, shape, scale, vec=False):
    a = (scale * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if vec:
        w.add_tensor(name, a, raw_dtype=QT.F32)
    elif wtype == "q8_0":
        w.add_tensor(name, gguf.quants.quantize(a, QT.Q8_0), raw_dtype=QT.Q8_0)
    else:
        w.add_tensor(name, a.astype(np.float16), raw_dtype=QT.F16)

def ones(w, name, n):
    w.add_tensor(name, (1 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32), raw_dtype=QT.F32)

def bert(path):
    e, f, L, H, ctx = 768, 3072, 12, 12, 512
    w = gguf.GGUFWriter(path, "bert")
    w.add_name("bench-bert-base")
    w.add_context_length(ctx); w.add_embedding_length(e); w.add_feed_forward_length(f)
    w.add_block_count(L); w.add_head_count(H); w.add_layer_norm_eps(1e-12); w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN); w.add_token_type_count(2)
    r = gguf.GGUFReader(vocab_path)
    for k in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
              "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.padding_token_id",
              "tokenizer.ggml.cls_token_id", "tokenizer.ggml.mask_token_id"):
        fl = r.fields[k]
        if fl.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, fl.contents(), fl.types[0], sub_type=fl.types[1])
        else:
            w.add_key_value(k, fl.contents(), fl.types[0])
    nv = len(r.fields["tokenizer.ggml.tokens"].data)
    tensor(w, "token_embd.weight", (nv, e), 1.0)
    # the converter keeps these two in F32 whatever the file type (llama.cpp adds them to f32 rows)
    tensor(w, "position_embd.weight", (ctx, e), 1.0, vec=True); tensor(w, "token_types.weight", (2, e), 1.0, vec=True)
    ones(w, "token_embd_norm.weight", e); tensor(w, "token_embd_norm.bias", e, 0.1, vec=True)
    for l in range(L):
        p = f"blk.{l}."
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensor(w, p + t + ".weight", (e, e), e ** -0.5); tensor(w, p + t + ".bias", e, 0.1, vec=True)
        ones(w, p + "attn_output_norm.weight", e); tensor(w, p + "attn_output_norm.bias", e, 0.1, vec=True)
        tensor(w, p + "ffn_up.weight", (f, e), e ** -0.5); tensor(w, p + "ffn_up.bias", f, 0.1, vec=True)
        tensor(w, p + "ffn_down.weight", (e, f), f ** -0.5); tensor(w, p + "ffn_down.bias", e, 0.1, vec=True)
        ones(w, p + "layer_output_norm.weight", e); tensor(w, p + "layer_output_norm.bias", e, 0.1, vec=True)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

def qwen3(path):
    e, f, L, H, KV, hd = 1024, 3072, 28, 16, 8, 128
    nv = hfref_gguf.vocab_size()
    w = gguf.GGUFWriter(path, "qwen3")
    w.add_name("bench-qwen3-0.6b")
    w.add_block_count(L); w.add_context_length(2048); w.add_embedding_length(e); w.add_feed_forward_length(f)
    w.add_head_count(H); w.add_head_count_kv(KV); w.add_rope_freq_base(1e6); w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(hd); w.add_value_length(hd); w.add_pooling_type(gguf.PoolingType.LAST)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    hfref_gguf._write_vocab(w, nv)
    tensor(w, "token_embd.weight", (nv, e), 1.0); ones(w, "output_norm.weight", e)
    for l in range(L):
        p = f"blk.{l}."
        ones(w, p + "attn_norm.weight", e); ones(w, p + "ffn_norm.weight", e)
        ones(w, p + "attn_q_norm.weight", hd); ones(w, p + "attn_k_norm.weight", hd)
        tensor(w, p + "attn_q.weight", (H * hd, e), e ** -0.5); tensor(w, p + "attn_k.weight", (KV * hd, e), e ** -0.5)
        tensor(w, p + "attn_v.weight", (KV * hd, e), e ** -0.5); tensor(w, p + "attn_output.weight", (e, H * hd), e ** -0.5)
        tensor(w, p + "ffn_gate.weight", (f, e), e ** -0.5); tensor(w, p + "ffn_up.weight", (f, e), e ** -0.5)
        tensor(w, p + "ffn_down.weight", (e, f), f ** -0.5)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

words = ("river harbor council market winter bridge archive school merchant farmer engineer village railway museum "
         "festival garden library station theatre factory mill canal orchard tower lighthouse ferry vineyard quarry "
         "forest meadow valley island coast plateau glacier delta estuary lagoon summit").split()
def sentence(r):
    return (f"In {1700 + r.randrange(300)} the {r.choice(words)} near the {r.choice(words)} was "
            f"{r.choice(['built', 'restored', 'opened', 'closed', 'flooded'])} and {r.randrange(2, 900)} people came.")

for name in models:
    path = f"{tmp}/{name}.gguf"
    (bert if name == "bert" else qwen3)(path)
    # how many sentences make ~200 tokens with this model's tokenizer
    r = random.Random(1)
    sample = " ".join(sentence(r) for _ in range(20))
    toks = subprocess.run([kvb, "tokenize", "-m", path, "--", sample], capture_output=True, text=True).stdout.split()
    per = max(1, round(200 / (len(toks) / 20)))
    chunks = []
    for i in range(n):
        r = random.Random(i)
        chunks.append(f"Chunk {i}. " + " ".join(sentence(r) for _ in range(per)))
    changed = list(chunks)
    for i in random.Random(7).sample(range(n), max(1, n // 50)):
        changed[i] = changed[i].replace("people", "visitors", 1)
    for tag, cs in (("cold", chunks), ("warm", changed)):
        with open(f"{tmp}/{name}-{tag}.jsonl", "w") as fj:
            for i, c in enumerate(cs):
                fj.write(json.dumps({"custom_id": f"c{i}", "input": c}) + "\n")
    with open(f"{tmp}/{name}.txt", "w") as ft:
        ft.write("\n".join(chunks) + "\n")
    print(f"{name}: {n} chunks of {per} sentences", file=sys.stderr)
PY

declare -A RES
TIMED=()
[ -x /usr/bin/time ] && TIMED=(/usr/bin/time -f "%U %S" -o)
cpu_of() { # the time file: user + system seconds, or "" without /usr/bin/time
  [ -s "$1" ] && awk 'END { printf "%.2f", $1 + $2 }' "$1" || true
}
kvb_run() { # model tag kernels (the tag's job is $tmp/model-${tag%%-*}.jsonl)
  local t0 t1 err="$tmp/$1-$2.err" job="${2%%-*}"
  t0=$(date +%s.%N)
  KVBATCH_KERNELS="$3" ${TIMED[@]+"${TIMED[@]}" "$tmp/$1-$2.time"} "$BIN" run -m "$tmp/$1.gguf" \
    -i "$tmp/$1-$job.jsonl" -o "$tmp/$1-$2.out" --metrics "$tmp/$1-$2.db" --cache-dir "$tmp/cache-$1-$3" \
    --threads "$THREADS" 2>"$err" || { cat "$err"; exit 1; }
  t1=$(date +%s.%N)
  RES[$1-$2-cpu]=$(cpu_of "$tmp/$1-$2.time")
  local tok comp
  tok=$(sed -n 's/.* \([0-9]*\) prompt tokens (.*/\1/p' "$err" | tail -1)
  comp=$(sed -n 's/.*, \([0-9]*\) computed).*/\1/p' "$err" | tail -1)
  RES[$1-$2-s]=$(echo "$t1 - $t0" | bc -l)
  RES[$1-$2-tok]=$tok
  RES[$1-$2-comp]=$comp
}
llama_run() { # model pooling
  [ -n "$LLAMA_EMB" ] && [ -x "$LLAMA_EMB" ] || { RES[$1-llama-s]=""; return; }
  local t0 t1
  t0=$(date +%s.%N)
  ${TIMED[@]+"${TIMED[@]}" "$tmp/$1-llama.time"} "$LLAMA_EMB" -m "$tmp/$1.gguf" -f "$tmp/$1.txt" --pooling "$2" \
    -t "$THREADS" --no-repack -c 8192 -b 8192 \
    -ub 2048 --embd-output-format array >"$tmp/$1-llama.out" 2>"$tmp/$1-llama.err" || {
    tail -5 "$tmp/$1-llama.err"
    RES[$1-llama-s]=""
    return
  }
  t1=$(date +%s.%N)
  RES[$1-llama-s]=$(echo "$t1 - $t0" | bc -l)
  RES[$1-llama-cpu]=$(cpu_of "$tmp/$1-llama.time")
}

for m in $MODELS; do
  pool=mean
  [ "$m" = qwen3 ] && pool=last
  first=""
  for k in $KERNELS; do
    first=${first:-$k}
    echo "== $m: cold (kvbatch, kernels $k) =="
    kvb_run "$m" "cold-$k" "$k"
    [ -n "${RES[$m-llama-s]:-}" ] && continue
    echo "== $m: llama-embedding =="
    llama_run "$m" "$pool"
  done
  echo "== $m: warm, 2 % of the chunks changed (kvbatch, kernels $first) =="
  kvb_run "$m" "warm-$first" "$first"
done

printf '\n%-6s %-22s %8s %10s %9s %10s %12s %9s\n' model run chunks tokens seconds chunks/s tokens/s cpu-s
for m in $MODELS; do
  first=${KERNELS%% *}
  tok=${RES[$m-cold-$first-tok]}
  for r in $(for k in $KERNELS; do echo "cold-$k"; done) llama "warm-$first"; do
    s=${RES[$m-$r-s]:-}
    [ -n "$s" ] || { printf '%-6s %-22s %8s\n' "$m" "llama-embedding" "skipped (set LLAMA_CPP_BIN)"; continue; }
    case $r in
    cold-*) name="kvbatch cold ${r#cold-}" ;;
    warm-*) name="kvbatch warm (2 %)" ;;
    *) name="llama-embedding" ;;
    esac
    printf '%-6s %-22s %8d %10d %9.1f %10.1f %12.0f %9s\n' "$m" "$name" "$N" "$tok" "$s" \
      "$(echo "$N / $s" | bc -l)" "$(echo "$tok / $s" | bc -l)" "${RES[$m-$r-cpu]:--}"
  done
  for k in $KERNELS; do
    [ -n "${RES[$m-llama-s]:-}" ] &&
      printf '%-6s kvbatch %s / llama.cpp: %.2fx (goal >= 2x)\n' "$m" "$k" \
        "$(echo "${RES[$m-llama-s]} / ${RES[$m-cold-$k-s]}" | bc -l)"
    [ -n "${RES[$m-llama-cpu]:-}" ] && [ -n "${RES[$m-cold-$k-cpu]:-}" ] &&
      printf '%-6s kvbatch %s / llama.cpp by CPU seconds: %.2fx\n' "$m" "$k" \
        "$(echo "${RES[$m-llama-cpu]} / ${RES[$m-cold-$k-cpu]}" | bc -l)"
  done
  printf '%-6s warm / cold: %.1f %% of the time (goal <= 5 %%); %s prompt tokens computed of %s\n' "$m" \
    "$(echo "100 * ${RES[$m-warm-$first-s]} / ${RES[$m-cold-$first-s]}" | bc -l)" "${RES[$m-warm-$first-comp]}" \
    "${RES[$m-warm-$first-tok]}"
done
