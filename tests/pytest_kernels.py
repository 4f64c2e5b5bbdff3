#!/usr/bin/env python3
"""End-to-end checks of `--kernels` (issue 26) on the real default model.

- every kernel this CPU runs is accepted, a name that is none is a usage
  error (exit 2), and so is a kernel the CPU cannot run: one it lacks, or
  AMX when the kernel refuses the tile state (KVBATCH_AMX_DENY=1 acts as a
  refusal), with the reason named;
- the AMX kernels give the AVX-512 kernels' logits bit for bit, whole
  prompts (tile path) and in chunks of 1 and 3 tokens (the decode path on
  packed weights), and the same greedy tokens;
- KVBATCH_KERNELS picks what auto means (the test suite forces kernels with
  it), and --kernels overrides it;
- `kvbatch run --kernels K` records K in the run's settings, and the AMX and
  AVX-512 runs write the same results;
- `--activations 8|16`: anything else is a usage error; 16 gives other logits
  than 8, the same bits whatever the chunking and under amx as under avx512
  (two 8-bit products added), and the run's settings name it.

Run by ctest (KVB_BIN, KVB_MODEL, KVB_SOURCE_DIR set); exits 77 to skip when
the model or binary is missing, and checks only what this CPU can run.
"""
import json
import os
import sqlite3
import subprocess
import sys
import tempfile

from kvbcheck import BIN, MODEL, check, finish, ready

PROMPT = ("The history of the printing press begins in the fifteenth century, when movable type changed how "
          "knowledge travelled across Europe. Printers, scholars and merchants built networks that carried")


def kv(args, env=None, **kw):
    e = dict(os.environ)
    e.pop("KVBATCH_KERNELS", None)  # each case says what it wants
    e.update(env or {})
    return subprocess.run([BIN] + args, capture_output=True, text=True, env=e, **kw)


def available(k):
    p = kv(["generate", "--model", MODEL, "--kernels", k, "-p", "a", "-n", "1", "--temperature", "0", "-q"])
    return p.returncode == 0


def logits(tmp, k, batch, env=None, bits=8):
    out = os.path.join(tmp, f"logits-{k}-{batch}-{bits}.f32")
    p = kv(["logits", "--model", MODEL, "--kernels", k, "--batch", str(batch), "-p", PROMPT, "-o", out, "-t", "2",
            "--activations", str(bits)], env=env)
    check(p.returncode == 0, f"logits --kernels {k} --batch {batch} --activations {bits}: exit {p.returncode}: "
                             f"{p.stderr.strip()}")
    return open(out, "rb").read() if p.returncode == 0 else None


