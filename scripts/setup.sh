#!/usr/bin/env bash
# Installs what kvbatch needs on a fresh Debian machine of this kind: the C
# libraries it links (Debian packages) and the default model. With --test
# (scripts/test.sh passes it) also what the test suite uses: clang for the
# fuzz build, the Python packages of the reference tests and their venv
# (torch, transformers: several GB, downloaded once), chromium and man.
# Safe to re-run: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
TEST=0
[ "${1:-}" = "--test" ] && TEST=1

APT_PKGS="build-essential cmake pkg-config liblmdb-dev libzstd-dev libsqlite3-dev libjsmn-dev libxxhash-dev python3-pip"
[ $TEST = 1 ] && APT_PKGS="$APT_PKGS clang clang-format libclang-rt-14-dev python3-venv man-db"
missing=""
for p in $APT_PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

if [ $TEST = 1 ] && ! python3 -c 'import numpy, gguf' 2>/dev/null; then
  echo "setup: installing Python packages numpy and gguf (reference tests)"
  python3 -m pip install --quiet numpy gguf 2>&1 | grep -v "Running pip as the 'root' user" || true
fi

# The Hugging Face reference test (tests/pytest_hf_ref.py) runs under its own
# venv: torch (from PyPI; the test runs it on the CPU) and transformers, beside
# numpy, gguf, openai and jsonschema, and lm-evaluation-harness with its hf
# extra (accelerate, peft) for the eval adapter (python/kvbatch_lm_eval.py,
# tests/pytest_lm_eval.py). $KVBATCH_VENV moves it (default
# ~/.cache/kvbatch-venv); skipped when everything in it imports, and an older
# venv only gets what it lacks.
KVB_VENV="${KVBATCH_VENV:-$HOME/.cache/kvbatch-venv}"
if [ $TEST = 1 ] && ! "$KVB_VENV/bin/python" -c 'import torch, transformers, numpy, gguf, openai, jsonschema, pydantic, lm_eval, accelerate' 2>/dev/null; then
  echo "setup: making the Python venv $KVB_VENV (torch, transformers, lm_eval: the Hugging Face reference and eval tests)"
  python3 -m venv "$KVB_VENV"
  "$KVB_VENV/bin/python" -m pip install --quiet torch transformers numpy gguf openai jsonschema pydantic "lm_eval[hf]"
fi

# Headless Chromium, for the browser test of `kvbatch report --html`
# (tests/pytest_report_html.py, which skips without it) and for
# scripts/report-demo.sh's screenshots. Skipped when a chromium is there.
if [ $TEST = 1 ] && ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  echo "setup: installing chromium (the HTML report's browser test)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
fi

scripts/fetch-model.sh
# Test data the repository does not carry (tokenizer vectors, chat templates):
# fetched once into $KVBATCH_TESTDATA or ~/.cache/kvbatch/testdata.
[ $TEST = 1 ] && scripts/fetch-testdata.sh
exit 0
