#!/usr/bin/env python3
"""Constrained outputs end to end, and the GBNF engine against an
independent checker (tests/gbnf_check.py, an Earley recogniser written from
llama.cpp's GBNF definition).

- differential: for llama.cpp's grammars (tests/data/gbnf) and a few
  written here, random sentences from the Python side, their prefixes and
  one-character mutations: the C engine (test_grammar --check) and the
  Python checker must give the same FULL / PREFIX / NONE;
- real jobs on the default model with guided_regex / structured_outputs
  regex, choice and grammar, at several seeds: an output that ended with
  finish_reason "stop" must match in full (Python's re.fullmatch, the choice
  list, the Python GBNF checker), one cut by max_tokens must be a prefix of
  a match (the `regex` module's partial matching for regexes);
- the same job with --max-batch 1 gives the same texts (determinism);
- refusals: a left-recursive grammar, a bad regex, two constraints in one
  line are error lines naming the field.

Needs the `regex` module (the test venv has it: transformers depends on
it); skips (77) without the binary or the model.
"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvbcheck import BIN, MODEL, SRC, check, finish, need_modules, ready  # noqa: E402

need_modules("regex")
import regex  # noqa: E402

import gbnf_check  # noqa: E402

GDIR = os.path.join(SRC, "tests", "data", "gbnf")
INLINE = {
    "nested": 'root ::= "(" root ")" root | ""\n',
    "kv": 'root ::= pair ("," pair){0,3}\npair ::= [a-z]{1,4} "=" ([0-9]+ | "\\"" [^"\\n]* "\\"")\n',
    "unicode": 'root ::= ([α-ω] | [ぁ-ゟ] | "é" | " ")+ "!"?\n',
    "dot": 'root ::= "<" .{0,5} ">" [^<>]*\n',
}


def c_check(path, texts):
    tool = os.path.join(os.path.dirname(BIN), "test_grammar")
    inp = "".join(t.encode("utf-8").hex() + "\n" for t in texts)
    r = subprocess.run([tool, "--check", path], input=inp, capture_output=True, text=True)
    check(r.returncode == 0, f"test_grammar --check {path}: {r.stderr}")
    return r.stdout.split()


def mutate(rng, s, alphabet):
    s = list(s)
    k = rng.randrange(3)
    at = rng.randrange(len(s) + 1)
    ch = rng.choice(alphabet)
    if k == 0 and s:
        s[min(at, len(s) - 1)] = ch
    elif k == 1:
        s.insert(at, ch)
    elif s:
        del s[min(at, len(s) - 1)]
    return "".join(s)


def differential(tmp):
    total = agree = 0
    grammars = [(f, open(os.path.join(GDIR, f), encoding="utf-8").read())
                for f in sorted(os.listdir(GDIR)) if f.endswith(".gbnf")]
    grammars += [(k, v) for k, v in INLINE.items()]
    for name, text in grammars:
        path = os.path.join(tmp, name + ".gbnf")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        g = gbnf_check.Grammar(text)
        rng = random.Random(hash(name) & 0xffff)
        texts = []
        for _ in range(60):
            s = g.sample(rng, budget=rng.choice([8, 20, 40]))
            if s is None or len(s) > 400:
                continue
            texts.append(s)
            for _ in range(2):
                texts.append(s[:rng.randrange(len(s) + 1)])
            alphabet = sorted(set(s)) + list(" \n\"{}[]()=+-.,:;#é<>") + ["\x00", "\t"]
            for _ in range(4):
                texts.append(mutate(rng, s, alphabet))
        got = c_check(path, texts)
        if not check(len(got) == len(texts), f"{name}: {len(got)} answers for {len(texts)} texts"):
            continue
        for t, c in zip(texts, got):
            p = g.check(t)
            total += 1
            agree += p == c
            check(p == c, f"{name} on {t!r}: C {c}, Python {p}")
    print(f"differential: {total} texts over {len(grammars)} grammars, {agree} agree")


def run(tmp, lines, extra=()):
    inp = os.path.join(tmp, "in.jsonl")
    out = os.path.join(tmp, "out.jsonl")
    with open(inp, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    r = subprocess.run([BIN, "run", "--model", MODEL, "--quiet", "--no-cache", "-i", inp, "-o", out,
                        "--metrics", os.path.join(tmp, "m.db")] + list(extra), capture_output=True, text=True)
    check(r.returncode == 0, f"run: rc {r.returncode}: {r.stderr[-500:]}")
    res = {}
    for line in open(out, encoding="utf-8"):
        o = json.loads(line)
        res[o["custom_id"]] = o
    return res


def output(o):
    b = o["response"]["body"]
    c = b["choices"][0]
    return (c["message"]["content"] if "message" in c else c["text"]), c["finish_reason"]


REGEXES = [
    r"(yes|no), because [a-z ]{5,40}\.",
    r"\d{3}-\d{4}",
    r"[A-Z][a-z]+ [A-Z][a-z]+",
    r"[a-z]{3,10}@[a-z]{3,8}\.(com|org)",
    r"(\d+\.\d{2}|free)",
]
CHOICES = [["positive", "negative", "neutral"], ["Paris", "London", "Rome", "Berlin"], ["café", "thé", "eau"]]
GRAMMARS = ["json.gbnf", "arithmetic.gbnf", "list.gbnf", "chess.gbnf", "english.gbnf"]


def jobs_lines():
    lines, want = [], {}
    k = 0

    def add(kind, spec, body_extra, prompt, seed, style):
        nonlocal k
        cid = f"{kind}{k}"
        k += 1
        body = {"max_tokens": 48 if seed % 3 else 96, "temperature": [0.0, 0.8, 1.0, 1.2][seed % 4], "seed": seed}
        body.update(body_extra)
        if style == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
            url = "/v1/chat/completions"
        else:
            body["prompt"] = prompt
            url = "/v1/completions"
        lines.append({"custom_id": cid, "method": "POST", "url": url, "body": body})
        want[cid] = (kind, spec)

    for i, rx in enumerate(REGEXES):
        for seed in range(4):
            field = {"guided_regex": rx} if seed % 2 else {"structured_outputs": {"regex": rx}}
            add("re", rx, field, "Answer briefly: is the sky blue?", seed, "chat" if i % 2 else "comp")
    for i, ch in enumerate(CHOICES):
        for seed in range(3):
            field = {"guided_choice": ch} if seed % 2 else {"structured_outputs": {"choice": ch}}
            add("ch", ch, field, "Pick one: " + ", ".join(ch), seed, "chat")
    for i, gf in enumerate(GRAMMARS):
        text = open(os.path.join(GDIR, gf), encoding="utf-8").read()
        for seed in range(3):
            field = {"guided_grammar": text} if seed % 2 else {"structured_outputs": {"grammar": text}}
            add("gb", gf, field, "Write something.", seed, "chat" if seed != 2 else "comp")
    for name, text in INLINE.items():
        for seed in range(2):
            add("gb", name, {"guided_grammar": text}, "Go:", seed, "comp")
    return lines, want


def check_output(kind, spec, text, finish_reason, cid, grammars):
    full = finish_reason == "stop"
    check(finish_reason in ("stop", "length"), f"{cid}: finish_reason {finish_reason}")
    if kind == "re":
        if full:
            check(re.fullmatch(spec, text) is not None, f"{cid}: {text!r} does not fullmatch {spec!r}")
        else:
            check(regex.fullmatch(spec, text, partial=True) is not None, f"{cid}: {text!r} no prefix of {spec!r}")
    elif kind == "ch":
        if full:
            check(text in spec, f"{cid}: {text!r} not among {spec}")
        else:
            check(any(c.startswith(text) for c in spec), f"{cid}: {text!r} no prefix of {spec}")
    else:
        g = grammars[spec]
        got = g.check(text.rstrip("\ufffd"))  # a cut may end inside a character (U+FFFD in the output)
        if full:
            check(got == "FULL", f"{cid}: {text!r} not a sentence of {spec} ({got})")
        else:
            check(got in ("FULL", "PREFIX"), f"{cid}: {text!r} no prefix of {spec} ({got})")


def real_jobs(tmp):
    lines, want = jobs_lines()
    grammars = {gf: gbnf_check.Grammar(open(os.path.join(GDIR, gf), encoding="utf-8").read()) for gf in GRAMMARS}
    grammars.update({k: gbnf_check.Grammar(v) for k, v in INLINE.items()})
    res = run(tmp, lines)
    check(len(res) == len(lines), f"{len(res)} results for {len(lines)} lines")
    n_stop = n_len = 0
    texts = {}
    for cid, (kind, spec) in want.items():
        o = res.get(cid)
        if not check(o and o.get("error") is None and o["response"]["status_code"] == 200, f"{cid}: {o}"):
            continue
        text, fr = output(o)
        texts[cid] = text
        n_stop += fr == "stop"
        n_len += fr == "length"
        check_output(kind, spec, text, fr, cid, grammars)
    print(f"jobs: {len(want)} constrained requests, {n_stop} ended by the grammar, {n_len} cut by max_tokens")
    check(n_stop >= len(want) // 3, "too few outputs reached the end of their grammar")
    res1 = run(tmp, lines, ["--max-batch", "1"])
    same = sum(1 for cid in texts if output(res1[cid])[0] == texts[cid])
    check(same == len(texts), f"--max-batch 1: {same} of {len(texts)} texts the same")
    print(f"determinism: {same} of {len(texts)} texts the same with --max-batch 1")


def refusals(tmp):
    base = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
    cases = [
        ({"guided_grammar": "root ::= root \"a\" | \"b\""}, "guided_grammar", "left-recursive"),
        ({"structured_outputs": {"grammar": "root ::= undefined-rule"}}, "structured_outputs.grammar",
         "undefined-rule"),
        ({"guided_regex": "(a"}, "guided_regex", ""),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "guided_regex"),
        ({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, "guided_choice", "response_format"),
    ]
    lines = [{"custom_id": f"bad{i}", "method": "POST", "url": "/v1/chat/completions", "body": dict(base, **f)}
             for i, (f, _, _) in enumerate(cases)]
    res = run(tmp, lines)
    for i, (_, param, words) in enumerate(cases):
        o = res.get(f"bad{i}")
        err = (o or {}).get("error") or {}
        body = (o or {}).get("response") or {}
        msg = json.dumps(err) + json.dumps(body)
        check(param in msg and words in msg, f"bad{i}: error does not name {param} / {words!r}: {msg[:400]}")


def main():
    if not ready():
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        differential(tmp)
        real_jobs(tmp)
        refusals(tmp)
    return finish("grammar")


if __name__ == "__main__":
    sys.exit(main())
