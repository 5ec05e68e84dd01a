/* src/engine/cpu_ops.c — the CPU kernels' entry points (see cpu_ops.h):
 * run-time choice of the instruction-set variant (cpu_kernels.h), task
 * planning of the matrix products over the thread pool, and the
 * conversions that do not depend on the instruction set (embedding rows,
 * dtype to f32). The arithmetic itself lives in cpu_kernels.c and the
 * cpu_k_*.c files, compiled once per variant. */
#include "engine/cpu_ops.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dolphin/log.h"
#include "engine/cpu_amx.h"
#include "engine/cpu_i8.h"
#include "engine/cpu_r16.h"
#include "engine/cpu_kernels.h"

#ifdef DOLPHIN_CPU_KERNELS_X86
#include <cpuid.h>
#endif

/* ---- kernel set selection ------------------------------------------------ */

/* DOLPHIN_CPU_KERNELS_X86 is defined by CMake when the avx2 and avx512
 * variants are built (x86-64). */
#ifdef DOLPHIN_CPU_KERNELS_X86
static const dol_cpu_kernels *const all_sets[] = { &dol_cpu_kernels_avx512, &dol_cpu_kernels_avx2,
                                                   &dol_cpu_kernels_portable };
#else
static const dol_cpu_kernels *const all_sets[] = { &dol_cpu_kernels_portable };
#endif
#define N_SETS ((int)(sizeof all_sets / sizeof all_sets[0]))

/* Whether this CPU and OS can run set k. __builtin_cpu_supports (libgcc's
 * cpu model, and compiler-rt's) reports AVX2 and FMA only when XCR0 has the
 * SSE and YMM states enabled (bits 1-2), and the AVX-512 features only when
 * it also has the opmask and both ZMM states (bits 5-7), so an OS that does
 * not save the zmm registers gets avx2 or portable. (libgcc reads the
 * feature bits for the vendors it knows, Intel and AMD among them; on
 * another vendor they all read as absent and portable is chosen.) */
static int set_supported(const dol_cpu_kernels *k)
{
#ifdef DOLPHIN_CPU_KERNELS_X86
    __builtin_cpu_init();
    /* F16C straight from cpuid leaf 1 (clang's __builtin_cpu_supports has
     * no "f16c"); the OS state it needs is AVX's, which the avx2 and fma
     * checks cover. */
    unsigned a, b, c, d;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    if (k == &dol_cpu_kernels_avx2) return avx2;
    if (k == &dol_cpu_kernels_avx512)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
    return k == &dol_cpu_kernels_portable;
}

const dol_cpu_kernels *dol_cpu_kernels_find(const char *name)
{
    if (!name) return NULL;
    for (int i = 0; i < N_SETS; i++)
        if (strcmp(all_sets[i]->name, name) == 0) return set_supported(all_sets[i]) ? all_sets[i] : NULL;
    return NULL;
}

static _Atomic(const dol_cpu_kernels *) active;
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

/* The widest supported set, unless DOLPHIN_CPU_KERNELS names another
 * supported one ("auto" or empty: the automatic choice). */
static void choose(void)
{
    const dol_cpu_kernels *k = NULL;
    for (int i = 0; i < N_SETS && !k; i++)
        if (set_supported(all_sets[i])) k = all_sets[i];
    const char *env = getenv("DOLPHIN_CPU_KERNELS");
    if (env && *env && strcmp(env, "auto") != 0) {
        const dol_cpu_kernels *want = dol_cpu_kernels_find(env);
        if (want) {
            k = want;
        } else {
            int known = strcmp(env, "portable") == 0 || strcmp(env, "avx2") == 0 ||
                        strcmp(env, "avx512") == 0;
            char q[96];
            dol_log(DOL_LOG_WARN, "cpu_kernels_override_ignored",
                    "env=DOLPHIN_CPU_KERNELS value=%s reason=%s using=%s", dol_log_quote(env, q, sizeof q),
                    known ? "not_supported_here" : "unknown_name", k->name);
        }
    }
    atomic_store_explicit(&active, k, memory_order_release);
}

const dol_cpu_kernels *dol_cpu_kernels_get(void)
{
    const dol_cpu_kernels *k = atomic_load_explicit(&active, memory_order_acquire);
    if (k) return k;
    pthread_once(&choose_once, choose);
    return atomic_load_explicit(&active, memory_order_acquire);
}

int dol_cpu_kernels_set(const char *name)
{
    const dol_cpu_kernels *k = dol_cpu_kernels_find(name);
    if (!k) return -1;
    pthread_once(&choose_once, choose); /* the environment must not override this later */
    atomic_store_explicit(&active, k, memory_order_release);
    return 0;
}

