#!/usr/bin/env python3
"""End-to-end checks of `kvbatch run` for the hardening of issue 18, each
one a case that once went wrong:

- logprobs without alternatives (chat "logprobs": true alone, completions
  "logprobs": 0) next to ordinary lines: it crashed the whole process.
- a numerically broken model (NaN output_norm, NaN epsilon): every line was
  a 200 with empty content; now each is a 500 naming non-finite logits (or
  the model is refused at load, naming why), and `generate` says why.
- every request field either works or is refused by name: ignore_eos (it
  stopped at EOS), min_tokens, stop_token_ids, include_stop_str_in_output,
  skip_special_tokens, prompt lists and token-id prompts, the developer role
  and continue_final_message rendered as the template does (checked against
  the same tokens sent as a completion), unknown fields refused;
- a line that crashes the process (KVBATCH_TEST_CRASH injects one) crashed
  every --resume again, forever: now the journal beside the output names it
  and the resume writes it as a 500 line; a crash that names no line runs
  the lines then in flight one at a time; a SIGKILLed run's lines simply run
  again; the journal goes when the job is done;
- custom_ids are echoed exactly as written: "x\\ud800" and "x\\udfff" were
  both repaired to "x\\ufffd" (the second then a duplicate_custom_id).

And for issue 27 (no constraint, grammar or cache fault takes down a job):
- one job holding the lines that ended whole jobs among good ones: a GBNF
  grammar of 100,000 nested groups (SIGSEGV), a guided_choice of 4,097
  strings and a chain of 2,000 rules each the next one's first item ("cannot
  queue: out of memory", exit 1, nothing written), a chain of 100,000 rules
  each the next one's whole body (SIGSEGV): exit 0, every line answered, the
  bad ones 400 error lines naming the field and the limit; also run by the
  ASan build's ctest (`hardening_constraints`: this file with the argument
  `constraints`);
- a line whose queueing fails (KVBATCH_TEST_CRASH=ID:queue injects what an
  allocation failure would do) is a 500 error line, and the job goes on;
- the cache file truncated, or its meta pages zeroed, by another process
  while `run` reads it: exit 0 and results identical to --no-cache (it was
  SIGBUS / SIGABRT);
- an output cut by max_tokens inside a UTF-8 character ends its text at the
  last whole character (it ended in U+FFFD), while the logprobs' bytes carry
  every byte.

Run by ctest (KVB_BIN, KVB_MODEL, KVB_SOURCE_DIR set); exits 77 to skip when
the model or binary is missing. Uses only the Python standard library.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from kvbcheck import BIN, MODEL, check, finish, ready


def run(args, env=None, **kw):
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.run([BIN, "run", "--model", MODEL, "--quiet", "--no-cache"] + args, capture_output=True,
                          text=True, env=e, **kw)


def write_job(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        for d in lines:
            f.write((d if isinstance(d, str) else json.dumps(d)) + "\n")


def read_lines(path):
    with open(path, "rb") as f:
        return [json.loads(l) for l in f.read().decode("utf-8").splitlines()]


def by_id(lines):
    return {d["custom_id"]: d for d in lines}


def chat(cid, text="Say yes.", **kw):
    return {"custom_id": cid, "messages": [{"role": "user", "content": text}], "max_tokens": 3, "temperature": 0,
            **kw}


def comp(cid, text="The capital of France is", **kw):
    d = {"custom_id": cid, "max_tokens": 3, "temperature": 0, **kw}
    if text is not None:
        d["prompt"] = text
    return d


def test_logprobs_without_alternatives(d):
    job, out = os.path.join(d, "lp.jsonl"), os.path.join(d, "lp.out.jsonl")
    write_job(job, [chat("good1"), chat("a", logprobs=True), comp("b", logprobs=0),
                    chat("c", logprobs=True, top_logprobs=0), comp("good2")])
    p = run(["-i", job, "-o", out])
    check(p.returncode == 0, f"logprobs without alternatives: exit {p.returncode}: {p.stderr[-500:]}")
    if p.returncode != 0:
        return
    res = by_id(read_lines(out))
    check(len(res) == 5, f"logprobs without alternatives: {len(res)} lines, not 5")
    for cid in ("a", "c"):
        body = res[cid]["response"]["body"]
        content = body["choices"][0]["logprobs"]["content"]
        check(len(content) == body["usage"]["completion_tokens"], f"{cid}: one logprob per token")
        check(all(t["top_logprobs"] == [] for t in content), f"{cid}: no alternatives asked, none given")
    lp = res["b"]["response"]["body"]["choices"][0]["logprobs"]
    check(len(lp["tokens"]) == len(lp["token_logprobs"]) == 3, "b: a logprob per token")
    check(all(t == {} for t in lp["top_logprobs"]), "b: logprobs 0 gives no alternatives")


def broken_copy(d, name, spoil):
    """A copy of the model spoiled in place by spoil(reader), or None without the gguf package."""
    try:
        import gguf
        import numpy as np
    except ImportError:
        print("note: no gguf/numpy package: broken-model checks skipped")
        return None
    path = os.path.join(d, name)
    shutil.copyfile(MODEL, path)
    r = gguf.GGUFReader(path, "r+")
    spoil(r, np)
    del r
    return path


def spoil_output_norm(r, np):
    t = next(t for t in r.tensors if t.name == "output_norm.weight")
    t.data[:] = np.nan


def spoil_epsilon(r, np):
    f = next(f for k, f in r.fields.items() if k.endswith("layer_norm_rms_epsilon"))
    f.parts[-1][0] = np.nan


def test_nonfinite_model(d):
    job = os.path.join(d, "nf.jsonl")
    write_job(job, [chat("c1"), comp("p1"), chat("c2", temperature=0.8, max_tokens=4)])
    for name, spoil in (("nan-norm.gguf", spoil_output_norm), ("nan-eps.gguf", spoil_epsilon)):
        path = broken_copy(d, name, spoil)
        if path is None:
            return
        out = os.path.join(d, name + ".out.jsonl")
        p = subprocess.run([BIN, "run", "--model", path, "--quiet", "--no-cache", "-i", job, "-o", out],
                           capture_output=True, text=True)
        if p.returncode == 1:  # refused at load: the message must say why
            check(any(w in p.stderr.lower() for w in ("nan", "finite")),
                  f"{name}: refused without naming the cause: {p.stderr[-300:]}")
        else:
            check(p.returncode == 0, f"{name}: exit {p.returncode}: {p.stderr[-300:]}")
            lines = read_lines(out)
            check(len(lines) == 3, f"{name}: {len(lines)} lines, not 3")
            for l in lines:
                check(l["response"]["status_code"] == 500 and l["error"]["code"] == "server_error" and
                      "not finite" in l["error"]["message"],
                      f"{name}: {l['custom_id']}: not a 500 naming non-finite logits: {json.dumps(l)[:300]}")
        g = subprocess.run([BIN, "generate", "--model", path, "-q", "-n", "4", "--prompt", "Hello"],
                           capture_output=True, text=True)
        check(g.returncode == 1, f"{name}: generate exit {g.returncode}")
        check(any(w in g.stderr.lower() for w in ("nan", "finite")),
              f"{name}: generate failed without saying why: {g.stderr[-300:]!r}")


def raw_custom_id(line):
    """The custom_id's JSON text as the line writes it (quotes included)."""
    at = line.index('"custom_id":') + len('"custom_id":')
    if line.startswith("null", at):
        return "null"
    _, end = json.decoder.scanstring(line, at + 1)
    return line[at:end]


