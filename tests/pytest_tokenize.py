#!/usr/bin/env python3
"""`kvbatch tokenize --jsonl`: one JSON string per input line gives the same ids as tokenizing
each text on its own (texts with newlines, quotes, non-ASCII, empty), in order; a line that is
not a JSON string is an error naming its line. Exit 0 pass, 1 fail, 77 skipped."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvbcheck import BIN, MODEL, check, finish, ready  # noqa: E402

TEXTS = ["Hello world", "two\nlines\n", "", " leading space", 'quote " and \\ backslash', "Héllo wörld — 日本語",
         "<|im_start|>user", "tab\there", "x" * 3000]


def main():
    if not ready():
        return 77
    for special in ([], ["--special"]):
        inp = "".join(json.dumps(t) + "\n" for t in TEXTS)
        p = subprocess.run([BIN, "tokenize", "--model", MODEL, "--jsonl"] + special, input=inp.encode(),
                           capture_output=True)
        check(p.returncode == 0, f"--jsonl exited {p.returncode}: {p.stderr.decode()[-300:]}")
        got = p.stdout.decode().split("\n")
        check(len(got) == len(TEXTS) + 1 and got[-1] == "", f"{len(got) - 1} lines of ids for {len(TEXTS)} texts")
        for i, t in enumerate(TEXTS):
            one = subprocess.run([BIN, "tokenize", "--model", MODEL] + special, input=t.encode(), capture_output=True)
            check(one.returncode == 0 and i < len(got) and got[i] == one.stdout.decode().rstrip("\n"),
                  f"text {i} {t[:30]!r}: --jsonl gave {got[i][:60] if i < len(got) else None!r}, "
                  f"alone {one.stdout.decode()[:60]!r}")
    p = subprocess.run([BIN, "tokenize", "--model", MODEL, "--jsonl"], input=b'"ok"\n{"a": 1}\n', capture_output=True)
    check(p.returncode == 1 and b"line 2" in p.stderr, f"a bad line: exit {p.returncode}, {p.stderr[-200:]!r}")
    return finish("tokenize --jsonl")


if __name__ == "__main__":
    sys.exit(main())
