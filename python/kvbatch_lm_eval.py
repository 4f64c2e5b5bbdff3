"""kvbatch_lm_eval.py — kvbatch as an lm-evaluation-harness (lm_eval 0.4.x)
model, registered as "kvbatch".

Each request type the harness hands over (loglikelihood, loglikelihood_rolling,
generate_until: lm_eval's evaluator calls each once, with every task's requests
of that type) becomes ONE kvbatch job file and ONE `kvbatch run`; results are
mapped back by custom_id. So the engine sees the whole evaluation at once and
shares prompt prefixes (few-shot examples, a question's context across its
choices) in the run and, through the persistent cache, across runs.

Scoring requests are completions with token-id prompts, so that the split
between context and continuation is exactly the harness's:
    {"prompt": [ids], "max_tokens": 0, "echo": true, "logprobs": 1, "temperature": 0}
The continuation's log-likelihood is the sum of token_logprobs over its tokens
(natural log, as the engine reports it); it is greedy when at each of its
tokens the token's own logprob is the top-1 logprob (logprobs: 1), i.e. the
token is the argmax (a tie counts as greedy).

Tokenization is kvbatch's own (`kvbatch tokenize --jsonl`: all the texts of a
call in one process), as the harness's TemplateLM defines it (context and
context+continuation encoded, the continuation being what follows the context's
tokens; trailing spaces of the context moved to the continuation). Special-token
text in the strings is parsed as the special token, as Hugging Face tokenizers
do by default (parse_special=false turns that off).

Use it from Python:
    import kvbatch_lm_eval, lm_eval
    lm_eval.simple_evaluate(model="kvbatch", model_args="binary=build/kvbatch,model=M.gguf,cache_dir=D",
                            tasks=[...], task_manager=lm_eval.tasks.TaskManager(include_path=...))
or pass a KvbatchLM instance as `model` (its `runs` then lists every kvbatch run's
figures), or from the shell through scripts/lm-eval.sh (lm_eval's CLI with this
module imported first).

model_args (all optional): binary (kvbatch; default $KVBATCH_BIN, else the
repository's build/kvbatch, else `kvbatch` on PATH), model (GGUF; default
$KVBATCH_MODEL, else the repository's default model), cache_dir, no_cache,
max_batch, threads, kv_mem, block_size (KV block size; default 8, see below),
max_length (tokens of input per scoring window;
default min(the model's context - 2, 4096); the engine runs with --ctx
max_length + 2: a scored sequence carries its last token too, and run keeps
room for one generated token even with max_tokens 0), add_bos (default: the
GGUF's tokenizer.ggml.add_bos_token), max_gen_toks
(default 256), prefix_token_id (default BOS, else EOS: the context of an empty
context and of a rolling window's first token), parse_special, work_dir (keep job,
result, log and metrics files there; default a temporary folder removed at exit),
metrics (the metrics database; default work_dir/metrics.db), extra_args (more
`kvbatch run` options, space-separated), quiet.

Why block_size 8 (kvbatch run's default is 16): prompt scores are cached with whole KV
blocks, so a night's rerun computes again only each request's tail past its last full
block, plus one position. A multiple-choice item is a short continuation behind a long
shared context; at 16 that tail was 6.6 % of the prompt tokens of scripts/bench-eval.sh's
task on a warm cache (2.6-3x faster than cold), at 8 it is 3.6 % (6x faster), with the
same scores.
"""
import atexit
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import lm_eval.models  # noqa: F401  (lm_eval fills its registry only while it is empty: fill it first)
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MAX_STOP = 8  # stop strings per request the job format takes (jobs/job.h JOB_MAX_STOP)
# sampling kwargs a task may give that mean the same in a kvbatch request body
GEN_FIELDS = ("top_p", "top_k", "min_p", "seed", "repetition_penalty", "presence_penalty", "frequency_penalty")


def _bool(v):
    return v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes", "on")


def default_binary():
    if os.environ.get("KVBATCH_BIN"):
        return os.environ["KVBATCH_BIN"]
    built = os.path.join(ROOT, "build", "kvbatch")
    return built if os.access(built, os.X_OK) else (shutil.which("kvbatch") or built)


def default_model():
    return os.environ.get("KVBATCH_MODEL") or os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


