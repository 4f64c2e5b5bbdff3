#!/usr/bin/env python3
"""End-to-end checks of the persistent prefix cache through the CLI.

- a job run cold then warm: the same results; the warm run's usage counts the
  restored tokens in cached_tokens, and the metrics rows split in-run and
  store reuse; `kvbatch report` shows both;
- `--no-cache` writes nothing and gives the same results;
- `kvbatch cache stats` lists the entries per model, `verify` passes on a
  sound cache, `gc --max-size` trims it and the trimmed cache still gives
  the same results, `clear --model` empties it;
- a cache directory that cannot be created turns the cache off with a
  warning; the job still succeeds.

Run by ctest (KVB_BIN, KVB_MODEL set); exits 77 when they are missing.
"""
import json
import os
import sqlite3
import subprocess
import sys
import tempfile

from kvbcheck import BIN, MODEL, check, finish, ready


def kvb(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True)


def run(job, out, db, *extra):
    p = kvb("run", "--model", MODEL, "--input", job, "--output", out, "--metrics", db, "--quiet", *extra)
    check(p.returncode == 0, f"run {out}: exit {p.returncode}: {p.stderr}")
    res = {}
    for line in open(out):
        d = json.loads(line)
        b = d["response"]["body"]
        res[d["custom_id"]] = (b["choices"][0]["message"]["content"],
                               b["usage"]["prompt_tokens_details"]["cached_tokens"])
    return res, p.stderr