/* ---- matrix products ------------------------------------------------------ */

float dol_cpu_dot(const float *x, const void *w, dol_dtype wtype, int n)
{
    return dol_cpu_kernels_get()->dot(x, w, wtype, n);
}

/* ---- fused jobs: several products, residual add, SwiGLU ------------------ */

enum { EPI_STORE, EPI_ADD, EPI_SWIGLU, EPI_SCATTER };

#define FUSED_MAX_TASKS 256

/* One call's job; k is read once per call, so every task of a call uses the
 * same kernel set even if dol_cpu_kernels_set runs meanwhile. */
typedef struct {
    const dol_cpu_kernels *k;
    const float *x;
    int T, K;
    int n_w;
    const dol_cpu_weight *W[3];
    float *out[3];
    int n_tasks;                /* task t: rows [t_n0, t_n1) of W[t_w] */
    uint8_t t_w[FUSED_MAX_TASKS];
    int t_n0[FUSED_MAX_TASKS], t_n1[FUSED_MAX_TASKS];
    int epi;
    float *acc;                 /* EPI_ADD: the residual stream; EPI_SWIGLU: h */
    float *const *rows;         /* EPI_SCATTER: where row t of the product goes */
    const uint16_t *xp;         /* non-NULL: x packed for the BF16x3 AMX products (cpu_amx.h) */
    const uint8_t *x8;          /* non-NULL: x quantized and packed for AMX-INT8 (cpu_amx.h) */
    const dol_cpu_i8 *i8;       /* non-NULL: x quantized in xa, for the weights with i8 */
    const dol_i8_act *xa;
} fused_job;

/* Rows of x from which an NF4 product dequantizes its weights once per
 * group of rows of W (below) instead of decoding them in registers per tile
 * of x (Q8_0: from QUANT_PACKED_MIN_T on; below, q8_rows decodes once per
 * tile itself); from QUANT_PACKED_MIN_T rows the group is packed for the
 * prefill kernel, below it stays row-major for the decode tiles. Rows of W
 * per group: four 4-row panels, the packed kernel's streams. */
#define QUANT_PANEL_MIN_T 5
#define QUANT_PACKED_MIN_T 16
#define QUANT_PANEL_ROWS 16
#define QUANT_ROWMAJOR_ROWS 4   /* a group the decode tiles read from L1 */

/* The NF4 / Q8_0 product for batch- and prefill-sized T, and the product
 * over GGUF's block types for every T: each group of rows
 * of W is dequantized once (the kernel set's nf4_panel / q8_panel, SIMD)
 * into an F32 tile, which an F32 kernel then runs against all T rows of x:
 * QUANT_PANEL_ROWS rows in the packed layout (cpu_kernels.h) for the packed
 * kernel from QUANT_PACKED_MIN_T rows of x, else QUANT_ROWMAJOR_ROWS rows
 * row-major for matmul_rows. Each element is still x[k] * (dequantized weight) accumulated lane
 * by lane in k order and summed as nf4_rows / q8_rows sum it (K whole
 * blocks, see panel_ok), so the bits are theirs and outputs stay
 * batch-invariant. Returns -1 (nothing done) when the tile cannot be had. */
/* Each thread's tile, kept between products (a tile allocated per task is
 * fresh pages every time: the kernel's zeroing of them took a third of a
 * decode step); freed when the thread ends. */
typedef struct {
    float *p;
    size_t cap; /* floats */
} tile_buf;

static pthread_key_t tile_key;
static pthread_once_t tile_once = PTHREAD_ONCE_INIT;
static bool tile_key_ok;

static void tile_free(void *v)
{
    tile_buf *t = v;
    free(t->p);
    free(t);
}

static void tile_key_make(void) { tile_key_ok = pthread_key_create(&tile_key, tile_free) == 0; }

/* At least n floats, 64-byte aligned, for this thread; NULL without memory. */
static float *thread_tile(size_t n)
{
    pthread_once(&tile_once, tile_key_make);
    if (!tile_key_ok) return NULL;
    tile_buf *t = pthread_getspecific(tile_key);
    if (!t) {
        if (!(t = calloc(1, sizeof *t))) return NULL;
        if (pthread_setspecific(tile_key, t) != 0) {
            free(t);
            return NULL;
        }
    }
    if (t->cap < n) {
        void *p = NULL;
        if (posix_memalign(&p, 64, sizeof(float) * n) != 0) return NULL;
        free(t->p);
        t->p = p;
        t->cap = n;
    }
    return t->p;
}

