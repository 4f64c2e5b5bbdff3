#!/usr/bin/env python3
"""pytest_hf_ref.py — kvbatch's logits against Hugging Face transformers, an
independent reference (tests/refmodel.py was written from the same
understanding as the engine and shares its blind spots).

For each case below: random weights go into a transformers model built from its
Config class (LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM /
Gemma2ForCausalLM / Gemma3ForCausalLM / Phi3ForCausalLM / GraniteForCausalLM /
Olmo2ForCausalLM / Olmo3ForCausalLM, float32, eager attention, CPU) and,
through tests/hfref_gguf.py, into a GGUF written as llama.cpp's
convert_hf_to_gguf.py writes one for that config (the Q/K row permutation for
llama and granite, rope_freqs for "llama3", the rope scaling keys for "linear"
and "yarn", Gemma's norms with 1 added and its soft-cap, window and RoPE keys,
Phi-3's fused tensors and LongRoPE factors, Granite's multipliers). transformers' own GGUF loader is not used: it drops rope
scaling, so a reference loaded through it would agree with an engine that does.
A prompt of 2,048 random token ids goes through both (`kvbatch logits
--prompt-ids`), and the logits are compared at every position 0-2047: max abs
difference, NMSE (sum (kvb - ref)^2 / sum ref^2 over all positions and the
vocabulary) and top-1 agreement. Scaled cases have an original context of
256-512, so most of the prompt lies beyond it.

Tolerance, and why. kvbatch keeps K and V in fp16 in its KV pool; its F32/F16
weights multiply float activations (only quantized weights get int8
activations, src/matmul_impl.h mm_type_is_quantized), so fp16 K/V is the one
rounding it adds to float32 arithmetic. Each case therefore runs the reference a
second time with K (after RoPE and QK norm) and V rounded to fp16, and that
reference's distance from the exact one sets the bar:
    max|kvb - ref| <= MARGIN   * max|ref16 - ref|
    NMSE(kvb, ref) <= MARGIN^2 * NMSE(ref16, ref)
    top-1 agrees wherever the reference's top-2 gap exceeds 2 * the max|d| bar
(MARGIN = 2: kvbatch computes K in its own float order and so rounds slightly
different values to fp16 than the reference does: its error is of the same size,
not the same numbers. Measured on the unscaled cases, kvbatch / fp16-reference
is 0.93-1.08 for max|d| and 0.99-1.01 for NMSE; kvbatch is ~0.002-0.005 from the
fp16 reference itself, about half its distance from the exact one.)
Each scaled case also checks that it can see a missing scaling: the reference
without it must differ from the reference by more than 10 x the bar. Likewise
each Gemma case for what its architecture adds: the reference with every layer
global (no sliding window), with the other query-scale rule (hidden / heads)
where that differs, for gemma3 with the windowed layers on the global RoPE
base, and for gemma2 without each soft-cap, must differ by more than 10 x the
bar, and the reference with its window one position shorter or longer by more
than 3 x (so an engine off by one at the window's edge fails); likewise the
windows of Phi-3 and OLMo 3. Windowed cases report top-1 agreement separately
for the positions past the window (where the window changes what is seen).
Phi-3 LongRoPE cases check the reference with the other factor set and
without the attention factor, Granite cases without each multiplier.

LongRoPE: transformers computes a forward pass with the long factors when the
sequence is longer than original_max_position_embeddings, else the short
ones; kvbatch by its run's context (model_set_ctx). So the long case has an
original context of 1024 under kvbatch's default context (4096), and the short
case an original context of 2048, run with --ctx 2048: both compare 2,048
positions computed with the set transformers uses for them.

KVB_HFREF_BREAK=noscale writes the scaled cases' GGUFs without their scaling
(keys, rope_freqs, Phi-3's LongRoPE factors), nopermute skips llama's and
granite's Q/K permutation, theta writes a
rope base 1% off, nonormshift writes Gemma's norms without the 1 the
converter adds: each must make the test FAIL. KVB_HFREF_CASES=a,b runs only
those cases.

The test needs torch and transformers: it re-runs itself under the kvbatch
venv's python ($KVBATCH_VENV, default ~/.cache/kvbatch-venv, made by
scripts/setup.sh) when the python running it lacks them, and skips (77) when
there is none. Exit 0 pass, 1 fail, 77 skip.
"""
import os
import random
import subprocess
import sys
import tempfile
import time

N_TOK = 2048
MARGIN = 2.0
SENSITIVITY = 10.0  # a scaled case's no-scaling reference must be this many bars away
# a detail one step off (the window one position short) must be this many bars away: kvbatch, as far from
# a wrong reference as it is from the right one (~half a bar), would then be over a bar from the right one
EDGE_SENSITIVITY = 3.0


def skip(msg):
    print("SKIP: " + msg)
    sys.exit(77)


