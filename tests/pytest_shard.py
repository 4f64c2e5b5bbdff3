#!/usr/bin/env python3
"""End-to-end checks of `kvbatch run --shard` on the real default model.

A RAG-shaped job (documents, several questions each, shuffled, plus a bad
line and a repeated custom_id) is run whole, then as two and as three
shards: every line is answered by exactly one shard, each document's
questions by one shard, the texts are those of the whole run (greedy), the
bad line and the duplicate are reported once, and `kvbatch report` over the
shards' databases gives the whole run's counts (and refuses a run given
twice, a shard twice, or shards of different splits); `--shard auto` reads a
Slurm job array's variables; pipes and bad values are refused; --ctx does not
change the plan.

Run by ctest (KVB_BIN, KVB_MODEL set); exits 77 to skip without them.
"""
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile

from kvbcheck import BIN, MODEL, check, finish, ready


def run(job, out, *extra, env=None):
    p = subprocess.run([BIN, "run", "--model", MODEL, "--input", job, "--output", out,
                        "--metrics", out + ".db", "--no-cache", *extra],
                       capture_output=True, text=True, env=env)
    return p


def results(path):
    got = {}
    for line in open(path):
        d = json.loads(line)
        body = (d.get("response") or {}).get("body") or {}
        text = body["choices"][0]["message"]["content"] if body.get("choices") else None
        got.setdefault(str(d["custom_id"]), []).append((text, json.dumps(d.get("error"), sort_keys=True)))
    return got