static int quant_rows_panel(const fused_job *j, const dol_cpu_weight *w, float *out, int n0,
                            int n1)
{
    const int K = j->K, N = w->N;
    const bool packed = j->T >= QUANT_PACKED_MIN_T;
    float *tile = thread_tile((size_t)QUANT_PANEL_ROWS * (size_t)K);
    if (!tile) return -1;
    const int group = packed ? QUANT_PANEL_ROWS : QUANT_ROWMAJOR_ROWS;
    for (int n = n0; n < n1; n += group) {
        const int m = n1 - n < group ? n1 - n : group;
        if (w->nf4) j->k->nf4_panel(w->nf4, n, m, packed, tile);
        else if (w->q8) j->k->q8_panel(w->q8, n, m, packed, tile);
        else j->k->blk_panel(w->wtype, w->w, w->row_bytes, n, m, K, packed, tile);
        /* the tile holds rows n .. n+m-1 of W: the kernels find row (or
         * panel) r at W + r * K, so they are given the address where a whole
         * W would start (never read below the tile) */
        const void *wp = (const void *)((uintptr_t)tile - (uintptr_t)n * (uintptr_t)K * sizeof(float));
        if (packed) j->k->matmul_packed_rows(out, j->x, j->T, K, wp, DOL_DTYPE_F32, N, n, n + m);
        else j->k->matmul_rows(out, j->x, j->T, K, wp, DOL_DTYPE_F32, N, n, n + m);
    }
    return 0;
}

/* Whether quant_rows_panel gives the in-register product's bits: K whole
 * blocks, blocks of whole chunks of the packed layout, and T large enough
 * for the tile to pay (n0 is always a multiple of 16: fused_run). */
static bool panel_ok(const fused_job *j, const dol_cpu_weight *w)
{
    if (dol_cpu_weight_is_blk(w)) return true; /* the only product of the block types */
    if (j->T < (w->q8 ? QUANT_PACKED_MIN_T : QUANT_PANEL_MIN_T)) return false;
    if (w->nf4) return w->nf4->cols % DOL_NF4_BLOCK == 0 && DOL_NF4_BLOCK % DOL_PACK_K == 0;
    if (w->q8) return w->q8->cols % DOL_Q8_BLOCK == 0 && DOL_Q8_BLOCK % DOL_PACK_K == 0;
    return false;
}

/* ---- AMX: BF16x3 and AMX-INT8 (opt-in, cpu_amx.h) ------------------------ */

int dol_cpu_fast_reserve(dol_cpu_fast *f, int T, int K)
{
    const size_t need = dol_amx_x_elems(T, K);
    if (need <= f->cap) return 0;
    uint16_t *x = malloc(sizeof(uint16_t) * need);
    if (!x) return -1;
    free(f->x);
    f->x = x;
    f->cap = need;
    return 0;
}

/* f->x8 for AMX-INT8 products of T rows of K inputs (grows, never shrinks). */
static int fast_reserve_i8(dol_cpu_fast *f, int T, int K)
{
    const size_t need = dol_amx_i8_x_bytes(T, K);
    if (need <= f->cap8) return 0;
    uint8_t *x = aligned_alloc(64, (need + 63) / 64 * 64);
    if (!x) return -1;
    free(f->x8);
    f->x8 = x;
    f->cap8 = need;
    return 0;
}

void dol_cpu_fast_free(dol_cpu_fast *f)
{
    free(f->x);
    free(f->x8);
    f->x = NULL;
    f->x8 = NULL;
    f->cap = f->cap8 = 0;
}

/* Formats the AMX path serves: F16/BF16 in the packed layout, NF4 and Q8_0
 * with K whole blocks (their panels then dequantize row-major). */
static bool fast_weight_ok(const dol_cpu_weight *w)
{
    if (w->nf4) return w->nf4->cols % DOL_NF4_BLOCK == 0;
    if (w->q8) return w->q8->cols % DOL_Q8_BLOCK == 0;
    return w->packed && (w->wtype == DOL_DTYPE_F16 || w->wtype == DOL_DTYPE_BF16);
}

typedef struct {
    uint16_t *xp;
    const float *x;
    int T, K;
} pack_x_job;

static void pack_x_task(void *ctx, int task, int worker)
{
    (void)worker;
    const pack_x_job *p = ctx;
    dol_amx_pack_x(p->xp, p->x, p->T, p->K, task, task + 1);
}

typedef struct {
    uint8_t *xp;
    const dol_i8_act *a;
} pack_x8_job;

static void pack_x8_task(void *ctx, int task, int worker)
{
    (void)worker;
    const pack_x8_job *p = ctx;
    dol_amx_i8_pack_x(p->xp, p->a, task, task + 1);
}

