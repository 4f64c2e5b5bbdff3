#!/usr/bin/env python3
"""Prompt scores (echo, prompt_logprobs) on the default model, cached with the prefix.

1. Values. Each echoed prompt token's logprob equals the log-softmax of `kvbatch logits`'
   row before it (the single-sequence path, computed by numpy in float64: |d| <= 2e-6),
   and is close to the independent numpy forward pass (tests/refmodel.py, float32 on
   the dequantized weights). refmodel's tolerance follows pytest_ref_logits.py's: kvbatch
   rounds matmul inputs to int8 per block (as llama.cpp does), which moves a logprob by a
   few hundredths of a nat; per prompt the median |d| must be <= 0.05 and every |d| <= 0.75.
   The top alternatives are the reference's most likely tokens wherever its margin is clear.
2. Shapes. Results validate with the openai package's Completion/ChatCompletion types (the
   echoed first token's null, which the API writes but the type does not declare, is
   checked on its own); echo's text is the prompt followed by the output; text_offset
   counts code points from the prompt's start (checked against Python's own counting on a
   prompt with non-ASCII text); vLLM's prompt_logprobs hold the prompt token with its rank.
3. Caches. One job of requests sharing a header of several KV blocks, run alone line by
   line (nothing shared), together (in-run reuse), into an empty persistent cache and
   again from it, into a cache that a run without scoring filled (its blocks carry no
   scores: they are computed again, once), and from a cache whose stored scores were
   damaged (a miss): every score, byte for byte the same JSON in every run. The warm run
   computes only the tails.

Exit 0 pass, 1 fail, 77 skipped (no binary/model, or numpy/gguf/openai missing).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvbcheck import BIN, MODEL, check, finish, need_modules, ready  # noqa: E402

HEADER = ("You are a careful grader. Read the question, think about each choice, and answer with the "
          "letter of the correct one. Example: Question: What is two plus two? A. three B. four "
          "C. five D. six Answer: B. Example: Question: Which planet is closest to the sun? A. Venus "
          "B. Earth C. Mercury D. Mars Answer: C. ")
TAILS = ["Question: What colour is the sky on a clear day? Answer:", "Question: How many legs has a spider? "
         "Answer: eight", "Question: Which is the largest ocean? A. Atlantic B. Pacific Answer: B",
         "Question:", "Question: Name a prime number larger than ten but smaller than twenty. Answer: thirteen",
         "Héllo wörld — ça va? 日本語のテキスト. Answer:"]


def run(args, timeout=600):
    p = subprocess.run([BIN] + args, capture_output=True, text=True, timeout=timeout)
    return p


def job_lines():
    lines = []
    for i, t in enumerate(TAILS):
        lines.append({"custom_id": f"mc{i}", "url": "/v1/completions",
                      "body": {"prompt": HEADER + t, "max_tokens": 0, "echo": True, "logprobs": 5,
                               "temperature": 0}})
    lines.append({"custom_id": "gen", "url": "/v1/completions",
                  "body": {"prompt": HEADER + TAILS[0], "max_tokens": 4, "echo": True, "logprobs": 2,
                           "temperature": 0, "n": 2}})
    lines.append({"custom_id": "vllm", "url": "/v1/completions",
                  "body": {"prompt": [HEADER + TAILS[1], HEADER + TAILS[2]], "max_tokens": 0,
                           "prompt_logprobs": 3}})
    lines.append({"custom_id": "chat", "url": "/v1/chat/completions",
                  "body": {"messages": [{"role": "system", "content": HEADER},
                                        {"role": "user", "content": TAILS[4]}],
                           "max_tokens": 2, "temperature": 0, "prompt_logprobs": 2}})
    return lines


def write_job(path, lines):
    with open(path, "w") as f:
        for d in lines:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")


def results(path):
    out = {}
    for line in open(path):
        d = json.loads(line)
        out[d["custom_id"]] = d
    return out


def scores_of(d):
    """What must not change between runs: texts and every logprob field, as JSON text."""
    b = d["response"]["body"]
    keep = [b.get("prompt_logprobs")]
    for c in b["choices"]:
        keep.append([c.get("text", c.get("message")), c.get("logprobs"), c.get("prompt_logprobs")])
    return json.dumps(keep, sort_keys=True)


def summary(p):
    m = re.search(r"(\d+) prompt tokens \((\d+) reused in-run, (\d+) from the cache, (\d+) computed\)", p.stderr)
    check(m is not None, f"no run summary in: {p.stderr[-300:]}")
    return tuple(int(x) for x in m.groups()) if m else (0, 0, 0, 0)


def runs(tmp, job):
    """Every way of running the job; returns {name: results} and the summaries."""
    got, sums = {}, {}

    def go(name, extra, inp=job):
        out = os.path.join(tmp, name + ".jsonl")
        p = run(["run", "--model", MODEL, "--input", inp, "--output", out,
                 "--metrics", os.path.join(tmp, name + ".db")] + extra)
        check(p.returncode == 0, f"{name}: exit {p.returncode}: {p.stderr[-400:]}")
        sums[name] = summary(p)
        return results(out) if p.returncode == 0 else {}, p

    lines = job_lines()
    alone = {}
    for i, d in enumerate(lines):
        one = os.path.join(tmp, f"one{i}.jsonl")
        write_job(one, [d])
        r, _ = go(f"alone{i}", ["--no-cache"], one)
        alone.update(r)
    got["alone"] = alone
    got["together"], _ = go("together", ["--no-cache"])
    cache = os.path.join(tmp, "cache")
    got["cold"], _ = go("cold", ["--cache-dir", cache])
    got["warm"], _ = go("warm", ["--cache-dir", cache])
    # a cache filled by a run that did not score: its blocks carry no scores
    plain = os.path.join(tmp, "plain-job.jsonl")
    write_job(plain, [{"custom_id": d["custom_id"], "url": d["url"],
                       "body": {k: v for k, v in d["body"].items()
                                if k not in ("echo", "logprobs", "prompt_logprobs", "max_tokens")} | {"max_tokens": 1}}
                      for d in lines])
    # in one run, requests that do not score first: their blocks in the prefix tree carry no
    # scores; the first scoring request computes the header again and its scores go to those
    # blocks, so the next ones reuse them
    go("plainonly", ["--no-cache"], plain)
    mixed = os.path.join(tmp, "mixed-job.jsonl")
    plain_lines = [json.loads(x) for x in open(plain)]
    write_job(mixed, [dict(d, custom_id="plain-" + d["custom_id"]) for d in plain_lines] + lines)
    r, _ = go("mixed", ["--no-cache"], mixed)
    got["mixed"] = {k: v for k, v in r.items() if not k.startswith("plain-")}
    cache2 = os.path.join(tmp, "cache2")
    go("plain", ["--cache-dir", cache2], plain)
    got["unscored"], _ = go("unscored", ["--cache-dir", cache2])
    got["upgraded"], _ = go("upgraded", ["--cache-dir", cache2])
    # damage every stored annex (the scores) in the first cache: misses, recomputed the same
    n_hit = damage_annexes(os.path.join(cache, "data.mdb"))
    check(n_hit > 0, "no stored value with scores found to damage")
    got["damaged"], p = go("damaged", ["--cache-dir", cache])
    check("damaged value" in p.stderr, f"damaged scores not reported: {p.stderr[-300:]}")
    return got, sums


def damage_annexes(path):
    """Flips one byte inside each value's annex (values: 'KVBC' magic, flags bit 1)."""
    data = bytearray(open(path, "rb").read())
    n = 0
    for m in re.finditer(b"KVBC", data):
        at = m.start()
        if at + 8 > len(data) or not (data[at + 6] & 2):
            continue
        bs = int.from_bytes(data[at + 28:at + 32], "little")
        comp = int.from_bytes(data[at + 56:at + 64], "little")
        annex_at = at + 72 + 4 * bs + 8 + comp + 4
        if 0 < bs <= 4096 and annex_at + 64 < len(data):
            data[annex_at + 40] ^= 0x5A  # a byte of the first score record's top list
            n += 1
    open(path, "wb").write(bytes(data))
    return n


