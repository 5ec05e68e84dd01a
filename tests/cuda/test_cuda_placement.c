/* tests/cuda/test_cuda_placement.c — layer placement through the public
 * engine API: blocks split over two CUDA devices (peer copies and pinned host
 * hand-offs), over two devices and the CPU, gpu_layers 0 / 1 / all, automatic
 * spill to the CPU when the device budget is short, and the refusals
 * (allow_host_spill off, a split that cannot fit, malformed settings, exit
 * status -2). Every placement reproduces the golden greedy ids of the
 * fixtures under the FP16 rule of test_cuda_engine.c (up to the first step
 * whose golden margin is below MARGIN_BOUND); placements made of CUDA ranges
 * only also match the one-device run's logits within SAME_BOUND; a batch of
 * sequences gives what each gives alone; every KV block is free again at the
 * end. Under the emulation the process asks for two virtual devices; the
 * budgets that force spill are computed from the device's own figures, so
 * the cases hold on a real GPU too. Exits 77 without a device or fixtures. */
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

#include "dolphin/engine.h"
#include "dolphin/model.h"
#include "engine/backend.h"
#include "engine/cpu_i8.h"

#define LOGIT_BOUND 0.03
#define MARGIN_BOUND (2 * LOGIT_BOUND)
#define SAME_BOUND 1e-3
#define MODEL "stories260K"
#define MAX_NEW 24

static dol_model *g_model;
static int g_devices;

static dol_engine_params params(void)
{
    dol_engine_params p = { .activations = DOL_ACT_F32, .backend = DOL_BACKEND_CUDA, .gpu_memory_utilization = 0.90, .n_threads = 2,
                            .kv_block_size = 16, .max_seqs = 9, .max_batch_tokens = 512 };
    return p;
}

/* Greedy ids of one sequence (prompt in one call); the logits after the
 * prompt into first. */
static int greedy(dol_engine *e, const int32_t *prompt, int np, int32_t *out, float *first)
{
    const int V = dol_engine_vocab_size(e);
    float *logits = malloc(sizeof(float) * (size_t)V);
    char err[DOL_ERR_LEN];
    int seq = dol_engine_seq_new(e);
    assert_true(seq >= 0);
    assert_int_equal(dol_engine_seq_reserve(e, seq, np + MAX_NEW), 0);
    dol_batch_item it = { seq, np, prompt, 0, 1, logits };
    if (dol_engine_forward(e, &it, 1, err, sizeof err) != 0) fail_msg("%s", err);
    if (first) memcpy(first, logits, sizeof(float) * (size_t)V);
    int n = 0;
    for (int step = 0; step < MAX_NEW; step++) {
        int32_t id = fixture_argmax(logits, V);
        if (id == 1 || id == 2) break;
        out[n++] = id;
        dol_batch_item d = { seq, 1, &out[n - 1], np + n - 1, 1, logits };
        if (dol_engine_forward(e, &d, 1, err, sizeof err) != 0) fail_msg("%s", err);
    }
    dol_engine_seq_free(e, seq);
    free(logits);
    return n;
}

/* The golden cases of the fixture: ids under the FP16 rule; the logits
 * after each prompt into ref[case] (compare == false) or compared with it. */
enum { MAX_CASES = 8 };
static float *g_ref[MAX_CASES];

static void golden_check(dol_engine *e, const char *what, bool compare)
{
    cJSON *g = fixture_json("golden/" MODEL ".json");
    assert_non_null(g);
    const int V = dol_engine_vocab_size(e);
    float *first = malloc(sizeof(float) * (size_t)V);
    const cJSON *c;
    int k = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "cases")) {
        if (k == MAX_CASES) break;
        int32_t prompt[1024], want[1024], got[MAX_NEW];
        int np = fixture_ids(cJSON_GetObjectItem(c, "prompt_ids"), prompt, 1024);
        int nw = fixture_ids(cJSON_GetObjectItem(c, "greedy_ids"), want, 1024);
        const cJSON *margins = cJSON_GetObjectItem(c, "greedy_margins");
        int trusted = 0;
        while (trusted < cJSON_GetArraySize(margins) && trusted < MAX_NEW &&
               cJSON_GetArrayItem(margins, trusted)->valuedouble >= MARGIN_BOUND)
            trusted++;
        int cmp = trusted < nw ? trusted : nw;
        int ng = greedy(e, prompt, np, got, first);
        assert_true(ng >= (cmp < MAX_NEW ? cmp : MAX_NEW));
        for (int i = 0; i < cmp && i < ng; i++)
            if (got[i] != want[i]) fail_msg("%s: case %d step %d: id %d, golden %d", what, k, i, got[i], want[i]);
        if (compare) {
            double d = fixture_max_abs_diff(first, g_ref[k], (size_t)V);
            printf("%s: case %d: %d trusted golden ids reproduced; logits vs one device: %.3g\n", what, k, cmp, d);
            assert_true(d <= SAME_BOUND);
        } else {
            if (!g_ref[k]) g_ref[k] = malloc(sizeof(float) * (size_t)V);
            memcpy(g_ref[k], first, sizeof(float) * (size_t)V);
            printf("%s: case %d: %d trusted golden ids reproduced\n", what, k, cmp);
        }
        k++;
    }
    assert_true(k > 0);
    free(first);
    cJSON_Delete(g);
}

