/* tests/unit/test_quant_golden.c — weights quantized at load (nf4, int8)
 * against the independent float64 reference of each scheme
 * (golden/quant-<model>.json), on stories260K and tiny-llama2:
 *   - every quantized tensor, quantized here and dequantized: its sum within
 *     1e-4 x the golden's sum_abs and its sum of squares within 1e-4
 *     relative (a code may differ from the reference's only where w / scale
 *     sits within float rounding of a midpoint);
 *   - through the engine (lm_head kept, the default): greedy ids equal to the
 *     golden's up to the first step whose margin is below MARGIN_BOUND, the
 *     logits after the prompt within LOGIT_BOUND of last_logits_top8, and the
 *     mean NLL of the full-precision greedy continuations within NLL_REL of
 *     the golden's `quantized` value.
 * The same file is built for the CUDA backend (tests/cuda/
 * test_cuda_quant_golden.c defines QG_BACKEND_CUDA): the tensor checks are
 * the host quantizer's and run on the CPU build only; the bounds there are
 * those of FP16 activations (docs/cuda.md), and each case's greedy ids are
 * compared over its first 32 steps (the emulation is slow). Fixtures from
 * $DOLPHIN_SHARED (default ../shared); skipped when absent. */
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

#include "dolphin/common.h"
#include "dolphin/engine.h"
#include "dolphin/model.h"
#include "engine/backend.h"
#include "engine/cpu_amx.h"
#include "engine/nf4.h"
#include "engine/q8.h"
#include "test_fixtures.h"

#ifdef QG_BACKEND_CUDA
#define QG_BACKEND DOL_BACKEND_CUDA
#define LOGIT_BOUND 0.03             /* FP16 activations */
#define MARGIN_BOUND (2 * LOGIT_BOUND)
#define NLL_REL 0.01
#define MAX_STEPS 32                 /* greedy steps per case: the emulation is slow */
#else
#define QG_BACKEND DOL_BACKEND_CPU
#define LOGIT_BOUND 1e-3
#define MARGIN_BOUND 1e-3
#define NLL_REL 0.002
#define MAX_STEPS MAX_IDS
#endif

#define MAX_IDS 512

/* ---- tensors -------------------------------------------------------------- */
#ifndef QG_BACKEND_CUDA

static const dol_tensor *tensor_named(const dol_model *m, const char *name)
{
    int l;
    char rest[64];
    if (strcmp(name, "lm_head.weight") == 0) return &m->lm_head;
    if (sscanf(name, "model.layers.%d.%63s", &l, rest) != 2 || l < 0 || l >= m->cfg.n_layers)
        return NULL;
    const dol_layer_weights *w = &m->layers[l];
    static const char *const names[7] = { "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                          "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                          "mlp.gate_proj.weight",   "mlp.up_proj.weight",
                                          "mlp.down_proj.weight" };
    const dol_tensor *t[7] = { &w->q, &w->k, &w->v, &w->o, &w->gate, &w->up, &w->down };
    for (int i = 0; i < 7; i++)
        if (strcmp(rest, names[i]) == 0) return t[i];
    return NULL;
}

/* Sum and sum of squares (double) of t quantized with `scheme`, dequantized. */
static void quantized_sums(const dol_tensor *t, const char *scheme, double *sum, double *sq)
{
    char err[DOL_ERR_LEN];
    float *row = malloc(sizeof(float) * (size_t)t->cols);
    *sum = *sq = 0.0;
    if (strcmp(scheme, "nf4") == 0) {
        dol_nf4_matrix q = { .codes = malloc(dol_nf4_codes_bytes(t->rows, t->cols)),
                             .scales = malloc(dol_nf4_scales_bytes(t->rows, t->cols)) };
        assert_int_equal(dol_nf4_quantize(NULL, t, &q, "t", err, sizeof err), 0);
        for (int64_t r = 0; r < t->rows; r++) {
            dol_nf4_dequantize_row(&q, r, row);
            for (int64_t k = 0; k < t->cols; k++) *sum += row[k], *sq += (double)row[k] * row[k];
        }
        free(q.codes);
        free(q.scales);
    } else {
        dol_q8_matrix q = { .quants = malloc(dol_q8_quants_bytes(t->rows, t->cols)),
                            .scales = malloc(dol_q8_scales_bytes(t->rows, t->cols)) };
        assert_int_equal(dol_q8_quantize(NULL, t, &q, "t", err, sizeof err), 0);
        for (int64_t r = 0; r < t->rows; r++) {
            dol_q8_dequantize_row(&q, r, row);
            for (int64_t k = 0; k < t->cols; k++) *sum += row[k], *sq += (double)row[k] * row[k];
        }
        free(q.quants);
        free(q.scales);
    }
    free(row);
}