def check_caches(got, sums):
    base = got["alone"]
    for name, r in got.items():
        check(set(r) == set(base), f"{name}: custom_ids {sorted(r)} vs {sorted(base)}")
        for cid in base:
            if cid in r:
                check(scores_of(r[cid]) == scores_of(base[cid]), f"{name}: {cid}'s scores differ from computing "
                      f"it alone:\n  {scores_of(r[cid])[:300]}\n  {scores_of(base[cid])[:300]}")
    tot, run_reuse, store, computed = sums["together"]
    check(run_reuse > 0, f"together: no in-run reuse ({sums['together']})")
    tot, run_reuse, store, computed = sums["warm"]
    check(store > 0 and computed * 4 < tot, f"warm: the header was not served from the cache ({sums['warm']})")
    slack = 16 * len(job_lines())  # a block per request: where the two kinds met mid-prefill
    check(sums["mixed"][3] <= sums["plainonly"][3] + sums["together"][3] + slack,
          f"mixed: scoring requests computed again what scored blocks in the tree had ({sums['mixed']} vs "
          f"{sums['plainonly']} + {sums['together']})")
    _, _, store_u, computed_u = sums["unscored"]
    check(store_u == 0, f"unscored: blocks without scores were reused for scoring ({sums['unscored']})")
    _, _, store_g, computed_g = sums["upgraded"]
    check(store_g > 0 and computed_g < computed_u,
          f"upgraded: the blocks stored with scores were not reused ({sums['upgraded']} after {sums['unscored']})")
    print("summaries (prompt, in-run, cache, computed):", json.dumps(sums))


