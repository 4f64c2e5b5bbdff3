#!/usr/bin/env bash
# scripts/perplexity.sh FILE [CTX] [--method harness|llama] [--cache-dir D | --no-cache] [--kv-type T] [--json] ...
# Prints the perplexity of a text file through kvbatch (per token, natural log):
# by default as lm-evaluation-harness's loglikelihood_rolling computes it (every
# token scored once, rolling windows of CTX tokens, default min(2048, the model's
# context - 2)); --method llama computes what llama.cpp's llama-perplexity prints
# (only the second half of each CTX-token chunk scored). python/kvbatch_ppl.py
# says exactly how each is defined. Needs the kvbatch venv ($KVBATCH_VENV, default
# ~/.cache/kvbatch-venv) and a built kvbatch (build/kvbatch, or $KVBATCH_BIN).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${KVBATCH_VENV:-$HOME/.cache/kvbatch-venv}"
[ $# -ge 1 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
FILE="$1"; shift
ARGS=()
if [ $# -ge 1 ] && [[ "$1" =~ ^[0-9]+$ ]]; then ARGS+=(--ctx "$1"); shift; fi
[ -x "$VENV/bin/python" ] || { echo "perplexity.sh: no venv python at $VENV (scripts/setup.sh --test makes it)" >&2; exit 1; }
PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" exec "$VENV/bin/python" "$ROOT/python/kvbatch_ppl.py" "$FILE" "${ARGS[@]}" "$@"
