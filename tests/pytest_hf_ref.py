#!/usr/bin/env python3
"""pytest_hf_ref.py — kvbatch's logits against Hugging Face transformers, an
independent reference (tests/refmodel.py was written from the same
understanding as the engine and shares its blind spots).

For each case below: random weights go into a transformers model built from its
Config class (LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM /
Gemma2ForCausalLM / Gemma3ForCausalLM, float32, eager attention, CPU) and,
through tests/hfref_gguf.py, into a GGUF written as llama.cpp's
convert_hf_to_gguf.py writes one for that config (the Q/K row permutation for
llama, rope_freqs for "llama3", the rope scaling keys for "linear" and "yarn",
Gemma's norms with 1 added and its soft-cap, window and RoPE keys). transformers' own GGUF loader is not used: it drops rope
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
than 3 x (so an engine off by one at the window's edge fails); windowed cases
report top-1 agreement separately for the positions past the window (where the
window changes what is seen).

KVB_HFREF_BREAK=noscale writes the scaled cases' GGUFs without their scaling
(keys, rope_freqs), nopermute skips llama's Q/K permutation, theta writes a
rope base 1% off, nonormshift writes Gemma's norms without the 1 the
converter adds: each must make the test FAIL. KVB_HFREF_CASES=a,b runs only
those cases.

The test needs torch and transformers: it re-runs itself under the kvbatch
venv's python ($KVBATCH_VENV, default ~/.cache/kvbatch-venv, made by
scripts/setup.sh) when the python running it lacks them, and skips (77) when
there is none. Exit 0 pass, 1 fail, 77 skip.
"""
import os
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


# name, arch, config overrides, F16 weights
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
]


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
    if arch in ("gemma2", "gemma3"):
        w = cfg["sliding_window"]
        out.append(("no window", dict(cfg, layer_types=["full_attention"] * cfg["num_hidden_layers"]), SENSITIVITY))
        # transformers' window holds the position itself and the w - 1 before it (kv > q - w): an engine
        # one off either way must fail
        out.append(("window %d (one short)" % (w - 1), dict(cfg, sliding_window=w - 1), EDGE_SENSITIVITY))
        out.append(("window %d (one long)" % (w + 1), dict(cfg, sliding_window=w + 1), EDGE_SENSITIVITY))
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
    return out


