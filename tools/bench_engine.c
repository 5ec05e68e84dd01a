/* tools/bench_engine.c — engine-level roofline benchmark for a model
 * directory (no HTTP): a streaming-read memory bandwidth probe run in the
 * same process with the same thread count, the weight bytes one decode step
 * streams, the roofline decode tokens/s they imply, prefill tokens/s at
 * several prompt lengths, decode tokens/s at several batch sizes (one forward
 * call per step over all sequences), and optionally a decode sweep over a
 * range of batch sizes as a two-column block for gnuplot. Prints one aligned
 * table (or a Markdown table). The table's figures are measured in
 * `--repeat` rounds, each round timing every prompt length once and every
 * batch size once, and each figure is the best of its rounds: on a shared
 * machine whose speed drifts with its neighbours (a cloud VM), a slow spell
 * then costs every figure one round instead of costing one figure all of
 * its runs. On the CPU backend the share of the roofline is given twice:
 * the best decode run against the best probe pass of the whole run, and the
 * median over batch-1 runs each taken right after its own probe passes (the
 * steadier figure where neighbours move the bandwidth, see decode_tps).
 * scripts/bench and scripts/bench-decode wrap it. No assertion on time
 * anywhere. */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "dolphin/engine.h"
#include "dolphin/model.h"

#define MAX_LIST 64       /* entries in --prompts / --batches */
#define MAX_BATCH 256     /* largest decode batch */
#define SHORT_PROMPT 16   /* tokens each decode sequence is prefilled with (--context) */
static int g_context = SHORT_PROMPT;

static int usage(void)
{
    fprintf(stderr,
            "usage: bench_engine MODEL_DIR [--threads N] [--prompts 128,512 | --prompt N]\n"
            "                    [--decode N] [--batches 1,8] [--repeat ROUNDS]\n"
            "                    [--sweep A-B] [--sweep-out FILE] [--markdown]\n"
            "                    [--weights auto|f32|f16|nf4|int8] [--quantize-lm-head]\n"
            "                    [--backend auto|cpu|cuda] [--no-batch-invariant]\n"
            "                    [--activations auto|f32|int8] [--kv-cache-dtype f32|f16|q8_0]\n"
            "                    [--context N]  (decode sequences prefilled with N tokens; 16)\n");
    return 2;
}

/* ---- argument parsing ---------------------------------------------------- */

static int parse_int(const char *opt, const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "bench_engine: %s: expected an integer from %d to %d, got '%s'\n", opt, lo,
                hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* "128,512" -> {128, 512}; -1 with one line on a bad or empty entry. */
static int parse_list(const char *opt, const char *s, int lo, int hi, int *out, int *n)
{
    *n = 0;
    for (const char *p = s;;) {
        size_t len = strcspn(p, ",");
        char item[32];
        if (len == 0 || len >= sizeof item) {
            fprintf(stderr, "bench_engine: %s: bad list '%s' (expected e.g. 128,512)\n", opt, s);
            return -1;
        }
        if (*n == MAX_LIST) {
            fprintf(stderr, "bench_engine: %s: more than %d entries\n", opt, MAX_LIST);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        if (parse_int(opt, item, lo, hi, &out[*n]) != 0) return -1;
        (*n)++;
        if (!p[len]) return 0;
        p += len + 1;
    }
}

/* "1-16" -> 1, 16; "4" -> 4, 4. */
static int parse_range(const char *opt, const char *s, int *a, int *b)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", s);
    char *dash = strchr(buf, '-');
    if (dash) *dash = '\0';
    if (parse_int(opt, buf, 1, MAX_BATCH, a) != 0) return -1;
    if (parse_int(opt, dash ? dash + 1 : buf, 1, MAX_BATCH, b) != 0) return -1;
    if (*b < *a) {
        fprintf(stderr, "bench_engine: %s: range '%s' ends before it starts\n", opt, s);
        return -1;
    }
    return 0;
}

/* ---- machine description ------------------------------------------------- */

/* /proc/cpuinfo's first "model name", else "unknown CPU", followed by the
 * first "cpu family" and "model" numbers when present: a VM may name every
 * generation "AMD EPYC" (family 25 is Zen 3/Zen 4, 26 is Zen 5). */
static void cpu_model_name(char *out, size_t n)
{
    snprintf(out, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512], name[256] = "", family[32] = "", model[32] = "";
    while (fgets(line, sizeof line, f) && (!*name || !*family || !*model)) {
        char *v = strchr(line, ':');
        if (!v) continue;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        v[strcspn(v, "\n")] = '\0';
        if (!*name && !strncmp(line, "model name", 10)) snprintf(name, sizeof name, "%s", v);
        else if (!*family && !strncmp(line, "cpu family", 10)) snprintf(family, sizeof family, "%s", v);
        else if (!*model && !strncmp(line, "model\t", 6)) snprintf(model, sizeof model, "%s", v);
    }
    fclose(f);
    if (*name) snprintf(out, n, "%s", name);
    if (*family && *model) {
        size_t used = strlen(out);
        snprintf(out + used, n - used, " (family %s, model %s)", family, model);
    }
}

/* Size of the last-level cache in bytes as sysconf reports it (L3, else L2),
 * 0 when unknown. */
static size_t llc_bytes(void)
{
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 > 0) return (size_t)l3;
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? (size_t)l2 : 0;
}

/* Busy jiffies of the whole machine (/proc/stat: all but idle and iowait,
 * steal included) and of this process (utime + stime of all its threads),
 * both in USER_HZ ticks. -1 when /proc cannot be read. */
static int cpu_ticks(unsigned long long *machine, unsigned long long *self)
{
    unsigned long long v[8] = { 0 };
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1;
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n != 8) return -1;
    *machine = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    char buf[1024];
    f = fopen("/proc/self/stat", "r");
    if (!f) return -1;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long ut, st;
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    *self = ut + st;
    return 0;
}