#endif

static cJSON *golden_of(const char *model)
{
    char rel[128];
    snprintf(rel, sizeof rel, "golden/quant-%s.json", model);
    cJSON *g = fixture_json(rel);
    assert_non_null(g);
    return g;
}

static dol_model *load_model(const char *name)
{
    char dir[1200], err[DOL_ERR_LEN];
    test_fixture_model(dir, sizeof dir, name);
    dol_model *m = NULL;
    int rc = dol_model_load(dir, &m, err, sizeof err);
    if (rc != 0) fail_msg("%s", err);
    return m;
}

#ifndef QG_BACKEND_CUDA
static void tensors(const char *model, const char *scheme)
{
    dol_model *m = load_model(model);
    cJSON *g = golden_of(model);
    const cJSON *ts = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(g, "schemes"), scheme), "tensors");
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, ts) {
        const dol_tensor *t = tensor_named(m, it->string);
        if (!t) fail_msg("%s: golden tensor %s not in the model", model, it->string);
        double sum, sq;
        quantized_sums(t, scheme, &sum, &sq);
        double gs = cJSON_GetObjectItem(it, "sum")->valuedouble;
        double ga = cJSON_GetObjectItem(it, "sum_abs")->valuedouble;
        double gq = cJSON_GetObjectItem(it, "sum_sq")->valuedouble;
        if (!(fabs(sum - gs) <= 1e-4 * ga) || !(fabs(sq - gq) <= 1e-4 * gq))
            fail_msg("%s %s %s: sum %.9g (golden %.9g, sum_abs %.6g), sum_sq %.9g (golden %.9g)",
                     model, scheme, it->string, sum, gs, ga, sq, gq);
        n++;
    }
    assert_int_equal(n, 7 * m->cfg.n_layers); /* the seven linear layers of each block */
    cJSON_Delete(g);
    dol_model_free(m);
}

#endif

/* ---- the engine ------------------------------------------------------------- */

/* Run the engine with fast_prefill (BF16x3 products on AMX from 16 rows of
 * x, cpu_amx.h): the same golden checks and bounds must hold. */
static bool g_fast;

static dol_engine *open_engine(const dol_model *m, dol_weight_format wf)
{
    /* an F32 KV cache on the CPU, so that only the weights' scheme moves the
     * logits from the float64 reference (CUDA keeps its F16 cache) */
    dol_engine_params p = { .activations = DOL_ACT_F32, .backend = QG_BACKEND, .n_threads = 2, .kv_block_size = 16,
                            .max_seqs = 2, .max_batch_tokens = 512, .weights = wf,
                            .gpu_memory_utilization = 0.9, .kv_cache_tokens = 2048,
                            .kv_dtype = DOL_KV_F32, .fast_prefill = g_fast };
    dol_engine *e = NULL;
    char err[DOL_ERR_LEN];
    if (dol_engine_create(m, &p, &e, err, sizeof err) != 0) fail_msg("%s", err);
    return e;
}

/* Sum over the continuation of -log softmax(logits)[next]: prompt + cont
 * through the engine in one call, every position's logits. */
