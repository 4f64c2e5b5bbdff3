#!/usr/bin/env python3
"""`kvbatch run` on a prompt of megabytes without white space.

- At the default context it is refused as context_length_exceeded from its
  length alone: the run stays small (it used to tokenize it whole, ~48
  bytes of memory per byte of prompt) and the next line still runs; the
  same for a chat message;
- with a context large enough to tokenize it, SIGTERM in the middle of the
  tokenization ends the run at once with 143 (it used to finish the
  tokenization first: seconds), and no line is written for the request, so
  --resume runs it;
- SIGTERM while waiting for more of a job on a pipe (-i -) ends the run as
  interrupted, not as failed on a read error.

Run by ctest (KVB_BIN, KVB_MODEL); exits 77 to skip without them.
"""
import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

from kvbcheck import BIN, MODEL, check, finish, ready

BIG = 10_000_000


def run_rss(args):
    """Runs kvbatch, returns (exit code, peak RSS in MiB)."""
    proc = subprocess.Popen([BIN, "run", "--model", MODEL, "--quiet", "--no-cache"] + args,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        print(err.decode(errors="replace"))
    return proc.returncode, usage.ru_maxrss / 1024


def results(path):
    with open(path) as f:
        return {d["custom_id"]: d for d in map(json.loads, f)}


def test_refused(tmp):
    job = os.path.join(tmp, "big.jsonl")
    with open(job, "w") as f:
        f.write(json.dumps({"custom_id": "big", "prompt": "a" * BIG, "max_tokens": 2}) + "\n")
        f.write(json.dumps({"custom_id": "chat", "messages": [{"role": "user", "content": "b" * BIG}],
                            "max_tokens": 2}) + "\n")
        f.write(json.dumps({"custom_id": "ok", "prompt": "Hello", "max_tokens": 2, "temperature": 0}) + "\n")
    out = os.path.join(tmp, "big.out")
    # The baseline: the same command on a job of the short line alone, in
    # this run, on this build (a CUDA build maps more libraries than a CPU
    # one; what is measured is what the two long lines add).
    small = os.path.join(tmp, "small.jsonl")
    with open(small, "w") as f:
        f.write(json.dumps({"custom_id": "ok", "prompt": "Hello", "max_tokens": 2, "temperature": 0}) + "\n")
    rc0, rss0 = run_rss(["-i", small, "-o", os.path.join(tmp, "small.out"), "--metrics", os.path.join(tmp, "s.db")])
    check(rc0 == 0, f"baseline: exit {rc0}")
    t0 = time.time()
    rc, rss = run_rss(["-i", job, "-o", out, "--metrics", os.path.join(tmp, "big.db")])
    print(f"two 10 MB prompts at the default context: exit {rc}, {time.time() - t0:.1f} s, peak RSS {rss:.0f} MiB "
          f"(one short line: {rss0:.0f} MiB)")
    check(rc == 0, f"exit {rc}")
    res = results(out)
    for cid in ("big", "chat"):
        e = (res.get(cid, {}).get("error") or {})
        check(e.get("code") == "context_length_exceeded", f"{cid}: {e}")
    check(res.get("ok", {}).get("error") is None, "the short line did not run")
    # A line is held once as read and once decoded (2 x 10 MB) while it is
    # checked; tokenizing the prompt whole took another 450 MiB. 80 MiB is
    # four copies of a line, and a sixth of what tokenizing costs.
    check(rss - rss0 < 80, f"peak RSS {rss:.0f} MiB for prompts refused on their length, "
          f"{rss - rss0:.0f} MiB above the same run on a short line")


def stop_time(proc):
    """Sends SIGTERM, returns (exit code, seconds until the process ended)."""
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    return rc, time.time() - t0


def test_sigterm_while_tokenizing(tmp, idle_stop):
    job = os.path.join(tmp, "term.jsonl")
    with open(job, "w") as f:
        f.write(json.dumps({"custom_id": "big", "prompt": "ab" * (BIG // 2), "max_tokens": 2}) + "\n")
    out = os.path.join(tmp, "term.out")
    # Context enough that the length alone does not rule the prompt out
    # (the KV pool is address space: only what is used is touched).
    proc = subprocess.Popen([BIN, "run", "--model", MODEL, "--no-cache", "-i", job, "-o", out, "--metrics",
                             os.path.join(tmp, "term.db"), "--ctx", "131072", "--kv-mem", "3G"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = wait_started(proc, "tokenizing")
    time.sleep(0.8)
    rc, dt = stop_time(proc)
    err += proc.stderr.read()
    print(f"SIGTERM while tokenizing a 10 MB word: exit {rc} {dt:.2f} s after the signal "
          f"(an idle run: {idle_stop:.2f} s)")
    check(rc == 128 + signal.SIGTERM, f"exit {rc}: {err[-500:]!r}")
    # Relative to the same signal to an idle run on this machine, now (the
    # cost of ending a run: metrics, unmapping): finishing the tokenization
    # first took seconds more; noticing the flag takes milliseconds.
    check(dt < 2 * idle_stop + 0.5, f"the run took {dt:.2f} s to stop after SIGTERM, an idle one {idle_stop:.2f} s")
    with open(out) as f:
        check(f.read() == "", "a line was written for the interrupted request (--resume would skip it)")


def wait_started(proc, what):
    """Reads the run's stderr until set-up is done."""
    err = b""
    deadline = time.time() + 60
    while time.time() < deadline:
        ready_fds, _, _ = select.select([proc.stderr], [], [], 1)
        if ready_fds:
            line = proc.stderr.readline()
            if not line:
                break
            err += line
            if b"KV blocks" in line:  # set-up done: the next thing is reading and tokenizing lines
                return err
    check(False, f"{what}: the run did not start: {err!r}")
    return err


def test_sigterm_reading_pipe(tmp):
    db = os.path.join(tmp, "pipe.db")
    out = os.path.join(tmp, "pipe.out")
    proc = subprocess.Popen([BIN, "run", "--model", MODEL, "--no-cache", "-i", "-", "-o", out, "--metrics", db],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = wait_started(proc, "pipe")
    time.sleep(0.5)  # reading the job: nothing has come yet
    rc, dt = stop_time(proc)
    err += proc.stderr.read()
    proc.stdin.close()
    check(rc == 128 + signal.SIGTERM, f"pipe: exit {rc}")
    check(b"cannot read" not in err, f"pipe: a read error was reported: {err[-300:]!r}")
    with sqlite3.connect(db) as c:
        st = c.execute("select status from runs").fetchone()[0]
    check(st == "interrupted", f"pipe: the run is recorded as {st}")
    return dt


def main():
    if not ready():
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        test_refused(tmp)
        print(f"test_refused: {time.time() - t0:.1f} s")
        # The idle run's stop first: the baseline of the tokenizing one.
        idle_stop = test_sigterm_reading_pipe(tmp)
        print(f"test_sigterm_reading_pipe: stopped {idle_stop:.2f} s after the signal")
        t0 = time.time()
        test_sigterm_while_tokenizing(tmp, idle_stop)
        print(f"test_sigterm_while_tokenizing: {time.time() - t0:.1f} s")
    return finish("huge line and signal")


if __name__ == "__main__":
    sys.exit(main())
