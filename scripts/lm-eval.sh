#!/usr/bin/env bash
# lm-evaluation-harness's command line with kvbatch's model registered: lm_eval
# 0.4.x finds models only in its registry (no plugin entry points), so the
# adapter (python/kvbatch_lm_eval.py) is imported first, then lm_eval's own
# cli_evaluate runs with the arguments as given. Runs under the kvbatch venv
# ($KVBATCH_VENV, default ~/.cache/kvbatch-venv; scripts/setup.sh --test makes it).
#   scripts/lm-eval.sh --model kvbatch --model_args model=M.gguf,cache_dir=D \
#       --tasks NAME --include_path DIR [--num_fewshot 5] [--limit N] ...
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${KVBATCH_VENV:-$HOME/.cache/kvbatch-venv}"
[ -x "$VENV/bin/python" ] || { echo "lm-eval.sh: no venv python at $VENV (scripts/setup.sh --test makes it)" >&2; exit 1; }
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$VENV/bin/python" -c '
import sys
import kvbatch_lm_eval  # registers "kvbatch"
from lm_eval.__main__ import cli_evaluate
sys.argv[0] = "lm-eval"
cli_evaluate()
' "$@"
