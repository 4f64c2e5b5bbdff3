"""quant_pack.py — numpy quantizers that write ggml blocks of the types gguf-py
can read but not write (Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS), for tests that need
whole quantized matrices (tests/pytest_quant_model.py).

They are test tooling, not llama.cpp's quantizers: plain round-to-nearest with
one scale (and min) per sub-block taken from its range, no error search. What
matters is only that they produce valid blocks whose values resemble the
weights: the tests compare kvbatch with gguf-py's dequantization of the very
same bytes, so the quality of the rounding does not enter. The layouts are
ggml's (ggml-common.h), as gguf-py's dequantize_blocks reads them; check()
holds each packer to that reader.
"""
import numpy as np

QK_K = 256
IQ4_GRID = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)


def _f16(v):
    """(bytes of v as f16, v rounded to f16 as float32)."""
    h = np.asarray(v, dtype=np.float16)
    return h.view(np.uint8).reshape(*h.shape, 2), h.astype(np.float32)


def _div(a, b):
    """a / b, 0 where b is 0."""
    b = np.asarray(b, dtype=np.float32)
    return np.where(b != 0, a / np.where(b != 0, b, 1), 0).astype(np.float32)


def _k_scales_pack(sc, m):
    """Q4_K/Q5_K's 12 bytes for 8 six-bit scales and mins, (nb, 8) each."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    for j in range(4):
        out[:, j] = sc[:, j] | (sc[:, j + 4] >> 4) << 6
        out[:, j + 4] = m[:, j] | (m[:, j + 4] >> 4) << 6
        out[:, j + 8] = (sc[:, j + 4] & 15) | (m[:, j + 4] & 15) << 4
    return out


def _sub_min_scale(x, levels):
    """Per sub-block (last axis): a min <= 0 and a scale spanning the range
    with `levels` steps."""
    mn = np.minimum(x.min(axis=-1), 0)
    return -mn, (x.max(axis=-1) - mn) / levels


def _crumbs_pack(q):
    """(nb, 256) 2-bit values -> (nb, 64) bytes, Q2_K's qs layout: element
    128n + 32j + l in bits 2j of byte 32n + l."""
    q = q.reshape(-1, 2, 4, 32).astype(np.uint8)
    out = np.zeros((q.shape[0], 2, 32), dtype=np.uint8)
    for j in range(4):
        out |= (q[:, :, j] & 3) << (2 * j)
    return out.reshape(-1, 64)


def q5_k(x):
    x = x.reshape(-1, 8, 32).astype(np.float32)
    mneg, scale = _sub_min_scale(x, 31)
    d_b, d = _f16(scale.max(axis=1) / 63)
    dm_b, dmin = _f16(mneg.max(axis=1) / 63)
    sc = np.clip(np.rint(_div(scale, d[:, None])), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(_div(mneg, dmin[:, None])), 0, 63).astype(np.uint8)
    deff, meff = d[:, None] * sc, dmin[:, None] * m
    q = np.clip(np.rint(_div(x + meff[..., None], deff[..., None])), 0, 31).astype(np.uint8)
    qs = (q[:, 0::2] & 15) | (q[:, 1::2] & 15) << 4  # (nb, 4, 32): chunk c = sub-blocks 2c, 2c+1
    qh = np.zeros((x.shape[0], 32), dtype=np.uint8)
    for s in range(8):
        qh |= ((q[:, s] >> 4) & 1) << s
    return np.concatenate([d_b, dm_b, _k_scales_pack(sc, m), qh, qs.reshape(-1, 128)], axis=1)


def q2_k(x):
    x = x.reshape(-1, 16, 16).astype(np.float32)
    mneg, scale = _sub_min_scale(x, 3)
    d_b, d = _f16(scale.max(axis=1) / 15)
    dm_b, dmin = _f16(mneg.max(axis=1) / 15)
    sc = np.clip(np.rint(_div(scale, d[:, None])), 0, 15).astype(np.uint8)
    m = np.clip(np.rint(_div(mneg, dmin[:, None])), 0, 15).astype(np.uint8)
    deff, meff = d[:, None] * sc, dmin[:, None] * m
    q = np.clip(np.rint(_div(x + meff[..., None], deff[..., None])), 0, 3).astype(np.uint8)
    return np.concatenate([sc | m << 4, _crumbs_pack(q.reshape(-1, 256)), d_b, dm_b], axis=1)


def _signed_scale(x, extreme):
    """Per sub-block: the signed scale that maps its largest-magnitude element
    to `extreme` (negative: the wider side of an asymmetric grid), so that
    negative scales occur as often as positive ones."""
    i = np.abs(x).argmax(axis=-1)
    return np.take_along_axis(x, i[..., None], axis=-1)[..., 0] / extreme


def q3_k(x):
    x = x.reshape(-1, 16, 16).astype(np.float32)
    s = _signed_scale(x, -4.0)
    d_b, d = _f16(np.abs(s).max(axis=1) / 32)
    ls = np.clip(np.rint(_div(s, d[:, None])), -32, 31).astype(np.int32)
    q = np.clip(np.rint(_div(x, (d[:, None] * ls)[..., None])), -4, 3).astype(np.int32) + 4  # 0..7
    u = (ls + 32).astype(np.uint8)
    scales = np.zeros((x.shape[0], 12), dtype=np.uint8)
    for i in range(16):
        scales[:, i % 8] |= (u[:, i] & 15) << (4 * (i // 8))
        scales[:, 8 + i % 4] |= ((u[:, i] >> 4) & 3) << (2 * (i // 4))
    q = q.reshape(-1, 256)
    hmask = np.zeros((x.shape[0], 32), dtype=np.uint8)
    for k in range(8):
        hmask |= ((q[:, 32 * k:32 * k + 32] >> 2) & 1).astype(np.uint8) << k
    return np.concatenate([hmask, _crumbs_pack(q & 3), scales, d_b], axis=1)


def _iq4_index(x, dl):
    """Nearest grid index of each element of x (..., 32) at scale dl (...)."""
    return np.abs(dl[..., None, None] * IQ4_GRID - x[..., None]).argmin(axis=-1).astype(np.uint8)


def iq4_nl(x):
    x = x.reshape(-1, 32).astype(np.float32)
    d_b, d = _f16(_signed_scale(x, -127.0))
    idx = _iq4_index(x, d)
    return np.concatenate([d_b, idx[:, :16] | idx[:, 16:] << 4], axis=1)


def iq4_xs(x):
    x = x.reshape(-1, 8, 32).astype(np.float32)
    s = _signed_scale(x, -127.0)
    d_b, d = _f16(np.abs(s).max(axis=1) / 32)
    ls = np.clip(np.rint(_div(s, d[:, None])), -32, 31).astype(np.int32)
    idx = _iq4_index(x, d[:, None] * ls)
    u = (ls + 32).astype(np.uint16)
    sh = np.zeros(x.shape[0], dtype=np.uint16)
    sl = np.zeros((x.shape[0], 4), dtype=np.uint8)
    for ib in range(8):
        sl[:, ib // 2] |= ((u[:, ib] & 15) << (4 * (ib % 2))).astype(np.uint8)
        sh |= ((u[:, ib] >> 4) & 3) << (2 * ib)
    qs = (idx[:, :, :16] | idx[:, :, 16:] << 4).reshape(-1, 128)
    return np.concatenate([d_b, sh.view(np.uint8).reshape(-1, 2), sl, qs], axis=1)


PACKERS = {"Q2_K": q2_k, "Q3_K": q3_k, "Q5_K": q5_k, "IQ4_NL": iq4_nl, "IQ4_XS": iq4_xs}


def quantize(w, name):
    """w (rows, n_in) float -> (rows, row_bytes) uint8 blocks of type `name`."""
    import gguf
    qt = gguf.GGMLQuantizationType[name]
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qt]
    rows, n_in = w.shape
    if n_in % block_elems:
        raise ValueError("%s rows of %d: not whole blocks of %d" % (name, n_in, block_elems))
    if name in PACKERS:
        b = PACKERS[name](np.ascontiguousarray(w, dtype=np.float32))
    else:  # a type gguf-py writes itself
        b = gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), qt).reshape(-1, block_bytes)
    assert b.shape == (rows * n_in // block_elems, block_bytes), (name, b.shape)
    return b.reshape(rows, -1)


def check(name, rows=64, n_in=512, seed=0):
    """NMSE of gguf-py's dequantization of quantize(w) against w: small when
    the packer writes the layout gguf-py reads."""
    import gguf
    w = np.random.default_rng(seed).standard_normal((rows, n_in)).astype(np.float32)
    got = gguf.quants.dequantize(quantize(w, name), gguf.GGMLQuantizationType[name]).reshape(rows, n_in)
    return float(((got - w) ** 2).sum() / (w ** 2).sum())