static void i8_prepare(dol_pool *pool, fused_job *j);
static bool i8_weight_ok(const fused_job *j, const dol_cpu_weight *w);
static dol_dtype i8_format(const dol_cpu_weight *w);

/* Whether job j runs on AMX: in int8 when every weight runs on 8-bit
 * activations and the CPU has AMX-INT8 (x quantized, then packed, j->x8
 * set), else in BF16x3 for the formats it serves (x packed, j->xp set);
 * the packing runs over the pool. */
static void fast_prepare(dol_pool *pool, fused_job *j)
{
    dol_cpu_fast *f = j->W[0]->fast;
    if (!f || j->T < DOL_CPU_FAST_MIN_T || j->K % DOL_AMX_K != 0 || j->k->lanes != 16) return;
    const int blocks = (j->T + DOL_AMX_ROWS - 1) / DOL_AMX_ROWS;
    bool all_r16 = true;
    for (int i = 0; i < j->n_w; i++) all_r16 = all_r16 && j->W[i]->r16;
    if (all_r16) return; /* the layout's own products (on the tile unit unless r16_amx is off) */
    bool all_i8 = dol_amx_i8_available();
    for (int i = 0; i < j->n_w && all_i8; i++) all_i8 = i8_weight_ok(j, j->W[i]);
    if (all_i8) {
        i8_prepare(pool, j);
        if (!j->xa || !j->i8->decode16 || fast_reserve_i8(f, j->T, j->K) != 0) return;
        pack_x8_job p = { f->x8, j->xa };
        if (pool && blocks > 1) dol_pool_run(pool, pack_x8_task, &p, blocks);
        else dol_amx_i8_pack_x(p.xp, p.a, 0, blocks);
        j->x8 = f->x8;
        return;
    }
    if (!dol_amx_available()) return;
    for (int i = 0; i < j->n_w; i++)
        if (!fast_weight_ok(j->W[i])) return;
    if (dol_cpu_fast_reserve(f, j->T, j->K) != 0) return;
    pack_x_job p = { f->x, j->x, j->T, j->K };
    if (pool && blocks > 1) dol_pool_run(pool, pack_x_task, &p, blocks);
    else dol_amx_pack_x(p.xp, p.x, p.T, p.K, 0, blocks);
    j->xp = f->x;
}

/* Rows n0..n1 of W on AMX, two groups of 16 rows at a time: dequantized
 * (NF4 / Q8_0) or read from the packed layout straight into bf16 hi/lo
 * tiles, then multiplied against all of x. -1 (nothing done) without memory. */
static int fast_rows(const fused_job *j, const dol_cpu_weight *w, float *out, int n0, int n1)
{
    const int K = j->K, N = w->N;
    const size_t ge = dol_amx_w_elems(K);
    uint16_t *wp = malloc(sizeof(uint16_t) * 2 * ge);
    if (!wp) return -1;
    for (int n = n0; n < n1; n += 2 * DOL_AMX_ROWS) {
        const int m = n1 - n < 2 * DOL_AMX_ROWS ? n1 - n : 2 * DOL_AMX_ROWS;
        for (int g = 0; g * DOL_AMX_ROWS < m; g++) {
            const int r = n + g * DOL_AMX_ROWS, mg = m - g * DOL_AMX_ROWS < DOL_AMX_ROWS ? m - g * DOL_AMX_ROWS : DOL_AMX_ROWS;
            if (w->nf4) dol_amx_w_from_nf4(wp + g * ge, w->nf4, r, mg);
            else if (w->q8) dol_amx_w_from_q8(wp + g * ge, w->q8, r, mg);
            else dol_amx_w_from_packed(wp + g * ge, w->w, w->wtype, r, mg, K);
        }
        dol_amx_product(out, N, n, m, wp, j->xp, j->T, K);
    }
    free(wp);
    return 0;
}

/* Rows n0..n1 of W on AMX-INT8, 16 rows at a time decoded once (the int8
 * set's decode16) into this thread's tile, then multiplied against all of
 * x. -1 (nothing done) without memory or for a format decode16 lacks. */
static int fast_i8_rows(const fused_job *j, const dol_cpu_weight *w, float *out, int n0, int n1)
{
    const int K = j->K, N = w->N;
    /* 16 K bytes of weights, then K floats of scales and K of minima */
    float *tile = thread_tile((size_t)4 * (size_t)K + (size_t)2 * (size_t)K);
    if (!tile) return -1;
    int8_t *wq = (int8_t *)tile;
    float *sw = tile + (size_t)4 * (size_t)K, *mw = sw + K;
    const dol_i8_weight v = { i8_format(w), w->w, w->row_bytes, w->nf4, w->q8, w->N, K };
    for (int n = n0; n < n1; n += DOL_AMX_ROWS) {
        const int m = n1 - n < DOL_AMX_ROWS ? n1 - n : DOL_AMX_ROWS;
        const int flags = j->i8->decode16(&v, n, m, wq, sw, mw);
        if (flags < 0) return -1; /* not a format of decode16's: the same for every group */
        dol_amx_i8_product(out, N, n, m, wq, sw, mw, flags, j->x8, j->T, K);
    }
    return 0;
}

