/* tools/bench_engine.c — engine-level roofline benchmark for a model
 * directory (no HTTP): a streaming-read memory bandwidth probe run in the
 * same process with the same thread count, the weight bytes one decode step
 * streams, the roofline decode tokens/s they imply, prefill tokens/s at
 * several prompt lengths, decode tokens/s at several batch sizes (one forward
 * call per step over all sequences), and optionally a decode sweep over a
 * range of batch sizes as a two-column block for gnuplot. Prints one aligned
 * table (or a Markdown table). On the CPU backend the share of the roofline
 * is given twice: the best decode run against the best probe pass, and the
 * median over decode runs each taken right after its own probe pass (the
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

#include "dolphin/engine.h"
#include "dolphin/model.h"

#define MAX_LIST 64       /* entries in --prompts / --batches */
#define MAX_BATCH 256     /* largest decode batch */
#define SHORT_PROMPT 16   /* tokens each decode sequence is prefilled with */

static int usage(void)
{
    fprintf(stderr,
            "usage: bench_engine MODEL_DIR [--threads N] [--prompts 128,512 | --prompt N]\n"
            "                    [--decode N] [--batches 1,8] [--repeat N]\n"
            "                    [--sweep A-B] [--sweep-out FILE] [--markdown]\n"
            "                    [--weights auto|f32|f16|nf4] [--backend auto|cpu|cuda]\n");
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

/* /proc/cpuinfo's first "model name", else "unknown CPU". */
static void cpu_model_name(char *out, size_t n)
{
    snprintf(out, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        char *v = strchr(line, ':');
        if (!v) continue;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        v[strcspn(v, "\n")] = '\0';
        if (*v) snprintf(out, n, "%s", v);
        break;
    }
    fclose(f);
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
 * roofline). Each thread reads its share as PROBE_STREAMS sequential streams
 * side by side (the share cut in PROBE_STREAMS equal parts, read in
 * lockstep), as the matmul kernels read a tile of weight rows at once: on a
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

static uint64_t read_sum(const uint64_t *restrict p, size_t n)
{
    size_t part = n / PROBE_STREAMS;
    uint64_t acc[PROBE_LANES] = { 0 };
    for (size_t i = 0; i < part; i += PROBE_LANES)
        for (int s = 0; s < PROBE_STREAMS; s++)
            for (int j = 0; j < PROBE_LANES; j++) acc[j] += p[(size_t)s * part + i + j];
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
    int V, decode, repeat;
    const int32_t *toks;
    float *logits;
    bool progress;
    probe *pr;          /* CPU backend: the bandwidth probe, else NULL */
    size_t step_bytes;  /* weight bytes streamed per decode step */
    double paired;      /* decode_tps(B = 1) with pr: median of the runs' roofline shares */
    double paired_gbs;  /* ... and median of the probe passes paired with them */
} bench;

static void progress(const bench *b, const char *what, int n)
{
    if (b->progress) fprintf(stderr, "\rbench: %s %d ...          ", what, n);
}

/* Prefill tokens/s for one prompt of n tokens: one warm-up call, then the
 * best of `repeat` calls. -1 on an engine error (printed). */
static double prefill_tps(bench *b, int n)
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
    for (int rep = 0; rep <= b->repeat; rep++) {
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

/* Decode tokens/s at batch B: B sequences each prefilled with SHORT_PROMPT
 * tokens (untimed), one untimed warm-up step, then `repeat` timed runs of
 * `decode` steps at positions SHORT_PROMPT.. (each run overwrites the same
 * positions, so all runs do the same work); the best run counts. -1 on an
 * engine error (printed).
 *
 * At batch 1 with a probe, each timed run comes right after PAIRED_PASSES
 * probe passes, and the run's share of the roofline is taken against the
 * best of them (one pass lasts a few ms, so a single one is at the mercy of
 * one descheduling of a thread): run tokens/s x step bytes / that bandwidth. On a shared machine whose memory
 * bandwidth drifts with its neighbours (a cloud VM), a ratio of two
 * measurements taken seconds apart is far steadier than the best decode
 * run against the best probe pass taken minutes apart. b->paired and
 * b->paired_gbs get the medians over the runs. */
static double decode_tps(bench *b, int B)
{
    char err[DOL_ERR_LEN];
    int seqs[MAX_BATCH];
    dol_batch_item items[MAX_BATCH];
    double best = 1e300;
    progress(b, "decode batch", B);
    for (int i = 0; i < B; i++) seqs[i] = -1;
    for (int i = 0; i < B; i++) {
        seqs[i] = dol_engine_seq_new(b->e);
        if (seqs[i] < 0 || dol_engine_seq_reserve(b->e, seqs[i], SHORT_PROMPT + b->decode) != 0) {
            fprintf(stderr, "\nbench_engine: decode batch %d: no sequence slot or KV blocks\n", B);
            goto fail_free;
        }
        dol_batch_item pi = { seqs[i], SHORT_PROMPT, b->toks + i, 0, 1, b->logits };
        if (dol_engine_forward(b->e, &pi, 1, err, sizeof err) != 0) goto fail;
    }
    double share[MAX_REPEAT], gbs[MAX_REPEAT];
    const bool pair = B == 1 && b->pr;
    for (int rep = 0; rep <= b->repeat; rep++) {
        int steps = rep == 0 ? 1 : b->decode; /* rep 0: one warm-up step */
        if (pair && rep > 0) {
            gbs[rep - 1] = 0;
            for (int k = 0; k < PAIRED_PASSES; k++) {
                double g = probe_pass(b->pr);
                if (g > gbs[rep - 1]) gbs[rep - 1] = g;
            }
        }
        double t0 = dol_now_ms();
        for (int step = 0; step < steps; step++) {
            for (int i = 0; i < B; i++)
                items[i] = (dol_batch_item){ seqs[i], 1, b->toks + SHORT_PROMPT + step + i,
                                             SHORT_PROMPT + step, 1, b->logits + (size_t)i * b->V };
            if (dol_engine_forward(b->e, items, B, err, sizeof err) != 0) goto fail;
        }
        double ms = dol_now_ms() - t0;
        if (rep > 0 && ms < best) best = ms;
        if (pair && rep > 0)
            share[rep - 1] = b->decode / (ms / 1000.0) * (double)b->step_bytes / (gbs[rep - 1] * 1e9);
    }
    if (pair) {
        b->paired = median(share, b->repeat);
        b->paired_gbs = median(gbs, b->repeat);
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
    default: break;
    }
    dol_dtype ck = m->layers[0].q.dtype;
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
    bool markdown = false;
    dol_weight_format wf = DOL_WEIGHTS_AUTO;
    dol_backend_kind backend = DOL_BACKEND_AUTO;
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--markdown")) { markdown = true; continue; }
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
        else if (!strcmp(o, "--batches")) rc = parse_list(o, v, 1, MAX_BATCH, batches, &n_batches);
        else if (!strcmp(o, "--repeat")) rc = parse_int(o, v, 1, MAX_REPEAT, &repeat);
        else if (!strcmp(o, "--sweep")) rc = parse_range(o, v, &sweep_a, &sweep_b);
        else if (!strcmp(o, "--sweep-out")) sweep_out = v;
        else if (!strcmp(o, "--weights")) {
            if (!strcmp(v, "f32")) wf = DOL_WEIGHTS_F32;
            else if (!strcmp(v, "f16")) wf = DOL_WEIGHTS_F16;
            else if (!strcmp(v, "nf4")) wf = DOL_WEIGHTS_NF4;
            else if (!strcmp(v, "auto")) wf = DOL_WEIGHTS_AUTO;
            else {
                fprintf(stderr, "bench_engine: --weights: expected auto, f32, f16 or nf4, got '%s'\n", v);
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
    if (SHORT_PROMPT + decode > ctx) {
        fprintf(stderr, "bench_engine: --decode %d: %d + %d positions exceed the context (%d)\n",
                decode, SHORT_PROMPT, decode, ctx);
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
    int64_t seq_tokens = (SHORT_PROMPT + decode + bs - 1) / bs * bs;
    int64_t kv_tokens = (int64_t)max_b * seq_tokens;
    if ((int64_t)(max_prompt + bs - 1) / bs * bs > kv_tokens) kv_tokens = (int64_t)(max_prompt + bs - 1) / bs * bs;
    int max_tokens = max_prompt > max_b ? max_prompt : max_b;
    if (max_tokens < SHORT_PROMPT) max_tokens = SHORT_PROMPT;
    dol_engine_params ep = { .backend = backend, .gpu_memory_fraction = 0.90,
                             .n_threads = threads, .kv_block_size = bs,
                             .kv_cache_tokens = kv_tokens, .max_seqs = max_b + 1,
                             .max_batch_tokens = max_tokens, .context_len = 0,
                             .weights = wf, .quantize_lm_head = true };
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
    size_t embed_bytes = (size_t)(m->embed.rows * m->embed.cols) * dol_dtype_size(m->embed.dtype);
    dol_quant_stats qs;
    dol_engine_quant_stats(e, &qs);
    size_t linear = qs.linear_bytes ? qs.linear_bytes : dol_engine_weight_bytes(e) - embed_bytes;
    size_t norms = (size_t)(2 * c->n_layers + 1) * (size_t)c->hidden_size * sizeof(float);
    size_t step_bytes = linear + norms + (size_t)c->hidden_size * dol_dtype_size(m->embed.dtype);

    /* header */
    char date[32], cpu[256];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", localtime(&now));
    cpu_model_name(cpu, sizeof cpu);
    const char *fmt = format_name(wf, m, &qs);
    const char *be = dol_engine_backend_name(e);
    char kernels[64] = "";
    if (!strcmp(be, "cpu")) snprintf(kernels, sizeof kernels, ", kernels %s", dol_engine_cpu_kernels());
    char header[1024];
    snprintf(header, sizeof header,
             "%s | %s: %d layers, hidden %d, ffn %d, heads %d/%d kv, vocab %d, context %d | "
             "weights %s (checkpoint %s) | backend %s%s, %d %s | %s",
             date, m->name, c->n_layers, c->hidden_size, c->intermediate_size, c->n_heads,
             c->n_kv_heads, V, ctx, fmt, dol_dtype_name(m->layers[0].q.dtype), be, kernels,
             threads, thr, cpu);
    char detail[512];
    snprintf(detail, sizeof detail, "resident weights %.1f MiB, ready in %.0f ms",
             dol_engine_weight_bytes(e) / 1048576.0, t_ready);
    if (qs.n_quantized > 0) {
        size_t used = strlen(detail);
        snprintf(detail + used, sizeof detail - used,
                 "; quantized %d matrices to nf4 in %.2f s (linear layers %.3f x F16)",
                 qs.n_quantized, qs.quant_seconds,
                 (double)qs.linear_bytes / (double)qs.linear_f16_bytes);
    }

    /* bandwidth probe: >= 4 x LLC, >= 512 MiB, >= 2 x weights, <= 2 GiB */
    size_t probe = (size_t)512 << 20;
    if (4 * llc_bytes() > probe) probe = 4 * llc_bytes();
    if (2 * dol_engine_weight_bytes(e) > probe) probe = 2 * dol_engine_weight_bytes(e);
    if (probe > (size_t)2 << 30) probe = (size_t)2 << 30;
    unsigned long long mach0 = 0, self0 = 0, mach1 = 0, self1 = 0;
    int have_ticks = cpu_ticks(&mach0, &self0) == 0;
    double wall0 = now_s();
    bench b = { .e = e, .V = V, .decode = decode, .repeat = repeat, .progress = isatty(2) };
    /* The probe measures host memory: it bounds the CPU backend only (a GPU
     * backend's roofline is its device bandwidth, scripts/gpu-check.sh). */
    bool cpu_backend = !strcmp(be, "cpu");
    double gbs = 0, roofline = 0;
    b.step_bytes = step_bytes;
    if (cpu_backend) {
        if (b.progress) fprintf(stderr, "bench: memory bandwidth probe (%zu MiB) ...", probe >> 20);
        if (!(b.pr = probe_open(threads, probe))) return 1;
        for (int pass = 0; pass < PROBE_PASSES; pass++) {
            double g = probe_pass(b.pr);
            if (g > gbs) gbs = g;
        }
        roofline = gbs * 1e9 / (double)step_bytes;
    }

    int n_toks = max_prompt + SHORT_PROMPT + decode + max_b + 1;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n_toks);
    float *logits = NULL; /* on a cache line, as the server's (scheduler.c) */
    if (posix_memalign((void **)&logits, 64, sizeof(float) * (size_t)V * (size_t)max_b) != 0) logits = NULL;
    if (!toks || !logits) { fprintf(stderr, "bench_engine: out of memory for tokens and logits\n"); return 1; }
    for (int i = 0; i < n_toks; i++) toks[i] = 3 + (int32_t)((int64_t)i * 7919 % (V - 3));
    b.toks = toks;
    b.logits = logits;

    row rows[3 * MAX_LIST + 8];
    int n_rows = 0;
    char label[64];
    char na[64];
    snprintf(na, sizeof na, "n/a (backend %s)", be);
    if (cpu_backend) add_row(rows, &n_rows, "memory read bandwidth (GB/s)", "%.1f", gbs);
    else add_row(rows, &n_rows, "memory read bandwidth (GB/s)", "%s", na);
    add_row(rows, &n_rows, "weight bytes per decode step (MB)", "%.1f", step_bytes / 1e6);
    if (cpu_backend) add_row(rows, &n_rows, "roofline decode tokens/s (batch 1)", "%.1f", roofline);
    else add_row(rows, &n_rows, "roofline decode tokens/s (batch 1)", "%s", na);
    for (int i = 0; i < n_prompts; i++) {
        snprintf(label, sizeof label, "prefill tokens/s @%d", prompts[i]);
        if (prompts[i] > ctx) {
            add_row(rows, &n_rows, label, "n/a (context %d)", ctx);
            continue;
        }
        double tps = prefill_tps(&b, prompts[i]);
        if (tps < 0) return 1;
        add_row(rows, &n_rows, label, "%.1f", tps);
    }
    /* decode: each batch size measured once, shared by the rows and the sweep */
    double measured[MAX_BATCH + 1] = { 0 };
    for (int i = 0; i < n_batches; i++) {
        int B = batches[i];
        if (measured[B] == 0 && (measured[B] = decode_tps(&b, B)) < 0) return 1;
        snprintf(label, sizeof label, "decode tokens/s batch %d", B);
        add_row(rows, &n_rows, label, "%.1f", measured[B]);
    }
    if (measured[1] > 0) {
        for (int i = 0; i < n_batches; i++) {
            if (batches[i] == 1) continue;
            snprintf(label, sizeof label, "batch %d / batch 1", batches[i]);
            add_row(rows, &n_rows, label, "%.2fx", measured[batches[i]] / measured[1]);
        }
        if (cpu_backend) {
            add_row(rows, &n_rows, "decode batch 1 % of roofline", "%.0f %%", 100.0 * measured[1] / roofline);
            if (b.paired > 0) {
                add_row(rows, &n_rows, "paired: probe before each run (GB/s, median)", "%.1f",
                        b.paired_gbs);
                add_row(rows, &n_rows, "paired: decode batch 1 % of that probe (median)", "%.0f %%",
                        100.0 * b.paired);
            }
        } else {
            add_row(rows, &n_rows, "decode batch 1 % of roofline", "%s", na);
        }
    }
    for (int B = sweep_a; sweep_a && B <= sweep_b; B++)
        if (measured[B] == 0 && (measured[B] = decode_tps(&b, B)) < 0) return 1;
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
