/* emu/exec.cpp — executes a grid for the CUDA emulation: blocks one after the
 * other; the threads of a block as fibers on one OS thread, switched at
 * every __syncthreads, __syncwarp and __shfl_*_sync. Those are barriers that
 * check each lane they name arrives at the same operation; a thread that
 * exits or waits elsewhere is reported as the fault it is on a GPU. Static
 * and dynamic shared memory are filled with 0xFF bytes (NaN as floats) at
 * every block start. Thread and block order: DOLPHIN_CUDA_EMU_ORDER =
 * forward (default) | reverse | random[:seed] (a new thread permutation per
 * block, the blocks shuffled too). */
#include "../emu/cuda_emu.h"
#include "fiber.h"
#include "internal.h"

/* the built-in names are fields here, not the current thread's values */
#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

extern "C" char __start_dol_emu_shared[] __attribute__((weak));
extern "C" char __stop_dol_emu_shared[] __attribute__((weak));

extern "C" {
dol_emu_builtins *dol_emu_cur = NULL;
}

namespace dol_emu {

namespace {

enum { T_RUN, T_WAIT_BAR, T_WAIT_WARP, T_DONE };
const size_t STACK_BYTES = (size_t)256 << 10;
const int MAX_THREADS = 1024;

struct ethread {
    dol_emu_builtins b;
    dol_fiber fib;
    int state;
    int linear, lane, warp;
    int wkind, warg, wwidth;
    unsigned wmask;
    uint64_t wval, wout, wseq;
};

struct executor {
    ethread *th = NULL;      /* [MAX_THREADS], stacks allocated once */
    dol_fiber main{};
    ethread *running = NULL;
    const launch_rec *launch = NULL;
    void *dyn = NULL;
    int n = 0;
    int order_mode = -1;     /* 0 forward, 1 reverse, 2 random */
    uint64_t seed = 0;
    std::vector<int> order, border;
    int pos = 0;             /* index into order of the thread running in this pass */
    int n_done = 0;
};
executor g;

const char *kind_name(int k)
{
    switch (k) {
    case DOL_EMU_SYNCWARP: return "__syncwarp";
    case DOL_EMU_SHFL: return "__shfl_sync";
    case DOL_EMU_SHFL_XOR: return "__shfl_xor_sync";
    case DOL_EMU_SHFL_UP: return "__shfl_up_sync";
    default: return "__shfl_down_sync";
    }
}

void init_once(void)
{
    if (g.th) return;
    g.th = (ethread *)calloc(MAX_THREADS, sizeof(ethread));
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < MAX_THREADS; i++) {
        /* one guard page below each stack: an overflow faults at once */
        char *m = (char *)mmap(NULL, STACK_BYTES + page, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) fault("cannot map a fiber stack");
        mprotect(m, page, PROT_NONE);
        g.th[i].fib.stack = m + page;
        /* stagger the stack tops by 64-byte steps: equal offsets modulo
         * 4 KiB would make every fiber's hot frame share a cache set */
        g.th[i].fib.stack_size = STACK_BYTES;
    }
    const char *o = getenv("DOLPHIN_CUDA_EMU_ORDER");
    g.order_mode = 0;
    if (o && strcmp(o, "reverse") == 0) g.order_mode = 1;
    else if (o && strncmp(o, "random", 6) == 0) {
        g.order_mode = 2;
        g.seed = o[6] == ':' ? strtoull(o + 7, NULL, 10) : 1;
    } else if (o && *o && strcmp(o, "forward") != 0)
        fault("DOLPHIN_CUDA_EMU_ORDER=%s: expected forward, reverse or random[:seed]", o);
}

uint64_t mix(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* order[0..n) = a permutation of 0..n-1 as the mode says */
void make_order(std::vector<int> &order, int n, uint64_t salt)
{
    order.resize((size_t)n);
    for (int i = 0; i < n; i++) order[(size_t)i] = g.order_mode == 1 ? n - 1 - i : i;
    if (g.order_mode == 2) {
        uint64_t s = mix(g.seed ^ mix(salt));
        for (int i = n - 1; i > 0; i--) {
            s = mix(s);
            int j = (int)(s % (uint64_t)(i + 1));
            std::swap(order[(size_t)i], order[(size_t)j]);
        }
    }
}

/* the main (scheduler) side's stack bounds, for AddressSanitizer */
void main_stack_bounds(void)
{
    static thread_local char *lo = NULL;
    static thread_local size_t size = 0;
    if (!lo) {
        pthread_attr_t a;
        void *addr = NULL;
        if (pthread_getattr_np(pthread_self(), &a) == 0) {
            pthread_attr_getstack(&a, &addr, &size);
            pthread_attr_destroy(&a);
        }
        lo = (char *)addr;
    }
    g.main.stack = lo;
    g.main.stack_size = size;
}

/* t stops (blocked or done): run the next runnable thread of this pass
 * directly, fiber to fiber; back to the scheduler when the pass is over. */
void yield_from(ethread *t, bool dying)
{
    for (int k = g.pos + 1; k < g.n; k++) {
        ethread *u = &g.th[g.order[(size_t)k]];
        if (u->state == T_RUN) {
            g.pos = k;
            g.running = u;
            dol_emu_cur = &u->b;
            dol_fiber_switch(&t->fib, &u->fib, dying);
            return;
        }
    }
    g.pos = g.n;
    dol_fiber_switch(&t->fib, &g.main, dying);
}

void fiber_entry(void)
{
    ethread *t = g.running;
    dol_fiber_started(&t->fib);
    (*g.launch->body)();
    t->state = T_DONE;
    g.n_done++;
    yield_from(t, true);
    fault("a finished GPU thread was resumed");
}

__attribute__((no_sanitize_address)) void poison_static_shared(void)
{
    if (!__start_dol_emu_shared) return;
    for (volatile char *p = __start_dol_emu_shared; p < __stop_dol_emu_shared; p++) *p = (char)0xff;
}

[[noreturn]] void thread_fault(const ethread *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void thread_fault(const ethread *t, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const dol_emu_builtins &b = t->b;
    fault("kernel %s, grid (%u,%u,%u) block (%u,%u,%u): block (%u,%u,%u) thread (%u,%u,%u) "
          "[warp %d lane %d]: %s",
          g.launch->name, b.gridDim.x, b.gridDim.y, b.gridDim.z, b.blockDim.x, b.blockDim.y,
          b.blockDim.z, b.blockIdx.x, b.blockIdx.y, b.blockIdx.z, b.threadIdx.x, b.threadIdx.y,
          b.threadIdx.z, t->warp, t->lane, msg);
}

const char *state_name(const ethread *u)
{
    switch (u->state) {
    case T_DONE: return "has exited";
    case T_WAIT_BAR: return "waits at __syncthreads";
    case T_WAIT_WARP: return "waits at another warp operation";
    default: return "is running";
    }
}

/* Complete the warp operations whose lanes have all arrived; false when none
 * could complete. Faults on a lane set that can never complete. */
bool resolve_warps(void)
{
    bool progress = false;
    const int n = g.n;
    for (int w = 0; w * 32 < n; w++) {
        const int base = w * 32, lanes = n - base < 32 ? n - base : 32;
        for (int l = 0; l < lanes; l++) {
            ethread *t = &g.th[base + l];
            if (t->state != T_WAIT_WARP) continue;
            const unsigned mask = t->wmask;
            const int width = t->wwidth;
            if (!((mask >> l) & 1u))
                thread_fault(t, "%s with mask 0x%08x, which does not name the calling lane", kind_name(t->wkind), mask);
            if (width < 1 || width > 32 || (width & (width - 1)))
                thread_fault(t, "%s with width %d (must be a power of two up to 32)", kind_name(t->wkind), width);
            for (int b = 0; b < 32; b++) {
                if (!((mask >> b) & 1u)) continue;
                if (b >= lanes)
                    thread_fault(t, "%s with mask 0x%08x names lane %d, but this warp has only %d threads "
                                    "(a partial warp)", kind_name(t->wkind), mask, b, lanes);
                const ethread *u = &g.th[base + b];
                if (u->state != T_WAIT_WARP)
                    thread_fault(t, "%s with mask 0x%08x: lane %d, named in the mask, %s "
                                    "(the operation is reached by part of the warp only)",
                                 kind_name(t->wkind), mask, b, state_name(u));
                if (u->wkind != t->wkind || u->wmask != mask || u->wwidth != width || u->wseq != t->wseq)
                    thread_fault(t, "%s (mask 0x%08x, warp operation #%llu of this lane) but lane %d is at "
                                    "%s (mask 0x%08x, its warp operation #%llu): the lanes diverged",
                                 kind_name(t->wkind), mask, (unsigned long long)t->wseq, b,
                                 kind_name(u->wkind), u->wmask, (unsigned long long)u->wseq);
            }
            for (int b = 0; b < 32; b++) {
                if (!((mask >> b) & 1u)) continue;
                ethread *u = &g.th[base + b];
                const int seg = b & ~(width - 1);
                int src = b;
                switch (u->wkind) {
                case DOL_EMU_SHFL: src = seg + (u->warg & (width - 1)); break;
                case DOL_EMU_SHFL_XOR: {
                    const int s = b ^ u->warg;
                    if (s >= seg && s < seg + width) src = s;
                    break;
                }
                case DOL_EMU_SHFL_UP: if (b - u->warg >= seg) src = b - u->warg; break;
                case DOL_EMU_SHFL_DOWN: if (b + u->warg < seg + width) src = b + u->warg; break;
                default: break;
                }
                if (src < 0 || src >= 32 || !((mask >> src) & 1u))
                    thread_fault(u, "%s reads lane %d, which is not in the mask 0x%08x (undefined value)",
                                 kind_name(u->wkind), src, mask);
                u->wout = g.th[base + src].wval;
            }
            for (int b = 0; b < 32; b++)
                if ((mask >> b) & 1u) {
                    g.th[base + b].state = T_RUN;
                    g.th[base + b].wseq++;
                }
            progress = true;
        }
    }
    return progress;
}

void resolve(void)
{
    if (resolve_warps()) return;
    int at_bar = 0;
    for (int i = 0; i < g.n; i++) at_bar += g.th[i].state == T_WAIT_BAR;
    if (at_bar == g.n) {
        for (int i = 0; i < g.n; i++) g.th[i].state = T_RUN;
        return;
    }
    const ethread *waiter = NULL, *other = NULL;
    for (int i = 0; i < g.n; i++) {
        const ethread *u = &g.th[i];
        if (u->state == T_WAIT_BAR && !waiter) waiter = u;
        if (u->state != T_WAIT_BAR && !other) other = u;
    }
    if (waiter)
        thread_fault(waiter, "waits at __syncthreads, but thread %d of the block %s (a barrier not reached "
                             "by the whole block)", other->linear, state_name(other));
    fault("kernel %s: the block's threads cannot proceed (internal error)", g.launch->name);
}

void run_block(uint3 bi)
{
    const launch_rec &l = *g.launch;
    poison_static_shared();
    if (l.smem) memset(g.dyn, 0xff, l.smem);
    int i = 0;
    for (unsigned z = 0; z < l.block.z; z++)
        for (unsigned y = 0; y < l.block.y; y++)
            for (unsigned x = 0; x < l.block.x; x++, i++) {
                ethread *t = &g.th[i];
                t->b.threadIdx = make_uint3(x, y, z);
                t->b.blockIdx = bi;
                t->b.blockDim = l.block;
                t->b.gridDim = l.grid;
                t->state = T_RUN;
                t->linear = i;
                t->lane = i & 31;
                t->warp = i >> 5;
                t->wseq = 0;
                dol_fiber_prepare(&t->fib, fiber_entry);
            }
    if (g.order_mode == 2) make_order(g.order, g.n, ((uint64_t)bi.z << 42) ^ ((uint64_t)bi.y << 21) ^ bi.x);
    g.n_done = 0;
    for (;;) {
        /* one pass: the first runnable thread starts it, each stopping thread
         * hands over to the next runnable one (yield_from) */
        for (int k = 0; k < g.n; k++) {
            ethread *t = &g.th[g.order[(size_t)k]];
            if (t->state == T_RUN) {
                g.pos = k;
                g.running = t;
                dol_emu_cur = &t->b;
                dol_fiber_switch(&g.main, &t->fib, false);
                dol_emu_cur = NULL;
                break;
            }
        }
        if (g.n_done == g.n) return;
        resolve();
    }
}

ethread *current_thread(const char *what)
{
    if (!dol_emu_cur || !g.running) fault("%s called outside a kernel", what);
    return g.running;
}

} // namespace

size_t static_smem_bytes(void)
{
    return __start_dol_emu_shared ? (size_t)(__stop_dol_emu_shared - __start_dol_emu_shared) : 0;
}

void run_grid(const launch_rec &l)
{
    init_once();
    if (g.launch) fault("kernel %s launched from inside kernel %s", l.name, g.launch->name);
    g.launch = &l;
    g.n = (int)(l.block.x * l.block.y * l.block.z);
    main_stack_bounds();
    g.dyn = NULL;
    if (l.smem && posix_memalign(&g.dyn, 16, l.smem) != 0) fault("out of host memory");
    make_order(g.order, g.n, 0);
    const uint64_t nb = (uint64_t)l.grid.x * l.grid.y * l.grid.z;
    const uint64_t gx = l.grid.x, gy = l.grid.y;
    /* blocks: forward, reverse, or (random) shuffled as threads are */
    if (g.order_mode == 2 && nb <= ((uint64_t)1 << 22)) make_order(g.border, (int)nb, ~(uint64_t)0);
    else g.border.clear();
    for (uint64_t k = 0; k < nb; k++) {
        const uint64_t b = !g.border.empty() ? (uint64_t)g.border[(size_t)k] : g.order_mode == 1 ? nb - 1 - k : k;
        run_block(make_uint3((unsigned)(b % gx), (unsigned)(b / gx % gy), (unsigned)(b / gx / gy)));
    }
    free(g.dyn);
    g.dyn = NULL;
    g.launch = NULL;
}

} // namespace dol_emu

using namespace dol_emu;

extern "C" void dol_emu_syncthreads(void)
{
    ethread *t = current_thread("__syncthreads");
    t->state = T_WAIT_BAR;
    yield_from(t, false);
}

extern "C" uint64_t dol_emu_warp_op(int kind, unsigned mask, uint64_t value, int arg, int width)
{
    ethread *t = current_thread(kind_name(kind));
    t->wkind = kind;
    t->wmask = mask;
    t->wval = value;
    t->warg = arg;
    t->wwidth = width;
    t->state = T_WAIT_WARP;
    yield_from(t, false);
    return t->wout;
}

extern "C" void *dol_emu_dyn_smem(void)
{
    (void)current_thread("dynamic shared memory");
    return g.dyn;
}
