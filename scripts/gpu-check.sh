#!/usr/bin/env bash
# gpu-check.sh — the whole CUDA check of issue 5, in one go, on a GPU machine
# that has no network: builds kvbatch for sm_90 from this checkout, runs the
# GPU tests (every kernel against its C reference, for each KV type f16, q8
# and q4; the CUDA backend against the CPU backend and an f32 reference on
# synthetic models, and on SmolLM2 when models/ has it, with each KV type),
# a batch job with the persistent cache cold then warm on CUDA (and again
# with --kv-type q8 and q4 when kvbatch has that option), and the GPU
# benchmark (its attention timings per KV type). Everything it runs goes into DIR/log.txt,
# the results into DIR/figures.txt; a failing step is recorded and the next
# one still runs. Each step runs under `timeout`, and all of them together
# within GPU_CHECK_BUDGET seconds (default 460, i.e. under 8 minutes with
# the start-up): steps are cut down or skipped, saying so, when time runs
# short.
#
#   scripts/gpu-check.sh DIR
#   scripts/gpu-check.sh --fetch-deps [FOLDER]
#       on a machine with apt and network: downloads the Debian packages
#       kvbatch links (lmdb, zstd, sqlite3, jsmn, xxhash; headers and
#       libraries) into FOLDER (default .gpu-deps, added to .git/info/exclude)
#       for a GPU machine that lacks them: carry that folder with the run, and
#       gpu-check.sh unpacks it into /tmp/kvb-deps when the system has none.
#       It also writes FOLDER/smollm2-8l.gguf, SmolLM2's first 8 layers
#       (scripts/gguf-truncate.py, ~47 MiB: the whole file is over the
#       upload limit), which the real-model comparison then uses.
#
# Environment: GPU_CHECK_BUDGET (seconds), BUILD_DIR (default build-gpu),
# KVB_MODEL (a GGUF for the real-model comparison; default
# models/SmolLM2-135M-Instruct.Q4_1.gguf when present, else
# .gpu-deps/smollm2-8l.gguf).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

deps_pkgs="liblmdb-dev liblmdb0 libzstd-dev libzstd1 libsqlite3-dev libsqlite3-0 libjsmn-dev libxxhash-dev libxxhash0"
if [ "${1:-}" = "--fetch-deps" ]; then
  folder=${2:-$root/.gpu-deps}
  mkdir -p "$folder"
  (cd "$folder" && apt-get download $deps_pkgs) || exit 1
  full=$root/models/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f "$full" ] || "$root/scripts/fetch-model.sh" || exit 1
  python3 "$root/scripts/gguf-truncate.py" "$full" "$folder/smollm2-8l.gguf" 8 || exit 1
  if [ "$folder" = "$root/.gpu-deps" ] && ! grep -qx '/.gpu-deps/' "$root/.git/info/exclude" 2>/dev/null; then
    echo '/.gpu-deps/' >> "$root/.git/info/exclude"
  fi
  du -sh "$folder"
  total=$(( $(du -sb "$folder" | cut -f1) + $(git -C "$root" ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) ))
  echo "carried with the tracked tree: $(( total >> 20 )) MiB of the 64 MiB a device call may take"
  echo "carry '.gpu-deps' with the run that calls scripts/gpu-check.sh"
  exit 0
