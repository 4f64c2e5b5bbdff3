"""The request-space test's engine (tests/pytest_request_space.py runs it in
CI with a fixed seed list, scripts/request-space.sh for longer before a
release).

A generator of random request lines over every body field the job format
accepts: valid values, edge values (0, 1, empty lists, true/false, maxima,
unicode, content-part arrays, assistant-last conversations, every role,
output constraints sized at, just under and past each limit of the grammar
engine: nesting, alternation width, choice counts, rule chains, regex and
schema nesting, text size — a refusal must name the field and the limit),
fields ignored on purpose, and invalid ones (wrong types, out of range,
unknown fields, broken JSON, duplicate ids). Each line carries what kvbatch
must answer: a 200, a 400, or either where the rules leave it open. A run
goes through the real `kvbatch run` on the real model, killed once at a
random moment (SIGKILL or SIGTERM) and resumed, and is then checked:

- exit 0, exactly one output line per input line, each valid JSON (no NaN);
- every 200 body accepted strictly by the openai package's ChatCompletion or
  Completion (pydantic strict mode, no field the type does not know, and the
  same JSON back from the model), consistent with its request (choices
  per prompt, logprobs when asked, usage adding up, finish reasons);
- every error line an `error` object that OpenAI's BatchError accepts
  strictly, with the code, message, param and line of its input line, and a
  response body whose error OpenAI's ErrorObject accepts;
- the expected kind of line for each input line, custom_ids echoed exactly.

Needs the openai package (the venv /root/.cache/kvbatch-venv has it).
"""
import json
import re
import os
import random
import signal
import subprocess
import time

try:
    from openai.types import BatchError, Completion
    from openai.types.chat import ChatCompletion
    from openai.types.shared import ErrorObject
    from pydantic import BaseModel
except ImportError:  # the caller re-executes in the venv or skips
    BatchError = None

OK, BAD, EITHER = "ok", "bad", "either"
N_VOCAB = 49152  # the default model's; ids at or above are refused

UNICODE = ["caf\u00e9", "\u65e5\u672c\u8a9e", "\U0001F600 emoji", "e\u0301 combining", "\u0645\u0631\u062d\u0628\u0627",
           "tab\there", "new\nline", "quote \" and \\ backslash", "<|im_start|>not special<|im_end|>", "\u0000nul",
           "\ud800 lone", "", " ", "a" * 300]
WORDS = ["Say yes.", "Name a color.", "Count to three.", "Hi", "What is 2+2?", "Write a haiku.", "Translate: chat",
         "List two fruits.", "Why is the sky blue?", "Reply with JSON."]


