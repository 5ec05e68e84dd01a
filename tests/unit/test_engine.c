/* tests/unit/test_engine.c — the CPU forward pass against the golden outputs
 * of an independent float64 reference (../shared/golden), batch invariance
 * (bit for bit), chunked prefill, KV-cache blocks and forks, and the
 * sampler's reproducibility. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "dolphin/engine.h"
#include "dolphin/model.h"
#include "dolphin/sampler.h"
#include "engine/cpu_amx.h"
#include "test_fixtures.h"

typedef struct {
    dol_model *m;
    dol_engine *e;
} fixture;

static bool g_fast_prefill; /* open engines with fast_prefill (BF16x3 on AMX) */

static fixture open_model_kv(const char *name, int threads, int64_t kv_tokens, dol_kv_dtype kv)
{
    fixture fx = {0};
    char dir[1200], err[DOL_ERR_LEN];
    snprintf(dir, sizeof dir, "%s/models/%s", fixture_shared_dir(), name);
    int rc = dol_model_load(dir, &fx.m, err, sizeof err);
    if (rc != 0) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    dol_engine_params p = { .activations = DOL_ACT_F32, .n_threads = threads, .kv_block_size = 16,
                            .kv_cache_tokens = kv_tokens, .max_seqs = 16,
                            .max_batch_tokens = 1024, .kv_dtype = kv,
                            .fast_prefill = g_fast_prefill };
    rc = dol_engine_create(fx.m, &p, &fx.e, err, sizeof err);
    if (rc != 0) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    return fx;
}

/* The references are float64 throughout: the engine is held to them with an
 * F32 KV cache (the default f16 cache has its own test). */
static fixture open_model(const char *name, int threads, int64_t kv_tokens)
{
    return open_model_kv(name, threads, kv_tokens, DOL_KV_F32);
}

static void close_model(fixture *fx)
{
    dol_engine_free(fx->e);
    dol_model_free(fx->m);
}


/* Greedy generation of one sequence through the engine alone. Stops at
 * BOS/EOS like the reference. Returns the number of generated ids; when
 * first_logits is given, the logits after the prompt are copied there. */
static int greedy(dol_engine *e, const int32_t *prompt, int n_prompt, int max_new,
                  int32_t *out, float *first_logits, int chunk)
{
    int V = dol_engine_vocab_size(e);
    float *logits = malloc(sizeof(float) * (size_t)V);
    char err[DOL_ERR_LEN];
    int seq = dol_engine_seq_new(e);
    assert_true(seq >= 0);
    assert_int_equal(dol_engine_seq_reserve(e, seq, n_prompt + max_new), 0);
    int done = 0;
    while (done < n_prompt) {
        int n = n_prompt - done < chunk ? n_prompt - done : chunk;
        dol_batch_item it = { seq, n, prompt + done, done, done + n == n_prompt ? 1 : 0, logits };
        assert_int_equal(dol_engine_forward(e, &it, 1, err, sizeof err), 0);
        done += n;
    }
    if (first_logits) memcpy(first_logits, logits, sizeof(float) * (size_t)V);
    int n_out = 0;
    for (int step = 0; step < max_new; step++) {
        int32_t id = fixture_argmax(logits, V);
        if (id == 1 || id == 2) break;
        out[n_out++] = id;
        if (step + 1 == max_new) break;
        dol_batch_item it = { seq, 1, &out[n_out - 1], n_prompt + n_out - 1, 1, logits };
        assert_int_equal(dol_engine_forward(e, &it, 1, err, sizeof err), 0);
    }
    dol_engine_seq_free(e, seq);
    free(logits);
    return n_out;
}

