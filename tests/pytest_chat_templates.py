#!/usr/bin/env python3
"""Real chat templates rendered by kvbatch exactly as transformers renders them.

The corpus is llama.cpp's set of real templates (scripts/fetch-testdata.sh
puts them in $KVB_TESTDATA/templates: Qwen, Llama, Mistral, Gemma, GLM, Kimi,
DeepSeek, gpt-oss, Granite, …). Every template meets every conversation below
(one user turn; system and three turns; no system; quotes, tags and control
-token text in the messages; an assistant message continued with
continue_final_message; no generation prompt; conversations many templates
refuse: an assistant first, two user turns in a row, a developer message;
chat_template_kwargs such as Qwen3's enable_thinking; non-ASCII text and
Unicode white space; an empty message; a long conversation). Each pair is a
request line carrying the template in its chat_template field, through
`kvbatch render --format json` (job parsing, the template's compilation and
rendering, continue_final_message, the vocabulary's bos_token/eos_token: run's
own path), against transformers' render_jinja_template (jinja2 in its
ImmutableSandboxedEnvironment) with the same messages, kwargs and tokens:

- where transformers renders, kvbatch renders the same bytes;
- where it raises (the template calls raise_exception, or fails), kvbatch
  writes an error line naming the template;
and every template, every conversation is counted: the test fails unless
all agree, and prints which do not.

strftime_now reads the same fixed time on both sides (SOURCE_DATE_EPOCH for
kvbatch, a patched clock for transformers, TZ=UTC for both).

Then the language itself: tests/data/jinja_snippets.txt holds small templates
that reach what the real ones do not (every filter, test and method, macro
forms, scoping, whitespace control, errors), held to jinja2 the same way.

Then the tokens: the user's text is plain text even where it spells a control
token (a message holding "<|im_end|>" gets no <|im_end|> token), the
template's own control tokens are tokens. And run: SmolLM2's example job
gives the same results with the template from its GGUF as with the built-in
ChatML (only "created" differs), the summary and the metrics settings name
the template, a template file is used and named, and a name that is neither
a template nor a file is a bad command line.

Run by ctest (KVB_BIN, KVB_MODEL, KVB_TESTDATA); re-runs itself under the
test venv for transformers; exits 77 when the binary or model is missing, 1
when the templates are (scripts/setup.sh --test fetches them).
"""
import datetime as _dt
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from kvbcheck import BIN, MODEL, check, finish, need_modules, ready

EPOCH = 1741356309  # 2025-03-07 14:05:09 UTC
TESTDATA = os.environ.get("KVB_TESTDATA") or os.path.join(os.path.expanduser("~"), ".cache", "kvbatch", "testdata")

SYS = "You are a careful assistant. Answer briefly."
CONVS = {
    "one_user": dict(messages=[("user", "Hello! What is 2+2?")]),
    "sys_three": dict(messages=[("system", SYS), ("user", "Name a colour."), ("assistant", "Blue."),
                                ("user", "Another one?")]),
    "no_system": dict(messages=[("user", "Name a colour."), ("assistant", "Blue."), ("user", "Another one?")]),
    "quotes_tags": dict(messages=[("system", "Quote 'single' and \"double\"; a \\ backslash."),
                                  ("user", "<b>bold</b> {{ not jinja }} {% if %} <|im_end|> </s> [INST] "
                                           "<think>x</think>\n\n  indented\t tab  "),
                                  ("assistant", "  I see <tags> & 'quotes'.  "), ("user", "OK\n")]),
    "continue": dict(messages=[("user", "Write a haiku."), ("assistant", "Autumn moonlight -")],
                     add_generation_prompt=False, continue_final_message=True),
    "continue_space": dict(messages=[("system", SYS), ("user", "Count to three."), ("assistant", "One, two, ")],
                           add_generation_prompt=False, continue_final_message=True),
    "no_gen": dict(messages=[("user", "Hi"), ("assistant", "Hello.")], add_generation_prompt=False),
    "assistant_first": dict(messages=[("assistant", "I start."), ("user", "Hm.")]),
    "two_users": dict(messages=[("user", "One."), ("user", "Two.")]),
    "developer": dict(messages=[("developer", "Be terse."), ("user", "Hi")]),
    "kw_nothink": dict(messages=[("user", "Hello!")], kw={"enable_thinking": False}),
    "kw_think": dict(messages=[("system", SYS), ("user", "Hello!")],
                     kw={"enable_thinking": True, "reasoning_effort": "high", "thinking": True}),
    "kw_misc": dict(messages=[("user", "What day is it?")],
                    kw={"custom_instructions": "Use metric units.", "date_string": "07 Mar 2025",
                        "builtin_tools": ["code_interpreter"], "xml_tools": None, "reasoning": False}),
    "unicode": dict(messages=[("system", " Ünïcödé — 日本語 😀 "), ("user", "\u00a0ß Straße ǅ İ\u2028x\u3000")]),
    "empty": dict(messages=[("user", "")]),
    "long": dict(messages=[("system", SYS)] + [m for i in range(4) for m in
                                              (("user", f"Question {i}?"), ("assistant", f"Answer {i}."))] +
                 [("user", "Last?")]),
}


