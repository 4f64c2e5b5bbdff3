#!/usr/bin/env python3
"""Embeddings (/v1/embeddings) on the real default model against transformers.

1. Values. With `run --pooling mean` and `--pooling last`, each embedding kvbatch writes is
   compared with transformers' base model (AutoModel through its own GGUF loader,
   last_hidden_state: the final norm's output) pooled the same way (mean over the tokens,
   or the last token's state) and L2-normalised, on inputs given as token ids (the
   tokenizer is then not part of the comparison) and as text (whose tokens must be the
   transformers tokenizer's: usage.prompt_tokens equals their count, and the vector is the
   ids input's bit for bit). Long inputs go through chunked prefill (--max-step-tokens 64),
   and inputs sharing an instruction prefix are in the same job.
   - On an F16 copy of the file (every tensor dequantized by gguf-py and stored as F16, which
     transformers reads as the same numbers) the CPU backend multiplies float activations:
     cosine >= 0.99999 on every text — the pooled state is the one transformers computes.
   - On the Q4_1 file itself, whose products take activations rounded to int8 per block of
     32 (as llama.cpp's do), each hidden state moves by a few 1e-4 in cosine (measured on a
     46-token text: mean 1 - cos 4.4e-4 for kvbatch's AVX-512 kernels, 5.1e-4 for llama.cpp's
     llama-embedding, at most 1.8e-3 and 2.2e-3): cosine >= 0.998 on every text and >= 0.9995
     on average. With `--activations 16` (the rounding's residual rounded and multiplied too)
     that noise goes: cosine >= 0.99999 on every text (issue 25 asks 0.999). The 16-bit run
     uses the 8-bit run's cache and must compute every token again: the store keeps the two
     arithmetics apart.
2. Shapes. Every result line validates strictly with the openai package's
   CreateEmbeddingResponse (pydantic strict mode, no field it does not know, the same JSON
   back); a base64 line decodes (little-endian float32) to the float line's values exactly
   and then validates the same way; `dimensions` N gives the first N values renormalised;
   a model without pooling and no --pooling gets an error line naming the option; bad
   fields are error lines.
3. Remembered. A second run of the same job on the same cache computes 0 prompt tokens
   (the results cache answers every input) and writes identical vectors; the report's
   prefix reuse counts them.
4. Mixed. Chat lines beside embeddings lines on the same decoder give the tokens they give
   alone.

Exit 0 pass, 1 fail, 77 skipped (no binary/model, or torch/transformers/openai missing).
"""
import base64
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvbcheck import BIN, MODEL, check, finish, need_modules, ready  # noqa: E402

INSTRUCT = "Instruct: Given a question about the library, retrieve the passage that answers it.\nQuery: "
TEXTS = [
    "The cat sat on the mat.",
    INSTRUCT + "Where are the atlases kept?",
    INSTRUCT + "When do you open on Sundays?",
    "Paged attention stores the key and value vectors of every token in fixed-size blocks, so that sequences "
    "of different lengths can share one pool of memory without fragmentation. " * 3,
    "Héllo wörld — ça va? 日本語のテキスト.",
    "x",
]


