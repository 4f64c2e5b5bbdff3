#!/usr/bin/env python3
"""pytest_ppl_ref.py — kvbatch's perplexity of tests/data/ppl-english.txt (5,471
SmolLM2 tokens) against two references, by llama-perplexity's definition (chunks
of 512 tokens, the second half of each scored: python/kvbatch_ppl.py), over the
first 4 chunks (llama-perplexity's running value [4]; KVB_PPLREF_FULL=1: all 10,
its final estimate), to stay near a minute on two shared cores:

  - transformers on the GGUF's weights dequantized to float32 (tests/hf_dequant.py),
    computed here: kvbatch within 1%;
  - llama.cpp's llama-perplexity, recorded (it is not built here):
        llama-perplexity -m models/SmolLM2-135M-Instruct.Q4_1.gguf -f tests/data/ppl-english.txt -c 512 -t 1
    llama.cpp from the llama-cpp-python 0.3.36 sdist (vendor/llama.cpp), CPU,
    GGML_NATIVE=ON with AMX off (-mno-amx-*: this VM's AMX tiles fault):
    "[1]22.6972,[2]20.2996,[3]21.7689,[4]21.8197,...,[10]19.0916" and
    "Final estimate: PPL = 19.0916 +/- 0.98293" over 10 chunks; kvbatch within 1%.

What the margin is for: kvbatch multiplies Q4_1 weights by int8 activations and
keeps K/V in fp16 (llama.cpp: q8_1 activations, f16 K/V), transformers computes
in float32. Measured over 10 chunks: kvbatch 19.0429, transformers 18.9757
(kvbatch +0.35%), llama.cpp 19.0916 (kvbatch -0.26%). The scoring itself (the sums, the windows) is checked exactly
in tests/pytest_lm_eval.py; this test is about the values.

Needs torch, transformers, gguf (the kvbatch venv; it re-runs itself under it)
and a kvbatch that scores (echo); skips (77) without them.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kvbcheck as kc  # noqa: E402
from kvbcheck import check, need_modules  # noqa: E402

CTX = 512
LLAMA_CPP_RUNNING = {4: 21.8197, 10: 19.0916}  # llama-perplexity's [N] after N chunks
TOL = 0.01
TEXT = os.path.join(HERE, "data", "ppl-english.txt")


def main():
    if not kc.ready():
        return 77
    need_modules("torch", "transformers", "lm_eval")
    sys.path.insert(0, os.path.join(kc.SRC, "python"))
    import kvbatch_lm_eval as kle
    import kvbatch_ppl
    import hf_dequant
    import tempfile
    import pytest_lm_eval
    if not pytest_lm_eval.engine_scores():
        print("SKIP: this kvbatch does not take echo scoring requests")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        lm = kle.KvbatchLM(binary=kc.BIN, model=kc.MODEL, no_cache=True, max_length=CTX - 1,
                           work_dir=tmp, quiet=True)
        with open(TEXT, "rb") as f:
            tokens = lm.tok.encode_bytes(f.read())
        check(len(tokens) == 5471, "the text is %d tokens, llama.cpp's tokenizer gave 5471" % len(tokens))
        chunks = 10 if os.environ.get("KVB_PPLREF_FULL") else 4
        tokens = tokens[:chunks * CTX]
        kvb = kvbatch_ppl.perplexity(lm, tokens, CTX, "llama")
    check(kvb["tokens_scored"] == chunks * (CTX - CTX // 2 - 1), "scored %d tokens, llama-perplexity scores %d"
          % (kvb["tokens_scored"], chunks * (CTX - CTX // 2 - 1)))
    import torch
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, cfg = hf_dequant.load_llama(kc.MODEL)
    ref, _, n = hf_dequant.perplexity(model, tokens, CTX, "llama", bos=None)
    check(n == kvb["tokens_scored"], "the reference scored %d tokens, kvbatch %d" % (n, kvb["tokens_scored"]))
    for name, want in (("transformers float32", ref), ("llama.cpp (recorded)", LLAMA_CPP_RUNNING[chunks])):
        rel = kvb["ppl"] / want - 1
        check(abs(rel) <= TOL, "kvbatch ppl %.4f vs %s %.4f: %+.2f%%, beyond %.0f%%"
              % (kvb["ppl"], name, want, 100 * rel, 100 * TOL))
    print("ppl (llama-perplexity's definition, ctx %d, %d chunks): kvbatch %.4f, transformers %.4f, llama.cpp %.4f"
          % (CTX, chunks, kvb["ppl"], ref, LLAMA_CPP_RUNNING[chunks]))
    return kc.finish("perplexity reference")


if __name__ == "__main__":
    sys.exit(main())