class Gen:
    """One seed's lines. Each line: (text, expectation, info) where info
    keeps what the checks need (custom_id as written, url, n, prompts, ...)."""

    def __init__(self, seed, n_ctx=4096):
        self.r = random.Random(seed)
        self.n_ctx = n_ctx  # the run's --ctx: token-id prompts at and past it are refused
        self.ids = {}  # custom_id -> "claimed" once a line that parses uses it
        self.k = 0
        self.pbad = 0.0  # chance of a bad value at each place that can hold one (set per line)
        # chance of a line whose constraint is sized at or past a limit (constraint_edge); raised by
        # KVB_REQSPACE_EDGE for a run aimed at the limits
        self.p_edge = float(os.environ.get("KVB_REQSPACE_EDGE", "0.03"))

    # ---- small pieces ---------------------------------------------------------------

    def text(self):
        r = self.r
        if r.random() < 0.3:
            return r.choice(UNICODE)
        return r.choice(WORDS)

    def custom_id(self):
        self.k += 1
        r = self.r
        base = f"r{self.k}"
        v = r.random()
        if v < 0.05:
            return base + "\ud800"  # lone surrogates stay as written
        if v < 0.1:
            return base + " \u00e9\"\\/"
        if v < 0.12:
            return base + "\u0000"
        return base

    def content(self, role, bad):
        r = self.r
        v = 1.0 if r.random() < self.pbad else r.random() * 0.88
        if v < 0.6:
            return self.text()
        if v < 0.8:
            return [{"type": "text", "text": self.text()} for _ in range(r.randint(1, 3))]
        if v < 0.85 and role == "assistant":
            return None  # a tool-calling turn's content
        if v < 0.88:
            return []  # no parts: empty text
        bad.append("content")
        return r.choice([5, None if role != "assistant" else 7, [{"type": "image_url", "image_url": {"url": "x"}}],
                         [{"type": "text"}], [{"text": "x"}], {"a": 1}])

    def messages(self, bad):
        r = self.r
        n = r.choice([1, 1, 2, 3, 4])
        msgs = []
        for i in range(n):
            role = r.choice(["system", "user", "user", "assistant", "developer"]) if i < n - 1 else \
                r.choice(["user", "user", "user", "assistant", "system", "developer"])
            m = {"role": role, "content": self.content(role, bad)}
            v = r.random()
            if v < 0.05:
                m["name"] = "someone"
            elif v < 0.08 and role == "assistant":
                m["tool_calls"] = []
            elif r.random() < self.pbad / 2:
                m["role"] = r.choice(["tool", "bot", "User", 3])
                bad.append("role")
            elif r.random() < self.pbad / 2:
                m["weight"] = 1
                bad.append("message field")
            msgs.append(m)
        if r.random() < self.pbad / 4:
            bad.append("messages")
            return r.choice([[], "hi", {"role": "user"}])
        return msgs

    def prompt(self, bad, info):
        r = self.r
        v = 1.0 if r.random() < self.pbad else r.random() * 0.82
        if v < 0.4:
            p = self.text()
            if p == "":
                bad.append("empty prompt")  # no tokens (the model adds no BOS)
            info["n_prompts"] = 1
            return p
        if v < 0.55:
            ps = [r.choice(WORDS) for _ in range(r.choice([1, 2, 3, 3, 8, 40]))]
            info["n_prompts"] = len(ps)
            return ps
        if v < 0.7:
            ids = [r.randrange(0, 5000) for _ in range(r.randint(1, 6))]
            if r.random() < (0.03 if self.n_ctx <= 512 else 0.002):  # at the context's edge: just short fits
                ids = [r.randrange(0, N_VOCAB) for _ in range(self.n_ctx - r.choice([1, 2, 0]))]
                if len(ids) >= self.n_ctx:
                    bad.append("context length")
            if r.random() < self.pbad:
                ids[-1] = r.choice([N_VOCAB, N_VOCAB + 7, 2 ** 31])
                bad.append("token id")
            info["n_prompts"] = 1
            return ids
        if v < 0.82:
            ps = [[r.randrange(0, 5000) for _ in range(r.randint(1, 4))] for _ in range(r.randint(1, 3))]
            info["n_prompts"] = len(ps)
            return ps
        bad.append("prompt")
        info["n_prompts"] = 1
        return r.choice([[], [[]], ["a", [1]], [1, "a"], 5, {"p": 1}, [1.5], [-1], [True]])

    # ---- constraints at and past the engine's limits ----------------------------------

    def constraint_edge(self, info):
        """A constraint sized at, just under or past one of the limits of
        engine/grammar.h, grammar_regex.h and grammar_schema.h (nesting,
        alternation width, choice count, rule chains, text size): (field,
        value, within, limit) where within says whether it must run, and
        limit is the number a refusal names. Sets info["choice"] or
        info["regex"] to what the output must match."""
        r = self.r
        kind = r.choice(["nest", "nest", "width", "choices", "choices", "left-chain", "left-chain", "tail-chain",
                         "regex-nest", "regex-count", "schema-nest", "schema-nest", "text-size"])
        so = r.random() < 0.5  # structured_outputs.X or the older guided_X
        def gbnf(g):
            return ("structured_outputs", {"grammar": g}) if so else ("guided_grammar", g)
        if kind == "nest":  # GRAMMAR_MAX_NEST groups inside groups
            k = r.choice([1, 40, 1023, 1024, 1025, 1025, 3000, 100000])
            name, value = gbnf("root ::= " + "(" * k + '"a"' + ")" * k)
            info["choice"] = ["a"]
            return name, value, k <= 1024, 1024
        if kind == "width":  # GRAMMAR_MAX_STACKS alternatives open at the start
            k = r.choice([2, 300, 4095, 4096, 4097, 4097, 20000])
            alts = [f"c{i}" for i in range(k)]
            name, value = gbnf("root ::= " + " | ".join(f'"{a}"' for a in alts))
            info["choice"] = alts
            return name, value, k <= 4096, 4096
        if kind == "choices":  # GRAMMAR_MAX_CHOICES strings
            k = r.choice([1, 2, 4095, 4096, 4097, 4097, 10000])
            words = [r.choice(["w", "\u00e9", "x y ", "\u65e5"]) + str(i) for i in range(k)]
            words = [json.loads('"' + w + '"') for w in words]
            info["choice"] = words
            name, value = ("structured_outputs", {"choice": words}) if so else ("guided_choice", words)
            return name, value, k <= 4096, 4096
        if kind == "left-chain":  # GRAMMAR_MAX_DEPTH: each rule the next one's first item
            k = r.choice([1, 10, 1000, 1024, 1025, 1025, 2000])
            g = "root ::= r0\n" + "".join(f'r{i} ::= r{i + 1} "a"\n' for i in range(k - 1)) + f'r{k - 1} ::= "a"\n'
            name, value = gbnf(g)
            info["regex"] = "a{%d}" % k
            return name, value, k <= 1024, 1024
        if kind == "tail-chain":  # each rule the next one's whole body: no limit, a long walk for the checks
            k = r.choice([10, 1000, 50000])
            g = "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(k - 1)) + f'r{k - 1} ::= "b" | "c"\n'
            name, value = gbnf(g)
            info["choice"] = ["b", "c"]
            return name, value, True, None
        if kind == "regex-nest":  # the regex parser's 100 groups inside groups
            k = r.choice([1, 99, 100, 101, 101, 5000])
            re_ = "(" * k + "ab" + ")" * k
            info["regex"] = "ab"
            name, value = ("structured_outputs", {"regex": re_}) if so else ("guided_regex", re_)
            return name, value, k <= 100, 100
        if kind == "regex-count":  # GREGEX_MAX_COUNT
            k = r.choice([1, 999, 1000, 1001, 1001])
            re_ = "x{%d}" % k
            info["regex"] = re_
            name, value = ("structured_outputs", {"regex": re_}) if so else ("guided_regex", re_)
            return name, value, k <= 1000, 1000
        if kind == "schema-nest":  # GSCHEMA_MAX_NEST schemas inside schemas
            k = r.choice([2, 40, 63, 64, 65, 65, 100])
            sch = {"type": "integer"}
            for _ in range(k - 1):
                sch = {"type": "object", "properties": {"a": sch}, "required": ["a"]}
            name, value = ("structured_outputs", {"json": sch}) if so else ("guided_json", sch)
            return name, value, k <= 64, 64
        # text-size: GRAMMAR_MAX_TEXT bytes of constraint text (a grammar padded with a comment)
        k = r.choice([8 << 20, (8 << 20) + 1, 9 << 20])
        head = 'root ::= "z"\n#'
        name, value = gbnf(head + "p" * (k - len(head)))
        info["choice"] = ["z"]
        return name, value, k <= (8 << 20), 8 << 20

    # ---- a line -----------------------------------------------------------------------

    def field(self, name, good, bad_values, body, bad, p=0.5):
        """Sets body[name] to a bad value with probability self.pbad, else
        to a good one with probability p."""
        r = self.r
        if bad_values and r.random() < self.pbad:
            body[name] = r.choice(bad_values)
            bad.append(name)
        elif r.random() < p:
            body[name] = r.choice(good)

    def line(self):
        r = self.r
        bad, maybe = [], []
        # a third of the lines are meant to hold something wrong, a few things at most
        self.pbad = 0.08 if r.random() < 0.35 else 0.0
        info = {}
        chat = r.random() < 0.55
        info["url"] = "/v1/chat/completions" if chat else "/v1/completions"
        body = {}
        if chat:
            body["messages"] = self.messages(bad)
        else:
            body["prompt"] = self.prompt(bad, info)
        f = self.field
        # sizes stay small: the run must fit in CI's minutes
        # scoring (echo, prompt_logprobs) first: it lets max_tokens be 0
        if not chat:
            f("echo", [False, True], ["yes"], body, bad, p=0.15)
        else:
            f("echo", [False], [True], body, bad, p=0.04)
        f("prompt_logprobs", [None, 0, 1, 5, 20], [-1, 21, "x"], body, bad, p=0.12)
        scoring = body.get("echo") is True and not chat or isinstance(body.get("prompt_logprobs"), int)
        f("max_tokens", [1, 2, 3, 5, 8] + ([0, 0] if scoring else []), ([] if scoring else [0]) + [-1, 2.5, "8", 2 ** 40],
          body, bad, p=0.85)
        if r.random() < 0.1:
            body.pop("max_tokens", None)
            if "max_tokens" in bad:
                bad.remove("max_tokens")
            body["max_completion_tokens"] = r.choice([1, 4, 6])
        if "max_tokens" not in body and "max_completion_tokens" not in body:
            body["max_tokens"] = 4  # the default (256) is too long for CI
        mt = body.get("max_completion_tokens", body.get("max_tokens"))
        f("temperature", [0, 0, 0.5, 1, 2, 1e-9, None], [-0.1, 2.01, "0"], body, bad)
        f("top_p", [1, 0.5, 1e-6, 0.99], [0, 1.1, -1], body, bad, p=0.2)
        f("top_k", [-1, 0, 1, 5, 40, 100000], [-2, 1.5], body, bad, p=0.2)
        f("min_p", [0, 0.1, 1], [1.5, -0.1], body, bad, p=0.15)
        f("seed", [0, 1, -1, 42, 2 ** 64 - 1, -2 ** 63, 7.0], [2 ** 64, 1.5, "1", 1e300], body, bad, p=0.4)
        f("stop", ["\n", ".", ["a", "b"], [], ["\u00e9"], " ", ["e", "s", "t", " ", ".", ",", "\n", "a"], "\U0001F600",
                   "<|im_end|>"], ["", [""], ["a"] * 9, 5, [5]], body, bad, p=0.25)
        f("n", [1, 1, 2, 3, 16], [0, 17, 1.5], body, bad, p=0.25)
        f("presence_penalty", [-2, 0, 2, 0.5], [2.5, -3], body, bad, p=0.1)
        f("frequency_penalty", [-2, 0, 2], [9], body, bad, p=0.1)
        f("repetition_penalty", [1, 1.2, 2, 0.5], [0, 2.5, -1], body, bad, p=0.1)
        if chat:
            f("logprobs", [True, False], [1, "yes"], body, bad, p=0.25)
            if r.random() < 0.2:
                if not self.pbad:
                    body["logprobs"] = True
                body["top_logprobs"] = r.choice([0, 1, 5, 20] + ([21, -1] if self.pbad else []))
                if body["top_logprobs"] in (21, -1) or body.get("logprobs") is not True:
                    bad.append("top_logprobs")
        else:
            f("logprobs", [0, 1, 5, 20], [21, -1, True], body, bad, p=0.25)
        f("logit_bias", [{}, {"0": 100}, {"5": -100, "11": 2.5}, {str(N_VOCAB - 1): 1}],
          [{"x": 1}, {"0": 101}, {str(N_VOCAB): 1}, {" 5": 1}, []], body, bad, p=0.15)
        f("response_format", [{"type": "text"}, {"type": "json_object"},
                              {"type": "json_schema", "json_schema": {"name": "s", "strict": True, "schema": {
                                  "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}],
          [{"type": "xml"}, {}, {"type": "json_schema"}, {"type": "text", "x": 1}], body, bad, p=0.12)
        # the other constraint forms (vLLM's), at most one besides response_format; choice and regex
        # outputs are checked against their constraint (check_result)
        edge = r.random() < self.p_edge
        if edge or r.random() < 0.12:
            good = [("structured_outputs", {"choice": ["yes", "no", "maybe so"]}),
                    ("structured_outputs", {"regex": "[a-c]{1,3}x?"}),
                    ("structured_outputs", {"grammar": 'root ::= "v" [0-9]+'}),
                    ("structured_outputs", {"json": {"type": "object"}}), ("guided_choice", ["A", "B", "C", "D"]),
                    ("guided_regex", "(ab|cd)+"), ("guided_grammar", 'root ::= ("x" | "y")+'),
                    ("guided_json", {"type": "object", "properties": {"k": {"enum": [1, 2]}}, "required": ["k"]})]
            wrong = [("structured_outputs", {"choice": []}), ("structured_outputs", {"regex": "(?=a)b"}),
                     ("structured_outputs", {"grammar": "root ::= nothere"}),
                     ("structured_outputs", {"regex": "a", "choice": ["b"]}), ("structured_outputs", "a"),
                     ("guided_choice", "A"), ("guided_regex", 5), ("guided_grammar", "root ::= [")]
            name, value = r.choice(wrong) if self.pbad and r.random() < 0.5 else r.choice(good)
            if edge:
                name, value, within, limit = self.constraint_edge(info)
                info["edge"] = True
                if not within:
                    bad.append(f"{name} past its limit")
                    info["limit"] = (name, limit)
            body[name] = value
            if edge:
                pass  # constraint_edge said what the output must match
            elif (name, value) in wrong:
                bad.append(name)
            elif isinstance(value, list) or (isinstance(value, dict) and "choice" in value):
                info["choice"] = value if isinstance(value, list) else value["choice"]
            elif isinstance(value, str) and name == "guided_regex" or isinstance(value, dict) and "regex" in value:
                info["regex"] = value if isinstance(value, str) else value["regex"]
            rf = body.get("response_format")
            if isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema"):
                bad.append("two constraints")
        # vLLM's fields
        f("ignore_eos", [True, False], [1, "true"], body, bad, p=0.15)
        rf = body.get("response_format")
        constrained = isinstance(rf, dict) and rf.get("type") != "text" or any(
            k in body for k in ("structured_outputs", "guided_choice", "guided_regex", "guided_grammar", "guided_json"))
        if not self.pbad and body.get("ignore_eos") is True and constrained:
            body["ignore_eos"] = False  # refused together; only meant in a line meant wrong
        if r.random() < 0.15:
            body["min_tokens"] = r.choice([0, 1, mt if isinstance(mt, int) else 1] + ([3, -1] if self.pbad else []))
            if body["min_tokens"] < 0 or (isinstance(mt, int) and 0 <= mt < 2 ** 31 and body["min_tokens"] > mt):
                bad.append("min_tokens")
        f("stop_token_ids", [[], [2], [0, 2, 7], [N_VOCAB - 1], list(range(0, 2000, 8)), [28, 30, 216]],
          [[-1], [N_VOCAB], 2, ["2"], list(range(300))], body, bad, p=0.12)
        f("include_stop_str_in_output", [True, False], [0], body, bad, p=0.1)
        f("skip_special_tokens", [True, False], ["no"], body, bad, p=0.1)
        f("spaces_between_special_tokens", [True, False], [], body, bad, p=0.05)
        if chat:
            if r.random() < 0.1:
                body["add_generation_prompt"] = r.choice([True, False])
            if r.random() < 0.08:
                body["continue_final_message"] = r.choice([True, False])
                if body["continue_final_message"] and not self.pbad:  # made right, unless meant wrong
                    body["add_generation_prompt"] = False
                    if isinstance(body["messages"], list):
                        body["messages"].append({"role": "assistant", "content": r.choice(["The answer is", ""])})
                msgs = body["messages"]
                if body["continue_final_message"] and (body.get("add_generation_prompt", True) or
                                                       not isinstance(msgs, list) or not msgs or
                                                       not isinstance(msgs[-1], dict) or
                                                       msgs[-1].get("role") != "assistant"):
                    bad.append("continue_final_message")
            f("tools", [[]], [[{"type": "function", "function": {"name": "f"}}]], body, bad, p=0.03)
            f("tool_choice", ["none", "auto"], ["required", {"type": "function"}], body, bad, p=0.03)
        else:
            f("suffix", ["", None], ["tail"], body, bad, p=0.04)
            f("best_of", [1], [5], body, bad, p=0.04)
        # ignored on purpose, any value
        for name in ("stream", "user", "metadata", "store", "service_tier", "priority"):
            if r.random() < 0.04:
                body[name] = r.choice([True, "x", {"k": "v"}, 3, None, [[[[[[[[[[1]]]]]]]]]]])
        if r.random() < 0.03:
            body["model"] = r.choice(["SmolLM2", "gpt-4o-mini"])
        if r.random() < self.pbad:
            body[r.choice(["max_token", "guided_json", "guided_decoding_backend", "best", "truncate_prompt_tokens"])] = 1
            bad.append("unknown field")
        if not chat and r.random() < self.pbad / 3:
            body["messages"] = [{"role": "user", "content": "x"}]  # the other endpoint's field
            bad.append("messages in a completion")
        if chat and r.random() < self.pbad / 3:
            body["prompt"] = "x"
            bad.append("prompt in a chat")

        # cross-field rules
        n = body.get("n", 1)
        np = info.get("n_prompts", 1)
        if isinstance(n, int) and 1 <= n <= 16 and n * np > 128:
            bad.append("choices")
        rf = body.get("response_format")
        if body.get("ignore_eos") is True and (isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema")
                                               or constrained and "two constraints" not in bad):
            bad.append("ignore_eos with a constraint")
        bo = body.get("best_of")
        if isinstance(bo, int) and isinstance(n, int) and bo > n:
            bad.append("best_of")
        elif "best_of" in bad and isinstance(bo, int) and isinstance(n, int) and 1 <= bo <= n <= 16:
            bad.remove("best_of")  # the "bad" value 5 is allowed beside n >= 5 (best_of at most n)

        info["n"] = n if isinstance(n, int) and 1 <= n <= 16 else 1
        info["logprobs"] = body.get("logprobs") is not None and body.get("logprobs") is not False
        info["max_tokens"] = mt if isinstance(mt, int) and mt >= 0 and "max_tokens" not in bad else 256
        info["echo"] = body.get("echo") is True and not chat
        pl = body.get("prompt_logprobs")
        info["prompt_logprobs"] = pl if isinstance(pl, int) and 0 <= pl <= 20 else None
        info["ignore_eos"] = body.get("ignore_eos") is True and not body.get("stop") and not body.get("stop_token_ids")
        # a stop string, an echoed prompt or the end-of-text token's own text (include_stop_str_in_output)
        # leaves the text something other than the constrained output
        if body.get("stop") or body.get("stop_token_ids") or info.get("echo") or body.get("include_stop_str_in_output"):
            info.pop("choice", None)
            info.pop("regex", None)

        cid = self.custom_id()
        if r.random() < self.pbad / 2 and self.ids:
            cid = r.choice(list(self.ids))  # a duplicate of a line that parsed
            bad.append("duplicate")
        shorthand = r.random() < 0.4
        if shorthand:
            line = {"custom_id": cid, **body}
            if "url" in info and r.random() < 0.3:
                line["url"] = info["url"]
        else:
            line = {"custom_id": cid, "method": "POST", "url": info["url"], "body": body}
            if r.random() < 0.1:
                del line["method"]
        # raw (not \u-escaped) text half the time; a lone surrogate written raw
        # is not UTF-8, which a custom_id may not hold (content is repaired)
        raw_ok = not any(0xD800 <= ord(ch) <= 0xDFFF for ch in cid)
        text = json.dumps(line, ensure_ascii=not raw_ok or r.random() < 0.5,
                          separators=r.choice([(", ", ": "), (",", ":"), (" ,\t", " :  ")]))
        if r.random() < 0.03 and not shorthand:  # a repeated key: the last one counts
            text = text[:-1] + ', "url": ' + json.dumps(info["url"]) + "}"
        if r.random() < 0.03:
            text += "\r"  # CRLF line ends
        # lines that are not requests at all
        v = r.random() if self.pbad else 1.0
        if v < 0.06:
            text = text[: r.randint(1, max(1, len(text) - 1))]  # cut short
            bad.append("invalid json")
            cid = None
        elif v < 0.09:
            text = r.choice(["[1,2]", "\"str\"", "{}", "{\"custom_id\":5,\"prompt\":\"x\"}", "{\"prompt\":\"x\"}",
                             "{\"custom_id\":\"\",\"prompt\":\"x\"}", "null", "{\"custom_id\":\"q\",\"prompt\":\"x\",}"])
            bad.append("not a request")
            cid = None
        expect = BAD if bad else EITHER if maybe else OK
        # a custom_id is claimed by the first line with it that parses; the
        # generator only knows for sure of lines it made fully valid
        if cid is not None and not bad and not maybe:
            self.ids.setdefault(cid, True)
        info["custom_id"] = cid
        info["why"] = bad + maybe
        return text, expect, info

    def lines(self, count):
        out = []
        for _ in range(count):
            if self.r.random() < 0.02:
                out.append((self.r.choice(["", "   ", "\t"]), None, {}))  # blank: no output line
            out.append(self.line())
        return out


# ---- checks ----------------------------------------------------------------------------------

def no_nan(s):
    raise ValueError(f"non-JSON number {s}")


def extras(m, path="body"):
    """Fields a pydantic model kept without knowing them (extra='allow')."""
    out = []
    if isinstance(m, BaseModel):
        if m.model_extra:
            out.append(f"{path}: {sorted(m.model_extra)}")
        for k in type(m).model_fields:
            out += extras(getattr(m, k), f"{path}.{k}")
    elif isinstance(m, list):
        for i, x in enumerate(m):
            out += extras(x, f"{path}[{i}]")
    return out


def strict(model, data, what, fail, allowed=()):
    try:
        m = model.model_validate(data, strict=True)
    except Exception as e:  # pydantic.ValidationError and friends
        fail(f"{what}: {model.__name__} refuses it: {str(e)[:400]}")
        return None
    ex = [e for e in extras(m, what) if not any(e.endswith(f": ['{a}']") for a in allowed)]
    if ex:
        fail(f"{what}: fields {model.__name__} does not know: {ex}")
    if m.model_dump(mode="json", exclude_unset=True) != data:
        fail(f"{what}: {model.__name__} does not give the same JSON back")
    return m


def raw_custom_id(line):
    at = line.index('"custom_id":') + len('"custom_id":')
    if line.startswith("null", at):
        return None
    _, end = json.decoder.scanstring(line, at + 1)
    return line[at:end]


def check_output(inputs, out_text, fail, stats):
    """inputs: [(text, expect, info)] in file order; out_text: the output file."""
    lines = out_text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    else:
        fail("the output's last line is not terminated")
    nonblank = [i for i, (t, _, _) in enumerate(inputs) if t.strip()]
    if len(lines) != len(nonblank):
        fail(f"{len(lines)} output lines for {len(nonblank)} input lines")
    by_line, by_cid, seen_ids = {}, {}, set()
    for k, l in enumerate(lines):
        try:
            d = json.loads(l, parse_constant=no_nan)
        except ValueError as e:
            fail(f"output line {k + 1} is not valid JSON: {e}: {l[:200]}")
            continue
        if d.get("id") in seen_ids:
            fail(f"output line {k + 1}: id {d.get('id')} written twice")
        seen_ids.add(d.get("id"))
        if not isinstance(d.get("response"), dict) or "error" not in d:
            fail(f"output line {k + 1}: not a batch output line: {l[:200]}")
            continue
        if d["error"] is not None:
            e = d["error"]
            if not isinstance(e, dict) or not isinstance(e.get("line"), int):
                fail(f"output line {k + 1}: error without a line: {e}")
                continue
            by_line.setdefault(e["line"], []).append((d, l))
        else:
            by_cid.setdefault(d["custom_id"], []).append((d, l))
    for i, (text, expect, info) in enumerate(inputs):
        n = i + 1
        if not text.strip():
            continue
        got = by_line.pop(n, [])
        cid = info.get("custom_id")
        if not got and cid is not None:
            got = by_cid.pop(cid, [])
        if len(got) != 1:
            fail(f"input line {n}: {len(got)} output lines ({text[:150]})")
            continue
        d, raw = got[0]
        status = d["response"]["status_code"]
        stats[status] = stats.get(status, 0) + 1
        if expect == OK and status != 200:
            fail(f"input line {n}: expected a result, got {status} {d['error']}: {text[:300]}")
        if expect == BAD and status == 200:
            fail(f"input line {n}: expected an error ({info['why']}), got a result: {text[:300]}")
        if status == 500:
            fail(f"input line {n}: server error {d['error']}: {text[:300]}")
        if cid is not None and "duplicate" not in info["why"] and "invalid json" not in info["why"]:
            want = json.dumps(cid, ensure_ascii=False)
            got_raw = raw_custom_id(raw)
            if got_raw is not None and json.loads(got_raw) != cid:
                fail(f"input line {n}: custom_id {got_raw} is not {want}")
        if status == 200:
            check_result(n, d, info, fail)
        else:
            check_error(n, d, status, fail)
            lim = info.get("limit")
            if lim and info["why"] == [f"{lim[0]} past its limit"]:
                # the one thing wrong: the refusal names the field and the limit
                e = d["error"]
                stats["limits named"] = stats.get("limits named", 0) + 1
                if lim[0] not in (e.get("param") or "") or str(lim[1]) not in e.get("message", ""):
                    fail(f"input line {n}: a constraint past its limit ({lim[0]}, {lim[1]}) refused without naming "
                         f"both: {e}")
        if info.get("limit") or "edge" in info:
            stats["edge"] = stats.get("edge", 0) + 1
    for leftover in list(by_line.values()) + list(by_cid.values()):
        for d, _ in leftover:
            fail(f"an output line matches no input line: {json.dumps(d)[:200]}")


def check_result(n, d, info, fail):
    b = d["response"]["body"]
    what = f"line {n}"
    chat = info["url"] == "/v1/chat/completions"
    # vLLM's prompt_logprobs is the one field the openai types do not know, and only where asked
    pl = info.get("prompt_logprobs")
    # The openai package types completion logprobs as lists of floats and dicts, though the API (and
    # vLLM) write null for an echoed prompt's first token, as the job format does: that one entry is
    # checked below, the rest by the type.
    typed = b
    if info.get("echo") and not chat:
        typed = json.loads(json.dumps(b))
        for c in typed.get("choices", []):
            lp = c.get("logprobs")
            if isinstance(lp, dict) and lp.get("token_logprobs") and lp["token_logprobs"][0] is None:
                for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                    del lp[key][0]
    strict(ChatCompletion if chat else Completion, typed, what, fail, ("prompt_logprobs",) if pl is not None else ())
    if pl is not None:
        lists = [b.get("prompt_logprobs")] if chat else [c.get("prompt_logprobs") for c in b.get("choices", [])]
        for x in lists:
            check_prompt_logprobs(x, pl, what, fail)
    if d["id"] != "batch_req_" + d["response"]["request_id"][4:]:
        fail(f"{what}: id and request_id disagree")
    if b.get("object") != ("chat.completion" if chat else "text_completion"):
        fail(f"{what}: object {b.get('object')}")
    ch = b.get("choices", [])
    want = info["n"] * (1 if chat else info.get("n_prompts", 1))
    if [c.get("index") for c in ch] != list(range(want)):
        fail(f"{what}: choices {[c.get('index') for c in ch]}, want {want}")
    u = b.get("usage", {})
    if u.get("total_tokens") != u.get("prompt_tokens", 0) + u.get("completion_tokens", 0):
        fail(f"{what}: usage does not add up: {u}")
    if u.get("completion_tokens", 0) > info["max_tokens"] * want:
        fail(f"{what}: {u.get('completion_tokens')} tokens for {want} choices of at most {info['max_tokens']}")
    for c in ch:
        if c.get("finish_reason") not in ("stop", "length"):
            fail(f"{what}: finish_reason {c.get('finish_reason')}")
        if info["ignore_eos"] and c.get("finish_reason") != "length":
            fail(f"{what}: ignore_eos, yet finish_reason {c.get('finish_reason')}")
        lp = c.get("logprobs")
        if info["logprobs"] != (lp is not None):
            fail(f"{what}: logprobs {'missing' if lp is None else 'not asked for'}")
        if lp is not None and not chat:
            k = len(lp["tokens"])
            if not (len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == k):
                fail(f"{what}: completion logprobs arrays of different lengths")
            if info.get("echo") and k and (lp["token_logprobs"][0] is not None or lp["top_logprobs"][0] is not None):
                fail(f"{what}: echo: the first prompt token has a logprob")
            if any(b2 < a2 for a2, b2 in zip(lp["text_offset"], lp["text_offset"][1:])):
                fail(f"{what}: text_offset goes backwards")
        text = (c.get("message") or {}).get("content") if chat else c.get("text")
        if "choice" in info and isinstance(text, str):
            ok = text in info["choice"] if c.get("finish_reason") == "stop" else any(
                x.startswith(text) for x in info["choice"])
            if not ok:
                fail(f"{what}: {text!r} is not one of (or, cut, a prefix of one of) {info['choice']}")
        if "regex" in info and isinstance(text, str) and c.get("finish_reason") == "stop" and \
                not re.fullmatch(info["regex"], text):
            fail(f"{what}: {text!r} does not match {info['regex']!r}")
    if info.get("echo") and info["max_tokens"] == 0 and info["logprobs"] and not chat:
        n_tok = sum(len((c.get("logprobs") or {}).get("tokens", [])) for c in ch)
        if n_tok != u.get("prompt_tokens", 0) * info["n"]:
            fail(f"{what}: echo with max_tokens 0: {n_tok} tokens in all, usage says {u.get('prompt_tokens')} "
                 f"prompt tokens for n = {info['n']}")


def check_prompt_logprobs(x, k, what, fail):
    """vLLM's shape: null first, then {"ID": {"logprob", "rank", "decoded_token"}} with the prompt token
    and at most k more."""
    if not isinstance(x, list) or not x or x[0] is not None:
        fail(f"{what}: prompt_logprobs {str(x)[:120]} is not a list starting with null")
        return
    for t, e in enumerate(x[1:], 1):
        ok = isinstance(e, dict) and 1 <= len(e) <= k + 1 and all(
            k2.isdigit() and isinstance(v, dict) and set(v) == {"logprob", "rank", "decoded_token"} and
            isinstance(v["logprob"], float) and v["logprob"] <= 0 and isinstance(v["rank"], int) and v["rank"] >= 1
            and isinstance(v["decoded_token"], str) for k2, v in e.items())
        if not ok:
            fail(f"{what}: prompt_logprobs[{t}] = {str(e)[:160]}")
            return


def check_error(n, d, status, fail):
    what = f"line {n}"
    e = d["error"]
    strict(BatchError, e, f"{what} error", fail)
    body = d["response"].get("body", {})
    if not isinstance(body, dict) or "error" not in body:
        fail(f"{what}: error line without response.body.error")
        return
    strict(ErrorObject, body["error"], f"{what} response.body.error", fail)
    if status not in (400, 500):
        fail(f"{what}: status {status}")
    if e.get("line") != n:
        fail(f"{what}: error names line {e.get('line')}")
    if not (isinstance(e.get("code"), str) and e["code"] and isinstance(e.get("message"), str) and
            e["message"].startswith(f"line {n}: ")):
        fail(f"{what}: error without code or message naming its line: {e}")
    if "param" not in e or not (e["param"] is None or isinstance(e["param"], str)):
        fail(f"{what}: error without a param: {e}")
    be = body["error"]
    if be.get("code") != e.get("code") or be.get("message") != e.get("message") or be.get("param") != e.get("param"):
        fail(f"{what}: the body's error differs from the line's: {be} vs {e}")
    want_type = "server_error" if status == 500 else "invalid_request_error"
    if be.get("type") != want_type:
        fail(f"{what}: type {be.get('type')} for status {status}")


# ---- a run ------------------------------------------------------------------------------------

def run_seed(binary, model, seed, count, workdir, fail, log=print):
    """One seed: generate, run with one random kill and a resume, check. Returns stats."""
    outer = fail
    fail = lambda m: outer(m.encode("utf-8", "backslashreplace").decode("utf-8"))  # lone surrogates printable
    r = random.Random(seed * 7919 + 1)
    n_ctx = r.choice([4096, 512, 512])
    g = Gen(seed, n_ctx)
    inputs = g.lines(count)
    job = os.path.join(workdir, f"space-{seed}.jsonl")
    out = os.path.join(workdir, f"space-{seed}.out.jsonl")
    with open(job, "w", encoding="utf-8", errors="surrogatepass") as f:
        for text, _, _ in inputs:
            f.write(text + "\n")
    for p in (out, out + ".journal"):
        if os.path.exists(p):
            os.remove(p)
    args = [binary, "run", "--model", model, "--quiet", "--no-cache", "-i", job, "-o", out,
            "--metrics", os.path.join(workdir, f"space-{seed}.db"), "--max-batch", str(r.choice([1, 4, 4, 16, 16, 64, 64, 64])),
            "--ctx", str(n_ctx)]
    if r.random() < 0.3:
        args += ["--max-step-tokens", str(r.choice([7, 64]))]
    if r.random() < 0.3:
        args += ["--lookahead", str(r.choice([1, 3, 40]))]
    t0 = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    delay = r.uniform(0.02, 0.25 + count / 150)
    sig = r.choice([signal.SIGKILL, signal.SIGTERM])
    try:
        proc.wait(timeout=delay)
        killed = None
    except subprocess.TimeoutExpired:
        proc.send_signal(sig)
        proc.wait()
        killed = sig
    first_rc = proc.returncode
    first_err = proc.stderr.read()
    if killed is None and first_rc != 0:
        fail(f"seed {seed}: exit {first_rc} without being killed: {first_err[-500:]}")
    if killed == signal.SIGTERM and first_rc not in (0, 128 + signal.SIGTERM, -signal.SIGTERM):
        fail(f"seed {seed}: SIGTERM gave exit {first_rc}: {first_err[-300:]}")
    p = subprocess.run(args + ["--resume"], capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"seed {seed}: the resume exited {p.returncode}: {p.stderr[-500:]}")
    with open(out, encoding="utf-8", errors="surrogatepass") as f:
        out_text = f.read()
    stats = {"lines": len(inputs), "killed": killed.name if killed else "no", "seconds": round(time.monotonic() - t0, 1),
             "args": " ".join(args[args.index("--max-batch"):])}
    check_output(inputs, out_text, lambda m: fail(f"seed {seed}: {m}"), stats)
    if os.path.exists(out + ".journal"):
        fail(f"seed {seed}: the crash journal outlived the finished job")
    log(f"seed {seed}: {stats}")
    return stats