def main():
    if not ready():
        return 77
    docs = [f"Document {d}. " + " ".join(f"The {w} of district {d} was rebuilt in {1800 + d * 7 + i}."
                                          for i, w in enumerate(["harbor", "library", "bridge", "mill", "school"]))
            for d in range(6)]
    lines = []
    for d in range(6):
        for q in range(3):
            lines.append(json.dumps({"custom_id": f"d{d}q{q}", "body": {"messages": [
                {"role": "system", "content": "Answer from the document in one short sentence."},
                {"role": "user", "content": docs[d] + f" Question {q}: what was rebuilt first?"}],
                "max_tokens": 6, "temperature": 0}}))
    random.Random(5).shuffle(lines)
    lines.insert(4, "{not json")
    lines.append(json.dumps({"custom_id": "d2q1", "prompt": "a repeated custom_id", "max_tokens": 2}))
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.jsonl")
        with open(job, "w") as f:
            f.write("\n".join(lines) + "\n")
        whole = os.path.join(tmp, "whole.jsonl")
        p = run(job, whole)
        check(p.returncode == 0, f"whole run: exit {p.returncode}: {p.stderr}")
        ref = results(whole)
        for n in (2, 3):
            outs = []
            for i in range(n):
                out = os.path.join(tmp, f"s{i}of{n}.jsonl")
                p = run(job, out, "--shard", f"{i}/{n}")
                check(p.returncode == 0, f"shard {i}/{n}: exit {p.returncode}: {p.stderr}")
                check(f"shard {i} of {n}" in p.stderr, f"shard {i}/{n}: no word of the shard: {p.stderr}")
                outs.append(results(out))
            merged = {}
            for o in outs:
                for k, v in o.items():
                    merged.setdefault(k, []).extend(v)
            check(sorted(merged) == sorted(ref), f"{n} shards answer other ids: {sorted(merged)} vs {sorted(ref)}")
            check(all(len(merged[k]) == len(ref[k]) for k in ref), f"{n} shards: a line answered twice or never")
            texts = lambda r: {k: sorted(str(t) for t, _ in v) for k, v in r.items()}
            check(texts(merged) == texts(ref), f"{n} shards: texts differ from the whole run")
            for d in range(6):
                where = {i for i, o in enumerate(outs) for q in range(3) if f"d{d}q{q}" in o}
                check(len(where) == 1, f"{n} shards: document {d}'s questions in shards {where}")
            sizes = [sum(len(v) for v in o.values()) for o in outs]
            print(f"{n} shards: {sizes} result lines; each document's questions in one shard")
            check(min(sizes) > 0, f"{n} shards: an empty shard {sizes}")
            # One report over the shards' metrics: the whole run's counts.
            rep = subprocess.run([BIN, "report", *[os.path.join(tmp, f"s{i}of{n}.jsonl.db") for i in range(n)]],
                                 capture_output=True, text=True)
            whole_rep = subprocess.run([BIN, "report", whole + ".db"], capture_output=True, text=True)
            line = lambda out, key: next((l for l in out.splitlines() if l.startswith(key)), None)
            check(rep.returncode == 0 and line(rep.stdout, "requests") == line(whole_rep.stdout, "requests")
                  and line(rep.stdout, "tokens") == line(whole_rep.stdout, "tokens"),
                  f"report over {n} shards: {rep.returncode} {rep.stderr}\n{rep.stdout}\nvs\n{whole_rep.stdout}")
        # auto: a Slurm array 3-4 (this task is index 1 of 2)
        env = dict(os.environ, SLURM_ARRAY_TASK_ID="4", SLURM_ARRAY_TASK_COUNT="2", SLURM_ARRAY_TASK_MIN="3")
        auto = os.path.join(tmp, "auto.jsonl")
        p = run(job, auto, "--shard", "auto", env=env)
        check(p.returncode == 0 and results(auto) == results(os.path.join(tmp, "s1of2.jsonl")),
              f"--shard auto under a Slurm array is not shard 1/2: {p.stderr}")
        for src in ("-", "/dev/stdin"):  # a pipe: the plan would eat what the run reads
            p = subprocess.run([BIN, "run", "--model", MODEL, "--input", src, "--output",
                                os.path.join(tmp, "x.jsonl"), "--shard", "0/2"],
                               input="\n".join(lines) + "\n", capture_output=True, text=True)
            check(p.returncode == 1 and "regular file" in p.stderr,
                  f"--shard over a pipe ({src}): exit {p.returncode}: {p.stderr}")
        # The plan does not depend on --ctx (a prompt too long for one shard's
        # context is still placed by its prefix): same plan hash in both runs.
        ctx = os.path.join(tmp, "ctx.jsonl")
        p = run(job, ctx, "--shard", "0/2", "--ctx", "64")
        check(p.returncode == 0, f"--ctx 64 shard: exit {p.returncode}: {p.stderr}")
        plan = lambda db: sqlite3.connect(db).execute(
            "select json_extract(settings, '$.shard_plan') from runs order by id desc").fetchone()[0]
        check(plan(ctx + ".db") == plan(os.path.join(tmp, "s0of2.jsonl.db")) and plan(ctx + ".db") != "0" * 16,
              f"--ctx changed the plan: {plan(ctx + '.db')} vs {plan(os.path.join(tmp, 's0of2.jsonl.db'))}")
        # The combined report refuses wrong sums and warns about partial ones.
        db = lambda i, n: os.path.join(tmp, f"s{i}of{n}.jsonl.db")
        for dbs, want in (([db(0, 2), db(0, 2)], "same run"), ([db(0, 2), db(1, 3)], "different splits"),
                          ([db(0, 2), ctx + ".db"], "both shard 0 of 2")):
            rep = subprocess.run([BIN, "report", *dbs], capture_output=True, text=True)
            check(rep.returncode == 1 and want in rep.stderr, f"report {dbs}: exit {rep.returncode}: {rep.stderr}")
        rep = subprocess.run([BIN, "report", db(0, 3), db(2, 3)], capture_output=True, text=True)
        check(rep.returncode == 0 and "warning: 2 of 3 shards given" in rep.stdout,
              f"report of 2 of 3 shards: exit {rep.returncode}: {rep.stderr}{rep.stdout}")
        p = run(job, os.path.join(tmp, "y.jsonl"), "--shard", "2/2")
        check(p.returncode == 2 and "0..1" in p.stderr, f"--shard 2/2: exit {p.returncode}: {p.stderr}")
    return finish("shard")


if __name__ == "__main__":
    sys.exit(main())
