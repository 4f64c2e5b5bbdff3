#!/usr/bin/env python3
"""End-to-end checks of `kvbatch run` on the real default model.

- the example job: one result line per non-blank input line, the right error
  codes for the bad lines, every line valid JSON in the OpenAI Batch shape;
- determinism: the same texts with --max-batch 1 and 32, a tiny
  --max-step-tokens, and a shuffled copy of the job;
- the shared system prompt is computed once (prefill computed vs submitted);
- resume after SIGKILL at several points: no result lost, none duplicated,
  every line valid JSON, and the same texts as an uninterrupted run;
- SIGTERM: exit 143, the run is marked interrupted in the metrics database;
- exit codes for a missing model, an unwritable output and bad usage;
- `kvbatch report` on the metrics database.

Run by ctest (KVB_BIN, KVB_MODEL, KVB_SOURCE_DIR set); exits 77 to skip when
the model or binary is missing. Uses only the Python standard library.
"""
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

from kvbcheck import BIN, MODEL, SRC, check, finish, ready


def run(args, **kw):
    return subprocess.run([BIN, "run", "--model", MODEL, "--quiet"] + args, capture_output=True, text=True, **kw)


def read_results(path):
    out = {}
    with open(path, "rb") as f:
        data = f.read()
    check(data == b"" or data.endswith(b"\n"), f"{path}: last line not terminated")
    for i, line in enumerate(data.decode("utf-8").splitlines(), 1):
        d = json.loads(line)  # raises on a torn or invalid line
        key = d["custom_id"] if d["custom_id"] is not None else f"line-{i}"
        check(key not in out or d["custom_id"] is None, f"{path}: custom_id {key} written twice")
        out.setdefault(key, []).append(d)
    return out


def texts(results):
    """custom_id -> (texts of choices, finish reasons, completion tokens) for successful lines."""
    t = {}
    for cid, ds in results.items():
        d = ds[0]
        if d["error"] is not None:
            continue
        body = d["response"]["body"]
        ch = body["choices"]
        t[cid] = (
            [c["message"]["content"] if "message" in c else c["text"] for c in ch],
            [c["finish_reason"] for c in ch],
            body["usage"]["completion_tokens"],
        )
    return t


