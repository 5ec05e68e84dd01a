/* tests/unit/test_metrics.c — unit tests for src/obs/metrics.c: bucket
 * placement and cumulative counts, per-route series, counters, gauges,
 * label escaping, the GPU family without a sample, negative figures
 * ignored, and concurrent recording (the HTTP tests run promtool on the
 * live output). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dolphin/metrics.h"

static dol_metrics_gauges gauges(void)
{
    dol_metrics_gauges g = {0};
    g.version = "9.9.9";
    g.backend = "cpu";
    g.model = "m";
    g.ready = true;
    g.kv_blocks_used = 1;
    g.kv_blocks_total = 4;
    g.kv_block_size = 16;
    g.gpu_utilization = -1;
    return g;
}

static char *render(dol_metrics *m, const dol_metrics_gauges *g)
{
    size_t len = 0;
    char *s = dol_metrics_render(m, g, &len);
    assert_non_null(s);
    assert_int_equal(strlen(s), len);
    return s;
}

/* The line starting with `prefix` must be present; returns its value. */
static double line_value(const char *text, const char *prefix)
{
    const char *p = text;
    size_t n = strlen(prefix);
    while ((p = strstr(p, prefix)) != NULL) {
        if ((p == text || p[-1] == '\n') && p[n] == ' ') return strtod(p + n + 1, NULL);
        p += n;
    }
    fail_msg("no line %s in:\n%s", prefix, text);
    return 0;
}

static void test_buckets_and_counters(void **state)
{
    (void)state;
    dol_metrics *m = dol_metrics_new();
    assert_non_null(m);
    dol_metrics_request r = {.route = "/v1/completions", .status = 200, .duration_s = 0.3,
                             .prompt_tokens = 5, .completion_tokens = 7, .queue_s = 0.002,
                             .ttft_s = 0.02, .tpot_s = 0.004};
    dol_metrics_observe(m, &r);
    r.duration_s = 0.5;            /* exactly on a bound: counted in le="0.5" */
    r.ttft_s = 2000;               /* past the last bound: only +Inf */
    dol_metrics_observe(m, &r);
    dol_metrics_request probe = {.route = "/healthz", .status = 503, .duration_s = 0.001,
                                 .queue_s = -1, .ttft_s = -1, .tpot_s = -1};
    dol_metrics_observe(m, &probe);

    dol_metrics_gauges g = gauges();
    char *s = render(m, &g);
    assert_float_equal(line_value(s, "dolphin_requests_total{route=\"/v1/completions\",status=\"200\"}"), 2, 0);
    assert_float_equal(line_value(s, "dolphin_requests_total{route=\"/healthz\",status=\"503\"}"), 1, 0);
    const char *d = "dolphin_request_duration_seconds_bucket{route=\"/v1/completions\",le=";
    char k[200];
    snprintf(k, sizeof k, "%s\"0.25\"}", d);
    assert_float_equal(line_value(s, k), 0, 0);
    snprintf(k, sizeof k, "%s\"0.5\"}", d);
    assert_float_equal(line_value(s, k), 2, 0);
    snprintf(k, sizeof k, "%s\"+Inf\"}", d);
    assert_float_equal(line_value(s, k), 2, 0);
    assert_float_equal(line_value(s, "dolphin_request_duration_seconds_sum{route=\"/v1/completions\"}"), 0.8, 1e-9);
    assert_float_equal(line_value(s, "dolphin_time_to_first_token_seconds_bucket{route=\"/v1/completions\",le=\"60\"}"), 1, 0);
    assert_float_equal(line_value(s, "dolphin_time_to_first_token_seconds_bucket{route=\"/v1/completions\",le=\"+Inf\"}"), 2, 0);
    assert_float_equal(line_value(s, "dolphin_time_to_first_token_seconds_count{route=\"/v1/completions\"}"), 2, 0);
    /* the probe has a duration but no first token, queue or per-token series */
    assert_float_equal(line_value(s, "dolphin_request_duration_seconds_count{route=\"/healthz\"}"), 1, 0);
    assert_null(strstr(s, "dolphin_time_to_first_token_seconds_count{route=\"/healthz\"}"));
    assert_null(strstr(s, "dolphin_queue_time_seconds_count{route=\"/healthz\"}"));
    assert_float_equal(line_value(s, "dolphin_prompt_tokens_total"), 10, 0);
    assert_float_equal(line_value(s, "dolphin_generation_tokens_total"), 14, 0);
    free(s);
    dol_metrics_free(m);
}

