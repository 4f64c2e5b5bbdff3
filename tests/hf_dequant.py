#!/usr/bin/env python3
"""hf_dequant.py — a llama-architecture GGUF (quantized or not) as a Hugging Face
LlamaForCausalLM in float32, and the two windowed perplexities computed with it.

It is the reference for kvbatch's scoring (echo/logprobs): the same weights
kvbatch multiplies, dequantized by gguf-py (gguf.quants.dequantize, written from
ggml's own formats, not kvbatch's), run by transformers' own Llama code on the
CPU. What stays different from kvbatch is kvbatch's arithmetic: int8 activations
against quantized weights, fp16 K/V. Those are the differences the comparison
measures.

The mapping undoes what llama.cpp's convert_hf_to_gguf.py did
(tests/hfref_gguf.py writes it in that direction):
  - tensor names back through gguf-py's TensorNameMap;
  - llama's Q and K rows un-permuted (ggml's interleaved RoPE -> transformers'
    rotate-half, hfref_gguf.unpermute);
  - no output.weight in the file means tied embeddings (lm_head = token_embd).

The perplexities, both per token with natural logs (ppl = exp(-sum(logp) / n)):
  - "llama": llama.cpp's llama-perplexity (tools/perplexity, `perplexity()`):
    the tokens are cut into n_chunk = n_tok // ctx disjoint chunks of ctx tokens
    (the tail left over is dropped), the first token of each chunk replaced by
    BOS when the vocabulary adds one (SmolLM2: add_bos_token false, so not), and
    only the tokens at positions ctx/2+1 .. ctx-1 of each chunk are scored:
    ctx/2 - 1 tokens per chunk, each with at least ctx/2 tokens of context.
  - "harness": lm-evaluation-harness's loglikelihood_rolling
    (lm_eval.utils.get_rolling_token_windows with context_len=1 +
    make_disjoint_window): a prefix token (BOS, else EOS) and then every token
    of the text scored exactly once, in windows of ctx inputs; a window's
    context is only the tokens of that window (the last window is filled back
    to a full ctx).
The windows of both are written here without lm_eval (the harness's rule is a
few lines; tests/pytest_lm_eval.py checks this copy against lm_eval's own).

Usage (from the kvbatch venv; token ids from `kvbatch tokenize`, as kvbatch and
llama.cpp tokenize the same file alike):
    python tests/hf_dequant.py --model M.gguf --text FILE --ctx 512 [--method llama|harness]
    python tests/hf_dequant.py --model M.gguf --save DIR   # save_pretrained, + the GGUF's tokenizer
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hfref_gguf import unpermute  # noqa: E402


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_config(reader):
    """The LlamaConfig keyword arguments a llama GGUF's metadata says."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError("architecture %r: this reference maps llama only" % arch)
    p = "llama."
    names = {t.name for t in reader.tensors}
    n_embd = _field(reader, p + "embedding_length")
    n_head = _field(reader, p + "attention.head_count")
    n_vocab = _field(reader, p + "vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    for key in ("rope.scaling.type", "rope.scaling.factor"):
        if _field(reader, p + key) not in (None, "none", 1.0):
            raise ValueError("%s%s is set: RoPE scaling is not mapped here" % (p, key))
    if "rope_freqs.weight" in names:
        raise ValueError("rope_freqs.weight (llama3 RoPE scaling) is not mapped here")
    return dict(
        vocab_size=n_vocab,
        hidden_size=n_embd,
        intermediate_size=_field(reader, p + "feed_forward_length"),
        num_hidden_layers=_field(reader, p + "block_count"),
        num_attention_heads=n_head,
        num_key_value_heads=_field(reader, p + "attention.head_count_kv", n_head),
        head_dim=_field(reader, p + "attention.key_length", n_embd // n_head),
        max_position_embeddings=_field(reader, p + "context_length", 2048),
        rms_norm_eps=_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=_field(reader, p + "rope.freq_base", 10000.0),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
    )


def _hf_names(n_layer):
    """{GGUF tensor name: Hugging Face name} for LlamaForCausalLM."""
    out = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    per = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
           "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
           "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    for i in range(n_layer):
        for g, h in per.items():
            out["blk.%d.%s.weight" % (i, g)] = "model.layers.%d.%s.weight" % (i, h)
    return out


def dequantized_state(reader, cfg):
    """{Hugging Face name: float32 ndarray} of every tensor, Q/K un-permuted."""
    from gguf import quants
    names = _hf_names(cfg["num_hidden_layers"])
    state = {}
    for t in reader.tensors:
        if t.name not in names:
            raise ValueError("tensor %s: not a llama tensor this reference maps" % t.name)
        # gguf-py gives numpy's shape (rows first), as transformers stores a Linear's weight
        w = np.array(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)  # a copy: F32 tensors are views of the read-only map
        w = w.reshape([int(d) for d in reversed(t.shape)])
        hf = names[t.name]
        if hf.endswith("q_proj.weight"):
            w = unpermute(w, cfg["num_attention_heads"], cfg["num_attention_heads"])
        elif hf.endswith("k_proj.weight"):
            w = unpermute(w, cfg["num_attention_heads"], cfg["num_key_value_heads"])
        state[hf] = w
    return state


def load_llama(gguf_path):
    """(model, config dict): the GGUF as a float32 LlamaForCausalLM in eval mode."""
    import gguf
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    reader = gguf.GGUFReader(gguf_path)
    cfg = gguf_config(reader)
    state = dequantized_state(reader, cfg)
    kw = dict(cfg)
    kw["rope_parameters"] = {"rope_type": "default", "rope_theta": kw.pop("rope_theta")}
    config = LlamaConfig(**kw, torch_dtype="float32", attn_implementation="eager")
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    tensors = {k: torch.from_numpy(v) for k, v in state.items()}
    if cfg["tie_word_embeddings"]:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    missing = [m for m in missing if not m.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise ValueError("state dict mismatch: missing %s, unexpected %s" % (missing, unexpected))
    if cfg["tie_word_embeddings"]:
        model.tie_weights()
    # the rotary buffers were made on the meta device: make them again on the CPU
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    return model.float().eval(), cfg


def save_pretrained(gguf_path, out_dir):
    """Writes the dequantized model and the GGUF's tokenizer (transformers' GGUF
    tokenizer conversion) to out_dir, for lm_eval's `hf` model."""
    from transformers import AutoTokenizer
    model, _ = load_llama(gguf_path)
    model.save_pretrained(out_dir)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(gguf_path)),
                                        gguf_file=os.path.basename(gguf_path))
    tok.save_pretrained(out_dir)
    import gguf
    if _field(gguf.GGUFReader(gguf_path), "tokenizer.ggml.pre") in DIGIT_SPLIT_PRE:
        _split_digits_first(os.path.join(out_dir, "tokenizer.json"))
    return out_dir


# GGUF pre-tokenizer names whose checkpoints split digits one by one before the
# byte-level regex (SmolLM2's tokenizer.json: Sequence[Digits, ByteLevel]);
# transformers' GGUF conversion writes the ByteLevel step alone, and so cuts
# whitespace before a digit differently ("\n\n1": "\n" "\n" "1", not "\n\n" "1")
DIGIT_SPLIT_PRE = ("smollm", "starcoder")


def _split_digits_first(path):
    with open(path) as f:
        t = json.load(f)
    if t["pre_tokenizer"].get("type") == "ByteLevel":
        t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, t["pre_tokenizer"]]}
        with open(path, "w") as f:
            json.dump(t, f, ensure_ascii=False)