def f16_copy(src, dst):
    """Every tensor of src dequantized by gguf-py and written as F16 (norms as F32), the
    metadata as it is."""
    import gguf
    import numpy as np
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(f.name, f.contents(), f.types[0], sub_type=f.types[1])
        else:
            w.add_key_value(f.name, f.contents(), f.types[0])
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)])
        if a.ndim == 1:
            w.add_tensor(t.name, a.astype(np.float32), raw_dtype=gguf.GGMLQuantizationType.F32)
        else:
            w.add_tensor(t.name, a.astype(np.float16), raw_dtype=gguf.GGMLQuantizationType.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run(args, timeout=900):
    return subprocess.run([BIN] + args, capture_output=True, text=True, timeout=timeout)


def computed_tokens(stderr):
    m = re.search(r"prompt tokens \(\d+ reused in-run, (\d+) from the cache, (\d+) computed\)", stderr)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def main():
    if not ready():
        return 77
    need_modules("numpy", "torch", "transformers", "openai", "gguf")
    import numpy as np
    import torch
    from openai.types import CreateEmbeddingResponse
    from transformers import AutoModel, AutoTokenizer
    from reqspace import strict

    real = os.path.realpath(MODEL)
    mdir, mfile = os.path.dirname(real), os.path.basename(real)
    tok = AutoTokenizer.from_pretrained(mdir, gguf_file=mfile)
    ids = [tok(t)["input_ids"] for t in TEXTS]

    def hf_refs(path):
        hf = AutoModel.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                       dtype=torch.float32).eval()
        states = []
        with torch.no_grad():
            for x in ids:
                states.append(hf(torch.tensor([x])).last_hidden_state[0].double().numpy())
        print("transformers:", type(hf).__name__, os.path.basename(path), "token counts", [len(x) for x in ids])
        return {"mean": [s.mean(0) for s in states], "last": [s[-1] for s in states]}

    def fail(msg):
        check(False, msg)

    def lines_for():
        out = [{"custom_id": "ids", "url": "/v1/embeddings", "body": {"input": ids, "model": "smol"}},
               {"custom_id": "text", "url": "/v1/embeddings", "body": {"input": TEXTS}},
               {"custom_id": "b64", "input": ids, "encoding_format": "base64"},
               {"custom_id": "dims", "input": ids[:2], "dimensions": 64, "user": "someone"}]
        return out

    def write_job(path, lines):
        with open(path, "w") as f:
            for l in lines:
                f.write(json.dumps(l, ensure_ascii=False) + "\n")

    def read_out(path):
        res = {}
        with open(path) as f:
            for line in f:
                o = json.loads(line)
                res[o["custom_id"]] = o
        return res

    def vec(o, i):
        e = o["response"]["body"]["data"][i]["embedding"]
        if isinstance(e, str):
            return np.frombuffer(base64.b64decode(e), dtype="<f4")
        return np.array(e, dtype=np.float32)

    table = []
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.jsonl")
        write_job(job, lines_for())
        # the F16 copy: float products, so the same numbers as transformers' up to f32 rounding
        f16 = os.path.join(tmp, "smollm2-f16.gguf")
        f16_copy(real, f16)
        exact = hf_refs(f16)
        for pooling in ("mean", "last"):
            out = os.path.join(tmp, f"f16-{pooling}.jsonl")
            p = run(["run", "-m", f16, "-i", job, "-o", out, "--no-cache", "--pooling", pooling,
                     "--max-step-tokens", "64", "--metrics", os.path.join(tmp, "f16.db")])
            if not check(p.returncode == 0, f"f16 {pooling}: kvbatch run failed: {p.stderr[-800:]}"):
                continue
            res = read_out(out)
            for i in range(len(TEXTS)):
                got = vec(res["ids"], i).astype(np.float64)
                ref = exact[pooling][i]
                cos = float(got @ ref / np.linalg.norm(got) / np.linalg.norm(ref))
                table.append(("F16 copy", pooling, i, len(ids[i]), cos))
                check(cos >= 0.99999, f"F16 copy {pooling} text {i}: cosine {cos:.7f} with transformers < 0.99999")
        # Under --kernels amx the F16 matrices run on BF16 tiles, not the other kernels' bits
        # (README, CPU kernels): the store keeps their results apart, so a cache filled by one
        # never answers the other, and each answers itself.
        have = [k for k in ("avx512", "amx")
                if run(["generate", "-m", MODEL, "--kernels", k, "-p", "a", "-n", "1", "-q"]).returncode == 0]
        if len(have) == 2:
            cache = os.path.join(tmp, "cache-kernels")
            seen = []
            for k in ("avx512", "amx", "amx", "avx512"):
                out = os.path.join(tmp, f"f16-{k}.jsonl")
                p = run(["run", "-m", f16, "-i", job, "-o", out, "--cache-dir", cache, "--pooling", "mean",
                         "--kernels", k, "--metrics", os.path.join(tmp, "f16k.db")])
                if not check(p.returncode == 0, f"f16 --kernels {k}: kvbatch run failed: {p.stderr[-800:]}"):
                    break
                seen.append(computed_tokens(p.stderr)[1])
            if len(seen) == 4:
                check(seen[0] > 0 and seen[1] == seen[0] and seen[2] == 0 and seen[3] == 0,
                      f"F16 copy, one cache, kernels avx512/amx/amx/avx512: computed {seen} (want n, n, 0, 0)")
                print(f"F16 copy, one cache, kernels avx512, amx, amx, avx512: {seen} prompt tokens computed")
        os.unlink(f16)
        refs = hf_refs(real)
        # 8-bit activations (the default: llama.cpp's rounding) and 16-bit ones (--activations 16),
        # each pooling's two on one cache: the 16-bit run must compute what the 8-bit one left there.
        first_computed = {}
        for pooling, bits in (("mean", 8), ("last", 8), ("mean", 16), ("last", 16)):
            cache = os.path.join(tmp, "cache-" + pooling)
            tag = f"{pooling}/{bits}-bit"
            out = os.path.join(tmp, f"out-{pooling}-{bits}.jsonl")
            args = ["run", "-m", MODEL, "-i", job, "-o", out, "--cache-dir", cache, "--pooling", pooling,
                    "--max-step-tokens", "64", "--metrics", os.path.join(tmp, f"m-{pooling}-{bits}.db"),
                    "--activations", str(bits)]
            p = run(args)
            if not check(p.returncode == 0, f"{tag}: kvbatch run failed: {p.stderr[-800:]}"):
                continue
            computed0 = computed_tokens(p.stderr)[1]
            if bits == 8:
                first_computed[pooling] = computed0
            else:
                check(computed0 == first_computed.get(pooling, -1) and computed0 > 0,
                      f"{tag}: the first run on the 8-bit run's cache computed {computed0} prompt tokens "
                      f"(want {first_computed.get(pooling)}: 8-bit results must not answer)")
            res = read_out(out)
            check(set(res) == {"ids", "text", "b64", "dims"}, f"{tag}: results {sorted(res)}")
            for cid, o in res.items():
                check(o["error"] is None and o["response"]["status_code"] == 200, f"{tag} {cid}: {o}")
            if any(o["error"] is not None for o in res.values()):
                continue
            # 1. values against transformers
            coss = []
            for i in range(len(TEXTS)):
                got = vec(res["ids"], i).astype(np.float64)
                ref = refs[pooling][i] / np.linalg.norm(refs[pooling][i])
                cos = float(got @ ref / np.linalg.norm(got))
                coss.append(cos)
                table.append((f"Q4_1 a{bits}", pooling, i, len(ids[i]), cos))
                # 8 bits: llama.cpp's rounding, as close as llama-embedding (text 0: 0.9988 vs its 0.9994);
                # 16 bits: issue 25 asks >= 0.999 on every text; measured >= 0.9999998, held at 0.99999.
                bar = 0.998 if bits == 8 else 0.99999
                check(cos >= bar, f"{tag} text {i}: cosine {cos:.7f} with transformers < {bar}")
                check(abs(np.linalg.norm(got) - 1) < 1e-5, f"{tag} text {i}: not normalised")
            check(bits == 16 or np.mean(coss) >= 0.9995,
                  f"{tag}: mean cosine {np.mean(coss):.6f} with transformers < 0.9995")
            # text inputs: the transformers tokenizer's tokens, so the same vectors bit for bit
            body = res["text"]["response"]["body"]
            check(body["usage"]["prompt_tokens"] == sum(len(x) for x in ids),
                  f"{tag}: text usage {body['usage']} vs {sum(len(x) for x in ids)} transformers tokens")
            for i in range(len(TEXTS)):
                check(np.array_equal(vec(res["text"], i), vec(res["ids"], i)),
                      f"{tag} text {i}: the text input's vector differs from the ids input's")
            # 2. shapes
            for cid in ("ids", "text", "dims"):
                strict(CreateEmbeddingResponse, res[cid]["response"]["body"], f"{tag} {cid}", fail)
            b = json.loads(json.dumps(res["b64"]["response"]["body"]))
            for i, d in enumerate(b["data"]):
                raw = base64.b64decode(d["embedding"], validate=True)
                check(len(raw) == 4 * 576, f"{tag} b64 {i}: {len(raw)} bytes")
                check(np.array_equal(np.frombuffer(raw, dtype="<f4"), vec(res["ids"], i)),
                      f"{tag} b64 {i}: decodes to other values than the float line")
                d["embedding"] = [float(x) for x in np.frombuffer(raw, dtype="<f4")]
            m = CreateEmbeddingResponse.model_validate(b, strict=True)
            check(len(m.data) == len(TEXTS), f"{tag} b64: {len(m.data)} embeddings")
            for i in range(2):
                d = vec(res["dims"], i).astype(np.float64)
                full = vec(res["ids"], i).astype(np.float64)[:64]
                check(len(d) == 64 and np.allclose(d, full / np.linalg.norm(full), atol=1e-6),
                      f"{tag} dims {i}: not the first 64 values renormalised")
            check(res["ids"]["response"]["body"]["model"] == "smol", "model not echoed")
            # 3. remembered: the same job again on the same cache
            out2 = os.path.join(tmp, f"out2-{pooling}-{bits}.jsonl")
            p2 = run(args[:6] + [out2] + args[7:])
            if check(p2.returncode == 0, f"{tag}: second run failed: {p2.stderr[-600:]}"):
                store, computed = computed_tokens(p2.stderr)
                check(computed == 0, f"{tag}: the second run computed {computed} prompt tokens (want 0)")
                res2 = read_out(out2)
                for cid in res:
                    check(res2[cid]["response"]["body"]["data"] == res[cid]["response"]["body"]["data"],
                          f"{tag} {cid}: the second run's vectors differ")
                rep = run(["report", os.path.join(tmp, f"m-{pooling}-{bits}.db"), "--format", "json"])
                if check(rep.returncode == 0, f"report failed: {rep.stderr[-300:]}"):
                    reuse = json.loads(rep.stdout)["prefix_reuse"]
                    check(reuse["computed"]["tokens"] == 0 and reuse["persistent_store"]["share"] == 1,
                          f"{tag}: the report's prefix reuse of the second run: {reuse}")
                print(f"{tag}: second run: {store} prompt tokens from the cache, {computed} computed")

        # errors: no pooling, bad fields, too many dimensions
        bad = os.path.join(tmp, "bad.jsonl")
        write_job(bad, [{"custom_id": "temp", "input": "hello", "temperature": 0.5},
                        {"custom_id": "fmt", "input": "hello", "encoding_format": "int8"},
                        {"custom_id": "dims", "input": "hello", "dimensions": 577},
                        {"custom_id": "empty", "input": ""},
                        {"custom_id": "oov", "input": [[1, 2, 999999]]},
                        {"custom_id": "long", "input": "word " * 5000}])
        out = os.path.join(tmp, "bad-out.jsonl")
        p = run(["run", "-m", MODEL, "-i", bad, "-o", out, "--no-cache", "--pooling", "mean", "--metrics",
                 os.path.join(tmp, "b.db")])
        check(p.returncode == 0, f"bad job: exit {p.returncode}: {p.stderr[-400:]}")
        res = read_out(out)
        nopool = os.path.join(tmp, "nopool.jsonl")
        write_job(nopool, [{"custom_id": "nopool", "input": "hello"}])
        p = run(["run", "-m", MODEL, "-i", nopool, "-o", out, "--no-cache", "--metrics", os.path.join(tmp, "n.db")])
        res.update(read_out(out))
        want = {"nopool": "--pooling", "temp": "temperature", "fmt": "encoding_format", "dims": "dimensions",
                "empty": "must not be empty", "oov": "not in the vocabulary", "long": "context"}
        for cid, w in want.items():
            e = res.get(cid, {}).get("error") or {}
            check(w in (e.get("message") or ""), f"error line {cid}: {e} does not name {w!r}")

        # 4. mixed: chat beside embeddings gives what it gives alone
        chat = {"custom_id": "chat", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 12,
                "temperature": 0}
        alone, mixed = os.path.join(tmp, "alone.jsonl"), os.path.join(tmp, "mixed.jsonl")
        write_job(alone, [chat])
        write_job(mixed, [{"custom_id": "e0", "input": TEXTS}, chat, {"custom_id": "e1", "input": TEXTS[:3]}])
        outs = []
        for j in (alone, mixed):
            o = j + ".out"
            p = run(["run", "-m", MODEL, "-i", j, "-o", o, "--no-cache", "--pooling", "last", "--metrics", j + ".db"])
            check(p.returncode == 0, f"mixed: {p.stderr[-300:]}")
            outs.append(read_out(o))
        if "chat" in outs[0] and "chat" in outs[1]:
            a = outs[0]["chat"]["response"]["body"]["choices"][0]["message"]["content"]
            b = outs[1]["chat"]["response"]["body"]["choices"][0]["message"]["content"]
            check(a == b, f"chat beside embeddings wrote {b!r}, alone {a!r}")
            check(all(outs[1][k]["error"] is None for k in ("e0", "e1")), "mixed: an embeddings line failed")

    print("file      pooling  text  tokens  cosine vs transformers")
    for what, pooling, i, n, cos in table:
        print(f"{what:9s} {pooling:7s}  {i:4d}  {n:6d}  {cos:.7f}")
    return finish("embeddings")


if __name__ == "__main__":
    sys.exit(main())
