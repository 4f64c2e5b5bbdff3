#!/bin/sh
# request-space.sh [N_SEEDS] [LINES] [FIRST_SEED] — the request-space test
# (tests/pytest_request_space.py) over many more seeds than CI runs, for
# before a release: N_SEEDS runs (default 200) of LINES random request lines
# (default 150) through `kvbatch run` on the default model, each killed once
# at random and resumed, every output line checked against the openai types.
# Needs a build (build/kvbatch), the model and the venv with the openai
# package (scripts/setup.sh --test). Exit 0 when every check passed.
# KVB_REQSPACE_EDGE=P makes a share P of the lines (default 0.03) carry a
# constraint sized at, just under or past one of the engine's limits
# (tests/reqspace.py, constraint_edge).
set -eu
cd "$(dirname "$0")/.."
n=${1:-200}
lines=${2:-150}
first=${3:-1000}
seeds=$(seq -s, "$first" $((first + n - 1)))
KVB_BIN=${KVB_BIN:-$PWD/build/kvbatch} \
KVB_MODEL=${KVB_MODEL:-${KVBATCH_MODEL:-$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf}} \
KVB_REQSPACE_SEEDS=$seeds KVB_REQSPACE_LINES=$lines \
  exec python3 tests/pytest_request_space.py