def make_job(path, n, seed=0, shuffle=False, max_tokens=12):
    system = ("You are a helpful librarian at the city library. Answer briefly and politely, in one or two "
              "sentences, and suggest a shelf number when you can. Do not make up book titles.")
    qs = ["Where are the atlases?", "Do you have poetry?", "When do you open on Sunday?", "Is there a quiet room?",
          "Can I print here?", "Where is the history section?", "Do you lend films?", "Is the wifi free?",
          "Where are maps of Spain?", "Who runs the book club?", "Are there books for children?",
          "Can I donate books?", "How long can I keep a book?", "Do you have newspapers?",
          "Can I reserve a room?", "Where are the cookbooks?", "Do you sell coffee?", "Is there parking?",
          "Can I renew online?", "Where is the science fiction?", "Do you have audiobooks?",
          "What is the late fee?", "Can kids get a card?", "Where are the dictionaries?"]
    lines = []
    for i in range(n):
        q = qs[i % len(qs)]
        if i % 5 == 4:  # a completion line now and then
            body = {"prompt": f"Library notice {i}: {q} Answer:", "max_tokens": max_tokens, "temperature": 0}
            url = "/v1/completions"
        else:
            body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
                    "max_tokens": max_tokens, "temperature": 0 if i % 2 else 0.8, "seed": 100 + i}
            url = "/v1/chat/completions"
        lines.append(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}))
    if shuffle:
        random.Random(seed).shuffle(lines)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def test_example(tmp):
    job = os.path.join(SRC, "jobs", "examples", "chat-mixed.jsonl")
    out = os.path.join(tmp, "example.jsonl")
    p = run(["--input", job, "--output", out, "--metrics", os.path.join(tmp, "ex.db")])
    check(p.returncode == 0, f"example job exit {p.returncode}: {p.stderr}")
    n_in = sum(1 for l in open(job) if l.strip())
    lines = open(out).read().splitlines()
    check(len(lines) == n_in, f"example: {len(lines)} output lines for {n_in} non-blank input lines")
    res = [json.loads(l) for l in lines]
    errors = {}
    for d in res:
        if d["error"] is not None:
            errors.setdefault(d["error"]["code"], []).append(d)
            check(d["response"]["status_code"] == 400, "error line without status 400")
            check("line " in d["error"]["message"], f"error message names no line: {d['error']['message']}")
        else:
            b = d["response"]["body"]
            check(d["response"]["status_code"] == 200, "result without status 200")
            u = b["usage"]
            check(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], "usage does not add up")
            check(b["choices"][0]["finish_reason"] in ("stop", "length"), "bad finish_reason")
            check(b["object"] in ("chat.completion", "text_completion"), "bad object")
    for code in ("invalid_json", "missing_field", "duplicate_custom_id", "invalid_value"):
        check(code in errors, f"example: no {code} error line")
    check(any("max_tokens" in d["error"]["message"] for d in errors.get("invalid_value", [])),
          "negative max_tokens not reported by field")
    check(any("url" in d["error"]["message"] for d in errors.get("invalid_value", [])), "unknown url not reported")
    # The answer to the capital question names Paris.
    cap = [d for d in res if d["custom_id"] == "complete-1"]
    check(cap and "Paris" in cap[0]["response"]["body"]["choices"][0]["text"], "complete-1 does not name Paris")
    rep = subprocess.run([BIN, "report", os.path.join(tmp, "ex.db")], capture_output=True, text=True)
    check(rep.returncode == 0 and "ok" in rep.stdout, f"report failed: {rep.returncode} {rep.stderr}")
    print(rep.stdout)


def test_determinism(tmp):
    job = os.path.join(tmp, "det.jsonl")
    shuf = os.path.join(tmp, "det-shuf.jsonl")
    make_job(job, 14, max_tokens=8)
    make_job(shuf, 14, seed=5, shuffle=True, max_tokens=8)
    configs = [
        ("batch1", job, ["--max-batch", "1"]),
        ("batch32", job, ["--max-batch", "32"]),
        ("step7", job, ["--max-batch", "8", "--max-step-tokens", "7"]),
        ("shuffled", shuf, ["--max-batch", "32"]),
        ("smallkv", job, ["--max-batch", "32", "--kv-mem", "40M", "--ctx", "512"]),
    ]
    ref = None
    for name, path, extra in configs:
        out = os.path.join(tmp, f"det-{name}.jsonl")
        db = os.path.join(tmp, f"det-{name}.db")
        t0 = time.time()
        p = run(["--input", path, "--output", out, "--metrics", db] + extra)
        check(p.returncode == 0, f"{name}: exit {p.returncode}: {p.stderr}")
        got = texts(read_results(out))
        check(len(got) == 14, f"{name}: {len(got)} results")
        with sqlite3.connect(db) as c:
            pt, pc = c.execute("select prompt_tokens, prefill_tokens_computed from runs").fetchone()
        print(f"{name}: {time.time() - t0:.1f} s, prefill computed {pc} of {pt} prompt tokens")
        if name == "batch32":
            # Shared system prompt once: computed <= unique + one block per request.
            check(pc < pt * 0.6, f"{name}: prefix not shared ({pc} of {pt} computed)")
        if ref is None:
            ref = got
        else:
            for cid in ref:
                check(got.get(cid) == ref[cid], f"{name}: {cid} differs from the --max-batch 1 run")


