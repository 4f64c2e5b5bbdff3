"""bench_eval.py — an lm-evaluation-harness 5-shot multiple-choice task (synthetic,
local: python/synth_mc_task.py) through kvbatch cold, warm and --max-batch 1,
and through lm_eval's own `hf` model on the same weights, side by side.

  cold    an empty --cache-dir: everything computed (prefixes shared in the run only)
  warm    the same cache dir again (tomorrow night's rerun): prompt blocks and
          their scores come from the persistent cache
  batch1  --max-batch 1 --no-cache on the first --limit items: one sequence at a
          time, to show that batching changes no score
  hf      lm_eval's `hf` model on the GGUF dequantized to float32 (tests/hf_dequant.py,
          save_pretrained into the temp folder), CPU: for scale; its scores are not
          kvbatch's (no int8 activations, no fp16 K/V), so its accuracy is close, not equal

Printed: wall time (the whole simple_evaluate, and kvbatch run's own), prompt
tokens submitted vs computed (the run's metrics: in-run reuse, persistent cache,
computed), acc and acc_norm, and whether cold, warm and batch1 chose the same
answer with the same scores on every item they share. The targets (issue 14):
warm computes <= 5% of the prompt tokens and is >= 5x faster than cold; the
answers are identical across cold, warm and batch1.

    python python/bench_eval.py [--items 500] [--limit 100] [--hf-limit N] [--no-hf] [--no-batch1]
                                [--extra-args "--block-size 16"] [--keep DIR]
(the adapter runs with --block-size 8 unless told otherwise: see kvbatch_lm_eval.py)
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import kvbatch_lm_eval as kle  # noqa: E402
import synth_mc_task  # noqa: E402


def evaluate(model, task_dir, task, limit=None, **kw):
    """(results, wall seconds) of one simple_evaluate over the local task."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    t0 = time.time()
    res = simple_evaluate(model=model, tasks=[task], task_manager=TaskManager(include_path=task_dir),
                          limit=limit, log_samples=True, random_seed=0, numpy_random_seed=0,
                          torch_random_seed=0, fewshot_random_seed=1234, **kw)
    return res, time.time() - t0


def per_item(res, task):
    """{doc_id: (chosen index, (logprob of each choice))}."""
    out = {}
    for s in res["samples"][task]:
        lps = tuple(float(r[0]) for r in s["filtered_resps"])
        out[s["doc_id"]] = (max(range(len(lps)), key=lps.__getitem__), lps)
    return out


def kvbatch_row(name, lm, res, wall, task):
    runs = [r for r in lm.runs if r["kind"] == "loglikelihood"]
    tot = lambda k: sum((r.get(k) or 0) for r in runs)  # noqa: E731
    m = res["results"][task]
    return {"mode": name, "wall_s": wall, "engine_s": sum(r["wall_s"] for r in runs),
            "prompt_tokens": tot("prompt_tokens"), "computed": tot("computed"),
            "reused_in_run": tot("reused_in_run"), "from_cache": tot("from_cache"),
            "requests": sum(r["requests"] for r in runs), "acc": m["acc,none"], "acc_norm": m["acc_norm,none"],
            "items": len(res["samples"][task]), "summary": runs[-1]["summary"] if runs else ""}


