#!/usr/bin/env bash
# emu.sh — runs the CUDA backend's tests on the CPU, without a GPU: the
# kernels of kernels/*.cu compiled as C++ over cuda_emu.h (threads as
# fibers, real barriers), be_cuda*.c and k_gemm.c over fake_cuda.c (CUDA
# runtime and cuBLAS in host memory), linked with a CPU-only kvbcore, under
# AddressSanitizer + UBSan. It checks logic — indexing, layouts, barriers,
# the GEMM's leading dimensions against cuBLAS's definition, the backend's
# step against the CPU backend — not GPU arithmetic or speed.
#
#   kernels/emu/emu.sh [BUILD_DIR]     (default: build-emu; needs python3, g++,
#                                       the CUDA headers in $CUDA_HOME/include)
# Set KVB_MODEL to a GGUF to include the real-model comparison (slow here);
# KVB_CUDA_CASES=label,label runs only those synthetic models of test_cuda_backend.
# EMU_BERT=1 adds tests/pytest_embed_bert.py over the emulated kvbatch (--device cuda).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bdir=${1:-$root/build-emu}
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
san=${EMU_SANITIZE--fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined}
mkdir -p "$bdir/emu"
cmake -S "$root" -B "$bdir" -DKVBATCH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVBATCH_SANITIZE=$([ -n "$san" ] && echo ON || echo OFF) >/dev/null
cmake --build "$bdir" -j"$(nproc)" --target kvb_testsupport >/dev/null

# kernel<<<grid, block, smem, stream>>>(args);  ->  emu_launch(grid, block, stream, std::bind(kernel, args));
# (bind: the arguments are evaluated and copied at the launch, as CUDA does,
# which a launch recorded into a graph and run later depends on)
for cu in "$root"/kernels/k_*.cu; do
  python3 - "$cu" "$bdir/emu/$(basename "$cu" .cu).cc" <<'PY'
import re, sys
src = open(sys.argv[1]).read()
src = re.sub(r'#include <(cuda_fp16|cuda_bf16|mma)\.h>\n', '', src)
pat = re.compile(r'([A-Za-z_]\w*(?:<[^<>;]*>)?)<<<([^;]*?),\s*([^;]*?),\s*[^;,]*?,\s*([^;,]*?)>>>\(([^;]*)\);')
out, n = pat.subn(lambda m: 'emu_launch(%s, %s, %s, std::bind(%s, %s));' % (m.group(2), m.group(3), m.group(4), m.group(1), m.group(5)), src)
if '<<<' in out:
    sys.exit('emu.sh: a launch in %s was not rewritten' % sys.argv[1])
open(sys.argv[2], 'w').write('#line 1 "%s"\n' % sys.argv[1] + out)
PY
done

flags="-O1 -g $san -D_GNU_SOURCE -DKVBATCH_HAVE_CUDA=1 -I$root/src -I$root -I$root/tests -I$cuda_inc -I$root/kernels/emu"
objs=()
for cc in "$bdir"/emu/k_*.cc "$root/kernels/emu/cuda_emu.cc"; do
  o="$bdir/emu/$(basename "$cc").o"
  g++ -std=c++17 -Wall -Wextra -Werror -Wno-unused-parameter -Wno-unknown-pragmas $flags -include cuda_emu.h -c "$cc" -o "$o"
  objs+=("$o")
done
for c in "$root/kernels/emu/fake_cuda.c" "$root"/kernels/be_cuda*.c "$root/kernels/k_gemm.c"; do
  o="$bdir/emu/$(basename "$c").o"
  gcc -std=c11 -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter $flags -c "$c" -o "$o"
  objs+=("$o")
done
libs=""
for l in testsupport app engine cpu backend text model pstore metrics jobs base; do libs="$libs $bdir/libkvb_$l.a"; done
libs="$libs -llmdb -lzstd -lsqlite3 -lxxhash -lpthread -lm"
rc=0
for t in test_cuda_kernels test_cuda_enc test_cuda_backend; do
  gcc -std=c11 -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter $flags -c "$root/tests/$t.c" -o "$bdir/emu/$t.o"
  g++ $san "$bdir/emu/$t.o" "${objs[@]}" $libs -o "$bdir/emu/$t"
  echo "== $t (emulated device)"
  ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=0 "$bdir/emu/$t" || rc=$?
done
# The kernels again with each block's threads resumed last first: a missing
# barrier that the first order hid shows up in this one (cuda_emu.cc).
echo "== test_cuda_kernels (emulated device, threads in reverse order)"
EMU_ORDER=reverse ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=0 "$bdir/emu/test_cuda_kernels" \
  > "$bdir/emu/kernels-reverse.log" 2>&1 || { rc=1; grep -E "FAIL|CHECK" "$bdir/emu/kernels-reverse.log"; }
