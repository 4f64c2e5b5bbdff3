#!/usr/bin/env python3
"""`kvbatch render` prints what `kvbatch run` prefills, for every built-in
chat template.

For each template (the list is the one the binary itself gives for an
unknown --chat-template name, so a template added later is covered without
editing this file) a job of chat requests (system + user, user alone,
several turns, add_generation_prompt false, continue_final_message, the
developer role) and completion requests (a text, a prompt list with n = 2,
token ids, a text holding control-token text), plus lines that fail, goes
through `render --format json --ids` and through `run`, and:

- every request's n_tokens (summed over its prompts) is the run's
  usage.prompt_tokens, and every bad line's error is the run's error
  object (code, message, param, line);
- the ids are the ones run prefills: each chat request's ids, sent back as
  a completion with a token-id prompt (greedy, same max_tokens), give the
  chat request's very output (same model, same ids, same output);
- the text is the one those ids were tokenized from (`kvbatch tokenize
  --special`, with BOS when the model adds it);
- the text form carries the same text and ids, --line N gives that line's
  entry, and the exit status is 3 exactly when a line is bad.

Models: two small random-weight GGUFs written here (so any template can be
forced on them and they run fast), one with a byte-level BPE vocabulary and
one with a SentencePiece one (BOS added, the space prefix), both holding the
control tokens of every family; then the default model (SmolLM2) once, with
its own template (the Jinja text its GGUF carries).

Run by ctest (KVB_BIN, KVB_MODEL, KVB_SOURCE_DIR set); exits 77 to skip when
the binary or the default model is missing. Uses only the Python standard
library.
"""
import json
import os
import random
import re
import struct
import subprocess
import sys
import tempfile
import time
from array import array

from kvbcheck import BIN, MODEL, check, finish, ready

# ---- random-weight models -------------------------------------------------------

# Control-token text of every family: in the vocabularies below each is one token, so the
# templates' text must be tokenized with its special tokens parsed (as run does).
CONTROLS = ["<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
            "<start_of_turn>", "<end_of_turn>", "[INST]", "[/INST]"]
GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STR, GGUF_ARR = 4, 5, 6, 7, 8, 9
ALIGN = 32


