#!/usr/bin/env python3
"""End-to-end checks of the quantized KV cache (--kv-type q8 | q4).

- for q8 and q4, a job's results are the same whatever the batch (--max-batch
  1, 4, 16), the prefill chunking (--max-step-tokens 16 or 512), the cache
  (none, cold, warm): a row's stored bytes are a pure function of its
  values (test_attn holds the SIMD attention to the scalar reference);
- the persistent store keeps f16 and q8 entries apart: a q8 run after an f16
  run over the same prompts restores nothing, its second run restores; `cache
  stats` names both KV types;
- the same --kv-mem holds more blocks (q8 ~1.9x, q4 ~2.4x: K stays at 8 bits),
  the run summary and the metrics' settings name the KV type;
- --cache-lossy8 with a quantized type and an unknown --kv-type are refused.

Run by ctest (KVB_BIN, KVB_MODEL set); exits 77 when they are missing.
"""
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile

from kvbcheck import BIN, MODEL, check, finish, ready


def kvb(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True)


def run(job, out, db, *extra, quiet=True):
    p = kvb("run", "--model", MODEL, "--input", job, "--output", out, "--metrics", db,
            *(["--quiet"] if quiet else []), *extra)
    check(p.returncode == 0, f"run {' '.join(extra)}: exit {p.returncode}: {p.stderr}")
    texts, cached = {}, {}
    if p.returncode == 0:
        for line in open(out):
            d = json.loads(line)
            b = d["response"]["body"]
            texts[d["custom_id"]] = b["choices"][0]["message"]["content"]
            cached[d["custom_id"]] = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    return texts, cached, p.stderr


def main():
    if not ready():
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.jsonl")
        system = ("You answer questions about the harbour archive: its maps, its ledgers of cargo, and the "
                  "letters of the keepers who watched the light for a hundred years. ") * 2
        qs = ["Who kept the light?", "What is in the ledgers?", "How old are the maps?", "Name a cargo.",
              "Why were the letters written?", "Where is the archive?"]
        with open(job, "w") as f:
            for i, q in enumerate(qs):
                body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
                        "max_tokens": 16, "temperature": 0 if i % 2 == 0 else 0.8, "seed": 100 + i}
                f.write(json.dumps({"custom_id": f"q{i}", "body": body}) + "\n")
        n = [0]

        def go(*extra, quiet=True):
            n[0] += 1
            return run(job, os.path.join(tmp, f"out{n[0]}.jsonl"), os.path.join(tmp, "m.db"), *extra, quiet=quiet)

        for kv in ("q8", "q4"):
            cache = os.path.join(tmp, "cache-" + kv)
            ref, _, _ = go("--kv-type", kv, "--no-cache", "--max-batch", "1")
            check(len(ref) == len(qs), f"{kv}: {len(ref)} results")
            for extra in (("--max-batch", "4", "--max-step-tokens", "16"), ("--max-batch", "16"),
                          ("--max-batch", "16", "--max-step-tokens", "512", "--block-size", "16")):
                got, _, _ = go("--kv-type", kv, "--no-cache", *extra)
                check(got == ref, f"{kv} {' '.join(extra)}: results differ from --max-batch 1")
            cold, c0, _ = go("--kv-type", kv, "--cache-dir", cache, "--max-batch", "4")
            warm, c1, _ = go("--kv-type", kv, "--cache-dir", cache, "--max-batch", "16")
            check(cold == ref and warm == ref, f"{kv}: cold or warm cache results differ")
            check(c1["q0"] > c0["q0"], f"{kv}: the warm run restored nothing ({c0['q0']} then {c1['q0']})")

        # f16 and q8 entries never answer for each other
        shared = os.path.join(tmp, "shared")
        _, f0, _ = go("--kv-type", "f16", "--cache-dir", shared)
        _, f1, _ = go("--kv-type", "f16", "--cache-dir", shared)
        _, q0, _ = go("--kv-type", "q8", "--cache-dir", shared)
        _, q1, _ = go("--kv-type", "q8", "--cache-dir", shared)
        check(f1["q0"] > f0["q0"], "f16 warm run restored nothing")
        check(q0["q0"] == f0["q0"], f"the first q8 run restored f16 blocks: cached {q0['q0']} vs cold {f0['q0']}")
        check(q1["q0"] > q0["q0"], "q8 warm run restored nothing")
        st = kvb("cache", "stats", "--cache-dir", shared)
        check(st.returncode == 0 and "KV f16" in st.stdout and "KV q8" in st.stdout,
              f"cache stats does not name both KV types: {st.stdout} {st.stderr}")

        # the same --kv-mem holds more blocks
        blocks = {}
        for kv in ("f16", "q8", "q4"):
            _, _, err = go("--kv-type", kv, "--no-cache", "--kv-mem", "128M", "--max-batch", "2", quiet=False)
            m = re.search(r"(\d+) (\w+) KV blocks", err)
            check(m is not None and m.group(2) == kv, f"run summary does not name {kv}: {err}")
            blocks[kv] = int(m.group(1)) if m else 0
        check(blocks["f16"] > 0, "no f16 blocks")
        if blocks["f16"]:
            r8, r4 = blocks["q8"] / blocks["f16"], blocks["q4"] / blocks["f16"]
            print(f"128 MiB of KV: f16 {blocks['f16']}, q8 {blocks['q8']} ({r8:.2f}x), q4 {blocks['q4']} ({r4:.2f}x)")
            check(1.85 < r8 < 1.9 and 2.3 < r4 < 2.4, f"blocks per --kv-mem: q8 {r8:.2f}x, q4 {r4:.2f}x")
        with sqlite3.connect(os.path.join(tmp, "m.db")) as c:
            kinds = {json.loads(s)["kv_type"] for (s,) in c.execute("select settings from runs")}
        check(kinds == {"f16", "q8", "q4"}, f"metrics settings kv_type: {kinds}")

        p = kvb("run", "--model", MODEL, "--input", job, "--output", os.path.join(tmp, "x.jsonl"),
                "--kv-type", "q8", "--cache-lossy8")
        check(p.returncode == 2 and "--cache-lossy8" in p.stderr, f"lossy8 with q8: {p.returncode} {p.stderr}")
        p = kvb("run", "--model", MODEL, "--input", job, "--output", os.path.join(tmp, "x.jsonl"), "--kv-type", "q5")
        check(p.returncode == 2 and "--kv-type" in p.stderr and "q5" in p.stderr, f"--kv-type q5: {p.stderr}")
    return finish("KV type")


if __name__ == "__main__":
    sys.exit(main())
