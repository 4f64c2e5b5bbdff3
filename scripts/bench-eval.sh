#!/usr/bin/env bash
# scripts/bench-eval.sh [--items N] [--limit N] [--hf-limit N] [--no-hf] [--no-batch1] [--extra-args A] [--keep DIR]
# An lm-evaluation-harness 5-shot multiple-choice task (500 synthetic items x 4
# choices by default, written into a temp folder) through kvbatch cold (empty
# cache), warm (the same cache: a second night) and --max-batch 1 (first --limit
# items), then through lm_eval's own hf model on the dequantized weights, side by
# side: wall time, prompt tokens submitted vs computed, accuracy, and whether the
# kvbatch runs chose alike (python/bench_eval.py). Benchmark, not a test.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${KVBATCH_VENV:-$HOME/.cache/kvbatch-venv}"
[ -x "$VENV/bin/python" ] || { echo "bench-eval.sh: no venv python at $VENV (scripts/setup.sh --test makes it)" >&2; exit 1; }
[ -x "${KVBATCH_BIN:-$ROOT/build/kvbatch}" ] || { echo "bench-eval.sh: build kvbatch first (cmake --build build)" >&2; exit 1; }
PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" exec "$VENV/bin/python" "$ROOT/python/bench_eval.py" "$@"