fi
[ $# -ge 1 ] || { sed -n '2,/^set -uo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 2; }

out=$(mkdir -p "$1" && cd "$1" && pwd)
log=$out/log.txt
fig=$out/figures.txt
: > "$log"
: > "$fig"
build=${BUILD_DIR:-$root/build-gpu}
export root out build
start=$(date +%s)
deadline=$(( start + ${GPU_CHECK_BUDGET:-460} ))
failed=0

note() { echo "$*" | tee -a "$log" >> "$fig"; }
left() { echo $(( deadline - $(date +%s) )); }
# step NAME MAX_SECONDS CMD...: runs CMD under timeout (at most MAX_SECONDS
# and what is left of the budget), output into the log, status into both.
step() {
  local name=$1 max=$2
  shift 2
  local t
  t=$(left)
  [ "$t" -gt "$max" ] && t=$max
  if [ "$t" -lt 15 ]; then
    note "== $name: SKIPPED (time budget spent)"
    failed=1
    return 1
  fi
  echo "== $name (limit ${t}s, started $(date -u +%T))" >> "$log"
  local s rc
  s=$(date +%s)
  # through bash, so that CMD may be one of the exported functions below
  timeout --kill-after=10 "$t" bash -c '"$@"' step "$@" >> "$log" 2>&1
  rc=$?
  [ $rc -eq 124 ] && echo "   (timed out after ${t}s)" >> "$log"
  note "== $name: $([ $rc -eq 0 ] && echo ok || echo "FAILED rc=$rc") in $(( $(date +%s) - s ))s"
  [ $rc -eq 0 ] || failed=1
  return $rc
}

# ---- environment ---------------------------------------------------------------
{
  echo "== gpu-check $(date -u +%FT%TZ) in $root, commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
  git -C "$root" status --short 2>/dev/null | head -40
  nvidia-smi 2>&1 | tee "$out/nvidia-smi.txt"
  nvcc --version 2>&1 | tail -2
  cmake --version 2>&1 | head -1
  cc --version 2>&1 | head -1
  echo "cpus: $(nproc)"; free -g; df -h "$out" "$root"
} >> "$log" 2>&1
note "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi failed')"

# Libraries kvbatch links: from the system, else from a carried .gpu-deps.
have_deps=1
for h in lmdb.h zstd.h sqlite3.h jsmn.h xxhash.h; do [ -e "/usr/include/$h" ] || have_deps=0; done
if [ $have_deps = 0 ]; then
  if compgen -G "$root/.gpu-deps/*.deb" > /dev/null; then
    mkdir -p /tmp/kvb-deps
    for f in "$root"/.gpu-deps/*.deb; do dpkg-deb -x "$f" /tmp/kvb-deps; done
    export CMAKE_PREFIX_PATH=/tmp/kvb-deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
    export LD_LIBRARY_PATH=/tmp/kvb-deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LIBRARY_PATH=/tmp/kvb-deps/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
    note "deps: unpacked $(ls "$root"/.gpu-deps/*.deb | wc -l) carried packages into /tmp/kvb-deps"
  else
    note "deps: some of lmdb, zstd, sqlite3, jsmn, xxhash missing and no .gpu-deps carried (scripts/gpu-check.sh --fetch-deps)"
  fi
fi

# The real model: the full SmolLM2 when models/ has it, else the truncated
# copy --fetch-deps carried.
if [ -z "${KVB_MODEL:-}" ] && [ ! -f "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" ] &&
   [ -f "$root/.gpu-deps/smollm2-8l.gguf" ]; then
  export KVB_MODEL=$root/.gpu-deps/smollm2-8l.gguf
  note "real model: SmolLM2's first 8 layers (carried in .gpu-deps)"
fi

# ---- build -----------------------------------------------------------------------
build_it() {
  # (the tests read the model from the CMake cache, hence KVB_MODEL here)
  cmake -S "$root" -B "$build" -DKVBATCH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
    ${KVB_MODEL:+-DKVB_MODEL="$KVB_MODEL"} &&
    cmake --build "$build" -j"$(nproc)"
}
export -f build_it
if ! step "build (sm_90, Release)" 240 build_it; then
  note "build failed: nothing else can run; see log.txt"
  exit 1
fi

# ---- GPU tests -------------------------------------------------------------------
model=${KVB_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$model" ] || note "real model: $model not present (the synthetic models still run)"
# -V: the per-kernel errors and the CPU/CUDA comparison figures go to the log.
step "ctest -L gpu (kernels vs C reference; CUDA vs CPU backend)" 120 \
  ctest --test-dir "$build" -L gpu --output-on-failure -V
kpat='^[0-9]+: (embed|rmsnorm|rope|swiglu|residual add|bias add|f32->bf16|kv store|attention|gemm|argmax)(->bf16)? '
note "kernel checks: $(grep -cE "$kpat.*ok" "$log") ok, $(grep -cE "$kpat.*FAIL" "$log") failed"
grep -E "$kpat.*FAIL" "$log" | sed 's/^[0-9]*: //' >> "$fig"
for kt in f16 q8 q4; do
  # kv store and the attention kernels name the type they ran on (f16's
  # attention lines do not: they count as f16)
  if [ $kt = f16 ]; then kt_pat='(kv store f16 |attention( tc)?(->bf16)? heads=)'; else kt_pat="(kv store $kt |attention( tc)?(->bf16)? $kt )"; fi
  note "kernel checks, KV $kt: $(grep -cE "^[0-9]+: $kt_pat.* ok" "$log") ok, $(grep -cE "^[0-9]+: $kt_pat.*FAIL" "$log") failed"
done
grep -E "^[0-9]+: [^ ]+ +KV (q8|q4): " "$log" | sed 's/^[0-9]*: //' >> "$fig"
grep -E "^[0-9]+: (llama|qwen|smollm)[^ ]* +(both steps|vs the f32|greedy|deterministic|scheduler)" "$log" | sed 's/^[0-9]*: //' >> "$fig"
grep -E "^[0-9]+: (device 0|real model)" "$log" | sed 's/^[0-9]*: //' | sort -u >> "$fig"
grep -qE "tests? (passed|failed)" "$log" && grep -E "tests passed|tests failed|Skipped|\*\*\*Failed" "$log" | tail -4 >> "$fig"

# ---- a batch job with the persistent cache, cold then warm, on CUDA ----------------
job_check() {
  local d=$out/job bin=$build/kvbatch
  rm -rf "$d"; mkdir -p "$d"
  # SmolLM2-shaped synthetic (byte-level vocabulary: a character is a token).
  "$build/bench_gpu" synth "$d/m.gguf" --layers 30 --embd 576 --ff 1536 --heads 9 --kv-heads 3 --type q8_0 || return 1
  local prefix="You are a careful assistant for the municipal archive. Every answer cites the register, the shelf and the year, and says plainly when the record is incomplete or was damaged in the flood of 1911; never guess a date. The archive opens at nine and closes at five, except on public holidays."
  for i in $(seq 1 256); do
    printf '{"custom_id":"q%d","prompt":"%s Question %d: which shelf holds register %d?","max_tokens":32,"temperature":0}\n' \
      "$i" "$prefix" "$i" "$((i * 37 % 1000))"
  done > "$d/job.jsonl"
  local run_opts=(-m "$d/m.gguf" -i "$d/job.jsonl" --device cuda --deterministic --cache-dir "$d/pcache" --max-batch 64)
  local s
  s=$(date +%s.%N)
  "$bin" run "${run_opts[@]}" -o "$d/cold.jsonl" --metrics "$d/cold.db" 2> "$d/cold.err" || { cat "$d/cold.err"; return 1; }
  echo "cold: $(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $s}") s wall"; cat "$d/cold.err"
  s=$(date +%s.%N)
  "$bin" run "${run_opts[@]}" -o "$d/warm.jsonl" --metrics "$d/warm.db" 2> "$d/warm.err" || { cat "$d/warm.err"; return 1; }
  echo "warm: $(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $s}") s wall"; cat "$d/warm.err"
  # --deterministic: the warm run (prefixes restored, other chunking) must
  # write the same completions as the cold one.
  local a b
  a=$(grep -o '"custom_id":"[^"]*"\|"text":"\([^"\\]\|\\.\)*"' "$d/cold.jsonl" | paste - - | sort | md5sum)
  b=$(grep -o '"custom_id":"[^"]*"\|"text":"\([^"\\]\|\\.\)*"' "$d/warm.jsonl" | paste - - | sort | md5sum)
  echo "completions cold $a, warm $b"
  [ "$a" = "$b" ] || { echo "cold and warm completions differ under --deterministic"; return 1; }
  echo "cold and warm completions identical"
  # Warm again with CUDA graphs: the same completions, bit for bit.
  s=$(date +%s.%N)
  "$bin" run "${run_opts[@]}" --cuda-graphs -o "$d/graphs.jsonl" 2> "$d/graphs.err" || { cat "$d/graphs.err"; return 1; }
  echo "warm, graphs: $(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $s}") s wall"; cat "$d/graphs.err"
  b=$(grep -o '"custom_id":"[^"]*"\|"text":"\([^"\\]\|\\.\)*"' "$d/graphs.jsonl" | paste - - | sort | md5sum)
  [ "$a" = "$b" ] || { echo "completions with --cuda-graphs differ"; return 1; }
  echo "completions with --cuda-graphs identical"
}
export -f job_check
# The first 64 requests of job_check's job on a q8 and a q4 pool: cold and
# warm must agree bit for bit (--deterministic), and the completions are
# compared with f16's (quantized K/V may change a greedy choice at a
# near-tie: counted, not failed).
kv_job_check() {
  local d=$out/job bin=$build/kvbatch kt rc=0
  head -64 "$d/job.jsonl" > "$d/job64.jsonl"
  pairs() { grep -o '"custom_id":"[^"]*"\|"text":"\([^"\\]\|\\.\)*"' "$1" | paste - - | LC_ALL=C sort; }
  pairs "$d/cold.jsonl" > "$d/f16.pairs"
  for kt in q8 q4; do
    local opts=(-m "$d/m.gguf" -i "$d/job64.jsonl" --device cuda --deterministic --cache-dir "$d/pcache-$kt"
                --max-batch 64 --kv-type "$kt")
    local s
    s=$(date +%s.%N)
    "$bin" run "${opts[@]}" -o "$d/$kt-cold.jsonl" 2> "$d/$kt-cold.err" || { cat "$d/$kt-cold.err"; rc=1; continue; }
    local t_cold
    t_cold=$(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $s}")
    "$bin" run "${opts[@]}" -o "$d/$kt-warm.jsonl" 2> "$d/$kt-warm.err" || { cat "$d/$kt-warm.err"; rc=1; continue; }
    cat "$d/$kt-cold.err" "$d/$kt-warm.err"
    pairs "$d/$kt-cold.jsonl" > "$d/$kt.pairs"
    local ok same_warm=identical same_f16
    ok=$(grep -c '"status_code":200' "$d/$kt-cold.jsonl")
    [ "$(pairs "$d/$kt-warm.jsonl")" = "$(cat "$d/$kt.pairs")" ] || { same_warm=DIFFER; rc=1; }
    same_f16=$(LC_ALL=C join -t "$(printf '\t')" "$d/f16.pairs" "$d/$kt.pairs" | awk -F '\t' '$2 == $3' | wc -l)
    echo "kv $kt: $ok of 64 requests ok, cold ${t_cold}s; cold and warm completions $same_warm; $same_f16 of 64 completions the same as with f16 KV"
    [ "$ok" = 64 ] || rc=1
  done
  return $rc
}
export -f kv_job_check
if "$build/kvbatch" run --help 2>&1 | grep -q -- "--device"; then
  step "batch job on CUDA: 256 requests sharing a 290-token prefix, cache cold then warm (--deterministic)" 90 job_check
  grep -E "^(cold|warm)(, graphs)?:|kvbatch run: (ok|cache|cuda|.* on cuda)|completions .*(identical|differ)" "$log" | tail -16 >> "$fig"
  if "$build/kvbatch" run --help 2>&1 | grep -q -- "--kv-type" && [ -f "$out/job/cold.jsonl" ]; then
    step "batch job on CUDA, --kv-type q8 and q4: 64 of those requests, cold then warm (--deterministic)" 90 kv_job_check
    grep -E "^kv (q8|q4):" "$log" >> "$fig"
  else
    note "== batch job with quantized KV: SKIPPED (this kvbatch has no --kv-type, or the f16 job failed)"
  fi
  rm -rf "$out/job/m.gguf" "$out/job/pcache"*
else
  note "== batch job: SKIPPED (this kvbatch has no --device)"
fi

# ---- GPU benchmark --------------------------------------------------------------------
# Llama-3-8B shape built in memory: the step timings in both modes (upload
# of 16 GB twice, then a few seconds of steps), then the 1,000-request job
# through the scheduler (a third upload; estimated 20-60 s of work) and the
# cache pair. Fewer layers and requests when time is short.
t=$(left)
layers=32 requests=1000
if [ "$t" -lt 70 ]; then layers=8 requests=100; elif [ "$t" -lt 120 ]; then layers=16 requests=250;
elif [ "$t" -lt 180 ]; then requests=500; fi
[ "$layers" -lt 32 ] || [ "$requests" -lt 1000 ] && note "bench: $t s left in the budget: $layers layers, $requests requests"
BENCH_LAYERS=$layers BENCH_REQUESTS=$requests step "GPU benchmark (scripts/bench-gpu.sh)" 300 \
  "$root/scripts/bench-gpu.sh" "$out/bench" "$build"
grep -E "^figure:|^device 0|^model |upload" "$log" | sed 's/^figure: //' >> "$fig"

note "== gpu-check: $([ $failed -eq 0 ] && echo 'all steps ok' || echo 'some steps FAILED') in $(( $(date +%s) - start ))s"
exit $failed
