#!/usr/bin/env bash
# Formats the C and CUDA sources with .clang-format (clang-format 14, as
# Debian ships it), or with --check says which files are not formatted and
# exits 1. Generated tables (src/base/unicode_tables.c) are left as written.
#   scripts/format.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
CF=${CLANG_FORMAT:-clang-format}
command -v "$CF" >/dev/null || { echo "format: $CF not found (apt-get install clang-format)" >&2; exit 77; }
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' | grep -v '^src/base/unicode_tables\.c$')
if [ "${1:-}" = "--check" ]; then
  bad=0
  for f in "${files[@]}"; do
    if ! "$CF" --dry-run -Werror "$f" >/dev/null 2>&1; then echo "format: $f is not formatted"; bad=1; fi
  done
  [ $bad = 0 ] && echo "format: ${#files[@]} files formatted"
  exit $bad
fi
"$CF" -i "${files[@]}"