class GGUFInfo:
    """What the adapter needs from the model file: context length, BOS/EOS and
    their texts, the chat template (gguf-py reads only the header; the tensors
    stay mapped, unread)."""

    def __init__(self, path):
        import gguf
        r = gguf.GGUFReader(path)

        def field(key, default=None):
            f = r.fields.get(key)
            return default if f is None else f.contents()

        arch = field("general.architecture")
        self.n_ctx_train = field("%s.context_length" % arch, 2048)
        self.bos = field("tokenizer.ggml.bos_token_id")
        self.eos = field("tokenizer.ggml.eos_token_id")
        self.add_bos = bool(field("tokenizer.ggml.add_bos_token", False))
        self.chat_template = field("tokenizer.chat_template")
        tokens = r.fields.get("tokenizer.ggml.tokens")
        text = lambda i: "" if i is None or tokens is None else tokens.contents(i)  # noqa: E731
        self.bos_text, self.eos_text = text(self.bos), text(self.eos)  # what a chat template calls them


class Tokenizer:
    """kvbatch's tokenizer: `kvbatch tokenize --jsonl`, every text of a call in one process."""

    def __init__(self, binary, model, parse_special=True):
        self.binary, self.model, self.special = binary, model, parse_special
        self.processes = 0  # tokenize processes run (for the tests and the curious)

    def _run(self, data, special, jsonl=False):
        cmd = [self.binary, "tokenize", "--model", self.model] + (["--special"] if special else []) + \
            (["--jsonl"] if jsonl else [])
        p = subprocess.run(cmd, input=data, capture_output=True)
        self.processes += 1
        if p.returncode != 0:
            raise RuntimeError("kvbatch tokenize failed (%d): %s" % (p.returncode, p.stderr.decode(errors="replace")))
        return p.stdout

    def encode_bytes(self, data, special=False):
        """The ids of raw bytes (a whole file, as llama-perplexity reads it)."""
        return [int(x) for x in self._run(data, special).split()]

    def encode_many(self, texts):
        """[ids of each text], through one process."""
        texts = list(texts)
        if not texts:
            return []
        # ensure_ascii keeps each JSON line free of raw newlines and odd bytes
        data = "".join(json.dumps(t) + "\n" for t in texts).encode()
        lines = self._run(data, self.special, jsonl=True).decode().split("\n")
        if len(lines) != len(texts) + 1 or lines[-1] != "":
            raise RuntimeError("kvbatch tokenize --jsonl gave %d lines for %d texts" % (len(lines) - 1, len(texts)))
        return [[int(x) for x in line.split()] for line in lines[:-1]]

    def encode(self, text):
        return self.encode_many([text])[0]


class ChatPrompt(str):
    """A chat rendered to text (for scoring) that remembers its messages (for
    generation, which sends them to /v1/chat/completions)."""

    def __new__(cls, text, messages, add_generation_prompt):
        s = super().__new__(cls, text)
        s.messages, s.add_generation_prompt = messages, add_generation_prompt
        return s


