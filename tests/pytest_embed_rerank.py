#!/usr/bin/env python3
"""A decoder reranker (Qwen3-Reranker's form) against transformers.

Random weights go into transformers' Qwen3ForCausalLM, built from its Config (float32,
CPU), and into a GGUF written as llama.cpp's converter writes a Qwen3-Reranker
(conversion/qwen.py, Qwen3Model with is_rerank): the qwen3 file tests/hfref_gguf.py
writes, plus `qwen3.pooling_type` = rank, `qwen3.classifier.output_labels` = ["yes",
"no"], the chat template named "rerank", and `cls.output.weight` = the LM head's rows of
the "yes" and "no" tokens — with, for an untied model, no output.weight at all (the
converter writes the head's two rows only). The synthetic vocabulary has no "yes": the
tokens "y" and "no" stand for the two answers here.

The reference is what Qwen3-Reranker's model card computes: the LM head's logits at the
last token, p = softmax([logit_yes, logit_no])[0]. kvbatch's /v1/score lines (text_1 the
instruction and query in the reranker's template, text_2 the document and the
assistant's opening, concatenated as vLLM does for a causal reranker) must give p within
2e-3 and, with use_activation false, the logit difference within 2 % of the reference's
spread; /v1/rerank must order the documents as the reference does wherever two scores
are further apart than that. Both a tied and an untied model; the pair's tokens are
kvbatch's own (`kvbatch tokenize --special`), fed to transformers as ids. Chat lines on
a reranker's file are error lines (its head is the classifier).

Exit 0 pass, 1 fail, 77 skipped (no binary, or torch/transformers/gguf missing).
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvbcheck import BIN, check, finish, need_modules  # noqa: E402

PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
          "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QUERY = "<Instruct>: Given a web search query, retrieve relevant passages\n<Query>: what is a paged cache?\n"
DOCS = ["<Document>: Paged attention keeps keys and values in fixed-size blocks.",
        "<Document>: The capital of France is Paris.",
        "<Document>: neat shoes in a hat; tea at noon",
        "<Document>: " + "a longer passage about caches, pages and their blocks " * 6,
        "<Document>: no"]


def rerank_copy(np, gguf, src, dst, yes, no, tied):
    """src (hfref_gguf's qwen3 file) with what the converter adds for a reranker."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, "qwen3")
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(f.name, f.contents(), f.types[0], sub_type=f.types[1])
        else:
            w.add_key_value(f.name, f.contents(), f.types[0])
    w.add_pooling_type(gguf.PoolingType.RANK)
    w.add_classifier_output_labels(["yes", "no"])
    w.add_chat_template([{"name": "rerank", "template": PREFIX + "{query}{document}" + SUFFIX}])
    head = None
    for t in r.tensors:
        a = np.array(t.data).reshape([int(x) for x in reversed(t.shape)])
        if t.name == "output.weight":  # untied: the converter keeps only the two rows
            head = a
            continue
        w.add_tensor(t.name, a.astype(np.float32), raw_dtype=gguf.GGMLQuantizationType.F32)
        if t.name == "token_embd.weight" and tied:
            head = a
    w.add_tensor("cls.output.weight", np.stack([head[yes], head[no]]).astype(np.float32),
                 raw_dtype=gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    if not BIN or not os.path.exists(BIN):
        print("SKIP: no kvbatch binary")
        return 77
    need_modules("numpy", "torch", "transformers", "gguf")
    import gguf
    import numpy as np
    import torch
    import transformers
    import hfref_gguf
    from pytest_hf_ref import random_state

    torch.set_num_threads(2)
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        for tied in (True, False):
            nv = hfref_gguf.vocab_size()
            cfg = dict(vocab_size=nv, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
                       rms_norm_eps=1e-6, tie_word_embeddings=tied,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e6})
            model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**cfg)).eval()
            state = random_state(np, model, 7 if tied else 8)
            model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
            if tied:
                model.tie_weights()
            base = os.path.join(tmp, "base.gguf")
            hfref_gguf.write_gguf(base, "qwen3", model.config.to_dict(), state, name="rerank-test")
            vocab = gguf.GGUFReader(base).fields["tokenizer.ggml.tokens"].contents()
            yes, no = vocab.index("y"), vocab.index("no")
            path = os.path.join(tmp, f"rerank-{'tied' if tied else 'untied'}.gguf")
            rerank_copy(np, gguf, base, path, yes, no, tied)
            label = "tied" if tied else "untied"

            # the reference: p(yes) at the last token, on kvbatch's tokens of each pair
            ref_p, ref_z = [], []
            for d in DOCS:
                t = subprocess.run([BIN, "tokenize", "-m", path, "--special", "--", PREFIX + QUERY + d + SUFFIX],
                                   capture_output=True, text=True)
                ids = [int(x) for x in t.stdout.split()]
                with torch.no_grad():
                    lg = model(torch.tensor([ids])).logits[0, -1].double().numpy()
                z = lg[yes] - lg[no]
                ref_z.append(z)
                ref_p.append(1 / (1 + np.exp(-z)))
            spread = max(ref_z) - min(ref_z)

            job = os.path.join(tmp, "job.jsonl")
            with open(job, "w") as f:
                f.write(json.dumps({"custom_id": "score", "url": "/v1/score",
                                    "body": {"text_1": PREFIX + QUERY, "text_2": [d + SUFFIX for d in DOCS]}}) + "\n")
                f.write(json.dumps({"custom_id": "raw", "text_1": PREFIX + QUERY,
                                    "text_2": [d + SUFFIX for d in DOCS], "use_activation": False}) + "\n")
                f.write(json.dumps({"custom_id": "rerank", "url": "/v1/rerank",
                                    "body": {"query": PREFIX + QUERY, "documents": [d + SUFFIX for d in DOCS],
                                             "top_n": 3}}) + "\n")
                f.write(json.dumps({"custom_id": "chat", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
                f.write(json.dumps({"custom_id": "emb", "input": "hi"}) + "\n")
            out = os.path.join(tmp, "out.jsonl")
            p = subprocess.run([BIN, "run", "-m", path, "-i", job, "-o", out, "--no-cache", "--max-step-tokens", "32",
                                "--metrics", os.path.join(tmp, "m.db")], capture_output=True, text=True)
            if not check(p.returncode == 0, f"{label}: run failed: {p.stderr[-600:]}"):
                continue
            res = {json.loads(l)["custom_id"]: json.loads(l) for l in open(out)}
            sc = [d["score"] for d in res["score"]["response"]["body"]["data"]]
            raw = [d["score"] for d in res["raw"]["response"]["body"]["data"]]
            for i in range(len(DOCS)):
                table.append((label, i, ref_p[i], sc[i], ref_z[i], raw[i]))
                check(abs(sc[i] - ref_p[i]) <= 2e-3, f"{label} doc {i}: p(yes) {sc[i]:.5f} vs {ref_p[i]:.5f}")
                check(abs(raw[i] - ref_z[i]) <= 0.02 * spread,
                      f"{label} doc {i}: logit difference {raw[i]:.4f} vs {ref_z[i]:.4f} (spread {spread:.3f})")
            results = res["rerank"]["response"]["body"]["results"]
            check(len(results) == 3, f"{label}: top_n 3 gave {len(results)} results")
            order = sorted(range(len(DOCS)), key=lambda i: -ref_p[i])
            for k, r in enumerate(results):
                i = r["index"]
                check(r["document"]["text"] == DOCS[i] + SUFFIX, f"{label}: rerank echoes another document")
                check(abs(r["relevance_score"] - sc[i]) < 1e-6, f"{label}: rerank score differs from the score line")
                check(i == order[k] or abs(ref_p[i] - ref_p[order[k]]) <= 4e-3,
                      f"{label}: rerank place {k} holds {i}, the reference's is {order[k]}")
            check(res["chat"]["error"] is not None and "reranker" in res["chat"]["error"]["message"],
                  f"{label}: a chat line on a reranker: {res['chat'].get('error')}")
            e = res["emb"]["error"] or {}
            check("--pooling" in (e.get("message") or ""), f"{label}: embeddings without --pooling: {e}")

    print("model    doc   p(yes) ref   kvbatch     z ref      kvbatch")
    for label, i, rp, kp, rz, kz in table:
        print(f"{label:7s}  {i:3d}   {rp:.6f}   {kp:.6f}   {rz:9.5f}  {kz:9.5f}")
    return finish("decoder reranker")


if __name__ == "__main__":
    sys.exit(main())