echo "$(grep -c ' ok' "$bdir/emu/kernels-reverse.log") checks ok, $(grep -c FAIL "$bdir/emu/kernels-reverse.log") failed"
echo "== test_cuda_enc (emulated device, threads in reverse order)"
EMU_ORDER=reverse ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=0 "$bdir/emu/test_cuda_enc" \
  > "$bdir/emu/enc-reverse.log" 2>&1 || { rc=1; grep -E "FAIL|CHECK" "$bdir/emu/enc-reverse.log"; }
echo "$(grep -c ' ok$' "$bdir/emu/enc-reverse.log") checks ok, $(grep -c "CHECK failed" "$bdir/emu/enc-reverse.log") failed"
# The benchmark driver, on tiny models (in memory, and a synthetic file):
# that it runs, not how fast.
bench_objs=()
for c in "$root"/bench/gpu/*.c; do
  o="$bdir/emu/bench-$(basename "$c").o"
  gcc -std=c11 -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter $flags -c "$c" -o "$o"
  bench_objs+=("$o")
done
g++ $san "${bench_objs[@]}" "${objs[@]}" $libs -o "$bdir/emu/bench_gpu"
echo "== bench_gpu (emulated device, tiny models)"
small="--ctx 40 --batch 3 --prefill-seqs 2 --prefill-len 24 --steps 2 --peak-tflops 1"
export ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=0
"$bdir/emu/bench_gpu" bench --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --vocab 1000 $small --deterministic || rc=1
"$bdir/emu/bench_gpu" synth "$bdir/emu/tiny.gguf" --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 || rc=1
"$bdir/emu/bench_gpu" bench --model "$bdir/emu/tiny.gguf" $small || rc=1
"$bdir/emu/bench_gpu" job --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --vocab 1000 --requests 12 \
  --prompt 40 --prefix 16 --gen 4 --max-batch 4 --step-tokens 64 --kv-gib 0.01 --cache-requests 4 || rc=1
"$bdir/emu/bench_gpu" job --layers 2 --embd 128 --ff 256 --heads 2 --kv-heads 1 --vocab 500 --requests 0 \
  --prompt 40 --kv-gib 0.01 --cache-requests 2 | grep -E "cache \(|cache warm" || rc=1
rm -f "$bdir/emu/tiny.gguf"

# kvbatch itself on the emulated device: CLI, runner, scheduler (greedy
# choices on the device, sampling, logprobs) and the persistent cache over
# be_cuda, with backend_select.c rebuilt with CUDA on. Cold, warm and warm
# with --cuda-graphs must write the same completions.
cmake -DSRC="$root" -DOUT="$bdir/emu/gen/kvb_build_info.h" -P "$root/cmake/build-info.cmake"
for c in "$root/src/app/backend_select.c" "$root/src/app/main.c"; do
  gcc -std=c11 -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter $flags -I"$bdir/emu/gen" \
    -DKVB_VERSION='"emu"' -DKVB_BUILD_OPTS='"emulated device"' -c "$c" -o "$bdir/emu/cli-$(basename "$c").o"
done
g++ $san "$bdir/emu/cli-main.c.o" "$bdir/emu/cli-backend_select.c.o" "${objs[@]}" $libs -o "$bdir/emu/kvbatch"
echo "== kvbatch run --device cuda (emulated device, tiny model)"
d=$bdir/emu/run
rm -rf "$d"; mkdir -p "$d"
"$bdir/emu/bench_gpu" synth "$d/m.gguf" --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --type q8_0 >/dev/null || rc=1
{
  for i in 1 2 3 4 5; do
    printf '{"custom_id":"g%d","prompt":"The municipal archive opens at nine and closes at five. Question %d:","max_tokens":6,"temperature":0}\n' "$i" "$i"
  done
  printf '{"custom_id":"s1","prompt":"The municipal archive opens at nine and closes at five. Sampled:","max_tokens":6,"temperature":0.8,"seed":3}\n'
  printf '{"custom_id":"l1","prompt":"The municipal archive opens at nine and closes at five. With logprobs:","max_tokens":4,"temperature":0,"logprobs":2}\n'
  # host-side choices on the device's logits: JSON mode and a logit bias (never greedy on the device)
  printf '{"custom_id":"j1","prompt":"The municipal archive opens at nine and closes at five. As JSON:","max_tokens":8,"temperature":0,"response_format":{"type":"json_object"}}\n'
  printf '{"custom_id":"b1","prompt":"The municipal archive opens at nine and closes at five. Question 1:","max_tokens":6,"temperature":0,"logit_bias":{"32":-100,"101":5}}\n'
  # prompt scores: every row of a prefill back from the device, kept with the blocks (warm: from the store)
  printf '{"custom_id":"e1","prompt":"The municipal archive opens at nine and closes at five. Scored:","max_tokens":0,"echo":true,"logprobs":2}\n'
  printf '{"custom_id":"p1","prompt":"The municipal archive opens at nine and closes at five. Question 2:","max_tokens":2,"temperature":0,"prompt_logprobs":1}\n'
} > "$d/job.jsonl"
texts() { grep -o '"custom_id":"[^"]*"\|"text":"\([^"\\]\|\\.\)*"' "$1" | paste - - | sort; }
for run in cold warm graphs; do
  extra=; [ $run = graphs ] && extra=--cuda-graphs
  "$bdir/emu/kvbatch" run -m "$d/m.gguf" -i "$d/job.jsonl" -o "$d/$run.jsonl" --metrics "$d/$run.db" --device cuda \
    --cache-dir "$d/pcache" --max-batch 3 --kv-mem 16M $extra 2> "$d/$run.err" || { cat "$d/$run.err"; rc=1; }
  grep -E "on cuda|ok|cache" "$d/$run.err" | tail -3
done
grep -E "cuda: " "$d/graphs.err"
grep -qE "cuda: [1-9][0-9]* steps ran from CUDA graphs" "$d/graphs.err" || { echo "the --cuda-graphs run ran no step from a graph"; rc=1; }
n_ok=$(grep -c '"status_code":200' "$d/cold.jsonl" || true)
[ "$n_ok" = 11 ] || { echo "kvbatch run on the emulated device: $n_ok of 11 requests ok"; rc=1; }
for run in cold warm; do
  grep '"custom_id":"e1"' "$d/$run.jsonl" | grep -q '"token_logprobs":\[null,-' || { echo "$run: no echoed prompt scores"; rc=1; }
  grep '"custom_id":"p1"' "$d/$run.jsonl" | grep -q '"prompt_logprobs":\[null,{' || { echo "$run: no prompt_logprobs"; rc=1; }
done
grep -q "from the cache" "$d/warm.err" || true
grep '"custom_id":"j1"' "$d/cold.jsonl" | grep -q '"text":"\(\\[nrt]\| \)*{' || { echo "JSON mode on the device: no object"; rc=1; }
grep -q '"logprobs":{' "$d/cold.jsonl" || grep -q '"top_logprobs"' "$d/cold.jsonl" || { echo "no logprobs in the output"; rc=1; }
if [ "$(texts "$d/cold.jsonl")" = "$(texts "$d/warm.jsonl")" ] && [ "$(texts "$d/cold.jsonl")" = "$(texts "$d/graphs.jsonl")" ]; then
  echo "cold, warm and warm with graphs: the same completions ($n_ok requests)"
else
  echo "completions differ between cold, warm and graphs runs"; rc=1
fi
# The quantized KV pools through the CLI, when it has --kv-type: every
# request answered, cold and warm (blocks from the store) the same.
if "$bdir/emu/kvbatch" run --help 2>&1 | grep -q -- "--kv-type"; then
  for kt in q8 q4; do
    for run in cold warm; do
      "$bdir/emu/kvbatch" run -m "$d/m.gguf" -i "$d/job.jsonl" -o "$d/$kt-$run.jsonl" --device cuda --kv-type $kt \
        --cache-dir "$d/pcache-$kt" --max-batch 3 --kv-mem 16M 2> "$d/$kt-$run.err" || { cat "$d/$kt-$run.err"; rc=1; }
    done
    n_ok=$(grep -c '"status_code":200' "$d/$kt-cold.jsonl" || true)
    if [ "$n_ok" = 11 ] && [ "$(texts "$d/$kt-cold.jsonl")" = "$(texts "$d/$kt-warm.jsonl")" ]; then
      echo "KV $kt: $n_ok of 11 requests ok, cold and warm the same completions"
    else
      echo "KV $kt: $n_ok of 11 requests ok, or cold and warm completions differ"; rc=1
    fi
  done
else
  echo "kvbatch has no --kv-type: quantized KV through the CLI not run"
fi
# EMU_BERT=1: BERT files end to end on the emulated device — embeddings, score
# and rerank lines against transformers (tests/pytest_embed_bert.py with
# --device cuda; ~45 minutes here, so not by default). 77: no torch,
# transformers or fetched vocabulary.
if [ "${EMU_BERT:-0}" = 1 ]; then
  echo "== pytest_embed_bert --device cuda (emulated device)"
  brc=0
  KVB_BIN="$bdir/emu/kvbatch" KVB_DEVICE=cuda python3 "$root/tests/pytest_embed_bert.py" > "$bdir/emu/bert.log" 2>&1 || brc=$?
  case $brc in
    0) tail -n 35 "$bdir/emu/bert.log" ;;
    77) echo "skipped: $(tail -n 1 "$bdir/emu/bert.log")" ;;
    *) tail -n 60 "$bdir/emu/bert.log"; rc=1 ;;
  esac
fi
exit $rc
