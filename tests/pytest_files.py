#!/usr/bin/env python3
"""The files `kvbatch run` opens: none is destroyed by being named twice or
by a run that cannot start.

- --output naming the input (same path, a symlink, a hard link, standard
  input redirected from it), the model, or the metrics database and its
  -wal/-shm/-journal files, and --metrics naming the input: exit 2, every
  file as it was, nothing created;
- `-o -` writes the results to standard output and nothing else there;
  `--resume -o -` is refused;
- a run whose metrics database cannot be opened (not SQLite, a missing
  directory) exits 1 and leaves the previous results byte for byte, also
  with --resume and a torn last line;
- --resume onto a device or a FIFO is refused at once (it used to spin at
  100 % CPU on /dev/full); without --resume they stay usable outputs.

Run by ctest (KVB_BIN, KVB_MODEL); exits 77 to skip without them.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from kvbcheck import BIN, MODEL, check, finish, ready


def run(args, timeout=60, **kw):
    return subprocess.run([BIN, "run", "--model", MODEL, "--quiet", "--no-cache"] + args, capture_output=True,
                          timeout=timeout, **kw)


def job(path, n=2):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"custom_id": f"r{i}", "prompt": f"Count to {i + 2}:", "max_tokens": 2,
                                "temperature": 0}) + "\n")
    with open(path, "rb") as f:
        return f.read()


def content(path):
    with open(path, "rb") as f:
        return f.read()


def refused(what, p, *files):
    """Exit 2 with a message, and each (path, bytes) in files unchanged."""
    err = p.stderr.decode(errors="replace")
    check(p.returncode == 2, f"{what}: exit {p.returncode}, expected 2: {err}")
    check("kvbatch run:" in err and len(err) < 1000, f"{what}: no clear message: {err!r}")
    for path, data in files:
        check(content(path) == data, f"{what}: {path} was changed")


def test_same_files(tmp):
    inp = os.path.join(tmp, "jobs.jsonl")
    data = job(inp)
    db = os.path.join(tmp, "m.db")
    refused("-o = -i", run(["-i", inp, "-o", inp, "--metrics", db]), (inp, data))
    refused("-o = -i with --resume", run(["-i", inp, "-o", inp, "--metrics", db, "--resume"]), (inp, data))
    link = os.path.join(tmp, "link.jsonl")
    os.symlink(inp, link)
    refused("-o a symlink to -i", run(["-i", inp, "-o", link, "--metrics", db]), (inp, data))
    refused("-i a symlink to -o", run(["-i", link, "-o", inp, "--metrics", db]), (inp, data))
    hard = os.path.join(tmp, "hard.jsonl")
    os.link(inp, hard)
    refused("-o a hard link to -i", run(["-i", inp, "-o", hard, "--metrics", db]), (inp, data))
    os.makedirs(os.path.join(tmp, "sub"))
    refused("-o sub/../x = -i x", run(["-i", "jobs.jsonl", "-o", "./sub/../jobs.jsonl", "--metrics", db], cwd=tmp),
            (inp, data))
    with open(inp, "rb") as stdin:
        refused("-i - from the output", run(["-i", "-", "-o", inp, "--metrics", db], stdin=stdin), (inp, data))
    with open(inp, "ab") as stdout:
        p = subprocess.run([BIN, "run", "--model", MODEL, "--quiet", "--no-cache", "-i", inp, "-o", "-",
                            "--metrics", db], stdout=stdout, stderr=subprocess.PIPE, timeout=60)
    refused("-o - appending to the input", p, (inp, data))
    refused("--metrics = -i", run(["-i", inp, "-o", os.path.join(tmp, "o.jsonl"), "--metrics", inp]), (inp, data))
    refused("--metrics a link to -i", run(["-i", inp, "-o", os.path.join(tmp, "o.jsonl"), "--metrics", link]),
            (inp, data))
    # The metrics database and its companions, existing or not yet.
    out = os.path.join(tmp, "out.jsonl")
    refused("-o = --metrics (neither there yet)", run(["-i", inp, "-o", out, "--metrics", out]), (inp, data))
    check(not os.path.exists(out), "-o = --metrics: the file was created")
    for sib in ("-wal", "-shm", "-journal"):
        refused(f"-o = --metrics{sib}", run(["-i", inp, "-o", db + sib, "--metrics", db]), (inp, data))
        check(not os.path.exists(db + sib), f"-o = --metrics{sib}: created")
    p = run(["-i", inp, "-o", out, "--metrics", db])
    check(p.returncode == 0, f"a plain run: exit {p.returncode}: {p.stderr!r}")
    res, dbdata = content(out), content(db)
    refused("-o = an existing --metrics", run(["-i", inp, "-o", db, "--metrics", db]), (db, dbdata), (inp, data))
    refused("--metrics = an existing -o", run(["-i", inp, "-o", out, "--metrics", out]), (out, res))
    # The default database sits beside the output: -o kvbatch.db would be it.
    deflt = os.path.join(tmp, "kvbatch.db")
    p = run(["-i", inp, "-o", out])
    check(p.returncode == 0 and os.path.exists(deflt), f"default metrics beside the output: {p.stderr!r}")
    refused("-o = the default database", run(["-i", inp, "-o", deflt]), (deflt, content(deflt)))
    # The model is never an output. On a private copy: a kvbatch without
    # this check empties the model it is given.
    model = os.path.join(tmp, "model.gguf")
    shutil.copyfile(MODEL, model)
    mlink = os.path.join(tmp, "model-link.gguf")
    os.symlink(model, mlink)
    size = os.path.getsize(model)
    for what, args in (("-o the model", ["-o", mlink, "--metrics", db]),
                       ("--metrics the model", ["-o", out, "--metrics", mlink])):
        p = subprocess.run([BIN, "run", "--model", model, "--quiet", "--no-cache", "-i", inp] + args,
                           capture_output=True, timeout=60)
        check(p.returncode == 2 and os.path.getsize(model) == size, f"{what}: exit {p.returncode}")


def test_stdout(tmp):
    inp = os.path.join(tmp, "std.jsonl")
    job(inp, 3)
    db = os.path.join(tmp, "std.db")
    p = subprocess.run([BIN, "run", "--model", MODEL, "--no-cache", "-i", inp, "-o", "-", "--metrics", db],
                       capture_output=True, timeout=60)
    check(p.returncode == 0, f"-o -: exit {p.returncode}: {p.stderr!r}")
    lines = p.stdout.decode().splitlines()
    ok = len(lines) == 3
    for ln in lines:
        try:
            ok = ok and json.loads(ln)["custom_id"].startswith("r")
        except (ValueError, KeyError, AttributeError):
            ok = False
    check(ok, f"-o -: standard output holds {len(lines)} lines, not just the 3 results: {p.stdout[:300]!r}")
    check(b"requests" in p.stderr, f"-o -: the summary is not on standard error: {p.stderr!r}")
    check(not os.path.exists(os.path.join(tmp, "-")), "-o -: a file named '-' was created")
    # The default database for standard output: kvbatch.db in the working directory.
    p = subprocess.run([BIN, "run", "--model", MODEL, "--quiet", "--no-cache", "-i", inp, "-o", "-"],
                       capture_output=True, timeout=60, cwd=tmp)
    check(p.returncode == 0 and os.path.exists(os.path.join(tmp, "kvbatch.db")), f"-o - default db: {p.stderr!r}")
    p = run(["-i", inp, "-o", "-", "--metrics", db, "--resume"])
    check(p.returncode == 2 and b"--resume" in p.stderr and p.stdout == b"", f"--resume -o -: exit {p.returncode}")


def test_failed_start(tmp):
    """Results survive a run that stops before it starts."""
    inp = os.path.join(tmp, "keep.jsonl")
    job(inp, 3)
    out = os.path.join(tmp, "keep.out")
    db = os.path.join(tmp, "keep.db")
    p = run(["-i", inp, "-o", out, "--metrics", db])
    check(p.returncode == 0, f"first run: {p.stderr!r}")
    before = content(out)
    check(before.count(b"\n") == 3, "first run: not 3 lines")
    bad_db = os.path.join(tmp, "not-sqlite.db")
    with open(bad_db, "wb") as f:
        f.write(b"this is not a database, just some text that is long enough " * 20)
    for what, mpath in (("a database that is not SQLite", bad_db),
                        ("a database in a missing directory", os.path.join(tmp, "no", "such", "m.db"))):
        p = run(["-i", inp, "-o", out, "--metrics", mpath])
        check(p.returncode == 1 and b"metrics" in p.stderr, f"{what}: exit {p.returncode}: {p.stderr!r}")
        check(content(out) == before, f"{what}: the earlier results were destroyed ({len(content(out))} bytes left)")
        # Resuming onto a torn line: the tear stays until the run can start.
        torn = before + b'{"id":"batch_req_0123'
        with open(out, "wb") as f:
            f.write(torn)
        p = run(["-i", inp, "-o", out, "--metrics", mpath, "--resume"])
        check(p.returncode == 1, f"{what} with --resume: exit {p.returncode}")
        check(content(out) == torn, f"{what} with --resume: the output was changed")
        with open(out, "wb") as f:
            f.write(before)
    # And once the database is usable the run replaces the results.
    p = run(["-i", inp, "-o", out, "--metrics", db])
    check(p.returncode == 0 and content(out).count(b"\n") == 3, f"rerun: exit {p.returncode}")


def test_resume_non_regular(tmp):
    inp = os.path.join(tmp, "dev.jsonl")
    job(inp, 1)
    db = os.path.join(tmp, "dev.db")
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    for dev in ("/dev/full", "/dev/zero", "/dev/null", fifo):
        if not os.path.exists(dev):
            continue
        t0 = time.time()
        try:
            p = run(["-i", inp, "-o", dev, "--metrics", db, "--resume"], timeout=20)
            rc, err = p.returncode, p.stderr
        except subprocess.TimeoutExpired:
            rc, err = "timeout", b""
        check(rc == 2 and b"regular file" in err, f"--resume -o {dev}: exit {rc} after {time.time() - t0:.1f} s: "
              f"{err!r}")
    p = run(["-i", inp, "-o", "/dev/null", "--metrics", db])
    check(p.returncode == 0, f"-o /dev/null without --resume: exit {p.returncode}: {p.stderr!r}")


def main():
    if not ready():
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        for t in (test_same_files, test_stdout, test_failed_start, test_resume_non_regular):
            t0 = time.time()
            d = os.path.join(tmp, t.__name__)
            os.makedirs(d)
            t(d)
            print(f"{t.__name__}: {time.time() - t0:.1f} s")
    return finish("files")


if __name__ == "__main__":
    sys.exit(main())
