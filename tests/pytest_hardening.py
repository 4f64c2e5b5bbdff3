#!/usr/bin/env python3
"""End-to-end checks of `kvbatch run` for the hardening of issue 18, each
one a case that once went wrong:

- logprobs without alternatives (chat "logprobs": true alone, completions
  "logprobs": 0) next to ordinary lines: it crashed the whole process.
- a numerically broken model (NaN output_norm, NaN epsilon): every line was
  a 200 with empty content; now each is a 500 naming non-finite logits (or
  the model is refused at load, naming why), and `generate` says why.
- custom_ids are echoed exactly as written: "x\\ud800" and "x\\udfff" were
  both repaired to "x\\ufffd" (the second then a duplicate_custom_id).

Run by ctest (KVB_BIN, KVB_MODEL, KVB_SOURCE_DIR set); exits 77 to skip when
the model or binary is missing. Uses only the Python standard library.
"""
import json
import os
import shutil
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


def broken_copy(d, name, spoil):
    """A copy of the model spoiled in place by spoil(reader), or None without the gguf package."""
    try:
        import gguf
        import numpy as np
    except ImportError:
        print("note: no gguf/numpy package: broken-model checks skipped")
        return None
    path = os.path.join(d, name)
    shutil.copyfile(MODEL, path)
    r = gguf.GGUFReader(path, "r+")
    spoil(r, np)
    del r
    return path


def spoil_output_norm(r, np):
    t = next(t for t in r.tensors if t.name == "output_norm.weight")
    t.data[:] = np.nan


def spoil_epsilon(r, np):
    f = next(f for k, f in r.fields.items() if k.endswith("layer_norm_rms_epsilon"))
    f.parts[-1][0] = np.nan


def test_nonfinite_model(d):
    job = os.path.join(d, "nf.jsonl")
    write_job(job, [chat("c1"), comp("p1"), chat("c2", temperature=0.8, max_tokens=4)])
    for name, spoil in (("nan-norm.gguf", spoil_output_norm), ("nan-eps.gguf", spoil_epsilon)):
        path = broken_copy(d, name, spoil)
        if path is None:
            return
        out = os.path.join(d, name + ".out.jsonl")
        p = subprocess.run([BIN, "run", "--model", path, "--quiet", "--no-cache", "-i", job, "-o", out],
                           capture_output=True, text=True)
        if p.returncode == 1:  # refused at load: the message must say why
            check(any(w in p.stderr for w in ("NaN", "non-finite", "not finite")),
                  f"{name}: refused without naming the cause: {p.stderr[-300:]}")
        else:
            check(p.returncode == 0, f"{name}: exit {p.returncode}: {p.stderr[-300:]}")
            lines = read_lines(out)
            check(len(lines) == 3, f"{name}: {len(lines)} lines, not 3")
            for l in lines:
                check(l["response"]["status_code"] == 500 and l["error"]["code"] == "server_error" and
                      "not finite" in l["error"]["message"],
                      f"{name}: {l['custom_id']}: not a 500 naming non-finite logits: {json.dumps(l)[:300]}")
        g = subprocess.run([BIN, "generate", "--model", path, "-q", "-n", "4", "--prompt", "Hello"],
                           capture_output=True, text=True)
        check(g.returncode == 1, f"{name}: generate exit {g.returncode}")
        check(any(w in g.stderr for w in ("NaN", "non-finite", "not finite")),
              f"{name}: generate failed without saying why: {g.stderr[-300:]!r}")


def raw_custom_id(line):
    """The custom_id's JSON text as the line writes it (quotes included)."""
    at = line.index('"custom_id":') + len('"custom_id":')
    if line.startswith("null", at):
        return "null"
    _, end = json.decoder.scanstring(line, at + 1)
    return line[at:end]


def test_custom_id_exact(d):
    job, out = os.path.join(d, "cid.jsonl"), os.path.join(d, "cid.out.jsonl")
    ids = ['"x\\ud800"', '"x\\udfff"', '"x\\ufffd"', '"x\\u0000"', '"q\\"\\\\\\/\\u00e9"', '"\\ud83d\\ude00"',
           '"caf\u00e9"']
    lines = []
    for k, cid in enumerate(ids):
        body = ('{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1}' if k % 2 else
                '{"prompt":"Hi","max_tokens":1}')
        url = "/v1/chat/completions" if k % 2 else "/v1/completions"
        lines.append('{"custom_id":%s,"method":"POST","url":"%s","body":%s}' % (cid, url, body))
    lines.append('{"custom_id":"x\\ud800","prompt":"Hi","max_tokens":1}')  # the same id again: a duplicate
    lines.append('{"custom_id":"bad\\ud800","prompt":"Hi","max_tokens":0}')  # an error line keeps it too
    with open(job, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    p = run(["-i", job, "-o", out])
    check(p.returncode == 0, f"custom_id: exit {p.returncode}: {p.stderr[-300:]}")
    with open(out, encoding="utf-8", errors="surrogatepass") as f:
        got = f.read().splitlines()
    check(len(got) == len(lines), f"custom_id: {len(got)} lines for {len(lines)}")
    raw = [raw_custom_id(l) for l in got]
    for cid in ids:
        want = 2 if cid == ids[0] else 1  # the duplicate's error line carries it too
        check(raw.count(cid) == want, f"custom_id {cid}: written {raw.count(cid)} times as given, not {want}: {raw}")
    outs = [json.loads(l) for l in got]
    dup = [o for o in outs if o["error"] and o["error"]["code"] == "duplicate_custom_id"]
    check(len(dup) == 1 and dup[0]["custom_id"] == "x\ud800", f"custom_id: duplicates {dup}")
    ok = [o for o in outs if o["response"]["status_code"] == 200]
    check(len(ok) == len(ids), f"custom_id: {len(ok)} results for {len(ids)} distinct ids")
    check(raw.count('"bad\\ud800"') == 1, "custom_id: an error line echoes its id as written")


def main():
    if not ready():
        return 77
    with tempfile.TemporaryDirectory() as d:
        test_logprobs_without_alternatives(d)
        test_nonfinite_model(d)
        test_custom_id_exact(d)
    return finish("hardening")


if __name__ == "__main__":
    sys.exit(main())
