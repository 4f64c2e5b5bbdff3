#!/usr/bin/env python3
"""kv-accuracy.py — how far the quantized KV cache types move the model from f16.

    scripts/kv-accuracy.py [--types f16,q8,q4] [--text FILE] [--nmse-tokens 2000]
                           [--prompts 50] [--gen 64] [--ctx N] [--threads N] [--json]

For each KV type (the first is the reference, f16 by default), through the
built kvbatch (build/kvbatch, or $KVBATCH_BIN) and its default model:
  logit NMSE   `kvbatch logits --kv-type T` over the first NMSE_TOKENS tokens of
               the text: sum((l - l_ref)^2) / sum(l_ref^2) over every position and
               vocabulary entry, with the share of positions whose top token agrees;
  greedy       PROMPTS prompts cut from the text (40 words each, evenly spaced),
               GEN tokens each at temperature 0 through `kvbatch run`: the mean share
               of the reference's tokens reproduced before the first difference, and
               how many continuations are identical;
  perplexity   scripts/perplexity.sh's harness method over the whole text
               (python/kvbatch_ppl.py), with its change relative to the reference.
Targets (issue 16): q8 perplexity within 0.5 % of f16, q4 within 3 %.
Needs the kvbatch venv (numpy, lm_eval): run it with ~/.cache/kvbatch-venv/bin/python.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import kvbatch_lm_eval as kle  # noqa: E402
import kvbatch_ppl  # noqa: E402


def binary():
    return os.environ.get("KVBATCH_BIN") or os.path.join(ROOT, "build", "kvbatch")


def logits_of(ids, kv, threads, work):
    out = os.path.join(work, "logits-%s.bin" % kv)
    cmd = [binary(), "logits", "--prompt-ids", " ".join(map(str, ids)), "--kv-type", kv, "--out", out]
    if threads:
        cmd += ["--threads", str(threads)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


def greedy_of(prompts, kv, gen, threads, work):
    job, out = os.path.join(work, "greedy.jsonl"), os.path.join(work, "greedy-%s.out.jsonl" % kv)
    with open(job, "w") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"custom_id": "p%d" % i, "prompt": p, "max_tokens": gen, "temperature": 0,
                                "logprobs": 0}) + "\n")
    cmd = [binary(), "run", "--input", job, "--output", out, "--metrics", os.path.join(work, "m.db"),
           "--no-cache", "--quiet", "--kv-type", kv]
    if threads:
        cmd += ["--threads", str(threads)]
    subprocess.run(cmd, check=True)
    toks = {}
    with open(out) as f:
        for line in f:
            r = json.loads(line)
            toks[r["custom_id"]] = r["response"]["body"]["choices"][0]["logprobs"]["tokens"]
    return [toks["p%d" % i] for i in range(len(prompts))]


def common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def main(argv=None):
    ap = argparse.ArgumentParser(description="accuracy of the quantized KV cache types against f16")
    ap.add_argument("--types", default="f16,q8,q4")
    ap.add_argument("--text", default=os.path.join(ROOT, "tests", "data", "ppl-english.txt"))
    ap.add_argument("--nmse-tokens", type=int, default=2000)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--ctx", type=int, help="perplexity window (default as scripts/perplexity.sh)")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    types = a.types.split(",")
    info = kle.GGUFInfo(kle.default_model())
    tok = kle.Tokenizer(binary(), kle.default_model())
    with open(a.text, "rb") as f:
        data = f.read()
    ids = tok.encode_bytes(data)
    if len(ids) < a.nmse_tokens:
        sys.exit("kv-accuracy: %s has %d tokens, fewer than --nmse-tokens %d" % (a.text, len(ids), a.nmse_tokens))
    words = data.decode("utf-8", "replace").split()
    step = max(1, (len(words) - 40) // a.prompts)
    prompts = [" ".join(words[i * step:i * step + 40]) for i in range(a.prompts)]
    ctx = a.ctx or min(2048, info.n_ctx_train - 2)
    res = {"text": a.text, "nmse_tokens": a.nmse_tokens, "prompts": a.prompts, "gen": a.gen, "ppl_ctx": ctx,
           "types": {}}
    with tempfile.TemporaryDirectory(prefix="kv-accuracy-") as work:
        ref_l = ref_g = ref_p = None
        for kv in types:
            lg = logits_of(ids[:a.nmse_tokens], kv, a.threads, work)
            gr = greedy_of(prompts, kv, a.gen, a.threads, work)
            lm = kle.KvbatchLM(binary=binary(), no_cache=True, threads=a.threads, work_dir=work, quiet=True,
                               max_length=ctx, extra_args="--kv-type " + kv)
            pp = kvbatch_ppl.perplexity(lm, ids, ctx, "harness")["ppl"]
            if ref_l is None:
                ref_l, ref_g, ref_p = lg, gr, pp
            d = lg.astype(np.float64) - ref_l
            nmse = float((d * d).sum() / (ref_l.astype(np.float64) ** 2).sum())
            top1 = float((lg.argmax(1) == ref_l.argmax(1)).mean())
            agree = [common_prefix(x, y) / max(1, len(y)) if x != y else 1.0 for x, y in zip(gr, ref_g)]
            r = {"logit_nmse": nmse, "top1_agreement": top1, "greedy_agreement": float(np.mean(agree)),
                 "greedy_identical": int(sum(x == y for x, y in zip(gr, ref_g))), "ppl": pp,
                 "ppl_change_pct": 100.0 * (pp / ref_p - 1.0)}
            res["types"][kv] = r
            if not a.json:
                print("%-4s logit NMSE %.3e (top-1 %.2f %% of %d positions)  greedy %.1f %% (%d/%d identical)  "
                      "ppl %.4f (%+.3f %%)" % (kv, nmse, 100 * top1, a.nmse_tokens, 100 * r["greedy_agreement"],
                                               r["greedy_identical"], a.prompts, pp, r["ppl_change_pct"]),
                      flush=True)
    if a.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