def check_shapes(r):
    from openai.types import Completion
    from openai.types.chat import ChatCompletion
    for cid, d in r.items():
        b = d["response"]["body"]
        chat = b["object"] == "chat.completion"
        typed = json.loads(json.dumps(b))
        typed.pop("prompt_logprobs", None)
        for c in typed["choices"]:
            c.pop("prompt_logprobs", None)
            lp = c.get("logprobs")
            if lp and not chat:
                check(lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None,
                      f"{cid}: the echoed prompt's first token has a logprob")
                for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                    del lp[k][0]
        try:
            (ChatCompletion if chat else Completion).model_validate(typed, strict=True)
        except Exception as e:  # pydantic's ValidationError
            check(False, f"{cid}: the openai type refuses it: {str(e)[:300]}")
    lines = {d["custom_id"]: d for d in job_lines()}
    for cid in [f"mc{i}" for i in range(len(TAILS))] + ["gen"]:
        body, prompt = r[cid]["response"]["body"], lines[cid]["body"]["prompt"]
        for c in body["choices"]:
            check(c["text"].startswith(prompt), f"{cid}: echo text {c['text'][:60]!r} does not start with the prompt")
            lp = c["logprobs"]
            n_prompt = body["usage"]["prompt_tokens"]
            check(len(lp["tokens"]) == n_prompt + (len(lp["tokens"]) - n_prompt if cid == "gen" else 0),
                  f"{cid}: {len(lp['tokens'])} tokens for {n_prompt} prompt tokens")
            # text_offset: code points from the start, as Python counts them
            text = c["text"]
            for t, (tok, off) in enumerate(zip(lp["tokens"], lp["text_offset"])):
                if "\ufffd" in tok or tok.startswith("bytes:"):
                    continue  # part of a character split across tokens
                check(text[off:off + len(tok)] == tok,
                      f"{cid}: token {t} {tok!r} is not at code point {off} of the text ({text[off:off + 12]!r})")
        if cid == "mc5":
            check(any(ord(ch) > 127 for ch in body["choices"][0]["text"]), "the non-ASCII prompt lost its text")
    v = r["vllm"]["response"]["body"]
    for c in v["choices"]:
        pl = c["prompt_logprobs"]
        check(pl[0] is None and all(len(e) >= 1 for e in pl[1:]), f"vllm: prompt_logprobs {str(pl)[:200]}")
    pl = r["chat"]["response"]["body"]["prompt_logprobs"]
    check(isinstance(pl, list) and len(pl) == r["chat"]["response"]["body"]["usage"]["prompt_tokens"],
          "chat: prompt_logprobs is not one entry per prompt token")
    # the echo logprob and vLLM's of the same token are the same number
    e = r["mc1"]["response"]["body"]["choices"][0]["logprobs"]["token_logprobs"]
    p = v["choices"][0]["prompt_logprobs"]
    same = all(abs(list(p[t].values())[0]["logprob"] - e[t]) == 0 for t in range(1, len(e)))
    check(same and len(p) == len(e), "vllm's prompt_logprobs and echo's token_logprobs disagree")


