"""Independent numpy reference of the llama-family forward pass (kvbatch test oracle).

Reads a GGUF with the PyPI `gguf` package, dequantizes every tensor once to
float32 and runs the transformer in float32 numpy.  Deliberately shares no code
with kvbatch.  act_q8=True additionally rounds each matmul input to int8 per
32-block, as llama.cpp-style kernels do (used to measure that noise floor).
Also holds a small byte-level BPE tokenizer (GPT-2 style, smollm pre-tokenizer,
no special tokens) and a detokenizer, for standalone use and a tokenizer cross-check.

RoPE pairing: llama GGUFs (convert_hf_to_gguf permutes Q/K) want the interleaved
"NORM" pairs (x[2i], x[2i+1]).  Checked on SmolLM2-135M: perplexity of three texts
23.3 / 2.4 / 13.9 with NORM vs 63.3 / 11.8 / 21.6 with the NeoX half split.

    python3 tests/refmodel.py MODEL.gguf "The capital of France is"   # greedy demo

    m = RefModel(path)
    logits = m.forward(ids)            # [len(ids), n_vocab], fresh sequence
    out = m.greedy(ids, 32)            # greedy continuation, with a KV cache
"""
import numpy as np
import gguf


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


class RefModel:
    def __init__(self, path, rope="norm", act_q8=False):
        r = gguf.GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch != "llama":
            raise ValueError(f"refmodel: only llama is supported, not {arch}")
        hp = lambda k, d=None: _field(r, f"{arch}.{k}", d)
        self.n_layer = int(hp("block_count"))
        self.n_embd = int(hp("embedding_length"))
        self.n_head = int(hp("attention.head_count"))
        self.n_head_kv = int(hp("attention.head_count_kv", self.n_head))
        self.head_dim = self.n_embd // self.n_head
        self.n_rot = int(hp("rope.dimension_count", self.head_dim))
        self.freq_base = float(hp("rope.freq_base", 10000.0))
        self.eps = float(hp("attention.layer_norm_rms_epsilon"))
        self.rope = rope  # "norm": pairs (x[2i], x[2i+1]); "neox": pairs (x[i], x[i+d/2])
        self.act_q8 = act_q8  # mimic llama.cpp: round matmul inputs to int8 per 32-block
        self.kv_of = np.arange(self.n_head) // (self.n_head // self.n_head_kv)  # GQA: q head -> kv head
        # Dequantize everything once. numpy rows = GGUF ne[1]: weight matrices are [out, in].
        self.w = {t.name: np.ascontiguousarray(
                      gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
                  for t in r.tensors}
        self.tok_embd = self.w["token_embd.weight"]
        self.out_w = self.w.get("output.weight", self.tok_embd)  # tied if absent
        self.n_vocab = self.tok_embd.shape[0]
        self.tokens = list(_field(r, "tokenizer.ggml.tokens"))
        self.merges = list(_field(r, "tokenizer.ggml.merges", []))
        self.eos = _field(r, "tokenizer.ggml.eos_token_id")

    # ---- building blocks -------------------------------------------------
    def mm(self, x, w):
        """x @ w.T; with act_q8, x is first quantized to int8 with one scale per 32 values
        (amax/127, round half to even), as llama.cpp-style integer dot products do."""
        if self.act_q8:
            b = x.reshape(-1, 32)
            d = np.abs(b).max(1, keepdims=True) / np.float32(127)
            x = (np.rint(b * (1 / np.where(d > 0, d, np.inf))) * d).reshape(x.shape)
        return x @ w.T

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def apply_rope(self, x, pos):
        """x: [T, n_heads, head_dim], pos: [T]. Rotates the first n_rot dims."""
        half = self.n_rot // 2
        theta = self.freq_base ** (-2.0 * np.arange(half) / self.n_rot)     # [half]
        ang = pos[:, None].astype(np.float64) * theta[None, :]             # [T, half]
        cos = np.cos(ang)[:, None, :].astype(np.float32)
        sin = np.sin(ang)[:, None, :].astype(np.float32)
        x = x.copy()
        if self.rope == "norm":
            a, b = x[..., 0:self.n_rot:2].copy(), x[..., 1:self.n_rot:2].copy()
            x[..., 0:self.n_rot:2] = a * cos - b * sin
            x[..., 1:self.n_rot:2] = a * sin + b * cos
        else:
            a, b = x[..., :half].copy(), x[..., half:self.n_rot].copy()
            x[..., :half] = a * cos - b * sin
            x[..., half:self.n_rot] = a * sin + b * cos
        return x

    def new_cache(self):
        return [{"k": np.zeros((0, self.n_head_kv, self.head_dim), np.float32),
                 "v": np.zeros((0, self.n_head_kv, self.head_dim), np.float32)}
                for _ in range(self.n_layer)]

    # ---- forward ----------------------------------------------------------
    def forward(self, ids, cache=None):
        """Run ids (appended after whatever `cache` holds); return logits [T, n_vocab]."""
        if cache is None:
            cache = self.new_cache()
        T, hd = len(ids), self.head_dim
        p0 = cache[0]["k"].shape[0]
        pos = np.arange(p0, p0 + T)
        x = self.tok_embd[np.asarray(ids)]                 # [T, n_embd]; all float32
        # causal mask over [T, p0+T]: query t sees keys 0..p0+t
        mask = np.arange(p0 + T)[None, :] > pos[:, None]
        for l in range(self.n_layer):
            W = lambda n: self.w[f"blk.{l}.{n}.weight"]
            h = self.rmsnorm(x, W("attn_norm"))
            q = self.mm(h, W("attn_q")).reshape(T, self.n_head, hd)
            k = self.mm(h, W("attn_k")).reshape(T, self.n_head_kv, hd)
            v = self.mm(h, W("attn_v")).reshape(T, self.n_head_kv, hd)
            q, k = self.apply_rope(q, pos), self.apply_rope(k, pos)
            c = cache[l]
            c["k"] = np.concatenate([c["k"], k])
            c["v"] = np.concatenate([c["v"], v])
            K = c["k"][:, self.kv_of, :].transpose(1, 0, 2)                 # [H, S, hd]
            V = c["v"][:, self.kv_of, :].transpose(1, 0, 2)
            s = np.einsum("thd,hsd->hts", q, K) * float(hd) ** -0.5             # [H, T, S]
            s = np.where(mask[None], -np.inf, s)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hts,hsd->thd", s, V).reshape(T, self.n_embd)
            x = x + self.mm(o, W("attn_output"))
            h = self.rmsnorm(x, W("ffn_norm"))
            g = self.mm(h, W("ffn_gate"))
            x = x + self.mm(g / (1.0 + np.exp(-g)) * self.mm(h, W("ffn_up")), W("ffn_down"))
        x = self.rmsnorm(x, self.w["output_norm.weight"])
        return self.mm(x, self.out_w)

    def greedy(self, ids, n, stop_at_eos=True):
        """Greedy continuation of ids: up to n new token ids (KV-cached decode)."""
        cache = self.new_cache()
        logits = self.forward(ids, cache)
        out = []
        for _ in range(n):
            t = int(np.argmax(logits[-1]))
            out.append(t)
            if stop_at_eos and t == self.eos:
                break
            logits = self.forward([t], cache)
        return out

    # ---- tokenizer (byte-level BPE) and detokenizer -----------------------
    @staticmethod
    def _byte_map():
        bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        cs, n = bs[:], 0
        for b in range(256):
            if b not in bs:
                bs.append(b); cs.append(256 + n); n += 1
        return dict(zip(bs, map(chr, cs)))

    def detokenize(self, ids):
        inv = {c: b for b, c in self._byte_map().items()}
        s = "".join(self.tokens[i] for i in ids)
        return bytes(inv.get(ch, ord("?")) for ch in s).decode("utf-8", "replace")

    def tokenize(self, text):
        import regex  # smollm pre-tokenizer: single digits, then the GPT-2 pattern
        pat = (r"\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+"
               r"| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
        bm = self._byte_map()
        vocab = {t: i for i, t in enumerate(self.tokens)}
        rank = {tuple(m.split(" ", 1)): i for i, m in enumerate(self.merges)}
        ids = []
        for piece in regex.findall(pat, text):
            w = [bm[b] for b in piece.encode("utf-8")]
            while len(w) > 1:
                pairs = [(rank.get((w[i], w[i + 1]), 1 << 30), i) for i in range(len(w) - 1)]
                r, i = min(pairs)
                if r == 1 << 30:
                    break
                w = w[:i] + [w[i] + w[i + 1]] + w[i + 2:]
            ids += [vocab[t] for t in w]
        return ids


if __name__ == "__main__":
    import sys, time
    t0 = time.time()
    m = RefModel(sys.argv[1], rope=(sys.argv[3] if len(sys.argv) > 3 else "norm"))
    ids = m.tokenize(sys.argv[2] if len(sys.argv) > 2 else "The capital of France is")
    print("load %.1fs ids %s" % (time.time() - t0, ids))
    out = m.greedy(ids, 32)
    print(out)
    print(repr(m.detokenize(ids + out)), "%.1fs" % (time.time() - t0))