def ensure_torch():
    """Imports torch and transformers, re-executing under the venv's python when needed."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import numpy  # noqa: F401
        import gguf  # noqa: F401
        return
    except ImportError as e:
        why = str(e)
    venv = os.environ.get("KVBATCH_VENV") or os.path.join(os.path.expanduser("~"), ".cache", "kvbatch-venv")
    py = os.path.join(venv, "bin", "python")
    if os.environ.get("KVB_HFREF_REEXEC") or not os.access(py, os.X_OK):
        skip("torch/transformers not importable (%s) and no venv python at %s (scripts/setup.sh makes it)"
             % (why, py))
    os.environ["KVB_HFREF_REEXEC"] = "1"
    sys.stdout.flush()
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])


def base_cfg(**kw):
    cfg = dict(vocab_size=0, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=N_TOK,
               rms_norm_eps=1e-5, tie_word_embeddings=False,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.update(kw)
    return cfg


def rope(theta, **kw):
    return dict(rope_theta=theta, **kw)


def gemma3_cfg(**kw):
    """Gemma3TextConfig's defaults where the converter cannot say otherwise
    (query_pre_attn_scalar = head_dim, every 6th layer global), small widths."""
    cfg = dict(vocab_size=0, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
               num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
               max_position_embeddings=N_TOK, rms_norm_eps=1e-6, tie_word_embeddings=True, sliding_window=512,
               rope_parameters={"full_attention": rope(1e6, rope_type="default"),
                                "sliding_attention": rope(1e4, rope_type="default")})
    cfg.update(kw)
    return cfg


def gemma2_cfg(**kw):
    cfg = dict(vocab_size=0, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=256, query_pre_attn_scalar=256,
               max_position_embeddings=N_TOK, rms_norm_eps=1e-6, tie_word_embeddings=True, sliding_window=512,
               attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
               rope_parameters=rope(10000.0, rope_type="default"))
    cfg.update(kw)
    return cfg


def phi3_cfg(**kw):
    """Phi3Config with the test's widths; no window and no LongRoPE unless given."""
    cfg = dict(vocab_size=0, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=4, max_position_embeddings=2 * N_TOK, original_max_position_embeddings=2 * N_TOK,
               rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=None, pad_token_id=None,
               bos_token_id=None, eos_token_id=None, rope_parameters=rope(10000.0, rope_type="default"))
    cfg.update(kw)
    return cfg


def longrope(theta, orig, n_pairs, seed, **kw):
    """LongRoPE parameters shaped like Phi-3.5's: short factors near 1, long
    ones rising from 1 to ~40 over the pairs (slow frequencies stretched most)."""
    rng = random.Random(seed)  # not numpy: the cases are built before the venv's python takes over
    short = [round(1.0 + 0.3 * rng.random(), 4) for _ in range(n_pairs)]
    long_ = [round(40.0 ** (i / (n_pairs - 1)) * (1.0 + 0.1 * rng.random()), 4) for i in range(n_pairs)]
    return dict(rope_theta=theta, rope_type="longrope", short_factor=short, long_factor=long_,
                original_max_position_embeddings=orig, **kw)


def granite_cfg(**kw):
    """GraniteConfig with Granite 3.x's multipliers (embedding 12, residual
    0.22, logits 8; attention 1/head_dim in the real models, 1/16 here)."""
    cfg = base_cfg(num_key_value_heads=2, tie_word_embeddings=True, embedding_multiplier=12.0,
                   attention_multiplier=1.0 / 16, residual_multiplier=0.22, logits_scaling=8.0)
    cfg.update(kw)
    return cfg


