/* tests/cuda/test_cuda_engine.c — the CUDA backend through the public engine
 * API (include/dolphin/engine.h): the golden greedy outputs of the fixtures
 * (../shared, env DOLPHIN_SHARED) within the FP16 error bound, batch
 * invariance, chunked prefill, echo logits over several lm_head chunks,
 * sequence forks, CUDA graphs against eager launches, and the memory
 * sizing. Exits 77 (skipped) without a usable CUDA device or fixtures.
 *
 * The FP16 error bound. The backend rounds weights, the inputs of every
 * matrix product and the KV cache to FP16 (docs/cuda.md). A host emulation
 * of exactly that scheme, measured against the float64 goldens, gives a
 * largest logit error after the prompt of 0.010 (stories260K, F32
 * checkpoint) and 0.0057 (tiny-llama2, F16 checkpoint). LOGIT_BOUND is three
 * times the larger. A greedy step is trusted when the golden margin between
 * the best two logits exceeds twice LOGIT_BOUND (both may move by the bound
 * in opposite directions); ids must equal the golden up to the first step
 * below that. Two CUDA runs that differ only in batching, chunking or graph
 * replay differ by FP32 summation order alone: SAME_BOUND. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "../fixtures.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cuda_runtime_api.h>

#include "dolphin/engine.h"
#include "dolphin/model.h"
#include "engine/backend.h"

#define LOGIT_BOUND 0.03
#define MARGIN_BOUND (2 * LOGIT_BOUND)
#define SAME_BOUND 1e-3



typedef struct {
    dol_model *m;
    dol_engine *e;
} fixture;

static dol_engine_params cuda_params(int64_t kv_tokens, int max_seqs)
{
    dol_engine_params p = { .activations = DOL_ACT_F32, .backend = DOL_BACKEND_CUDA, .gpu_memory_utilization = 0.90, .n_threads = 1,
                            .kv_block_size = 16, .kv_cache_tokens = kv_tokens, .max_seqs = max_seqs,
                            .max_batch_tokens = 1024 };
    return p;
}

static fixture open_model(const char *name, int64_t kv_tokens, int max_seqs)
{
    fixture fx = { 0 };
    char dir[1200], err[DOL_ERR_LEN];
    snprintf(dir, sizeof dir, "%s/models/%s", fixture_shared_dir(), name);
    int rc = dol_model_load(dir, &fx.m, err, sizeof err);
    if (rc != 0) fail_msg("%s", err);
    dol_engine_params p = cuda_params(kv_tokens, max_seqs);
    rc = dol_engine_create(fx.m, &p, &fx.e, err, sizeof err);
    if (rc != 0) fail_msg("%s", err);
    assert_string_equal(dol_engine_backend_name(fx.e), "cuda");
    return fx;
}

static void close_model(fixture *fx)
{
    dol_engine_free(fx->e);
    dol_model_free(fx->m);
}




/* Greedy generation of one sequence alone, prefill in chunks of `chunk`.
 * Stops at BOS/EOS like the reference. Records each step's margin; copies
 * the logits after the prompt to first_logits when given. */
static int greedy(dol_engine *e, const int32_t *prompt, int n_prompt, int max_new, int32_t *out,
                  double *margins, float *first_logits, int chunk)
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
        if (dol_engine_forward(e, &it, 1, err, sizeof err) != 0) fail_msg("%s", err);
        done += n;
    }
    if (first_logits) memcpy(first_logits, logits, sizeof(float) * (size_t)V);
    int n_out = 0;
    for (int step = 0; step < max_new; step++) {
        int32_t id = fixture_argmax(logits, V);
        if (margins) margins[step] = fixture_margin(logits, V);
        if (id == 1 || id == 2) break;
        out[n_out++] = id;
        if (step + 1 == max_new) break;
        dol_batch_item it = { seq, 1, &out[n_out - 1], n_prompt + n_out - 1, 1, logits };
        if (dol_engine_forward(e, &it, 1, err, sizeof err) != 0) fail_msg("%s", err);
    }
    dol_engine_seq_free(e, seq);
    free(logits);
    return n_out;
}