def main():
    if not ready():
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cache")
        job = os.path.join(tmp, "job.jsonl")
        doc = ("The museum of the coastal town keeps a map from 1652, a ship's bell, and letters written by "
               "a lighthouse keeper to his sister over thirty winters. ") * 3
        with open(job, "w") as f:
            for i, q in enumerate(["Who wrote the letters?", "How old is the map?", "What is the bell from?"]):
                f.write(json.dumps({"custom_id": f"q{i}", "body": {"messages": [
                    {"role": "user", "content": doc + q}], "max_tokens": 8, "temperature": 0}}) + "\n")
        cold, _ = run(job, os.path.join(tmp, "cold.jsonl"), os.path.join(tmp, "m.db"), "--cache-dir", cache)
        warm, _ = run(job, os.path.join(tmp, "warm.jsonl"), os.path.join(tmp, "m.db"), "--cache-dir", cache)
        nocache, _ = run(job, os.path.join(tmp, "none.jsonl"), os.path.join(tmp, "n.db"), "--no-cache")
        texts = lambda r: {k: v[0] for k, v in r.items()}
        check(texts(cold) == texts(warm) == texts(nocache), "cold, warm and --no-cache results differ")
        check(warm["q0"][1] > cold["q0"][1], f"warm cached_tokens {warm['q0'][1]} not above cold {cold['q0'][1]}")
        with sqlite3.connect(os.path.join(tmp, "m.db")) as c:
            rows = c.execute("select run_id, sum(cached_tokens_run), sum(cached_tokens_store) from requests "
                             "group by run_id order by run_id").fetchall()
            runs = c.execute("select store_bytes_read, store_bytes_written from runs order by id").fetchall()
        check(len(rows) == 2 and rows[0][2] == 0 and rows[1][2] > 0, f"store reuse not recorded: {rows}")
        check(runs[0][1] > 0 and runs[1][0] > 0, f"store bytes not recorded: {runs}")
        # --activations 16 computes other bits than the 8-bit runs above: on the
        # same cache its first run restores nothing of theirs, its second
        # restores its own, and both give the --no-cache 16-bit texts.
        a16 = ("--activations", "16")
        adb = os.path.join(tmp, "a16.db")
        a16_cold, _ = run(job, os.path.join(tmp, "a16-cold.jsonl"), adb, "--cache-dir", cache, *a16)
        a16_warm, _ = run(job, os.path.join(tmp, "a16-warm.jsonl"), adb, "--cache-dir", cache, *a16)
        a16_none, _ = run(job, os.path.join(tmp, "a16-none.jsonl"), os.path.join(tmp, "a16n.db"), "--no-cache", *a16)
        check(texts(a16_cold) == texts(a16_warm) == texts(a16_none),
              "--activations 16: cold, warm and --no-cache results differ")
        with sqlite3.connect(adb) as c:
            store = [r[0] for r in c.execute("select sum(cached_tokens_store) from requests group by run_id "
                                             "order by run_id")]
        check(len(store) == 2 and store[0] == 0 and store[1] > 0,
              f"--activations 16 on a cache written at 8 bits: tokens restored per run {store} "
              "(the first must restore none of the 8-bit blocks, the second its own)")
        rep = kvb("report", os.path.join(tmp, "m.db"))
        check(rep.returncode == 0 and "persistent store" in rep.stdout, "report lacks the store hit rate")

        st = kvb("cache", "stats", "--cache-dir", cache)
        check(st.returncode == 0 and "blocks" in st.stdout, f"cache stats: {st.returncode} {st.stderr}")
        print(st.stdout)
        v = kvb("cache", "verify", "--cache-dir", cache)
        check(v.returncode == 0, f"cache verify on a sound cache: exit {v.returncode}: {v.stdout} {v.stderr}")
        gc = kvb("cache", "gc", "--max-size", "1M", "--cache-dir", cache)
        check(gc.returncode == 0, f"cache gc: {gc.stderr}")
        trimmed, _ = run(job, os.path.join(tmp, "trim.jsonl"), os.path.join(tmp, "m.db"), "--cache-dir", cache)
        check(texts(trimmed) == texts(cold), "results differ after gc")
        cl = kvb("cache", "clear", "--model", MODEL, "--cache-dir", cache)
        check(cl.returncode == 0, f"cache clear: {cl.stderr}")
        st2 = kvb("cache", "stats", "--cache-dir", cache)
        check(" 0 blocks" in st2.stdout or "entries          0" in st2.stdout, f"cache not empty after clear: {st2.stdout}")
        bad = kvb("cache", "frobnicate")
        check(bad.returncode == 2, f"unknown cache verb: exit {bad.returncode}")

        # A write buffer too small for the blocks of one step: the run says
        # blocks were not stored and which option helps; results unchanged.
        p = kvb("run", "--model", MODEL, "--input", job, "--output", os.path.join(tmp, "buf.jsonl"), "--metrics",
                os.path.join(tmp, "buf.db"), "--cache-dir", os.path.join(tmp, "small"), "--cache-buffer", "1K")
        check(p.returncode == 0 and "not stored" in p.stderr and "--cache-buffer" in p.stderr,
              f"a 1K cache buffer: exit {p.returncode}, no word of blocks not stored: {p.stderr}")
        res = {json.loads(l)["custom_id"]: json.loads(l)["response"]["body"]["choices"][0]["message"]["content"]
               for l in open(os.path.join(tmp, "buf.jsonl"))}
        check(res == texts(cold), "results differ with a small cache buffer")
        bad = kvb("run", "--model", MODEL, "--input", job, "--output", os.path.join(tmp, "x.jsonl"),
                  "--cache-buffer", "lots")
        check(bad.returncode == 2 and "--cache-buffer" in bad.stderr, f"bad --cache-buffer: exit {bad.returncode}")

        # A pool of four blocks, one sequence preempting another whose newest
        # block is still waiting to go to the store: the spill is handed over
        # rather than the job failing with "KV pool too small" (it did), and
        # the texts are those of the run without the cache.
        tight = os.path.join(tmp, "tight.jsonl")
        with open(tight, "w") as f:
            f.write(json.dumps({"custom_id": "Y", "prompt": " ".join(["alpha"] * 13), "max_tokens": 45,
                                "temperature": 0}) + "\n")
            f.write(json.dumps({"custom_id": "X", "prompt": " ".join(["beta"] * 50), "max_tokens": 5,
                                "temperature": 0}) + "\n")
        outs = []
        for extra in (["--cache-dir", os.path.join(tmp, "tight-cache")], ["--no-cache"]):
            out = os.path.join(tmp, f"tight{len(outs)}.out")
            p = kvb("run", "--model", MODEL, "--input", tight, "--output", out, "--metrics", os.path.join(tmp, "t.db"),
                    "--quiet", "--ctx", "64", "--kv-mem", "1500K", "--max-batch", "2", "--max-step-tokens", "16", *extra)
            check(p.returncode == 0, f"tight pool {extra[0]}: exit {p.returncode}: {p.stderr}")
            outs.append(sorted(open(out).read().splitlines()) if p.returncode == 0 else [])
        strip = lambda ls: [json.loads(l)["response"]["body"]["choices"][0]["text"] for l in ls]
        check(len(outs[0]) == 2 and strip(outs[0]) == strip(outs[1]), "tight pool: results differ with the cache")

        # A cache that cannot be opened is a warning, not a failure.
        blocker = os.path.join(tmp, "file")
        open(blocker, "w").close()
        res, err = run(job, os.path.join(tmp, "blocked.jsonl"), os.path.join(tmp, "b.db"),
                       "--cache-dir", os.path.join(blocker, "sub"))
        check(texts(res) == texts(cold), "results differ with the cache unavailable")
    return finish("cache")


if __name__ == "__main__":
    sys.exit(main())