/* stories260K in F32 reproduces every golden greedy continuation exactly. */
static void test_stories_golden(void **state)
{
    (void)state;
    cJSON *g = fixture_json("golden/stories260K.json");
    assert_non_null(g);
    fixture fx = open_model("stories260K", 2, 0);
    const cJSON *c;
    int cases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "cases")) {
        int32_t prompt[512], want[512], got[512];
        int np = fixture_ids(cJSON_GetObjectItem(c, "prompt_ids"), prompt, 512);
        int nw = fixture_ids(cJSON_GetObjectItem(c, "greedy_ids"), want, 512);
        int max_new = cJSON_GetObjectItem(c, "max_tokens")->valueint;
        int ng = greedy(fx.e, prompt, np, max_new, got, NULL, 512);
        assert_int_equal(ng, nw);
        assert_memory_equal(got, want, sizeof(int32_t) * (size_t)nw);
        cases++;
    }
    assert_true(cases > 0);
    close_model(&fx);
    cJSON_Delete(g);
}

/* tiny-llama2 (F16 weights, F32 compute): ids equal the golden up to the
 * first step whose margin is below `margin`; logits after the prompt within
 * `tol` of last_logits_top8. */
static void tiny_llama2_golden(dol_kv_dtype kv, double tol, double margin)
{
    cJSON *g = fixture_json("golden/tiny-llama2.json");
    assert_non_null(g);
    fixture fx = open_model_kv("tiny-llama2", 2, 0, kv);
    int V = dol_engine_vocab_size(fx.e);
    float *logits = malloc(sizeof(float) * (size_t)V);
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "cases")) {
        int32_t prompt[1024], want[1024], got[1024];
        int np = fixture_ids(cJSON_GetObjectItem(c, "prompt_ids"), prompt, 1024);
        int nw = fixture_ids(cJSON_GetObjectItem(c, "greedy_ids"), want, 1024);
        int max_new = cJSON_GetObjectItem(c, "max_tokens")->valueint;
        const cJSON *margins = cJSON_GetObjectItem(c, "greedy_margins");
        int trusted = 0;
        while (trusted < cJSON_GetArraySize(margins) &&
               cJSON_GetArrayItem(margins, trusted)->valuedouble >= margin)
            trusted++;
        int ng = greedy(fx.e, prompt, np, max_new, got, logits, 64);
        int cmp = trusted < nw ? trusted + 1 : nw; /* the first low-margin step's token */
        if (trusted < nw) cmp = trusted;           /* is not trusted itself */
        assert_true(ng >= cmp);
        for (int i = 0; i < cmp; i++) assert_int_equal(got[i], want[i]);
        const cJSON *t8;
        cJSON_ArrayForEach(t8, cJSON_GetObjectItem(c, "last_logits_top8")) {
            int id = cJSON_GetArrayItem(t8, 0)->valueint;
            double v = cJSON_GetArrayItem(t8, 1)->valuedouble;
            if (fabs(logits[id] - v) > tol)
                fail_msg("token %d: logit %.6f, golden %.6f", id, logits[id], v);
        }
    }
    free(logits);
    close_model(&fx);
    cJSON_Delete(g);
}

static void test_tiny_llama2_golden(void **state)
{
    (void)state;
    tiny_llama2_golden(DOL_KV_F32, 1e-3, 1e-3);
}

/* fast_prefill (F16 weights on AMX in BF16x3 from 16 rows of x): each
 * prompt and its golden continuation in one call, so the products take that
 * path; the logits after the prompt within 1e-3 of the golden's, and every
 * later row's argmax the golden's next id while its margin is above 1e-3. */