/* ---- goldens -------------------------------------------------------------------- */

static void golden(const char *model, int chunk)
{
    char rel[128];
    snprintf(rel, sizeof rel, "golden/%s.json", model);
    cJSON *g = fixture_json(rel);
    assert_non_null(g);
    fixture fx = open_model(model, 0, 4);
    int V = dol_engine_vocab_size(fx.e);
    float *logits = malloc(sizeof(float) * (size_t)V);
    const cJSON *c;
    int cases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "cases")) {
        int32_t prompt[1024], want[1024], got[1024];
        int np = fixture_ids(cJSON_GetObjectItem(c, "prompt_ids"), prompt, 1024);
        int nw = fixture_ids(cJSON_GetObjectItem(c, "greedy_ids"), want, 1024);
        int max_new = cJSON_GetObjectItem(c, "max_tokens")->valueint;
        const cJSON *margins = cJSON_GetObjectItem(c, "greedy_margins");
        int trusted = 0; /* steps before the first one below the FP16 bound */
        while (trusted < cJSON_GetArraySize(margins) &&
               cJSON_GetArrayItem(margins, trusted)->valuedouble >= MARGIN_BOUND)
            trusted++;
        int cmp = trusted < nw ? trusted : nw;
        int ng = greedy(fx.e, prompt, np, max_new, got, NULL, logits, chunk);
        assert_true(ng >= cmp);
        int same = 0;
        while (same < ng && same < nw && got[same] == want[same]) same++;
        printf("%s case %d: %d of %d golden ids reproduced (%d trusted at margin >= %.2f)\n", model, cases,
               same, nw, cmp, MARGIN_BOUND);
        for (int i = 0; i < cmp; i++)
            if (got[i] != want[i]) fail_msg("%s case %d step %d: id %d, golden %d", model, cases, i, got[i], want[i]);
        const cJSON *t8;
        cJSON_ArrayForEach(t8, cJSON_GetObjectItem(c, "last_logits_top8")) {
            int id = cJSON_GetArrayItem(t8, 0)->valueint;
            double v = cJSON_GetArrayItem(t8, 1)->valuedouble;
            if (!(fabs(logits[id] - v) <= LOGIT_BOUND))
                fail_msg("%s case %d token %d: logit %.6f, golden %.6f", model, cases, id, logits[id], v);
        }
        cases++;
    }
    assert_true(cases > 0);
    free(logits);
    close_model(&fx);
    cJSON_Delete(g);
}

static void test_stories_golden(void **state) { (void)state; golden("stories260K", 512); }
static void test_tiny_llama2_golden(void **state) { (void)state; golden("tiny-llama2", 64); }

/* ---- batch invariance ----------------------------------------------------------------- */

/* Eight sequences greedy-decoded alone, then together (one prefill call for
 * all eight, then one decode call per step for all eight): the same ids up
 * to the first step whose margin alone is below SAME_BOUND, and logits after
 * the prompts within SAME_BOUND. */
