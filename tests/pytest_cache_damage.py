#!/usr/bin/env python3
"""A persistent cache whose file structure is damaged, end to end through the
CLI (test_pstore_damage sweeps every page and many truncations through the
API; this checks what a user sees):

- a job runs cold into a cache; copies of that cache are then truncated (to
  half, to three pages) or have a page overwritten (the main database's root
  page with random bytes, a meta page with zeros);
- `kvbatch run` on each copy exits 0 with the same results as a run without a
  cache, says the file is damaged, where it moved it and what to do, and
  leaves it in DIR/damaged-*/; a second run on the same directory is warm
  from the fresh cache, with no such message;
- `kvbatch cache verify` on a damaged copy exits 1 naming the damage, and
  moves nothing; `cache stats` exits 1; `cache clear` moves it aside and
  exits 0.

Run by ctest (KVB_BIN, KVB_MODEL set); exits 77 when they are missing.
"""
import glob
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

from kvbcheck import BIN, MODEL, check, finish, ready

PAGE = 4096


def kvb(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True)


def run(job, out, db, *extra):
    p = kvb("run", "--model", MODEL, "--input", job, "--output", out, "--metrics", db, "--quiet", *extra)
    check(p.returncode == 0, f"run {out}: exit {p.returncode}: {p.stderr}")
    res = {}
    if p.returncode == 0:
        for line in open(out):
            d = json.loads(line)
            b = d["response"]["body"]
            res[d["custom_id"]] = (b["choices"][0]["message"]["content"],
                                   b["usage"]["prompt_tokens_details"]["cached_tokens"])
    return res, p


def main_root(data):
    """The main database's root page, from the newer meta page (LMDB 0.9,
    64-bit: meta at byte 16 of pages 0 and 1; main record at +72, root at +40
    of it; txnid at +128)."""
    metas = []
    for pg in (0, 1):
        base = pg * PAGE + 16
        txnid, = struct.unpack_from("<Q", data, base + 128)
        root, = struct.unpack_from("<Q", data, base + 72 + 40)
        metas.append((txnid, root))
    return max(metas)[1]


def damaged_copies(src, tmp):
    data = open(os.path.join(src, "data.mdb"), "rb").read()
    root = main_root(data)
    rnd = random.Random(7)
    cases = {
        "half": data[: len(data) // 2 // PAGE * PAGE],
        "three-pages": data[: 3 * PAGE],
        "root-random": data[: root * PAGE] + bytes(rnd.randrange(256) for _ in range(PAGE)) + data[(root + 1) * PAGE:],
        "meta-zeros": data[:PAGE] + bytes(PAGE) + data[2 * PAGE:],
    }
    out = {}
    for name, img in cases.items():
        d = os.path.join(tmp, "cache-" + name)
        os.makedirs(d)
        with open(os.path.join(d, "data.mdb"), "wb") as f:
            f.write(img)
        out[name] = d
    return out


def main():
    if not ready():
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.jsonl")
        doc = ("The harbour master's log records every ship that anchored in the bay, its cargo, its crew and "
               "the weather of the day it left. ") * 3
        with open(job, "w") as f:
            for i, q in enumerate(["Which ships anchored?", "What cargo came in?", "What was the weather?"]):
                f.write(json.dumps({"custom_id": f"q{i}", "body": {"messages": [
                    {"role": "user", "content": doc + q}], "max_tokens": 8, "temperature": 0}}) + "\n")
        texts = lambda r: {k: v[0] for k, v in r.items()}
        ref, _ = run(job, os.path.join(tmp, "none.jsonl"), os.path.join(tmp, "n.db"), "--no-cache")
        cache = os.path.join(tmp, "cache")
        cold, _ = run(job, os.path.join(tmp, "cold.jsonl"), os.path.join(tmp, "c.db"), "--cache-dir", cache)
        check(texts(cold) == texts(ref), "cold run differs from the run without a cache")
        v = kvb("cache", "verify", "--cache-dir", cache)
        check(v.returncode == 0 and "structure: sound" in v.stdout,
              f"verify of the sound cache: exit {v.returncode}: {v.stdout} {v.stderr}")

        for name, d in damaged_copies(cache, tmp).items():
            # verify first: it must report and leave the file where it is
            ver = kvb("cache", "verify", "--cache-dir", d)
            check(ver.returncode == 1 and "damaged" in ver.stdout and "kvbatch run" in ver.stdout,
                  f"{name}: verify of a damaged cache: exit {ver.returncode}: {ver.stdout} {ver.stderr}")
            check(ver.returncode >= 0, f"{name}: verify died of signal {-ver.returncode}")
            check(not glob.glob(os.path.join(d, "damaged-*")), f"{name}: verify moved the file")
            st = kvb("cache", "stats", "--cache-dir", d)
            check(st.returncode == 1 and "damaged" in st.stderr, f"{name}: stats: exit {st.returncode}: {st.stderr}")
            spare = d + "-clear"
            shutil.copytree(d, spare)

            res, p = run(job, os.path.join(tmp, f"{name}.jsonl"), os.path.join(tmp, f"{name}.db"), "--cache-dir", d)
            check(p.returncode >= 0, f"{name}: run died of signal {-p.returncode}")
            check(texts(res) == texts(ref), f"{name}: results differ from the run without a cache")
            check("is damaged" in p.stderr and "Moved it to" in p.stderr and "Remove" in p.stderr,
                  f"{name}: no message saying the file was damaged and moved: {p.stderr}")
            check(glob.glob(os.path.join(d, "damaged-*", "data.mdb")), f"{name}: no damaged-*/data.mdb")
            again, p2 = run(job, os.path.join(tmp, f"{name}-2.jsonl"), os.path.join(tmp, f"{name}.db"),
                            "--cache-dir", d)
            check(texts(again) == texts(ref), f"{name}: second run differs")
            check("damaged" not in p2.stderr, f"{name}: second run still complains: {p2.stderr}")
            check(again and again["q0"][1] > 0, f"{name}: second run not warm from the fresh cache: {again}")

            cl = kvb("cache", "clear", "--cache-dir", spare)
            check(cl.returncode == 0 and "Moved it to" in cl.stderr,
                  f"{name}: clear of a damaged cache: exit {cl.returncode}: {cl.stdout} {cl.stderr}")
        print("damaged caches: runs exit 0 with the results of a run without a cache; verify and stats exit 1")
    return finish("cache damage")


if __name__ == "__main__":
    sys.exit(main())