def _s(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def _kv(key, vtype, val):
    out = _s(key) + struct.pack("<I", vtype)
    if vtype == GGUF_U32:
        return out + struct.pack("<I", val)
    if vtype == GGUF_F32:
        return out + struct.pack("<f", val)
    if vtype == GGUF_BOOL:
        return out + struct.pack("<B", 1 if val else 0)
    if vtype == GGUF_STR:
        return out + _s(val)
    etype, items = val  # an array
    out += struct.pack("<IQ", etype, len(items))
    if etype == GGUF_STR:
        return out + b"".join(_s(x) for x in items)
    return out + b"".join(struct.pack("<i" if etype == GGUF_I32 else "<f", x) for x in items)


def write_gguf(path, kvs, tensors):
    """A GGUF v3 file: kvs [(key, type, value)], tensors [(name, shape (ne0 first), floats)] as F32."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(_kv(*kv) for kv in kvs)
    infos, blobs, off = b"", [], 0
    for name, shape, data in tensors:
        infos += _s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        infos += struct.pack("<IQ", 0, off)  # type F32, offset in the data section
        blob = array("f", data).tobytes()
        blob += b"\0" * (-len(blob) % ALIGN)
        blobs.append(blob)
        off += len(blob)
    meta = head + infos
    with open(path, "wb") as f:
        f.write(meta + b"\0" * (-len(meta) % ALIGN) + b"".join(blobs))


def gpt2_byte_chars():
    """GPT-2's byte-level alphabet: each byte as one visible character."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cps, n = {}, 0
    for b in range(256):
        if b in keep:
            cps[b] = chr(b)
        else:
            cps[b] = chr(256 + n)
            n += 1
    return [cps[b] for b in range(256)]


def bpe_vocab():
    """Byte-level BPE: 256 byte tokens, a few merges, the control tokens; BOS added."""
    toks = gpt2_byte_chars()
    merges = ["Ġ t", "h e", "Ġt he", "i n", "e r", "Ġ a", "o n"]
    toks += [m.replace(" ", "") for m in merges]
    types = [1] * len(toks)
    specials = ["<|endoftext|>", "<s>", "</s>"] + CONTROLS
    toks += specials
    types += [3] * len(specials)
    kvs = [("tokenizer.ggml.model", GGUF_STR, "gpt2"), ("tokenizer.ggml.pre", GGUF_STR, "gpt-2"),
           ("tokenizer.ggml.tokens", GGUF_ARR, (GGUF_STR, toks)),
           ("tokenizer.ggml.token_type", GGUF_ARR, (GGUF_I32, types)),
           ("tokenizer.ggml.merges", GGUF_ARR, (GGUF_STR, merges)),
           ("tokenizer.ggml.bos_token_id", GGUF_U32, toks.index("<s>")),
           ("tokenizer.ggml.eos_token_id", GGUF_U32, toks.index("</s>")),
           ("tokenizer.ggml.add_bos_token", GGUF_BOOL, True)]
    return toks, kvs


def spm_vocab():
    """SentencePiece BPE with byte fallback: <unk> <s> </s>, 256 <0xNN>, the control tokens,
    then "▁", the printable ASCII characters and a few merges (scored); BOS added and the
    space prefix, as Llama 2's and Mistral's tokenizers do."""
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + CONTROLS
    types = [2, 3, 3] + [6] * 256 + [3] * len(CONTROLS)
    normal = ["▁"] + [chr(c) for c in range(33, 127)] + ["▁t", "he", "▁the", "in", "er", "▁a", "on", "▁I"]
    toks += normal
    types += [1] * len(normal)
    scores = [0.0] * (len(toks) - len(normal)) + [-float(i) for i in range(len(normal))]
    kvs = [("tokenizer.ggml.model", GGUF_STR, "llama"),
           ("tokenizer.ggml.tokens", GGUF_ARR, (GGUF_STR, toks)),
           ("tokenizer.ggml.scores", GGUF_ARR, (GGUF_F32, scores)),
           ("tokenizer.ggml.token_type", GGUF_ARR, (GGUF_I32, types)),
           ("tokenizer.ggml.bos_token_id", GGUF_U32, 1), ("tokenizer.ggml.eos_token_id", GGUF_U32, 2),
           ("tokenizer.ggml.unknown_token_id", GGUF_U32, 0)]
    return toks, kvs


def write_random_model(path, vocab, seed):
    """A 2-layer llama with random F32 weights, scaled as tests/support/synth.c scales them but
    for an untied output and sharper, stronger attention: with synth's tied output a random model
    mostly repeats the prompt's last token, so its output could not tell two prompts apart;
    this one's greedy output changes when any one token of the prompt does."""
    toks, tok_kvs = vocab
    rnd = random.Random(seed)
    n_vocab, e, ff, nh, nkv = len(toks), 64, 128, 4, 2
    hd = e // nh

    def mat(n_in, n_out, sigma):
        u = sigma * 3 ** 0.5
        return [rnd.uniform(-u, u) for _ in range(n_in * n_out)]

    def norm(n):
        return [1.0 + rnd.uniform(-0.17, 0.17) for _ in range(n)]

    kvs = [("general.architecture", GGUF_STR, "llama"), ("general.name", GGUF_STR, "render test model"),
           ("llama.block_count", GGUF_U32, 2), ("llama.context_length", GGUF_U32, 2048),
           ("llama.embedding_length", GGUF_U32, e), ("llama.feed_forward_length", GGUF_U32, ff),
           ("llama.attention.head_count", GGUF_U32, nh), ("llama.attention.head_count_kv", GGUF_U32, nkv),
           ("llama.attention.key_length", GGUF_U32, hd), ("llama.rope.dimension_count", GGUF_U32, hd),
           ("llama.rope.freq_base", GGUF_F32, 10000.0),
           ("llama.attention.layer_norm_rms_epsilon", GGUF_F32, 1e-5)] + tok_kvs
    si, sf = e ** -0.5, ff ** -0.5
    tensors = [("token_embd.weight", [e, n_vocab], mat(e, n_vocab, 1.0)), ("output_norm.weight", [e], norm(e)),
               ("output.weight", [e, n_vocab], mat(e, n_vocab, si))]
    for l in range(2):
        b = f"blk.{l}."
        tensors += [(b + "attn_norm.weight", [e], norm(e)), (b + "attn_q.weight", [e, e], mat(e, e, 3 * si)),
                    (b + "attn_k.weight", [e, nkv * hd], mat(e, nkv * hd, 3 * si)),
                    (b + "attn_v.weight", [e, nkv * hd], mat(e, nkv * hd, si)),
                    (b + "attn_output.weight", [e, e], mat(e, e, 4 * si)), (b + "ffn_norm.weight", [e], norm(e)),
                    (b + "ffn_gate.weight", [e, ff], mat(e, ff, si)), (b + "ffn_up.weight", [e, ff], mat(e, ff, si)),
                    (b + "ffn_down.weight", [ff, e], mat(ff, e, sf))]
    write_gguf(path, kvs, tensors)


# ---- the job ---------------------------------------------------------------------

SYSTEM = "You are terse. Answer in one short sentence."
LONG = "word " * 700  # past --ctx in any of the vocabularies
CTX = "512"


# Greedy, with the logprob of every token: two runs from the same prefilled ids give the same
# floats bit for bit (the CPU's results do not depend on the batch), other ids almost never do.
def chat(cid, msgs, **kw):
    return {"custom_id": cid, "messages": [{"role": r, "content": c} for r, c in msgs], "max_tokens": 6,
            "temperature": 0, "logprobs": True, **kw}


def comp(cid, prompt, **kw):
    return {"custom_id": cid, "prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 0, **kw}


def job_lines():
    return [
        chat("sys-user", [("system", SYSTEM), ("user", "Where is the station?")]),
        chat("user", [("user", "Hi there")]),
        chat("multi", [("system", SYSTEM), ("user", "Name a colour."), ("assistant", "Blue."),
                       ("user", "And another one?")]),
        chat("two-sys", [("system", SYSTEM), ("system", "Be kind."), ("user", "Hello")]),
        chat("nogen", [("user", "Name a fruit."), ("assistant", "A pear."), ("user", "Thanks")],
             add_generation_prompt=False),
        chat("cont", [("user", "Name a fruit."), ("assistant", "My favourite fruit is the")],
             add_generation_prompt=False, continue_final_message=True),
        chat("dev", [("developer", "Answer in French."), ("user", "What is bread?")]),  # refused by some
        chat("unicode", [("user", "Ünïcødé 🙂 and a\ttab\nand a second line ")]),
        chat("json", [("user", "Give me a JSON object.")], response_format={"type": "json_object"}),
        "",  # blank: no output line, no entry
        comp("text", "The capital of France is"),
        comp("ctrl-text", "<|im_start|>user\nplain text, not control tokens<|im_end|>"),
        comp("list", ["Once upon a time", "the end"], n=2, temperature=0.8, seed=3),
        comp("ids", [1, 2, 3, 40, 50, 60, 70]),
        comp("bad-temp", "x", temperature=-1),
        chat("user", [("user", "a duplicate custom_id")]),
        comp("long", LONG),
        '{"custom_id": "broken", "prompt": ',
    ]


def write_job(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        for d in lines:
            f.write((d if isinstance(d, str) else json.dumps(d)) + "\n")


def render(model, tmpl, job, *extra):
    args = [BIN, "render", "--model", model, "--input", job, "--ctx", CTX] + (["--chat-template", tmpl] if tmpl else [])
    return subprocess.run(args + list(extra), capture_output=True, text=True)


def run(model, tmpl, job, out):
    args = [BIN, "run", "--model", model, "--quiet", "--no-cache", "--ctx", CTX, "-i", job, "-o", out,
            "--metrics", out + ".db"] + (["--chat-template", tmpl] if tmpl else [])
    p = subprocess.run(args, capture_output=True, text=True)
    check(p.returncode == 0, f"run {tmpl}: exit {p.returncode}: {p.stderr[-400:]}")
    with open(out, encoding="utf-8") as f:
        return [json.loads(l) for l in f]


def tokenize(model, text, special, bos):
    p = subprocess.run([BIN, "tokenize", "--model", model] + (["--special"] if special else []) +
                       (["--bos"] if bos else []) + ["--", text], capture_output=True, text=True)
    check(p.returncode == 0, f"tokenize: {p.stderr}")
    return [int(x) for x in p.stdout.split()]


def output_of(d):
    """(text, finish_reason, completion_tokens, logprobs) of a one-choice result line."""
    b = d["response"]["body"]
    c = b["choices"][0]
    lp = [t["logprob"] for t in c["logprobs"]["content"]] if "message" in c else c["logprobs"]["token_logprobs"]
    return (c["message"]["content"] if "message" in c else c["text"], c["finish_reason"],
            b["usage"]["completion_tokens"], lp)


def parse_text_form(out):
    """The text form back into [(line, custom_id, template, tokens, text, ids)] and error lines."""
    entries, errors = [], []
    head = re.compile(r"^# line (\d+) custom_id=(\S+)(?: prompt=\d+/\d+)? template=(\S+) tokens=(\d+)")
    lines = out.split("\n")
    i = 0
    while i < len(lines):
        m = head.match(lines[i])
        if not m:
            e = re.match(r"^# line (\d+) custom_id=\S+ error=([^\s:]+)", lines[i])
            check(e is not None or lines[i] == "" and i == len(lines) - 1, f"text form: stray line {lines[i]!r}")
            if e:
                errors.append((int(e.group(1)), e.group(2)))
            i += 1
            continue
        i += 1
        body = []
        while not lines[i].startswith("# ids: "):
            body.append(lines[i])
            i += 1
        if body and body[-1] == "\\ no newline at the end":
            text = "\n".join(body[:-1])
        else:
            text = "\n".join(body) + "\n"
        ids = [int(x) for x in lines[i][len("# ids: "):].split()]
        entries.append((int(m.group(1)), m.group(2), m.group(3), int(m.group(4)), text, ids))
        i += 1
    return entries, errors


# ---- the checks ----------------------------------------------------------------

def check_template(d, model, tmpl, bos, label):
    """One model with one template (None: the model's own): the job through render and run."""
    job, out = os.path.join(d, label + ".jsonl"), os.path.join(d, label + ".out.jsonl")
    lines = job_lines()
    write_job(job, lines)
    p = render(model, tmpl, job, "--format", "json", "--ids")
    check(p.returncode == 3, f"{label}: render of a job with bad lines exited {p.returncode}: {p.stderr[-300:]}")
    rend = [json.loads(l) for l in p.stdout.splitlines()]
    n_lines = sum(1 for l in lines if l != "")
    check(len(rend) == n_lines, f"{label}: {len(rend)} render entries for {n_lines} non-blank lines")
    res = run(model, tmpl, job, out)
    check(len(res) == n_lines, f"{label}: run wrote {len(res)} lines for {n_lines}")
    run_ok = {r["custom_id"]: r for r in res if r["error"] is None}
    run_err = {r["error"]["line"]: r["error"] for r in res if r["error"] is not None}

    # (a) what render prints is what run counts; a bad line is the run's error
    by_line = {}
    for r in rend:
        by_line[r["line"]] = r
        if r["error"] is not None:
            check(run_err.get(r["line"]) == r["error"],
                  f"{label}: line {r['line']}: render error {r['error']} but run wrote {run_err.get(r['line'])}")
            continue
        cid = r["custom_id"]
        got = run_ok.get(cid)
        if not check(got is not None, f"{label}: {cid} rendered but run wrote {run_err.get(r['line'])}"):
            continue
        usage = got["response"]["body"]["usage"]["prompt_tokens"]
        n = sum(q["n_tokens"] for q in r["prompts"])
        check(n == usage and r["prompt_tokens"] == usage,
              f"{label}: {cid}: render counts {n} ({r['prompt_tokens']}) tokens, run prefilled {usage}")
        check(all(len(q["ids"]) == q["n_tokens"] for q in r["prompts"]), f"{label}: {cid}: ids vs n_tokens")
        is_chat = lines[r["line"] - 1].get("messages") is not None
        # the model's own template is named by its key and hash
        want = (tmpl or r"tokenizer\.chat_template@[0-9a-f]{12}") if is_chat else None
        check(r["template"] == want if not is_chat or tmpl else re.fullmatch(want, r["template"] or ""),
              f"{label}: {cid}: template {r['template']!r}, want {want!r}")
    check(len(run_err) == sum(1 for r in rend if r["error"] is not None),
          f"{label}: run wrote {len(run_err)} errors, render {sum(1 for r in rend if r['error'])}")
    rendered = [r for r in rend if r["error"] is None]
    check(len(rendered) >= 11, f"{label}: only {len(rendered)} lines rendered: the job lost its point")

    # the text is what the ids were tokenized from
    for r in rendered:
        src = lines[r["line"] - 1]
        is_chat = src.get("messages") is not None
        for k, q in enumerate(r["prompts"]):
            given = src.get("prompt") if not is_chat else None
            if isinstance(given, list) and given and isinstance(given[0], int):
                check(q["ids"] == given, f"{label}: {r['custom_id']}: token ids {q['ids']} for {given}")
                continue
            ids = tokenize(model, q["text"], is_chat, bos)
            check(ids == q["ids"],
                  f"{label}: {r['custom_id']}[{k}]: the text tokenizes to {ids}, render says {q['ids']}")

    # (b) the ids are what run prefills: sent back as token ids they give the same output
    back = []
    for r in rendered:
        src = lines[r["line"] - 1]
        if len(r["prompts"]) != 1 or src.get("n", 1) != 1:
            continue
        c = {k: v for k, v in src.items()
             if k not in ("messages", "prompt", "add_generation_prompt", "continue_final_message", "logprobs")}
        c["custom_id"] = r["custom_id"] + "/ids"
        c["prompt"] = r["prompts"][0]["ids"]
        c["logprobs"] = 0
        back.append(c)
    check(sum(1 for c in back if lines_by_id(lines)[c["custom_id"][:-4]].get("messages")) >= 7,
          f"{label}: too few chat lines to send back")
    job2, out2 = os.path.join(d, label + "-ids.jsonl"), os.path.join(d, label + "-ids.out.jsonl")
    write_job(job2, back)
    p2 = render(model, tmpl, job2, "--format", "json", "--ids")
    check(p2.returncode == 0, f"{label}: render of a job without bad lines exited {p2.returncode}: {p2.stderr}")
    for r2, c in zip([json.loads(l) for l in p2.stdout.splitlines()], back):
        check(r2["prompts"][0]["ids"] == c["prompt"], f"{label}: {c['custom_id']}: token ids not rendered as given")
    res2 = {r["custom_id"]: r for r in run(model, tmpl, job2, out2)}
    outs = [output_of(run_ok[c["custom_id"][:-4]]) for c in back if c["custom_id"][:-4] in run_ok]
    check(len({repr(o) for o in outs}) * 4 >= len(outs) * 3,
          f"{label}: the outputs hardly differ from prompt to prompt, so equal outputs would prove little: {outs}")
    for c in back:
        cid = c["custom_id"][:-4]
        a, b = run_ok.get(cid), res2.get(c["custom_id"])
        if not check(b is not None and b["error"] is None, f"{label}: {c['custom_id']}: {b and b['error']}"):
            continue
        check(b["response"]["body"]["usage"]["prompt_tokens"] == a["response"]["body"]["usage"]["prompt_tokens"],
              f"{label}: {cid}: {b['response']['body']['usage']} as ids, {a['response']['body']['usage']} as sent")
        check(output_of(a) == output_of(b),
              f"{label}: {cid}: run gave {output_of(a)!r}, the rendered ids give {output_of(b)!r}")

    # the text form says the same; --line N gives that line's entry
    p3 = render(model, tmpl, job, "--ids")
    check(p3.returncode == 3, f"{label}: text form exited {p3.returncode}")
    entries, errors = parse_text_form(p3.stdout)
    flat = [(r["line"], r["custom_id"], r["template"] or "none", q["n_tokens"], q["text"], q["ids"])
            for r in rendered for q in r["prompts"]]
    check(entries == flat, f"{label}: the text form differs from the JSON form")
    check(errors == [(r["line"], r["error"]["code"]) for r in rend if r["error"]], f"{label}: text form errors")
    multi = next(r for r in rend if r["custom_id"] == "multi")
    p4 = render(model, tmpl, job, "--format", "json", "--ids", "--line", str(multi["line"]))
    check(p4.returncode == 0 and [json.loads(l) for l in p4.stdout.splitlines()] == [multi],
          f"{label}: --line {multi['line']}: exit {p4.returncode}, {p4.stdout[:200]!r}")
    dup = max(r["line"] for r in rend if r["custom_id"] == "user")
    p5 = render(model, tmpl, job, "--format", "json", "--line", str(dup))
    check(p5.returncode == 3 and json.loads(p5.stdout)["error"]["code"] == "duplicate_custom_id",
          f"{label}: --line {dup} (a duplicate of an earlier line): exit {p5.returncode}, {p5.stdout!r}")


def lines_by_id(lines):
    out = {}
    for d in lines:
        if isinstance(d, dict):
            out.setdefault(d["custom_id"], d)
    return out


def template_names():
    """The built-in templates, as the binary lists them for a name it does not know."""
    p = subprocess.run([BIN, "render", "--input", "-", "--chat-template", "no-such-template"], capture_output=True,
                       text=True, stdin=subprocess.DEVNULL)
    m = re.search(r"known: ([^)]*)\)", p.stderr)
    check(p.returncode == 2 and m, f"render --chat-template no-such-template: exit {p.returncode}: {p.stderr}")
    return [n.strip() for n in m.group(1).split(",")] if m else []


def main():
    if not ready():
        return 77
    names = template_names()
    check(len(names) >= 9 and "chatml" in names and "gemma" in names, f"built-in templates: {names}")
    with tempfile.TemporaryDirectory() as d:
        models = [("bpe", bpe_vocab(), True), ("spm", spm_vocab(), True)]
        for label, vocab, bos in models:
            path = os.path.join(d, label + ".gguf")
            write_random_model(path, vocab, seed=len(label))
            for t in names:
                t0 = time.time()
                check_template(d, path, t, bos, f"{label}-{t}")
                print(f"{label} {t}: {time.time() - t0:.1f} s")
        t0 = time.time()
        check_template(d, MODEL, None, False, "default-model")  # SmolLM2: its own Jinja template, no BOS
        print(f"default model: {time.time() - t0:.1f} s")
    return finish("render")


if __name__ == "__main__":
    sys.exit(main())