static void test_gauges_and_metadata(void **state)
{
    (void)state;
    dol_metrics_gauges g = gauges();
    g.device_memory_used = 3;
    g.device_memory_total = 12;
    g.weight_bytes = 1000;
    g.queue_depth = 7;
    g.running_seqs = 5;
    char *s = render(NULL, &g);   /* no per-request figures at all */
    assert_float_equal(line_value(s, "dolphin_ready"), 1, 0);
    assert_float_equal(line_value(s, "dolphin_queue_depth"), 7, 0);
    assert_float_equal(line_value(s, "dolphin_running_sequences"), 5, 0);
    assert_float_equal(line_value(s, "dolphin_kv_cache_usage_ratio"), 0.25, 1e-12);
    assert_float_equal(line_value(s, "dolphin_device_memory_total_bytes"), 12, 0);
    assert_float_equal(line_value(s, "dolphin_weight_bytes"), 1000, 0);
    assert_float_equal(line_value(s, "dolphin_build_info{version=\"9.9.9\",backend=\"cpu\",model=\"m\"}"), 1, 0);
    /* every family declared, histograms even without series */
    assert_non_null(strstr(s, "# TYPE dolphin_requests_total counter\n"));
    assert_non_null(strstr(s, "# TYPE dolphin_time_per_output_token_seconds histogram\n"));
    /* GPU utilisation unknown: declared, no sample */
    assert_non_null(strstr(s, "# TYPE dolphin_gpu_utilization_ratio gauge\n"));
    assert_null(strstr(s, "\ndolphin_gpu_utilization_ratio "));
    free(s);
    g.gpu_utilization = 0.42;
    s = render(NULL, &g);
    assert_float_equal(line_value(s, "dolphin_gpu_utilization_ratio"), 0.42, 1e-12);
    free(s);
}

static void test_label_escaping_and_bad_input(void **state)
{
    (void)state;
    dol_metrics *m = dol_metrics_new();
    dol_metrics_request r = {.route = "a\"b\\c\nd", .status = 7, .duration_s = -1,
                             .queue_s = INFINITY, .ttft_s = -1, .tpot_s = -1};
    dol_metrics_observe(m, &r);
    dol_metrics_request none = {.route = NULL, .status = 404, .duration_s = 0.01,
                                .queue_s = -1, .ttft_s = -1, .tpot_s = -1};
    dol_metrics_observe(m, &none);
    dol_metrics_gauges g = gauges();
    g.model = "x\"y";
    char *s = render(m, &g);
    assert_non_null(strstr(s, "route=\"a\\\"b\\\\c\\nd\",status=\"0\"} 1\n"));
    assert_non_null(strstr(s, "route=\"unknown\",status=\"404\"} 1\n"));
    assert_non_null(strstr(s, "model=\"x\\\"y\""));
    /* negative or infinite times are not observations */
    assert_null(strstr(s, "dolphin_queue_time_seconds_count{route=\"a"));
    assert_non_null(strstr(s, "dolphin_request_duration_seconds_count{route=\"a\\\"b\\\\c\\nd\"} 0\n"));
    free(s);
    dol_metrics_free(m);
}

static void *hammer(void *arg)
{
    dol_metrics *m = arg;
    char route[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(route, sizeof route, "/r%d", i % 5);
        dol_metrics_request r = {.route = route, .status = 200 + i % 3, .duration_s = 0.01,
                                 .completion_tokens = 1, .queue_s = -1, .ttft_s = 0.001,
                                 .tpot_s = -1};
        dol_metrics_observe(m, &r);
    }
    return NULL;
}

static void test_concurrent_recording(void **state)
{
    (void)state;
    dol_metrics *m = dol_metrics_new();
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, hammer, m);
    dol_metrics_gauges g = gauges();
    for (int i = 0; i < 20; i++) free(render(m, &g));   /* scrapes meanwhile */
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    char *s = render(m, &g);
    assert_float_equal(line_value(s, "dolphin_generation_tokens_total"), 20000, 0);
    double n = 0;
    for (int r = 0; r < 5; r++) {
        char k[128];
        snprintf(k, sizeof k, "dolphin_time_to_first_token_seconds_count{route=\"/r%d\"}", r);
        n += line_value(s, k);
    }
    assert_float_equal(n, 20000, 0);
    free(s);
    dol_metrics_free(m);
    assert_non_null(dol_metrics_default());
    assert_ptr_equal(dol_metrics_default(), dol_metrics_default());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_and_counters),
        cmocka_unit_test(test_gauges_and_metadata),
        cmocka_unit_test(test_label_escaping_and_bad_input),
        cmocka_unit_test(test_concurrent_recording),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
