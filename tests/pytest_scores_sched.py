#!/usr/bin/env python3
"""Prompt scoring in the scheduler: the pool's bound, the last block's scores, and reuse
of a prefix that a request without scores computed first.

1. Pool. A KV pool of exactly one full context (the smallest the scheduler accepts) runs a
   scoring request whose prompt's scored blocks are all in the prefix tree, so that its first
   unscored position is recomputed in a private copy of a shared block: the job must finish,
   with the scores and text of the same request run in a roomy pool.
2. The last block of a prompt whose length is a multiple of the block size. A request scores
   a 144-token prompt (9 blocks) and generates, its first block's scores cached by an earlier
   request: it computes from position 15, and its 128-row scoring chunk ends at position 143,
   the prompt's last, which a chunk of its own computes without scoring. An identical scoring
   request afterwards finds every block with its scores (cached_tokens 144).
3. In-run reuse after a request that does not score. One completion without scores computes
   a 10-block header first; twelve scoring requests then share it. The header's scores are
   computed once (by the first scoring request), not once per request: the run computes at
   most the header once more than the same scoring requests without the plain one; from the
   persistent cache, the header is loaded twice (without scores, then with them), not once
   per request.
Every result is also compared with the request run alone (scores bit for bit, as JSON text).

Exit 0 pass, 1 fail, 77 skipped (no binary or model).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvbcheck import BIN, MODEL, check, finish, ready  # noqa: E402

TEXT = ("The quick brown fox jumps over the lazy dog near the river bank while children play football in "
        "the park and the old man reads a newspaper on a wooden bench under the tall oak tree. Meanwhile, "
        "in the city, engineers are designing new bridges that will connect the northern districts with "
        "the southern harbour, and economists debate whether the project will pay for itself. ")
BLOCK = 16
KV_BLOCK_BYTES = 30 * 2 * 192 * 2 * BLOCK  # SmolLM2-135M: 30 layers, K and V of 192 fp16 values a token


def ids_of(text):
    p = subprocess.run([BIN, "tokenize", "--model", MODEL, text], capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"tokenize: {p.stderr[-300:]}")
    return [int(x) for x in p.stdout.split()]


def comp(cid, prompt, **body):
    b = {"prompt": prompt, "temperature": 0}
    b.update(body)
    return {"custom_id": cid, "url": "/v1/completions", "body": b}


def run_job(tmp, name, lines, extra, cache=None):
    job, out = os.path.join(tmp, name + ".jsonl"), os.path.join(tmp, name + ".out.jsonl")
    with open(job, "w") as f:
        for d in lines:
            f.write(json.dumps(d) + "\n")
    p = subprocess.run([BIN, "run", "--model", MODEL, "--input", job, "--output", out,
                        "--metrics", os.path.join(tmp, name + ".db")]
                       + (["--cache-dir", cache] if cache else ["--no-cache"]) + extra,
                       capture_output=True, text=True, timeout=600)
    check(p.returncode == 0, f"{name}: exit {p.returncode}: {p.stderr[-400:]}")
    res = {}
    if os.path.exists(out):
        for line in open(out):
            d = json.loads(line)
            res[d["custom_id"]] = d
    m = re.search(r"\((\d+) reused in-run, (\d+) from the cache, (\d+) computed\)", p.stderr)
    check(m is not None, f"{name}: no run summary")
    return res, (tuple(int(x) for x in m.groups()) if m else (-1, -1, -1))


def scores_of(d):
    b = d["response"]["body"]
    return json.dumps([[c.get("text"), c.get("logprobs"), c.get("prompt_logprobs")] for c in b["choices"]],
                      sort_keys=True)


def same_as_alone(tmp, name, lines, got, extra=()):
    for d in lines:
        alone, _ = run_job(tmp, f"{name}-alone-{d['custom_id']}", [d], list(extra))
        cid = d["custom_id"]
        if check(cid in got and cid in alone, f"{name}: {cid} has no result"):
            check(scores_of(got[cid]) == scores_of(alone[cid]), f"{name}: {cid} differs from running it alone")


def main():
    if not ready():
        sys.exit(77)
    ids = ids_of(TEXT * 5)
    check(len(ids) >= 320, f"only {len(ids)} ids")
    with tempfile.TemporaryDirectory() as tmp:
        # 1. a pool of one 320-token context: 20 blocks
        ctx = 320
        pool = ["--ctx", str(ctx), "--kv-mem", str(ctx // BLOCK * KV_BLOCK_BYTES)]
        lines = [comp("B", ids[:305], max_tokens=0, echo=True, logprobs=1),
                 comp("A", ids[:304] + ids[5:11], max_tokens=10, echo=True, logprobs=1)]
        got, _ = run_job(tmp, "pool", lines, pool)
        same_as_alone(tmp, "pool", lines, got, ["--ctx", str(ctx)])

        # 2. the last block of a 9-block prompt keeps its scores
        lines = [comp("B", ids[:17], max_tokens=0, echo=True, logprobs=1),
                 comp("A", ids[:144], max_tokens=1, echo=True, logprobs=1),
                 comp("C", ids[:144], max_tokens=0, echo=True, logprobs=1)]
        got, _ = run_job(tmp, "last", lines, ["--max-batch", "1"])
        if check("C" in got, "last: no result for C"):
            cached = got["C"]["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"]
            check(cached == 144, f"last: C reused {cached} of its 144 prompt tokens, scored and cached by A")
        same_as_alone(tmp, "last", lines, got)

        # 3. a plain request computes the header first; the scoring ones share it
        head = ids[:160]
        scoring = [comp(f"s{i}", head + ids[200 + i:210 + 2 * i], max_tokens=0, echo=True, logprobs=1)
                   for i in range(12)]
        plain = comp("plain", head + ids[250:260], max_tokens=2)
        _, (_, _, without) = run_job(tmp, "scoring", scoring, [])
        got, (_, _, with_plain) = run_job(tmp, "mixed", [plain] + scoring, [])
        check(0 < with_plain <= without + len(head) + 10,
              f"mixed: {with_plain} prompt tokens computed, {without} without the plain request: the header's "
              f"scores were computed again for each scoring request")
        same_as_alone(tmp, "mixed", [plain] + scoring[:3], got)
        # the same from a persistent cache: the plain request loads the header without its
        # scores, the first scoring request loads it again with them, the others reuse those
        cache = os.path.join(tmp, "cache")
        run_job(tmp, "mixed-cold", [plain] + scoring, [], cache)
        warm, (_, from_cache, _) = run_job(tmp, "mixed-warm", [plain] + scoring, [], cache)
        tails = sum(len(d["body"]["prompt"]) // BLOCK - len(head) // BLOCK for d in scoring + [plain])
        check(0 < from_cache <= 2 * len(head) + tails * BLOCK,
              f"mixed-warm: {from_cache} prompt tokens from the cache: the header was loaded for each request")
        for cid in got:
            check(cid in warm and scores_of(warm[cid]) == scores_of(got[cid]), f"mixed-warm: {cid} differs")
    sys.exit(finish("scheduler scoring"))


if __name__ == "__main__":
    main()
