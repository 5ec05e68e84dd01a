/* tests/cuda/test_cuda_gguf.c — GGUF files on the CUDA backend (on a GPU,
 * or on the CPU under the emulation): the F32/F16 fixtures give the same
 * greedy ids and logits, bit for bit, as the safetensors checkpoints they
 * were made from on the same backend, and the float64 reference's greedy
 * ids up to the first step whose margin is below 5e-2 (FP16 arithmetic);
 * every file in a block-quantized type (the k256 set, tiny-llama2 Q4_K_M),
 * held as stored (kernels/ggml_blocks.cu), gives the reference's greedy ids
 * up to the first step whose margin is below 5e-2, the reference's top-8
 * logits after each prompt within TOP8_BOUND, and holds
 * no more device bytes of weights than the file has.
 * Exits 77 (skipped) without a usable CUDA device or fixtures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../unit/test_fixtures.h"
#include "dolphin/engine.h"
#include "dolphin/model.h"
#include "engine/backend.h"

#define CUDA_MARGIN 5e-2
#define TOP8_BOUND 0.05 /* logits after the prompt, CUDA (FP16 inputs) against the float64 reference */

static dol_engine *cuda_engine(dol_model *m)
{
    dol_engine *e = NULL;
    char err[DOL_ERR_LEN];
    dol_engine_params p = { .activations = DOL_ACT_F32, .backend = DOL_BACKEND_CUDA, .gpu_memory_utilization = 0.90,
                           .n_threads = 1, .kv_block_size = 16, .kv_cache_tokens = 1024,
                           .max_seqs = 2, .max_batch_tokens = 256};
    if (dol_engine_create(m, &p, &e, err, sizeof err) != 0) fail_msg("%s", err);
    assert_string_equal(dol_engine_backend_name(e), "cuda");
    return e;
}

static void against_checkpoint(const char *file, const char *dir_name, const char *golden,
                               const char *key)
{
    char path[1200], dir[1200], err[DOL_ERR_LEN], rel[96];
    snprintf(path, sizeof path, "%s/models/gguf/%s", test_shared_dir(), file);
    if (access(path, R_OK) != 0) skip();
    test_fixture_model(dir, sizeof dir, dir_name);
    snprintf(rel, sizeof rel, "golden/gguf-%s.json", golden);
    cJSON *gold = fixture_json(rel);
    if (!gold) skip();
    const cJSON *cases = cJSON_GetObjectItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(gold, "files"), key),
                            "reference"), "cases");
    assert_non_null(cases);
    dol_model *g = NULL, *h = NULL;
    if (dol_model_load(path, &g, err, sizeof err) != 0) fail_msg("%s", err);
    if (dol_model_load(dir, &h, err, sizeof err) != 0) fail_msg("%s", err);
    dol_engine *eg = cuda_engine(g), *eh = cuda_engine(h);
    const int V = g->cfg.vocab_size;
    float *fg = malloc(sizeof(float) * (size_t)V), *fh = malloc(sizeof(float) * (size_t)V);
    const cJSON *c;
    int ci = 0;
    cJSON_ArrayForEach(c, cases) {
        int32_t prompt[64], want[128], og[128], oh[128];
        int np = fixture_ids(cJSON_GetObjectItem(c, "prompt_ids"), prompt, 64);
        int nw = fixture_ids(cJSON_GetObjectItem(c, "greedy_ids"), want, 128);
        int max_new = cJSON_GetObjectItem(c, "max_tokens")->valueint;
        int ng = test_greedy(eg, prompt, np, max_new, og, NULL, fg);
        int nh = test_greedy(eh, prompt, np, max_new, oh, NULL, fh);
        assert_int_equal(ng, nh);
        assert_memory_equal(og, oh, (size_t)ng * sizeof *og);
        assert_memory_equal(fg, fh, sizeof(float) * (size_t)V);
        const cJSON *mg = cJSON_GetObjectItem(c, "greedy_margins");
        for (int s = 0; s < nw && cJSON_GetArrayItem(mg, s)->valuedouble >= CUDA_MARGIN; s++)
            if (s >= ng || og[s] != want[s])
                fail_msg("%s case %d step %d: id %d, reference %d", file, ci, s,
                         s < ng ? og[s] : -1, want[s]);
        ci++;
    }
    free(fg);
    free(fh);
    dol_engine_free(eg);
    dol_engine_free(eh);
    dol_model_free(g);
    dol_model_free(h);
    cJSON_Delete(gold);
}

static void test_stories_f32(void **state)
{
    (void)state;
    against_checkpoint("stories260K-F32.gguf", "stories260K", "stories260K", "F32");
}

static void test_k256_f16(void **state)
{
    (void)state;
    against_checkpoint("k256-F16.gguf", "k256", "k256", "F16");
}