static void test_tiny_llama2_golden_fast(void **state)
{
    (void)state;
    if (!dol_amx_available()) skip();
    cJSON *g = fixture_json("golden/tiny-llama2.json");
    assert_non_null(g);
    g_fast_prefill = true;
    fixture fx = open_model_kv("tiny-llama2", 2, 0, DOL_KV_F32);
    g_fast_prefill = false;
    int V = dol_engine_vocab_size(fx.e);
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "cases")) {
        int32_t ids[1024];
        int np = fixture_ids(cJSON_GetObjectItem(c, "prompt_ids"), ids, 1024);
        int nw = fixture_ids(cJSON_GetObjectItem(c, "greedy_ids"), ids + np, 1024 - np);
        const cJSON *margins = cJSON_GetObjectItem(c, "greedy_margins");
        int trusted = 0;
        while (trusted < cJSON_GetArraySize(margins) && trusted < nw &&
               cJSON_GetArrayItem(margins, trusted)->valuedouble >= 1e-3)
            trusted++;
        int n = np + trusted;
        assert_true(n >= 16);
        float *all = malloc(sizeof(float) * (size_t)V * (size_t)n);
        test_forward_all(fx.e, ids, n, all);
        const cJSON *t8;
        cJSON_ArrayForEach(t8, cJSON_GetObjectItem(c, "last_logits_top8")) {
            int id = cJSON_GetArrayItem(t8, 0)->valueint;
            double v = cJSON_GetArrayItem(t8, 1)->valuedouble;
            float got = all[(size_t)(np - 1) * V + id];
            if (fabs(got - v) > 1e-3) fail_msg("token %d: logit %.6f, golden %.6f", id, got, v);
        }
        for (int i = np; i < n; i++) assert_int_equal(fixture_argmax(all + (size_t)(i - 1) * V, V), ids[i]);
        free(all);
    }
    close_model(&fx);
    cJSON_Delete(g);
}

/* The default cache of F16 weights (kv_cache_dtype auto = f16): K and V
 * rounded to F16 once each, so the logits move by about F16's relative
 * precision times their spread; ids equal wherever the golden's margin is
 * well above that. */
static void test_tiny_llama2_golden_kv_f16(void **state)
{
    (void)state;
    tiny_llama2_golden(DOL_KV_AUTO, 2e-2, 5e-2);
}

/* A batch of sequences with different lengths, mixing prefill chunks and
 * decode tokens, gives bit-identical logits to each sequence alone. */
static void test_batch_invariance(void **state)
{
    (void)state;
    fixture fx = open_model("tiny-llama2", 2, 4096);
    int V = dol_engine_vocab_size(fx.e);
    enum { NS = 6 };
    int lens[NS] = { 1, 5, 17, 33, 2, 40 };
    int32_t toks[NS][48];
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < 48; i++) toks[s][i] = (int32_t)((s * 7919 + i * 104729) % (V - 3)) + 3;
    float *alone = malloc(sizeof(float) * (size_t)V * NS * 2);
    float *batched = malloc(sizeof(float) * (size_t)V * NS * 2);
    char err[DOL_ERR_LEN];
    /* alone: prefill then one decode step */
    for (int s = 0; s < NS; s++) {
        int q = dol_engine_seq_new(fx.e);
        assert_int_equal(dol_engine_seq_reserve(fx.e, q, lens[s] + 1), 0);
        dol_batch_item it = { q, lens[s], toks[s], 0, 1, alone + (size_t)V * (2 * s) };
        assert_int_equal(dol_engine_forward(fx.e, &it, 1, err, sizeof err), 0);
        dol_batch_item d = { q, 1, &toks[s][lens[s]], lens[s], 1, alone + (size_t)V * (2 * s + 1) };
        assert_int_equal(dol_engine_forward(fx.e, &d, 1, err, sizeof err), 0);
        dol_engine_seq_free(fx.e, q);
    }
    /* together: step 1 prefills all; step 2 decodes all but feeds a new
     * prompt alongside (mixed prefill + decode) */
    int q[NS];
    dol_batch_item items[NS + 1];
    for (int s = 0; s < NS; s++) {
        q[s] = dol_engine_seq_new(fx.e);
        assert_int_equal(dol_engine_seq_reserve(fx.e, q[s], lens[s] + 1), 0);
        items[s] = (dol_batch_item){ q[s], lens[s], toks[s], 0, 1, batched + (size_t)V * (2 * s) };
    }
    assert_int_equal(dol_engine_forward(fx.e, items, NS, err, sizeof err), 0);
    float *extra = malloc(sizeof(float) * (size_t)V);
    int qx = dol_engine_seq_new(fx.e);
    assert_int_equal(dol_engine_seq_reserve(fx.e, qx, 20), 0);
    for (int s = 0; s < NS; s++)
        items[s] = (dol_batch_item){ q[s], 1, &toks[s][lens[s]], lens[s], 1, batched + (size_t)V * (2 * s + 1) };
    items[NS] = (dol_batch_item){ qx, 20, toks[5], 0, 1, extra };
    assert_int_equal(dol_engine_forward(fx.e, items, NS + 1, err, sizeof err), 0);
    assert_memory_equal(alone, batched, sizeof(float) * (size_t)V * NS * 2);
    for (int s = 0; s < NS; s++) dol_engine_seq_free(fx.e, q[s]);
    dol_engine_seq_free(fx.e, qx);
    assert_int_equal(dol_engine_kv_blocks_free(fx.e), dol_engine_kv_blocks_total(fx.e));
    free(extra);
    free(alone);
    free(batched);
    close_model(&fx);
}

