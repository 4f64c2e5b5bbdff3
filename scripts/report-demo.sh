#!/usr/bin/env bash
# A night's job in small: N short requests (default 1,000; 8 output tokens
# each, four shared system prompts, a few bad lines) on the default model,
# run twice — cold, then with the persistent prefix cache warm — and drawn
# with `kvbatch report --html`: one page for the first run, one comparing
# the two, and a screenshot of each when Debian's chromium is installed.
#
#   scripts/report-demo.sh [N] [OUTDIR]      (default 1000, /tmp/kvbatch-report-demo)
#
# Takes a minute or two on two cores. Not a test: CI runs
# tests/pytest_report_html.py, which is the same on a few dozen requests.
# KVB_BIN (default build/kvbatch) and KVBATCH_MODEL pick the binary and model;
# DEMO_RUN_ARGS adds options to both runs (e.g. "--kv-mem 16M" to see
# preemptions).
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-1000}"
OUT="${2:-/tmp/kvbatch-report-demo}"
BIN="${KVB_BIN:-build/kvbatch}"
[ -x "$BIN" ] || { echo "report-demo: $BIN not built (cmake --build build)" >&2; exit 1; }
rm -rf "$OUT"
mkdir -p "$OUT/cache"

python3 - "$N" "$OUT/job.jsonl" <<'EOF'
import json, random, sys
n, path = int(sys.argv[1]), sys.argv[2]
rng = random.Random(17)
systems = [
    "You are a terse assistant for a bicycle shop. Answer in one sentence.",
    "You translate short English phrases into French. Reply with the translation only.",
    "You are a helpful librarian. Suggest one book title and nothing else.",
    "You answer arithmetic questions with the number only.",
]
topics = ["brakes", "tyres", "chains", "saddles", "lights", "gears", "locks", "pumps", "helmets", "bells"]
words = ["good morning", "the red door", "a cold winter", "my old friend", "the last train", "green tea"]
with open(path, "w") as f:
    for i in range(n):
        if i % 97 == 13:  # a bad line now and then: it shows up under errors
            f.write('{"custom_id": "bad-%d", "body": {"messages": [}\n' % i)
            continue
        s = rng.randrange(len(systems))
        if s == 0: q = f"Do you sell {rng.choice(topics)} for a {rng.randint(2, 30)}-year-old bike?"
        elif s == 1: q = f"{rng.choice(words)} number {i}"
        elif s == 2: q = f"Something about {rng.choice(topics)}, request {i}?"
        else: q = f"What is {rng.randint(2, 99)} plus {rng.randint(2, 99)}?"
        body = {"messages": [{"role": "system", "content": systems[s]}, {"role": "user", "content": q}],
                "max_tokens": 8, "temperature": 0}
        f.write(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                            "body": body}) + "\n")
EOF

for night in cold warm; do
  echo "report-demo: run $night ($N requests)"
  # shellcheck disable=SC2086
  "$BIN" run -i "$OUT/job.jsonl" -o "$OUT/$night.jsonl" --metrics "$OUT/$night.db" \
    --cache-dir "$OUT/cache" ${DEMO_RUN_ARGS:-}
done
"$BIN" report "$OUT/cold.db"
"$BIN" report "$OUT/cold.db" --html "$OUT/report.html"
"$BIN" report "$OUT/cold.db" "$OUT/warm.db" --html "$OUT/compare.html"

CHROME="$(command -v chromium || command -v chromium-browser || true)"
if [ -z "$CHROME" ]; then
  echo "report-demo: no chromium (apt-get install chromium): pages in $OUT, no screenshots"
  exit 0
fi
# name resolution mapped to nothing and background services off: the
# browser reaches no network (the pages need none)
for page in report compare; do
  "$CHROME" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1100,3000 \
    --host-resolver-rules="MAP * ~NOTFOUND" --disable-background-networking --disable-component-update \
    --disable-sync --no-first-run --user-data-dir="$OUT/chromium-profile" \
    --screenshot="$OUT/$page.png" "file://$(realpath "$OUT/$page.html")" >/dev/null 2>&1
  echo "report-demo: $OUT/$page.html, screenshot $OUT/$page.png"
done