static double nll_sum(dol_engine *e, const int32_t *prompt, int np, const int32_t *cont, int nc)
{
    int V = dol_engine_vocab_size(e), n = np + nc;
    int32_t ids[2 * MAX_IDS];
    memcpy(ids, prompt, sizeof(int32_t) * (size_t)np);
    memcpy(ids + np, cont, sizeof(int32_t) * (size_t)nc);
    float *logits = malloc(sizeof(float) * (size_t)V * (size_t)n);
    test_forward_all(e, ids, n, logits);
    double s = 0.0;
    for (int i = np - 1; i < n - 1; i++) {
        const float *l = logits + (size_t)i * V;
        double mx = l[0], z = 0.0;
        for (int v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
        for (int v = 0; v < V; v++) z += exp((double)l[v] - mx);
        s += -((double)l[ids[i + 1]] - mx - log(z));
    }
    free(logits);
    return s;
}

static void engine_golden(const char *model, const char *scheme)
{
    dol_model *m = load_model(model);
    cJSON *g = golden_of(model);
    char rel[128];
    snprintf(rel, sizeof rel, "golden/%s.json", model);
    cJSON *fp = fixture_json(rel); /* the full-precision continuations */
    assert_non_null(fp);
    const cJSON *sc = cJSON_GetObjectItem(cJSON_GetObjectItem(g, "schemes"), scheme);
    dol_engine *e = open_engine(m, strcmp(scheme, "nf4") == 0 ? DOL_WEIGHTS_NF4 : DOL_WEIGHTS_INT8);
    dol_quant_stats qs;
    dol_engine_quant_stats(e, &qs);
    if (QG_BACKEND == DOL_BACKEND_CPU || qs.n_quantized) /* lm_head kept by default */
        assert_int_equal(qs.n_quantized, 7 * m->cfg.n_layers);
    int V = dol_engine_vocab_size(e);
    float *first = malloc(sizeof(float) * (size_t)V);
    const cJSON *c;
    int ci = 0;
    double nll = 0.0;
    int nll_tokens = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(sc, "cases")) {
        int32_t prompt[MAX_IDS], want[MAX_IDS], got[MAX_IDS], cont[MAX_IDS];
        int np = fixture_ids(cJSON_GetObjectItem(c, "prompt_ids"), prompt, MAX_IDS);
        int nw = fixture_ids(cJSON_GetObjectItem(c, "greedy_ids"), want, MAX_IDS);
        int max_new = cJSON_GetObjectItem(c, "max_tokens")->valueint;
        if (max_new > MAX_STEPS) max_new = MAX_STEPS;
        if (nw > max_new) nw = max_new;
        const cJSON *margins = cJSON_GetObjectItem(c, "greedy_margins");
        int trusted = 0;
        while (trusted < cJSON_GetArraySize(margins) &&
               cJSON_GetArrayItem(margins, trusted)->valuedouble >= MARGIN_BOUND)
            trusted++;
        int cmp = trusted < nw ? trusted : nw;
        int ng = test_greedy(e, prompt, np, max_new, got, NULL, first);
        int same = 0;
        while (same < ng && same < nw && got[same] == want[same]) same++;
        print_message("  %s %s case %d: %d of %d golden ids (%d trusted)\n", model, scheme, ci,
                      same, nw, cmp);
        if (same < cmp)
            fail_msg("%s %s case %d step %d: id %d, golden %d", model, scheme, ci, same,
                     same < ng ? got[same] : -1, want[same]);
        const cJSON *t8;
        cJSON_ArrayForEach(t8, cJSON_GetObjectItem(c, "last_logits_top8")) {
            int id = cJSON_GetArrayItem(t8, 0)->valueint;
            double v = cJSON_GetArrayItem(t8, 1)->valuedouble;
            if (!(fabs(first[id] - v) <= LOGIT_BOUND))
                fail_msg("%s %s case %d token %d: logit %.6f, golden %.6f", model, scheme, ci, id,
                         first[id], v);
        }
        if (g_fast) { /* prompt + golden ids in one call: T >= 16, the AMX path */
            int nt = np + (cmp < 24 ? cmp : 24);
            if (nt >= 16) {
                int32_t ids[MAX_IDS + 24];
                memcpy(ids, prompt, sizeof(int32_t) * (size_t)np);
                memcpy(ids + np, want, sizeof(int32_t) * (size_t)(nt - np));
                float *all = malloc(sizeof(float) * (size_t)V * (size_t)nt);
                test_forward_all(e, ids, nt, all);
                const float *row = all + (size_t)(np - 1) * V;
                cJSON_ArrayForEach(t8, cJSON_GetObjectItem(c, "last_logits_top8")) {
                    int id = cJSON_GetArrayItem(t8, 0)->valueint;
                    double v = cJSON_GetArrayItem(t8, 1)->valuedouble;
                    if (!(fabs(row[id] - v) <= LOGIT_BOUND))
                        fail_msg("%s %s case %d token %d, one call of %d: logit %.6f, golden %.6f",
                                 model, scheme, ci, id, nt, row[id], v);
                }
                for (int i = np; i < nt; i++) {
                    int32_t a = fixture_argmax(all + (size_t)(i - 1) * V, V);
                    if (a != want[i - np])
                        fail_msg("%s %s case %d step %d, one call: id %d, golden %d", model, scheme,
                                 ci, i - np, a, want[i - np]);
                }
                print_message("  %s %s case %d: one call of %d tokens matches\n", model, scheme, ci, nt);
                free(all);
            }
        }
        /* the full-precision continuation of the same prompt */
        const cJSON *fc = cJSON_GetArrayItem(cJSON_GetObjectItem(fp, "cases"), ci);
        assert_non_null(fc);
        int nc = fixture_ids(cJSON_GetObjectItem(fc, "greedy_ids"), cont, MAX_IDS);
        nll += nll_sum(e, prompt, np, cont, nc);
        nll_tokens += nc;
        ci++;
    }
    assert_true(ci > 0);
    const cJSON *gn = cJSON_GetObjectItem(sc, "nll_of_reference_continuations");
    double want_nll = cJSON_GetObjectItem(gn, "quantized")->valuedouble;
    assert_int_equal(nll_tokens, cJSON_GetObjectItem(gn, "tokens")->valueint);
    nll /= nll_tokens;
    print_message("  %s %s: NLL %.5f, golden %.5f (%+.3f %%), full precision %.5f\n", model,
                  scheme, nll, want_nll, 100.0 * (nll - want_nll) / want_nll,
                  cJSON_GetObjectItem(gn, "full_precision")->valuedouble);
    if (!(fabs(nll - want_nll) <= NLL_REL * want_nll))
        fail_msg("%s %s: NLL %.6f, golden %.6f", model, scheme, nll, want_nll);
    free(first);
    dol_engine_free(e);
    cJSON_Delete(fp);
    cJSON_Delete(g);
    dol_model_free(m);
}