static void test_tiny_llama2_f16(void **state)
{
    (void)state;
    against_checkpoint("tiny-llama2-F16.gguf", "tiny-llama2", "tiny-llama2", "F16");
}

/* One quantized file on CUDA: the reference's greedy ids up to the first
 * margin below CUDA_MARGIN, in every case of its golden entry. */
static void quantized_file(const char *file, const cJSON *entry)
{
    char path[1200], err[DOL_ERR_LEN];
    snprintf(path, sizeof path, "%s/models/gguf/%s", test_shared_dir(), file);
    dol_model *g = NULL;
    if (dol_model_load(path, &g, err, sizeof err) != 0) fail_msg("%s", err);
    dol_engine *eg = cuda_engine(g);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    if (dol_engine_weight_bytes(eg) > (size_t)st.st_size)
        fail_msg("%s: %zu bytes of weights on the device, the file has %lld", file,
                 dol_engine_weight_bytes(eg), (long long)st.st_size);
    const cJSON *cases = cJSON_GetObjectItem(cJSON_GetObjectItem(entry, "reference"), "cases");
    assert_non_null(cases);
    const int V = g->cfg.vocab_size;
    float *first = malloc(sizeof(float) * (size_t)V);
    double worst = 0;
    const cJSON *c;
    int ci = 0;
    cJSON_ArrayForEach(c, cases) {
        int32_t prompt[64], want[128], og[128];
        const int np = fixture_ids(cJSON_GetObjectItem(c, "prompt_ids"), prompt, 64);
        const int nw = fixture_ids(cJSON_GetObjectItem(c, "greedy_ids"), want, 128);
        const int max_new = cJSON_GetObjectItem(c, "max_tokens")->valueint;
        /* the steps up to the first small margin are checked: generate no further */
        const cJSON *mg = cJSON_GetObjectItem(c, "greedy_margins");
        int checked = 0;
        while (checked < nw && cJSON_GetArrayItem(mg, checked)->valuedouble >= CUDA_MARGIN) checked++;
        const int ng = test_greedy(eg, prompt, np, checked < max_new ? checked : max_new, og, NULL, first);
        const cJSON *top8 = cJSON_GetObjectItem(c, "last_logits_top8"), *pr;
        assert_true(cJSON_GetArraySize(top8) == 8);
        cJSON_ArrayForEach(pr, top8) {
            const int id = cJSON_GetArrayItem(pr, 0)->valueint;
            const double want_v = cJSON_GetArrayItem(pr, 1)->valuedouble;
            assert_true(id >= 0 && id < V);
            const double d = fabs((double)first[id] - want_v);
            if (!(d <= TOP8_BOUND))
                fail_msg("%s case %d: logit %d after the prompt %.6f, reference %.6f", file, ci, id,
                         first[id], want_v);
            worst = d > worst ? d : worst;
        }
        int s = 0;
        for (; s < checked; s++)
            if (s >= ng || og[s] != want[s])
                fail_msg("%s case %d step %d: id %d, reference %d", file, ci, s,
                         s < ng ? og[s] : -1, want[s]);
        printf("test_cuda_gguf: %s case %d: %d ids equal the reference's (of %d)\n", file, ci, s, nw);
        ci++;
    }
    assert_true(ci > 0);
    printf("test_cuda_gguf: %s: largest top-8 logit difference from the reference %.4f\n", file, worst);
    free(first);
    dol_engine_free(eg);
    dol_model_free(g);
}

static void test_quantized_files(void **state)
{
    (void)state;
    static const char *const models[] = {"k256", "tiny-llama2"};
    int seen = 0;
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        char rel[96], path[1200];
        snprintf(rel, sizeof rel, "golden/gguf-%s.json", models[mi]);
        cJSON *gold = fixture_json(rel);
        if (!gold) continue;
        const cJSON *entry;
        cJSON_ArrayForEach(entry, cJSON_GetObjectItem(gold, "files")) {
            if (strcmp(entry->string, "F16") == 0 || strcmp(entry->string, "F32") == 0) continue;
            const char *file = cJSON_GetObjectItem(entry, "file")->valuestring;
            snprintf(path, sizeof path, "%s/models/gguf/%s", test_shared_dir(), file);
            if (access(path, R_OK) != 0) continue; /* the GPU kit carries one file */
            quantized_file(file, entry);
            seen++;
        }
        cJSON_Delete(gold);
    }
    if (!seen) skip();
}

int main(void)
{
    char why[256];
    if (!dol_cuda_device_check(why, sizeof why)) {
        printf("test_cuda_gguf: no usable CUDA device (%s); skipping\n", why);
#ifdef DOLPHIN_CUDA_EMU
        return 1; /* the emulated device is always there: not finding it is a failure */
#else
        return 77;
#endif
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_f32),
        cmocka_unit_test(test_k256_f16),
        cmocka_unit_test(test_tiny_llama2_f16),
        cmocka_unit_test(test_quantized_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