# name, arch, config overrides, F16 weights[, extra kvbatch logits arguments]
CASES = [
    ("llama-mha", "llama", base_cfg(), False),
    ("llama-gqa", "llama", base_cfg(num_attention_heads=8, num_key_value_heads=2, head_dim=16), False),
    ("llama-mqa", "llama", base_cfg(num_key_value_heads=1), False),
    ("llama-tied", "llama", base_cfg(num_key_value_heads=2, tie_word_embeddings=True), False),
    ("llama-headdim48", "llama", base_cfg(num_key_value_heads=2, head_dim=48), False),
    ("llama-f16", "llama", base_cfg(num_key_value_heads=2), True),
    ("qwen2-bias", "qwen2", base_cfg(num_key_value_heads=2, rms_norm_eps=1e-6,
                                     rope_parameters=rope(1e6, rope_type="default")), False),
    ("qwen2-tied-f16", "qwen2", base_cfg(num_key_value_heads=2, tie_word_embeddings=True,
                                         rope_parameters=rope(1e6, rope_type="default")), True),
    ("qwen3-qknorm", "qwen3", base_cfg(num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
                                       rope_parameters=rope(1e6, rope_type="default")), False),
    # scaled: a short original context, so the prompt runs far past it
    ("llama-rope-llama3", "llama", base_cfg(
        num_key_value_heads=2, original_max_position_embeddings=256,
        rope_parameters=rope(500000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=256)), False),
    ("llama-rope-linear", "llama", base_cfg(
        num_key_value_heads=2, rope_parameters=rope(10000.0, rope_type="linear", factor=4.0)), False),
    ("llama-rope-yarn", "llama", base_cfg(
        num_key_value_heads=2, rope_parameters=rope(10000.0, rope_type="yarn", factor=4.0,
                                                    original_max_position_embeddings=512)), False),
    ("qwen2-rope-yarn", "qwen2", base_cfg(
        num_key_value_heads=2, rope_parameters=rope(1e6, rope_type="yarn", factor=4.0,
                                                    original_max_position_embeddings=512)), False),
    # yarn with the attention factor and betas given: transformers takes attention_factor as is (llama.cpp
    # multiplies in ggml's own 0.1 ln(factor) + 1 and divides it out again), betas move the ramp
    ("llama-rope-yarn-attnf", "llama", base_cfg(
        num_key_value_heads=2, rope_parameters=rope(10000.0, rope_type="yarn", factor=4.0, attention_factor=1.25,
                                                    beta_fast=16.0, beta_slow=2.0,
                                                    original_max_position_embeddings=512)), False),
    # betas in the wrong order (transformers warns and computes): the ramp runs downwards, where ggml's
    # max(0.001, high - low) would make it a step
    ("qwen2-rope-yarn-rev", "qwen2", base_cfg(
        num_key_value_heads=2, rope_parameters=rope(10000.0, rope_type="yarn", factor=4.0, beta_fast=1.0,
                                                    beta_slow=32.0, original_max_position_embeddings=512)), False),
    ("qwen3-rope-yarn", "qwen3", base_cfg(
        num_key_value_heads=2, head_dim=32, rope_parameters=rope(1e6, rope_type="yarn", factor=4.0,
                                                                 original_max_position_embeddings=512)), False),
    # Gemma 3 270M's shape (hidden 640, 4 heads over 1 KV head of 256, FFN 2048, window 512), 6 of its 18 layers
    ("gemma3-270m-shape", "gemma3", gemma3_cfg(hidden_size=640, intermediate_size=2048), False),
    # GQA, small heads, a window of 100 (not a whole number of KV blocks), untied output, F16 weights, two
    # global layers (5, 11) among 12
    ("gemma3-gqa-win100", "gemma3", gemma3_cfg(num_hidden_layers=12, num_key_value_heads=2, head_dim=64,
                                               query_pre_attn_scalar=64, sliding_window=100,
                                               tie_word_embeddings=False), True),
    # Gemma 3 4B-27B's RoPE: linear factor 8 on the global layers only, a 1e4 base on the local ones
    ("gemma3-rope-linear", "gemma3", gemma3_cfg(
        num_key_value_heads=2, head_dim=128, query_pre_attn_scalar=128, sliding_window=256,
        rope_parameters={"full_attention": rope(1e6, rope_type="linear", factor=8.0),
                         "sliding_attention": rope(1e4, rope_type="default")}), False),
    # Gemma 2 2B's shape in miniature: soft-caps 50 / 30, window 512, every other layer windowed
    ("gemma2-2b-shape", "gemma2", gemma2_cfg(), False),
    # caps that bite on every score and logit, a window of 200, F16 weights
    ("gemma2-softcap-strong", "gemma2", gemma2_cfg(num_key_value_heads=1, head_dim=128, query_pre_attn_scalar=128,
                                                   sliding_window=200, attn_logit_softcapping=4.0,
                                                   final_logit_softcapping=2.5), True),
    # Phi-3-mini-4k in miniature: fused QKV / gate-up, every layer windowed (its 2047 of 4096; 1000 here)
    ("phi3-mini-4k-shape", "phi3", phi3_cfg(sliding_window=1000), False),
    # Phi-3.5-mini's LongRoPE past the original context (1024 of 4096: the long factors, attention factor
    # sqrt(1 + ln 4 / ln 1024)), its window of 262144 (wider than the context), GQA
    ("phi3-longrope-long", "phi3", phi3_cfg(num_key_value_heads=2, original_max_position_embeddings=1024,
                                            max_position_embeddings=4096, sliding_window=262144,
                                            rope_parameters=longrope(10000.0, 1024, 16, 1)), False),
    # the same within the original context (2048 of 8192, run with --ctx 2048): the short factors
    ("phi3-longrope-short", "phi3", phi3_cfg(num_key_value_heads=2, original_max_position_embeddings=2048,
                                             max_position_embeddings=8192,
                                             rope_parameters=longrope(10000.0, 2048, 16, 2)), False,
     ["--ctx", "2048"]),
    # Phi-4-mini's shape in miniature: partial rotary 0.75 (24 of 32 dims), LongRoPE (long), 8 heads over 2,
    # tied embeddings, F16 weights
    ("phi4-mini-shape", "phi3", phi3_cfg(hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                                         tie_word_embeddings=True, original_max_position_embeddings=1024,
                                         max_position_embeddings=4096,
                                         rope_parameters=longrope(10000.0, 1024, 12, 3,
                                                                  partial_rotary_factor=0.75)), True),
    # Granite 3.x's multipliers, tied embeddings
    ("granite-3-shape", "granite", granite_cfg(), False),
    # other multipliers, an untied head, 8 heads over 2, F16 weights
    ("granite-untied-f16", "granite", granite_cfg(num_attention_heads=8, tie_word_embeddings=False,
                                                  embedding_multiplier=6.0, attention_multiplier=0.1,
                                                  residual_multiplier=0.5, logits_scaling=3.0), True),
    # OLMo 2: norms after attention and FFN only, Q/K norms over the whole projection
    ("olmo2-shape", "olmo2", base_cfg(rms_norm_eps=1e-6, rope_parameters=rope(500000.0, rope_type="default")),
     False),
    ("olmo2-gqa-tied-f16", "olmo2", base_cfg(num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True,
                                             rms_norm_eps=1e-6), True),
    # OLMo 3 (converted as olmo2): windows of 300 on three layers of four, their own RoPE base, yarn on the
    # global layers only
    ("olmo3-window", "olmo3", base_cfg(
        num_hidden_layers=4, num_key_value_heads=2, rms_norm_eps=1e-6, sliding_window=300,
        rope_parameters={"full_attention": rope(500000.0, rope_type="yarn", factor=4.0,
                                                original_max_position_embeddings=512),
                         "sliding_attention": rope(10000.0, rope_type="default")}), False),
    # mixtures of experts. Mixtral 8x7B's routing (8 experts, top 2, renormalised) as "llama" with experts
    ("mixtral-8x2", "mixtral", base_cfg(num_key_value_heads=2, intermediate_size=128, num_local_experts=8,
                                        num_experts_per_tok=2, rope_parameters=rope(1e6, rope_type="default")),
     False),
    # Qwen3-30B-A3B's routing (top 8, renormalised: norm_topk_prob as released) over 32 experts, its head
    # size twice hidden / heads, Q/K norms per head
    ("qwen3moe-a3b-shape", "qwen3moe", base_cfg(num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
                                                intermediate_size=384, num_experts=32, num_experts_per_tok=8,
                                                moe_intermediate_size=64, norm_topk_prob=True,
                                                rope_parameters=rope(1e6, rope_type="default")), False),
    # F16 experts (the router stays F32, as the converter writes it), 3 layers, top 4 of 16, GQA 8/2
    ("qwen3moe-f16", "qwen3moe", base_cfg(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
                                          head_dim=32, rms_norm_eps=1e-6, num_experts=16, num_experts_per_tok=4,
                                          moe_intermediate_size=96, norm_topk_prob=True,
                                          rope_parameters=rope(1e6, rope_type="default")), True),
    # OLMoE-1B-7B's routing (top 8 of 64, not renormalised) in miniature, Q/K norms over the whole projection
    ("olmoe-1b-7b-shape", "olmoe", base_cfg(intermediate_size=64, num_experts=64, num_experts_per_tok=8,
                                            norm_topk_prob=False), False),
    # Qwen1.5-MoE-A2.7B's (top 4 of 60, not renormalised, Q/K/V biases) with its shared expert, four times an
    # expert's width, gated by sigmoid; F16 matrices (the two gates F32)
    ("qwen2moe-a2.7b-shape", "qwen2moe", base_cfg(num_experts=60, num_experts_per_tok=4, moe_intermediate_size=64,
                                                  shared_expert_intermediate_size=256, norm_topk_prob=False,
                                                  rms_norm_eps=1e-6, rope_parameters=rope(1e6, rope_type="default")),
     True),
]
MOE = ("mixtral", "qwen3moe", "olmoe", "qwen2moe")


