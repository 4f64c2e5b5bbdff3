#!/usr/bin/env python3
"""random_llama_gguf.py — writes a random-weight llama GGUF in F16 for
benchmarks (scripts/bench-matmul.sh llama): matrices large enough that the
products dominate (hidden 2048, FFN 5632, rows of whole 256-blocks so that
llama-quantize can make any K or IQ type of it), the small byte-level
vocabulary of tests/hfref_gguf.py. Nothing about the values matters but
their size: N(0, 1/n_in) weights, unit norms.
Usage: random_llama_gguf.py OUT.gguf [n_layer=2]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import hfref_gguf  # noqa: E402


def main():
    out = sys.argv[1]
    n_layer = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    hp = dict(vocab_size=hfref_gguf.vocab_size(), hidden_size=2048, intermediate_size=5632,
              num_hidden_layers=n_layer, num_attention_heads=16, num_key_value_heads=16,
              max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    e, f, v = hp["hidden_size"], hp["intermediate_size"], hp["vocab_size"]
    rng = np.random.default_rng(1)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float32)

    state = {"model.embed_tokens.weight": rng.standard_normal((v, e), dtype=np.float32),
             "model.norm.weight": np.ones(e, np.float32), "lm_head.weight": mat(v, e)}
    for i in range(n_layer):
        p = "model.layers.%d." % i
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            state[p + "self_attn.%s.weight" % n] = mat(e, e)
        state[p + "mlp.gate_proj.weight"] = mat(f, e)
        state[p + "mlp.up_proj.weight"] = mat(f, e)
        state[p + "mlp.down_proj.weight"] = mat(e, f)
        state[p + "input_layernorm.weight"] = np.ones(e, np.float32)
        state[p + "post_attention_layernorm.weight"] = np.ones(e, np.float32)
    hfref_gguf.write_gguf(out, "llama", hp, state, f16=True, name="bench-random")


if __name__ == "__main__":
    main()
