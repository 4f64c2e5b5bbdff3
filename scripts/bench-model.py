#!/usr/bin/env python3
"""bench-model.py — writes the benchmark model of issue 26: a Llama-3.2-3B-shaped
GGUF (28 layers, hidden 3072, 24 heads / 8 KV heads of 128, FFN 8192, tied
embeddings) with random weights and SmolLM2-135M's tokenizer (vocabulary
49152), Q4_0 matrices and a Q6_K token embedding (what llama-quantize makes of
a tied embedding in a Q4_0 file): about 1.71 GB.

    scripts/bench-model.py [OUT]      (default ~/.cache/kvbatch/bench/llama3b-shape-q4_0.gguf)

The weights are random but scaled like an initialised network (RMS about
0.5 / sqrt(fan-in)), so activations stay finite through the 28 layers; the
text the model writes is noise, and greedy decoding of it is deterministic.
The same seed gives the same file. Written with gguf-py (the test venv), so
llama.cpp and kvbatch both read it; never committed (benchmarks only).
Needs the default model (scripts/fetch-model.sh) for the tokenizer."""
import os
import sys

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("bench-model: needs gguf-py (the test venv: ~/.cache/kvbatch-venv/bin/python)")

HP = dict(n_layer=28, n_embd=3072, n_ff=8192, n_head=24, n_head_kv=8, head_dim=128, n_ctx=8192)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.environ.get("KVB_MODEL") or os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/kvbatch/bench/llama3b-shape-q4_0.gguf")
Q = gguf.GGMLQuantizationType


def q4_0(rng, n_out, n_in):
    """Random Q4_0 rows: uniform nibbles (values -8..7, RMS ~4.6), scale so the
    weights' RMS is 0.5 / sqrt(n_in), each block's scale jittered by +-50 %."""
    nb = n_in // 32
    b = rng.integers(0, 256, size=(n_out * nb, 18), dtype=np.uint8)
    d = (0.5 / np.sqrt(n_in) / 4.6) * rng.uniform(0.5, 1.5, size=n_out * nb)
    b[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return b.reshape(n_out, nb * 18)


def q6_k(rng, n_out, n_in):
    """Random Q6_K rows: random 6-bit values and int8 scales in [-32, 31], d so
    that an embedding row has RMS about 1."""
    nb = n_in // 256
    b = rng.integers(0, 256, size=(n_out * nb, 210), dtype=np.uint8)
    b[:, 192:208] = rng.integers(-32, 32, size=(n_out * nb, 16), dtype=np.int8).view(np.uint8)
    d = np.full(n_out * nb, 1.0 / (18.5 * 18.5), dtype=np.float16)
    b[:, 208:210] = d.view(np.uint8).reshape(-1, 2)
    return b.reshape(n_out, nb * 210)


def main():
    if not os.path.exists(SRC):
        sys.exit(f"bench-model: {SRC} not found (scripts/fetch-model.sh fetches it; it gives the tokenizer)")
    r = gguf.GGUFReader(SRC)
    f = {k: v.contents() for k, v in r.fields.items() if k.startswith("tokenizer.")}
    n_vocab = len(f["tokenizer.ggml.tokens"])
    os.makedirs(os.path.dirname(os.path.abspath(OUT)), exist_ok=True)
    tmp = OUT + ".part"
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name("llama3b-shape-q4_0 (random weights)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_block_count(HP["n_layer"])
    w.add_context_length(HP["n_ctx"])
    w.add_embedding_length(HP["n_embd"])
    w.add_feed_forward_length(HP["n_ff"])
    w.add_head_count(HP["n_head"])
    w.add_head_count_kv(HP["n_head_kv"])
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HP["head_dim"])
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model(f["tokenizer.ggml.model"])
    w.add_tokenizer_pre(f["tokenizer.ggml.pre"])
    w.add_token_list(f["tokenizer.ggml.tokens"])
    w.add_token_types(f["tokenizer.ggml.token_type"])
    w.add_token_merges(f["tokenizer.ggml.merges"])
    w.add_bos_token_id(f["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(f["tokenizer.ggml.eos_token_id"])
    w.add_unk_token_id(f["tokenizer.ggml.unknown_token_id"])
    w.add_pad_token_id(f["tokenizer.ggml.padding_token_id"])
    w.add_add_bos_token(f["tokenizer.ggml.add_bos_token"])
    w.add_add_space_prefix(f["tokenizer.ggml.add_space_prefix"])
    w.add_chat_template(f["tokenizer.chat_template"])
    w.add_quantization_version(2)

    E, F, D = HP["n_embd"], HP["n_ff"], HP["head_dim"]
    plan = [("token_embd.weight", "q6_k", n_vocab, E)]
    for i in range(HP["n_layer"]):
        p = f"blk.{i}."
        plan += [(p + "attn_norm.weight", "norm", E, 0), (p + "ffn_norm.weight", "norm", E, 0),
                 (p + "attn_q.weight", "q4_0", HP["n_head"] * D, E),
                 (p + "attn_k.weight", "q4_0", HP["n_head_kv"] * D, E),
                 (p + "attn_v.weight", "q4_0", HP["n_head_kv"] * D, E),
                 (p + "attn_output.weight", "q4_0", E, HP["n_head"] * D),
                 (p + "ffn_gate.weight", "q4_0", F, E), (p + "ffn_up.weight", "q4_0", F, E),
                 (p + "ffn_down.weight", "q4_0", E, F)]
    plan.append(("output_norm.weight", "norm", E, 0))
    for name, kind, n_out, n_in in plan:
        if kind == "norm":
            w.add_tensor_info(name, (n_out,), np.dtype(np.float32), n_out * 4)
        else:
            rb = n_in // 32 * 18 if kind == "q4_0" else n_in // 256 * 210
            w.add_tensor_info(name, (n_out, rb), np.dtype(np.uint8), n_out * rb,
                              raw_dtype=Q.Q4_0 if kind == "q4_0" else Q.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(26)
    for name, kind, n_out, n_in in plan:
        if kind == "norm":
            w.write_tensor_data(np.ones(n_out, dtype=np.float32))
        else:
            w.write_tensor_data(q4_0(rng, n_out, n_in) if kind == "q4_0" else q6_k(rng, n_out, n_in))
    w.close()
    os.replace(tmp, OUT)
    print(f"bench-model: wrote {OUT} ({os.path.getsize(OUT) / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
