#!/usr/bin/env python3
"""moe-bench-cpu.py — decode tokens per CPU-second of kvbatch and llama.cpp on
one thread, for scripts/bench-moe.sh (a benchmark, not a test).

Why: on a machine shared by many processes the wall-clock rates of
bench-moe.sh swing several-fold from one run to the next (the same
llama-bench run measured 61 and 8.6 tok/s an hour apart), and a ratio of two
such figures says little. The CPU time a process is charged for its decode
steps moves much less with the load (only by what other processes take from
the caches and the memory bus), so on one thread tokens per CPU-second is the
comparison that survives a loaded machine. Each tool decodes the same
requests twice, once for 1 token and once for 1 + N tokens; the difference of
the two CPU times is N decode steps, without the load of the file, the
prefill or the first token (kvbatch starts once uncounted before: see main).
User CPU time only, for both tools: kvbatch's load copies the experts into
huge pages, and the system time of that (page zeroing, and the kernel's
memory compaction when free memory is fragmented) moves by seconds from one
start to the next, more than 32 decode steps at batch 1 take; the decode
steps of both tools are user-space arithmetic.

kvbatch: `kvbatch run` (batch B) or `kvbatch generate` (batch 1) in a child
process; its CPU time is the child's rusage. llama.cpp: one llama-server
with B slots (--no-repack: its repacking routes to AMX kernels that die on
this machine), B concurrent /completion requests of each length; its CPU
time is read from /proc/PID/stat before and after. Each pair runs REPS
times, interleaved, and the least CPU time of each length counts.

  moe-bench-cpu.py KVBATCH MODEL LLAMA_CPP_BIN|- B N PROMPT_IDS [REPS=2]
Prints one line per tool: "NAME B TOK_PER_CPU_S"."""
import concurrent.futures
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request


def child_cpu(cmd):
    """User CPU seconds of running cmd to its end (see the module's note)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime


def kvbatch_cpu(kvb, model, b, n, ids, tmp):
    if b == 1:
        return child_cpu([kvb, "generate", "--model", model, "--prompt-ids", " ".join(map(str, ids)), "-n", str(n),
                          "--temperature", "0", "--ignore-eos", "--threads", "1"])
    job = os.path.join(tmp, "job.jsonl")
    with open(job, "w") as f:
        for i in range(b):
            f.write(json.dumps({"custom_id": "r%d" % i, "prompt": "Job %04d:" % i, "max_tokens": n,
                                "temperature": 0, "ignore_eos": True}) + "\n")
    return child_cpu([kvb, "run", "--model", model, "-i", job, "-o", os.path.join(tmp, "out.jsonl"), "--threads", "1",
                      "--max-batch", str(b), "--quiet", "--no-cache"])


class Server:
    def __init__(self, bindir, model, b):
        self.port = 20000 + os.getpid() % 20000
        self.url = "http://127.0.0.1:%d" % self.port
        self.p = subprocess.Popen([os.path.join(bindir, "llama-server"), "-m", model, "--host", "127.0.0.1", "--port",
                                   str(self.port), "-t", "1", "-np", str(b), "-c", str(b * 128), "--no-repack",
                                   "--log-disable"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(1200):
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2)
                return
            except Exception:
                if self.p.poll() is not None:
                    break
                time.sleep(0.5)
        self.close()
        raise RuntimeError("llama-server did not come up")

    def cpu(self):
        f = open("/proc/%d/stat" % self.p.pid).read().rsplit(")", 1)[1].split()
        return int(f[11]) / os.sysconf("SC_CLK_TCK")  # utime

    def one(self, ids, n):
        body = {"prompt": ids, "n_predict": n, "ignore_eos": True, "temperature": 0, "cache_prompt": False}
        req = urllib.request.Request(self.url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        got = json.loads(urllib.request.urlopen(req, timeout=3600).read())["timings"]["predicted_n"]
        if got != n:
            raise RuntimeError("llama-server predicted %d tokens, asked for %d" % (got, n))

    def run(self, b, n, ids):
        # the prompts differ in their last token, as bench-moe.sh's do
        prompts = [ids[:-1] + [ids[-1] + i % 8] for i in range(b)]
        c0 = self.cpu()
        with concurrent.futures.ThreadPoolExecutor(b) as ex:
            list(ex.map(lambda p: self.one(p, n), prompts))
        return self.cpu() - c0

    def close(self):
        self.p.kill()
        self.p.wait()


def main():
    kvb, model, ll, b, n, ids = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    reps = int(sys.argv[7]) if len(sys.argv) > 7 else 2
    ids = [int(x) for x in ids.split()]
    k = {1: [], 1 + n: []}
    lc = {1: [], 1 + n: []}
    srv = Server(ll, model, b) if ll != "-" else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            # One uncounted start first: the first start after other
            # processes may find the page cache cold or the huge pages not
            # free (see above), a load cost of the 1-token run only.
            kvbatch_cpu(kvb, model, b, 1, ids, tmp)
            for _ in range(reps):
                for m in (1, 1 + n):
                    k[m].append(kvbatch_cpu(kvb, model, b, m, ids, tmp))
                    if srv:
                        lc[m].append(srv.run(b, m, ids))
    finally:
        if srv:
            srv.close()
    for name, c in (("kvbatch", k), ("llama.cpp", lc)):
        if c[1]:
            d = min(c[1 + n]) - min(c[1])
            print("%s %d %.2f" % (name, b, b * n / d if d > 0 else 0.0))


if __name__ == "__main__":
    main()