/* ---- 8-bit activations (cpu_i8.h) ----------------------------------------- */

static dol_dtype i8_format(const dol_cpu_weight *w)
{
    return w->nf4 ? DOL_I8_NF4 : w->q8 ? DOL_I8_Q8 : w->packed ? DOL_DTYPE_F32 : w->wtype;
}

static bool i8_weight_ok(const fused_job *j, const dol_cpu_weight *w)
{
    return w->i8 && dol_cpu_i8_takes(i8_format(w), j->K);
}

typedef struct {
    const dol_cpu_i8 *s;
    dol_i8_act *a;
    const float *x;
    int T, rows_per_task;
} i8_quant_job;

static void i8_quant_task(void *ctx, int task, int worker)
{
    (void)worker;
    const i8_quant_job *q = ctx;
    const int t0 = task * q->rows_per_task, t1 = t0 + q->rows_per_task < q->T ? t0 + q->rows_per_task : q->T;
    q->s->quantize(q->a, q->x, t0, t1);
}

/* Whether job j runs on 8-bit activations; if so x is quantized once into
 * the first eligible weight's scratch (over the pool when T is large) and
 * j->i8, j->xa set. A row's quantization depends on that row only. */
static void i8_prepare(dol_pool *pool, fused_job *j)
{
    if (j->xp || j->xa) return;
    dol_i8_act *a = NULL;
    for (int i = 0; i < j->n_w && !a; i++)
        if (i8_weight_ok(j, j->W[i])) a = j->W[i]->i8;
    const dol_cpu_i8 *s = a ? dol_cpu_i8_get() : NULL;
    if (!s || dol_cpu_i8_act_reserve(a, j->T, j->K) != 0) return;
    const int threads = pool ? dol_pool_threads(pool) : 1;
    if (threads > 1 && j->T >= 4 * threads) {
        i8_quant_job q = { s, a, j->x, j->T, (j->T + 2 * threads - 1) / (2 * threads) };
        dol_pool_run(pool, i8_quant_task, &q, (j->T + q.rows_per_task - 1) / q.rows_per_task);
    } else {
        s->quantize(a, j->x, 0, j->T);
    }
    j->i8 = s;
    j->xa = a;
}

static void rows_of(const fused_job *j, int i, float *out, int n0, int n1)
{
    const dol_cpu_weight *w = j->W[i];
    if (w->r16 && j->xa) { /* xa is always set then: i8_prepare's arrays are sized at start */
        void *s = w->r16_amx && j->T >= DOL_R16_ROWS ? thread_tile((dol_i8_r16_scratch_bytes(j->K) + 3) / 4) : NULL;
        dol_i8_r16_rows(out, w->N, j->xa, w->r16, n0, n1, s);
        return;
    }
    if (j->xp && fast_rows(j, w, out, n0, n1) == 0) return;
    if (j->x8 && fast_i8_rows(j, w, out, n0, n1) == 0) return;
    if (j->xa && i8_weight_ok(j, w)) {
        const dol_i8_weight v = { i8_format(w), w->w, w->row_bytes, w->nf4, w->q8, w->N, j->K };
        void *scratch = j->T > 2 ? thread_tile((j->i8->scratch_bytes(j->K) + sizeof(float) - 1) / sizeof(float)) : NULL;
        j->i8->rows(out, w->N, j->xa, &v, n0, n1, scratch);
        return;
    }
    if (panel_ok(j, w) && quant_rows_panel(j, w, out, n0, n1) == 0) return;
    if (dol_cpu_weight_is_blk(w)) {   /* no memory for a tile: row by row */
        float *row = malloc(sizeof(float) * (size_t)j->K);
        for (int n = n0; row && n < n1; n++) {
            j->k->blk_panel(w->wtype, w->w, w->row_bytes, n, 1, j->K, false, row);
            const void *wp = (const void *)((uintptr_t)row - (uintptr_t)n * (uintptr_t)j->K * sizeof(float));
            j->k->matmul_rows(out, j->x, j->T, j->K, wp, DOL_DTYPE_F32, w->N, n, n + 1);
        }
        free(row);
        return;
    }
    if (w->q8) j->k->q8_rows(out, j->x, j->T, w->q8, n0, n1);
    else if (w->nf4) j->k->nf4_rows(out, j->x, j->T, w->nf4, n0, n1);
    else if (w->packed) j->k->matmul_packed_rows(out, j->x, j->T, j->K, w->w, w->wtype, w->N, n0, n1);
    else j->k->matmul_rows(out, j->x, j->T, j->K, w->w, w->wtype, w->N, n0, n1);
}