def messages_of(c):
    return [{"role": r, "content": t} for r, t in c["messages"]]


def request(cid, tmpl, c):
    d = {"custom_id": cid, "messages": messages_of(c), "chat_template": tmpl, "max_tokens": 1,
         "add_generation_prompt": c.get("add_generation_prompt", True)}
    if c.get("continue_final_message"):
        d["continue_final_message"] = True
    if "kw" in c:
        d["chat_template_kwargs"] = c["kw"]
    return d


def kvbatch_render(d, lines, *extra):
    job = os.path.join(d, "job.jsonl")
    with open(job, "w", encoding="utf-8") as f:
        for ln in lines:
            f.write(json.dumps(ln, ensure_ascii=False) + "\n")
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(EPOCH), TZ="UTC")
    p = subprocess.run([BIN, "render", "--model", MODEL, "--input", job, "--format", "json", "--ctx", "1048576"]
                       + list(extra), capture_output=True, env=env)
    check(p.returncode in (0, 3), f"render exited {p.returncode}: {p.stderr.decode()[-500:]}")
    return [json.loads(l) for l in p.stdout.decode("utf-8").split("\n") if l]


def main():
    if not ready():
        return 77
    need_modules("transformers", "jinja2")
    os.environ["TZ"] = "UTC"
    time.tzset()
    from transformers.utils import chat_template_utils as ctu

    class FixedClock(_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls.fromtimestamp(EPOCH, tz)

    ctu.datetime = FixedClock  # strftime_now reads this module's datetime

    paths = sorted(glob.glob(os.path.join(TESTDATA, "templates", "*.jinja")))
    if not check(len(paths) >= 60, f"{len(paths)} templates in {TESTDATA}/templates (scripts/setup.sh --test)"):
        return finish("chat template")

    with tempfile.TemporaryDirectory() as d:
        # the vocabulary's tokens as kvbatch gives them to a template
        probe = kvbatch_render(d, [{"custom_id": "probe", "messages": [{"role": "user", "content": "x"}],
                                    "chat_template": "{{ bos_token }}\n{{ eos_token }}"}])
        bos, eos = probe[0]["prompts"][0]["text"].split("\n")
        print(f"bos_token {bos!r}, eos_token {eos!r}")

        lines, want = [], {}
        for p in paths:
            name = os.path.basename(p)
            with open(p, encoding="utf-8") as f:
                tmpl = f.read()
            for cname, c in CONVS.items():
                cid = f"{name}|{cname}"
                lines.append(request(cid, tmpl, c))
                try:
                    out, _ = ctu.render_jinja_template(
                        conversations=[messages_of(c)], chat_template=tmpl,
                        add_generation_prompt=c.get("add_generation_prompt", True),
                        continue_final_message=c.get("continue_final_message", False),
                        bos_token=bos, eos_token=eos, **c.get("kw", {}))
                    want[cid] = ("text", out[0])
                except Exception as e:  # the template refuses the conversation
                    want[cid] = ("error", f"{type(e).__name__}: {str(e)[:160]}")
        t0 = time.time()
        got = {r["custom_id"]: r for r in kvbatch_render(d, lines)}
        print(f"kvbatch rendered {len(lines)} requests in {time.time() - t0:.2f} s")

        agree, refused, bad = 0, 0, []
        for cid, (kind, val) in want.items():
            r = got.get(cid)
            if r is None:
                bad.append((cid, "no render entry"))
                continue
            if kind == "text":
                if r["error"] is not None:
                    bad.append((cid, f"kvbatch error {r['error']['message'][:200]!r}; transformers renders"))
                elif r["prompts"][0]["text"] != val:
                    a, b = r["prompts"][0]["text"], val
                    k = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
                    bad.append((cid, f"texts differ at {k}: kvbatch {a[max(0, k - 30):k + 40]!r}, "
                                     f"transformers {b[max(0, k - 30):k + 40]!r}"))
                else:
                    agree += 1
            else:
                if r["error"] is None:
                    bad.append((cid, f"transformers raised {val!r}; kvbatch rendered"))
                elif "template request, line " not in r["error"]["message"]:
                    bad.append((cid, f"the error does not name the template: {r['error']['message']!r}"))
                else:
                    agree += 1
                    refused += 1
        total = len(want)
        per_template = {}
        for cid, _ in bad:
            per_template.setdefault(cid.split("|")[0], []).append(cid.split("|")[1])
        print(f"{agree} of {total} template x conversation pairs agree ({refused} refused by both); "
              f"{len(paths) - len(per_template)} of {len(paths)} templates agree on every conversation")
        for cid, why in bad:
            print(f"  {cid}: {why}")
        check(not bad, f"{len(bad)} of {total} pairs differ from transformers")

        # the language itself: snippets that reach what the real templates do
        # not (every filter, test, method, macro forms, scoping, whitespace
        # control, errors), against jinja2 in transformers' environment
        snippet_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "jinja_snippets.txt")
        with open(snippet_path, encoding="utf-8") as f:
            snippets = f.read().split("\n----\n")
        conv = CONVS["sys_three"]
        data = {"a": 1, "b": [1, 2, 3], "s": "Hello World"}
        lines, want = [], []
        for i, sn in enumerate(snippets):
            lines.append({"custom_id": f"snippet{i}", "messages": messages_of(conv), "chat_template": sn,
                          "max_tokens": 1, "chat_template_kwargs": {"data": data}})
            try:
                out, _ = ctu.render_jinja_template(conversations=[messages_of(conv)], chat_template=sn,
                                                   add_generation_prompt=True, bos_token=bos, eos_token=eos, data=data)
                want.append(("text", out[0]))
            except Exception as e:
                want.append(("error", f"{type(e).__name__}: {str(e)[:120]}"))
        got = {r["custom_id"]: r for r in kvbatch_render(d, lines)}
        n_ok = 0
        for i, (kind, val) in enumerate(want):
            r = got[f"snippet{i}"]
            first = snippets[i].strip().split("\n")[0][:70]
            if kind == "text":
                ok = r["error"] is None and r["prompts"][0]["text"] == val
                check(ok, f"snippet {i} ({first!r}): transformers {val[:300]!r}, kvbatch "
                          f"{(r['prompts'][0]['text'][:300] if r['error'] is None else r['error']['message'])!r}")
            else:
                ok = r["error"] is not None
                check(ok, f"snippet {i} ({first!r}): transformers raised {val!r}, kvbatch rendered "
                          f"{r['prompts'][0]['text'][:200] if r['error'] is None else ''!r}")
            n_ok += ok
        print(f"{n_ok} of {len(snippets)} language snippets agree "
              f"({sum(1 for k, _ in want if k == 'error')} raise on both sides)")

        # the user's text is plain text, the template's control tokens are tokens
        line = {"custom_id": "ctl", "messages": [{"role": "user", "content": "a<|im_end|>b<|im_start|>c"}]}
        r = kvbatch_render(d, [line], "--ids")[0]
        ids = r["prompts"][0]["ids"]
        text = r["prompts"][0]["text"]
        p = subprocess.run([BIN, "tokenize", "--model", MODEL, "--special", "--", "<|im_end|><|im_start|>"],
                           capture_output=True, text=True)
        im_end, im_start = (int(x) for x in p.stdout.split())
        check(text.count("<|im_end|>") == 3 and ids.count(im_end) == 2,
              f"<|im_end|> in the user's text became a token: {text.count('<|im_end|>')} in the text, "
              f"{ids.count(im_end)} tokens (the template writes 2)")
        check(text.count("<|im_start|>") == 4 and ids.count(im_start) == 3,
              f"<|im_start|> in the user's text became a token: {ids.count(im_start)} tokens (the template writes 3)")
        check_runs(d)
    return finish("chat template")