def check_values(tmp, r, np):
    from refmodel import RefModel
    ref = RefModel(MODEL)
    for cid in ("mc0", "mc4", "mc5"):
        lp = r[cid]["response"]["body"]["choices"][0]["logprobs"]
        text = job_lines()[int(cid[2:])]["body"]["prompt"]
        out = os.path.join(tmp, cid + ".f32")
        p = run(["logits", "--model", MODEL, "--prompt", text, "--out", out])
        check(p.returncode == 0, f"logits: {p.stderr[-300:]}")
        ids = [int(t) for t in p.stdout.split()]
        check(len(ids) == len(lp["tokens"]), f"{cid}: {len(ids)} ids from `logits`, {len(lp['tokens'])} echoed")
        got = np.array(lp["token_logprobs"][1:], dtype=np.float64)
        rows = np.fromfile(out, dtype="<f4").reshape(len(ids), -1).astype(np.float64)

        def logsoftmax(x):
            m = x.max(-1, keepdims=True)
            return x - (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))

        mine = logsoftmax(rows)[np.arange(len(ids) - 1), ids[1:]]
        d_same = np.abs(mine - got).max()
        check(d_same <= 2e-6, f"{cid}: echo logprobs differ from `kvbatch logits` rows by {d_same:.2e}")
        refl = logsoftmax(ref.forward(ids).astype(np.float64))
        want = refl[np.arange(len(ids) - 1), ids[1:]]
        d = np.abs(want - got)
        print(f"{cid}: {len(got)} scores; vs `logits` max|d| {d_same:.1e}; vs numpy reference median |d| "
              f"{np.median(d):.4f} max {d.max():.4f}")
        check(np.median(d) <= 0.05 and d.max() <= 0.75,
              f"{cid}: prompt logprobs vs the numpy reference: median |d| {np.median(d):.4f}, max {d.max():.4f}")
        # alternatives: the reference's top token where its margin is clear
        for t in range(1, len(ids)):
            row = refl[t - 1]
            top2 = np.argsort(-row)[:2]
            if row[top2[0]] - row[top2[1]] > 1.0:
                alt = lp["top_logprobs"][t]
                best = max(alt, key=alt.get)
                check(len(alt) == 5, f"{cid}: position {t} has {len(alt)} alternatives, asked 5")
                check(abs(alt[best] - row[top2[0]]) <= 0.75,
                      f"{cid}: position {t}: best alternative {best!r} {alt[best]:.3f}, reference {row[top2[0]]:.3f}")


def main():
    if not ready():
        sys.exit(77)
    need_modules("numpy", "gguf", "openai")
    import numpy as np
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.jsonl")
        write_job(job, job_lines())
        got, sums = runs(tmp, job)
        check_caches(got, sums)
        if got.get("alone"):
            check_shapes(got["alone"])
            check_values(tmp, got["alone"], np)
    sys.exit(finish("prompt score"))


if __name__ == "__main__":
    main()
