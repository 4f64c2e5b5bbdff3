#!/usr/bin/env python3
"""pytest_lm_eval.py — the lm-evaluation-harness adapter (python/kvbatch_lm_eval.py)
against what it should compute, on a tiny local task.

  1. Batched tokenization (many texts through one `kvbatch tokenize --jsonl`)
     gives the ids each text gets alone, for awkward texts (specials, digits,
     whitespace runs, newlines, emoji, empty ones), with and without specials.
  2. The rolling windows: the adapter's (lm_eval.utils') and the reference's
     (tests/hf_dequant.py, written apart) are the same, token for token.
  3. A 2-shot multiple-choice task (YAML + JSONL written here) through
     lm_eval.simple_evaluate: every (context, continuation) the harness asked
     for is tokenized again one process per string, found in the job the run
     wrote, and its score summed from the result line by hand: the adapter's
     (logprob, is_greedy) must be exactly that (is_greedy here from the token
     strings: top-1 string == the token's); lm_eval's accuracy must be the
     argmax over choices of those scores.
  4. loglikelihood_rolling over a document of ~500 tokens with max_length 64:
     each token scored once, the total the sum over the reference's windows of
     the job's logprobs, and above the total a single full-context pass gives
     (context helps).
  5. generate_until: completions cut at `until` (" 4, 5," stops before " 6"),
     chat contexts sent to /v1/chat/completions (a prefilled assistant turn
     continued), and the adapter's Jinja rendering of a chat, which scoring
     uses, is the text `kvbatch render` gives for the same messages.

Needs lm_eval (the kvbatch venv: it re-runs itself under $KVBATCH_VENV or
~/.cache/kvbatch-venv when the python running it lacks it) and a kvbatch that
scores (echo); skips (77) without them. Exit 0 pass, 1 fail, 77 skip.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kvbcheck as kc  # noqa: E402
from kvbcheck import check, need_modules  # noqa: E402


def skip(msg):
    print("SKIP: " + msg)
    sys.exit(77)


def tok_alone(text, special=True):
    cmd = [kc.BIN, "tokenize", "--model", kc.MODEL] + (["--special"] if special else [])
    out = subprocess.run(cmd, input=text.encode(), capture_output=True, check=True).stdout
    return [int(x) for x in out.split()]


def engine_scores():
    """Whether this kvbatch takes echo scoring requests (the job parser refused echo before)."""
    with tempfile.TemporaryDirectory() as d:
        job, out = os.path.join(d, "j.jsonl"), os.path.join(d, "o.jsonl")
        with open(job, "w") as f:
            f.write(json.dumps({"custom_id": "p", "method": "POST", "url": "/v1/completions",
                                "body": {"prompt": [1, 2, 3], "max_tokens": 0, "echo": True, "logprobs": 1}}) + "\n")
        subprocess.run([kc.BIN, "run", "-q", "--model", kc.MODEL, "--input", job, "--output", out, "--no-cache",
                        "--metrics", os.path.join(d, "m.db")], capture_output=True)
        try:
            return json.loads(open(out).readline())["response"]["status_code"] == 200
        except (OSError, ValueError, KeyError, TypeError):
            return False


def check_tokenizer(kle):
    tok = kle.Tokenizer(kc.BIN, kc.MODEL)
    rng = random.Random(5)
    pieces = ["Hello", " world", "  ", "\n", "\n\n", "123", "4567", " é", "日本語", "<|im_start|>", "<|im_end|>",
              "'s", " don't", "!!", " ", "\t", "The cat sat.", " 42.5%", "<|endoftext|>", "🙂", "x<y"]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 7))) for _ in range(24)] + ["", " "]
    batched = tok.encode_many(texts)
    check(tok.processes == 1, "24+2 texts took %d tokenize processes, not 1" % tok.processes)
    for t, ids in zip(texts, batched):
        check(ids == tok_alone(t), "batched ids of %r differ from its own: %s vs %s" % (t, ids, tok_alone(t)))
    # parse_special=False: special-token text stays text
    plain = kle.Tokenizer(kc.BIN, kc.MODEL, parse_special=False)
    got = plain.encode_many(["a<|im_end|>b", "plain one", "two"])
    check(got == [tok_alone(t, False) for t in ("a<|im_end|>b", "plain one", "two")],
          "parse_special=false ids wrong: %s" % got)


def check_windows(kppl, hfd):
    rng = random.Random(7)
    for n, ctx in ((1, 4), (4, 4), (5, 4), (17, 4), (100, 16), (64, 64), (65, 64), (300, 64)):
        toks = [rng.randrange(1000) for _ in range(n)]
        a, b = kppl.harness_windows(toks, ctx, 999), hfd.harness_windows(toks, ctx, 999)
        check(a == b, "harness windows differ for n=%d ctx=%d" % (n, ctx))
        check(sum(k for _, k in a) == n, "harness windows score %d of %d tokens" % (sum(k for _, k in a), n))
        check(all(len(ids) <= ctx + 1 for ids, _ in a), "a window longer than ctx + 1")
        la = [(ids, len(ids) - k) for ids, k in kppl.llama_chunks(toks, ctx)]
        check(la == hfd.llama_windows(toks, ctx), "llama chunks differ for n=%d ctx=%d" % (n, ctx))


def read_run(run):
    """{tuple(prompt ids): logprobs object} of one kvbatch run of the adapter."""
    prompts = {}
    for line in open(run["job"]):
        j = json.loads(line)
        prompts[j["custom_id"]] = tuple(j["body"]["prompt"])
    out = {}
    for line in open(run["output"]):
        r = json.loads(line)
        out[prompts[r["custom_id"]]] = r["response"]["body"]["choices"][0]["logprobs"]
    return out


def by_hand(lp, k):
    """(sum of the last k token logprobs, top-1 string == token string at each)."""
    n = len(lp["tokens"])
    total = sum(lp["token_logprobs"][n - k:])
    tops = lp["top_logprobs"]
    greedy = all(max(tops[i], key=tops[i].get) == lp["tokens"][i] for i in range(n - k, n))
    return total, greedy


def check_task(kle, smt, tmp):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    class Recording(kle.KvbatchLM):
        seen = []

        def loglikelihood(self, requests, disable_tqdm=False):
            res = super().loglikelihood(requests, disable_tqdm)
            self.seen += [(r.args, v, r.doc) for r, v in zip(requests, res)]
            return res

    task_dir = os.path.join(tmp, "task")
    name = smt.write_task(task_dir, n_test=8, n_train=4, seed=3, name="kvb_tiny_mc", shots=2)
    lm = Recording(binary=kc.BIN, model=kc.MODEL, no_cache=True, work_dir=os.path.join(tmp, "work"), quiet=True)
    res = simple_evaluate(model=lm, tasks=[name], task_manager=TaskManager(include_path=task_dir),
                          num_fewshot=2, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                          fewshot_random_seed=0)
    check(len(lm.runs) == 1, "%d kvbatch runs for one loglikelihood call" % len(lm.runs))
    check(len(lm.seen) == 8 * 4, "%d loglikelihood requests for 8 items x 4 choices" % len(lm.seen))
    scored = read_run(lm.runs[0])
    right = 0
    docs = {}
    for (ctx, cont), (lp, greedy), doc in lm.seen:
        c, w = kle._move_spaces(ctx, cont)
        ctx_ids, whole = tok_alone(c), tok_alone(c + w)
        check(whole[:len(ctx_ids)] == ctx_ids, "context ids are not a prefix for %r" % ctx[-40:])
        n_cont = len(whole) - len(ctx_ids)
        got = scored.get(tuple(whole))
        if not check(got is not None, "no scored line for %r + %r" % (ctx[-30:], cont)):
            continue
        check(len(got["tokens"]) == len(whole) and got["token_logprobs"][0] is None,
              "echo of a %d-token prompt: %d tokens, first logprob %r"
              % (len(whole), len(got["tokens"]), got["token_logprobs"][0]))
        want = by_hand(got, n_cont)
        check((lp, greedy) == want, "%r: adapter %s, by hand %s" % (cont, (lp, greedy), want))
        docs.setdefault(doc["question"], (doc, []))[1].append((cont, lp))
    for q, (doc, conts) in docs.items():
        best = max(conts, key=lambda c: c[1])[0]
        right += best.strip() == doc["choices"][doc["label"]]
    acc = res["results"][name]["acc,none"]
    check(abs(acc - right / len(docs)) < 1e-9, "lm_eval acc %s, by hand %d/%d" % (acc, right, len(docs)))
    print("tiny task: acc %.3f over %d items, %d scoring requests, run: %s"
          % (acc, len(docs), len(lm.seen), lm.runs[0]["summary"]))


def check_rolling(kle, hfd, tmp):
    from lm_eval.api.instance import Instance
    text = open(os.path.join(HERE, "data", "ppl-english.txt")).read()[:2400]
    lm = kle.KvbatchLM(binary=kc.BIN, model=kc.MODEL, no_cache=True, max_length=64,
                       work_dir=os.path.join(tmp, "rolling"), quiet=True)
    req = Instance(request_type="loglikelihood_rolling", doc={}, arguments=(text,), idx=0)
    (total,) = lm.loglikelihood_rolling([req])
    toks = tok_alone(text)
    windows = hfd.harness_windows(toks, 64, lm.prefix_token_id)
    check(len(windows) >= 6, "a %d-token document makes only %d windows of 64" % (len(toks), len(windows)))
    scored = read_run(lm.runs[-1])
    want = 0.0
    for ids, k in windows:
        got = scored.get(tuple(ids))
        if check(got is not None, "no scored line for a window of %d tokens" % len(ids)):
            want += sum(got["token_logprobs"][len(ids) - k:])
    check(abs(total - want) < 1e-9 * max(1.0, abs(want)), "rolling total %r, by hand %r" % (total, want))
    full = kle.KvbatchLM(binary=kc.BIN, model=kc.MODEL, no_cache=True, max_length=len(toks) + 1,
                         work_dir=os.path.join(tmp, "full"), quiet=True)
    (one,) = full.loglikelihood_rolling([req])
    check(one > total, "one full-context pass (%.2f) not above the 64-token windows (%.2f)" % (one, total))
    print("rolling: %d tokens, %d windows: %.3f nats/token (one window: %.3f)"
          % (len(toks), len(windows), -total / len(toks), -one / len(toks)))


def check_generate(kle, tmp):
    """generate_until: completions cut at `until`, chat through the chat endpoint, and the
    adapter's Jinja rendering of a chat (what scoring sees) the text kvbatch's template makes."""
    from lm_eval.api.instance import Instance
    lm = kle.KvbatchLM(binary=kc.BIN, model=kc.MODEL, no_cache=True, max_length=256,
                       work_dir=os.path.join(tmp, "gen"), quiet=True)
    chat = lm.apply_chat_template([{"role": "user", "content": "Name three colours."}], True)
    cont = lm.apply_chat_template([{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hello"}],
                                  False)
    reqs = [("Count: 1, 2, 3,", {"until": ["\n", " 6"], "max_gen_toks": 20}),
            ("The capital of France is", {"until": ["."], "max_gen_toks": 16}),
            (chat, {"until": ["\n\n"], "max_gen_toks": 16}), (cont, {"max_gen_toks": 6})]
    out = lm.generate_until([Instance("generate_until", {}, r, i) for i, r in enumerate(reqs)])
    check(out[0] == " 4, 5,", "counting continued as %r, not ' 4, 5,' (cut before ' 6')" % out[0])
    job = [json.loads(x) for x in open(lm.runs[-1]["job"])]
    check([j["url"] for j in job] == ["/v1/completions"] * 2 + ["/v1/chat/completions"] * 2,
          "endpoints: %s" % [j["url"] for j in job])
    check(job[3]["body"].get("continue_final_message") is True, "a prefilled assistant turn not continued")
    res = {json.loads(x)["custom_id"]: json.loads(x)["response"]["body"] for x in open(lm.runs[-1]["output"])}
    for n, text in enumerate(out):
        ch = res["g%d" % n]["choices"][0]
        raw = ch["message"]["content"] if "message" in ch else ch["text"]
        check(text == raw, "g%d: the adapter gave %r, the result line %r (run applies the stops)" % (n, text, raw))
    p = subprocess.run([kc.BIN, "render", "--model", kc.MODEL, "--input", lm.runs[-1]["job"], "--format", "json"],
                       capture_output=True, text=True)
    rendered = {json.loads(x)["custom_id"]: json.loads(x)["prompts"][0]["text"] for x in p.stdout.splitlines()}
    for n, c in ((2, chat), (3, cont)):
        check(rendered.get("g%d" % n) == str(c), "Jinja chat text %r, kvbatch render %r" % (str(c)[-60:],
              (rendered.get("g%d" % n) or "")[-60:]))
    print("generate_until: %s" % out)


def main():
    if not kc.ready():
        return 77
    need_modules("lm_eval", "gguf")
    sys.path.insert(0, os.path.join(kc.SRC, "python"))
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import kvbatch_lm_eval as kle
    import kvbatch_ppl as kppl
    import synth_mc_task as smt
    import hf_dequant as hfd
    check_tokenizer(kle)
    check_windows(kppl, hfd)
    if not engine_scores():
        print("SKIP: this kvbatch does not take echo scoring requests yet (the tokenizer and window checks ran)")
        return 77 if not kc.failures else kc.finish("lm_eval adapter")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HF_DATASETS_CACHE"] = os.path.join(tmp, "hf-datasets")
        check_task(kle, smt, tmp)
        check_rolling(kle, hfd, tmp)
        check_generate(kle, tmp)
    return kc.finish("lm_eval adapter")


if __name__ == "__main__":
    sys.exit(main())