def wait_lines(path, n, proc, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            with open(path, "rb") as f:
                if f.read().count(b"\n") >= n:
                    return True
        except FileNotFoundError:
            pass
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    return False


def test_resume(tmp):
    job = os.path.join(tmp, "res.jsonl")
    make_job(job, 16, max_tokens=10)
    ref_out = os.path.join(tmp, "res-ref.jsonl")
    p = run(["--input", job, "--output", ref_out, "--metrics", os.path.join(tmp, "res-ref.db"), "--max-batch", "4"])
    check(p.returncode == 0, f"resume reference: {p.stderr}")
    ref = texts(read_results(ref_out))
    for kill_after in (0, 3, 9):
        out = os.path.join(tmp, f"res-{kill_after}.jsonl")
        db = os.path.join(tmp, f"res-{kill_after}.db")
        proc = subprocess.Popen([BIN, "run", "--model", MODEL, "--quiet", "--input", job, "--output", out,
                                 "--metrics", db, "--max-batch", "4"], stderr=subprocess.PIPE)
        if kill_after:
            wait_lines(out, kill_after, proc)
        else:
            time.sleep(0.3)
        proc.kill()
        proc.wait()
        # A torn tail is what a kill in the middle of a write leaves: simulate it too.
        if kill_after == 9:
            with open(out, "ab") as f:
                f.write(b'{"id":"batch_req_torn","custom_id":"req-')
        before = open(out, "rb").read().count(b"\n") if os.path.exists(out) else 0
        p = run(["--input", job, "--output", out, "--metrics", db, "--max-batch", "4", "--resume"])
        check(p.returncode == 0, f"resume after kill at {kill_after}: {p.stderr}")
        got = read_results(out)  # every line valid JSON, no duplicates
        check(len(got) == 16, f"resume after kill at {kill_after}: {len(got)} results, expected 16 "
                              f"({before} lines were there)")
        check(texts(got) == ref, f"resume after kill at {kill_after}: results differ from an uninterrupted run")
        print(f"resume: killed after {before} lines, resumed to {len(got)}")


def test_resume_bad_then_good(tmp):
    """A line that does not parse does not own its custom_id: a later line with
    the same custom_id runs, under an id of its own, also when resumed."""
    job = os.path.join(tmp, "badgood.jsonl")
    with open(job, "w") as f:
        f.write(json.dumps({"custom_id": "x", "prompt": 5, "max_tokens": 2}) + "\n")
        f.write(json.dumps({"custom_id": "x", "prompt": "Hello", "max_tokens": 2, "temperature": 0}) + "\n")
    out = os.path.join(tmp, "badgood.out")
    for resume in (False, True):
        if resume:  # as if killed after the first line was written
            with open(out, "rb") as f:
                first = f.readline()
            with open(out, "wb") as f:
                f.write(first)
        p = run(["--input", job, "--output", out, "--metrics", os.path.join(tmp, "badgood.db")]
                + (["--resume"] if resume else []))
        check(p.returncode == 0, f"bad-then-good (resume {resume}): exit {p.returncode}: {p.stderr}")
        lines = [json.loads(l) for l in open(out, encoding="utf-8")]
        check(len(lines) == 2 and lines[0]["id"] != lines[1]["id"],
              f"bad-then-good (resume {resume}): {[(l['id'], l['error']) for l in lines]}")
        check(lines[0]["error"] is not None and lines[1]["error"] is None,
              f"bad-then-good (resume {resume}): the bad line failed and the good one ran: "
              f"{[l['error'] for l in lines]}")


def test_json_mode(tmp):
    """response_format json_object: every output that stops is one JSON object,
    whatever the batch; refused fields are named."""
    job = os.path.join(tmp, "json.jsonl")
    asks = ["Give me a JSON object with a name and an age.", "Describe Paris as JSON: city, country, population.",
            "Hello, how are you?", "Write a short poem about the sea.", "List three fruits in JSON under 'fruits'."]
    with open(job, "w") as f:
        for i, q in enumerate(asks):
            for t in (0, 0.8):
                f.write(json.dumps({"custom_id": f"j{i}-{t}", "body": {
                    "messages": [{"role": "user", "content": q}], "max_tokens": 96, "temperature": t, "seed": i,
                    "response_format": {"type": "json_object"}}}) + "\n")
        f.write(json.dumps({"custom_id": "c", "prompt": "The answer, as JSON:", "max_tokens": 60, "temperature": 0,
                            "response_format": {"type": "json_object"}}) + "\n")
        f.write(json.dumps({"custom_id": "text", "prompt": "Hi", "max_tokens": 3,
                            "response_format": {"type": "text"}}) + "\n")
        # logit_bias: the greedy continuation, then the same with its first token banned
        f.write(json.dumps({"custom_id": "free", "prompt": "The capital of France is", "max_tokens": 1,
                            "temperature": 0, "logprobs": 1}) + "\n")
        for cid, extra in (("schema", {"response_format": {"type": "json_schema", "json_schema": {"schema": {
                               "type": "object", "properties": {"d": {"type": "string", "format": "color"}}}}}}),
                           ("tools", {"tools": [{"type": "function", "function": {"name": "f"}}]}),
                           ("bias", {"logit_bias": {"999999": 5}}), ("echo", {"echo": "yes"}),
                           ("rf", {"response_format": "json"})):
            f.write(json.dumps({"custom_id": cid, "prompt": "Hi", "max_tokens": 3, **extra}) + "\n")
    outs = []
    for mb in ("1", "8"):
        out = os.path.join(tmp, f"json-{mb}.out")
        p = run(["--input", job, "--output", out, "--metrics", os.path.join(tmp, "json.db"), "--max-batch", mb])
        check(p.returncode == 0, f"json job: exit {p.returncode}: {p.stderr}")
        outs.append(read_results(out))
    res = outs[0]
    check(texts(outs[0]) == texts(outs[1]), "JSON mode: texts depend on the batch")
    stopped = 0
    for cid, ds in res.items():
        if not (cid.startswith("j") or cid == "c"):
            continue
        body = ds[0]["response"]["body"]
        ch = body["choices"][0]
        txt = ch["message"]["content"] if "message" in ch else ch["text"]
        if ch["finish_reason"] == "stop":
            stopped += 1
            try:
                ok = isinstance(json.loads(txt), dict)
            except ValueError:
                ok = False
            check(ok, f"JSON mode: {cid} stopped on a non-object: {txt!r}")
    check(stopped >= 6, f"JSON mode: only {stopped} of 11 outputs ended")
    check(res["text"][0]["error"] is None, "response_format text refused")
    first = res["free"][0]["response"]["body"]["choices"][0]["text"]
    ids = subprocess.run([BIN, "tokenize", "--model", MODEL, first], capture_output=True, text=True).stdout.split()
    job2 = os.path.join(tmp, "bias.jsonl")
    with open(job2, "w") as f:
        f.write(json.dumps({"custom_id": "banned", "prompt": "The capital of France is", "max_tokens": 1,
                            "temperature": 0, "logit_bias": {ids[0]: -100}}) + "\n")
    out2 = os.path.join(tmp, "bias.out")
    p = run(["--input", job2, "--output", out2, "--metrics", os.path.join(tmp, "json.db")])
    banned = read_results(out2)["banned"][0]["response"]["body"]["choices"][0]["text"]
    check(p.returncode == 0 and len(ids) == 1 and banned != first,
          f"logit_bias -100 on the greedy token {ids} ({first!r}) gave {banned!r}")
    for cid, field in (("schema", "schema.properties.d"), ("tools", "tools"), ("bias", "logit_bias"),
                       ("echo", "echo"), ("rf", "response_format")):
        err = res[cid][0]["error"]
        check(err is not None and field in err["message"], f"{cid}: {err}")
    # kvbatch generate --json: the same mode for one prompt
    g = subprocess.run([BIN, "generate", "--model", MODEL, "--chat", "--json", "-q", "-n", "96", "--temperature", "0",
                        "--prompt", asks[0]], capture_output=True, text=True)
    try:
        gen_ok = g.returncode == 0 and isinstance(json.loads(g.stdout), dict)
    except ValueError:
        gen_ok = False
    check(gen_ok, f"generate --json: exit {g.returncode}: {g.stdout!r} {g.stderr}")
    print(f"json mode: {stopped} of 11 outputs ended, each one JSON object; 5 refused fields named")


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"], "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "city": {"enum": ["Paris", "London", "Rome"]},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}, "member": {"type": ["boolean", "null"]},
    "pets": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["kind"],
                                                        "properties": {"kind": {"const": "cat"}, "age": {"type": "number"}}}}}}