static void fused_task(void *ctx, int task, int worker)
{
    (void)worker;
    const fused_job *j = ctx;
    const int i = j->t_w[task], N = j->W[i]->N, n0 = j->t_n0[task], n1 = j->t_n1[task];
    rows_of(j, i, j->out[i], n0, n1);
    if (j->epi == EPI_ADD) {
        for (int t = 0; t < j->T; t++) {
            float *a = j->acc + (size_t)t * N;
            const float *o = j->out[0] + (size_t)t * N;
            for (int n = n0; n < n1; n++) a[n] += o[n];
        }
    } else if (j->epi == EPI_SCATTER) {
        for (int t = 0; t < j->T; t++)
            memcpy(j->rows[t] + n0, j->out[0] + (size_t)t * N + n0, sizeof(float) * (size_t)(n1 - n0));
    } else if (j->epi == EPI_SWIGLU) {
        rows_of(j, 1, j->out[1], n0, n1);
        for (int t = 0; t < j->T; t++) {
            size_t r = (size_t)t * N + (size_t)n0;
            j->k->silu_mul(j->acc + r, j->out[0] + r, j->out[1] + r, n1 - n0);
        }
    }
}

/* Plan the tasks of a fused job over the rows of its first `n_plan`
 * matrices, taken in order as one row space, and run it. Guided sizes: each
 * task takes 1/(2 x threads) of the rows still unassigned, rounded up to a
 * multiple of 16 (at least 16, never across two matrices: whole groups of
 * four 4-row panels for the four-stream tiles, cpu_k_matmul.c), so the first
 * tasks are long sequential streams of W and the last ones short (the
 * threads finish together). At one or two rows of x (memory-bound decode)
 * each task takes 1/threads of the rows still unassigned instead: every
 * task start costs its streams a trip to memory, so fewer tasks win there
 * (and lose at more rows). With one thread, or under 64 K multiply-adds,
 * each matrix is one task, run inline. Measurements: docs/performance.md,
 * "Thread tasks and fused jobs". */
#define GUIDED_COARSE_ROWS 2 /* rows of x up to which tasks are 1/threads */

static void fused_run(dol_pool *pool, fused_job *j, int n_plan)
{
    fast_prepare(pool, j);
    i8_prepare(pool, j);
    const int threads = pool ? dol_pool_threads(pool) : 1;
    int total = 0;
    for (int i = 0; i < n_plan; i++) total += j->W[i]->N;
    const double work = (double)j->T * j->K * total * (j->epi == EPI_SWIGLU ? 2 : 1);
    const bool split = threads > 1 && work >= 65536.0;
    int n = 0, left = total;
    for (int i = 0; i < n_plan; i++) {
        const int N = j->W[i]->N;
        for (int r = 0; r < N;) {
            int size = N - r;
            if (split && n < FUSED_MAX_TASKS - n_plan) {
                const int div = (j->T <= GUIDED_COARSE_ROWS ? 1 : 2) * threads;
                int want = (left + div - 1) / div;
                want = (want + 15) & ~15;
                if (want < 16) want = 16;
                if (want < size) size = want;
            }
            j->t_w[n] = (uint8_t)i;
            j->t_n0[n] = r;
            j->t_n1[n] = r + size;
            n++;
            r += size;
            left -= size;
        }
    }
    j->n_tasks = n;
    if (n <= 1 || !pool || !split) {
        for (int t = 0; t < n; t++) fused_task(j, t, 0);
        return;
    }
    dol_pool_run(pool, fused_task, j, n);
}

void dol_cpu_matmul_multi(dol_pool *pool, const float *x, int T, int K,
                          const dol_cpu_weight *W, float *const *out, int n_w)
{
    for (int i0 = 0; i0 < n_w; i0 += 3) {
        fused_job j = { .k = dol_cpu_kernels_get(), .x = x, .T = T, .K = K, .epi = EPI_STORE };
        j.n_w = n_w - i0 < 3 ? n_w - i0 : 3;
        for (int i = 0; i < j.n_w; i++) {
            j.W[i] = &W[i0 + i];
            j.out[i] = out[i0 + i];
        }
        fused_run(pool, &j, j.n_w);
    }
}

