#!/usr/bin/env bash
# Structured outputs on a batch extraction job: N requests (default 256),
# each a short generated passage about people and companies to extract into
# a Pydantic-style nested schema ($defs/$ref, Optional fields, an enum, an
# email format, bounded integers, lists with maxItems). The same job runs
# twice, with response_format json_schema and without it (same prompts,
# seeds, max_tokens), alternating REPS times and keeping each side's best;
# then, when LLAMA_SERVER names a llama-server binary (llama.cpp, CPU build),
# the constrained job through its json_schema field for comparison.
#   [KVBATCH_BIN=build/kvbatch] [LLAMA_SERVER=/path/llama-server] [LLAMA_N=64]
#   scripts/bench-structured.sh [N_REQUESTS] [MAX_TOKENS] [THREADS] [REPS]
# Prints output tok/s constrained and not (target: constrained >= 85% of
# unconstrained), the share of constrained outputs that end valid within
# max_tokens (checked with jsonschema when the Python in PATH or the test
# venv has it, else as JSON with the required keys), and llama-server's
# figures on the first LLAMA_N requests (default 64) with as many slots as
# threads. Then the largest accepted constraint of each kind (bench_constraint_limits):
# compile time, peak memory and token masks, and the refusal of one size more.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-256}
MAXTOK=${2:-192}
THREADS=${3:-$(nproc)}
REPS=${4:-1}
BIN=${KVBATCH_BIN:-build/kvbatch}
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
LN=${LLAMA_N:-64}
[ -x "$BIN" ] || { cmake -S . -B build >/dev/null && cmake --build build -j"$(nproc)" >/dev/null; }
[ -f "$MODEL" ] || scripts/fetch-model.sh
PY=python3
VENV_PY="${KVBATCH_VENV:-$HOME/.cache/kvbatch-venv}/bin/python"
if ! $PY -c 'import jsonschema' 2>/dev/null && [ -x "$VENV_PY" ]; then PY=$VENV_PY; fi
tmp=$(mktemp -d)
server_pid=""
trap '[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; [ -n "${KEEP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"' EXIT

$PY - "$tmp" "$N" "$MAXTOK" <<'PY'
import json, random, sys
tmp, n, maxtok = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# The schema as Pydantic writes it for:
#   class Person(BaseModel): name: str; age: Optional[conint(ge=0, le=120)] = None
#       role: Optional[str] = None; email: Optional[EmailStr] = None
#   class Company(BaseModel): name: str; industry: Industry; founded: Optional[conint(ge=1800, le=2030)] = None
#       city: Optional[str] = None
#   class Extraction(BaseModel): people: List[Person] = Field(max_length=6)
#       companies: List[Company] = Field(max_length=4)
schema = {
    "$defs": {
        "Industry": {"enum": ["software", "finance", "retail", "energy", "health", "other"], "title": "Industry",
                     "type": "string"},
        "Person": {"properties": {
            "name": {"title": "Name", "type": "string"},
            "age": {"anyOf": [{"maximum": 120, "minimum": 0, "type": "integer"}, {"type": "null"}],
                    "default": None, "title": "Age"},
            "role": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None,
                     "title": "Role"},
            "email": {"anyOf": [{"format": "email", "type": "string"}, {"type": "null"}], "default": None,
                      "title": "Email"}},
            "required": ["name"], "title": "Person", "type": "object"},
        "Company": {"properties": {
            "name": {"title": "Name", "type": "string"},
            "industry": {"$ref": "#/$defs/Industry"},
            "founded": {"anyOf": [{"maximum": 2030, "minimum": 1800, "type": "integer"}, {"type": "null"}],
                        "default": None, "title": "Founded"},
            "city": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None,
                     "title": "City"}},
            "required": ["name", "industry"], "title": "Company", "type": "object"}},
    "properties": {
        "people": {"items": {"$ref": "#/$defs/Person"}, "maxItems": 6, "title": "People", "type": "array"},
        "companies": {"items": {"$ref": "#/$defs/Company"}, "maxItems": 4, "title": "Companies", "type": "array"}},
    "required": ["people", "companies"], "title": "Extraction", "type": "object"}