/* ---- memory read bandwidth probe ------------------------------------------ */

/* What it measures: the rate at which `threads` threads together can stream
 * a buffer far larger than the last-level cache from DRAM into registers —
 * read-only, sequential, each thread over its own contiguous share, no
 * writes (so no write-allocate or write-back traffic). That is the access
 * pattern of a decode step, which reads every weight once and writes little,
 * so bandwidth / (bytes per step) bounds decode tokens/s from above (the
 * roofline). Each thread reads its share block by block (PROBE_BLOCK_WORDS,
 * 16 MiB), each block as PROBE_STREAMS sequential streams side by side (the
 * block cut in PROBE_STREAMS equal parts, read in lockstep), as the matmul
 * kernels read a tile of weight rows at once, a few MB apart within one
 * matrix. (Streams a quarter of the whole share apart, as before
 * 2026-12-01, read 17-20 GB/s on the Zen 4 VM once the buffer reached
 * 2 GiB (the 1b shape's probe), 34 at 1 GiB, 52 at 512 MiB, while the
 * engine streamed the 1b weights at up to 54 GB/s; in 16 MiB blocks: 35-72
 * at 2 GiB, and the same as before at 512 MiB.) On a
 * 2-core AMD EPYC VM one stream per thread reached ~60 GB/s, 2 streams ~70,
 * 4 streams ~84, 8 ~75, and the engine's own batch-1 decode ran above the
 * one-stream figure, so one stream understates the roofline. The buffer is
 * written once before timing (its pages then exist and are not the shared
 * zero page); each pass is timed from the moment all threads are released
 * to the moment the last one finishes; the best of PROBE_PASSES passes is
 * reported, in GB/s (1e9 bytes/s).
 *
 * The loop is portable C: PROBE_LANES uint64_t accumulators, which gcc -O3
 * vectorizes (two lanes per SSE2 register without -march, wider with
 * -march=native); the same loop hand-written with AVX2 intrinsics (four
 * 256-bit accumulators) gave the same figure within the run-to-run noise
 * (about 3 %). A read loop this cheap is limited by memory, not by the
 * instructions. */
#define PROBE_PASSES 5
#define PAIRED_PASSES 3   /* probe passes (the best counts) before each paired decode run */
#define MAX_REPEAT 1000
#define PROBE_STREAMS 4
#define PROBE_LANES 8
#define PROBE_BLOCK_WORDS ((size_t)2 << 20) /* 16 MiB of uint64_t */

/* The probe's threads stay up between passes, so that a pass can be taken
 * right before each timed decode run (main: the paired roofline). */
typedef struct probe probe;

typedef struct {
    probe *pr;
    uint64_t *p;
    size_t n_words;        /* a multiple of PROBE_STREAMS * PROBE_LANES */
    uint64_t sink;         /* this thread's sums */
} probe_arg;

struct probe {
    int threads;
    size_t bytes;
    uint64_t *buf;
    pthread_barrier_t bar;
    pthread_t *tid;
    probe_arg *args;
    bool quit;             /* read by the threads after a start barrier */
};

/* The sums end here, so the compiler cannot drop the reads. */
static volatile uint64_t probe_sink;

/* Sum of n words (a multiple of PROBE_STREAMS * PROBE_LANES) read block
 * by block, each block as PROBE_STREAMS streams in lockstep. */
static uint64_t read_sum(const uint64_t *restrict p, size_t n)
{
    uint64_t acc[PROBE_LANES] = { 0 };
    for (size_t b = 0; b < n; b += PROBE_BLOCK_WORDS) {
        const size_t m = n - b < PROBE_BLOCK_WORDS ? n - b : PROBE_BLOCK_WORDS;
        const size_t part = m / PROBE_STREAMS;
        const uint64_t *q = p + b;
        for (size_t i = 0; i < part; i += PROBE_LANES)
            for (int s = 0; s < PROBE_STREAMS; s++)
                for (int j = 0; j < PROBE_LANES; j++) acc[j] += q[(size_t)s * part + i + j];
    }
    uint64_t sum = 0;
    for (int j = 0; j < PROBE_LANES; j++) sum += acc[j];
    return sum;
}