/* Chunked prefill and thread count do not change the result. */
static void test_chunking_and_threads(void **state)
{
    (void)state;
    int32_t prompt[40], a[20], b[20], c[20];
    for (int i = 0; i < 40; i++) prompt[i] = 3 + (i * 37) % 500;
    fixture f1 = open_model("stories260K", 1, 0);
    fixture f2 = open_model("stories260K", 2, 0);
    const int V = dol_engine_vocab_size(f1.e);
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V),
          *lc = malloc(sizeof(float) * (size_t)V);
    int na = greedy(f1.e, prompt, 40, 20, a, la, 40);
    int nb = greedy(f2.e, prompt, 40, 20, b, lb, 7);
    /* chunks of 1: every call is a decode-shaped batch, which runs RoPE,
     * the KV write and attention as one job per (token, KV head) — GQA
     * here, 8 query heads on 4 KV heads — instead of the prefill path */
    int nc = greedy(f2.e, prompt, 40, 20, c, lc, 1);
    assert_int_equal(na, nb);
    assert_int_equal(na, nc);
    assert_memory_equal(a, b, sizeof(int32_t) * (size_t)na);
    assert_memory_equal(a, c, sizeof(int32_t) * (size_t)na);
    /* the logits after the prompt: the same bits along every path */
    assert_memory_equal(la, lb, sizeof(float) * (size_t)V);
    assert_memory_equal(la, lc, sizeof(float) * (size_t)V);
    free(la);
    free(lb);
    free(lc);
    close_model(&f1);
    close_model(&f2);
}

/* Forked sequences share the prompt's blocks and continue identically;
 * blocks return to the pool when all holders are freed; reservation fails
 * cleanly when the pool is exhausted. */
static void test_kv_blocks_and_fork(void **state)
{
    (void)state;
    fixture fx = open_model("stories260K", 1, 64); /* 4 blocks of 16 */
    int V = dol_engine_vocab_size(fx.e);
    assert_int_equal(dol_engine_kv_blocks_total(fx.e), 4);
    char err[DOL_ERR_LEN];
    int32_t prompt[20];
    for (int i = 0; i < 20; i++) prompt[i] = 5 + i;
    float *l1 = malloc(sizeof(float) * (size_t)V), *l2 = malloc(sizeof(float) * (size_t)V);
    int s = dol_engine_seq_new(fx.e);
    assert_int_equal(dol_engine_seq_reserve(fx.e, s, 21), 0);       /* 2 blocks */
    assert_int_equal(dol_engine_kv_blocks_free(fx.e), 2);
    dol_batch_item it = { s, 20, prompt, 0, 1, l1 };
    assert_int_equal(dol_engine_forward(fx.e, &it, 1, err, sizeof err), 0);
    int f = dol_engine_seq_fork(fx.e, s, 20);                        /* shares 1, copies 1 */
    assert_true(f >= 0);
    assert_int_equal(dol_engine_kv_blocks_free(fx.e), 1);
    assert_int_equal(dol_engine_seq_reserve(fx.e, f, 21), 0);
    int32_t nxt = 42;
    dol_batch_item a = { s, 1, &nxt, 20, 1, l1 }, b = { f, 1, &nxt, 20, 1, l2 };
    assert_int_equal(dol_engine_forward(fx.e, &a, 1, err, sizeof err), 0);
    assert_int_equal(dol_engine_forward(fx.e, &b, 1, err, sizeof err), 0);
    assert_memory_equal(l1, l2, sizeof(float) * (size_t)V);
    int t = dol_engine_seq_new(fx.e);
    assert_int_equal(dol_engine_seq_reserve(fx.e, t, 33), -1);       /* needs 3, 1 free */
    assert_int_equal(dol_engine_kv_blocks_free(fx.e), 1);
    dol_engine_seq_free(fx.e, s);
    assert_int_equal(dol_engine_kv_blocks_free(fx.e), 2);            /* shared block still held */
    dol_engine_seq_free(fx.e, f);
    assert_int_equal(dol_engine_kv_blocks_free(fx.e), 4);
    /* forward refuses positions that were not reserved */
    dol_batch_item bad = { t, 1, &nxt, 0, 0, NULL };
    assert_int_equal(dol_engine_forward(fx.e, &bad, 1, err, sizeof err), -1);
    dol_engine_seq_free(fx.e, t);
    free(l1);
    free(l2);
    close_model(&fx);
}

