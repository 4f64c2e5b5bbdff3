"""pytest_truncate.py — scripts/gguf-truncate.py against gguf-py's reader.

The truncated copy of the real model (what gpu-check carries to the GPU
machine) must hold exactly the source's metadata but for block_count, and
exactly its tensors of the kept layers, same types, shapes and bytes; and
kvbatch must load it and generate. Skips (77) without the model, numpy or
gguf (pip install gguf).
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from gguf import GGUFReader
except ImportError:
    print("SKIP: numpy and gguf (pip install gguf) are needed")
    sys.exit(77)

MODEL = os.environ.get("KVB_MODEL", "")
SRC_DIR = os.environ.get("KVB_SOURCE_DIR", os.path.join(os.path.dirname(__file__), ".."))
BIN = os.environ.get("KVB_BIN", "")
KEEP = 3


def fields(reader):
    out = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        out[name] = [bytes(f.parts[i].tobytes()) for i in f.data]
    return out


def main():
    if not os.path.exists(MODEL):
        print(f"SKIP: model {MODEL!r} not fetched (scripts/fetch-model.sh)")
        return 77
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        dst = os.path.join(tmp, "cut.gguf")
        subprocess.run([sys.executable, os.path.join(SRC_DIR, "scripts", "gguf-truncate.py"), MODEL, dst, str(KEEP)],
                       check=True)
        a, b = GGUFReader(MODEL), GGUFReader(dst)
        fa, fb = fields(a), fields(b)
        arch = bytes(a.fields["general.architecture"].parts[-1]).decode()
        key = f"{arch}.block_count"
        if int(b.fields[key].parts[-1][0]) != KEEP:
            failures.append(f"{key} is {b.fields[key].parts[-1][0]}, not {KEEP}")
        for name in set(fa) | set(fb):
            if name != key and fa.get(name) != fb.get(name):
                failures.append(f"metadata {name} differs")
        want = {t.name: t for t in a.tensors
                if not (t.name.startswith("blk.") and int(t.name.split(".")[1]) >= KEEP)}
        got = {t.name: t for t in b.tensors}
        if set(want) != set(got):
            failures.append(f"tensors: missing {sorted(set(want) - set(got))[:3]}, extra {sorted(set(got) - set(want))[:3]}")
        for name in set(want) & set(got):
            ta, tb = want[name], got[name]
            if ta.tensor_type != tb.tensor_type or list(ta.shape) != list(tb.shape) or \
                    not np.array_equal(np.asarray(ta.data).view(np.uint8), np.asarray(tb.data).view(np.uint8)):
                failures.append(f"tensor {name} differs")
        print(f"{len(got)} of {len(a.tensors)} tensors kept, all identical to the source: {not failures}")
        if os.path.exists(BIN):
            job, out = os.path.join(tmp, "job.jsonl"), os.path.join(tmp, "out.jsonl")
            with open(job, "w") as f:
                f.write(json.dumps({"custom_id": "a", "prompt": "The capital of France is", "max_tokens": 4}) + "\n")
            r = subprocess.run([BIN, "run", "-m", dst, "-i", job, "-o", out, "--no-cache", "--device", "cpu", "-q"])
            ok = r.returncode == 0 and '"status_code":200' in open(out).read()
            print(f"kvbatch run on the truncated model: {'ok' if ok else 'FAILED'}")
            if not ok:
                failures.append("kvbatch could not run the truncated model")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
