#!/usr/bin/env bash
# Builds the libFuzzer targets (build-fuzz/, clang, library and harness
# instrumented, ASan + UBSan) and runs each tests/fuzz/fuzz_*.c for a bounded
# time, one after the other, printing what it reached. Every file matching
# the glob is a target, so one added there is fuzzed with no change here.
#   scripts/fuzz.sh [SECONDS] [NAME...]   seconds per target (default 60); the
#                                          targets named (grammar, regex, ...), else all
# The release check (.ci/run --release) runs all of them.
#
# Each target starts from its saved corpus (tests/fuzz/corpus/NAME, read
# only) plus a working corpus of its own in build-fuzz/fuzz-corpus/NAME that
# is kept between runs, so repeated runs go further. A crash, leak, timeout
# or sanitizer report leaves its input in build-fuzz/fuzz-artifacts/NAME/ and
# makes the script exit 1 (after the other targets have run). The timeout per
# input is 60 s: instrumented (ASan, UBSan, coverage) a unit runs 20-40 times
# slower than in a release build, where the slowest constraints the compilers
# accept take about a second (scripts/bench-structured.sh). New inputs
# worth keeping can be folded into the saved corpus with
#   build-fuzz/fuzz_NAME -merge=1 tests/fuzz/corpus/NAME build-fuzz/fuzz-corpus/NAME
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
if ! [[ "$secs" =~ ^[0-9]+$ ]] || [ "$secs" -lt 1 ]; then
  echo "usage: scripts/fuzz.sh [SECONDS] [NAME...]   (a whole number of seconds per target, default 60)" >&2
  exit 2
fi
shift || true
only=("$@")
command -v clang >/dev/null || { echo "scripts/fuzz.sh: clang not found (scripts/setup.sh --test installs it)" >&2; exit 1; }

targets=()
for src in tests/fuzz/fuzz_*.c; do
  [ -e "$src" ] || continue
  t=$(basename "$src" .c)
  if [ ${#only[@]} -gt 0 ]; then
    keep=0
    for o in "${only[@]}"; do [ "fuzz_${o#fuzz_}" = "$t" ] && keep=1; done
    [ $keep = 1 ] || continue
  fi
  targets+=("$t")
done
[ ${#targets[@]} -gt 0 ] || { echo "scripts/fuzz.sh: no tests/fuzz/fuzz_*.c${only[*]:+ named ${only[*]}}" >&2; exit 1; }

CC=clang cmake -S . -B build-fuzz -DKVBATCH_FUZZ=ON -DKVBATCH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]}"

# The code under test is the library: without coverage instrumentation there
# libFuzzer sees only the harness's branches and mutates blind. Check that
# (nearly) every object of the layers' libraries (libkvb_*.a) carries
# coverage and ASan hooks.
n_obj=0
n_cov=0
for lib in build-fuzz/libkvb_*.a; do
  n_obj=$((n_obj + $(ar t "$lib" | wc -l)))
  n_cov=$((n_cov + $(nm -A "$lib" 2>/dev/null | grep -E ' U (__sanitizer_cov_|__asan_report)' | cut -d: -f2 | sort -u | wc -l || true)))
done
echo "library objects instrumented: $n_cov of $n_obj"
if [ "$n_obj" -eq 0 ] || [ "$n_cov" -lt $((n_obj - 3)) ]; then
  echo "scripts/fuzz.sh: the libraries are not instrumented for fuzzing (see the fuzz section of CMakeLists.txt)" >&2
  exit 1
fi

status=0
summary=()
for t in "${targets[@]}"; do
  name=${t#fuzz_}
  work=build-fuzz/fuzz-corpus/$name
  arts=build-fuzz/fuzz-artifacts/$name
  log=build-fuzz/fuzz-$name.log
  mkdir -p "$work" "$arts"
  seeds=()
  [ -d "tests/fuzz/corpus/$name" ] && seeds+=("tests/fuzz/corpus/$name")
  echo "== $t: $secs s (log: $log)"
  set +e
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    "build-fuzz/$t" -max_total_time="$secs" -timeout=60 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$arts/" "$work" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  set -e
  # libFuzzer's status lines: "#RUNS <event> cov: N ft: N corp: N/SIZE ..."
  last=$(grep -E '^#[0-9]+' "$log" | grep 'cov:' | tail -n 1 || true)
  runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -n 1)
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
  corp=$(sed -nE 's/.* corp: ([0-9]+)\/.*/\1/p' <<<"$last")
  line="$t: $secs s, ${runs:-?} runs, coverage ${cov:-?} edges, ${ft:-?} features, corpus ${corp:-?} inputs"
  if [ $rc -ne 0 ]; then
    status=1
    line="$line; FAILED (exit $rc): $(ls "$arts" | head -n 3 | tr '\n' ' ')see $log"
    grep -E 'ERROR: |runtime error|SUMMARY' "$log" | head -n 5 || true
  else
    line="$line; nothing found"
  fi
  echo "$line"
  summary+=("$line")
done
echo
echo "== summary ($secs s per target)"
printf '%s\n' "${summary[@]}"
exit $status