@register_model("kvbatch")
class KvbatchLM(TemplateLM):
    def __init__(self, binary=None, model=None, cache_dir=None, no_cache=False, max_batch=None,
                 threads=None, kv_mem=None, block_size=8, max_length=None, max_gen_toks=256, prefix_token_id=None,
                 parse_special=True, add_bos=None, work_dir=None, metrics=None, extra_args="", quiet=False,
                 batch_size=None, max_batch_size=None, device=None, **unknown):
        super().__init__()
        if unknown:
            raise ValueError("kvbatch model_args: unknown %s" % ", ".join(sorted(unknown)))
        # batch_size / max_batch_size / device are what lm_eval passes every model; the
        # engine batches by itself (max_batch) and picks its device (extra_args=--device ...)
        self.binary = binary or default_binary()
        self.model_path = model or default_model()
        for what, p in (("binary", self.binary), ("model", self.model_path)):
            if not os.path.exists(p):
                raise FileNotFoundError("kvbatch %s %s does not exist" % (what, p))
        self.info = GGUFInfo(self.model_path)
        self.tok = Tokenizer(self.binary, self.model_path, _bool(parse_special))
        add_bos = self.info.add_bos if add_bos in (None, "") else _bool(add_bos)
        self.bos_first = [self.info.bos] if add_bos and self.info.bos is not None else []
        self._max_length = int(max_length) if max_length else min(self.info.n_ctx_train - 2, 4096)
        self.max_gen_toks = int(max_gen_toks)
        self._prefix = int(prefix_token_id) if prefix_token_id not in (None, "") else (
            self.info.bos if self.info.bos is not None else self.info.eos)
        # a scored sequence is max_length inputs + its last token, and run refuses a prompt
        # that leaves no room for one generated token even with max_tokens 0: hence + 2
        self.run_args = ["--ctx", str(self._max_length + 2)]
        if _bool(no_cache):
            self.run_args.append("--no-cache")
        elif cache_dir:
            self.run_args += ["--cache-dir", str(cache_dir)]
        for flag, v in (("--max-batch", max_batch), ("--threads", threads), ("--kv-mem", kv_mem),
                        ("--block-size", block_size)):
            if v not in (None, ""):
                self.run_args += [flag, str(v)]
        self.run_args += shlex.split(str(extra_args or ""))
        self.quiet = _bool(quiet)
        if work_dir:
            os.makedirs(work_dir, exist_ok=True)
            self.work_dir = work_dir
        else:
            self.work_dir = tempfile.mkdtemp(prefix="kvbatch-lm-eval-")
            atexit.register(shutil.rmtree, self.work_dir, True)
        self.metrics = metrics or os.path.join(self.work_dir, "metrics.db")
        self.runs = []  # one dict per kvbatch run: kind, files, wall_s, the report's prefix reuse

    # --- what TemplateLM and the harness ask of a model --------------------------------

    @property
    def eot_token_id(self):
        return self.info.eos

    @property
    def prefix_token_id(self):
        return self._prefix

    @property
    def max_length(self):
        return self._max_length

    @property
    def tokenizer_name(self):
        return os.path.basename(self.model_path)

    def chat_template(self, chat_template=False):
        return self.info.chat_template if chat_template not in (False, None) else None

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        # the GGUF says whether BOS goes first (SmolLM2: no); add_special_tokens=False never adds it
        ids = self.tok.encode(string)
        return ids if add_special_tokens is False else self.bos_first + ids

    def _encode_all(self, strings):
        """tok_encode over many strings with one tokenize process; {string: ids}."""
        uniq = list(dict.fromkeys(strings))
        ids = self.tok.encode_many(uniq)
        return {s: self.bos_first + i for s, i in zip(uniq, ids)}

    def apply_chat_template(self, chat_history, add_generation_prompt=True):
        """The model's own (Jinja) chat template, rendered as transformers renders
        it, so that scoring sees the text a Hugging Face run would; the messages
        ride along for generation (kvbatch's template gives the same text for the
        templates it knows)."""
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        if not self.info.chat_template:
            raise ValueError("%s has no chat template" % self.model_path)

        def raise_exception(msg):
            raise jinja2.exceptions.TemplateError(msg)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        text = env.from_string(self.info.chat_template).render(
            messages=chat_history, add_generation_prompt=add_generation_prompt,
            bos_token=self.info.bos_text, eos_token=self.info.eos_text)
        if not add_generation_prompt and chat_history:
            # continue_final_message: cut what the template writes after the last message
            last = chat_history[-1]["content"].strip()
            text = text[:text.rindex(last) + len(last)]
        return ChatPrompt(text, chat_history, add_generation_prompt)

    # --- scoring ------------------------------------------------------------------------

    def loglikelihood(self, requests, disable_tqdm=False):
        """TemplateLM.loglikelihood's encoding, with every string tokenized at once."""
        pairs = [req.args for req in requests]
        strings = []
        for context, continuation in pairs:
            if context == "":
                strings.append(continuation)
            else:
                context, continuation = _move_spaces(context, continuation)
                strings += [context, context + continuation]
        enc = self._encode_all(strings)
        new_reqs = []
        for context, continuation in pairs:
            if context == "":
                # TemplateLM: an empty context is the prefix token (unless the continuation starts with it)
                cont = enc[continuation][len(self.bos_first):]
                ctx_enc, cont_enc = ([self.prefix_token_id], cont) if not cont or cont[0] != self.prefix_token_id \
                    else (cont[:1], cont[1:])
            else:
                c, w = _move_spaces(context, continuation)
                ctx_enc = enc[c]
                cont_enc = enc[c + w][len(ctx_enc):]
            new_reqs.append(((context, continuation), ctx_enc, cont_enc))
        return self._loglikelihood_tokens(new_reqs, disable_tqdm=disable_tqdm)

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        """[(logprob, is_greedy)] of each (key, context ids, continuation ids), all in one run."""
        seqs = []
        for _, ctx, cont in requests:
            # as HFLM: the last max_length + 1 tokens, the continuation's scored
            seq = (list(ctx) + list(cont))[-(self._max_length + 1):]
            seqs.append((seq, min(len(cont), len(seq) - 1)))
        scores = self.score(seqs, kind="loglikelihood")
        out = []
        for (key, _, _), res in zip(requests, scores):
            if key is not None and key[0] is not None:
                self.cache_hook.add_partial("loglikelihood", key, res)
            out.append(res)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """Each text's whole log-likelihood: the harness's rolling windows of
        max_length (lm_eval.utils, context_len=1), each window one request."""
        texts = [req.args[0] for req in requests]
        enc = self._encode_all(texts)
        seqs, owner = [], []
        for n, text in enumerate(texts):
            windows = map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                token_list=enc[text][len(self.bos_first):], prefix_token=self.prefix_token_id,
                max_seq_len=self._max_length, context_len=1))
            for ctx, cont in windows:
                seqs.append((list(ctx) + list(cont), len(cont)))
                owner.append(n)
        scores = self.score(seqs, kind="loglikelihood_rolling")
        totals = [0.0] * len(texts)
        for n, (lp, _) in zip(owner, scores):
            totals[n] += lp
        for text, total in zip(texts, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        return totals

    def score(self, seqs, kind="score"):
        """[(sum of the last k tokens' logprobs, all of them greedy)] for each
        (token ids, k), through one kvbatch run (identical sequences sent once)."""
        uniq = {}
        for seq, _ in seqs:
            uniq.setdefault(tuple(seq), len(uniq))
        lines = [{"custom_id": "s%d" % i, "method": "POST", "url": "/v1/completions",
                  "body": {"prompt": list(seq), "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0}}
                 for seq, i in uniq.items()]
        results = self.run_job(lines, kind)
        out = []
        for seq, k in seqs:
            lp = results["s%d" % uniq[tuple(seq)]]["choices"][0]["logprobs"]
            out.append(continuation_score(lp, len(seq), k))
        return out

    # --- generation ---------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm=False):
        from lm_eval.models.utils import normalize_gen_kwargs
        plain = [req.args[0] for req in requests if not isinstance(req.args[0], ChatPrompt)]
        enc = self._encode_all(plain)
        lines, untils = [], []
        for n, req in enumerate(requests):
            context, gen_kwargs = req.args
            kw = normalize_gen_kwargs(dict(gen_kwargs or {}), self.max_gen_toks)
            until = [s for s in (kw.pop("until", None) or []) if s]
            max_gen = int(kw.pop("max_gen_toks"))
            if max_gen >= self._max_length:
                raise ValueError("max_gen_toks %d is not below max_length %d" % (max_gen, self._max_length))
            # normalize_gen_kwargs has set temperature 0 unless do_sample
            body = {"max_tokens": max_gen, "temperature": float(kw.pop("temperature", 0.0) or 0.0)}
            kw.pop("do_sample", None)
            for f in GEN_FIELDS:
                if f in kw:
                    body[f] = kw.pop(f)
            if kw:
                lm_utils.eval_logger.warning("kvbatch: generation kwargs ignored: %s", sorted(kw))
            if until:
                body["stop"] = until[:MAX_STOP]  # the rest are cut below
            if isinstance(context, ChatPrompt):
                url = "/v1/chat/completions"
                body["messages"] = context.messages
                if not context.add_generation_prompt:
                    body["add_generation_prompt"] = False
                    body["continue_final_message"] = True
            else:
                url = "/v1/completions"
                # as HFLM: the context's last max_length - max_gen_toks tokens
                body["prompt"] = enc[context][-(self._max_length - max_gen):]
            lines.append({"custom_id": "g%d" % n, "method": "POST", "url": url, "body": body})
            untils.append(until)
        results = self.run_job(lines, "generate_until")
        out = []
        for n, req in enumerate(requests):
            choice = results["g%d" % n]["choices"][0]
            text = choice["message"]["content"] if "message" in choice else choice["text"]
            for stop in untils[n]:
                text = text.split(stop)[0]
            self.cache_hook.add_partial("generate_until", req.args, text)
            out.append(text)
        return out

    # --- the run ------------------------------------------------------------------------

    def run_job(self, lines, kind):
        """Writes the job, runs `kvbatch run` once, returns {custom_id: response body}."""
        n = len(self.runs)
        job = os.path.join(self.work_dir, "%03d-%s.jsonl" % (n, kind))
        out = os.path.join(self.work_dir, "%03d-%s.out.jsonl" % (n, kind))
        log = os.path.join(self.work_dir, "%03d-%s.log" % (n, kind))
        with open(job, "w") as f:
            for line in lines:
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
        cmd = [self.binary, "run", "--model", self.model_path, "--input", job, "--output", out,
               "--metrics", self.metrics] + self.run_args
        t0 = time.time()
        with open(log, "w") as logf:
            rc = subprocess.run(cmd, stderr=logf, stdout=logf).returncode
        wall = time.time() - t0
        with open(log, errors="replace") as logf:
            log_text = logf.read()
        if rc != 0:
            raise RuntimeError("%s exited %d:\n%s" % (" ".join(cmd), rc, log_text[-4000:]))
        results, errors = {}, []
        with open(out) as f:
            for raw in f:
                if not raw.strip():
                    continue
                r = json.loads(raw)
                resp = r.get("response") or {}
                if r.get("error") or resp.get("status_code") != 200:
                    errors.append(r)
                else:
                    results[r["custom_id"]] = resp["body"]
        if errors or len(results) != len(lines):
            first = json.dumps(errors[0])[:2000] if errors else "(no error line)"
            raise RuntimeError("kvbatch run %s: %d of %d requests failed or missing; first: %s"
                               % (job, len(lines) - len(results), len(lines), first))
        stats = {"kind": kind, "requests": len(lines), "wall_s": wall, "job": job, "output": out,
                 "summary": _summary_line(log_text)}
        stats.update(self.report())
        self.runs.append(stats)
        if not self.quiet:
            print("kvbatch %s: %d requests in %.1f s; %s" % (kind, len(lines), wall, stats["summary"]),
                  file=sys.stderr)
        return results

    def report(self):
        """The latest run's prefix reuse, from `kvbatch report --format json`."""
        p = subprocess.run([self.binary, "report", self.metrics, "--format", "json"], capture_output=True, text=True)
        if p.returncode != 0:
            return {}
        rep = json.loads(p.stdout)
        reuse = rep.get("prefix_reuse") or {}
        tok = lambda k: (reuse.get(k) or {}).get("tokens")  # noqa: E731
        return {"run_id": rep.get("run", {}).get("id"), "prompt_tokens": reuse.get("prompt_tokens"),
                "reused_in_run": tok("in_run_cache"), "from_cache": tok("persistent_store"),
                "computed": tok("computed"), "engine_wall_s": rep.get("run", {}).get("wall_seconds")}


def continuation_score(logprobs, n_tokens, k):
    """(sum of the last k token_logprobs, whether each of those tokens is the
    top-1) from a legacy logprobs object over n_tokens echoed prompt tokens."""
    lps, tops = logprobs["token_logprobs"], logprobs["top_logprobs"]
    if len(lps) != n_tokens:
        raise RuntimeError("echo gave %d token logprobs for a %d-token prompt" % (len(lps), n_tokens))
    total, greedy = 0.0, True
    for i in range(n_tokens - k, n_tokens):
        total += lps[i]
        best = max(tops[i].values()) if tops[i] else lps[i]
        greedy = greedy and lps[i] >= best
    return total, greedy


def _move_spaces(context, continuation):
    """TemplateLM._encode_pair: trailing spaces of the context belong to the continuation."""
    n = len(context) - len(context.rstrip())
    return (context[:-n], context[-n:] + continuation) if n else (context, continuation)


def _summary_line(log_text):
    """run's summary line on stderr ("... N prompt tokens (N reused in-run, N from the cache, N computed) ...")."""
    lines = [ln for ln in log_text.splitlines() if "reused in-run" in ln]
    return lines[-1].strip() if lines else ""
