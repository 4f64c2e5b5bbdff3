#!/usr/bin/env python3
"""BERT encoders (`bert`) against transformers: embeddings and a cross-encoder.

Random weights go into transformers' BertModel and BertForSequenceClassification (built
from BertConfig, float32, CPU) and into GGUFs written as llama.cpp's converter writes them
(conversion/bert.py BertModel: the `bert.*` keys, `attention.causal` false, a pooling type
from sentence-transformers' config, the tensors through gguf-py's TensorNameMap, the
pooler dropped; the vocabulary is llama.cpp's ggml-vocab-bert-bge (fetched by
scripts/fetch-testdata.sh): its WordPiece tokens in the converter's "phantom space" form,
and the same vocabulary back in BERT's own form for transformers' BertTokenizerFast).
Texts go to kvbatch as text, so its WordPiece tokenizer is checked end to end: the token
counts of its usage must be BertTokenizerFast's.

1. Embeddings (pooling_type mean from the file; cls with --pooling cls): cosine >= 0.99999
   with BertModel's last_hidden_state pooled the same way and L2-normalised, F32 weights;
   >= 0.9999 with the file in F16 (transformers reads the same F16 numbers through the
   GGUF's values: both compute in float). Texts of 1 to ~400 tokens in one job, so
   sequences of different lengths share steps.
2. Cross-encoder (BertForSequenceClassification, one label): /v1/score lines give
   sigmoid(logit) within 1e-4 of transformers' with the pair's token types (the second
   text is token type 1), /v1/rerank orders the documents by them. The converter drops
   BERT's pooler, which transformers applies before the classifier: the file here keeps it
   as cls.weight/cls.bias, where llama.cpp's graph reads a head's dense layer; a second
   file without it (the converter's own output) gives the classifier applied to the [CLS]
   state directly, as llama.cpp computes it, checked against that.
3. Lines an encoder cannot serve are error lines (chat; completions).

KVB_DEVICE (e.g. cuda) runs kvbatch with --device so: the same checks of the CUDA backend's
encoder pass against transformers (kernels/emu/emu.sh's kvbatch runs it on the emulated device).
It multiplies in bf16 (weights and GEMM inputs), so its bars are those of bf16 arithmetic:
cosine >= 0.9995 and scores within 5e-3 (the CPU's f32 products: 0.99999 / 0.9999 and 1e-4;
measured on the emulated device: cosines >= 0.99995, scores within 2.9e-3 with the pooler).

Exit 0 pass, 1 fail, 77 skipped (no binary, or torch/transformers/gguf missing).
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvbcheck import BIN, check, finish, need_modules  # noqa: E402

TEXTS = ["The cat sat on the mat.", "Äpfel und Birnen: ça coûte 3,50 € — naïve café!", "日本語のテキストと English mixed",
         "x", "Paged attention stores keys and values in fixed-size blocks. " * 30,
         "What is a paged KV cache, and why does it avoid fragmentation?"]
QUERY = "what is a paged cache?"
DOCS = ["Paged attention keeps keys and values in fixed-size blocks.", "The capital of France is Paris.",
        "Blocks of memory are shared between sequences of different lengths.", "bananas"]
TESTDATA = os.environ.get("KVB_TESTDATA") or os.path.join(os.path.expanduser("~"), ".cache", "kvbatch", "testdata")
VOCAB = os.path.join(TESTDATA, "tokenizer", "ggml-vocab-bert-bge.gguf")
DEVICE = os.environ.get("KVB_DEVICE") or ""
BF16 = DEVICE.startswith("cuda")
TOK_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
            "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.padding_token_id",
            "tokenizer.ggml.cls_token_id", "tokenizer.ggml.mask_token_id")


def bert_vocab_txt(gguf, path):
    """The vocabulary in BERT's own form (the converter's phantom() undone)."""
    r = gguf.GGUFReader(VOCAB)
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    with open(path, "w", encoding="utf-8") as f:
        for t, ty in zip(toks, types):
            if ty == gguf.TokenType.CONTROL:
                f.write(t + "\n")
            elif t.startswith("\u2581"):
                f.write(t[1:] + "\n")
            else:
                f.write("##" + t + "\n")
    return len(toks)


def random_state(np, model, seed):
    rng = np.random.default_rng(seed)
    out = {}
    for name, t in model.state_dict().items():
        shape = tuple(t.shape)
        if "LayerNorm.weight" in name:
            out[name] = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith(".bias"):
            out[name] = (0.2 * rng.standard_normal(shape)).astype(np.float32)
        elif "embeddings" in name:
            out[name] = rng.standard_normal(shape).astype(np.float32)
        else:
            out[name] = (1.5 / np.sqrt(shape[1]) * rng.standard_normal(shape)).astype(np.float32)
    return out


def write_gguf(gguf, np, path, cfg, state, pooling=None, keep_pooler=False, f16=False, classifier=False):
    """The converter's BertModel for this config and state."""
    import gguf as g
    w = gguf.GGUFWriter(path, "bert")
    w.add_name("bert-test")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_layer_norm_eps(cfg.layer_norm_eps)
    w.add_file_type(g.LlamaFileType.MOSTLY_F16 if f16 else g.LlamaFileType.ALL_F32)
    w.add_causal_attention(False)
    if pooling is not None:
        w.add_pooling_type(pooling)
    w.add_token_type_count(cfg.type_vocab_size)
    r = gguf.GGUFReader(VOCAB)
    for k in TOK_KEYS:
        f = r.fields[k]
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), f.types[0], sub_type=f.types[1])
        else:
            w.add_key_value(k, f.contents(), f.types[0])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, cfg.num_hidden_layers)
    for hf, data in state.items():
        name = hf[5:] if hf.startswith("bert.") else hf
        if name in ("embeddings.position_ids", "embeddings.token_type_ids"):
            continue
        if name.startswith("pooler."):
            if not keep_pooler:
                continue  # what the converter does
            new = "cls.weight" if name.endswith("weight") else "cls.bias"
        elif classifier and name.startswith("classifier."):
            new = "cls.output." + name.split(".")[-1]
        else:
            new = names.get_name(name, try_suffixes=(".weight", ".bias"))
            if new is None:
                raise ValueError("cannot map %s" % name)
        a = np.asarray(data, dtype=np.float32)
        # 1-D tensors, and positions and token types whatever the file type, stay F32 (the converter's rule)
        if a.ndim == 1 or not f16 or new in ("position_embd.weight", "token_types.weight"):
            w.add_tensor(new, a, raw_dtype=gguf.GGMLQuantizationType.F32)
        else:
            w.add_tensor(new, a.astype(np.float16), raw_dtype=gguf.GGMLQuantizationType.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run_job(tmp, model, lines, extra=()):
    job, out = os.path.join(tmp, "job.jsonl"), os.path.join(tmp, "out.jsonl")
    with open(job, "w") as f:
        for l in lines:
            f.write(json.dumps(l, ensure_ascii=False) + "\n")
    p = subprocess.run([BIN, "run", "-m", model, "-i", job, "-o", out, "--no-cache", "--metrics",
                        os.path.join(tmp, "m.db"), "--max-step-tokens", "256"] + list(extra) +
                       (["--device", DEVICE] if DEVICE else []),
                       capture_output=True, text=True)
    if not check(p.returncode == 0, f"run failed: {p.stderr[-800:]}"):
        return {}
    return {json.loads(l)["custom_id"]: json.loads(l) for l in open(out)}


def main():
    if not BIN or not os.path.exists(BIN):
        print("SKIP: no kvbatch binary")
        return 77
    need_modules("numpy", "torch", "transformers", "gguf")
    import gguf
    import numpy as np
    import torch
    import transformers
    if not check(os.path.exists(VOCAB), f"{VOCAB} is missing: scripts/fetch-testdata.sh fetches it"):
        return finish("bert")
    torch.set_num_threads(2)
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        vtxt = os.path.join(tmp, "vocab.txt")
        nv = bert_vocab_txt(gguf, vtxt)
        with open(vtxt, encoding="utf-8") as f:
            vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
        tok = transformers.BertTokenizerFast(vocab=vocab, do_lower_case=True)
        cfg = transformers.BertConfig(vocab_size=nv, hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
                                      intermediate_size=384, max_position_embeddings=512, type_vocab_size=2,
                                      layer_norm_eps=1e-12, hidden_act="gelu")

        # 1. embeddings
        model = transformers.BertModel(cfg).eval()
        state = random_state(np, model, 1)
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
        ids = [tok(t)["input_ids"] for t in TEXTS]
        with torch.no_grad():
            hs = [model(torch.tensor([x])).last_hidden_state[0].double().numpy() for x in ids]
        for f16 in (False, True):
            path = os.path.join(tmp, "bert-f16.gguf" if f16 else "bert.gguf")
            write_gguf(gguf, np, path, cfg, state, pooling=gguf.PoolingType.MEAN, f16=f16)
            ref_state = state
            if f16:  # transformers on the file's own numbers
                ref_state = {k: (v.astype(np.float16).astype(np.float32)
                                 if v.ndim > 1 and "position" not in k and "token_type" not in k else v)
                             for k, v in state.items()}
                m16 = transformers.BertModel(cfg).eval()
                m16.load_state_dict({k: torch.from_numpy(v) for k, v in ref_state.items()}, strict=False)
                with torch.no_grad():
                    hs16 = [m16(torch.tensor([x])).last_hidden_state[0].double().numpy() for x in ids]
            ref_h = hs16 if f16 else hs
            if not f16:  # `kvbatch info` says what an encoder computes, not the llama layer's parts
                inf = subprocess.run([BIN, "info", path], capture_output=True, text=True)
                check(inf.returncode == 0 and "bidirectional" in inf.stdout and "pooling:       mean" in inf.stdout
                      and "LayerNorm (eps 1e-12)" in inf.stdout and "RoPE" not in inf.stdout
                      and "RMSNorm" not in inf.stdout, f"kvbatch info on a bert file: {inf.stdout}{inf.stderr}")
            for pooling, extra in (("mean", []), ("cls", ["--pooling", "cls"])):
                res = run_job(tmp, path, [{"custom_id": "e", "input": TEXTS},
                                          {"custom_id": "chat", "messages": [{"role": "user", "content": "hi"}]},
                                          {"custom_id": "comp", "prompt": "hi"}], extra)
                if "e" not in res:
                    continue
                body = res["e"]["response"]["body"]
                if not check("usage" in body, f"embeddings line failed: {res['e']}"):
                    continue
                check(body["usage"]["prompt_tokens"] == sum(len(x) for x in ids),
                      f"usage {body['usage']} vs BertTokenizerFast's {sum(len(x) for x in ids)} tokens")
                for i, d in enumerate(body["data"]):
                    got = np.array(d["embedding"])
                    ref = ref_h[i].mean(0) if pooling == "mean" else ref_h[i][0]
                    cos = float(got @ ref / np.linalg.norm(got) / np.linalg.norm(ref))
                    bar = 0.9995 if BF16 else 0.9999 if f16 else 0.99999
                    table.append(("F16" if f16 else "F32", pooling, i, len(ids[i]), cos))
                    check(cos >= bar, f"{'f16' if f16 else 'f32'} {pooling} text {i}: cosine {cos:.7f} < {bar}")
                for cid in ("chat", "comp"):
                    e = res[cid]["error"] or {}
                    check("encoder" in (e.get("message") or ""), f"{cid} line on an encoder: {e}")

        # 2. cross-encoder
        ccfg = transformers.BertConfig(**{**cfg.to_dict(), "num_labels": 1})
        clf = transformers.BertForSequenceClassification(ccfg).eval()
        cstate = random_state(np, clf, 2)
        clf.load_state_dict({k: torch.from_numpy(v) for k, v in cstate.items()}, strict=False)
        enc = [tok(QUERY, d) for d in DOCS]
        with torch.no_grad():
            logits, cls_states = [], []
            for e in enc:
                o = clf(torch.tensor([e["input_ids"]]), token_type_ids=torch.tensor([e["token_type_ids"]]),
                        output_hidden_states=True)
                logits.append(float(o.logits[0, 0]))
                cls_states.append(o.hidden_states[-1][0, 0].double().numpy())
        w_out = cstate["classifier.weight"].astype(np.float64)
        b_out = cstate["classifier.bias"].astype(np.float64)
        for keep in (True, False):
            path = os.path.join(tmp, "ce.gguf")
            write_gguf(gguf, np, path, ccfg, cstate, keep_pooler=keep, classifier=True)
            if keep:
                ref = [1 / (1 + np.exp(-z)) for z in logits]
            else:  # llama.cpp's computation of the converter's file: the classifier on the [CLS] state
                ref = [1 / (1 + np.exp(-(float(w_out[0] @ h) + b_out[0]))) for h in cls_states]
            res = run_job(tmp, path, [{"custom_id": "s", "text_1": QUERY, "text_2": DOCS},
                                      {"custom_id": "r", "query": QUERY, "documents": DOCS},
                                      {"custom_id": "e", "input": "hi"}])
            if "s" not in res:
                continue
            got = [d["score"] for d in res["s"]["response"]["body"]["data"]]
            check(res["s"]["response"]["body"]["usage"]["prompt_tokens"] == sum(len(e["input_ids"]) for e in enc),
                  f"pair token counts {res['s']['response']['body']['usage']} vs BertTokenizerFast's pairs")
            for i in range(len(DOCS)):
                table.append(("pooler" if keep else "no pooler", "rank", i, len(enc[i]["input_ids"]), got[i] - ref[i]))
                check(abs(got[i] - ref[i]) <= (5e-3 if BF16 else 1e-4), f"cross-encoder ({'pooler' if keep else 'no pooler'}) pair {i}: "
                                                    f"{got[i]:.6f} vs {ref[i]:.6f}")
            order = [r["index"] for r in res["r"]["response"]["body"]["results"]]
            check(order == sorted(range(len(DOCS)), key=lambda i: -ref[i]), f"rerank order {order} vs {ref}")
            e = res["e"]["error"] or {}
            check("--pooling" in (e.get("message") or ""), f"embeddings on a cross-encoder without --pooling: {e}")

    print("file       pooling  text  tokens  cosine (embeddings) / score - reference (cross-encoder)")
    for what, pooling, i, n, v in table:
        print(f"{what:9s}  {pooling:7s}  {i:4d}  {n:6d}  {v:.7f}" if pooling != "rank" else
              f"{what:9s}  {pooling:7s}  {i:4d}  {n:6d}  {v:+.2e}")
    return finish("bert")


if __name__ == "__main__":
    sys.exit(main())
