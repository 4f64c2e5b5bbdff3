/* cuda_emu.cc — the fiber scheduler behind cuda_emu.h (see there).
 *
 * One OS thread. For each block, every CUDA thread gets a ucontext fiber;
 * the scheduler resumes them in turn. A fiber waiting at a barrier yields
 * until the barrier's generation moves on, which happens when the last of its
 * members arrives. If a whole round passes with every live fiber waiting and
 * no barrier completing, the kernel is deadlocked (e.g. __syncthreads()
 * inside a branch some threads skip): reported, then abort().
 *
 * Between two barriers the fibers run one after another, so a missing
 * barrier goes unnoticed when the writer happens to run before the reader.
 * EMU_ORDER=reverse resumes them last thread first: running the tests both
 * ways turns such races into wrong results one way or the other. */
#include "cuda_emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

emu_dim threadIdx, blockIdx, blockDim, gridDim;

namespace {

enum { STACK = 64 << 10 };

struct barrier {
    unsigned n, count, gen;
};

struct fiber {
    ucontext_t ctx;
    char *stack;
    bool done;
};

ucontext_t sched_ctx;
fiber fibers[EMU_MAX_THREADS];
unsigned n_fibers, cur;
const std::function<void()> *cur_fn;
barrier block_bar, warp_bar[EMU_MAX_THREADS / 32];
float shfl_buf[EMU_MAX_THREADS / 32][32];
unsigned progress; /* bumped whenever a barrier completes or a fiber ends */

void fiber_main()
{
    (*cur_fn)();
    fibers[cur].done = true;
    progress++;
    /* returning resumes uc_link = the scheduler */
}

void yield_to_scheduler() { swapcontext(&fibers[cur].ctx, &sched_ctx); }

void barrier_wait(barrier *b)
{
    const unsigned gen = b->gen;
    if (++b->count == b->n) {
        b->count = 0;
        b->gen++;
        progress++;
        return;
    }
    while (b->gen == gen) yield_to_scheduler();
}

/* Its own function: getcontext "returns twice" for the compiler's purposes,
 * which would make a caller's loop variables suspect. */
void fiber_init(fiber *f)
{
    if (!f->stack) f->stack = (char *)malloc(STACK);
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = f->stack;
    f->ctx.uc_stack.ss_size = STACK;
    f->ctx.uc_link = &sched_ctx;
    makecontext(&f->ctx, fiber_main, 0);
    f->done = false;
}

bool reverse_order()
{
    static int r = -1;
    if (r < 0) {
        const char *s = getenv("EMU_ORDER");
        r = s && !strcmp(s, "reverse");
    }
    return r;
}

void run_block(unsigned n)
{
    const bool rev = reverse_order();
    n_fibers = n;
    for (unsigned i = 0; i < n; i++) fiber_init(&fibers[i]);
    block_bar = {n, 0, 0};
    for (unsigned w = 0; w < (n + 31) / 32; w++) warp_bar[w] = {32, 0, 0};
    unsigned live = n;
    while (live) {
        const unsigned before = progress;
        live = 0;
        for (unsigned k = 0; k < n; k++) {
            const unsigned i = rev ? n - 1 - k : k;
            if (fibers[i].done) continue;
            cur = i;
            threadIdx = {i, 0, 0};
            swapcontext(&sched_ctx, &fibers[i].ctx);
            if (!fibers[i].done) live++;
        }
        if (live && progress == before) {
            /* A fiber that merely yielded again without anyone reaching a
             * barrier: every live fiber is waiting on something that can
             * no longer complete. */
            fprintf(stderr, "cuda_emu: deadlock in block %u: %u of %u threads stuck at a barrier\n", blockIdx.x,
                    live, n);
            abort();
        }
    }
}

} // namespace

/* fake_cuda.c's streams: a launch is queued (with its arguments, bound by
 * value at the launch) and runs when the stream's work is forced, or when
 * the graph it was captured into is launched. */
extern "C" void fake_cuda_enqueue(cudaStream_t st, void (*run)(void *), void (*drop)(void *), void *arg);

namespace {

struct recorded_launch {
    unsigned grid, block;
    std::function<void()> fn;
};

void run_blocks(unsigned grid, unsigned block, const std::function<void()> &fn)
{
    cur_fn = &fn;
    blockDim = {block, 1, 1};
    gridDim = {grid, 1, 1};
    for (unsigned b = 0; b < grid; b++) {
        blockIdx = {b, 0, 0};
        run_block(block);
    }
}

void run_recorded(void *a)
{
    const recorded_launch *r = static_cast<const recorded_launch *>(a);
    run_blocks(r->grid, r->block, r->fn);
}

void drop_recorded(void *a) { delete static_cast<recorded_launch *>(a); }

} // namespace

void emu_launch(unsigned grid, unsigned block, cudaStream_t stream, const std::function<void()> &fn)
{
    if (block == 0 || block > EMU_MAX_THREADS) {
        fprintf(stderr, "cuda_emu: block of %u threads\n", block);
        abort();
    }
    fake_cuda_enqueue(stream, run_recorded, drop_recorded, new recorded_launch{grid, block, fn});
}

void __syncthreads() { barrier_wait(&block_bar); }

/* mma_sync's gathering of the warp's shares of A, B and C (see cuda_emu.h). */
void emu_wmma_exchange(const float *a, const float *b, const float *c, float *d)
{
    static float xa[EMU_MAX_THREADS / 32][256], xb[EMU_MAX_THREADS / 32][256], xc[EMU_MAX_THREADS / 32][256];
    const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    for (unsigned i = l; i < 256; i += 32) {
        xa[w][i] = a[i];
        xb[w][i] = b[i];
        xc[w][i] = c[i];
    }
    __syncwarp();
    float t[256];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = xc[w][r * 16 + n];
            for (int k = 0; k < 16; k++) s += xa[w][r * 16 + k] * xb[w][k * 16 + n];
            t[r * 16 + n] = s;
        }
    __syncwarp(); /* every lane has read the exchange before the next mma fills it */
    memcpy(d, t, sizeof t);
}

void __syncwarp(unsigned mask)
{
    (void)mask;
    if (blockDim.x % 32) {
        fprintf(stderr, "cuda_emu: __syncwarp in a block of %u threads\n", blockDim.x);
        abort();
    }
    barrier_wait(&warp_bar[threadIdx.x / 32]);
}

float __shfl_xor_sync(unsigned mask, float v, int lane_mask)
{
    (void)mask;
    if (blockDim.x % 32) {
        fprintf(stderr, "cuda_emu: shuffle in a block of %u threads\n", blockDim.x);
        abort();
    }
    const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    shfl_buf[w][l] = v;
    barrier_wait(&warp_bar[w]);
    const float r = shfl_buf[w][l ^ (unsigned)lane_mask];
    barrier_wait(&warp_bar[w]);
    return r;
}
