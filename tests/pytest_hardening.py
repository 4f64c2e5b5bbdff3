#!/usr/bin/env python3
"""End-to-end checks of `kvbatch run` for the hardening of issue 18, each
one a case that once went wrong:

- logprobs without alternatives (chat "logprobs": true alone, completions
  "logprobs": 0) next to ordinary lines: it crashed the whole process.

Run by ctest (KVB_BIN, KVB_MODEL, KVB_SOURCE_DIR set); exits 77 to skip when
the model or binary is missing. Uses only the Python standard library.
"""
import json
import os
import subprocess
import sys
import tempfile

from kvbcheck import BIN, MODEL, check, finish, ready


def run(args, env=None, **kw):
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.run([BIN, "run", "--model", MODEL, "--quiet", "--no-cache"] + args, capture_output=True,
                          text=True, env=e, **kw)


def write_job(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        for d in lines:
            f.write((d if isinstance(d, str) else json.dumps(d)) + "\n")


def read_lines(path):
    with open(path, "rb") as f:
        return [json.loads(l) for l in f.read().decode("utf-8").splitlines()]


def by_id(lines):
    return {d["custom_id"]: d for d in lines}


def chat(cid, text="Say yes.", **kw):
    return {"custom_id": cid, "messages": [{"role": "user", "content": text}], "max_tokens": 3, "temperature": 0,
            **kw}


def comp(cid, text="The capital of France is", **kw):
    return {"custom_id": cid, "prompt": text, "max_tokens": 3, "temperature": 0, **kw}


def test_logprobs_without_alternatives(d):
    job, out = os.path.join(d, "lp.jsonl"), os.path.join(d, "lp.out.jsonl")
    write_job(job, [chat("good1"), chat("a", logprobs=True), comp("b", logprobs=0),
                    chat("c", logprobs=True, top_logprobs=0), comp("good2")])
    p = run(["-i", job, "-o", out])
    check(p.returncode == 0, f"logprobs without alternatives: exit {p.returncode}: {p.stderr[-500:]}")
    if p.returncode != 0:
        return
    res = by_id(read_lines(out))
    check(len(res) == 5, f"logprobs without alternatives: {len(res)} lines, not 5")
    for cid in ("a", "c"):
        body = res[cid]["response"]["body"]
        content = body["choices"][0]["logprobs"]["content"]
        check(len(content) == body["usage"]["completion_tokens"], f"{cid}: one logprob per token")
        check(all(t["top_logprobs"] == [] for t in content), f"{cid}: no alternatives asked, none given")
    lp = res["b"]["response"]["body"]["choices"][0]["logprobs"]
    check(len(lp["tokens"]) == len(lp["token_logprobs"]) == 3, "b: a logprob per token")
    check(all(t == {} for t in lp["top_logprobs"]), "b: logprobs 0 gives no alternatives")


def main():
    if not ready():
        return 77
    with tempfile.TemporaryDirectory() as d:
        test_logprobs_without_alternatives(d)
    return finish("hardening")


if __name__ == "__main__":
    sys.exit(main())