/* Four sequences together (one prefill call, then one decode call per step)
 * give the ids each gives alone; every block is free afterwards. */
static void batch_check(dol_engine *e, const char *what)
{
    enum { NS = 4, STEPS = 8 };
    const int V = dol_engine_vocab_size(e);
    const int lens[NS] = { 3, 17, 1, 40 };
    int32_t toks[NS][48], alone[NS][MAX_NEW], ids[NS];
    int n_alone[NS];
    for (int s = 0; s < NS; s++) {
        for (int i = 0; i < 48; i++) toks[s][i] = (int32_t)((s * 7919 + i * 104729) % (V - 3)) + 3;
        n_alone[s] = greedy(e, toks[s], lens[s], alone[s], NULL);
    }
    float *logits = malloc(sizeof(float) * (size_t)V * NS);
    char err[DOL_ERR_LEN];
    int q[NS];
    dol_batch_item items[NS];
    for (int s = 0; s < NS; s++) {
        q[s] = dol_engine_seq_new(e);
        assert_int_equal(dol_engine_seq_reserve(e, q[s], lens[s] + STEPS), 0);
        items[s] = (dol_batch_item){ q[s], lens[s], toks[s], 0, 1, logits + (size_t)s * V };
    }
    if (dol_engine_forward(e, items, NS, err, sizeof err) != 0) fail_msg("%s", err);
    for (int step = 0; step < STEPS; step++) {
        for (int s = 0; s < NS; s++) {
            ids[s] = fixture_argmax(logits + (size_t)s * V, V);
            if (step < n_alone[s] && ids[s] != alone[s][step])
                fail_msg("%s: sequence %d step %d: %d in the batch, %d alone", what, s, step, ids[s], alone[s][step]);
            items[s] = (dol_batch_item){ q[s], 1, &ids[s], lens[s] + step, 1, logits + (size_t)s * V };
        }
        if (dol_engine_forward(e, items, NS, err, sizeof err) != 0) fail_msg("%s", err);
    }
    for (int s = 0; s < NS; s++) dol_engine_seq_free(e, q[s]);
    assert_int_equal(dol_engine_kv_blocks_free(e), dol_engine_kv_blocks_total(e));
    free(logits);
}

static dol_engine *make(const dol_engine_params *p)
{
    dol_engine *e = NULL;
    char err[DOL_ERR_LEN];
    if (dol_engine_create(g_model, p, &e, err, sizeof err) != 0) fail_msg("%s", err);
    return e;
}

/* What each device holds, as "cuda:0 0..1 | cuda:1 2..4 head". */
static void layout(dol_engine *e, char *buf, size_t n)
{
    dol_device_memory d[DOL_MAX_DEVICES + 1];
    int k = dol_engine_devices(e, d, DOL_MAX_DEVICES + 1);
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < k && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%s %d..%d%s", i ? " | " : "", d[i].name, d[i].first_block,
                              d[i].first_block + d[i].n_blocks - 1, d[i].head ? " head" : "");
}

static void expect_layout(dol_engine *e, const char *want)
{
    char got[256];
    layout(e, got, sizeof got);
    printf("placement: %s\n", got);
    assert_string_equal(got, want);
}

/* The one-device reference: its logits become g_ref. */
static void test_one_device(void **state)
{
    (void)state;
    dol_engine_params p = params();
    dol_engine *e = make(&p);
    expect_layout(e, "cuda:0 0..4 head");
    golden_check(e, "one device", false);
    dol_engine_free(e);
}