#ifndef QG_BACKEND_CUDA
static void test_tensors_stories_nf4(void **s) { (void)s; tensors("stories260K", "nf4"); }
static void test_tensors_stories_int8(void **s) { (void)s; tensors("stories260K", "int8"); }
static void test_tensors_tiny_nf4(void **s) { (void)s; tensors("tiny-llama2", "nf4"); }
static void test_tensors_tiny_int8(void **s) { (void)s; tensors("tiny-llama2", "int8"); }
#endif
static void test_engine_stories_nf4(void **s) { (void)s; engine_golden("stories260K", "nf4"); }
static void test_engine_stories_int8(void **s) { (void)s; engine_golden("stories260K", "int8"); }
static void test_engine_tiny_nf4(void **s) { (void)s; engine_golden("tiny-llama2", "nf4"); }
static void test_engine_tiny_int8(void **s) { (void)s; engine_golden("tiny-llama2", "int8"); }
#ifndef QG_BACKEND_CUDA
static void fast_golden(const char *model, const char *scheme)
{
    if (!dol_amx_available()) skip();
    g_fast = true;
    engine_golden(model, scheme);
    g_fast = false;
}
static void test_fast_stories_nf4(void **s) { (void)s; fast_golden("stories260K", "nf4"); }
static void test_fast_stories_int8(void **s) { (void)s; fast_golden("stories260K", "int8"); }
static void test_fast_tiny_nf4(void **s) { (void)s; fast_golden("tiny-llama2", "nf4"); }
static void test_fast_tiny_int8(void **s) { (void)s; fast_golden("tiny-llama2", "int8"); }
#endif

int main(void)
{
#ifdef QG_BACKEND_CUDA
    char why[256];
    if (!dol_cuda_device_check(why, sizeof why)) {
        printf("test_cuda_quant_golden: no usable CUDA device (%s); skipping\n", why);
#ifdef DOLPHIN_CUDA_EMU
        return 1; /* the emulated device is always there: not finding it is a failure */
#else
        return 77;
#endif
    }
#endif
    const struct CMUnitTest tests[] = {
#ifndef QG_BACKEND_CUDA
        cmocka_unit_test(test_tensors_stories_nf4),
        cmocka_unit_test(test_tensors_stories_int8),
        cmocka_unit_test(test_tensors_tiny_nf4),
        cmocka_unit_test(test_tensors_tiny_int8),
#endif
        cmocka_unit_test(test_engine_stories_nf4),
        cmocka_unit_test(test_engine_stories_int8),
        cmocka_unit_test(test_engine_tiny_nf4),
        cmocka_unit_test(test_engine_tiny_int8),
#ifndef QG_BACKEND_CUDA
        cmocka_unit_test(test_fast_stories_nf4),
        cmocka_unit_test(test_fast_stories_int8),
        cmocka_unit_test(test_fast_tiny_nf4),
        cmocka_unit_test(test_fast_tiny_int8),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
