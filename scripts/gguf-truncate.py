#!/usr/bin/env python3
"""gguf-truncate.py — a GGUF with only the first N transformer layers.

    scripts/gguf-truncate.py SRC DST N

Copies SRC's metadata (with <arch>.block_count set to N) and its tensors,
except those of layers N and up ("blk.<i>." with i >= N), byte for byte and
in their stored types. The result is a smaller model with real weights, a
real tokenizer and real norms — its text is not meaningful, but the CUDA
and CPU backends can be compared on it where the full file is too big to
travel (scripts/gpu-check.sh --fetch-deps makes one from SmolLM2 for the
GPU machine, whose upload is limited).

Only GGUF versions 2 and 3 (little-endian) are read. Exit status 1 with a
message naming the problem when SRC is not such a file or N is out of range.
"""
import re
import struct
import sys

# value type -> struct format of a scalar (8 = string, 9 = array)
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, data):
        self.d = data
        self.p = 0

    def take(self, n):
        if self.p + n > len(self.d):
            raise ValueError(f"truncated file at byte {self.p}")
        b = self.d[self.p:self.p + n]
        self.p += n
        return b

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def string(self):
        return self.take(self.u64()).decode("utf-8")

    def skip_value(self, vtype):
        if vtype in SCALAR:
            self.take(struct.calcsize(SCALAR[vtype]))
        elif vtype == 8:
            self.take(self.u64())
        elif vtype == 9:
            itype, n = self.u32(), self.u64()
            for _ in range(n):
                self.skip_value(itype)
        else:
            raise ValueError(f"unknown value type {vtype} at byte {self.p}")


def gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def main(argv):
    if len(argv) != 4:
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    src, dst, keep = argv[1], argv[2], int(argv[3])
    data = open(src, "rb").read()
    r = Reader(data)
    if r.take(4) != b"GGUF":
        raise ValueError("not a GGUF file (bad magic)")
    version = r.u32()
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (2 or 3 expected)")
    n_tensors, n_kv = r.u64(), r.u64()

    kvs = []  # (key, raw bytes of type + value)
    arch, alignment, block_count_key = None, 32, None
    for _ in range(n_kv):
        key = r.string()
        start = r.p
        vtype = r.u32()
        vstart = r.p
        r.skip_value(vtype)
        raw = data[start:r.p]
        if key == "general.architecture":
            arch = data[vstart + 8:r.p].decode("utf-8")
        if key == "general.alignment":
            alignment = struct.unpack(SCALAR[vtype], data[vstart:r.p])[0]
        kvs.append([key, raw])
    if arch is None:
        raise ValueError("no general.architecture")
    block_count_key = f"{arch}.block_count"
    for kv in kvs:
        if kv[0] == block_count_key:
            vtype = struct.unpack("<I", kv[1][:4])[0]
            n_layer = struct.unpack(SCALAR[vtype], kv[1][4:])[0]
            if not 1 <= keep <= n_layer:
                raise ValueError(f"keeping {keep} of {n_layer} layers")
            kv[1] = kv[1][:4] + struct.pack(SCALAR[vtype], keep)
            break
    else:
        raise ValueError(f"no {block_count_key}")

    infos = []  # (name, raw info without offset, offset)
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.u32()
        dims = [r.u64() for _ in range(n_dims)]
        ttype = r.u32()
        offset = r.u64()
        infos.append((name, n_dims, dims, ttype, offset))
    data_start = (r.p + alignment - 1) // alignment * alignment
    ends = sorted(i[4] for i in infos) + [len(data) - data_start]
    span = {off: ends[ends.index(off) + 1] - off for off in sorted(i[4] for i in infos)}

    layer = re.compile(r"blk\.(\d+)\.")
    kept = [i for i in infos if not (m := layer.match(i[0])) or int(m.group(1)) < keep]

    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(kept), len(kvs)))
    for key, raw in kvs:
        out += gguf_string(key) + raw
    offset = 0
    placed = []
    for name, n_dims, dims, ttype, old in kept:
        out += gguf_string(name) + struct.pack("<I", n_dims) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ttype, offset)
        placed.append((old, offset))
        offset += (span[old] + alignment - 1) // alignment * alignment
    out += b"\0" * ((alignment - len(out) % alignment) % alignment)
    base = len(out)
    out += b"\0" * offset
    for old, new in placed:
        chunk = data[data_start + old:data_start + old + span[old]]
        out[base + new:base + new + len(chunk)] = chunk
    open(dst, "wb").write(out)
    print(f"{dst}: {keep} of {n_layer} layers, {len(kept)} of {n_tensors} tensors, {len(out) / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except (OSError, ValueError, struct.error) as e:
        sys.stderr.write(f"gguf-truncate: {e}\n")
        sys.exit(1)