static void split_two(bool peer)
{
    if (g_devices < 2) skip();
    setenv("DOLPHIN_CUDA_EMU_PEER", peer ? "1" : "0", 1);
    dol_engine_params p = params();
    p.n_devices = 2;
    p.devices[0] = 0;
    p.devices[1] = 1;
    p.n_layer_split = 2;
    p.layer_split[0] = 2;
    p.layer_split[1] = 3;
    dol_engine *e = make(&p);
    expect_layout(e, "cuda:0 0..1 | cuda:1 2..4 head");
    golden_check(e, peer ? "split 2+3, peer copy" : "split 2+3, pinned host", true);
    batch_check(e, "split 2+3");
    dol_engine_free(e);
    unsetenv("DOLPHIN_CUDA_EMU_PEER");
}
static void test_split_two_peer(void **state) { (void)state; split_two(true); }
static void test_split_two_host(void **state) { (void)state; split_two(false); }

/* Two devices, then the CPU; the head on the last GPU. */
static void test_split_three_with_cpu(void **state)
{
    (void)state;
    if (g_devices < 2) skip();
    dol_engine_params p = params();
    p.n_devices = 2;
    p.devices[0] = 0;
    p.devices[1] = 1;
    p.n_layer_split = 2;
    p.layer_split[0] = 1;
    p.layer_split[1] = 2;
    p.gpu_layers_set = true;
    p.gpu_layers = 3;
    dol_engine *e = make(&p);
    expect_layout(e, "cuda:0 0..0 | cuda:1 1..2 head | cpu 3..4");
    assert_string_equal(dol_engine_activations(e), "f16");
    golden_check(e, "split 1+2+cpu 2", false);
    batch_check(e, "split 1+2+cpu 2");
    dol_engine_free(e);
    /* quantized weights with activations auto: the host blocks run 8-bit
     * activations where the CPU has an int8 set, and the engine says so */
    p.weights = DOL_WEIGHTS_NF4;
    p.activations = DOL_ACT_AUTO;
    e = make(&p);
    assert_string_equal(dol_engine_activations(e), dol_cpu_i8_get() ? "f16+int8" : "f16");
    dol_engine_free(e);
}