static void test_batch_invariance(void **state)
{
    (void)state;
    enum { NS = 8, STEPS = 16 };
    fixture fx = open_model("tiny-llama2", 4096, NS + 1);
    int V = dol_engine_vocab_size(fx.e);
    const int lens[NS] = { 1, 5, 17, 33, 2, 40, 9, 16 };
    int32_t toks[NS][48];
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < 48; i++) toks[s][i] = (int32_t)((s * 7919 + i * 104729) % (V - 3)) + 3;
    int32_t alone[NS][STEPS], together[NS][STEPS];
    double margins[NS][STEPS];
    int n_alone[NS];
    float *first_alone = malloc(sizeof(float) * (size_t)V * NS);
    float *logits = malloc(sizeof(float) * (size_t)V * NS);
    for (int s = 0; s < NS; s++)
        n_alone[s] = greedy(fx.e, toks[s], lens[s], STEPS, alone[s], margins[s], first_alone + (size_t)s * V, 64);

    char err[DOL_ERR_LEN];
    int q[NS];
    dol_batch_item items[NS];
    for (int s = 0; s < NS; s++) {
        q[s] = dol_engine_seq_new(fx.e);
        assert_int_equal(dol_engine_seq_reserve(fx.e, q[s], lens[s] + STEPS), 0);
        items[s] = (dol_batch_item){ q[s], lens[s], toks[s], 0, 1, logits + (size_t)s * V };
    }
    if (dol_engine_forward(fx.e, items, NS, err, sizeof err) != 0) fail_msg("%s", err);
    double d = fixture_max_abs_diff(first_alone, logits, (size_t)V * NS);
    printf("batch invariance: logits after the prompts differ by at most %.3g\n", d);
    assert_true(d <= SAME_BOUND);
    for (int step = 0; step < STEPS; step++) {
        for (int s = 0; s < NS; s++) together[s][step] = fixture_argmax(logits + (size_t)s * V, V);
        if (step + 1 == STEPS) break;
        for (int s = 0; s < NS; s++)
            items[s] = (dol_batch_item){ q[s], 1, &together[s][step], lens[s] + step, 1, logits + (size_t)s * V };
        if (dol_engine_forward(fx.e, items, NS, err, sizeof err) != 0) fail_msg("%s", err);
    }
    for (int s = 0; s < NS; s++) {
        for (int step = 0; step < n_alone[s] && margins[s][step] >= SAME_BOUND; step++)
            if (alone[s][step] != together[s][step])
                fail_msg("sequence %d step %d: alone %d, in a batch of %d %d", s, step, alone[s][step], NS,
                         together[s][step]);
        dol_engine_seq_free(fx.e, q[s]);
    }
    assert_int_equal(dol_engine_kv_blocks_free(fx.e), dol_engine_kv_blocks_total(fx.e));
    free(first_alone);
    free(logits);
    close_model(&fx);
}

/* ---- chunked prefill, echo logits --------------------------------------------------------- */

/* Prefill in one call, in chunks of 7 (prefill kernel across chunks) and of 1
 * (the decode kernel): the same greedy ids while margins allow, logits after
 * the prompt within SAME_BOUND. */
static void test_chunked_prefill(void **state)
{
    (void)state;
    fixture fx = open_model("stories260K", 0, 4);
    int V = dol_engine_vocab_size(fx.e);
    int32_t prompt[40], a[20], b[20], c[20];
    double ma[20];
    for (int i = 0; i < 40; i++) prompt[i] = 3 + (i * 37) % 500;
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V), *lc = malloc(sizeof(float) * V);
    int na = greedy(fx.e, prompt, 40, 20, a, ma, la, 40);
    int nb = greedy(fx.e, prompt, 40, 20, b, NULL, lb, 7);
    int nc = greedy(fx.e, prompt, 40, 20, c, NULL, lc, 1);
    assert_true(fixture_max_abs_diff(la, lb, (size_t)V) <= SAME_BOUND);
    assert_true(fixture_max_abs_diff(la, lc, (size_t)V) <= SAME_BOUND);
    for (int i = 0; i < na && ma[i] >= SAME_BOUND; i++) {
        assert_true(i < nb && i < nc);
        assert_int_equal(a[i], b[i]);
        assert_int_equal(a[i], c[i]);
    }
    free(la); free(lb); free(lc);
    close_model(&fx);
}

/* n_logits = n_tokens over 150 tokens (two lm_head chunks of 128): row k
 * equals, within SAME_BOUND, the last-token logits of a prefill of the first
 * k + 1 tokens. A second item without logits rides along. */
