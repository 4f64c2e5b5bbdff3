"""pytest_quant.py — quant_dequant_row against gguf-py's numpy dequantizers.

An independent reference for the block layouts: for every type kvbatch
supports, random blocks (with finite f16 scales) are dequantized by gguf-py
and by the C reference (through `test_quant dequant TYPE N`, built beside
kvbatch), and must agree bit for bit. Skips (77) when numpy or gguf is not
installed or the test binary is not built.
"""
import os
import subprocess
import sys

try:
    import numpy as np
    import gguf
    from gguf import quants
except ImportError:
    print("SKIP: numpy and gguf (pip install gguf) are needed")
    sys.exit(77)

BIN = os.path.join(os.path.dirname(os.environ.get("KVB_BIN", "")), "test_quant")
if not os.path.exists(BIN):
    print(f"SKIP: {BIN} not built")
    sys.exit(77)

# ggml type codes (dtype.h) by gguf-py name
TYPES = {"F16": 1, "BF16": 30, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
         "Q4_K": 12, "Q6_K": 14, "Q2_K": 10, "Q3_K": 11, "Q5_K": 13, "IQ4_NL": 20, "IQ4_XS": 23}
# byte offsets of f16 fields to overwrite with finite values: scale, then min
HALF_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
               "Q4_K": [0, 2], "Q6_K": [208], "Q2_K": [80, 82], "Q3_K": [108], "Q5_K": [0, 2],
               "IQ4_NL": [0], "IQ4_XS": [0]}


def half_bytes(v):
    return np.frombuffer(np.float16(v).tobytes(), dtype=np.uint8)


def main():
    rng = np.random.default_rng(7)
    failures = 0
    for name, code in TYPES.items():
        qt = gguf.GGMLQuantizationType[name]
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qt]
        n = block_elems * 96 if block_elems > 1 else 1000
        if name == "F16":
            raw = np.float16(rng.uniform(-4, 4, n)).view(np.uint8)
        elif name == "BF16":
            raw = (np.float32(rng.uniform(-4, 4, n)).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        else:
            raw = rng.integers(0, 256, n // block_elems * block_bytes, dtype=np.uint8)
            blocks = raw.reshape(-1, block_bytes)
            for blk in blocks:
                for off in HALF_FIELDS[name]:
                    blk[off:off + 2] = half_bytes(rng.uniform(-0.05, 0.05))
        data = raw.tobytes()
        want = quants.dequantize(np.frombuffer(data, dtype=np.uint8), qt).astype(np.float32).reshape(-1)
        res = subprocess.run([BIN, "dequant", str(code), str(n)], input=data, capture_output=True)
        if res.returncode != 0:
            print(f"{name}: test_quant dequant failed with {res.returncode}")
            failures += 1
            continue
        got = np.frombuffer(res.stdout, dtype=np.float32)
        if got.shape != want.shape or not np.array_equal(got, want):
            bad = np.flatnonzero(got != want) if got.shape == want.shape else []
            print(f"{name}: differs from gguf-py at {len(bad)} elements, first {bad[:5]}")
            failures += 1
        else:
            print(f"{name}: {n} elements bit-identical to gguf-py")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