def test_custom_id_exact(d):
    job, out = os.path.join(d, "cid.jsonl"), os.path.join(d, "cid.out.jsonl")
    ids = ['"x\\ud800"', '"x\\udfff"', '"x\\ufffd"', '"x\\u0000"', '"q\\"\\\\\\/\\u00e9"', '"\\ud83d\\ude00"',
           '"caf\u00e9"']
    lines = []
    for k, cid in enumerate(ids):
        body = ('{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1}' if k % 2 else
                '{"prompt":"Hi","max_tokens":1}')
        url = "/v1/chat/completions" if k % 2 else "/v1/completions"
        lines.append('{"custom_id":%s,"method":"POST","url":"%s","body":%s}' % (cid, url, body))
    lines.append('{"custom_id":"x\\ud800","prompt":"Hi","max_tokens":1}')  # the same id again: a duplicate
    lines.append('{"custom_id":"bad\\ud800","prompt":"Hi","max_tokens":0}')  # an error line keeps it too
    with open(job, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    p = run(["-i", job, "-o", out])
    check(p.returncode == 0, f"custom_id: exit {p.returncode}: {p.stderr[-300:]}")
    with open(out, encoding="utf-8", errors="surrogatepass") as f:
        got = f.read().splitlines()
    check(len(got) == len(lines), f"custom_id: {len(got)} lines for {len(lines)}")
    raw = [raw_custom_id(l) for l in got]
    for cid in ids:
        want = 2 if cid == ids[0] else 1  # the duplicate's error line carries it too
        check(raw.count(cid) == want, f"custom_id {cid}: written {raw.count(cid)} times as given, not {want}: {raw}")
    outs = [json.loads(l) for l in got]
    dup = [o for o in outs if o["error"] and o["error"]["code"] == "duplicate_custom_id"]
    check(len(dup) == 1 and dup[0]["custom_id"] == "x\ud800", f"custom_id: duplicates {dup}")
    ok = [o for o in outs if o["response"]["status_code"] == 200]
    check(len(ok) == len(ids), f"custom_id: {len(ok)} results for {len(ids)} distinct ids")
    check(raw.count('"bad\\ud800"') == 1, "custom_id: an error line echoes its id as written")


SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def tokenize(text, special=False):
    p = subprocess.run([BIN, "tokenize", "--model", MODEL] + (["--special"] if special else []) + ["--", text],
                       capture_output=True, text=True)
    check(p.returncode == 0, f"tokenize: {p.stderr}")
    return [int(x) for x in p.stdout.split()]


def results(d, name, lines):
    """Runs lines, returns custom_id -> output line (and checks one line each)."""
    job, out = os.path.join(d, name + ".jsonl"), os.path.join(d, name + ".out.jsonl")
    write_job(job, lines)
    p = run(["-i", job, "-o", out])
    check(p.returncode == 0, f"{name}: exit {p.returncode}: {p.stderr[-400:]}")
    if p.returncode != 0:
        return {}
    res = by_id(read_lines(out))
    check(len(res) == len(lines), f"{name}: {len(res)} lines for {len(lines)}")
    return res


def body(res, cid):
    d = res.get(cid)
    if not check(d is not None and d["response"]["status_code"] == 200, f"{cid}: not a result: {d}"):
        return None
    return d["response"]["body"]


def text_of(b, i=0):
    c = b["choices"][i]
    return c["message"]["content"] if "message" in c else c["text"]


def test_fields(d):
    q = "Say yes."
    lines = []
    for k in range(12):  # ignore_eos: every sample runs to max_tokens
        lines.append(chat(f"ie{k}", q, ignore_eos=True, max_tokens=24, temperature=0.9, seed=k))
        lines.append(chat(f"ref{k}", q, max_tokens=24, temperature=0.9, seed=k))
    lines.append(chat("min", q, min_tokens=12, max_tokens=16))
    lines.append(chat("min-stop", q, min_tokens=6, max_tokens=16, stop=[" ", "."]))
    lines.append(comp("greedy", max_tokens=8, logprobs=0))
    # greedy "Hi" ends at <|im_end|> after about 10 tokens
    lines.append(chat("special", "Hi", max_tokens=14, skip_special_tokens=False, include_stop_str_in_output=True))
    lines.append(chat("special-skip", "Hi", max_tokens=14, include_stop_str_in_output=True))
    lines.append(chat("special-ie", "Hi", max_tokens=14, skip_special_tokens=False, ignore_eos=True))
    res = results(d, "fields", lines)
    if not res:
        return
    stopped = 0
    for k in range(12):
        b, ref = body(res, f"ie{k}"), body(res, f"ref{k}")
        if b and ref:
            check(b["usage"]["completion_tokens"] == 24 and b["choices"][0]["finish_reason"] == "length",
                  f"ie{k}: ignore_eos ended after {b['usage']['completion_tokens']} tokens")
            stopped += ref["choices"][0]["finish_reason"] == "stop"
    check(stopped > 0, "ignore_eos: no reference request stopped at EOS, so the check saw nothing")
    b = body(res, "min")
    if b:
        check(b["usage"]["completion_tokens"] >= 12, f"min_tokens 12: {b['usage']['completion_tokens']} tokens")
    b = body(res, "min-stop")
    if b:
        check(b["usage"]["completion_tokens"] >= 6, f"min_tokens with stop: {b['usage']['completion_tokens']} tokens")
    b = body(res, "special")
    if b:
        check(b["choices"][0]["finish_reason"] == "stop" and text_of(b).endswith("<|im_end|>"),
              f"skip_special_tokens false + include_stop_str_in_output: {text_of(b)!r}")
    b = body(res, "special-skip")
    if b:
        check("<|im_" not in text_of(b), f"skip_special_tokens true shows special text: {text_of(b)!r}")
    b = body(res, "special-ie")
    if b:
        check("<|im_end|>" in text_of(b), f"ignore_eos + skip_special_tokens false: {text_of(b)!r}")

    # stop_token_ids and include_stop_str_in_output, from the greedy run's own tokens
    g = body(res, "greedy")
    if not g:
        return
    toks = g["choices"][0]["logprobs"]["tokens"]
    full = text_of(g)
    stop_tok = tokenize(toks[2])
    check(len(stop_tok) == 1, f"greedy token {toks[2]!r} is not one token alone: {stop_tok}")
    stop_str = full[len(toks[0]):len(toks[0]) + len(toks[1]) + 2].strip() or toks[1]
    lines = [comp("sti", max_tokens=8, stop_token_ids=stop_tok),
             comp("sti-inc", max_tokens=8, stop_token_ids=stop_tok, include_stop_str_in_output=True),
             comp("stop-inc", max_tokens=8, stop=[stop_str], include_stop_str_in_output=True),
             comp("stop", max_tokens=8, stop=[stop_str]),
             comp("ids", text=None, prompt=tokenize("The capital of France is"), max_tokens=8),
             comp("list", text=None, prompt=["The capital of France is", "Once upon a time"], n=2, max_tokens=5,
                  temperature=0.8, seed=3),
             comp("one", text="Once upon a time", n=2, max_tokens=5, temperature=0.8, seed=3),
             comp("badtok", text=None, prompt=[1, 10 ** 7])]
    res = results(d, "fields2", lines)
    if not res:
        return
    b = body(res, "sti")
    if b:
        check(text_of(b) == toks[0] + toks[1] and b["choices"][0]["finish_reason"] == "stop",
              f"stop_token_ids: {text_of(b)!r}, want {toks[0] + toks[1]!r}")
    b = body(res, "sti-inc")
    if b:
        check(text_of(b) == toks[0] + toks[1] + toks[2], f"stop_token_ids + include: {text_of(b)!r}")
    b, b2 = body(res, "stop-inc"), body(res, "stop")
    if b and b2:
        at = full.index(stop_str)
        check(text_of(b) == full[:at + len(stop_str)], f"include_stop_str_in_output: {text_of(b)!r} ({stop_str!r})")
        check(text_of(b2) == full[:at], f"stop: {text_of(b2)!r}")
    b = body(res, "ids")
    if b:
        check(text_of(b) == full, f"token-id prompt: {text_of(b)!r} vs text prompt {full!r}")
    b, one = body(res, "list"), body(res, "one")
    if b and one:
        ch = b["choices"]
        check([c["index"] for c in ch] == [0, 1, 2, 3], f"prompt list: indices {[c['index'] for c in ch]}")
        check([text_of(b, 2), text_of(b, 3)] == [text_of(one, 0), text_of(one, 1)],
              "prompt list: the second prompt's choices differ from the same prompt alone")
        check(b["usage"]["prompt_tokens"] == len(tokenize("The capital of France is")) +
              one["usage"]["prompt_tokens"], f"prompt list: usage {b['usage']}")
    e = res.get("badtok")
    check(e and e["error"] and e["error"]["code"] == "invalid_value" and e["error"]["param"] == "prompt",
          f"token id out of the vocabulary: {e}")

    # the developer role and continue_final_message, against the very tokens as a completion
    dev_text = (f"<|im_start|>system\n{SMOLLM_SYSTEM}<|im_end|>\n<|im_start|>developer\nAnswer in French.<|im_end|>\n"
                "<|im_start|>user\nWhat is bread?<|im_end|>\n<|im_start|>assistant\n")
    cont_text = (f"<|im_start|>system\n{SMOLLM_SYSTEM}<|im_end|>\n<|im_start|>user\nName a fruit.<|im_end|>\n"
                 "<|im_start|>assistant\nMy favourite fruit is the")
    dev_msgs = [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "What is bread?"}]
    cont_msgs = [{"role": "user", "content": "Name a fruit."},
                 {"role": "assistant", "content": "My favourite fruit is the"}]
    lines = [{"custom_id": "dev", "messages": dev_msgs, "max_tokens": 10, "temperature": 0},
             comp("dev-ids", text=None, prompt=tokenize(dev_text, special=True), max_tokens=10),
             {"custom_id": "cont", "messages": cont_msgs, "max_tokens": 10, "temperature": 0,
              "add_generation_prompt": False, "continue_final_message": True},
             comp("cont-ids", text=None, prompt=tokenize(cont_text, special=True), max_tokens=10),
             {"custom_id": "nogen", "messages": cont_msgs, "max_tokens": 4, "add_generation_prompt": False},
             chat("unknown", q, truncate_prompt_tokens=5),
             chat("misspelt", q, max_token=3),
             chat("ignored", q, stream=True, user="u", metadata={"a": "b"})]
    res = results(d, "fields3", lines)
    if not res:
        return
    for a, b in (("dev", "dev-ids"), ("cont", "cont-ids")):
        x, y = body(res, a), body(res, b)
        if x and y:
            check(x["usage"]["prompt_tokens"] == y["usage"]["prompt_tokens"] and text_of(x) == text_of(y),
                  f"{a}: not rendered as the template does: {x['usage']} {text_of(x)!r} vs {y['usage']} {text_of(y)!r}")
    body(res, "nogen")
    for cid, field in (("unknown", "truncate_prompt_tokens"), ("misspelt", "max_token")):
        e = res[cid]
        check(e["error"] and e["error"]["code"] == "unsupported_field" and e["error"]["param"] == field and
              field in e["error"]["message"], f"{cid}: not refused by name: {e['error']}")
    body(res, "ignored")