/* The plain products are fused jobs of one matrix: one task planner for
 * every product. */
void dol_cpu_matmul(dol_pool *pool, float *out, const float *x, int T, int K,
                    const void *W, dol_dtype wtype, int N)
{
    const dol_cpu_weight w = { W, wtype, NULL, N, K, false, NULL, NULL,
                               dol_dtype_is_block(wtype) ? dol_dtype_row_bytes(wtype, K) : 0, NULL, NULL, false };
    dol_cpu_matmul_multi(pool, x, T, K, &w, &out, 1);
}

void dol_cpu_matmul_nf4(dol_pool *pool, float *out, const float *x, int T,
                        const dol_nf4_matrix *W)
{
    const dol_cpu_weight w = { NULL, DOL_DTYPE_F32, W, (int)W->rows, (int)W->cols, false, NULL, NULL, 0, NULL, NULL, false };
    dol_cpu_matmul_multi(pool, x, T, w.K, &w, &out, 1);
}

void dol_cpu_matmul_q8(dol_pool *pool, float *out, const float *x, int T,
                       const dol_q8_matrix *W)
{
    const dol_cpu_weight w = { NULL, DOL_DTYPE_F32, NULL, (int)W->rows, (int)W->cols, false, W, NULL, 0, NULL, NULL, false };
    dol_cpu_matmul_multi(pool, x, T, w.K, &w, &out, 1);
}

void dol_cpu_matmul_add(dol_pool *pool, float *acc, float *tmp, const float *x, int T, int K,
                        const dol_cpu_weight *W)
{
    fused_job j = { .k = dol_cpu_kernels_get(), .x = x, .T = T, .K = K, .n_w = 1,
                    .W = { W }, .out = { tmp }, .epi = EPI_ADD, .acc = acc };
    fused_run(pool, &j, 1);
}

void dol_cpu_matmul_scatter(dol_pool *pool, float *const *rows, float *tmp, const float *x, int T,
                            int K, const dol_cpu_weight *W)
{
    fused_job j = { .k = dol_cpu_kernels_get(), .x = x, .T = T, .K = K, .n_w = 1,
                    .W = { W }, .out = { tmp }, .epi = EPI_SCATTER, .rows = rows };
    fused_run(pool, &j, 1);
}

void dol_cpu_swiglu(dol_pool *pool, float *h, float *u_tmp, const float *x, int T, int K,
                    const dol_cpu_weight *gate, const dol_cpu_weight *up)
{
    /* gate's output goes to h, then h = silu(h) * u in place (silu_mul may
     * alias out and gate) */
    fused_job j = { .k = dol_cpu_kernels_get(), .x = x, .T = T, .K = K, .n_w = 2,
                    .W = { gate, up }, .out = { h, u_tmp }, .epi = EPI_SWIGLU, .acc = h };
    fused_run(pool, &j, 1);
}

/* ---- packing -------------------------------------------------------------- */

typedef struct {
    void *dst;
    dol_dtype dst_t, src_t;
    const void *src;
    int N, K;
} pack_job;

static float src_elem(const void *src, dol_dtype t, size_t i)
{
    if (t == DOL_DTYPE_F16) return dol_f16_to_f32(((const uint16_t *)src)[i]);
    if (t == DOL_DTYPE_BF16) return dol_bf16_to_f32(((const uint16_t *)src)[i]);
    return ((const float *)src)[i];
}

/* n elements from src (src_t) to dst (dst_t); zeros when src is NULL */
static void pack_run(void *dst, dol_dtype dst_t, const void *src, dol_dtype src_t, int n)
{
    const size_t dsz = dol_dtype_size(dst_t);
    if (!src) {
        memset(dst, 0, (size_t)n * dsz);
    } else if (dst_t == src_t) {
        memcpy(dst, src, (size_t)n * dsz);
    } else if (dst_t == DOL_DTYPE_F32) {
        for (int i = 0; i < n; i++) ((float *)dst)[i] = src_elem(src, src_t, (size_t)i);
    } else {
        for (int i = 0; i < n; i++) ((uint16_t *)dst)[i] = dol_f32_to_f16(src_elem(src, src_t, (size_t)i));
    }
}

/* One panel, written in order: for each chunk of DOL_PACK_K weights the
 * chunks of its DOL_PACK_ROWS rows, then the rows' tails (the layout of
 * dol_cpu_packed_index), copied run by run rather than element by element. */
/* The same-dtype panel of a full panel (all DOL_PACK_ROWS rows real): runs
 * of a constant size E * DOL_PACK_K bytes, which the compiler turns into
 * plain vector moves (pack_run's memcpy of a run-time size is a call per
 * 32 bytes). */
