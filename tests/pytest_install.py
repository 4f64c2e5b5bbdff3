#!/usr/bin/env python3
"""`cmake --install` gives a working tool: the binary in bin/ (its --version
names the git revision and the build options), a man page in share/man/man1
that `man -l` reads and that carries every command's help, and bash/zsh
completions that complete commands and each command's options.

Exit 0 pass, 1 fail, 77 skipped (no binary, or cmake/man missing).
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvbcheck import BIN, check, finish  # noqa: E402


def bash_complete(script, words):
    """What the installed bash completion offers for the command line `words`
    (the last word being completed)."""
    line = " ".join(f"'{w}'" for w in words)
    prog = (f"source '{script}'; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _kvbatch; "
            'printf "%s\\n" "${COMPREPLY[@]}"')
    p = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, timeout=30)
    return p.stdout.split()


def main():
    if not BIN or not os.path.exists(BIN) or not shutil.which("cmake") or not shutil.which("man"):
        print("SKIP: kvbatch, cmake or man missing")
        return 77
    build = os.path.dirname(os.path.abspath(BIN))
    with tempfile.TemporaryDirectory(prefix="kvb-install-") as prefix:
        p = subprocess.run(["cmake", "--install", build, "--prefix", prefix], capture_output=True, text=True,
                           timeout=120)
        check(p.returncode == 0, f"cmake --install failed: {p.stderr[-500:]}")
        exe = os.path.join(prefix, "bin", "kvbatch")
        page = os.path.join(prefix, "share", "man", "man1", "kvbatch.1")
        bash = os.path.join(prefix, "share", "bash-completion", "completions", "kvbatch")
        zsh = os.path.join(prefix, "share", "zsh", "site-functions", "_kvbatch")
        for f in (exe, page, bash, zsh):
            check(os.path.exists(f), f"not installed: {os.path.relpath(f, prefix)}")
        if not os.path.exists(exe):
            return finish("install")

        v = subprocess.run([exe, "--version"], capture_output=True, text=True)
        check(v.returncode == 0 and v.stdout.startswith("kvbatch "), f"--version: {v.stdout!r} {v.stderr!r}")
        check("(git " in v.stdout and "CUDA" in v.stdout and "CPU kernels" in v.stdout,
              f"--version lacks the revision or build options: {v.stdout!r}")
        h = subprocess.run([exe, "--help"], capture_output=True, text=True)
        check("--version" in h.stdout, "kvbatch --help does not list --version")
        r = subprocess.run([exe, "tokenize", "hello"], capture_output=True, text=True,
                           env={**os.environ, "KVBATCH_MODEL": os.environ.get("KVB_MODEL", "")})
        if os.environ.get("KVB_MODEL") and os.path.exists(os.environ["KVB_MODEL"]):
            check(r.returncode == 0 and r.stdout.strip(), f"the installed binary cannot tokenize: {r.stderr!r}")

        if os.path.exists(page):
            m = subprocess.run(["man", "-l", page], capture_output=True, text=True,
                               env={**os.environ, "MANPAGER": "cat", "PAGER": "cat", "MANWIDTH": "100"}, timeout=60)
            check(m.returncode == 0, f"man -l failed: {m.stderr[-300:]}")
            text = m.stdout
            check("offline batch runner" in text, "the man page has no NAME line")
            for cmd in ("run", "render", "report", "cache", "generate", "tokenize", "logits"):
                check(f"usage: kvbatch {cmd}" in text, f"the man page lacks the help of '{cmd}'")
            check("--max-batch" in text and "--cache-dir" in text, "the man page lost option names")
            check("EXIT STATUS" in text, "the man page has no EXIT STATUS")

        if os.path.exists(bash) and shutil.which("bash"):
            check("run" in bash_complete(bash, ["kvbatch", "ru"]), "bash: 'kvbatch ru' does not complete to run")
            got = bash_complete(bash, ["kvbatch", "run", "--max-b"])
            check("--max-batch" in got, f"bash: 'run --max-b' gives {got}")
            got = bash_complete(bash, ["kvbatch", "cache", "v"])
            check(got == ["verify"], f"bash: 'cache v' gives {got}")
            got = bash_complete(bash, ["kvbatch", "render", "--li"])
            check(got == ["--line"], f"bash: 'render --li' gives {got}")
            got = bash_complete(bash, ["kvbatch", "report", "--l"])
            check(got == ["--list"], f"bash: 'report --l' gives {got}")
        if os.path.exists(zsh) and shutil.which("zsh"):
            z = subprocess.run(["zsh", "-n", zsh], capture_output=True, text=True)
            check(z.returncode == 0, f"zsh completion does not parse: {z.stderr}")
    return finish("install")


if __name__ == "__main__":
    sys.exit(main())
