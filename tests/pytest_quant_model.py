#!/usr/bin/env python3
"""pytest_quant_model.py — whole models whose matrices are Q2_K, Q3_K, Q5_K,
IQ4_NL or IQ4_XS: kvbatch's logits against transformers' own GGUF loader.

For each type: random llama weights (transformers' LlamaConfig shapes; hidden
256 so that every row is whole 256-element super-blocks) are quantized to that
type (tests/quant_pack.py: every 2-D tensor, the token embeddings and the
output head included, Q and K rows permuted as llama.cpp's converter does) and
written to a GGUF with tests/hfref_gguf.py's metadata and vocabulary. The
reference is LlamaForCausalLM.from_pretrained(..., gguf_file=...): transformers
reads the file itself, dequantizes through gguf-py and undoes the permutation,
float32, eager attention, CPU. A prompt of 2,048 random token ids goes through
both (`kvbatch logits --prompt-ids`, the SIMD kernels and --scalar).

The bar, and why. kvbatch does not compute in float32 throughout: every
product with a quantized weight sees its input quantized per 32 elements to
int8 (d = amax/127, round half to even: src/cpu/matmul_scalar.c), and K/V are
kept in fp16. So the reference is run a second time doing exactly that
(`emulated`: an int8 round trip of each Linear's input, K and V rounded to
fp16), and its distance from the exact reference sets the bar, as in
tests/pytest_hf_ref.py:
    max|kvb - ref| <= D_MARGIN * max|emulated - ref|
    NMSE(kvb, ref) <= N_MARGIN * NMSE(emulated, ref)
    top-1 agrees wherever the reference's top-2 gap exceeds 2 * the max|d| bar
kvbatch cannot be held to the emulation itself: the int8 rounding of a
layer's input flips wherever kvbatch's float order moves a value across a
rounding boundary, and the flips cascade (perturbing the emulation's
activations by 1e-6 relative moves its logits by half its whole distance
from the exact reference). kvbatch is another draw of that same error, so
its NMSE should match the emulation's: measured 0.99-1.01 x for these types
and for Q4_0 / Q8_0, hence N_MARGIN 1.5 (a bug that adds error of the
int8 rounding's own size fails it). The max over 650k logits is noisier:
D_MARGIN 2 (measured 0.9-1.1 x).
The test also shows it can see a layout mistake: the reference computed with
each 32-element block of every weight reversed (a nibble-order bug) must lie
more than SENSITIVITY bars away.

Needs torch, transformers, gguf (re-runs itself under the kvbatch venv) and
KVB_BIN; skips (77) without them. KVB_QUANT_TYPES=Q2_K,... runs only those.
"""
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from kvbcheck import need_modules  # noqa: E402

TYPES = ["Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS"]
N_TOK = 2048
D_MARGIN = 2.0
N_MARGIN = 1.5
SENSITIVITY = 10.0
CFG = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=N_TOK, rms_norm_eps=1e-5, tie_word_embeddings=False,
           rope_theta=10000.0)


