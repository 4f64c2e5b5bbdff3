#!/usr/bin/env python3
"""moe-bench-model.py — writes a random-weight Qwen3-30B-A3B-shaped qwen3moe
GGUF for scripts/bench-moe.sh (a benchmark's input, never a test's: its text
is noise).

The shape is Qwen3-30B-A3B's (config.json of Qwen/Qwen3-30B-A3B): hidden 2048,
32 query / 4 KV heads of 128, 128 experts of 768, 8 per token, renormalised
(qwen3moe always is), RoPE base 1e6, RMS epsilon 1e-6 — with fewer layers
when asked (the full 48 layers are ~17 GB at Q4_K) and the small byte-level
vocabulary of tests/hfref_gguf.py (320 tokens) instead of 151,936. Every
matrix is Q4_K (the router F32, as llama.cpp's converter and quantizer keep
it; norms F32). Q4_K blocks are random bytes with the two block scales set so
that each matrix has a spread of about 1/sqrt(fan-in) (the scheme of
tests/support/synth.c), written tensor by tensor so memory stays small.

  moe-bench-model.py OUT.gguf [N_LAYERS=48] [SEED=1]
Needs numpy and gguf (the kvbatch venv: scripts/setup.sh)."""
import os
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import hfref_gguf  # noqa: E402  (the vocabulary)

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2048, 32, 4, 128
EXPERTS, USED, FF_EXP, FF_DENSE = 128, 8, 768, 6144
Q4K = gguf.GGMLQuantizationType.Q4_K
BLOCK, BLOCK_BYTES = 256, 144  # Q4_K: 256 weights in 144 bytes (d, dmin, 12 scale bytes, 128 nibble bytes)


def q4k(rng, n_rows, n_in, n_mats=1):
    """Random Q4_K rows: w = d*sc*q - dmin*m with q in 0..15, sc and m in 0..63,
    d = sigma / (32 * 4.6), dmin = 7.5 d (mean ~0, std ~sigma)."""
    sigma = 1.0 / np.sqrt(n_in)
    nb = n_in // BLOCK
    raw = rng.integers(0, 256, size=(n_mats * n_rows * nb, BLOCK_BYTES), dtype=np.uint8)
    d = np.float16(sigma / (32 * 4.6))
    raw[:, 0:2] = np.frombuffer(np.array([d], dtype=np.float16).tobytes(), dtype=np.uint8)
    raw[:, 2:4] = np.frombuffer(np.array([np.float16(float(d) * 7.5)], dtype=np.float16).tobytes(), dtype=np.uint8)
    shape = (n_mats, n_rows, nb * BLOCK_BYTES) if n_mats > 1 else (n_rows, nb * BLOCK_BYTES)
    return raw.reshape(shape)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    n_layer = int(sys.argv[2]) if len(sys.argv) > 2 else 48
    rng = np.random.default_rng(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    n_vocab = hfref_gguf.vocab_size()
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM

    # (name, ("q4k", n_mats, rows, n_in) or ("norm", n) or ("router",)) in file order
    tensors = [("token_embd.weight", ("q4k", 1, n_vocab, HIDDEN)), ("output_norm.weight", ("norm", HIDDEN)),
               ("output.weight", ("q4k", 1, n_vocab, HIDDEN))]
    for b in range(n_layer):
        tensors += [("blk.%d.%s.weight" % (b, n), t) for n, t in (
            ("attn_norm", ("norm", HIDDEN)), ("attn_q", ("q4k", 1, q, HIDDEN)), ("attn_k", ("q4k", 1, kv, HIDDEN)),
            ("attn_v", ("q4k", 1, kv, HIDDEN)), ("attn_output", ("q4k", 1, HIDDEN, q)),
            ("attn_q_norm", ("norm", HEAD_DIM)), ("attn_k_norm", ("norm", HEAD_DIM)), ("ffn_norm", ("norm", HIDDEN)),
            ("ffn_gate_inp", ("router",)), ("ffn_gate_exps", ("q4k", EXPERTS, FF_EXP, HIDDEN)),
            ("ffn_up_exps", ("q4k", EXPERTS, FF_EXP, HIDDEN)), ("ffn_down_exps", ("q4k", EXPERTS, HIDDEN, FF_EXP)))]

    def make(t):
        if t[0] == "q4k":
            return q4k(rng, t[2], t[3], t[1])
        if t[0] == "norm":
            return (1 + 0.1 * rng.standard_normal(t[1])).astype(np.float32)
        return (rng.standard_normal((EXPERTS, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32)

    w = gguf.GGUFWriter(out, "qwen3moe")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("random Qwen3-30B-A3B shape, %d layers" % n_layer)
    w.add_block_count(n_layer)
    w.add_context_length(40960)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FF_DENSE)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(USED)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_S)
    w.add_expert_feed_forward_length(FF_EXP)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    hfref_gguf._write_vocab(w, n_vocab)
    for name, t in tensors:  # the header first: every tensor's shape and size
        if t[0] == "q4k":
            shp = (t[1], t[2], t[3] // BLOCK * BLOCK_BYTES) if t[1] > 1 else (t[2], t[3] // BLOCK * BLOCK_BYTES)
            w.add_tensor_info(name, shp, np.dtype(np.uint8), int(np.prod(shp)), raw_dtype=Q4K)
        else:
            shp = (t[1],) if t[0] == "norm" else (EXPERTS, HIDDEN)
            w.add_tensor_info(name, shp, np.dtype(np.float32), 4 * int(np.prod(shp)),
                              raw_dtype=gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, (name, t) in enumerate(tensors):  # then the data, one tensor in memory at a time
        w.write_tensor_data(make(t))
        if i % 12 == 0:
            print("\r%s: %d/%d tensors" % (out, i + 1, len(tensors)), end="", file=sys.stderr, flush=True)
    w.close()
    print("\r%s: %d tensors, %.2f GB" % (out, len(tensors), os.path.getsize(out) / 1e9), file=sys.stderr)


if __name__ == "__main__":
    main()