/* Same seed, same draws; greedy picks the argmax; top-k 1 equals greedy. */
static void test_sampler(void **state)
{
    (void)state;
    enum { V = 100 };
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = sinf((float)i * 0.37f) * 3.0f;
    dol_sampler *s = dol_sampler_new(V);
    dol_sampling_params p;
    dol_sampling_params_default(&p);
    dol_rng r1, r2;
    dol_rng_seed(&r1, 1234);
    dol_rng_seed(&r2, 1234);
    int diff = 0;
    int32_t first = -1;
    for (int i = 0; i < 50; i++) {
        int32_t a = dol_sampler_pick(s, &p, logits, &r1), b = dol_sampler_pick(s, &p, logits, &r2);
        assert_int_equal(a, b);
        if (first < 0) first = a; else if (a != first) diff++;
    }
    assert_true(diff > 0); /* it does sample */
    p.temperature = 0.0f;
    int32_t g = dol_sampler_pick(s, &p, logits, &r1);
    for (int i = 0; i < V; i++) assert_true(logits[i] <= logits[g]);
    p.temperature = 0.8f;
    p.top_k = 1;
    assert_int_equal(dol_sampler_pick(s, &p, logits, &r1), g);
    p.top_k = 0;
    p.top_p = 1e-6f;
    assert_int_equal(dol_sampler_pick(s, &p, logits, &r1), g);
    /* logprobs: top ids are sorted and sum of exp over vocab is 1 */
    int32_t ids[5];
    float lps[5];
    dol_top_logprobs(logits, V, 5, ids, lps);
    assert_int_equal(ids[0], g);
    for (int i = 1; i < 5; i++) assert_true(lps[i] <= lps[i - 1]);
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp(dol_logprob_of(logits, V, i));
    assert_true(fabs(sum - 1.0) < 1e-4);
    /* penalties: a repeated token loses probability */
    float pl[V];
    memcpy(pl, logits, sizeof pl);
    dol_sampling_params pp;
    dol_sampling_params_default(&pp);
    pp.frequency_penalty = 1.0f;
    int32_t hist[3] = { g, g, 7 };
    dol_sampler_apply_penalties(s, &pp, pl, hist, 3, 1);
    assert_true(fabsf(pl[g] - (logits[g] - 1.0f)) < 1e-6f); /* once in the generated part */
    assert_true(fabsf(pl[7] - (logits[7] - 1.0f)) < 1e-6f);
    dol_sampler_free(s);
}

/* The reference: softmax(logits / T) over the ids a full sort keeps under
 * top-k, min-p and top-p, in that order, as dol_sampler_pick applies them. */
static int cmp_desc_id(const void *a, const void *b, void *ctx)
{
    const double *w = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    return w[x] > w[y] ? -1 : w[x] < w[y] ? 1 : (x > y) - (x < y);
}

