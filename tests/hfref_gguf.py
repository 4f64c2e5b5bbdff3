"""hfref_gguf.py — writes a GGUF from a Hugging Face config and state dict the
way llama.cpp's convert_hf_to_gguf.py does, for the architectures kvbatch runs
(LlamaForCausalLM → llama, Qwen2ForCausalLM → qwen2, Qwen3ForCausalLM → qwen3,
Gemma2ForCausalLM → gemma2, Gemma3ForCausalLM → gemma3).

It is the converter's behaviour for these configs, written out step by step so
that tests/pytest_hf_ref.py can put one set of random weights both into a
transformers model and into kvbatch without going through either project's
loader:
  - hparams are `config.to_dict()` (what the converter reads through
    AutoConfig); the keys are those TextModel.set_gguf_parameters writes
    (block_count, context_length, embedding_length, feed_forward_length,
    head_count, head_count_kv, rope.freq_base, layer_norm_rms_epsilon,
    key_length/value_length when the config has head_dim, the rope scaling
    keys for "linear" and "yarn") plus, for llama, vocab_size and
    rope.dimension_count;
  - llama's Q and K rows are permuted (LlamaModel.permute) so that ggml's
    interleaved ("NORM") RoPE equals transformers' rotate-half;
  - llama with rope_type "llama3" gets no scaling keys but a `rope_freqs.weight`
    tensor of per-frequency divisors (LlamaModel.generate_extra_tensors; note the
    converter reads original_max_position_embeddings from the top level of the
    config, default 8192, not from rope_parameters);
  - tensor names through gguf-py's TensorNameMap; 1-D tensors and *_norm
    weights F32, the rest F32 or F16 as the file type says; a tied output
    (tie_word_embeddings) has no output.weight, as the checkpoint has no lm_head;
  - gemma2 and gemma3 (conversion/gemma.py, Gemma2Model / Gemma3Model): 1 added
    to every tensor whose name ends in "norm.weight" (Gemma's RMSNorm computes
    with 1 + weight; Gemma3Model.norm_shift, Gemma2Model.modify_tensors), no
    lm_head for gemma2 (filter_tensors drops it: the output is the embedding),
    and their own keys: gemma2 writes no RoPE base at all but the two soft-caps
    and the sliding window; gemma3 writes the full-attention RoPE base (and
    scaling), the sliding-attention base as rope.freq_base_swa (TextModel), the
    window, and final_logit_softcapping only when the config has one. Neither
    writes query_pre_attn_scalar or the layer pattern: the test's configs keep
    transformers' defaults for those (head_dim; every 6th layer global for
    gemma3, every 2nd for gemma2), which is what llama.cpp and kvbatch assume.
The tokenizer is the one thing not taken from a Hugging Face checkpoint (there is
none): a small byte-level BPE vocabulary (256 byte tokens, a few merges, a few
control tokens) in the layout _set_vocab_gpt2 writes (Gemma3Model's choice
without a tokenizer.model; Gemma2Model would want a SentencePiece model). It
only has to load; the test feeds token ids.
"""
import logging
import math

import numpy as np
import gguf

# Gemma3Model sets some keys TextModel has set: the writer says so each time.
logging.getLogger("gguf.gguf_writer").setLevel(logging.ERROR)

ARCHS = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3,
         "gemma2": gguf.MODEL_ARCH.GEMMA2, "gemma3": gguf.MODEL_ARCH.GEMMA3}
GEMMA = ("gemma2", "gemma3")
MERGE_LETTERS = "etaoinsh"
N_CONTROL = 8


def vocab_size():
    """Tokens in the vocabulary write_gguf writes: bytes, merges, control tokens."""
    n_merges = len(MERGE_LETTERS) * (len(MERGE_LETTERS) - 1)
    return 256 + n_merges + N_CONTROL