rng = random.Random(7)
first = ["Alice", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Julia", "Kenji", "Lena"]
last = ["Moreau", "Okafor", "Schmidt", "Tanaka", "Silva", "Novak", "Haddad", "Kowalski", "Larsen", "Rossi"]
comp = ["Northwind", "Bluepeak", "Solaria", "Fintrek", "Greenfield", "Medcore", "Quanta", "Harbor & Sons"]
suffix = ["Labs", "Capital", "Energy", "Retail", "Health", "Systems", "Group"]
inds = ["software", "finance", "retail", "energy", "health"]
cities = ["Lisbon", "Osaka", "Toronto", "Nairobi", "Berlin", "Austin", "Lyon", "Seoul"]
roles = ["chief executive", "engineer", "analyst", "founder", "head of sales", "researcher"]
def passage(i):
    c = f"{rng.choice(comp)} {rng.choice(suffix)}"
    p1 = f"{rng.choice(first)} {rng.choice(last)}"
    p2 = f"{rng.choice(first)} {rng.choice(last)}"
    year = rng.randint(1890, 2022)
    s = [f"{c}, a {rng.choice(inds)} company founded in {year} in {rng.choice(cities)}, hired {p1} as "
         f"{rng.choice(roles)}.",
         f"{p1}, {rng.randint(24, 70)}, can be reached at {p1.split()[0].lower()}@{c.split()[0].lower()}.com."]
    if i % 2:
        s.append(f"{p2} joined from {rng.choice(comp)} {rng.choice(suffix)} as {rng.choice(roles)}.")
    return " ".join(s)
def line(i, constrained):
    body = {"messages": [{"role": "system", "content": "Extract every person and company in the passage as JSON "
                          "with the keys people (name, age, role, email) and companies (name, industry, founded, "
                          "city)."},
                         {"role": "user", "content": passage(i)}],
            "max_tokens": maxtok, "temperature": 0.7, "seed": i}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "Extraction", "schema": schema}}
    return {"custom_id": f"x{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
rng_state = rng.getstate()
for name, con in (("con", True), ("free", False)):
    rng.setstate(rng_state)  # the same passages on both sides
    with open(f"{tmp}/{name}.jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps(line(i, con)) + "\n")
json.dump(schema, open(f"{tmp}/schema.json", "w"))
PY

stats() { # db -> "wall completion"
  python3 - "$1" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
print(*c.execute("select wall_seconds, completion_tokens from runs").fetchone())
PY
}

echo "bench-structured: $N extraction requests, max_tokens $MAXTOK, $THREADS threads, best of $REPS"
cw=""; fw=""
for r in $(seq 1 "$REPS"); do
  for side in con free; do
    rm -f "$tmp/$side.db"*
    "$BIN" run --model "$MODEL" -i "$tmp/$side.jsonl" -o "$tmp/$side-out.jsonl" --metrics "$tmp/$side.db" \
      --threads "$THREADS" --quiet --no-cache
    read -r w g <<<"$(stats "$tmp/$side.db")"
    echo "  run $r: $side $w s, $g tokens"
    if [ $side = con ]; then
      if [ -z "$cw" ] || python3 -c "import sys; sys.exit(not $w < $cw)"; then cw=$w; cg=$g; fi
    else
      if [ -z "$fw" ] || python3 -c "import sys; sys.exit(not $w < $fw)"; then fw=$w; fg=$g; fi
    fi
  done
done

$PY - "$tmp" "$cw" "$cg" "$fw" "$fg" <<'PY'
import json, sys
tmp, cw, cg, fw, fg = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
schema = json.load(open(f"{tmp}/schema.json"))
try:
    import jsonschema
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    v = cls(schema, format_checker=cls.FORMAT_CHECKER)
    valid, how = v.is_valid, "jsonschema"
except ImportError:
    valid, how = (lambda d: isinstance(d, dict) and "people" in d and "companies" in d), "JSON with the keys"
def share(path):
    n = ok = stop = 0
    for line in open(path, encoding="utf-8"):
        o = json.loads(line)
        n += 1
        c = o["response"]["body"]["choices"][0]
        if c["finish_reason"] != "stop":
            continue
        stop += 1
        try:
            ok += bool(valid(json.loads(c["message"]["content"])))
        except ValueError:
            pass
    return n, stop, ok
cn, cs, cok = share(f"{tmp}/con-out.jsonl")
fn, fs, fok = share(f"{tmp}/free-out.jsonl")
cr, fr = cg / cw, fg / fw
print(f"constrained:    {cn} requests in {cw:.1f} s, {cg} tokens: {cr:.1f} output tok/s; "
      f"{cok}/{cn} ({100 * cok / cn:.0f}%) end valid within max_tokens ({how}), {cs} stopped")
print(f"unconstrained:  {fn} requests in {fw:.1f} s, {fg} tokens: {fr:.1f} output tok/s; "
      f"{fok}/{fn} ({100 * fok / fn:.0f}%) happen to be valid")
print(f"constrained / unconstrained: {100 * cr / fr:.0f}% of the rate (target >= 85%)")
PY

# The budget of one constraint (README, "Limits of one constraint"): the
# largest accepted constraint of each kind, its compile time, peak memory and
# token masks, and the refusal of one size more.
echo
BUILD_DIR=$(dirname "$BIN")
if cmake --build "$BUILD_DIR" --target bench_constraint_limits >/dev/null 2>&1 && [ -x "$BUILD_DIR/bench_constraint_limits" ]; then
  KVB_MODEL=$PWD/$MODEL "$BUILD_DIR/bench_constraint_limits"
else
  echo "bench_constraint_limits: not built (cmake --build $BUILD_DIR --target bench_constraint_limits)"
fi

if [ -z "${LLAMA_SERVER:-}" ]; then
  echo "llama-server: skipped (set LLAMA_SERVER to a llama-server binary to compare)"
  exit 0
fi
port=$((20000 + RANDOM % 20000))
"$LLAMA_SERVER" -m "$MODEL" --host 127.0.0.1 --port "$port" -t "$THREADS" -np "$THREADS" -c $((THREADS * 2048)) \
  --log-disable >"$tmp/server.log" 2>&1 &
server_pid=$!
$PY - "$tmp" "$port" "$LN" "$THREADS" <<'PY'
import concurrent.futures, json, sys, time, urllib.request
tmp, port, ln, slots = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
url = f"http://127.0.0.1:{port}"
for _ in range(120):  # the model loads
    try:
        urllib.request.urlopen(url + "/health", timeout=2)
        break
    except Exception:
        time.sleep(0.5)
else:
    sys.exit("llama-server did not come up (see its log)")
schema = json.load(open(f"{tmp}/schema.json"))
lines = [json.loads(l) for l in open(f"{tmp}/con.jsonl")][:ln]
try:
    import jsonschema
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    valid = cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid
except ImportError:
    valid = lambda d: isinstance(d, dict)
def one(l):
    b = dict(l["body"])
    b.pop("response_format")
    b["json_schema"] = schema
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(b).encode(),
                                 headers={"Content-Type": "application/json"})
    o = json.loads(urllib.request.urlopen(req, timeout=600).read())
    c = o["choices"][0]
    ok = False
    if c["finish_reason"] == "stop":
        try:
            ok = bool(valid(json.loads(c["message"]["content"])))
        except ValueError:
            pass
    return o["usage"]["completion_tokens"], ok
t = time.time()
with concurrent.futures.ThreadPoolExecutor(slots) as ex:
    res = list(ex.map(one, lines))
w = time.time() - t
toks = sum(r[0] for r in res)
oks = sum(r[1] for r in res)
print(f"llama-server:   {len(res)} requests ({slots} slots) in {w:.1f} s, {toks} tokens: {toks / w:.1f} output tok/s; "
      f"{oks}/{len(res)} ({100 * oks / len(res):.0f}%) end valid within max_tokens")
PY