def random_state(np, names_shapes, seed):
    """Weights scaled so that activations stay O(1) and attention is peaked."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in names_shapes:
        if name.endswith("norm.weight"):
            out[name] = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith("embed_tokens.weight"):
            out[name] = rng.standard_normal(shape).astype(np.float32)
        else:
            gain = 1.7 if name.endswith(("q_proj.weight", "k_proj.weight")) else 2.0 if name == "lm_head.weight" else 1.0
            out[name] = (gain / np.sqrt(shape[1]) * rng.standard_normal(shape)).astype(np.float32)
    return out


def write_gguf(path, hp, state, qtype):
    """The state as llama.cpp's converter names and permutes it, every 2-D
    tensor quantized to qtype, norms F32."""
    import gguf
    import numpy as np
    import hfref_gguf
    import quant_pack
    n_head, n_kv = hp["num_attention_heads"], hp["num_key_value_heads"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, hp["num_hidden_layers"])
    w = gguf.GGUFWriter(path, "llama")
    qt = gguf.GGMLQuantizationType[qtype]
    for hf_name, data in state.items():
        if hf_name.endswith("q_proj.weight"):
            data = hfref_gguf.permute(data, n_head, n_head)
        elif hf_name.endswith("k_proj.weight"):
            data = hfref_gguf.permute(data, n_head, n_kv)
        name = names.get_name(hf_name, try_suffixes=(".weight",))
        if data.ndim == 1:
            w.add_tensor(name, data.astype(np.float32), raw_dtype=gguf.GGMLQuantizationType.F32)
        else:
            w.add_tensor(name, quant_pack.quantize(data, qtype), raw_dtype=qt)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("quant-" + qtype)
    hp = dict(hp, rope_parameters={"rope_type": "default", "rope_theta": hp["rope_theta"]})
    hfref_gguf._write_params(w, "llama", hp, gguf.LlamaFileType.ALL_F32, True)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    hfref_gguf._write_vocab(w, hp["vocab_size"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    need_modules("torch", "transformers", "numpy", "gguf")
    import numpy as np
    import torch
    import transformers
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.models.llama.modeling_llama import eager_attention_forward
    import hfref_gguf
    import quant_pack

    kvb = os.environ.get("KVB_BIN", "")
    if not kvb or not os.access(kvb, os.X_OK):
        print("SKIP: KVB_BIN not set or not executable (%r)" % kvb)
        return 77
    only = [t for t in os.environ.get("KVB_QUANT_TYPES", "").split(",") if t]
    torch.set_num_threads(2)
    t_start = time.time()

    def fp16kv_attention(module, query, key, value, attention_mask, **kw):
        return eager_attention_forward(module, query, key.half().float(), value.half().float(), attention_mask, **kw)
    AttentionInterface.register("kvb_fp16kv", fp16kv_attention)
    AttentionMaskInterface.register("kvb_fp16kv", eager_mask)

    def int8_input(module, args):
        """kvbatch's input quantization (matmul_scalar.c quantize()), as a round trip."""
        x = args[0]
        blocks = x.reshape(*x.shape[:-1], -1, 32)
        d = blocks.abs().amax(-1, keepdim=True) / 127.0
        inv = torch.where(d != 0, 1.0 / torch.where(d != 0, d, torch.ones_like(d)), torch.zeros_like(d))
        q = torch.round(torch.clamp(blocks * inv, -127.0, 127.0))
        return ((q * d).reshape(x.shape),) + tuple(args[1:])

    def forward(model, ids, emulate):
        hooks = []
        if emulate:
            model.set_attn_implementation("kvb_fp16kv")
            hooks = [m.register_forward_pre_hook(int8_input) for m in model.modules()
                     if isinstance(m, torch.nn.Linear)]
        else:
            model.set_attn_implementation("eager")
        try:
            with torch.inference_mode():
                return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].double().numpy()
        finally:
            for h in hooks:
                h.remove()

    def metrics(ref, got):
        d = np.abs(got - ref)
        return float(d.max()), float(((got - ref) ** 2).sum() / (ref ** 2).sum()), ref.argmax(1) == got.argmax(1)

    n_vocab = hfref_gguf.vocab_size()
    hp = dict(CFG, vocab_size=n_vocab)
    shapes = LlamaForCausalLM(LlamaConfig(**hp)).state_dict()
    shapes = [(k, tuple(v.shape)) for k, v in shapes.items() if not k.endswith("inv_freq")]
    failures, table = [], []
    with tempfile.TemporaryDirectory(prefix="kvb_quantmodel_") as tmp:
        out = os.path.join(tmp, "logits.f32")
        for ti, qtype in enumerate(TYPES + [t for t in only if t not in TYPES]):
            if only and qtype not in only:
                continue
            t0 = time.time()
            # the test's own packer writes what gguf-py reads (a wrong layout dequantizes to noise, NMSE ~1)
            pack_nmse = quant_pack.check(qtype)
            if not pack_nmse < 0.2:
                failures.append("%s: gguf-py reads tests/quant_pack.py's blocks back at NMSE %.3g" % (qtype, pack_nmse))
            name = "quant-%s.gguf" % qtype
            path = os.path.join(tmp, name)
            write_gguf(path, hp, random_state(np, shapes, 500 + ti), qtype)
            model = LlamaForCausalLM.from_pretrained(tmp, gguf_file=name, dtype=torch.float32).eval()
            ids = np.random.default_rng(ti).integers(0, n_vocab, N_TOK).tolist()
            ref = forward(model, ids, False)
            emu = forward(model, ids, True)
            d_emu, n_emu, _ = metrics(ref, emu)
            if not 0 < n_emu < 1e-2:
                failures.append("%s: the emulated reference is %.3g NMSE from the exact one: broken, or not "
                                "rounding at all" % (qtype, n_emu))
            tol_d, tol_n = D_MARGIN * d_emu, N_MARGIN * n_emu
            # a layout mistake the bar must see: every 32-block of every weight reversed
            with torch.no_grad():
                saved = {}
                for pname, p in model.named_parameters():
                    if p.ndim == 2:
                        saved[pname] = p.detach().clone()
                        p.copy_(p.reshape(p.shape[0], -1, 32).flip(-1).reshape(p.shape))
                d_bad, _, _ = metrics(ref, forward(model, ids, False))
                for pname, p in model.named_parameters():
                    if pname in saved:
                        p.copy_(saved[pname])
            if d_bad <= SENSITIVITY * tol_d:
                failures.append("%s: reversed blocks move the reference only %.3g (bar %.3g): this case cannot "
                                "tell a layout mistake" % (qtype, d_bad, tol_d))
            srt = np.sort(ref, 1)
            clear = srt[:, -1] - srt[:, -2] > 2 * tol_d
            for impl in ("simd", "scalar"):
                cmd = [kvb, "logits", "--model", path, "--prompt-ids", " ".join(map(str, ids)), "--out", out,
                       "--threads", "2"] + (["--scalar"] if impl == "scalar" else [])
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                if p.returncode != 0:
                    failures.append("%s %s: kvbatch logits exited %d: %s" % (qtype, impl, p.returncode,
                                                                             p.stderr.strip()[-300:]))
                    table.append((qtype, impl) + (None,) * 5 + (d_emu, n_emu, d_bad, "FAIL"))
                    continue
                got = np.fromfile(out, dtype="<f4").astype(np.float64)
                if got.size != N_TOK * n_vocab:
                    failures.append("%s %s: %d floats, expected %d" % (qtype, impl, got.size, N_TOK * n_vocab))
                    continue
                got = got.reshape(N_TOK, n_vocab)
                d, n, top1 = metrics(ref, got)
                _, n_vs_emu, _ = metrics(emu, got)
                bad_top1 = int((clear & ~top1).sum())
                ok = d <= tol_d and n <= tol_n and bad_top1 == 0
                if not ok:
                    failures.append("%s %s: max|d| %.3g (bar %.3g), NMSE %.3g (bar %.3g), top-1 wrong at %d clear "
                                    "positions" % (qtype, impl, d, tol_d, n, tol_n, bad_top1))
                table.append((qtype, impl, d, n, top1.mean(), n_vs_emu, time.time() - t0, d_emu, n_emu, d_bad,
                              "ok" if ok else "FAIL"))

    print("\ntransformers %s (its GGUF loader, gguf-py dequantization), torch %s; %d positions, vocab %d"
          % (transformers.__version__, torch.__version__, N_TOK, n_vocab))
    print("%-7s %-6s %9s %9s %7s %11s | %9s %9s %9s  %-6s"
          % ("type", "kernel", "max|d|", "NMSE", "top-1", "NMSE v emu", "emu d", "emu NMSE", "rev d", "status"))
    g = lambda x: "-" if x is None else "%.3g" % x  # noqa: E731
    for r in table:
        print("%-7s %-6s %9s %9s %7s %11s | %9s %9s %9s  %-6s"
              % (r[0], r[1], g(r[2]), g(r[3]), "-" if r[4] is None else "%.4f" % r[4], g(r[5]), g(r[7]), g(r[8]),
                 g(r[9]), r[10]))
    print("max|d|, NMSE, top-1: kvbatch against transformers float32; NMSE v emu: against the reference with\n"
          "kvbatch's int8 inputs and fp16 K/V emulated (for information); emu d / NMSE: that emulation against the\n"
          "exact reference (bars: %g x max|d|, %g x NMSE); rev d: max|d| of the reference with every weight block\n"
          "reversed (must exceed %g bars)" % (D_MARGIN, N_MARGIN, SENSITIVITY))
    print("total %.1fs" % (time.time() - t_start))
    if failures:
        print("\nFAIL:\n  " + "\n  ".join(failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