static void test_echo_logits(void **state)
{
    (void)state;
    fixture fx = open_model("stories260K", 0, 4);
    int V = dol_engine_vocab_size(fx.e);
    enum { N = 150 };
    int32_t prompt[N];
    for (int i = 0; i < N; i++) prompt[i] = 3 + (i * 131) % 500;
    float *all = malloc(sizeof(float) * (size_t)V * N), *one = malloc(sizeof(float) * V);
    char err[DOL_ERR_LEN];
    int s = dol_engine_seq_new(fx.e), x = dol_engine_seq_new(fx.e);
    assert_int_equal(dol_engine_seq_reserve(fx.e, s, N), 0);
    assert_int_equal(dol_engine_seq_reserve(fx.e, x, 30), 0);
    dol_batch_item its[2] = { { x, 30, prompt + 3, 0, 0, NULL }, { s, N, prompt, 0, N, all } };
    if (dol_engine_forward(fx.e, its, 2, err, sizeof err) != 0) fail_msg("%s", err);
    dol_engine_seq_free(fx.e, s);
    dol_engine_seq_free(fx.e, x);
    const int ks[] = { 0, 1, 63, 127, 128, 129, 149 };
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) {
        int k = ks[i];
        int t = dol_engine_seq_new(fx.e);
        assert_int_equal(dol_engine_seq_reserve(fx.e, t, k + 1), 0);
        dol_batch_item it = { t, k + 1, prompt, 0, 1, one };
        if (dol_engine_forward(fx.e, &it, 1, err, sizeof err) != 0) fail_msg("%s", err);
        double d = fixture_max_abs_diff(all + (size_t)k * V, one, (size_t)V);
        if (!(d <= SAME_BOUND)) fail_msg("echo row %d differs from a prefill of %d tokens by %.3g", k, k + 1, d);
        dol_engine_seq_free(fx.e, t);
    }
    free(all);
    free(one);
    close_model(&fx);
}

/* ---- forks and graphs ------------------------------------------------------------------------ */

/* A fork shares the prompt's full blocks and copies the partial one: the
 * next token of source and fork gives the same logits. The first of the two
 * decode calls runs eagerly and the second replays a captured graph (a batch
 * size runs once before it is captured), so this also compares graph replay
 * with eager launches. */
static void test_fork(void **state)
{
    (void)state;
    fixture fx = open_model("stories260K", 64, 4); /* 4 blocks of 16 */
    int V = dol_engine_vocab_size(fx.e);
    char err[DOL_ERR_LEN];
    int32_t prompt[20];
    for (int i = 0; i < 20; i++) prompt[i] = 5 + i;
    float *l1 = malloc(sizeof(float) * V), *l2 = malloc(sizeof(float) * V);
    int s = dol_engine_seq_new(fx.e);
    assert_int_equal(dol_engine_seq_reserve(fx.e, s, 21), 0);
    dol_batch_item it = { s, 20, prompt, 0, 1, l1 };
    if (dol_engine_forward(fx.e, &it, 1, err, sizeof err) != 0) fail_msg("%s", err);
    int f = dol_engine_seq_fork(fx.e, s, 20);
    assert_true(f >= 0);
    assert_int_equal(dol_engine_seq_reserve(fx.e, f, 21), 0);
    int32_t nxt = 42;
    dol_batch_item a = { s, 1, &nxt, 20, 1, l1 }, b = { f, 1, &nxt, 20, 1, l2 };
    if (dol_engine_forward(fx.e, &a, 1, err, sizeof err) != 0) fail_msg("%s", err);
    if (dol_engine_forward(fx.e, &b, 1, err, sizeof err) != 0) fail_msg("%s", err);
    double d = fixture_max_abs_diff(l1, l2, (size_t)V);
    printf("fork: source and fork logits differ by %.3g (%s)\n", d,
           memcmp(l1, l2, sizeof(float) * V) == 0 ? "bit-identical" : "not bit-identical");
    assert_true(d <= SAME_BOUND);
    assert_int_equal(fixture_argmax(l1, V), fixture_argmax(l2, V));
    dol_engine_seq_free(fx.e, s);
    dol_engine_seq_free(fx.e, f);
    assert_int_equal(dol_engine_kv_blocks_free(fx.e), 4);
    free(l1);
    free(l2);
    close_model(&fx);
}

