#!/usr/bin/env python3
"""The layers' edges hold (ARCHITECTURE.md; CMakeLists.txt, kvb_layer).

1. From the sources: every quoted #include of every file in a layer's folder
   names its own layer or one the layer USES in CMakeLists.txt, written with
   its folder ("engine/scheduler.h"); headers ending in _internal.h or _impl.h
   are included only from their own folder.
2. From the build: a layer's include tree (build/layers/NAME) really refuses
   the rest. For each layer, a probe that includes one header of a layer it
   may not use fails to compile against that tree ("No such file"), and one
   that includes a header of a layer it may use compiles. This is the check a
   forbidden #include meets in the build itself.

Exit 0 pass, 1 fail, 77 skipped (no build tree or no C compiler).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvbcheck import BIN, SRC, check, finish  # noqa: E402

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
GENERATED = {"kvb_build_info.h"}  # written into the build tree (cmake/build-info.cmake)


def layers_from_cmake():
    text = open(os.path.join(SRC, "CMakeLists.txt")).read()
    dirs = dict(re.findall(r"set\(KVB_LAYER_DIR_(\w+)\s+(\S+)\)", text))
    incs = dict(re.findall(r"set\(KVB_LAYER_INC_(\w+)\s+(\S+)\)", text))
    uses = {}
    for name, rest in re.findall(r"^\s*kvb_layer\((\w+)([^)]*)\)", text, re.M):
        m = re.search(r"USES\s+(.*)", rest)
        words = m.group(1).split() if m else []
        if any(w.startswith("${") for w in words):  # app: USES ${KVB_APP_USES}
            app = re.findall(r"set\(KVB_APP_USES ([^)]*)\)", text)
            extra = re.findall(r"list\(APPEND KVB_APP_USES (\w+)\)", text)
            words = (app[0].split() if app else []) + extra
        uses[name] = set(words)
    return dirs, incs, uses


def layer_of_include(inc, incs):
    """The layer an include path names, by its longest matching folder prefix."""
    best = None
    for name, prefix in incs.items():
        if inc.startswith(prefix + "/") and (best is None or len(prefix) > len(incs[best])):
            best = name
    return best


def check_sources(dirs, incs, uses):
    n_files = n_incs = 0
    for name, d in dirs.items():
        folder = os.path.join(SRC, d)
        allowed = uses.get(name, set()) | {name}
        for f in sorted(os.listdir(folder)):
            if not f.endswith((".c", ".h", ".cu")):
                continue
            n_files += 1
            for inc in INCLUDE.findall(open(os.path.join(folder, f)).read()):
                n_incs += 1
                if inc in GENERATED:
                    continue
                target = layer_of_include(inc, incs)
                if target is None:
                    check(False, f"{d}/{f}: #include \"{inc}\" is not written with a layer's folder")
                    continue
                check(target in allowed,
                      f"{d}/{f} (layer {name}) includes \"{inc}\" of layer {target}, which {name} may not use")
                if inc.endswith(("_internal.h", "_impl.h")):
                    check(target == name, f"{d}/{f} includes another layer's private header \"{inc}\"")
    print(f"sources: {n_files} files, {n_incs} includes checked against {len(uses)} layers")


def a_header(d):
    hs = sorted(f for f in os.listdir(os.path.join(SRC, d)) if f.endswith(".h") and "_internal" not in f
                and "_impl" not in f)
    return hs[0] if hs else None


def check_trees(dirs, incs, uses):
    build = os.path.dirname(os.path.abspath(BIN))
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not os.path.isdir(os.path.join(build, "layers")) or not cc:
        print("SKIP (trees): no build/layers or no C compiler")
        return False
    sysinc = [f"-I{p}" for p in ("/usr/include",)]
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in uses:
            tree = os.path.join(build, "layers", name)
            if not os.path.isdir(tree):
                continue  # cuda when not built
            allowed = uses[name] | {name}
            for other in dirs:
                h = a_header(dirs[other])
                if not h or not os.path.isdir(os.path.join(SRC, dirs[other])):
                    continue
                probe = os.path.join(tmp, "probe.c")
                open(probe, "w").write(f'#include "{incs[other]}/{h}"\nint probe_;\n')
                p = subprocess.run([cc, "-std=c11", "-D_GNU_SOURCE", "-fsyntax-only", f"-I{tree}", *sysinc, probe],
                                   capture_output=True, text=True)
                if other in allowed:
                    # cuda headers need the CUDA toolkit's own
                    if other != "cuda":
                        check(p.returncode == 0, f"layer {name} cannot include \"{incs[other]}/{h}\" it may use: "
                                                 f"{p.stderr.strip()[:300]}")
                else:
                    check(p.returncode != 0 and "No such file" in p.stderr,
                          f"layer {name} compiled an #include of \"{incs[other]}/{h}\" (layer {other}) it may not use")
                n += 1
    print(f"include trees: {n} probes (a forbidden include fails to compile, an allowed one compiles)")
    return True


def main():
    if not BIN:
        print("SKIP: no KVB_BIN")
        return 77
    dirs, incs, uses = layers_from_cmake()
    check(len(uses) >= 10 and "base" in uses and not uses["base"], f"layers not found in CMakeLists.txt: {uses}")
    check_sources(dirs, incs, uses)
    check_trees(dirs, incs, uses)
    return finish("layer")


if __name__ == "__main__":
    sys.exit(main())