def test_crash_resume(d):
    qs = ["Say yes.", "Name a color.", "Count to three.", "Hi", "What is 2+2?", "Name a fruit.", "Say no.",
          "Hello there"]
    lines = [chat(f"c{i}", q, max_tokens=6) for i, q in enumerate(qs)]
    job = os.path.join(d, "crash.jsonl")
    write_job(job, lines)
    clean = os.path.join(d, "crash.clean.jsonl")
    p = run(["-i", job, "-o", clean])
    check(p.returncode == 0, f"crash: clean run exit {p.returncode}")
    want = {cid: text_of(l["response"]["body"]) for cid, l in by_id(read_lines(clean)).items()}
    for where, max_crashes in (("token", 1), ("step", 2)):
        out = os.path.join(d, f"crash.{where}.jsonl")
        env = {"KVBATCH_TEST_CRASH": f"c3:{where}"}
        crashes, rc = 0, None
        for attempt in range(4):
            p = run(["-i", job, "-o", out] + (["--resume"] if attempt else []), env=env)
            rc = p.returncode
            if rc == 0:
                break
            check(rc == -11, f"crash {where}: run {attempt}: exit {rc}, not SIGSEGV: {p.stderr[-300:]}")
            crashes += 1
        check(rc == 0 and crashes <= max_crashes,
              f"crash {where}: {crashes} crashes, exit {rc} (at most {max_crashes} crash(es) before a resume finishes)")
        if rc != 0:
            continue
        got = read_lines(out)
        check(len(got) == len(lines), f"crash {where}: {len(got)} lines for {len(lines)}")
        res = by_id(got)
        bad = res.get("c3")
        check(bad and bad["response"]["status_code"] == 500 and "crashed" in bad["error"]["message"],
              f"crash {where}: c3 is not a 500 naming the crash: {bad}")
        for cid, t in want.items():
            if cid != "c3":
                check(cid in res and res[cid]["response"]["status_code"] == 200 and
                      text_of(res[cid]["response"]["body"]) == t, f"crash {where}: {cid} lost or changed")
        check(not os.path.exists(out + ".journal"), f"crash {where}: the journal outlived the finished job")
    # killed, not crashed: every line simply runs again
    out = os.path.join(d, "crash.kill.jsonl")
    write_job(job, [chat(f"k{i}", q, max_tokens=48, ignore_eos=True) for i, q in enumerate(qs)])
    proc = subprocess.Popen([BIN, "run", "--model", MODEL, "--quiet", "--no-cache", "--max-batch", "2", "-i", job,
                             "-o", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        time.sleep(0.02)
        if os.path.exists(out) and os.path.getsize(out) > 0:
            break
    proc.kill()
    proc.wait()
    p = run(["-i", job, "-o", out, "--resume"])
    got = read_lines(out)
    check(p.returncode == 0 and len(got) == len(qs), f"kill: resume exit {p.returncode}, {len(got)} lines")
    check(all(l["response"]["status_code"] == 200 for l in got), "kill: a killed run's line was not run again")
    # a job named like the journal of its own output is read, never emptied
    out = os.path.join(d, "named.jsonl")
    shutil.copyfile(job, out + ".journal")
    before = open(out + ".journal", "rb").read()
    p = run(["-i", out + ".journal", "-o", out])
    check(p.returncode == 0 and open(out + ".journal", "rb").read() == before,
          f"journal named as the input: exit {p.returncode}, input changed: {open(out + '.journal', 'rb').read() != before}")


# ---- issue 27: constraints, queueing, the cache under damage, UTF-8 cuts ------------------------

def constraint_lines():
    """(line, expected status, words the error must hold) for the constraint lines that took jobs down."""
    g_nest = "root ::= " + "(" * 100000 + '"a"' + ")" * 100000
    g_left = "root ::= r0\n" + "".join(f'r{i} ::= r{i + 1} "a"\n' for i in range(1999)) + 'r1999 ::= "a"\n'
    g_tail = "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(99999)) + 'r99999 ::= "t"\n'
    choices = [f"c{i}" for i in range(4097)]
    return [
        (chat("good1"), 200, None),
        (chat("nest", guided_grammar=g_nest), 400, ["guided_grammar", "1024"]),
        (comp("good2"), 200, None),
        (chat("choice_4097", guided_choice=choices), 400, ["guided_choice", "4096"]),
        (chat("choice_4096", guided_choice=choices[:4096]), 200, None),
        (comp("deep-left-chain", guided_grammar=g_left), 400, ["guided_grammar", "1024"]),
        (chat("so-nest", structured_outputs={"grammar": g_nest}), 400, ["structured_outputs", "1024"]),
        (comp("tail-chain", guided_grammar=g_tail), 200, None),
        (chat("good3", n=2, temperature=0.7), 200, None),
    ]


def test_constraint_killers(d):
    lines = constraint_lines()
    job, out = os.path.join(d, "killers.jsonl"), os.path.join(d, "killers.out.jsonl")
    write_job(job, [l for l, _, _ in lines])
    p = run(["-i", job, "-o", out])
    check(p.returncode == 0, f"constraint killers: exit {p.returncode}: {p.stderr[-600:]}")
    if p.returncode != 0:
        return
    res = by_id(read_lines(out))
    check(len(res) == len(lines), f"constraint killers: {len(res)} lines for {len(lines)}")
    for line, status, words in lines:
        cid = line["custom_id"]
        got = res.get(cid)
        if not check(got is not None, f"{cid}: no output line"):
            continue
        st = got["response"]["status_code"]
        check(st == status, f"{cid}: status {st}, want {status}: {json.dumps(got)[:300]}")
        if words and st == 400:
            e = got["error"]
            for w in words:
                check(w in e["message"] and (w.isdigit() or w in (e["param"] or "")),
                      f"{cid}: the error does not name {w!r}: {e}")
    t = res.get("tail-chain")
    if t and t["response"]["status_code"] == 200:
        check(t["response"]["body"]["choices"][0]["text"] in ("", "t"), f"tail-chain: {t['response']['body']}")


def test_queue_failure(d):
    lines = [comp("q-one"), comp("q-ok"), comp("q-many", n=3, temperature=0.8), comp("q-ok2")]
    for victim in ("q-one", "q-many"):
        job, out = os.path.join(d, f"queue-{victim}.jsonl"), os.path.join(d, f"queue-{victim}.out.jsonl")
        write_job(job, lines)
        p = run(["-i", job, "-o", out], env={"KVBATCH_TEST_CRASH": f"{victim}:queue"})
        check(p.returncode == 0, f"queue failure of {victim}: exit {p.returncode}: {p.stderr[-400:]}")
        if p.returncode != 0:
            continue
        res = by_id(read_lines(out))
        check(len(res) == len(lines), f"queue failure of {victim}: {len(res)} lines for {len(lines)}")
        for cid, got in res.items():
            st = got["response"]["status_code"]
            want = 500 if cid == victim else 200
            check(st == want, f"queue failure of {victim}: {cid} has status {st}, want {want}")
            if cid == victim and st == 500:
                check("cannot queue" in got["error"]["message"], f"{cid}: {got['error']}")


def cache_job(path, n):
    """n prompts of about 170 tokens, each its own from the first block, so
    that every line of a warm run loads its own chain from the cache."""
    body = " ".join(f"The quick brown fox jumps over the lazy dog number {i}." for i in range(14))
    write_job(path, [{"custom_id": f"p{i}", "prompt": f"Document {i}. {body} Question: what is {i} plus {i}?",
                      "max_tokens": 5, "temperature": 0} for i in range(n)])


def texts(path):
    return {d["custom_id"]: d["response"]["body"]["choices"][0]["text"] for d in read_lines(path)}


def test_cache_damaged_under_run(d):
    job, ref = os.path.join(d, "cd.jsonl"), os.path.join(d, "cd.ref.jsonl")
    cache_job(job, 24)
    p = run(["-i", job, "-o", ref])
    if not check(p.returncode == 0, f"cache damage: the --no-cache run: exit {p.returncode}: {p.stderr[-300:]}"):
        return
    want = texts(ref)
    cold = os.path.join(d, "cd.cache")
    base = [BIN, "run", "--model", MODEL, "-i", job, "--metrics", os.path.join(d, "cd.db")]
    p = subprocess.run(base + ["-o", os.path.join(d, "cd.cold.jsonl"), "--quiet", "--cache-dir", cold],
                       capture_output=True, text=True)
    if not check(p.returncode == 0, f"cache damage: the cold run: exit {p.returncode}: {p.stderr[-300:]}"):
        return
    for how in ("truncate", "zero meta pages"):
        cache = os.path.join(d, "cd.cache." + how.replace(" ", "-"))
        shutil.copytree(cold, cache)
        out = os.path.join(d, f"cd.{how.replace(' ', '-')}.jsonl")
        # one sequence at a time, so that loads from the cache go on all through the run
        proc = subprocess.Popen(base + ["-o", out, "--cache-dir", cache, "--max-batch", "1"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120 and proc.poll() is None:
            if os.path.exists(out) and open(out, "rb").read().count(b"\n") >= 2:
                break
            time.sleep(0.02)
        data = os.path.join(cache, "data.mdb")
        if how == "truncate":
            os.truncate(data, 8192)
        else:
            with open(data, "r+b") as f:
                f.write(b"\0" * 8192)
        _, err = proc.communicate(timeout=600)
        check(proc.returncode == 0, f"cache {how} under a run: exit {proc.returncode}: {err[-600:]}")
        check("changed under this process" in err,
              f"cache {how} under a run: the damage was not met while the run read the cache (too late?): "
              f"{err[-600:]}")
        if proc.returncode == 0:
            got = texts(out)
            check(got == want, f"cache {how} under a run: results differ from --no-cache: "
                               f"{[k for k in want if got.get(k) != want[k]][:5]}")


def test_utf8_cut(d):
    """Outputs held to Chinese characters (3 bytes each, often split over tokens), cut by max_tokens."""
    lines = []
    for k in range(1, 13):
        lines.append(chat(f"u{k}", "Write Chinese.", max_tokens=k, temperature=0.9, seed=k, logprobs=True,
                          guided_regex="[\u4e00-\u9fff]{1,40}"))
        lines.append(comp(f"c{k}", "Chinese:", max_tokens=k, temperature=0.9, seed=k, logprobs=0,
                          guided_regex="[\u4e00-\u9fff]{1,40}"))
    res = results(d, "utf8", lines)
    cut = 0
    for line in lines:
        cid = line["custom_id"]
        b = body(res, cid)
        if not b:
            continue
        c = b["choices"][0]
        text = text_of(b)
        check("\ufffd" not in text, f"{cid}: U+FFFD in {text!r}")
        if "message" in c:
            raw = b"".join(bytes(t["bytes"]) for t in c["logprobs"]["content"])
        else:
            raw = b"".join(bytes.fromhex(t[6:].replace("\\x", "")) if t.startswith("bytes:") else t.encode()
                           for t in c["logprobs"]["tokens"])
        k = len(raw)
        while k > 0:
            try:
                raw[:k].decode("utf-8")
                break
            except UnicodeDecodeError:
                k -= 1
        cut += k < len(raw)
        check(text.encode() == raw[:k], f"{cid}: text {text!r} is not the whole characters of {raw!r}")
    check(cut > 0, "utf8 cut: no output ended inside a character, so nothing was tested")
    print(f"utf8 cut: {cut} of {len(lines)} outputs ended inside a character")


def main():
    if not ready():
        return 77
    with tempfile.TemporaryDirectory() as d:
        if sys.argv[1:] == ["constraints"]:  # the part the ASan build runs too (hardening_constraints)
            test_constraint_killers(d)
            test_queue_failure(d)
            return finish("hardening (constraints)")
        test_logprobs_without_alternatives(d)
        test_nonfinite_model(d)
        test_custom_id_exact(d)
        test_fields(d)
        test_crash_resume(d)
        test_constraint_killers(d)
        test_queue_failure(d)
        test_cache_damaged_under_run(d)
        test_utf8_cut(d)
    return finish("hardening")


if __name__ == "__main__":
    sys.exit(main())
