#!/usr/bin/env python3
"""bench_types_llama.py — kvbatch and llama.cpp on the same files, one per
weight type: a random 2-layer llama (bench/random_llama_gguf.py: hidden 2048,
FFN 5632) made into Q4_K, Q2_K, Q3_K, Q5_K, IQ4_NL and IQ4_XS by llama.cpp's
own llama-quantize --pure. Run by scripts/bench-matmul.sh llama (a benchmark,
never a test; it needs a llama.cpp build outside the repository).

What is measured, per type and engine, prefill of a 512-token prompt and
decode of 128 tokens at batch 1:
  - tok/s as each program reports it (wall clock), best of the rounds;
  - tok per CPU second: the CPU time (user + sys, getrusage of the child) of
    a run minus that of a baseline run, which cancels loading and set-up:
      kvbatch  prefill: generate 512 prompt, 1 new  - generate 1 prompt, 1 new
               decode:  generate 512 prompt, 129 new - the 1-new run, / 128
      llama    prefill: llama-bench -p 512 -n 0  - llama-bench -p 1 -n 0
               decode:  llama-bench -p 0 -n 128  - llama-bench -p 1 -n 0, / 128
    (llama-bench with --no-warmup -r 1, so each test runs once), median of
    the rounds. On a shared machine a run's wall time depends on the share
    of the cores it was given; its CPU time much less. With threads > 1 a
    spinning pool counts too, so 1 thread is the clean comparison.
The engines alternate run by run, so drift in the machine's load meets both.
llama-bench runs with --repack 0: the repacked layouts live in an extra
buffer type that, on this build, also brings AMX kernels which fault where
the VM does not grant AMX; so llama.cpp runs its plain AVX-512 K/IQ kernels.
Usage: bench_types_llama.py LLAMA_CPP_BIN KVBATCH [threads=1] [rounds=3]
"""
import csv
import io
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TYPES = ["Q4_K", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS"]


def cpu_run(cmd, env=None):
    """(stdout + stderr text, CPU seconds of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (cmd[0], p.returncode, p.stderr.strip()[-400:]))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return p.stdout + p.stderr, cpu


def kvb_rate(text, what):
    for line in text.splitlines():
        if line.startswith(what + ":"):
            return float(line.rsplit("(", 1)[1].split()[0])
    raise RuntimeError("no %s line in kvbatch's output" % what)


def llama_rate(text):
    rows = list(csv.DictReader(io.StringIO(text[text.index("build_commit"):])))
    return float(rows[0]["avg_ts"])


def main():
    llama, kvb = sys.argv[1], sys.argv[2]
    th = sys.argv[3] if len(sys.argv) > 3 else "1"
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    env = dict(os.environ, LD_LIBRARY_PATH=llama + ":" + os.environ.get("LD_LIBRARY_PATH", ""))
    rng = random.Random(1)
    prompt = " ".join(str(rng.randrange(320)) for _ in range(512))
    with tempfile.TemporaryDirectory(prefix="kvb_bench_types_") as tmp:
        f16 = os.path.join(tmp, "f16.gguf")
        subprocess.run([sys.executable, os.path.join(HERE, "random_llama_gguf.py"), f16, "2"], check=True)
        for t in TYPES:
            cpu_run([os.path.join(llama, "llama-quantize"), "--pure", f16, os.path.join(tmp, t + ".gguf"), t, "1"],
                    env)
        os.remove(f16)
        wall = {t: {"kp": [], "kd": [], "lp": [], "ld": []} for t in TYPES}
        cpu = {t: {"kp": [], "kd": [], "lp": [], "ld": []} for t in TYPES}
        for r in range(rounds):
            for t in TYPES:
                m = os.path.join(tmp, t + ".gguf")
                gen = [kvb, "generate", "--model", m, "--temperature", "0", "--ignore-eos", "--threads", th,
                       "--print-ids"]
                _, c0 = cpu_run(gen + ["--prompt-ids", "1", "-n", "1"])
                o1, c1 = cpu_run(gen + ["--prompt-ids", prompt, "-n", "1"])
                o2, c2 = cpu_run(gen + ["--prompt-ids", prompt, "-n", "129"])
                wall[t]["kp"].append(kvb_rate(o1, "prefill"))
                wall[t]["kd"].append(kvb_rate(o2, "decode"))
                cpu[t]["kp"].append(512 / (c1 - c0))
                cpu[t]["kd"].append(128 / (c2 - c1))
                lb = [os.path.join(llama, "llama-bench"), "-m", m, "-t", th, "-r", "1", "--no-warmup",
                      "--repack", "0", "-o", "csv"]
                _, l0 = cpu_run(lb + ["-p", "1", "-n", "0"], env)
                o1, l1 = cpu_run(lb + ["-p", "512", "-n", "0"], env)
                o2, l2 = cpu_run(lb + ["-p", "0", "-n", "128"], env)
                wall[t]["lp"].append(llama_rate(o1))
                wall[t]["ld"].append(llama_rate(o2))
                cpu[t]["lp"].append(512 / (l1 - l0))
                cpu[t]["ld"].append(128 / (l2 - l0))
            print("round %d of %d done" % (r + 1, rounds), file=sys.stderr, flush=True)
    print("random llama 2 x (2048, FFN 5632), batch 1, %s thread(s), %d rounds; prefill 512 tokens, decode 128"
          % (th, rounds))
    for title, data, agg in (("tokens per CPU second (median)", cpu, statistics.median),
                             ("tokens per wall second as reported (best)", wall, max)):
        print("\n" + title)
        print("%-7s %11s %11s %8s   %11s %11s %8s" % ("type", "kvb pp", "llama pp", "ratio", "kvb tg", "llama tg",
                                                     "ratio"))
        for t in TYPES:
            kp, lp, kd, ld = (agg(data[t][k]) for k in ("kp", "lp", "kd", "ld"))
            print("%-7s %11.1f %11.1f %7.2fx   %11.1f %11.1f %7.2fx" % (t, kp, lp, kp / lp, kd, ld, kd / ld))
    return 0


if __name__ == "__main__":
    sys.exit(main())