def conforms(v, sc):
    """The schema subset kvbatch holds outputs to, checked on a parsed value."""
    if "enum" in sc or "const" in sc:
        return v in (sc["enum"] if "enum" in sc else [sc["const"]])
    types = sc.get("type")
    if types is None:
        return True
    types = types if isinstance(types, list) else [types]
    checks = {"string": lambda x: isinstance(x, str), "boolean": lambda x: isinstance(x, bool),
              "null": lambda x: x is None, "integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
              "number": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
              "array": lambda x: isinstance(x, list), "object": lambda x: isinstance(x, dict)}
    if not any(checks[t](v) for t in types):
        return False
    if isinstance(v, list):
        return (sc.get("minItems", 0) <= len(v) <= sc.get("maxItems", 65535)
                and all(conforms(x, sc.get("items", {})) for x in v))
    if isinstance(v, dict) and "properties" in sc:
        return (set(v) <= set(sc["properties"]) and set(sc.get("required", [])) <= set(v)
                and all(conforms(x, sc["properties"][k]) for k, x in v.items()))
    return True


def test_json_schema(tmp):
    """response_format json_schema: outputs that stop are objects the schema allows."""
    job = os.path.join(tmp, "schema.jsonl")
    asks = ["Describe a person who lives in Paris.", "Tell me about Bob, 40, from Rome, who has a cat.",
            "Who are you?", "Write a haiku about rain."]
    with open(job, "w") as f:
        for i, q in enumerate(asks):
            for t in (0, 1.0):
                f.write(json.dumps({"custom_id": f"p{i}-{t}", "body": {
                    "messages": [{"role": "user", "content": q}], "max_tokens": 160, "temperature": t, "seed": i,
                    "response_format": {"type": "json_schema",
                                        "json_schema": {"name": "person", "strict": True, "schema": PERSON}}}}) + "\n")
    out = os.path.join(tmp, "schema.out")
    p = run(["--input", job, "--output", out, "--metrics", os.path.join(tmp, "schema.db")])
    check(p.returncode == 0, f"schema job: exit {p.returncode}: {p.stderr}")
    stopped = 0
    for cid, ds in read_results(out).items():
        ch = ds[0]["response"]["body"]["choices"][0]
        if ch["finish_reason"] != "stop":
            continue
        stopped += 1
        try:
            v = json.loads(ch["message"]["content"])
        except ValueError:
            v = None
        check(isinstance(v, dict) and conforms(v, PERSON), f"json_schema: {cid} stopped on {ch['message']['content']!r}")
    check(stopped >= 3, f"json_schema: only {stopped} of 8 outputs ended")
    print(f"json schema: {stopped} of 8 outputs ended, each an object the schema allows")