def full_rope(cfg):
    """The (global layers') rope parameters."""
    rp = cfg["rope_parameters"]
    return rp.get("full_attention", rp)


def scaled(cfg):
    return full_rope(cfg).get("rope_type", "default") != "default"


def unscaled(cfg):
    """cfg with the global layers' RoPE unscaled."""
    plain = dict(full_rope(cfg))
    plain = {"rope_type": "default", "rope_theta": plain["rope_theta"]}
    rp = cfg["rope_parameters"]
    out = dict(cfg, rope_parameters=dict(rp, full_attention=plain) if "full_attention" in rp else plain)
    out.pop("original_max_position_embeddings", None)
    return out


def variants(arch, cfg):
    """(what, config, bars) triples the reference must be sensitive to, each by
    more than `bars` x the case's bar: each leaves out something the
    architecture computes, or gets a detail of it one step wrong."""
    out = []
    if scaled(cfg):
        out.append(("no rope scaling", unscaled(cfg), SENSITIVITY))
    w = window_of(arch, cfg)
    if arch in ("gemma2", "gemma3", "olmo3"):
        out.append(("no window", dict(cfg, layer_types=["full_attention"] * cfg["num_hidden_layers"]), SENSITIVITY))
    if arch == "phi3" and w:
        out.append(("no window", dict(cfg, sliding_window=None), SENSITIVITY))
    if w:
        # transformers' window holds the position itself and the w - 1 before it (kv > q - w): an engine
        # one off either way must fail
        out.append(("window %d (one short)" % (w - 1), dict(cfg, sliding_window=w - 1), EDGE_SENSITIVITY))
        out.append(("window %d (one long)" % (w + 1), dict(cfg, sliding_window=w + 1), EDGE_SENSITIVITY))
    if arch in ("gemma2", "gemma3"):
        # the query scale is 1/sqrt(query_pre_attn_scalar), which the GGUF does not carry: the other rule
        # (hidden / heads, Gemma 2 27B's) must show
        alt = cfg["hidden_size"] // cfg["num_attention_heads"]
        if alt != cfg["query_pre_attn_scalar"]:
            out.append(("query scale 1/sqrt(%d)" % alt, dict(cfg, query_pre_attn_scalar=alt), SENSITIVITY))
    if arch == "gemma3":
        rp = cfg["rope_parameters"]
        glob = {"rope_type": "default", "rope_theta": full_rope(cfg)["rope_theta"]}
        out.append(("the global RoPE base on the windowed layers",
                    dict(cfg, rope_parameters=dict(rp, sliding_attention=glob)), SENSITIVITY))
    if arch == "gemma2":
        out.append(("no attn softcap", dict(cfg, attn_logit_softcapping=None), SENSITIVITY))
        out.append(("no final softcap", dict(cfg, final_logit_softcapping=None), SENSITIVITY))
    rp = full_rope(cfg)
    if arch == "phi3" and rp.get("rope_type") == "longrope":
        # the other factor set: what a run choosing the wrong one computes
        used, other = ("long_factor", "short_factor") if N_TOK > rp["original_max_position_embeddings"] \
            else ("short_factor", "long_factor")
        out.append(("the %s" % other.replace("_", " "), dict(cfg, rope_parameters=dict(rp, **{used: rp[other]})),
                    SENSITIVITY))
        out.append(("no attention factor", dict(cfg, rope_parameters=dict(rp, attention_factor=1.0)), SENSITIVITY))
    if arch == "granite":
        hd = cfg["hidden_size"] // cfg["num_attention_heads"]
        for k, neutral in (("embedding_multiplier", 1.0), ("attention_multiplier", hd ** -0.5),
                           ("residual_multiplier", 1.0), ("logits_scaling", 1.0)):
            out.append(("neutral %s" % k, dict(cfg, **{k: neutral}), SENSITIVITY))
    # a mixture of experts: measured at the median position (main's loop says why)
    if arch in MOE:
        out.append(("one expert fewer", dict(cfg, num_experts_per_tok=cfg["num_experts_per_tok"] - 1), SENSITIVITY))
    if arch in ("qwen3moe", "olmoe", "qwen2moe"):
        out.append(("the other top-k normalisation", dict(cfg, norm_topk_prob=not cfg["norm_topk_prob"]),
                    SENSITIVITY))
    if arch == "qwen2moe":  # the shared expert's down projection zeroed: it adds nothing
        out.append(("no shared expert", cfg, SENSITIVITY,
                    lambda st: {k: (v * 0 if k.endswith("shared_expert.down_proj.weight") else v)
                                for k, v in st.items()}))
    return out