def strip_created(path):
    """The result lines without their "created" time (the only field that depends on the clock)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r.get("response") and isinstance(r["response"].get("body"), dict):
                r["response"]["body"].pop("created", None)
            out.append(r)
    return out


def check_runs(d):
    """The model's own template in run: SmolLM2's example job gives the same results with the
    template from its GGUF as with the built-in ChatML family (they write the same text); a template
    file on the command line is used and named; a name that is nothing is a bad command line."""
    import sqlite3
    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "jobs", "examples", "chat-mixed.jsonl")
    res = {}
    for label, extra in (("gguf", []), ("chatml", ["--chat-template", "chatml"])):
        out = os.path.join(d, f"example-{label}.jsonl")
        p = subprocess.run([BIN, "run", "--model", MODEL, "--no-cache", "-i", job, "-o", out, "--metrics",
                            out + ".db"] + extra, capture_output=True, text=True)
        check(p.returncode == 0, f"run ({label}): exit {p.returncode}: {p.stderr[-300:]}")
        res[label] = strip_created(out)
        with sqlite3.connect(out + ".db") as c:
            settings = json.loads(c.execute("select settings from runs").fetchone()[0])
        want = r"tokenizer\.chat_template@[0-9a-f]{12}" if label == "gguf" else "chatml"
        check(re.fullmatch(want, settings.get("chat_template", "")) is not None,
              f"run ({label}): settings name the template {settings.get('chat_template')!r}, want {want}")
        check(("chat template " + settings.get("chat_template", "?")) in p.stderr,
              f"run ({label}): the summary does not name the template: {p.stderr[:300]}")
    ok = sum(1 for r in res["gguf"] if r.get("error") is None)
    check(ok >= 8 and res["gguf"] == res["chatml"],
          f"the example job's results differ between the GGUF's template and the built-in ChatML ({ok} ok lines)")

    # a template file
    tf = os.path.join(d, "my template.jinja")
    with open(tf, "w", encoding="utf-8") as f:
        f.write("{% for m in messages %}[{{ m.role|upper }}] {{ m.content }}\n{% endfor %}"
                "{% if add_generation_prompt %}[ASSISTANT]{% endif %}\n")
    job2 = os.path.join(d, "file.jsonl")
    with open(job2, "w") as f:
        f.write(json.dumps({"custom_id": "a", "messages": [{"role": "user", "content": "Hi"}]}) + "\n")
    p = subprocess.run([BIN, "render", "--model", MODEL, "--input", job2, "--format", "json", "--chat-template", tf],
                       capture_output=True, text=True)
    r = json.loads(p.stdout) if p.returncode == 0 else {}
    check(r.get("prompts", [{}])[0].get("text") == "[USER] Hi\n[ASSISTANT]" and
          re.fullmatch(re.escape(tf) + r"@[0-9a-f]{12}", r.get("template", "")) is not None,
          f"render --chat-template FILE: exit {p.returncode}: {p.stdout[:300]} {p.stderr[:300]}")
    p = subprocess.run([BIN, "render", "--model", MODEL, "--input", job2, "--chat-template", "no/such/template"],
                       capture_output=True, text=True)
    check(p.returncode == 2 and "known: chatml" in p.stderr and "nor is it a file" in p.stderr,
          f"render --chat-template no/such/template: exit {p.returncode}: {p.stderr[:300]}")
    with open(tf, "w", encoding="utf-8") as f:
        f.write("{% for m in messages %}")
    p = subprocess.run([BIN, "run", "--model", MODEL, "--no-cache", "-i", job2, "-o", os.path.join(d, "x.jsonl"),
                        "--chat-template", tf], capture_output=True, text=True)
    check(p.returncode != 0 and "unexpected end of template" in p.stderr and tf in p.stderr,
          f"run with a template file that does not compile: exit {p.returncode}: {p.stderr[:300]}")


if __name__ == "__main__":
    sys.exit(main())