def token_logprobs(model, ids):
    """log p(ids[i] | ids[:i]) for i = 1 .. len(ids)-1, float64 ndarray."""
    import torch
    with torch.no_grad():
        logits = model(torch.tensor([ids], dtype=torch.long)).logits[0].double()
    lp = torch.log_softmax(logits[:-1], dim=-1)
    return lp.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1).numpy()


def llama_windows(tokens, ctx, bos=None):
    """llama-perplexity's chunks: [(chunk ids, first scored position)], with
    positions ctx/2+1 .. ctx-1 scored (the logits at ctx/2 .. ctx-2)."""
    out = []
    for i in range(len(tokens) // ctx):
        chunk = list(tokens[i * ctx:(i + 1) * ctx])
        if bos is not None:
            chunk[0] = bos
        out.append((chunk, ctx // 2 + 1))
    return out


def harness_windows(tokens, ctx, prefix):
    """lm_eval's rolling windows (get_rolling_token_windows(context_len=1) +
    make_disjoint_window) as [(ids to send, number of scored tokens at its end)]."""
    out = []
    if not tokens:
        return out
    first = min(ctx, len(tokens))
    out.append(([prefix] + list(tokens[:first]), first))
    done = first
    while done < len(tokens):
        n = min(len(tokens) - done, ctx)
        end = done + n
        # the window's input is tokens[end-ctx-1 : end-1]; sending it plus the last
        # predicted token scores the n tokens at its end
        out.append((list(tokens[max(0, end - ctx - 1):end]), n))
        done = end
    return out


def perplexity(model, tokens, ctx, method="llama", bos=None, prefix=None):
    """(ppl, sum of logprobs, tokens scored) by either method (module doc)."""
    total, n = 0.0, 0
    if method == "llama":
        for chunk, first in llama_windows(tokens, ctx, bos):
            lp = token_logprobs(model, chunk)
            total += float(lp[first - 1:].sum())
            n += len(chunk) - first
    elif method == "harness":
        for ids, k in harness_windows(tokens, ctx, prefix):
            lp = token_logprobs(model, ids)
            total += float(lp[-k:].sum())
            n += k
    else:
        raise ValueError("method %r: llama or harness" % method)
    return math.exp(-total / n), total, n


def kvbatch_tokens(binary, model_path, text_path):
    """The text file's token ids as kvbatch tokenizes it (no BOS, specials as text)."""
    with open(text_path, "rb") as f:
        out = subprocess.run([binary, "tokenize", "--model", model_path], stdin=f,
                             capture_output=True, check=True).stdout
    return [int(x) for x in out.split()]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(root, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--text", help="text file whose perplexity to compute")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--method", choices=("llama", "harness"), default="llama")
    ap.add_argument("--bin", default=os.path.join(root, "build", "kvbatch"), help="kvbatch, for tokenizing")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--save", metavar="DIR", help="save_pretrained the model and tokenizer into DIR")
    a = ap.parse_args()
    import torch
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.save:
        save_pretrained(a.model, a.save)
        print("saved", a.save)
        return 0
    if not a.text:
        ap.error("--text or --save")
    tokens = kvbatch_tokens(a.bin, a.model, a.text)
    model, cfg = load_llama(a.model)
    import gguf
    add_bos = _field(gguf.GGUFReader(a.model), "tokenizer.ggml.add_bos_token", False)
    bos = cfg["bos_token_id"] if add_bos else None
    prefix = cfg["bos_token_id"] if cfg["bos_token_id"] is not None else cfg["eos_token_id"]
    ppl, total, n = perplexity(model, tokens, a.ctx, a.method, bos=bos, prefix=prefix)
    print("transformers float32 ppl (%s method, ctx %d): %.4f over %d tokens (sum logprob %.4f, %d tokens in file)"
          % (a.method, a.ctx, ppl, n, total, len(tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