static void *probe_thread(void *v)
{
    probe_arg *a = v;
    for (size_t i = 0; i < a->n_words; i++) a->p[i] = i; /* first touch, by this thread */
    pthread_barrier_wait(&a->pr->bar);                  /* touched */
    for (;;) {
        pthread_barrier_wait(&a->pr->bar);              /* start (or quit) */
        if (a->pr->quit) break;
        a->sink += read_sum(a->p, a->n_words / 4 / (PROBE_STREAMS * PROBE_LANES) * (PROBE_STREAMS * PROBE_LANES)); /* untimed: wakes the CPU */
        pthread_barrier_wait(&a->pr->bar);              /* timing starts */
        a->sink += read_sum(a->p, a->n_words);
        pthread_barrier_wait(&a->pr->bar);              /* done */
    }
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Map and touch about `bytes` (split over `threads` threads, which stay
 * parked on a barrier). NULL with one line on stderr. */
static probe *probe_open(int threads, size_t bytes)
{
    probe *pr = calloc(1, sizeof *pr);
    if (!pr) {
        fprintf(stderr, "bench_engine: bandwidth probe: out of memory\n");
        return NULL;
    }
    size_t share = bytes / sizeof(uint64_t) / (size_t)threads;
    share -= share % (PROBE_STREAMS * PROBE_LANES);
    pr->threads = threads;
    pr->bytes = share * sizeof(uint64_t) * (size_t)threads;
    pr->buf = mmap(NULL, pr->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pr->buf == MAP_FAILED) {
        fprintf(stderr, "bench_engine: bandwidth probe: cannot map %zu bytes\n", pr->bytes);
        free(pr);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    /* on 2 MiB pages where the kernel has them, as the engine's weights
     * (cpu_engine.c), so the probe walks the same kind of pages; a hint */
    (void)madvise(pr->buf, pr->bytes, MADV_HUGEPAGE);
#endif
    pthread_barrier_init(&pr->bar, NULL, (unsigned)threads + 1);
    pr->tid = calloc((size_t)threads, sizeof *pr->tid);
    pr->args = calloc((size_t)threads, sizeof *pr->args);
    if (!pr->tid || !pr->args) {
        fprintf(stderr, "bench_engine: bandwidth probe: out of memory\n");
        exit(1);
    }
    for (int t = 0; t < threads; t++) {
        pr->args[t] = (probe_arg){ pr, pr->buf + (size_t)t * share, share, 0 };
        if (pthread_create(&pr->tid[t], NULL, probe_thread, &pr->args[t]) != 0) {
            fprintf(stderr, "bench_engine: bandwidth probe: cannot start thread %d\n", t);
            exit(1);
        }
    }
    pthread_barrier_wait(&pr->bar); /* every share touched */
    return pr;
}

/* One pass over the whole buffer: GB/s (1e9 bytes/s), timed from the
 * release of the threads to the end of the last one. */
static double probe_pass(probe *pr)
{
    /* let the engine's pool workers finish spinning and sleep first (on a
     * 2-CPU machine a third runnable thread would time-slice the probe) */
    nanosleep(&(struct timespec){ 0, 1000 * 1000 }, NULL);
    pthread_barrier_wait(&pr->bar);
    pthread_barrier_wait(&pr->bar); /* after a short untimed read that wakes the CPUs up */
    double t0 = now_s();
    pthread_barrier_wait(&pr->bar);
    return (double)pr->bytes / (now_s() - t0) / 1e9;
}

static void probe_close(probe *pr)
{
    if (!pr) return;
    pr->quit = true;
    pthread_barrier_wait(&pr->bar);
    uint64_t sink = 0;
    for (int t = 0; t < pr->threads; t++) {
        pthread_join(pr->tid[t], NULL);
        sink ^= pr->args[t].sink;
    }
    probe_sink = sink;
    pthread_barrier_destroy(&pr->bar);
    free(pr->tid);
    free(pr->args);
    munmap(pr->buf, pr->bytes);
    free(pr);
}

/* ---- FMA peak probe ------------------------------------------------------------ */

/* What it measures: the float32 fused multiply-add rate of `threads`
 * threads together, each running FMA_CHAINS independent chains of vector
 * FMAs (a * x + y, the accumulators stay in registers) with the widest
 * vectors of the kernel set the engine chose: 16 lanes for avx512, 8 for
 * avx2. 2 FLOP per lane per FMA. Prefill and batched decode are products
 * of F16/BF16 weights by F32 activations accumulated in F32 FMAs (F16
 * widened in registers), so this bounds their tokens/s from above: a
 * compute roofline beside the memory one. Twelve chains cover the FMA
 * latency (4 cycles) times the FMA issue width (2) of current x86 cores.
 * Each pass is timed from the release of the threads (after a short
 * untimed run that wakes the CPUs up) to the end of the last one; the best
 * of FMA_PASSES passes counts, in GFLOP/s (1e9 FLOP/s). */
#define FMA_CHAINS 12
#define FMA_ITERS (1 << 23) /* per thread per pass: 100 M vector FMAs, ~30 ms */
#define FMA_PASSES 5

#if defined(__x86_64__) || defined(__i386__)
static volatile float fma_sink;

#define FMA_BODY(V, FMA, SET1, ITERS)                                                   \
    V x = SET1(0.999f), y = SET1(1e-4f);                                                \
    V a0 = SET1(0.f), a1 = SET1(1.f), a2 = SET1(2.f), a3 = SET1(3.f), a4 = SET1(4.f);   \
    V a5 = SET1(5.f), a6 = SET1(6.f), a7 = SET1(7.f), a8 = SET1(8.f), a9 = SET1(9.f);   \
    V a10 = SET1(10.f), a11 = SET1(11.f);                                               \
    for (long i = 0; i < (ITERS); i++) {                                                \
        a0 = FMA(a0, x, y); a1 = FMA(a1, x, y); a2 = FMA(a2, x, y);                     \
        a3 = FMA(a3, x, y); a4 = FMA(a4, x, y); a5 = FMA(a5, x, y);                     \
        a6 = FMA(a6, x, y); a7 = FMA(a7, x, y); a8 = FMA(a8, x, y);                     \
        a9 = FMA(a9, x, y); a10 = FMA(a10, x, y); a11 = FMA(a11, x, y);                 \
    }                                                                                   \
    V s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;                 \
    fma_sink = s[0];

__attribute__((target("avx512f"))) static void fma_run_16(long iters)
{
    FMA_BODY(__m512, _mm512_fmadd_ps, _mm512_set1_ps, iters)
}

__attribute__((target("avx2,fma"))) static void fma_run_8(long iters)
{
    FMA_BODY(__m256, _mm256_fmadd_ps, _mm256_set1_ps, iters)
}
#endif

typedef struct {
    pthread_barrier_t *bar;
    int lanes;
    double t0, t1;
} fma_arg;

static void fma_run(int lanes, long iters)
{
#if defined(__x86_64__) || defined(__i386__)
    if (lanes == 16) fma_run_16(iters);
    else fma_run_8(iters);
#else
    (void)lanes;
    (void)iters;
#endif
}

static void *fma_thread(void *v)
{
    fma_arg *a = v;
    fma_run(a->lanes, FMA_ITERS / 2); /* untimed: wakes the CPU, settles its clock */
    pthread_barrier_wait(a->bar);
    a->t0 = now_s();
    fma_run(a->lanes, FMA_ITERS);
    a->t1 = now_s();
    return NULL;
}

/* Vector lanes of the FMA probe for the engine's kernel set: 16 for
 * avx512, 8 for avx2, 0 (no probe) for the portable set or another CPU. */
static int fma_lanes(const char *kernels)
{
#if defined(__x86_64__) || defined(__i386__)
    if (!strcmp(kernels, "avx512")) return 16;
    if (!strcmp(kernels, "avx2")) return 8;
#else
    (void)kernels;
#endif
    return 0;
}

/* Best of FMA_PASSES passes of `threads` threads, GFLOP/s; 0 when lanes
 * is 0. Exits with one line on stderr when memory or a thread cannot be
 * had. */
static double fma_peak(int threads, int lanes)
{
    if (!lanes) return 0;
    double best = 0;
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    fma_arg *args = calloc((size_t)threads, sizeof *args);
    pthread_barrier_t bar;
    if (!tid || !args) {
        fprintf(stderr, "bench_engine: FMA probe: out of memory\n");
        exit(1);
    }
    for (int pass = 0; pass < FMA_PASSES; pass++) {
        /* as probe_pass: the engine's pool workers go to sleep first */
        nanosleep(&(struct timespec){ 0, 1000 * 1000 }, NULL);
        pthread_barrier_init(&bar, NULL, (unsigned)threads);
        int started = 0;
        for (; started < threads; started++) {
            args[started] = (fma_arg){ &bar, lanes, 0, 0 };
            if (pthread_create(&tid[started], NULL, fma_thread, &args[started]) != 0) break;
        }
        if (started < threads) { /* the barrier would never open: not joinable */
            fprintf(stderr, "bench_engine: FMA probe: cannot start thread %d\n", started);
            exit(1);
        }
        double t0 = 1e300, t1 = 0;
        for (int t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            if (args[t].t0 < t0) t0 = args[t].t0;
            if (args[t].t1 > t1) t1 = args[t].t1;
        }
        pthread_barrier_destroy(&bar);
        double flops = 2.0 * lanes * FMA_CHAINS * (double)FMA_ITERS * threads;
        if (t1 > t0 && flops / (t1 - t0) / 1e9 > best) best = flops / (t1 - t0) / 1e9;
    }
    free(tid);
    free(args);
    return best;
}

/* FLOP per token of a prefill of n tokens in one call: the products of
 * every layer (q, k, v, o, gate, up, down: 2 FLOP per weight per token),
 * attention (q.k and the weighted sum of v over the token's p + 1
 * positions, 2 x 2 x q_dim FLOP per position, p averaging (n - 1) / 2),
 * and lm_head for the last token only, spread over the n. Norms, RoPE and
 * the softmax (a few FLOP per element) are left out. */
static double prefill_flops_per_token(const dol_model_config *c, int n)
{
    const double d = c->hidden_size, f = c->intermediate_size;
    const double q = (double)c->n_heads * c->head_dim, kv = (double)c->n_kv_heads * c->head_dim;
    const double per_layer = 2.0 * (d * q + 2.0 * d * kv + q * d + 3.0 * d * f) +
                             4.0 * q * ((n - 1) / 2.0 + 1.0);
    return c->n_layers * per_layer + 2.0 * d * c->vocab_size / n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- engine measurements ---------------------------------------------------- */

typedef struct {
    dol_engine *e;
    int V, decode;
    const int32_t *toks;
    float *logits;
    bool progress;
    probe *pr;          /* CPU backend: the bandwidth probe, else NULL */
    size_t step_bytes;  /* weight bytes streamed per decode step */
    double best_gbs;    /* best probe pass of the run so far (GB/s) */
    int n_paired;       /* decode_tps(B = 1) runs with pr so far, and for each */
    double share[MAX_REPEAT]; /* its share of the roofline of its own probe passes */
    double gbs[MAX_REPEAT];   /* the best of those passes (GB/s) */
} bench;

static void progress(const bench *b, const char *what, int n)
{
    if (b->progress) fprintf(stderr, "\rbench: %s %d ...          ", what, n);
}

/* One probe pass (GB/s), kept in b->best_gbs when it is the best so far. */
static double bench_probe(bench *b)
{
    double g = probe_pass(b->pr);
    if (g > b->best_gbs) b->best_gbs = g;
    return g;
}

/* Prefill tokens/s for one prompt of n tokens: one untimed warm-up call
 * (when `warm`), then the best of `reps` calls. -1 on an engine error
 * (printed). */
static double prefill_tps(bench *b, int n, int reps, bool warm)
{
    char err[DOL_ERR_LEN];
    progress(b, "prefill", n);
    int s = dol_engine_seq_new(b->e);
    if (s < 0 || dol_engine_seq_reserve(b->e, s, n) != 0) {
        fprintf(stderr, "\nbench_engine: prefill %d: no sequence slot or KV blocks for the prompt\n", n);
        dol_engine_seq_free(b->e, s);
        return -1;
    }
    dol_batch_item it = { s, n, b->toks, 0, 1, b->logits };
    double best = 1e300;
    for (int rep = warm ? 0 : 1; rep <= reps; rep++) {
        double t0 = dol_now_ms();
        if (dol_engine_forward(b->e, &it, 1, err, sizeof err) != 0) {
            fprintf(stderr, "\nbench_engine: prefill %d: %s\n", n, err);
            dol_engine_seq_free(b->e, s);
            return -1;
        }
        double ms = dol_now_ms() - t0;
        if (rep > 0 && ms < best) best = ms; /* rep 0 is the warm-up */
    }
    dol_engine_seq_free(b->e, s);
    return n / (best / 1000.0);
}

/* Decode tokens/s at batch B: B sequences each prefilled with g_context
 * tokens (untimed), one untimed warm-up step, then `reps` timed runs of
 * `decode` steps at positions g_context.. (each run overwrites the same
 * positions, so all runs do the same work); the best run counts. -1 on an
 * engine error (printed).
 *
 * At batch 1 with a probe, each timed run comes right after PAIRED_PASSES
 * probe passes, and the run's share of the roofline is taken against the
 * best of them (one pass lasts a few ms, so a single one is at the mercy of
 * one descheduling of a thread): run tokens/s x step bytes / that
 * bandwidth. On a shared machine whose memory bandwidth drifts with its
 * neighbours (a cloud VM), a ratio of two measurements taken seconds apart
 * is far steadier than the best decode run against the best probe pass
 * taken minutes apart. Each such run adds its share and its bandwidth to
 * b->share and b->gbs (main takes the medians). */
static double decode_tps(bench *b, int B, int reps)
{
    char err[DOL_ERR_LEN];
    int seqs[MAX_BATCH];
    dol_batch_item items[MAX_BATCH];
    double best = 1e300;
    progress(b, "decode batch", B);
    for (int i = 0; i < B; i++) seqs[i] = -1;
    for (int i = 0; i < B; i++) {
        seqs[i] = dol_engine_seq_new(b->e);
        if (seqs[i] < 0 || dol_engine_seq_reserve(b->e, seqs[i], g_context + b->decode) != 0) {
            fprintf(stderr, "\nbench_engine: decode batch %d: no sequence slot or KV blocks\n", B);
            goto fail_free;
        }
        dol_batch_item pi = { seqs[i], g_context, b->toks + i, 0, 1, b->logits };
        if (dol_engine_forward(b->e, &pi, 1, err, sizeof err) != 0) goto fail;
    }
    const bool pair = B == 1 && b->pr;
    double gbs = 0;
    for (int rep = 0; rep <= reps; rep++) {
        int steps = rep == 0 ? 1 : b->decode; /* rep 0: one warm-up step */
        if (pair && rep > 0) {
            gbs = 0;
            for (int k = 0; k < PAIRED_PASSES; k++) {
                double g = bench_probe(b);
                if (g > gbs) gbs = g;
            }
        }
        double t0 = dol_now_ms();
        for (int step = 0; step < steps; step++) {
            for (int i = 0; i < B; i++)
                items[i] = (dol_batch_item){ seqs[i], 1, b->toks + g_context + step + i,
                                             g_context + step, 1, b->logits + (size_t)i * b->V };
            if (dol_engine_forward(b->e, items, B, err, sizeof err) != 0) goto fail;
        }
        double ms = dol_now_ms() - t0;
        if (rep > 0 && ms < best) best = ms;
        if (pair && rep > 0 && b->n_paired < MAX_REPEAT) {
            b->share[b->n_paired] = b->decode / (ms / 1000.0) * (double)b->step_bytes / (gbs * 1e9);
            b->gbs[b->n_paired++] = gbs;
        }
    }
    for (int i = 0; i < B; i++) dol_engine_seq_free(b->e, seqs[i]);
    return (double)B * b->decode / (best / 1000.0);
fail:
    fprintf(stderr, "\nbench_engine: decode batch %d: %s\n", B, err);
fail_free:
    for (int i = 0; i < B; i++) dol_engine_seq_free(b->e, seqs[i]);
    return -1;
}

/* ---- the table ----------------------------------------------------------------- */

typedef struct {
    char label[64];
    char value[64];
} row;

__attribute__((format(printf, 4, 5)))
static void add_row(row *rows, int *n, const char *label, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    snprintf(rows[*n].label, sizeof rows[*n].label, "%s", label);
    vsnprintf(rows[*n].value, sizeof rows[*n].value, fmt, ap);
    va_end(ap);
    (*n)++;
}

/* The format the engine holds the linear layers in. AUTO keeps the
 * checkpoint's precision where the backend can (or widens it): the resident
 * bytes per weight against F16 tell which. */
static const char *format_name(dol_weight_format wf, const dol_model *m, const dol_quant_stats *qs)
{
    switch (wf) {
    case DOL_WEIGHTS_F32: return "f32";
    case DOL_WEIGHTS_F16: return "f16";
    case DOL_WEIGHTS_NF4: return "nf4";
    case DOL_WEIGHTS_INT8: return "int8";
    default: break;
    }
    dol_dtype ck = m->layers[0].q.dtype;
    if (dol_dtype_is_block(ck)) return "as stored";   /* GGUF block types, read in place */
    if (qs->linear_f16_bytes > 0) {
        double ratio = (double)qs->linear_bytes / (double)qs->linear_f16_bytes;
        if (ratio > 1.5) return "f32";
        return ck == DOL_DTYPE_BF16 ? "bf16" : "f16";
    }
    return ck == DOL_DTYPE_F32 ? "f32" : ck == DOL_DTYPE_F16 ? "f16" : "bf16";
}

int main(int argc, char **argv)
{
    if (argc < 2 || argv[1][0] == '-') return usage();
    const char *dir = argv[1];
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), decode = 32, repeat = 3;
    int prompts[MAX_LIST] = { 128, 512 }, n_prompts = 2;
    int batches[MAX_LIST] = { 1, 8 }, n_batches = 2;
    int sweep_a = 0, sweep_b = 0;
    const char *sweep_out = NULL;
    bool markdown = false, quantize_lm_head = false, fast_prefill = false;
    dol_weight_format wf = DOL_WEIGHTS_AUTO;
    dol_backend_kind backend = DOL_BACKEND_AUTO;
    dol_activations act = DOL_ACT_AUTO;
    dol_kv_dtype kvt = DOL_KV_AUTO;
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--markdown")) { markdown = true; continue; }
        if (!strcmp(o, "--quantize-lm-head")) { quantize_lm_head = true; continue; }
        if (!strcmp(o, "--no-batch-invariant")) { fast_prefill = true; continue; }
        if (i + 1 >= argc) {
            if (!strncmp(o, "--", 2)) fprintf(stderr, "bench_engine: %s: missing value\n", o);
            return usage();
        }
        const char *v = argv[++i];
        int rc = 0;
        if (!strcmp(o, "--threads")) rc = parse_int(o, v, 1, 1024, &threads);
        else if (!strcmp(o, "--prompt")) { rc = parse_int(o, v, 1, 1 << 20, &prompts[0]); n_prompts = 1; }
        else if (!strcmp(o, "--prompts")) rc = parse_list(o, v, 1, 1 << 20, prompts, &n_prompts);
        else if (!strcmp(o, "--decode")) rc = parse_int(o, v, 1, 1 << 20, &decode);
        else if (!strcmp(o, "--context")) rc = parse_int(o, v, 1, 1 << 20, &g_context);
        else if (!strcmp(o, "--kv-cache-dtype")) {
            if (!strcmp(v, "f32")) kvt = DOL_KV_F32;
            else if (!strcmp(v, "f16")) kvt = DOL_KV_F16;
            else if (!strcmp(v, "q8_0")) kvt = DOL_KV_Q8_0;
            else {
                fprintf(stderr, "bench_engine: --kv-cache-dtype: expected f32, f16 or q8_0, got '%s'\n", v);
                return 2;
            }
        }
        else if (!strcmp(o, "--batches")) rc = parse_list(o, v, 1, MAX_BATCH, batches, &n_batches);
        else if (!strcmp(o, "--repeat")) rc = parse_int(o, v, 1, MAX_REPEAT, &repeat);
        else if (!strcmp(o, "--sweep")) rc = parse_range(o, v, &sweep_a, &sweep_b);
        else if (!strcmp(o, "--sweep-out")) sweep_out = v;
        else if (!strcmp(o, "--weights")) {
            if (!strcmp(v, "f32")) wf = DOL_WEIGHTS_F32;
            else if (!strcmp(v, "f16")) wf = DOL_WEIGHTS_F16;
            else if (!strcmp(v, "nf4")) wf = DOL_WEIGHTS_NF4;
            else if (!strcmp(v, "int8")) wf = DOL_WEIGHTS_INT8;
            else if (!strcmp(v, "auto")) wf = DOL_WEIGHTS_AUTO;
            else {
                fprintf(stderr, "bench_engine: --weights: expected auto, f32, f16, nf4 or int8, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(o, "--activations")) {
            if (!strcmp(v, "f32")) act = DOL_ACT_F32;
            else if (!strcmp(v, "int8")) act = DOL_ACT_INT8;
            else if (!strcmp(v, "auto")) act = DOL_ACT_AUTO;
            else {
                fprintf(stderr, "bench_engine: --activations: expected auto, f32 or int8, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(o, "--backend")) {
            if (!strcmp(v, "cpu")) backend = DOL_BACKEND_CPU;
            else if (!strcmp(v, "cuda")) backend = DOL_BACKEND_CUDA;
            else if (!strcmp(v, "auto")) backend = DOL_BACKEND_AUTO;
            else {
                fprintf(stderr, "bench_engine: --backend: expected auto, cpu or cuda, got '%s'\n", v);
                return 2;
            }
        } else return usage();
        if (rc != 0) return 2;
    }
    if (sweep_out && !sweep_a) {
        fprintf(stderr, "bench_engine: --sweep-out: needs --sweep A-B\n");
        return 2;
    }
    const char *thr = threads == 1 ? "thread" : "threads";
    /* opened before the run, so a bad path fails before minutes of measuring */
    FILE *f = NULL;
    if (sweep_out && !(f = fopen(sweep_out, "w"))) {
        fprintf(stderr, "bench_engine: --sweep-out %s: cannot open for writing\n", sweep_out);
        return 1;
    }

    char err[DOL_ERR_LEN];
    dol_model *m = NULL;
    if (dol_model_load(dir, &m, err, sizeof err) != 0) {
        fprintf(stderr, "bench_engine: %s: %s\n", dir, err);
        return 1;
    }
    const dol_model_config *c = &m->cfg;
    int ctx = c->max_position_embeddings;
    if (g_context + decode > ctx) {
        fprintf(stderr, "bench_engine: --decode %d: %d + %d positions exceed the context (%d)\n",
                decode, g_context, decode, ctx);
        return 2;
    }

    /* Size the engine from the largest prompt that fits the context and the
     * largest batch: the workspace holds a whole prompt in one call, the KV
     * pool holds either that prompt or every decode sequence. */
    int max_prompt = 0, max_b = sweep_b;
    for (int i = 0; i < n_prompts; i++)
        if (prompts[i] <= ctx && prompts[i] > max_prompt) max_prompt = prompts[i];
    for (int i = 0; i < n_batches; i++)
        if (batches[i] > max_b) max_b = batches[i];
    const int bs = 16;
    int64_t seq_tokens = (g_context + decode + bs - 1) / bs * bs;
    int64_t kv_tokens = (int64_t)max_b * seq_tokens;
    if ((int64_t)(max_prompt + bs - 1) / bs * bs > kv_tokens) kv_tokens = (int64_t)(max_prompt + bs - 1) / bs * bs;
    int max_tokens = max_prompt > max_b ? max_prompt : max_b;
    if (max_tokens < g_context) max_tokens = g_context;
    dol_engine_params ep = { .backend = backend, .gpu_memory_utilization = 0.90,
                             .n_threads = threads, .kv_block_size = bs,
                             .kv_cache_tokens = kv_tokens, .max_seqs = max_b + 1,
                             .max_batch_tokens = max_tokens, .context_len = 0,
                             .weights = wf, .quantize_lm_head = quantize_lm_head,
                             .fast_prefill = fast_prefill, .activations = act, .kv_dtype = kvt };
    double t0 = dol_now_ms();
    dol_engine *e = NULL;
    if (dol_engine_create(m, &ep, &e, err, sizeof err) != 0) {
        fprintf(stderr, "bench_engine: %s: %s\n", m->name, err);
        return 1;
    }
    double t_ready = dol_now_ms() - t0;
    ctx = dol_engine_context_len(e);
    int V = dol_engine_vocab_size(e);

    /* Bytes one decode step streams at batch 1: every linear layer (q, k, v,
     * o, gate, up, down of every layer, and lm_head) as the engine holds it,
     * the norms (held as F32), and one row of the embedding table. The KV
     * cache read by attention (a few hundred positions here) is left out. */
    size_t embed_bytes = dol_tensor_bytes(&m->embed);
    dol_quant_stats qs;
    dol_engine_quant_stats(e, &qs);
    size_t linear = qs.linear_bytes ? qs.linear_bytes : dol_engine_weight_bytes(e) - embed_bytes;
    size_t norms = (size_t)(2 * c->n_layers + 1) * (size_t)c->hidden_size * sizeof(float);
    size_t step_bytes = linear + norms + dol_dtype_row_bytes(m->embed.dtype, c->hidden_size);

    /* header */
    char date[32], cpu[256];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", localtime(&now));
    cpu_model_name(cpu, sizeof cpu);
    const char *fmt = format_name(wf, m, &qs);
    const char *be = dol_engine_backend_name(e);
    char kernels[96] = "";
    if (!strcmp(be, "cpu"))
        snprintf(kernels, sizeof kernels, ", kernels %s, activations %s", dol_engine_cpu_kernels(),
                 dol_engine_activations(e));
    char kvinfo[64];
    snprintf(kvinfo, sizeof kvinfo, " | KV %s, decode after %d tokens", dol_engine_kv_dtype_name(e), g_context);
    char header[1024];
    snprintf(header, sizeof header,
             "%s | %s: %d layers, hidden %d, ffn %d, heads %d/%d kv, vocab %d, context %d | "
             "weights %s (checkpoint %s) | backend %s%s, %d %s%s | %s",
             date, m->name, c->n_layers, c->hidden_size, c->intermediate_size, c->n_heads,
             c->n_kv_heads, V, ctx, fmt, dol_dtype_name(m->layers[0].q.dtype), be, kernels,
             threads, thr, kvinfo, cpu);
    char detail[512];
    snprintf(detail, sizeof detail, "resident weights %.1f MiB, ready in %.0f ms",
             dol_engine_weight_bytes(e) / 1048576.0, t_ready);
    if (qs.n_quantized > 0) {
        size_t used = strlen(detail);
        snprintf(detail + used, sizeof detail - used,
                 "; quantized %d matrices to %s in %.2f s (linear layers %.3f x F16, lm_head %s)",
                 qs.n_quantized, fmt, qs.quant_seconds,
                 (double)qs.linear_bytes / (double)qs.linear_f16_bytes,
                 quantize_lm_head ? "quantized" : "kept");
    }

    /* bandwidth probe: >= 4 x LLC, >= 512 MiB, >= 2 x weights, <= 2 GiB */
    size_t probe = (size_t)512 << 20;
    if (4 * llc_bytes() > probe) probe = 4 * llc_bytes();
    if (2 * dol_engine_weight_bytes(e) > probe) probe = 2 * dol_engine_weight_bytes(e);
    if (probe > (size_t)2 << 30) probe = (size_t)2 << 30;
    unsigned long long mach0 = 0, self0 = 0, mach1 = 0, self1 = 0;
    int have_ticks = cpu_ticks(&mach0, &self0) == 0;
    double wall0 = now_s();
    bench b = { .e = e, .V = V, .decode = decode, .progress = isatty(2) };
    /* The probe measures host memory: it bounds the CPU backend only (a GPU
     * backend's roofline is its device bandwidth, scripts/gpu-check.sh). */
    bool cpu_backend = !strcmp(be, "cpu");
    double roofline = 0;
    b.step_bytes = step_bytes;
    if (cpu_backend) {
        if (b.progress) fprintf(stderr, "bench: memory bandwidth probe (%zu MiB) ...", probe >> 20);
        if (!(b.pr = probe_open(threads, probe))) return 1;
        for (int pass = 0; pass < PROBE_PASSES; pass++) bench_probe(&b);
    }
    /* the compute roofline: taken before and after the rounds, the best counts */
    const int lanes = cpu_backend ? fma_lanes(dol_engine_cpu_kernels()) : 0;
    double peak = fma_peak(threads, lanes);

    int n_toks = max_prompt + g_context + decode + max_b + 1;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n_toks);
    float *logits = NULL; /* on a cache line, as the server's (scheduler.c) */
    if (posix_memalign((void **)&logits, 64, sizeof(float) * (size_t)V * (size_t)max_b) != 0) logits = NULL;
    if (!toks || !logits) { fprintf(stderr, "bench_engine: out of memory for tokens and logits\n"); return 1; }
    for (int i = 0; i < n_toks; i++) toks[i] = 3 + (int32_t)((int64_t)i * 7919 % (V - 3));
    b.toks = toks;
    b.logits = logits;

    /* The table's figures and the sweep, in rounds: each round times every
     * prompt length once (after its own warm-up call) and every batch size
     * of --batches and --sweep once; each figure is the best of its
     * rounds. */
    double prefill[MAX_LIST] = { 0 };
    double measured[MAX_BATCH + 1] = { 0 };
    bool listed1 = false; /* batch 1 in --batches: the rows relative to it */
    for (int i = 0; i < n_batches; i++) listed1 |= batches[i] == 1;
    for (int round = 0; round < repeat; round++) {
        for (int i = 0; i < n_prompts; i++) {
            if (prompts[i] > ctx) continue;
            double tps = prefill_tps(&b, prompts[i], 1, true);
            if (tps < 0) return 1;
            if (tps > prefill[i]) prefill[i] = tps;
        }
        bool done[MAX_BATCH + 1] = { false }; /* a batch size listed twice runs once a round */
        for (int i = 0; i < n_batches + (sweep_a ? sweep_b - sweep_a + 1 : 0); i++) {
            int B = i < n_batches ? batches[i] : sweep_a + (i - n_batches);
            if (done[B]) continue;
            done[B] = true;
            double tps = decode_tps(&b, B, 1);
            if (tps < 0) return 1;
            if (tps > measured[B]) measured[B] = tps;
        }
    }
    if (cpu_backend) roofline = b.best_gbs * 1e9 / (double)step_bytes;
    double peak2 = fma_peak(threads, lanes);
    if (peak2 > peak) peak = peak2;

    row rows[4 * MAX_LIST + 12];
    int n_rows = 0;
    char label[64];
    char na[64];
    snprintf(na, sizeof na, "n/a (backend %s)", be);
    if (cpu_backend) add_row(rows, &n_rows, "memory read bandwidth (GB/s)", "%.1f", b.best_gbs);
    else add_row(rows, &n_rows, "memory read bandwidth (GB/s)", "%s", na);
    add_row(rows, &n_rows, "weight bytes per decode step (MB)", "%.1f", step_bytes / 1e6);
    if (cpu_backend) add_row(rows, &n_rows, "roofline decode tokens/s (batch 1)", "%.1f", roofline);
    else add_row(rows, &n_rows, "roofline decode tokens/s (batch 1)", "%s", na);
    if (peak > 0) add_row(rows, &n_rows, "FMA peak (GFLOP/s, f32)", "%.1f", peak);
    else add_row(rows, &n_rows, "FMA peak (GFLOP/s, f32)", "n/a (backend %s, kernels %s)", be,
                 cpu_backend ? dol_engine_cpu_kernels() : "-");
    for (int i = 0; i < n_prompts; i++) {
        snprintf(label, sizeof label, "prefill tokens/s @%d", prompts[i]);
        if (prompts[i] > ctx) add_row(rows, &n_rows, label, "n/a (context %d)", ctx);
        else add_row(rows, &n_rows, label, "%.1f", prefill[i]);
    }
    for (int i = 0; i < n_prompts && peak > 0; i++) {
        if (prompts[i] > ctx) continue;
        snprintf(label, sizeof label, "prefill @%d %% of FMA peak", prompts[i]);
        add_row(rows, &n_rows, label, "%.0f %% (%.1f MFLOP/token)",
                100.0 * prefill[i] * prefill_flops_per_token(c, prompts[i]) / (peak * 1e9),
                prefill_flops_per_token(c, prompts[i]) / 1e6);
    }
    for (int i = 0; i < n_batches; i++) {
        snprintf(label, sizeof label, "decode tokens/s batch %d", batches[i]);
        add_row(rows, &n_rows, label, "%.1f", measured[batches[i]]);
    }
    if (listed1) {
        for (int i = 0; i < n_batches; i++) {
            if (batches[i] == 1) continue;
            snprintf(label, sizeof label, "batch %d / batch 1", batches[i]);
            add_row(rows, &n_rows, label, "%.2fx", measured[batches[i]] / measured[1]);
        }
        if (cpu_backend) {
            add_row(rows, &n_rows, "decode batch 1 % of roofline", "%.0f %%", 100.0 * measured[1] / roofline);
            if (b.n_paired > 0) {
                add_row(rows, &n_rows, "paired: probe before each run (GB/s, median)", "%.1f",
                        median(b.gbs, b.n_paired));
                add_row(rows, &n_rows, "paired: decode batch 1 % of that probe (median)", "%.0f %%",
                        100.0 * median(b.share, b.n_paired));
            }
        } else {
            add_row(rows, &n_rows, "decode batch 1 % of roofline", "%s", na);
        }
    }
    probe_close(b.pr);
    b.pr = NULL;
    if (b.progress) fprintf(stderr, "\r%60s\r", "");
    /* Share of the machine's CPU time that other processes took while this
     * one measured: well above 0 % means the figures are from a busy machine. */
    double wall = now_s() - wall0, busy_share = 0;
    long hz = sysconf(_SC_CLK_TCK), ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (have_ticks && cpu_ticks(&mach1, &self1) == 0 && hz > 0 && ncpu > 0 && wall > 0) {
        double other = ((double)(mach1 - mach0) - (double)(self1 - self0)) / (double)hz;
        if (other < 0) other = 0;
        double share = 100.0 * other / (wall * (double)ncpu);
        size_t used = strlen(detail);
        snprintf(detail + used, sizeof detail - used, "; other processes used %.0f %% of the %ld CPUs",
                 share, ncpu);
        busy_share = share;
    }

    if (markdown) {
        printf("%s  \n%s\n\n| %s (%s, %d %s) | value |\n|---|---:|\n", header, detail, m->name,
               fmt, threads, thr);
        for (int i = 0; i < n_rows; i++) printf("| %s | %s |\n", rows[i].label, rows[i].value);
    } else {
        int w = 6;
        for (int i = 0; i < n_rows; i++)
            if ((int)strlen(rows[i].label) > w) w = (int)strlen(rows[i].label);
        printf("%s\n%s\n%-*s  %s\n", header, detail, w, "metric", "value");
        for (int i = 0; i < n_rows; i++) printf("%-*s  %s\n", w, rows[i].label, rows[i].value);
    }

    if (sweep_a) {
        printf(markdown ? "\n```\n" : "\n");
        for (int pass = 0; pass < 2; pass++) {
            FILE *o = pass == 0 ? stdout : f;
            if (!o) continue;
            fprintf(o, "# decode tokens/s by batch size: %s, weights %s, %d %s, %s\n", m->name,
                    fmt, threads, thr, date);
            fprintf(o, "# batch\ttokens_per_s\n");
            for (int B = sweep_a; B <= sweep_b; B++) fprintf(o, "%d\t%.2f\n", B, measured[B]);
        }
        if (markdown) printf("```\n");
        if (f && fclose(f) != 0) {
            fprintf(stderr, "bench_engine: --sweep-out %s: write failed\n", sweep_out);
            return 1;
        }
    }
    fflush(stdout);
    if (busy_share > 10)
        fprintf(stderr, "bench_engine: warning: other processes used %.0f %% of the CPUs during "
                        "the run; these figures are low and noisy\n", busy_share);
    free(logits);
    free(toks);
    dol_engine_free(e);
    dol_model_free(m);
    return 0;
}
