"""kvbatch_ppl.py — the perplexity of a text file through kvbatch (one `kvbatch
run` of echo-scoring requests, built by kvbatch_lm_eval's KvbatchLM).

Both methods are per token with natural logs, ppl = exp(-sum(logp) / n), over
the file tokenized whole by `kvbatch tokenize` (no BOS, special-token text as
text: what llama-perplexity's common_tokenize does):
  harness  lm-evaluation-harness's loglikelihood_rolling: a prefix token (BOS,
           else EOS), then every token of the file scored once, in rolling windows
           of CTX inputs (lm_eval.utils.get_rolling_token_windows, context_len=1 +
           make_disjoint_window); a window sees only its own tokens as context.
  llama    llama.cpp's llama-perplexity (tools/perplexity, perplexity()): the file
           cut into len // CTX disjoint chunks of CTX tokens (the rest dropped), the
           first token of each replaced by BOS when the vocabulary adds BOS, and only
           positions CTX/2+1 .. CTX-1 of each chunk scored (CTX/2 - 1 per chunk): the
           number llama-perplexity prints as its final estimate.

    python python/kvbatch_ppl.py FILE [--ctx N] [--method harness|llama] [--cache-dir D | --no-cache]
                                      [--kv-type f16|q8|q4]
"""
import argparse
import json
import math
import sys

import kvbatch_lm_eval as kle


def llama_chunks(tokens, ctx, bos=None):
    """llama-perplexity's chunks, each (ids, number of tokens scored at its end)."""
    out = []
    for i in range(len(tokens) // ctx):
        chunk = list(tokens[i * ctx:(i + 1) * ctx])
        if bos is not None:
            chunk[0] = bos
        out.append((chunk, ctx - ctx // 2 - 1))
    return out


def harness_windows(tokens, ctx, prefix):
    """The harness's rolling windows, each (ids, number of tokens scored at its end)."""
    wins = map(kle.lm_utils.make_disjoint_window,
               kle.lm_utils.get_rolling_token_windows(token_list=list(tokens), prefix_token=prefix,
                                                      max_seq_len=ctx, context_len=1))
    return [(list(a) + list(b), len(b)) for a, b in wins]


def perplexity(lm, tokens, ctx, method):
    """{"ppl", "sum_logprob", "tokens_scored", "windows", ...} through lm (a KvbatchLM)."""
    if method == "llama":
        if len(tokens) < 2 * ctx:
            raise ValueError("%d tokens: llama-perplexity needs at least 2 x ctx = %d" % (len(tokens), 2 * ctx))
        seqs = llama_chunks(tokens, ctx, lm.info.bos if lm.info.add_bos else None)
    elif method == "harness":
        seqs = harness_windows(tokens, ctx, lm.prefix_token_id)
    else:
        raise ValueError("method %r: harness or llama" % method)
    scores = lm.score(seqs, kind="perplexity-" + method)
    total = sum(lp for lp, _ in scores)
    n = sum(k for _, k in seqs)
    return {"method": method, "ctx": ctx, "ppl": math.exp(-total / n), "sum_logprob": total,
            "tokens_scored": n, "tokens_in_file": len(tokens), "windows": len(seqs)}


def main(argv=None):
    ap = argparse.ArgumentParser(description="perplexity of a text file through kvbatch")
    ap.add_argument("file")
    ap.add_argument("--ctx", type=int, help="window (harness) or chunk (llama) length; "
                    "default min(2048, the model's context - 2 (harness) or - 1 (llama))")
    ap.add_argument("--method", choices=("harness", "llama"), default="harness")
    ap.add_argument("--binary")
    ap.add_argument("--model")
    ap.add_argument("--cache-dir")
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--threads")
    ap.add_argument("--kv-type", choices=("f16", "q8", "q4"), help="the KV cache's type (kvbatch run --kv-type)")
    ap.add_argument("--work-dir")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    a = ap.parse_args(argv)
    info = kle.GGUFInfo(a.model or kle.default_model())
    ctx = a.ctx or min(2048, info.n_ctx_train - (2 if a.method == "harness" else 1))
    # a harness window is ctx inputs + its last scored token; a llama chunk is ctx tokens
    # (KvbatchLM runs the engine with --ctx max_length + 2: see there)
    lm = kle.KvbatchLM(binary=a.binary, model=a.model, cache_dir=a.cache_dir, no_cache=a.no_cache,
                       threads=a.threads, work_dir=a.work_dir, quiet=True,
                       extra_args="--kv-type " + a.kv_type if a.kv_type else "",
                       max_length=ctx if a.method == "harness" else ctx - 1)
    with open(a.file, "rb") as f:
        tokens = lm.tok.encode_bytes(f.read())  # the bytes as they are, as llama-perplexity reads them
    r = perplexity(lm, tokens, ctx, a.method)
    r["run"] = {k: v for k, v in lm.runs[-1].items() if k not in ("job", "output")}
    if a.json:
        print(json.dumps(r))
    else:
        print("ppl %.4f  (%s method, ctx %d: %d of %d tokens scored in %d windows; natural log, per token)"
              % (r["ppl"], r["method"], ctx, r["tokens_scored"], r["tokens_in_file"], r["windows"]))
        print(r["run"].get("summary", ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