def test_sigterm(tmp):
    job = os.path.join(tmp, "term.jsonl")
    make_job(job, 24, max_tokens=24)
    out = os.path.join(tmp, "term.jsonl.out")
    db = os.path.join(tmp, "term.db")
    proc = subprocess.Popen([BIN, "run", "--model", MODEL, "--quiet", "--input", job, "--output", out,
                             "--metrics", db, "--max-batch", "2"], stderr=subprocess.PIPE)
    wait_lines(out, 2, proc)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    check(rc == 128 + signal.SIGTERM, f"SIGTERM: exit {rc}, expected {128 + signal.SIGTERM}")
    read_results(out)
    with sqlite3.connect(db) as c:
        st = c.execute("select status from runs").fetchone()[0]
    check(st == "interrupted", f"SIGTERM: run status {st}")


def test_errors(tmp):
    job = os.path.join(tmp, "err.jsonl")
    long_prompt = "word " * 400
    with open(job, "w") as f:
        f.write(json.dumps({"custom_id": "long", "prompt": long_prompt, "max_tokens": 4}) + "\n")
        f.write(json.dumps({"custom_id": "ok", "prompt": "Hello", "max_tokens": 2, "temperature": 0}) + "\n")
        f.write("[1, 2, 3]\n")
        f.write(json.dumps({"custom_id": "temp", "prompt": "x", "temperature": -1}) + "\n")
        f.write(json.dumps({"custom_id": "topp", "prompt": "x", "top_p": 1.5}) + "\n")
        f.write(json.dumps({"custom_id": "type", "prompt": "x", "max_tokens": "ten"}) + "\n")
        f.write(json.dumps({"custom_id": "nomsg", "method": "POST", "url": "/v1/chat/completions",
                            "body": {"max_tokens": 3}}) + "\n")
    out = os.path.join(tmp, "err.out")
    p = run(["--input", job, "--output", out, "--ctx", "128"])
    check(p.returncode == 0, f"error job exit {p.returncode}")
    res = read_results(out)
    codes = {k: (v[0]["error"] or {}).get("code") for k, v in res.items()}
    check(codes.get("long") == "context_length_exceeded", f"long prompt: {codes.get('long')}")
    check(codes.get("ok") is None, "the good line failed")
    check(codes.get("temp") == "invalid_value", f"temperature -1: {codes.get('temp')}")
    check(codes.get("topp") == "invalid_value", f"top_p 1.5: {codes.get('topp')}")
    check(codes.get("type") == "invalid_type", f"max_tokens string: {codes.get('type')}")
    check(codes.get("nomsg") == "missing_field", f"no messages: {codes.get('nomsg')}")
    check(any(c == "invalid_request" for c in codes.values()), "non-object line not reported")
    # Exit codes.
    p = subprocess.run([BIN, "run", "--model", os.path.join(tmp, "nope.gguf"), "-i", job, "-o", out],
                       capture_output=True, text=True)
    check(p.returncode == 1 and "nope.gguf" in p.stderr, f"missing model: exit {p.returncode}: {p.stderr}")
    p = run(["--input", job, "--output", os.path.join(tmp, "no", "dir", "out.jsonl")])
    check(p.returncode == 1 and "cannot open" in p.stderr, f"unwritable output: exit {p.returncode}: {p.stderr}")
    # A full disk: exit 1 naming the cause; the run is recorded as failed,
    # counting only what reached the output (here nothing).
    if os.path.exists("/dev/full"):
        full_db = os.path.join(tmp, "full.db")
        p = run(["--input", job, "--output", "/dev/full", "--metrics", full_db])
        check(p.returncode == 1 and "No space left" in p.stderr, f"full disk: exit {p.returncode}: {p.stderr}")
        with sqlite3.connect(full_db) as c:
            row = c.execute("select status, requests_total from runs").fetchone()
            n_rows = c.execute("select count(*) from requests").fetchone()[0]
        check(row == ("failed", 0) and n_rows == 0, f"full disk: run {row}, {n_rows} request rows")
    p = run(["--input", os.path.join(tmp, "missing.jsonl"), "--output", out])
    check(p.returncode == 1, f"missing input: exit {p.returncode}")
    p = run(["--input", job])
    check(p.returncode == 2, f"no --output: exit {p.returncode}")
    p = run(["--input", job, "--output", out, "--max-batch", "zero"])
    check(p.returncode == 2, f"bad --max-batch: exit {p.returncode}")


def main():
    if not ready():
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        # A private persistent cache: runs after the first find it warm, so
        # the determinism and resume checks also cover cold vs warm.
        os.environ["KVBATCH_CACHE_DIR"] = os.path.join(tmp, "cache")
        for t in (test_example, test_errors, test_determinism, test_resume, test_resume_bad_then_good,
                  test_json_mode, test_json_schema, test_sigterm):
            t0 = time.time()
            t(tmp)
            print(f"{t.__name__}: {time.time() - t0:.1f} s")
    return finish("run")


if __name__ == "__main__":
    sys.exit(main())
