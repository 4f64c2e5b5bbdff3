#!/usr/bin/env python3
"""pytest_info.py — `kvbatch info MODEL` says what a file is, and for a file
kvbatch refuses, every reason.

Files are written with gguf-py (the writer llama.cpp's converter uses):
  - a gemma3 file as the converter writes it (tests/hfref_gguf.py, 6 layers,
    window 64): info names the architecture, the window on 5 of 6 layers with
    layer 5 global, GeGLU, post-norms, the embedding scale sqrt(128), exit 0;
  - a llama file with four faults at once (an unknown key, a soft-cap key
    llama does not compute, a tensor nobody reads, a weight type kvbatch has
    no kernels for): info lists all four, exit 1, where `kvbatch generate`
    stops at the first;
  - a file of an architecture kvbatch does not run: the architecture and the
    unsupported weight type are both named.
Needs numpy and gguf (skips, 77, without them). Exit 0 pass, 1 fail, 77 skip.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
except ImportError as e:
    print("SKIP: %s" % e)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hfref_gguf  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def run(kvb, *args):
    p = subprocess.run([kvb, *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def gemma3_file(path):
    n_vocab = hfref_gguf.vocab_size()
    hp = dict(num_hidden_layers=6, max_position_embeddings=1024, hidden_size=128, intermediate_size=256,
              num_attention_heads=4, num_key_value_heads=1, head_dim=64, rms_norm_eps=1e-6, sliding_window=64,
              vocab_size=n_vocab, tie_word_embeddings=True,
              rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    rng = np.random.default_rng(1)
    st = {"model.embed_tokens.weight": rng.standard_normal((n_vocab, 128)).astype(np.float32),
          "model.norm.weight": np.zeros(128, np.float32)}
    for i in range(6):
        p = "model.layers.%d." % i
        for n, shape in (("self_attn.q_proj.weight", (256, 128)), ("self_attn.k_proj.weight", (64, 128)),
                         ("self_attn.v_proj.weight", (64, 128)), ("self_attn.o_proj.weight", (128, 256)),
                         ("mlp.gate_proj.weight", (256, 128)), ("mlp.up_proj.weight", (256, 128)),
                         ("mlp.down_proj.weight", (128, 256))):
            st[p + n] = (0.05 * rng.standard_normal(shape)).astype(np.float32)
        for n, dim in (("input_layernorm.weight", 128), ("post_attention_layernorm.weight", 128),
                       ("pre_feedforward_layernorm.weight", 128), ("post_feedforward_layernorm.weight", 128),
                       ("self_attn.q_norm.weight", 64), ("self_attn.k_norm.weight", 64)):
            st[p + n] = np.zeros(dim, np.float32)
    hfref_gguf.write_gguf(path, "gemma3", hp, st, name="info-gemma3")


def faulty_file(path, arch):
    """A small file with several faults at once."""
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(256)
    w.add_feed_forward_length(256)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_key_value(arch + ".frobnication", 3, gguf.GGUFValueType.UINT32)  # unknown key
    w.add_final_logit_softcapping(30.0)  # a variant llama does not compute
    n_vocab = hfref_gguf.vocab_size()
    f32 = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", f32(n_vocab, 256))
    w.add_tensor("output_norm.weight", f32(256))
    w.add_tensor("blk.0.attn_norm.weight", f32(256))
    for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up"):
        w.add_tensor("blk.0.%s.weight" % n, f32(256, 256))
    # ffn_down as Q2_K: 256 x 256 = 256 rows of one 84-byte block
    w.add_tensor("blk.0.ffn_down.weight", np.zeros((256, 84), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q2_K)
    w.add_tensor("blk.0.ffn_norm.weight", f32(256))
    w.add_tensor("blk.0.bogus.weight", f32(256))  # nobody reads it
    hfref_gguf._write_vocab(w, n_vocab)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    kvb = os.environ.get("KVB_BIN", "")
    if not kvb or not os.access(kvb, os.X_OK):
        print("SKIP: KVB_BIN not set")
        return 77
    with tempfile.TemporaryDirectory(prefix="kvb_info_") as tmp:
        g3 = os.path.join(tmp, "g3.gguf")
        gemma3_file(g3)
        rc, out, err = run(kvb, "info", g3)
        print(out)
        check(rc == 0, "gemma3: exit %d (%s)" % (rc, err.strip()))
        check("architecture:  gemma3" in out, "gemma3: architecture not named")
        check("sliding window of 64 positions on 5 of 6 layers; global layers: 5\n" in out,
              "gemma3: window pattern not as the file gives it")
        check("GeGLU" in out and "post-norms" in out and "x11.3137" in out,
              "gemma3: layer (GeGLU, post-norms, embedding scale sqrt(128)) not described")
        check("chat template: none" in out, "gemma3: a template reported for a file without one")
        rc, out, _ = run(kvb, "info", "--chat-template", "gemma", g3)
        check(rc == 0 and "chat template: gemma (named on the command line)" in out,
              "gemma3 --chat-template gemma: %r" % out[-200:])

        bad = os.path.join(tmp, "bad.gguf")
        faulty_file(bad, "llama")
        rc, out, _ = run(kvb, "info", bad)
        print(out)
        check(rc == 1, "faulty llama: exit %d, want 1" % rc)
        for what in ("'llama.frobnication' = 3", "'llama.final_logit_softcapping' = 30", "'blk.0.bogus.weight'",
                     "1 tensor of type Q2_K"):
            check(what in out, "faulty llama: %s not among the reasons" % what)
        rc, _, err = run(kvb, "generate", "--model", bad, "--prompt", "x", "--max-tokens", "1")
        check(rc != 0 and err.count("\n") <= 2, "generate on the faulty file: rc %d, %r" % (rc, err))

        other = os.path.join(tmp, "other.gguf")
        faulty_file(other, "phi3")
        rc, out, _ = run(kvb, "info", other)
        print(out)
        check(rc == 1 and "architecture 'phi3' is not supported" in out and "type Q2_K" in out,
              "phi3: %r" % out)
        rc, out, err = run(kvb, "info", os.path.join(tmp, "missing.gguf"))
        check(rc == 1 and "missing.gguf" in out + err, "missing file: rc %d" % rc)
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