static void test_gpu_layers(void **state)
{
    (void)state;
    const int L = g_model->cfg.n_layers;
    const struct { int n; const char *want; const char *backend; } cases[] = {
        { 0, "cpu 0..4 head", "cpu" },
        { 1, "cuda:0 0..0 head | cpu 1..4", "cuda" },
        { L, "cuda:0 0..4 head", "cuda" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dol_engine_params p = params();
        p.gpu_layers_set = true;
        p.gpu_layers = cases[i].n;
        dol_engine *e = make(&p);
        assert_string_equal(dol_engine_backend_name(e), cases[i].backend);
        expect_layout(e, cases[i].want);
        char what[64];
        snprintf(what, sizeof what, "gpu_layers %d", cases[i].n);
        golden_check(e, what, false);
        batch_check(e, what);
        dol_engine_free(e);
    }
}

/* A gpu_memory_utilization under which device `dev` has room for blocks
 * 0..n-1 with the embedding and the head (plus half a block's weights),
 * solved from the device's own budget: avail is linear in the fraction. */
static double utilization_for(const dol_engine_params *p, int dev, int n)
{
    const dol_backend_ops *o = &dol_cuda_backend;
    size_t avail = 0, total = 0;
    char err[DOL_ERR_LEN];
    assert_int_equal(o->device_budget(dev, 1.0, &avail, &total, err, sizeof err), 0);
    const int ctx = g_model->cfg.max_position_embeddings, bs = p->kv_block_size;
    const dol_layer_range rn = { 0, n, true, true, dev }, r1 = { 0, n + 1, true, true, dev };
    const double kv_layer = 2.0 * bs * g_model->cfg.n_kv_heads * g_model->cfg.head_dim * 2 * ((ctx + bs - 1) / bs);
    const double need = (double)o->range_bytes(g_model, p, ctx, bs, &rn, NULL, 0) + n * kv_layer;
    const double next = (double)o->range_bytes(g_model, p, ctx, bs, &r1, NULL, 0) + (n + 1) * kv_layer;
    const double target = (need + next) / 2;
    return 1.0 - ((double)avail - target) / (double)total;
}

/* Automatic placement on one device with room for two blocks: the rest
 * spills to the CPU (logged), and the answers stay the golden ones. */
static void test_auto_spill(void **state)
{
    (void)state;
    dol_engine_params p = params();
    p.gpu_memory_utilization = utilization_for(&p, 0, 2);
    printf("gpu_memory_utilization %.6f leaves room for 2 blocks\n", p.gpu_memory_utilization);
    dol_engine *e = make(&p);
    expect_layout(e, "cuda:0 0..1 head | cpu 2..4");
    golden_check(e, "auto spill", false);
    batch_check(e, "auto spill");
    dol_engine_free(e);
}

/* The same budget with allow_host_spill off, and splits that cannot be:
 * -2 and one line naming the device and the bytes. */
static void test_refusals(void **state)
{
    (void)state;
    dol_engine_params p = params();
    p.gpu_memory_utilization = utilization_for(&p, 0, 2);
    p.no_host_spill = true;
    dol_engine *e = NULL;
    char err[DOL_ERR_LEN] = "";
    assert_int_equal(dol_engine_create(g_model, &p, &e, err, sizeof err), -2);
    printf("no spill: %s\n", err);
    assert_non_null(strstr(err, "allow_host_spill"));
    assert_non_null(strstr(err, "only 2 of 5 blocks fit"));
    assert_non_null(strstr(err, "MiB"));

    p.no_host_spill = false;
    p.gpu_layers_set = true;
    p.gpu_layers = 4;
    assert_int_equal(dol_engine_create(g_model, &p, &e, err, sizeof err), -2);
    printf("gpu_layers 4: %s\n", err);
    assert_non_null(strstr(err, "cuda:0"));
    assert_non_null(strstr(err, "short by"));

    p = params();
    p.gpu_layers_set = true;
    p.gpu_layers = 6;
    assert_int_equal(dol_engine_create(g_model, &p, &e, err, sizeof err), -2);
    printf("gpu_layers 6: %s\n", err);

    p = params();
    p.n_devices = 1;
    p.devices[0] = 0;
    p.n_layer_split = 2;
    p.layer_split[0] = p.layer_split[1] = 2;
    assert_int_equal(dol_engine_create(g_model, &p, &e, err, sizeof err), -2);
    printf("split of 2 for 1 device: %s\n", err);

    p = params();
    p.n_devices = 1;
    p.devices[0] = 9;
    assert_int_equal(dol_engine_create(g_model, &p, &e, err, sizeof err), -2);
    printf("device 9: %s\n", err);
    assert_non_null(strstr(err, "cuda:9"));

    if (g_devices >= 2) {
        p = params();
        p.gpu_memory_utilization = utilization_for(&p, 1, 2);
        p.n_devices = 2;
        p.devices[0] = 0;
        p.devices[1] = 1;
        p.n_layer_split = 2;
        p.layer_split[0] = 1;
        p.layer_split[1] = 4;
        assert_int_equal(dol_engine_create(g_model, &p, &e, err, sizeof err), -2);
        printf("split 1+4: %s\n", err);
        assert_non_null(strstr(err, "cuda:1"));
        assert_non_null(strstr(err, "short by"));
    }
    assert_null(e);
}

int main(void)
{
#ifdef DOLPHIN_CUDA_EMU
    setenv("DOLPHIN_CUDA_EMU_DEVICES", "2", 0);
#endif
    char why[256], dir[1200], err[DOL_ERR_LEN];
    if (!dol_cuda_device_check(why, sizeof why)) {
        printf("test_cuda_placement: no usable CUDA device (%s); skipping\n", why);
        return 77;
    }
    cJSON *g = fixture_json("golden/" MODEL ".json");
    if (!g) {
        printf("test_cuda_placement: no fixtures; skipping\n");
        return 77;
    }
    cJSON_Delete(g);
    snprintf(dir, sizeof dir, "%s/models/%s", fixture_shared_dir(), MODEL);
    if (dol_model_load(dir, &g_model, err, sizeof err) != 0) {
        printf("%s\n", err);
        return 1;
    }
    g_devices = dol_cuda_device_count();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_device),
        cmocka_unit_test(test_split_two_peer),
        cmocka_unit_test(test_split_two_host),
        cmocka_unit_test(test_split_three_with_cpu),
        cmocka_unit_test(test_gpu_layers),
        cmocka_unit_test(test_auto_spill),
        cmocka_unit_test(test_refusals),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int i = 0; i < MAX_CASES; i++) free(g_ref[i]);
    dol_model_free(g_model);
    return rc;
}