def same(a, b):
    """(items compared, items whose choice or scores differ) over the items both have."""
    common = sorted(set(a) & set(b))
    return len(common), [d for d in common if a[d] != b[d]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=500, help="test items (x 4 choices)")
    ap.add_argument("--limit", type=int, default=100, help="items for the --max-batch 1 run")
    ap.add_argument("--hf-limit", type=int, help="items for the hf run (default: all)")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--binary")
    ap.add_argument("--model")
    ap.add_argument("--threads")
    ap.add_argument("--extra-args", default="", help="more `kvbatch run` options for the kvbatch runs")
    ap.add_argument("--no-batch1", action="store_true")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (default: a temp folder, removed)")
    a = ap.parse_args()
    tmp = a.keep or tempfile.mkdtemp(prefix="kvbatch-bench-eval-")
    os.makedirs(tmp, exist_ok=True)
    os.environ["HF_DATASETS_CACHE"] = os.path.join(tmp, "hf-datasets")
    try:
        task_dir = os.path.join(tmp, "task")
        task = synth_mc_task.write_task(task_dir, n_test=a.items, n_train=50, seed=14, shots=5)
        cache = os.path.join(tmp, "cache")
        shutil.rmtree(cache, ignore_errors=True)
        common = dict(binary=a.binary, model=a.model, threads=a.threads, extra_args=a.extra_args, quiet=True)
        rows, items = [], {}
        modes = [("cold", dict(cache_dir=cache), None), ("warm", dict(cache_dir=cache), None)]
        if not a.no_batch1:
            modes.append(("batch1", dict(no_cache=True, max_batch=1), a.limit))
        for name, extra, limit in modes:
            lm = kle.KvbatchLM(work_dir=os.path.join(tmp, name), **common, **extra)
            res, wall = evaluate(lm, task_dir, task, limit=limit)
            rows.append(kvbatch_row(name, lm, res, wall, task))
            items[name] = per_item(res, task)
            print("%s: %.1f s, %s" % (name, wall, rows[-1]["summary"]), file=sys.stderr, flush=True)
        if not a.no_hf:
            sys.path.insert(0, os.path.join(ROOT, "tests"))
            import hf_dequant
            hf_dir = os.path.join(tmp, "hf-model")
            t0 = time.time()
            hf_dequant.save_pretrained(a.model or kle.default_model(), hf_dir)
            conv = time.time() - t0
            res, wall = evaluate("hf", task_dir, task, limit=a.hf_limit,
                                 model_args="pretrained=%s,dtype=float32,device=cpu" % hf_dir, batch_size=16)
            m = res["results"][task]
            rows.append({"mode": "hf", "wall_s": wall, "engine_s": None, "prompt_tokens": None, "computed": None,
                         "reused_in_run": None, "from_cache": None, "acc": m["acc,none"],
                         "acc_norm": m["acc_norm,none"], "items": len(res["samples"][task]),
                         "summary": "float32 transformers on the CPU (conversion %.0f s, not counted)" % conv})
            items["hf"] = per_item(res, task)
        report(rows, items)
        with open(os.path.join(tmp, "bench-eval.json"), "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(rows, items):
    fmt = lambda v, spec: "-" if v is None else spec % v  # noqa: E731
    print("\n%-7s %6s %8s %9s %9s %9s %9s %8s %6s %6s %8s" % ("mode", "items", "wall s", "kvbatch s", "prompt",
          "computed", "in-run", "cache", "comp%", "acc", "acc_norm"))
    for r in rows:
        share = None if not r["prompt_tokens"] else 100.0 * r["computed"] / r["prompt_tokens"]
        print("%-7s %6d %8.1f %9s %9s %9s %9s %8s %6s %6.4f %8.4f" % (
            r["mode"], r["items"], r["wall_s"], fmt(r["engine_s"], "%.1f"), fmt(r["prompt_tokens"], "%d"),
            fmt(r["computed"], "%d"), fmt(r["reused_in_run"], "%d"), fmt(r["from_cache"], "%d"),
            fmt(share, "%.2f"), r["acc"], r["acc_norm"]))
    by = {r["mode"]: r for r in rows}
    cold, warm = by["cold"], by["warm"]
    share = 100.0 * warm["computed"] / warm["prompt_tokens"] if warm["prompt_tokens"] else float("nan")
    print("\nwarm vs cold: %.2f%% of prompt tokens computed (target <= 5%%), %.1fx faster overall, "
          "%.1fx in kvbatch run (target >= 5x)"
          % (share, cold["wall_s"] / warm["wall_s"], cold["engine_s"] / max(warm["engine_s"], 1e-9)))
    for other in [m for m in ("warm", "batch1") if m in items]:
        n, diff = same(items["cold"], items[other])
        print("cold vs %-6s: %d items compared, %s" % (other, n, "identical choices and scores" if not diff else
              "%d differ (first doc ids %s)" % (len(diff), diff[:5])))
    if "hf" in items:
        n, _ = same(items["cold"], items["hf"])
        agree = sum(items["cold"][d][0] == items["hf"][d][0] for d in set(items["cold"]) & set(items["hf"]))
        print("cold vs hf    : %d items compared, same choice on %d (%.1f%%)" % (n, agree, 100.0 * agree / max(n, 1)))


if __name__ == "__main__":
    sys.exit(main())