static void filtered_softmax(const float *logits, int V, const dol_sampling_params *p, double *q)
{
    double *w = calloc((size_t)V, sizeof *w);
    int *ord = malloc(sizeof(int) * (size_t)V);
    float mx = logits[dol_sampler_argmax(logits, V)];
    for (int i = 0; i < V; i++) {
        w[i] = expf((logits[i] - mx) / p->temperature);
        ord[i] = i;
    }
    qsort_r(ord, (size_t)V, sizeof(int), cmp_desc_id, w);
    int m = V;
    if (p->top_k > 0 && p->top_k < m) m = p->top_k;
    if (p->min_p > 0.0f) {
        int k = 0;
        while (k < m && w[ord[k]] >= p->min_p * w[ord[0]]) k++;
        m = k;
    }
    double sum = 0.0;
    for (int i = 0; i < m; i++) sum += w[ord[i]];
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        double acc = 0.0;
        int k = 0;
        while (k < m && acc < p->top_p * sum) acc += w[ord[k++]];
        m = k;
        sum = acc;
    }
    for (int i = 0; i < V; i++) q[i] = 0.0;
    for (int i = 0; i < m; i++) q[ord[i]] = w[ord[i]] / sum;
    free(w);
    free(ord);
}

/* Each filter's draws follow the reference distribution: never an id it
 * drops, and every kept id within 5 standard errors of its probability
 * (over a vocabulary of 2000, so the partial selection does real work). */
static void test_sampler_distribution(void **state)
{
    (void)state;
    enum { V = 2000, N = 40000 };
    float *logits = malloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) logits[i] = sinf((float)i * 0.37f) * 3.0f + (float)(i % 7) * 0.1f;
    logits[17] = -INFINITY;
    dol_sampler *s = dol_sampler_new(V);
    double *q = malloc(sizeof(double) * V);
    int *hits = malloc(sizeof(int) * V);
    struct { float t, top_p, min_p; int top_k; } cfg[] = {
        {1.0f, 1.0f, 0.0f, 0}, {0.7f, 1.0f, 0.0f, 40}, {1.0f, 0.6f, 0.0f, 0},
        {1.3f, 1.0f, 0.3f, 0}, {0.9f, 0.8f, 0.05f, 300},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        dol_sampling_params p;
        dol_sampling_params_default(&p);
        p.temperature = cfg[c].t;
        p.top_p = cfg[c].top_p;
        p.min_p = cfg[c].min_p;
        p.top_k = cfg[c].top_k;
        filtered_softmax(logits, V, &p, q);
        memset(hits, 0, sizeof(int) * V);
        dol_rng r;
        dol_rng_seed(&r, 99 + c);
        for (int i = 0; i < N; i++) hits[dol_sampler_pick(s, &p, logits, &r)]++;
        for (int i = 0; i < V; i++) {
            double f = (double)hits[i] / N, se = sqrt(q[i] * (1.0 - q[i]) / N);
            if (q[i] == 0.0 ? hits[i] != 0 : fabs(f - q[i]) > 5.0 * se + 1e-4)
                fail_msg("config %zu, id %d: drawn %.5f, probability %.5f", c, i, f, q[i]);
        }
    }
    free(logits);
    free(q);
    free(hits);
    dol_sampler_free(s);
}

int main(void)
{
    const char *g_shared = fixture_shared_dir();
    char probe[1200];
    snprintf(probe, sizeof probe, "%s/models/stories260K/config.json", g_shared);
    FILE *f = fopen(probe, "r");
    if (!f) {
        printf("test_engine: fixtures not found under %s (set DOLPHIN_SHARED); skipping\n", g_shared);
        return 77;
    }
    fclose(f);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_golden),
        cmocka_unit_test(test_tiny_llama2_golden_fast),
        cmocka_unit_test(test_tiny_llama2_golden),
        cmocka_unit_test(test_tiny_llama2_golden_kv_f16),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_chunking_and_threads),
        cmocka_unit_test(test_kv_blocks_and_fork),
        cmocka_unit_test(test_sampler),
        cmocka_unit_test(test_sampler_distribution),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
