#!/usr/bin/env bash
# emu.sh — runs the CUDA backend's tests on the CPU, without a GPU: the
# kernels of kernels/*.cu compiled as C++ over cuda_emu.h (threads as
# fibers, real barriers), be_cuda.c and k_gemm.c over fake_cuda.c (CUDA
# runtime and cuBLAS in host memory), linked with a CPU-only kvbcore, under
# AddressSanitizer + UBSan. It checks logic — indexing, layouts, barriers,
# the GEMM's leading dimensions against cuBLAS's definition, the backend's
# step against the CPU backend — not GPU arithmetic or speed.
#
#   kernels/emu/emu.sh [BUILD_DIR]     (default: build-emu; needs python3, g++,
#                                       the CUDA headers in $CUDA_HOME/include)
# Set KVB_MODEL to a GGUF to include the real-model comparison (slow here).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bdir=${1:-$root/build-emu}
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
san=${EMU_SANITIZE--fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined}
mkdir -p "$bdir/emu"
cmake -S "$root" -B "$bdir" -DKVBATCH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVBATCH_SANITIZE=$([ -n "$san" ] && echo ON || echo OFF) >/dev/null
cmake --build "$bdir" -j"$(nproc)" --target kvbcore >/dev/null

# kernel<<<grid, block, smem, stream>>>(args);  ->  emu_launch(grid, block, [&] { kernel(args); });
for cu in "$root"/kernels/k_*.cu; do
  python3 - "$cu" "$bdir/emu/$(basename "$cu" .cu).cc" <<'PY'
import re, sys
src = open(sys.argv[1]).read()
src = re.sub(r'#include <cuda_(fp16|bf16)\.h>\n', '', src)
pat = re.compile(r'([A-Za-z_]\w*(?:<[^<>;]*>)?)<<<([^;]*?),\s*([^;]*?),\s*[^;,]*?,\s*[^;,]*?>>>\(([^;]*)\);')
out, n = pat.subn(lambda m: 'emu_launch(%s, %s, [&] { %s(%s); });' % (m.group(2), m.group(3), m.group(1), m.group(4)), src)
if '<<<' in out:
    sys.exit('emu.sh: a launch in %s was not rewritten' % sys.argv[1])
open(sys.argv[2], 'w').write('#line 1 "%s"\n' % sys.argv[1] + out)
PY
done

flags="-O1 -g $san -D_GNU_SOURCE -DKVBATCH_HAVE_CUDA=1 -I$root/kernels -I$root/src -I$root/store -I$root/jobs -I$root/tests -I$cuda_inc -I$root/kernels/emu"
objs=()
for cc in "$bdir"/emu/k_*.cc "$root/kernels/emu/cuda_emu.cc"; do
  o="$bdir/emu/$(basename "$cc").o"
  g++ -std=c++17 -Wall -Wextra -Werror -Wno-unused-parameter -Wno-unknown-pragmas $flags -include cuda_emu.h -c "$cc" -o "$o"
  objs+=("$o")
done
for c in "$root/kernels/emu/fake_cuda.c" "$root/kernels/be_cuda.c" "$root/kernels/k_gemm.c" "$root/tests/testutil.c"; do
  o="$bdir/emu/$(basename "$c").o"
  gcc -std=c11 -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter $flags -c "$c" -o "$o"
  objs+=("$o")
done
libs="$bdir/libkvbcore.a -llmdb -lzstd -lsqlite3 -lxxhash -lpthread -lm"
rc=0
for t in test_cuda_kernels test_cuda_backend; do
  gcc -std=c11 -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter $flags -c "$root/tests/$t.c" -o "$bdir/emu/$t.o"
  g++ $san "$bdir/emu/$t.o" "${objs[@]}" $libs -o "$bdir/emu/$t"
  echo "== $t (emulated device)"
  ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=0 "$bdir/emu/$t" || rc=$?
done
# The benchmark driver, on tiny models (in memory, and a synthetic file):
# that it runs, not how fast.
bench_objs=()
for c in "$root"/kernels/bench/*.c; do
  o="$bdir/emu/bench-$(basename "$c").o"
  gcc -std=c11 -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter $flags -c "$c" -o "$o"
  bench_objs+=("$o")
done
g++ $san "${bench_objs[@]}" "${objs[@]}" $libs -o "$bdir/emu/bench_gpu"
echo "== bench_gpu (emulated device, tiny models)"
small="--ctx 40 --batch 3 --prefill-seqs 2 --prefill-len 24 --steps 2 --peak-tflops 1"
export ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=0
"$bdir/emu/bench_gpu" bench --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --vocab 1000 $small --deterministic || rc=1
"$bdir/emu/bench_gpu" synth "$bdir/emu/tiny.gguf" --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 || rc=1
"$bdir/emu/bench_gpu" bench --model "$bdir/emu/tiny.gguf" $small || rc=1
"$bdir/emu/bench_gpu" job --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --vocab 1000 --requests 12 \
  --prompt 40 --prefix 16 --gen 4 --max-batch 4 --step-tokens 64 --kv-gib 0.01 --cache-requests 4 || rc=1
rm -f "$bdir/emu/tiny.gguf"
exit $rc
