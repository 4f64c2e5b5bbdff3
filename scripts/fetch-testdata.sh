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
#
# All of it comes from one pinned source distribution on PyPI, checked by
# sha256. A download that fails or does not match is an error (exit 1) naming
# what to do: the tests that need the data fail, never skip, without it.
# Safe to re-run: nothing is fetched when the stamp of this version is there.
set -euo pipefail

VERSION="0.3.36"
SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST="llama_cpp_python-$VERSION.tar.gz"
# Vocabularies whose tokenizer kvbatch implements (model and pre-tokenizer);
# test_tokenizer checks every one of them against its vectors.
VOCABS="gpt-2 starcoder llama-spm phi-3 llama-bpe qwen2 bert-bge"

DEST="${KVBATCH_TESTDATA:-$HOME/.cache/kvbatch/testdata}"
STAMP="$DEST/.llama-cpp-python-$VERSION"
have_vocabs() { # every vocabulary of VOCABS extracted (the list grows: a stamp alone does not say)
  for v in $VOCABS; do [ -f "$DEST/tokenizer/ggml-vocab-$v.gguf.out" ] || return 1; done
}
if [ -f "$STAMP" ] && have_vocabs; then
  echo "fetch-testdata: $DEST is present (llama-cpp-python $VERSION)"
  exit 0
fi
mkdir -p "$DEST"

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
