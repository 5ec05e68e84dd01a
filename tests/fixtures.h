/* tests/fixtures.h — the shared test fixtures ($DOLPHIN_SHARED, else
 * ../shared beside the checkout: models/ and golden/) as the C tests and
 * tools/eval_quant.c read them: the root, a JSON file, and id lists; and the
 * logits helpers that comparisons with the golden outputs use. No test
 * framework here; tests/unit/test_fixtures.h adds cmocka's skip. */
#ifndef DOLPHIN_TESTS_FIXTURES_H
#define DOLPHIN_TESTS_FIXTURES_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

/* The fixtures' root directory. */
static inline const char *fixture_shared_dir(void)
{
    const char *s = getenv("DOLPHIN_SHARED");
    return s && *s ? s : "../shared";
}

/* The JSON file at `path` (as given), parsed; NULL when it cannot be read
 * or parsed. The caller frees it with cJSON_Delete. */
/* DOLPHIN_TEST_LIGHT=1 (scripts/test.sh sets it for the sanitizer build's
 * run, ten times slower): loops over the GGUF files take one of each kind
 * of kernel (the float files, Q8_0, Q4_0, Q4_K_M); the Release run takes
 * them all. `key` is the file's entry in its golden (F16, Q4_0, ...). */
static inline bool fixture_light(void)
{
    const char *light = getenv("DOLPHIN_TEST_LIGHT");
    return light && strcmp(light, "1") == 0;
}

static inline bool fixture_gguf_wanted(const char *key)
{
    if (!fixture_light()) return true;
    return !strcmp(key, "F16") || !strcmp(key, "F32") || !strcmp(key, "Q8_0") || !strcmp(key, "Q4_0") ||
           !strcmp(key, "Q4_K_M");
}

static inline cJSON *fixture_json_at(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (buf) buf[n] = 0;
    fclose(f);
    cJSON *j = buf ? cJSON_Parse(buf) : NULL;
    free(buf);
    return j;
}

/* fixture_json_at for `rel` under the fixtures' root ("golden/x.json"). */
static inline cJSON *fixture_json(const char *rel)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", fixture_shared_dir(), rel);
    return fixture_json_at(path);
}

/* Up to max ids of a JSON array of numbers into out; returns how many. */
static inline int fixture_ids(const cJSON *arr, int32_t *out, int max)
{
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) if (n < max) out[n++] = (int32_t)it->valueint;
    return n;
}

/* The index of the largest of x[0..n) (the first one on a tie). */
static inline int32_t fixture_argmax(const float *x, int n)
{
    int32_t b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

/* The best logit minus the second best: how clearly a greedy step was decided. */
static inline double fixture_margin(const float *x, int n)
{
    int32_t b = fixture_argmax(x, n);
    double second = -INFINITY;
    for (int i = 0; i < n; i++) if (i != b && x[i] > second) second = x[i];
    return (double)x[b] - second;
}

/* max |a[i] - b[i]| over n values; NaN when any difference is NaN. */
static inline double fixture_max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

#endif