def random_state(np, model, seed):
    """Random weights for every tensor of the model, scaled so that attention is
    peaked (score std ~3: RoPE errors show) and activations stay O(1)."""
    rng = np.random.default_rng(seed)
    out = {}
    gemma = model.config.model_type.startswith("gemma")
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
            gain = 1.7 if name.endswith(("q_proj.weight", "k_proj.weight")) else \
                2.0 if name == "lm_head.weight" else 1.0
            out[name] = (gain / np.sqrt(shape[1]) * rng.standard_normal(shape)).astype(np.float32)
    if model.config.tie_word_embeddings and "lm_head.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


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
               "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM)}
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
        for ci, (name, arch, cfg, f16) in enumerate(CASES):
            if only and name not in only:
                continue
            t0 = time.time()
            cfg = dict(cfg, vocab_size=n_vocab, rope_parameters=dict(cfg["rope_parameters"]))
            for k in ("full_attention", "sliding_attention"):
                if k in cfg["rope_parameters"]:
                    cfg["rope_parameters"][k] = dict(cfg["rope_parameters"][k])
            model = build(arch, cfg, None)
            state = random_state(np, model, 1000 + ci)
            if f16:  # the reference computes with the weights the file holds
                state = {k: (v.astype(np.float16).astype(np.float32)
                             if v.ndim == 2 else v) for k, v in state.items()}
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
            if not 0 < n16 < 1e-4:
                failures.append("%s: the fp16-KV reference is %.3g NMSE from the exact one: it is broken, "
                                "or not rounding at all" % (name, n16))
            tol_d, tol_n = MARGIN * d16, MARGIN ** 2 * n16
            sens = []
            for what, plain, bars in variants(arch, cfg):
                ds, ns, _ = metrics(np, ref, forward(build(arch, plain, state), ids, "eager"))
                sens.append(ds / (bars * tol_d))
                print("  %s: the reference with %s is %.3g from it (%.1f bars)" % (name, what, ds, ds / tol_d))
                if ds <= bars * tol_d:
                    failures.append("%s: the reference with %s is only %.3g from it (must exceed %.3g): "
                                    "this case cannot tell them apart" % (name, what, ds, bars * tol_d))
            sens = "%.3g" % min(sens) if sens else ""  # > 1: every variant far enough
            win = cfg.get("sliding_window") if arch in ("gemma2", "gemma3") else None
            try:
                p = subprocess.run([kvb, "logits", "--model", path, "--prompt-ids", " ".join(map(str, ids)),
                                    "--out", out, "--threads", "2"], capture_output=True, text=True, timeout=300)
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
                              time.time() - t0))
                continue
            got = got.reshape(N_TOK, n_vocab)
            d, n, top1 = metrics(np, ref, got)
            srt = np.sort(ref, 1)
            clear = srt[:, -1] - srt[:, -2] > 2 * tol_d
            bad_top1 = int((clear & ~top1).sum())
            d_vs16 = float(np.abs(got.astype(np.float64) - ref16).max())
            ok = d <= tol_d and n <= tol_n and bad_top1 == 0
            if not ok:
                dpos = np.abs(got - ref).max(1)
                w = int(dpos.argmax())
                failures.append("%s: max|d| %.3g (bar %.3g), NMSE %.3g (bar %.3g), top-1 wrong at %d clear "
                                "positions; worst position %d (max|d| there %.3g; first position over the "
                                "bar: %s)" % (name, d, tol_d, n, tol_n, bad_top1, w, dpos[w],
                                             next((int(i) for i in np.flatnonzero(dpos > tol_d)), "-")))
            past = top1[win:].mean() if win else None
            table.append((name, d, n, top1.mean(), past, d16, n16, tol_d, tol_n, d_vs16, sens, "ok" if ok else "FAIL",
                          time.time() - t0))

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
    print("%-21s %9s %9s %7s %7s | %9s %9s | %9s %9s | %9s %9s  %-6s %5s"
          % ("case", "max|d|", "NMSE", "top-1", "past w", "fp16 d", "fp16 NMSE", "bar d", "bar NMSE", "d vs fp16",
             "without", "status", "s"))
    g = lambda x: "-" if x is None else "%.3g" % x  # noqa: E731
    pct = lambda x: "-" if x is None else "%.4f" % x  # noqa: E731
    for r in table:
        print("%-21s %9s %9s %7s %7s | %9s %9s | %9s %9s | %9s %9s  %-6s %5.1f"
              % (r[0], g(r[1]), g(r[2]), pct(r[3]), pct(r[4]), g(r[5]), g(r[6]), g(r[7]), g(r[8]), g(r[9]),
                 r[10] or "-", r[11], r[12]))
    print("max|d|, NMSE, top-1: kvbatch against the exact reference over positions 0-%d (past w: top-1 over\n"
          "the positions past the sliding window); fp16 d / NMSE: the reference with fp16 K/V against the exact\n"
          "one; bar: what kvbatch is held to (max|d| %g x, NMSE %g x those); d vs fp16: kvbatch against the\n"
          "fp16-K/V reference (for information); without: over the case's changed references (RoPE scaling,\n"
          "the window or a soft-cap left out, the other query-scale rule, the global RoPE base on the windowed\n"
          "layers: each must be over %g bars away; the window one position off: over %g bars), the smallest\n"
          "distance from the reference in units of what it must exceed (> 1 everywhere)"
          % (N_TOK - 1, MARGIN, MARGIN ** 2, SENSITIVITY, EDGE_SENSITIVITY))
    print("total %.1fs" % (time.time() - t_start))
    if failures:
        print("\nFAIL:\n  " + "\n  ".join(failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
