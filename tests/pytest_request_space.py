#!/usr/bin/env python3
"""The request space through the real engine: random request lines over
every field the job format accepts (valid, edge and invalid values), run in
bounded batches through `kvbatch run` on the default model, each run killed
once at a random moment and resumed, every output line checked strictly
against the openai package's types (tests/reqspace.py says what is checked).

CI runs a fixed list of seeds; scripts/request-space.sh runs many more.
Needs the openai package: re-executes itself in /root/.cache/kvbatch-venv
(or $KVB_VENV) when the running Python lacks it, and skips (77) when there
is none. Exit 0 pass, 1 fail, 77 skip.
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SEEDS = [11, 22, 33, 44, 55, 66]  # fixed: CI sees the same lines every time
LINES_PER_SEED = 100


def reexec_or_skip():
    try:
        import openai  # noqa: F401
        import pydantic  # noqa: F401
        return
    except ImportError:
        pass
    venv = os.environ.get("KVB_VENV", "/root/.cache/kvbatch-venv")
    py = os.path.join(venv, "bin", "python")
    if os.path.exists(py) and not os.environ.get("KVB_REQSPACE_REEXEC"):  # once: no loop if it lacks openai too
        os.environ["KVB_REQSPACE_REEXEC"] = "1"
        os.execv(py, [py] + sys.argv)
    print("SKIP: the openai package is not installed (scripts/setup.sh makes the venv)")
    sys.exit(77)


def main():
    reexec_or_skip()
    import reqspace
    from kvbcheck import BIN, MODEL, check, finish, ready
    if not ready():
        return 77
    seeds = [int(s) for s in os.environ.get("KVB_REQSPACE_SEEDS", "").split(",") if s] or SEEDS
    count = int(os.environ.get("KVB_REQSPACE_LINES", LINES_PER_SEED))
    total = {}
    with tempfile.TemporaryDirectory() as d:
        for seed in seeds:
            st = reqspace.run_seed(BIN, MODEL, seed, count, d, lambda m: check(False, m))
            for k, v in st.items():
                if isinstance(v, int):
                    total[k] = total.get(k, 0) + v
    print(f"{len(seeds)} seeds: {total}")
    return finish("request-space")


if __name__ == "__main__":
    sys.exit(main())