def main():
    if not ready():
        return 77
    kernels = [k for k in ("amx", "avx512", "avx2", "scalar") if available(k)]
    print("kernels this CPU runs:", " ".join(kernels))
    check("scalar" in kernels, "--kernels scalar refused")

    # bad names and kernels this CPU cannot run: usage errors that say why
    p = kv(["generate", "--model", MODEL, "--kernels", "avx1024", "-p", "a"])
    check(p.returncode == 2 and "auto, amx, avx512, avx2 or scalar" in p.stderr,
          f"--kernels avx1024: exit {p.returncode}, {p.stderr.strip()!r}")
    for cmd in (["run", "-i", "x.jsonl", "-o", "y.jsonl"], ["logits", "-p", "a", "-o", "/dev/null"], ["generate", "-p", "a"]):
        p = kv(cmd[:1] + ["--model", MODEL, "--kernels", "amx"] + cmd[1:], env={"KVBATCH_AMX_DENY": "1"})
        check(p.returncode == 2 and "amx kernels cannot run here" in p.stderr,
              f"{cmd[0]} --kernels amx with AMX refused: exit {p.returncode}, {p.stderr.strip()!r}")
    for k in ("amx", "avx512", "avx2"):
        if k not in kernels:
            p = kv(["generate", "--model", MODEL, "--kernels", k, "-p", "a"])
            check(p.returncode == 2 and "cannot run here" in p.stderr, f"--kernels {k} (not here): exit {p.returncode}")
    p = kv(["generate", "--model", MODEL, "-p", "a", "-n", "1"], env={"KVBATCH_KERNELS": "avx9"})
    check(p.returncode != 0 and "KVBATCH_KERNELS='avx9'" in p.stderr, f"KVBATCH_KERNELS=avx9: {p.stderr.strip()!r}")
    if "amx" in kernels:
        p = kv(["generate", "--model", MODEL, "-p", "a", "-n", "1"], env={"KVBATCH_AMX_DENY": "1"})
        check(p.returncode == 0 and "avx512 kernels" in p.stderr, "auto with AMX refused does not fall back to avx512")

    # what auto means: KVBATCH_KERNELS, overridden by --kernels
    for k in kernels:
        p = kv(["generate", "--model", MODEL, "-p", "a", "-n", "1"], env={"KVBATCH_KERNELS": k})
        check(p.returncode == 0 and f"{k} kernels" in p.stderr, f"KVBATCH_KERNELS={k}: {p.stderr.strip()!r}")
    p = kv(["generate", "--model", MODEL, "-p", "a", "-n", "1", "--kernels", "scalar"], env={"KVBATCH_KERNELS": kernels[0]})
    check(p.returncode == 0 and "scalar kernels" in p.stderr, "--kernels does not override KVBATCH_KERNELS")

    # --activations: 8 or 16, nothing else; 16 is other bits than 8, the same whatever the chunking
    for bad in ("12", "int8", ""):
        p = kv(["generate", "--model", MODEL, "-p", "a", "-n", "1", "--activations", bad])
        check(p.returncode == 2 and "--activations expects 8 or 16" in p.stderr,
              f"--activations {bad!r}: exit {p.returncode}, {p.stderr.strip()!r}")
    p = kv(["generate", "--model", MODEL, "-p", "a", "-n", "1", "--activations", "16"])
    check(p.returncode == 0 and "16-bit activations" in p.stderr, f"--activations 16: {p.stderr.strip()!r}")
    with tempfile.TemporaryDirectory() as tmp:
        k = kernels[0]
        a8, a16 = logits(tmp, k, 512), logits(tmp, k, 512, bits=16)
        check(a8 is not None and a16 is not None and a8 != a16, f"{k}: --activations 16 gives the 8-bit logits")
        for batch in (3, 1):
            check(logits(tmp, k, batch, bits=16) == a16, f"{k} --activations 16: --batch {batch} changes the logits")

    if "amx" in kernels and "avx512" in kernels:
        with tempfile.TemporaryDirectory() as tmp:
            ref = logits(tmp, "avx512", 512)
            for batch in (512, 3, 1):
                got = logits(tmp, "amx", batch)
                check(ref is not None and got == ref, f"amx logits (--batch {batch}) differ from avx512's")
            # 16-bit activations are two 8-bit products added: amx is avx512's bits there too
            ref16 = logits(tmp, "avx512", 512, bits=16)
            check(ref16 is not None and logits(tmp, "amx", 512, bits=16) == ref16,
                  "amx --activations 16 logits differ from avx512's")
            ids = {}
            for k in ("avx512", "amx"):
                p = kv(["generate", "--model", MODEL, "--kernels", k, "-p", PROMPT, "-n", "24", "--temperature", "0",
                        "--ignore-eos", "--print-ids", "-q"])
                check(p.returncode == 0, f"generate --kernels {k}: {p.stderr.strip()}")
                ids[k] = p.stdout
            check(ids["amx"] == ids["avx512"] and ids["amx"].strip(), "amx and avx512 greedy tokens differ")

            # a small job: the same results, the kernel in the run's settings
            job = os.path.join(tmp, "job.jsonl")
            with open(job, "w") as f:
                for i in range(6):
                    f.write(json.dumps({"custom_id": f"r{i}", "body": {
                        "messages": [{"role": "system", "content": PROMPT},
                                     {"role": "user", "content": f"Question {i}: what happened next?"}],
                        "max_tokens": 12, "temperature": 0}}) + "\n")
            res = {}
            for k, bits in (("avx512", 8), ("amx", 8), ("amx", 16)):
                out, db = os.path.join(tmp, f"out-{k}-{bits}.jsonl"), os.path.join(tmp, f"m-{k}-{bits}.db")
                p = kv(["run", "--model", MODEL, "--kernels", k, "-i", job, "-o", out, "--metrics", db, "--quiet",
                        "--no-cache", "-t", "2"] + (["--activations", "16"] if bits == 16 else []))
                check(p.returncode == 0, f"run --kernels {k}: exit {p.returncode}: {p.stderr.strip()}")
                if p.returncode:
                    continue
                settings = json.loads(sqlite3.connect(db).execute("select settings from runs").fetchone()[0])
                check(settings.get("kernels") == k and settings.get("activations") == f"{bits}-bit",
                      f"run --kernels {k}, {bits}-bit activations: settings say {settings}")
                if bits == 16:
                    continue
                lines = [json.loads(x) for x in open(out)]
                res[k] = sorted((d["custom_id"], d["response"]["body"]["choices"][0]["message"]["content"])
                                for d in lines)
            check(len(res) == 2 and res["amx"] == res["avx512"], "run: amx and avx512 results differ")
    return finish("kernels")


if __name__ == "__main__":
    sys.exit(main())