def window_of(arch, cfg):
    """The sliding window when the prompt runs past it, else None."""
    win = cfg.get("sliding_window") if arch in ("gemma2", "gemma3", "phi3", "olmo3") else None
    return win if win and win < N_TOK else None


def random_state(np, model, seed):
    """Random weights for every tensor of the model, scaled so that attention is
    peaked (score std ~3: RoPE errors show) and activations stay O(1)."""
    rng = np.random.default_rng(seed)
    out = {}
    c = model.config
    gemma = c.model_type.startswith("gemma")
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    q_rows, kv_rows = c.num_attention_heads * hd, c.num_key_value_heads * hd
    # Q/K scaled so that the scores' spread is the same whatever the query scale (Granite's attention_multiplier
    # is 4-8 x below 1/sqrt(head_dim)): peaked attention, where RoPE errors show
    qk_gain = 1.7 * (hd ** -0.5 / getattr(c, "attention_multiplier", hd ** -0.5)) ** 0.5
    for name, t in model.state_dict().items():
        shape = tuple(t.shape)
        if name.endswith("norm.weight"):
            # q_norm/k_norm scale what the scores see; the others stay near 1 (Gemma's norms multiply by
            # 1 + weight: near 0 there)
            mean = 1.7 if ("q_norm" in name or "k_norm" in name) else 1.0
            out[name] = (mean - (1.0 if gemma else 0.0) + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith(".bias"):
            out[name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith("embed_tokens.weight"):
            # a tied output reads it as lm_head too: scale it as one (Gemma scales embeddings by sqrt(hidden))
            tied = model.config.tie_word_embeddings
            gain = 2.0 / np.sqrt(shape[1]) if tied else 1.0 / np.sqrt(shape[1]) if gemma else 1.0
            out[name] = (gain * rng.standard_normal(shape)).astype(np.float32)
        else:
            # fan-in is the last dimension (a MoE's stacked experts are (n_expert, rows, fan-in))
            gain = qk_gain if name.endswith(("q_proj.weight", "k_proj.weight")) else \
                2.0 if name == "lm_head.weight" else 1.0
            out[name] = (gain / np.sqrt(shape[-1]) * rng.standard_normal(shape)).astype(np.float32)
            if name.endswith("qkv_proj.weight"):  # phi3's fused Q, K, V: Q and K rows as q_proj/k_proj
                out[name][:q_rows + kv_rows] *= np.float32(qk_gain)
    if model.config.tie_word_embeddings and "lm_head.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def median_d(np, ref, got):
    """The median over positions of each position's max|d|: what the typical position sees, which a few
    outlying positions (a MoE's routing flips) do not move."""
    return float(np.median(np.abs(got.astype(np.float64) - ref).max(1)))


def metrics(np, ref, got):
    r, g = ref.astype(np.float64), got.astype(np.float64)
    d = np.abs(g - r)
    nmse = float(((g - r) ** 2).sum() / (r ** 2).sum())
    top1 = r.argmax(1) == g.argmax(1)
    return float(d.max()), nmse, top1


def main():
    ensure_torch()
    import numpy as np
    import torch
    import transformers
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hfref_gguf

    kvb = os.environ.get("KVB_BIN", "")
    if not kvb or not os.access(kvb, os.X_OK):
        skip("KVB_BIN not set or not executable (%r)" % kvb)
    brk = os.environ.get("KVB_HFREF_BREAK", "")
    if brk not in ("", "noscale", "nopermute", "theta", "nonormshift"):
        skip("unknown KVB_HFREF_BREAK=%s" % brk)
    if brk:
        print("NOTE: GGUFs deliberately broken (KVB_HFREF_BREAK=%s): this run must FAIL" % brk)
    only = [c for c in os.environ.get("KVB_HFREF_CASES", "").split(",") if c]
    # KVB_HFREF_ACTIVATIONS=16: kvbatch with --activations 16 (the quantized cases then come within the
    # fp16-K/V reference's distance: mixtral-8x2 Q8_0 NMSE 3.4e-4 -> 1.2e-7, max|d| 2.6 -> 0.007)
    acts = os.environ.get("KVB_HFREF_ACTIVATIONS", "")
    if acts not in ("", "8", "16"):
        skip("KVB_HFREF_ACTIVATIONS=%s: 8 or 16" % acts)
    torch.set_num_threads(2)
    t_start = time.time()

    # the fp16-KV reference: K (after RoPE / QK norm) and V rounded as kvbatch's KV pool stores them, through
    # the model's own eager attention (Gemma's soft-caps its scores)
    def fp16kv_attention(module, query, key, value, attention_mask, **kw):
        eager = sys.modules[type(module).__module__].eager_attention_forward
        return eager(module, query, key.half().float(), value.half().float(), attention_mask, **kw)
    AttentionInterface.register("kvb_fp16kv", fp16kv_attention)
    AttentionMaskInterface.register("kvb_fp16kv", eager_mask)  # the same causal mask as eager

    classes = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
               "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
               "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
               "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
               "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
               "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
               "granite": (transformers.GraniteConfig, transformers.GraniteForCausalLM),
               "olmo2": (transformers.Olmo2Config, transformers.Olmo2ForCausalLM),
               "olmo3": (transformers.Olmo3Config, transformers.Olmo3ForCausalLM),
               "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
               "qwen3moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
               "olmoe": (transformers.OlmoeConfig, transformers.OlmoeForCausalLM),
               "qwen2moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM)}
    n_vocab = hfref_gguf.vocab_size()
    failures, table = [], []

    # the converter's permutation must be a permutation (and unpermute its inverse)
    x = np.arange(6 * 4 * 8, dtype=np.float32).reshape(6 * 8, 4)
    px = hfref_gguf.permute(x, 6, 6)
    if not np.array_equal(hfref_gguf.unpermute(px, 6, 6), x) or np.array_equal(px, x):
        failures.append("hfref_gguf.permute is not an invertible reordering")

    def forward(model, ids, attn):
        model.set_attn_implementation(attn)
        with torch.inference_mode():
            return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float().numpy()

    def build(arch, cfg, state):
        cfg_cls, model_cls = classes[arch]
        config = cfg_cls(**cfg)
        config._attn_implementation = "eager"
        model = model_cls(config).eval()
        if state is not None:
            model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
        return model

    with tempfile.TemporaryDirectory(prefix="kvb_hfref_") as tmp:
        out = os.path.join(tmp, "logits.f32")
        for ci, (name, arch, cfg, f16, *extra) in enumerate(CASES):
            if only and name not in only:
                continue
            extra = extra[0] if extra else []
            if acts:
                extra = extra + ["--activations", acts]
            t0 = time.time()
            cfg = dict(cfg, vocab_size=n_vocab, rope_parameters=dict(cfg["rope_parameters"]))
            for k in ("full_attention", "sliding_attention"):
                if k in cfg["rope_parameters"]:
                    cfg["rope_parameters"][k] = dict(cfg["rope_parameters"][k])
            model = build(arch, cfg, None)
            state = random_state(np, model, 1000 + ci)
            if f16:  # the reference computes with the weights the file holds (a MoE's router stays F32)
                state = {k: (v.astype(np.float16).astype(np.float32)
                             if v.ndim >= 2 and not k.endswith(("mlp.gate.weight", "shared_expert_gate.weight"))
                             else v) for k, v in state.items()}
            model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
            hp = model.config.to_dict()
            if brk == "theta":
                rp = hp["rope_parameters"]
                if "full_attention" in rp:
                    hp["rope_parameters"] = dict(rp, full_attention=dict(
                        rp["full_attention"], rope_theta=rp["full_attention"]["rope_theta"] * 1.01))
                else:
                    hp["rope_parameters"] = dict(rp, rope_theta=rp["rope_theta"] * 1.01)
            path = os.path.join(tmp, name + ".gguf")
            hfref_gguf.write_gguf(path, arch, hp, state, f16=f16, scaling=brk != "noscale",
                                  permute_qk=brk != "nopermute", name=name, norm_shift=brk != "nonormshift")
            ids = np.random.default_rng(ci).integers(0, n_vocab, N_TOK).tolist()

            ref = forward(model, ids, "eager")
            ref16 = forward(model, ids, "kvb_fp16kv")
            d16, n16, t16 = metrics(np, ref, ref16)
            m16 = median_d(np, ref, ref16)
            if not 0 < n16 < (1e-3 if arch in MOE else 1e-4):
                failures.append("%s: the fp16-KV reference is %.3g NMSE from the exact one: it is broken, "
                                "or not rounding at all" % (name, n16))
            tol_d, tol_n, tol_m = MARGIN * d16, MARGIN ** 2 * n16, MARGIN * m16
            sens = []
            for what, plain, bars, *edit in variants(arch, cfg):
                other = forward(build(arch, plain, edit[0](state) if edit else state), ids, "eager")
                if arch in MOE:
                    # a MoE's max|d| and NMSE bars are set by the fp16 reference's routing flips (the few
                    # tokens whose k-th and (k+1)-th experts are within rounding of each other); a change
                    # of routing shows at the typical position
                    ms = median_d(np, ref, other)
                    sens.append(ms / (bars * tol_m))
                    print("  %s: the reference with %s is %.3g from it at the median position (%.1f median bars)"
                          % (name, what, ms, ms / tol_m))
                    if ms <= bars * tol_m:
                        failures.append("%s: the reference with %s is only %.3g from it at the median position "
                                        "(must exceed %.3g): this case cannot tell them apart"
                                        % (name, what, ms, bars * tol_m))
                    continue
                ds, ns, _ = metrics(np, ref, other)
                sens.append(ds / (bars * tol_d))
                print("  %s: the reference with %s is %.3g from it (%.1f bars)" % (name, what, ds, ds / tol_d))
                if ds <= bars * tol_d:
                    failures.append("%s: the reference with %s is only %.3g from it (must exceed %.3g): "
                                    "this case cannot tell them apart" % (name, what, ds, bars * tol_d))
            sens = "%.3g" % min(sens) if sens else ""  # > 1: every variant far enough
            win = window_of(arch, cfg)
            try:
                p = subprocess.run([kvb, "logits", "--model", path, "--prompt-ids", " ".join(map(str, ids)),
                                    "--out", out, "--threads", "2"] + extra, capture_output=True, text=True,
                               timeout=300)
                if p.returncode != 0:
                    raise RuntimeError("kvbatch logits exited %d: %s" % (p.returncode, p.stderr.strip()[-300:]))
                if [int(t) for t in p.stdout.split()] != ids:
                    raise RuntimeError("kvbatch logits echoed other token ids than it was given")
                got = np.fromfile(out, dtype="<f4")
                if got.size != N_TOK * n_vocab:
                    raise RuntimeError("%d floats, expected %d x %d" % (got.size, N_TOK, n_vocab))
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                failures.append("%s: %s" % (name, e))
                table.append((name, None, None, None, None, d16, n16, tol_d, tol_n, None, sens, "FAIL",
                              time.time() - t0, None, m16))
                continue
            got = got.reshape(N_TOK, n_vocab)
            d, n, top1 = metrics(np, ref, got)
            srt = np.sort(ref, 1)
            clear = srt[:, -1] - srt[:, -2] > 2 * tol_d
            bad_top1 = int((clear & ~top1).sum())
            d_vs16 = float(np.abs(got.astype(np.float64) - ref16).max())
            med = median_d(np, ref, got)
            ok = d <= tol_d and n <= tol_n and bad_top1 == 0 and (med <= tol_m or arch not in MOE)
            if arch in MOE and med > tol_m:
                failures.append("%s: median position's max|d| %.3g (bar %.3g)" % (name, med, tol_m))
            if not ok:
                dpos = np.abs(got - ref).max(1)
                w = int(dpos.argmax())
                failures.append("%s: max|d| %.3g (bar %.3g), NMSE %.3g (bar %.3g), top-1 wrong at %d clear "
                                "positions; worst position %d (max|d| there %.3g; first position over the "
                                "bar: %s)" % (name, d, tol_d, n, tol_n, bad_top1, w, dpos[w],
                                             next((int(i) for i in np.flatnonzero(dpos > tol_d)), "-")))
            past = top1[win:].mean() if win else None
            table.append((name, d, n, top1.mean(), past, d16, n16, tol_d, tol_n, d_vs16, sens, "ok" if ok else "FAIL",
                          time.time() - t0, med, m16))

        # --prompt-ids is the same prompt as the text it tokenizes to
        first = next((c for c in CASES if not only or c[0] in only), None)
        if first:
            path = os.path.join(tmp, first[0] + ".gguf")
            a = subprocess.run([kvb, "logits", "--model", path, "--prompt", "the seat is hot",
                                "--out", out + ".a"], capture_output=True, text=True)
            b = subprocess.run([kvb, "logits", "--model", path, "--prompt-ids", a.stdout.strip(),
                                "--out", out + ".b"], capture_output=True, text=True)
            bad = subprocess.run([kvb, "logits", "--model", path, "--prompt-ids", "1 %d" % n_vocab,
                                  "--out", out + ".c"], capture_output=True, text=True)
            same = a.returncode == 0 and b.returncode == 0 and \
                open(out + ".a", "rb").read() == open(out + ".b", "rb").read()
            if not same:
                failures.append("logits --prompt TEXT and --prompt-ids of its ids differ (rc %d, %d)"
                                % (a.returncode, b.returncode))
            if bad.returncode != 2 or "outside the vocabulary" not in bad.stderr:
                failures.append("logits --prompt-ids with id %d: rc %d, %r (want 2, outside the vocabulary)"
                                % (n_vocab, bad.returncode, bad.stderr.strip()))

    print("\ntransformers %s, torch %s; %d positions, vocab %d; bar = %g x the fp16-KV reference's distance"
          % (transformers.__version__, torch.__version__, N_TOK, n_vocab, MARGIN))
    print("%-21s %9s %9s %7s %7s | %9s %9s | %9s %9s | %9s %9s | %9s %9s  %-6s %5s"
          % ("case", "max|d|", "NMSE", "top-1", "past w", "fp16 d", "fp16 NMSE", "bar d", "bar NMSE", "med|d|",
             "fp16 med", "d vs fp16", "without", "status", "s"))
    g = lambda x: "-" if x is None else "%.3g" % x  # noqa: E731
    pct = lambda x: "-" if x is None else "%.4f" % x  # noqa: E731
    for r in table:
        print("%-21s %9s %9s %7s %7s | %9s %9s | %9s %9s | %9s %9s | %9s %9s  %-6s %5.1f"
              % (r[0], g(r[1]), g(r[2]), pct(r[3]), pct(r[4]), g(r[5]), g(r[6]), g(r[7]), g(r[8]), g(r[13]),
                 g(r[14]), g(r[9]), r[10] or "-", r[11], r[12]))
    print("max|d|, NMSE, top-1: kvbatch against the exact reference over positions 0-%d (past w: top-1 over\n"
          "the positions past the sliding window); fp16 d / NMSE: the reference with fp16 K/V against the exact\n"
          "one; bar: what kvbatch is held to (max|d| %g x, NMSE %g x those); med|d| / fp16 med: the median over\n"
          "positions of each position's max|d|, kvbatch's and the fp16 reference's (a mixture of experts is held\n"
          "to %g x the latter too: its max|d| and NMSE bars come from the few tokens whose routing fp16 rounding\n"
          "flips); d vs fp16: kvbatch against the fp16-K/V reference (for information); without: over the case's\n"
          "changed references (RoPE scaling, the window or a soft-cap left out, the other query-scale rule, the\n"
          "global RoPE base on the windowed layers: each must be over %g bars away; the window one position off:\n"
          "over %g bars; for a mixture of experts one expert fewer, the other top-k normalisation, no shared\n"
          "expert: over %g median bars), the smallest distance in units of what it must exceed (> 1 everywhere)"
          % (N_TOK - 1, MARGIN, MARGIN ** 2, MARGIN, SENSITIVITY, EDGE_SENSITIVITY, SENSITIVITY))
    print("total %.1fs" % (time.time() - t_start))
    if failures:
        print("\nFAIL:\n  " + "\n  ".join(failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