def permute(w, n_head, n_head_kv):
    """LlamaModel.permute: within each head, the rows (dim 0) of the first and
    second halves are interleaved, so that rotating pairs (2i, 2i+1) in the
    GGUF equals rotating (i, i + d/2) in Hugging Face's layout."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute(w, n_head, n_head_kv):
    """The inverse of permute (used by the test to check permute itself)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def rope_parameters(hp):
    """TextModel.__init__: rope_parameters (or rope_scaling) with rope_theta and
    rope_type mirrored into it."""
    rp = dict(hp.get("rope_parameters", hp.get("rope_scaling")) or {})
    if "full_attention" not in rp and "sliding_attention" not in rp:
        theta = next((hp[k] for k in ("global_rope_theta", "rope_global_theta", "rope_theta_global",
                                       "rope_theta", "rotary_emb_base") if k in hp), None)
        if "rope_theta" not in rp and theta is not None:
            rp["rope_theta"] = theta
        if "rope_type" not in rp and rp.get("type") is not None:
            rp["rope_type"] = rp["type"]
    return rp.get("full_attention", rp)


def llama3_rope_factors(hp, rp):
    """LlamaModel.generate_extra_tensors for rope_type llama3: the divisor of
    each RoPE frequency (1 for short wavelengths, `factor` for long ones, a
    smooth blend between)."""
    base = rp.get("rope_theta", 10000.0)
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = rp.get("factor", 8.0)
    low, high = rp.get("low_freq_factor", 1.0), rp.get("high_freq_factor", 4.0)
    old_ctx = hp.get("original_max_position_embeddings", 8192)
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _write_params_gemma2(w, hp, ftype):
    """Gemma2Model.set_gguf_parameters (it does not call TextModel's)."""
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_block_count(hp["num_hidden_layers"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(hp.get("num_key_value_heads", hp["num_attention_heads"]))
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_file_type(ftype)
    w.add_attn_logit_softcapping(hp["attn_logit_softcapping"])
    w.add_final_logit_softcapping(hp["final_logit_softcapping"])
    w.add_sliding_window(hp["sliding_window"])


def _write_params_gemma3(w, hp, ftype, scaling):
    """TextModel.set_gguf_parameters, then Gemma3Model's (which sets some keys
    again: gguf-py's writer keeps the last value)."""
    _write_params(w, "gemma3", hp, ftype, scaling)
    rp = hp["rope_parameters"]
    w.add_context_length(hp.get("max_position_embeddings", 131072))
    w.add_head_count(hp.get("num_attention_heads", 8))
    w.add_layer_norm_rms_eps(hp.get("rms_norm_eps", 1e-6))
    w.add_key_length(hp.get("head_dim", 256))
    w.add_value_length(hp.get("head_dim", 256))
    w.add_rope_freq_base(rp.get("full_attention", rp).get("rope_theta", 1_000_000.0))
    assert hp.get("attn_logit_softcapping") is None
    if hp.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(hp["final_logit_softcapping"])
    if hp.get("sliding_window_pattern") != 1:
        w.add_sliding_window(hp["sliding_window"])
    w.add_head_count_kv(hp.get("num_key_value_heads", 4))


def _write_params(w, arch, hp, ftype, scaling):
    """TextModel.set_gguf_parameters (+ LlamaModel's additions). scaling=False
    leaves out the rope scaling keys (the test's deliberately broken files)."""
    w.add_block_count(hp["num_hidden_layers"])
    if hp.get("max_position_embeddings") is not None:
        w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    if hp.get("num_key_value_heads") is not None:
        w.add_head_count_kv(hp["num_key_value_heads"])
    rp = rope_parameters(hp)
    rope_type, factor = rp.get("rope_type"), rp.get("factor")
    if scaling and rope_type == "linear" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(factor)
    elif scaling and rope_type == "yarn" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
        if rp.get("extrapolation_factor") is not None:
            w.add_rope_scaling_yarn_ext_factor(rp["extrapolation_factor"])
        attn = rp.get("attention_factor", rp.get("attn_factor"))
        if attn is not None:
            w.add_rope_scaling_yarn_attn_factor(attn)
        if rp.get("beta_fast") is not None:
            w.add_rope_scaling_yarn_beta_fast(rp["beta_fast"])
        if rp.get("beta_slow") is not None:
            w.add_rope_scaling_yarn_beta_slow(rp["beta_slow"])
    elif rope_type not in (None, "default", "linear", "yarn", "llama3"):
        raise ValueError("rope_type %r: not one the converter maps for these architectures" % rope_type)
    if rp.get("rope_theta") is not None:
        w.add_rope_freq_base(rp["rope_theta"])
    swa_theta = (hp.get("rope_parameters") or {}).get("sliding_attention", {}).get("rope_theta")
    if swa_theta is not None:
        w.add_rope_freq_base_swa(swa_theta)
    if hp.get("rms_norm_eps") is not None:
        w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    if hp.get("head_dim") is not None:
        w.add_key_length(hp["head_dim"])
        w.add_value_length(hp["head_dim"])
    w.add_file_type(ftype)
    if arch == "llama":
        w.add_vocab_size(hp["vocab_size"])
        w.add_rope_dimension_count(hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"])


def _write_vocab(w, n_vocab):
    """A byte-level BPE vocabulary as _set_vocab_gpt2 lays it out."""
    from gguf.vocab import bytes_to_unicode
    if n_vocab != vocab_size():
        raise ValueError("the vocabulary written has %d tokens, the config says %d" % (vocab_size(), n_vocab))
    byte_chr = bytes_to_unicode()
    tokens = [byte_chr[b] for b in range(256)]
    merges = ["%s %s" % (a, b) for a in MERGE_LETTERS for b in MERGE_LETTERS if a != b]
    tokens += [m.replace(" ", "") for m in merges]
    types = [gguf.TokenType.NORMAL] * len(tokens)
    tokens += ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + ["<|extra_%d|>" % i for i in range(N_CONTROL - 3)]
    types += [gguf.TokenType.CONTROL] * N_CONTROL
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(256 + len(merges))
    w.add_eos_token_id(256 + len(merges))
    w.add_add_bos_token(False)


def write_gguf(path, arch, hp, state, f16=False, scaling=True, permute_qk=True, name="hfref", norm_shift=True):
    """Writes `state` ({Hugging Face name: float32 ndarray}) with config dict
    `hp` as the converter would with --outtype f32 (or f16). scaling=False,
    permute_qk=False and norm_shift=False write deliberately wrong files (the
    test's KVB_HFREF_BREAK), everything else is the converter's."""
    march = ARCHS[arch]
    ftype = gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32
    n_head, n_kv = hp["num_attention_heads"], hp.get("num_key_value_heads")
    names = gguf.get_tensor_name_map(march, hp["num_hidden_layers"])
    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[march])
    tensors = []
    rp = rope_parameters(hp)
    gemma = arch in GEMMA
    if arch == "llama" and str(rp.get("rope_type", "")).lower() == "llama3" and scaling:
        tensors.append((gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", llama3_rope_factors(hp, rp)))
    for hf_name, data in state.items():
        if hf_name.endswith(".rotary_emb.inv_freq"):
            continue
        if hf_name == "lm_head.weight" and (hp.get("tie_word_embeddings") or arch == "gemma2"):
            continue  # a tied checkpoint stores no lm_head; Gemma2Model drops it
        data = np.asarray(data, dtype=np.float32)
        if gemma and norm_shift and hf_name.endswith("norm.weight"):
            data = data + np.float32(1.0)  # in float32, as torch adds it to the f32 checkpoint
        if arch == "llama" and permute_qk:
            if hf_name.endswith(("q_proj.weight", "q_proj.bias")):
                data = permute(data, n_head, n_head)
            if hf_name.endswith(("k_proj.weight", "k_proj.bias")):
                data = permute(data, n_head, n_kv)
        new_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise ValueError("cannot map tensor %r" % hf_name)
        tensors.append((new_name, data))
    for new_name, data in tensors:
        if data.ndim <= 1 or new_name.endswith("_norm.weight") or not f16:
            w.add_tensor(new_name, data.astype(np.float32), raw_dtype=gguf.GGMLQuantizationType.F32)
        else:
            w.add_tensor(new_name, data.astype(np.float16), raw_dtype=gguf.GGMLQuantizationType.F16)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    if arch == "gemma2":
        _write_params_gemma2(w, hp, ftype)
    elif arch == "gemma3":
        _write_params_gemma3(w, hp, ftype, scaling)
    else:
        _write_params(w, arch, hp, ftype, scaling)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _write_vocab(w, hp["vocab_size"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