/* DOLPHIN_CUDA_GRAPHS=0 (eager launches only) and the default (graphs for
 * decode steps) produce the same greedy ids and logits within SAME_BOUND. */
static void test_graphs_match_eager(void **state)
{
    (void)state;
    int32_t prompt[6] = { 1, 15043, 29892, 590, 1024, 338 }, a[32], b[32];
    double ma[32];
    fixture g = open_model("tiny-llama2", 0, 4);
    int V = dol_engine_vocab_size(g.e);
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    int na = greedy(g.e, prompt, 6, 32, a, ma, la, 64);
    close_model(&g);
    setenv("DOLPHIN_CUDA_GRAPHS", "0", 1);
    fixture e = open_model("tiny-llama2", 0, 4);
    unsetenv("DOLPHIN_CUDA_GRAPHS");
    int nb = greedy(e.e, prompt, 6, 32, b, NULL, lb, 64);
    close_model(&e);
    assert_true(fixture_max_abs_diff(la, lb, (size_t)V) <= SAME_BOUND);
    for (int i = 0; i < na && ma[i] >= SAME_BOUND; i++) {
        assert_true(i < nb);
        assert_int_equal(a[i], b[i]);
    }
    free(la);
    free(lb);
}

/* ---- memory -------------------------------------------------------------------------------- */

/* kv_cache_tokens 0: the pool holds max_seqs full contexts when the budget
 * allows (it does on any supported GPU for this model); memory figures come
 * from the device. A tiny gpu_memory_utilization fails with the shortfall. */
static void test_memory_sizing(void **state)
{
    (void)state;
    fixture fx = open_model("stories260K", 0, 16);
    const dol_model_config *c = &fx.m->cfg;
    int ctx = dol_engine_context_len(fx.e);
    assert_int_equal(dol_engine_kv_blocks_total(fx.e), 16 * ((ctx + 15) / 16));
    assert_int_equal(dol_engine_kv_bytes_per_token(fx.e), (size_t)c->n_layers * 2 * c->n_kv_heads * c->head_dim * 2);
    assert_true(dol_engine_weight_bytes(fx.e) > 0);
    size_t used = 0, total = 0;
    assert_int_equal(dol_engine_memory_info(fx.e, &used, &total), 0);
    size_t free_b = 0, total_b = 0;
    assert_int_equal(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
    assert_true(total == total_b && used > 0 && used <= total);
    dol_engine_params p = cuda_params(0, 16);
    p.gpu_memory_utilization = 0.0001;
    dol_engine *e2 = NULL;
    char err[DOL_ERR_LEN] = "";
    assert_int_equal(dol_engine_create(fx.m, &p, &e2, err, sizeof err), -1);
    printf("fraction 0.0001: %s\n", err);
    assert_non_null(strstr(err, "short by"));
    assert_non_null(strstr(err, "MiB"));
    close_model(&fx);
}

int main(void)
{
    char why[256];
    if (!dol_cuda_device_check(why, sizeof why)) {
        printf("test_cuda_engine: no usable CUDA device (%s); skipping\n", why);
#ifdef DOLPHIN_CUDA_EMU
        return 1; /* the emulated device is always there: not finding it is a failure */
#else
        return 77;
#endif
    }
    const char *g_shared = fixture_shared_dir();
    char probe[1200];
    snprintf(probe, sizeof probe, "%s/models/tiny-llama2/config.json", g_shared);
    FILE *f = fopen(probe, "r");
    if (!f) {
        printf("test_cuda_engine: fixtures not found under %s (set DOLPHIN_SHARED); skipping\n", g_shared);
        return 77;
    }
    fclose(f);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_sizing),
        cmocka_unit_test(test_stories_golden),
        cmocka_unit_test(test_tiny_llama2_golden),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_echo_logits),
        cmocka_unit_test(test_fork),
        cmocka_unit_test(test_graphs_match_eager),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