#define PACK_COPY(E)                                                                        \
    static void pack_copy_##E(char *d, const char *s, int K, int kc)                        \
    {                                                                                       \
        for (int k = 0; k < kc; k += DOL_PACK_K)                                            \
            for (int r = 0; r < DOL_PACK_ROWS; r++, d += (E) * DOL_PACK_K)                  \
                memcpy(d, s + ((size_t)r * K + (size_t)k) * (E), (E) * DOL_PACK_K);         \
        for (int r = 0; r < DOL_PACK_ROWS && kc < K; r++, d += (size_t)(K - kc) * (E))      \
            memcpy(d, s + ((size_t)r * K + (size_t)kc) * (E), (size_t)(K - kc) * (E));      \
    }
PACK_COPY(2)
PACK_COPY(4)

static void pack_task(void *ctx, int panel, int worker)
{
    (void)worker;
    const pack_job *j = ctx;
    const int K = j->K, kc = K - K % DOL_PACK_K, n0 = panel * DOL_PACK_ROWS;
    const size_t dsz = dol_dtype_size(j->dst_t), ssz = dol_dtype_size(j->src_t);
    char *d = (char *)j->dst + (size_t)n0 * (size_t)K * dsz;
    const char *s = j->src;
    if (j->dst_t == j->src_t && n0 + DOL_PACK_ROWS <= j->N) {
        const char *p = s + (size_t)n0 * (size_t)K * ssz;
        if (dsz == 2) pack_copy_2(d, p, K, kc);
        else pack_copy_4(d, p, K, kc);
        return;
    }
    for (int k = 0; k < kc; k += DOL_PACK_K)
        for (int r = 0; r < DOL_PACK_ROWS; r++, d += DOL_PACK_K * dsz) {
            const int n = n0 + r;
            pack_run(d, j->dst_t, n < j->N ? s + ((size_t)n * K + (size_t)k) * ssz : NULL, j->src_t,
                     DOL_PACK_K);
        }
    for (int r = 0; r < DOL_PACK_ROWS && kc < K; r++, d += (size_t)(K - kc) * dsz) {
        const int n = n0 + r;
        pack_run(d, j->dst_t, n < j->N ? s + ((size_t)n * K + (size_t)kc) * ssz : NULL, j->src_t,
                 K - kc);
    }
}

int dol_cpu_pack(dol_pool *pool, void *dst, dol_dtype dst_t, const void *src, dol_dtype src_t,
                 int N, int K)
{
    if (dst_t == DOL_DTYPE_BF16 && src_t != DOL_DTYPE_BF16) return -1;
    if (dst_t != DOL_DTYPE_F32 && dst_t != DOL_DTYPE_F16 && dst_t != DOL_DTYPE_BF16) return -1;
    pack_job j = { dst, dst_t, src_t, src, N, K };
    int panels = (N + DOL_PACK_ROWS - 1) / DOL_PACK_ROWS;
    if (pool && panels > 1) dol_pool_run(pool, pack_task, &j, panels);
    else
        for (int p = 0; p < panels; p++) pack_task(&j, p, 0);
    return 0;
}

/* ---- element-wise kernels ------------------------------------------------ */

void dol_cpu_rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    dol_cpu_kernels_get()->rmsnorm(out, x, w, 1, n, eps);
}

void dol_cpu_rmsnorm_rows(float *out, const float *x, const float *w, int rows, int n,
                          float eps)
{
    dol_cpu_kernels_get()->rmsnorm(out, x, w, rows, n, eps);
}

void dol_cpu_rope(float *x, int n_heads, int head_dim, const float *cos_row,
                  const float *sin_row)
{
    dol_cpu_kernels_get()->rope(x, n_heads, head_dim, cos_row, sin_row);
}

void dol_cpu_silu_mul(float *out, const float *gate, const float *up, int n)
{
    dol_cpu_kernels_get()->silu_mul(out, gate, up, n);
}

/* ---- conversions (no instruction-set variants) ---------------------------- */

void dol_cpu_to_f32(float *dst, const void *src, dol_dtype t, int64_t n)
{
    if (t == DOL_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *h = src;
    if (t == DOL_DTYPE_F16)
        for (int64_t i = 0; i < n; i++) dst[i] = dol_f16_to_f32(h[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = dol_bf16_to_f32(h[i]);
}

void dol_cpu_embed_row(float *out, const dol_tensor *table, int32_t id)
{
    const char *row = (const char *)table->data + (size_t)id * dol_dtype_row_bytes(table->dtype, table->cols);
    dol_dequantize(table->dtype, row, out, table->cols);
}
