/* tests/unit/test_config.c — unit tests for src/config/config.c (defaults,
 * configs/dolphin.yaml, good and bad YAML, flags, --help, API-key
 * priorities, size suffixes) and src/obs/log.c (quoting, line format).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <limits.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dolphin/config.h"
#include "dolphin/log.h"

/* Every YAML key, written out independently of config.c's table so a field
 * missing from the table, the default file, the docs or --help is caught. */
static const char *const KEYS[] = {
    "host", "port", "max_body_bytes", "max_connections", "max_connections_per_ip",
    "connection_timeout_s", "max_json_depth", "max_prompt_tokens", "max_tokens_cap", "max_n",
    "max_stop", "max_stop_len", "max_logit_bias", "model", "served_model_name", "threads",
    "backend", "gpu_memory_utilization", "devices", "layer_split", "gpu_layers", "allow_host_spill",
    "weights", "quantize_lm_head", "context_len", "temperature", "top_p", "top_k",
    "max_tokens", "batch_window_ms", "max_batch_size", "batch_mode", "max_queue",
    "request_timeout_s", "memory_high_watermark", "kv_cache_tokens",
    "kv_cache_bytes", "kv_block_size", "prefix_caching", "prefill_chunk", "speculative_mode",
    "speculative_draft_model", "speculative_max_draft", "speculative_ngram", "speculative_min_acceptance", "api_keys",
    "default_priority", "drain_timeout_s", "vram_unready_ratio",
    "vram_unready_after_s", "log_level", "warmup", "max_loaded_models", "memory_budget_bytes",
    "load_timeout_s", "load_retry_s", "weights_cache_dir",
};
#define N_KEYS (sizeof KEYS / sizeof KEYS[0])

/* ------------------------------------------------------------- helpers */

static char g_dir[] = "/tmp/dolphin-test-config-XXXXXX";
static char g_yaml[PATH_MAX];

static int setup(void **state)
{
    (void)state;
    if (!mkdtemp(g_dir)) return -1;
    snprintf(g_yaml, sizeof g_yaml, "%s/c.yaml", g_dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_yaml);
    rmdir(g_dir);
    return 0;
}

/* Write `text` to the scratch YAML file and return its path. */
static const char *yaml(const char *text)
{
    FILE *f = fopen(g_yaml, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return g_yaml;
}

/* A file of the source tree: __FILE__ is this file's path under CMake. */
static void source_path(char *out, size_t n, const char *rel)
{
    const char *env = getenv("DOLPHIN_SOURCE_DIR");
    if (env && *env) { snprintf(out, n, "%s/%s", env, rel); return; }
    const char *me = __FILE__, *tail = "tests/unit/test_config.c";
    size_t ml = strlen(me), tl = strlen(tail);
    size_t pl = ml >= tl && strcmp(me + ml - tl, tail) == 0 ? ml - tl : 0;
    snprintf(out, n, "%.*s%s", (int)pl, me, rel);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = '\0';
    fclose(f);
    return s;
}

static void assert_contains(const char *hay, const char *needle)
{
    if (!strstr(hay, needle)) {
        print_error("expected \"%s\"\n      in \"%s\"\n", needle, hay);
        fail();
    }
}

static int parse_args(dol_config *c, char *err, const char *const *args, int n)
{
    char *argv[80];
    assert_true(n + 2 <= (int)(sizeof argv / sizeof argv[0]));
    argv[0] = "dolphind";
    for (int i = 0; i < n; i++) argv[i + 1] = (char *)args[i];
    argv[n + 1] = NULL;
    err[0] = '\0';
    return dol_config_from_args(c, n + 1, argv, err, DOL_ERR_LEN);
}

#define ARGS(...) (const char *const[]){ __VA_ARGS__ }, \
    (int)(sizeof((const char *const[]){ __VA_ARGS__ }) / sizeof(const char *))

/* ------------------------------------------------------------ defaults */

static void test_defaults(void **state)
{
    (void)state;
    dol_config c;
    memset(&c, 0xab, sizeof c);
    dol_config_defaults(&c);
    assert_string_equal(c.host, "127.0.0.1");
    assert_int_equal(c.port, 8080);
    assert_int_equal(c.max_body_bytes, 1024 * 1024);
    assert_int_equal(c.max_json_depth, 64);
    assert_int_equal(c.max_prompt_tokens, 0);
    assert_int_equal(c.max_tokens_cap, 0);
    assert_int_equal(c.max_n, 16);
    assert_int_equal(c.max_stop, 4);
    assert_int_equal(c.max_stop_len, 512);
    assert_int_equal(c.max_logit_bias, 300);
    assert_string_equal(c.model, "");
    assert_string_equal(c.served_model_name, "");
    assert_int_equal(c.threads, 0);
    assert_int_equal(c.backend, DOL_BACKEND_AUTO);
    assert_true(c.gpu_memory_utilization == 0.90);
    assert_int_equal(c.weights, DOL_WEIGHTS_AUTO);
    assert_false(c.quantize_lm_head);
    assert_int_equal(c.context_len, 0);
    assert_true(c.temperature == 1.0f);
    assert_true(c.top_p == 1.0f);
    assert_int_equal(c.top_k, 0);
    assert_int_equal(c.max_tokens, 16);
    assert_int_equal(c.batch_window_ms, 50);
    assert_int_equal(c.max_batch_size, 8);
    assert_int_equal(c.batch_mode, DOL_BATCH_CONTINUOUS);
    assert_int_equal(c.max_queue, 256);
    assert_true(c.request_timeout_s == 600.0);
    assert_true(c.memory_high_watermark == 0.80);
    assert_int_equal(c.kv_cache_tokens, 0);
    assert_int_equal(c.kv_cache_bytes, 0);
    assert_int_equal(c.kv_block_size, 16);
    assert_int_equal(c.prefill_chunk, 512);
    assert_int_equal(c.n_api_keys, 0);
    assert_int_equal(c.default_priority, 0);
    assert_true(c.drain_timeout_s == 30.0);
    assert_true(c.vram_unready_ratio == 0.90);
    assert_true(c.vram_unready_after_s == 15.0);
    assert_int_equal(c.log_level, DOL_LOG_INFO);
    assert_true(c.warmup);
}

/* configs/dolphin.yaml holds every key, each at its default (but model). */
static void test_default_file(void **state)
{
    (void)state;
    char path[PATH_MAX], err[DOL_ERR_LEN];
    source_path(path, sizeof path, "configs/dolphin.yaml");
    dol_config want, c;
    dol_config_defaults(&want);
    dol_config_defaults(&c);
    if (dol_config_load_yaml(&c, path, err, sizeof err) != 0) {
        print_error("%s\n", err);
        fail();
    }
    assert_string_equal(c.model, "../shared/models/stories260K");
    memset(c.model, 0, sizeof c.model);
    /* the single model: is a one-entry list */
    assert_int_equal(c.n_models, 1);
    assert_true(c.models[0].implicit);
    assert_string_equal(c.models[0].name, "stories260K");
    memset(c.models, 0, sizeof c.models);
    c.n_models = 0;
    assert_memory_equal(&c, &want, sizeof c);

    char *text = slurp(path);
    assert_non_null(text);
    for (size_t i = 0; i < N_KEYS; i++) {
        char line[64];
        snprintf(line, sizeof line, "\n%s:", KEYS[i]);
        assert_contains(text, line);
    }
    free(text);
}

/* docs/configuration.md names every key and its flag. */
static void test_docs_cover_every_key(void **state)
{
    (void)state;
    char path[PATH_MAX];
    source_path(path, sizeof path, "docs/configuration.md");
    char *text = slurp(path);
    assert_non_null(text);
    for (size_t i = 0; i < N_KEYS; i++) {
        char key[64], flag[64];
        snprintf(key, sizeof key, "`%s`", KEYS[i]);
        if (strcmp(KEYS[i], "api_keys") == 0) {
            snprintf(flag, sizeof flag, "`--api-key");
        } else {
            snprintf(flag, sizeof flag, "`--%s", KEYS[i]);
            for (char *p = flag; *p; p++) if (*p == '_') *p = '-';
        }
        assert_contains(text, key);
        assert_contains(text, flag);
    }
    free(text);
}

/* ---------------------------------------------------------------- YAML */

static void test_yaml_good(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN];
    dol_config c;
    dol_config_defaults(&c);
    int rc = dol_config_load_yaml(&c, yaml(
        "# a full file\n"
        "host: 0.0.0.0\n"
        "port: 9001\n"
        "max_body_bytes: 64KiB\n"
        "model: /models/llama 2   # spaces are fine in a plain scalar\n"
        "served_model_name: \"llama-2-7b-chat\"\n"
        "threads: 4\n"
        "backend: CUDA\n"
        "weights: nf4\n"
        "context_len: 2048\n"
        "temperature: 0.7\n"
        "top_p: 0.9\n"
        "top_k: 40\n"
        "max_tokens: 128\n"
        "batch_window_ms: 0\n"
        "max_batch_size: 256\n"
        "batch_mode: static\n"
        "max_queue: 1\n"
        "request_timeout_s: 0\n"
        "memory_high_watermark: 1\n"
        "kv_cache_tokens: 100000\n"
        "kv_cache_bytes: 512MiB\n"
        "kv_cache_dtype: q8_0\n"
        "kv_cache_dtype_v: f16\n"
        "kv_block_size: 32\n"
        "prefill_chunk: 128\n"
        "api_keys:\n"
        "  - key: \"sk-high\"\n"
        "    priority: 10\n"
        "  - {key: sk-low, priority: 1}\n"
        "  - key: sk-zero\n"
        "default_priority: 3\n"
        "drain_timeout_s: 5.5\n"
        "vram_unready_ratio: 0.95\n"
        "vram_unready_after_s: 0\n"
        "log_level: debug\n"
        "warmup: no\n"), err, sizeof err);
    if (rc != 0) { print_error("%s\n", err); fail(); }
    assert_string_equal(c.host, "0.0.0.0");
    assert_int_equal(c.port, 9001);
    assert_int_equal(c.max_body_bytes, 65536);
    assert_string_equal(c.model, "/models/llama 2");
    assert_string_equal(c.served_model_name, "llama-2-7b-chat");
    assert_int_equal(c.threads, 4);
    assert_int_equal(c.backend, DOL_BACKEND_CUDA); /* any case */
    assert_string_equal(dol_config_choice_name("backend", c.backend), "cuda");
    assert_int_equal(c.weights, DOL_WEIGHTS_NF4);
    assert_string_equal(dol_config_choice_name("weights", c.weights), "nf4");
    assert_int_equal(c.context_len, 2048);
    assert_true(c.temperature == 0.7f);
    assert_true(c.top_p == 0.9f);
    assert_int_equal(c.top_k, 40);
    assert_int_equal(c.max_tokens, 128);
    assert_int_equal(c.batch_window_ms, 0);
    assert_int_equal(c.max_batch_size, 256);
    assert_int_equal(c.batch_mode, DOL_BATCH_STATIC);
    assert_int_equal(c.max_queue, 1);
    assert_true(c.request_timeout_s == 0.0);
    assert_true(c.memory_high_watermark == 1.0);
    assert_int_equal(c.kv_cache_tokens, 100000);
    assert_int_equal(c.kv_cache_bytes, 512LL << 20);
    assert_int_equal(c.kv_cache_dtype, DOL_KV_Q8_0);
    assert_int_equal(c.kv_cache_dtype_k, DOL_KV_AUTO);
    assert_int_equal(c.kv_cache_dtype_v, DOL_KV_F16);
    assert_int_equal(c.models[0].kv_cache_dtype, DOL_KV_Q8_0);   /* the implicit entry inherits */
    assert_int_equal(c.models[0].kv_cache_dtype_v, DOL_KV_F16);
    assert_int_equal(c.kv_block_size, 32);
    assert_int_equal(c.prefill_chunk, 128);
    assert_int_equal(c.n_api_keys, 3);
    assert_string_equal(c.api_keys[0].key, "sk-high");
    assert_int_equal(c.api_keys[0].priority, 10);
    assert_string_equal(c.api_keys[1].key, "sk-low");
    assert_int_equal(c.api_keys[1].priority, 1);
    assert_string_equal(c.api_keys[2].key, "sk-zero");
    assert_int_equal(c.api_keys[2].priority, 0);
    assert_int_equal(c.default_priority, 3);
    assert_true(c.drain_timeout_s == 5.5);
    assert_true(c.vram_unready_ratio == 0.95);
    assert_true(c.vram_unready_after_s == 0.0);
    assert_int_equal(c.log_level, DOL_LOG_DEBUG);
    assert_false(c.warmup);
}

/* devices and layer_split: YAML sequences or "a,b" flags, into dol_int_list */
static void test_placement_lists(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN];
    dol_config c;
    dol_config_defaults(&c);
    assert_int_equal(c.devices.n, 0);
    assert_int_equal(c.layer_split.n, 0);
    assert_int_equal(c.gpu_layers, -1);
    assert_true(c.allow_host_spill);
    assert_int_equal(dol_config_load_yaml(&c, yaml("devices: [0, 1]\nlayer_split: [20, 20]\n"
                                                   "gpu_layers: 40\nallow_host_spill: false\n"), err, sizeof err), 0);
    assert_int_equal(c.devices.n, 2);
    assert_int_equal(c.devices.v[1], 1);
    assert_int_equal(c.layer_split.n, 2);
    assert_int_equal(c.layer_split.v[0], 20);
    assert_int_equal(c.gpu_layers, 40);
    assert_false(c.allow_host_spill);
    assert_int_equal(dol_config_load_yaml(&c, yaml("devices: []\nlayer_split:\n"), err, sizeof err), 0);
    assert_int_equal(c.devices.n, 0);
    assert_int_equal(c.layer_split.n, 0);
    assert_int_equal(parse_args(&c, err, ARGS("--devices", "1,0", "--layer-split=3,2", "--gpu-layers", "5")), 0);
    assert_int_equal(c.devices.n, 2);
    assert_int_equal(c.devices.v[0], 1);
    assert_int_equal(c.layer_split.v[1], 2);
    assert_int_equal(c.gpu_layers, 5);
}

static void test_yaml_merges(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN];
    dol_config c;
    dol_config_defaults(&c);
    c.threads = 7;
    assert_int_equal(dol_config_load_yaml(&c, yaml("port: 9002\nmodel: ~\n"), err, sizeof err), 0);
    assert_int_equal(c.port, 9002);
    assert_int_equal(c.threads, 7); /* untouched */
    assert_string_equal(c.model, "");

    /* An empty file, or one of comments only, changes nothing. */
    dol_config before = c;
    assert_int_equal(dol_config_load_yaml(&c, yaml(""), err, sizeof err), 0);
    assert_memory_equal(&c, &before, sizeof c);
    assert_int_equal(dol_config_load_yaml(&c, yaml("# nothing\n\n"), err, sizeof err), 0);
    assert_memory_equal(&c, &before, sizeof c);

    /* A file's api_keys replace the list. */
    assert_int_equal(dol_config_load_yaml(&c, yaml("api_keys: [{key: a, priority: 1}]\n"),
                                          err, sizeof err), 0);
    assert_int_equal(c.n_api_keys, 1);
    assert_int_equal(dol_config_load_yaml(&c, yaml("api_keys: []\n"), err, sizeof err), 0);
    assert_int_equal(c.n_api_keys, 0);
}

static const struct { const char *text, *want; } BAD_YAML[] = {
    { "devices: [0, x]\n", ":1: field devices: not a list of integers (e.g. 0,1): 0,x" },
    { "devices: [0, 64]\n", ":1: field devices: entry out of range: 64 (must be between 0 and 63)" },
    { "devices: [0, [1]]\n", ":1: field devices: expected a list of integers" },
    { "layer_split: [1, 0]\n", ":1: field layer_split: entry out of range: 0" },
    { "layer_split: [1,2,3,4,5,6,7,8,9]\n", ":1: field layer_split: more than 8 entries" },
    { "gpu_layers: -2\n", ":1: field gpu_layers: out of range: -2" },
    { "port: abc\n", ":1: field port: not an integer: abc" },
    { "host: x\nport: 70000\n", ":2: field port: out of range: 70000 (must be between 0 and 65535)" },
    { "port: -1\n", ":1: field port: out of range: -1" },
    { "port: 99999999999999999999\n", ":1: field port: out of range" },
    { "max_batch_size: 1.5\n", ":1: field max_batch_size: not an integer: 1.5" },
    { "max_batch_size: 0\n", ":1: field max_batch_size: out of range: 0 (must be between 1 and 256)" },
    { "max_batch_size: 257\n", ":1: field max_batch_size: out of range: 257" },
    { "# c\n\nwarmup: maybe\n", ":3: field warmup: not a boolean (true or false): maybe" },
    { "batch_mode: dynamic\n", ":1: field batch_mode: not one of continuous|static: dynamic" },
    { "backend: gpu\n", ":1: field backend: not one of auto|cpu|cuda: gpu" },
    { "weights: q4\n", ":1: field weights: not one of auto|f32|f16|nf4|int8: q4" },
    { "log_level: trace\n", ":1: field log_level: not one of debug|info|warn|error: trace" },
    { "memory_high_watermark: 0\n",
      ":1: field memory_high_watermark: out of range: 0 (must be > 0 and <= 1)" },
    { "memory_high_watermark: 1.01\n", ":1: field memory_high_watermark: out of range: 1.01" },
    { "vram_unready_ratio: 0\n", ":1: field vram_unready_ratio: out of range: 0" },
    { "vram_unready_after_s: -1\n", ":1: field vram_unready_after_s: out of range: -1 (must be >= 0)" },
    { "threads: 1025\n", ":1: field threads: out of range: 1025 (must be between 0 and 1024)" },
    { "temperature: 2.5\n", ":1: field temperature: out of range: 2.5 (must be between 0 and 2)" },
    { "temperature: -0.1\n", ":1: field temperature: out of range: -0.1" },
    { "temperature: warm\n", ":1: field temperature: not a number: warm" },
    { "temperature: .nan\n", ":1: field temperature: not a number: .nan" },
    { "top_p: 0\n", ":1: field top_p: out of range: 0 (must be > 0 and <= 1)" },
    /* > 0 as a double, 0 as the float it is stored in (fuzz_config) */
    { "top_p: 5e-94\n", ":1: field top_p: out of range: 5e-94 (must be > 0 and <= 1)" },
    { "top_k: -1\n", ":1: field top_k: out of range: -1 (must be >= 0)" },
    { "max_tokens: 0\n", ":1: field max_tokens: out of range: 0 (must be >= 1)" },
    { "batch_window_ms: 60001\n", ":1: field batch_window_ms: out of range: 60001" },
    { "kv_block_size: 0\n", ":1: field kv_block_size: out of range: 0 (must be between 1 and 1024)" },
    { "kv_block_size: 2048\n", ":1: field kv_block_size: out of range: 2048" },
    { "max_queue: 0\n", ":1: field max_queue: out of range: 0 (must be >= 1)" },
    { "request_timeout_s: -1\n", ":1: field request_timeout_s: out of range: -1" },
    { "drain_timeout_s: -5\n", ":1: field drain_timeout_s: out of range: -5" },
    { "prefill_chunk: 0\n", ":1: field prefill_chunk: out of range: 0" },
    { "context_len: -4\n", ":1: field context_len: out of range: -4" },
    { "default_priority: -1\n", ":1: field default_priority: out of range: -1" },
    { "max_body_bytes: 512\n", ":1: field max_body_bytes: out of range: 512 (must be >= 1024)" },
    { "max_json_depth: 0\n", ":1: field max_json_depth: out of range: 0 (must be between 1 and 1000)" },
    { "max_json_depth: 1001\n", ":1: field max_json_depth: out of range: 1001" },
    { "max_prompt_tokens: -1\n", ":1: field max_prompt_tokens: out of range: -1 (must be >= 0)" },
    { "max_tokens_cap: -1\n", ":1: field max_tokens_cap: out of range: -1 (must be >= 0)" },
    { "max_n: 0\n", ":1: field max_n: out of range: 0 (must be between 1 and 256)" },
    { "max_stop: 5\n", ":1: field max_stop: out of range: 5 (must be between 1 and 4)" },
    { "max_stop_len: 0\n", ":1: field max_stop_len: out of range: 0 (must be between 1 and 65536)" },
    { "max_stop_len: 65KiB\n", ":1: field max_stop_len: out of range: 65KiB" },
    { "max_logit_bias: 301\n", ":1: field max_logit_bias: out of range: 301 (must be between 1 and 300)" },
    { "max_body_bytes: 1.5GiB\n", ":1: field max_body_bytes: not a size" },
    { "kv_cache_bytes: 12XB\n", ":1: field kv_cache_bytes: not a size" },
    { "kv_cache_bytes: -1KiB\n", ":1: field kv_cache_bytes: out of range: -1KiB (must be >= 0)" },
    { "kv_cache_bytes: 99999999999TiB\n", ":1: field kv_cache_bytes: out of range: 99999999999TiB" },
    { "kv_cache_tokens: -1\n", ":1: field kv_cache_tokens: out of range: -1" },
    { "kv_cache_tokens: 1KiB\n", ":1: field kv_cache_tokens: not an integer: 1KiB" },
    { "host: \"\"\n", ":1: field host: must not be empty" },
    { "port: 1\nfrobnicate: 1\n", ":2: field frobnicate: unknown key" },
    { "max-batch-size: 4\n", ":1: field max-batch-size: unknown key (did you mean max_batch_size?)" },
    { "config: x.yaml\n", ":1: field config: unknown key" },
    { "port: [1, 2]\n", ":1: field port: expected a single value, got a sequence" },
    { "host:\n  a: b\n", ":2: field host: expected a single value, got a mapping" },
    { "port:\n", ":1: field port: missing value" },
    { "port: 1\nport: 2\n", ":2: field port: set twice (first at line 1)" },
    { "api_keys: sk-1\n", ":1: field api_keys: expected a sequence of {key, priority} mappings" },
    { "api_keys:\n  - sk-1\n", ":2: field api_keys[0]: expected a mapping" },
    { "api_keys:\n  - key: \"\"\n    priority: 1\n", ":2: field api_keys[0].key: key must not be empty" },
    { "api_keys:\n  - {key: a, priority: 1}\n  - {key: b, priority: x}\n",
      ":3: field api_keys[1].priority: not an integer: x" },
    { "api_keys:\n  - {key: a, priority: -2}\n", ":2: field api_keys[0].priority: out of range: -2" },
    { "api_keys:\n  - {key: a, prio: 1}\n", ":2: field api_keys[0].prio: unknown key (want key, priority)" },
    { "api_keys:\n  - {priority: 1}\n", ":2: field api_keys[0]: missing key" },
    { "api_keys:\n  - {key: a}\n  - {key: a}\n", ":3: field api_keys[1].key: key listed twice" },
    { "api_keys:\n  - {key: \"a b\"}\n", ":2: field api_keys[0].key: key contains whitespace" },
    /* a NUL escape inside a quoted scalar would cut the C string short */
    { "api_keys: [{key: \"k1\\0zz\"}]\n", ":1: field api_keys[0].key: contains a NUL byte" },
    { "api_keys: [{key: a, priority: \"1\\0\"}]\n",
      ":1: field api_keys[0].priority: contains a NUL byte" },
    { "api_keys: [{\"key\\0\": a}]\n", ":1: field api_keys[0].key: contains a NUL byte" },
    { "model: \"/path\\0/x\"\n", ":1: field model: the value contains a NUL byte" },
    { "port: \"80\\u0000\"\n", ":1: field port: the value contains a NUL byte" },
    { "\"port\\0x\": 80\n", ":1: field port: the key contains a NUL byte" },
    { "- a\n- b\n", ":1: expected a mapping of `key: value` lines at the top level, got a sequence" },
    { "port: 1\n---\nport: 2\n", ":3: only one YAML document is allowed" },
    /* syntax errors: libyaml's problem with the line */
    { "port: 1\n  host: x\n", ":2: mapping values are not allowed in this context" },
    { "port: 8080\nhost: [unclosed\n", ":3: did not find expected ',' or ']'" },
};

static void test_yaml_bad(void **state)
{
    (void)state;
    dol_config c, before;
    dol_config_defaults(&c);
    before = c;
    for (size_t i = 0; i < sizeof BAD_YAML / sizeof BAD_YAML[0]; i++) {
        char err[DOL_ERR_LEN] = "";
        const char *path = yaml(BAD_YAML[i].text);
        if (dol_config_load_yaml(&c, path, err, sizeof err) != -1) {
            print_error("accepted: %s", BAD_YAML[i].text);
            fail();
        }
        assert_int_equal(strncmp(err, path, strlen(path)), 0); /* "<path>:<line>: ..." */
        assert_contains(err + strlen(path), BAD_YAML[i].want);
        assert_null(strchr(err, '\n'));                          /* one line */
        assert_memory_equal(&c, &before, sizeof c);              /* all or nothing */
    }
}

static void test_yaml_long_values(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN], text[4096];
    dol_config c;
    dol_config_defaults(&c);

    char model[1101];
    memset(model, 'm', 1100);
    model[1100] = '\0';
    snprintf(text, sizeof text, "model: %s\n", model);
    assert_int_equal(dol_config_load_yaml(&c, yaml(text), err, sizeof err), -1);
    assert_contains(err, ":1: field model: too long: 1100 bytes (max 1023)");

    char key[129];
    memset(key, 'k', 128);
    key[128] = '\0';
    snprintf(text, sizeof text, "api_keys:\n  - key: %s\n", key);
    assert_int_equal(dol_config_load_yaml(&c, yaml(text), err, sizeof err), -1);
    assert_contains(err, ":2: field api_keys[0].key: key too long: 128 bytes (max 127)");
    assert_null(strstr(err, key)); /* a secret is never echoed */

    key[127] = '\0'; /* 127 is the longest allowed */
    snprintf(text, sizeof text, "api_keys:\n  - key: %s\n    priority: 2\n", key);
    assert_int_equal(dol_config_load_yaml(&c, yaml(text), err, sizeof err), 0);
    assert_int_equal(dol_config_key_priority(&c, key), 2);
}

static void test_yaml_too_many_keys(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN], text[8192];
    size_t n = (size_t)snprintf(text, sizeof text, "api_keys:\n");
    for (int i = 0; i < DOL_MAX_API_KEYS; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "  - {key: k%d, priority: %d}\n", i, i);
    dol_config c;
    dol_config_defaults(&c);
    assert_int_equal(dol_config_load_yaml(&c, yaml(text), err, sizeof err), 0);
    assert_int_equal(c.n_api_keys, DOL_MAX_API_KEYS);
    assert_int_equal(dol_config_key_priority(&c, "k63"), 63);

    snprintf(text + n, sizeof text - n, "  - {key: one-more}\n");
    assert_int_equal(dol_config_load_yaml(&c, yaml(text), err, sizeof err), -1);
    assert_contains(err, ":66: field api_keys[64].key: too many keys (max 64)");
}

static void test_yaml_cannot_open(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN];
    dol_config c;
    dol_config_defaults(&c);
    assert_int_equal(dol_config_load_yaml(&c, "/nonexistent/dolphin.yaml", err, sizeof err), -1);
    assert_string_equal(err, "/nonexistent/dolphin.yaml: cannot open: No such file or directory");
}

static void test_size_suffixes(void **state)
{
    (void)state;
    static const struct { const char *text; int64_t want; } good[] = {
        { "1000000", 1000000 }, { "64KiB", 65536 }, { "512MiB", 512LL << 20 },
        { "1GiB", 1LL << 30 }, { "2TiB", 2LL << 40 }, { "1gib", 1LL << 30 },
        { "2 MiB", 2LL << 20 }, { "4096B", 4096 }, { "1KB", 1000 }, { "3MB", 3000000 },
        { "2GB", 2000000000 }, { "0", 0 },
    };
    char err[DOL_ERR_LEN], text[128];
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        dol_config c;
        dol_config_defaults(&c);
        snprintf(text, sizeof text, "kv_cache_bytes: %s\n", good[i].text);
        if (dol_config_load_yaml(&c, yaml(text), err, sizeof err) != 0) {
            print_error("%s\n", err);
            fail();
        }
        assert_int_equal(c.kv_cache_bytes, good[i].want);
    }
    /* The same parser serves flags and size_t fields. */
    dol_config c;
    assert_int_equal(parse_args(&c, err, ARGS("--max-body-bytes", "16MiB", "--kv-cache-bytes=1GiB")), 0);
    assert_int_equal(c.max_body_bytes, 16u << 20);
    assert_int_equal(c.kv_cache_bytes, 1LL << 30);
    assert_int_equal(parse_args(&c, err, ARGS("--max-body-bytes", "1.5GiB")), -1);
    assert_contains(err, "flag --max-body-bytes: not a size");
    assert_contains(err, ": 1.5GiB");
    assert_int_equal(parse_args(&c, err, ARGS("--max-body-bytes", "GiB")), -1);
    assert_contains(err, "flag --max-body-bytes: not a size");
}

/* --------------------------------------------------------------- flags */

static void test_flags_override_file(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN];
    dol_config c;
    const char *path = yaml("port: 9000\nthreads: 3\nwarmup: true\nmodel: from-file\n"
                            "api_keys: [{key: f1, priority: 2}]\n");
    int rc = parse_args(&c, err, ARGS("--config", path, "--port", "9100", "--model=/m",
                                      "--no-warmup", "--api-key", "k1:5", "--api-key=k2",
                                      "--api-key", "a:b:7"));
    if (rc != 0) { print_error("%s\n", err); fail(); }
    assert_int_equal(c.port, 9100);
    assert_int_equal(c.threads, 3);
    assert_string_equal(c.model, "/m");
    assert_false(c.warmup);
    assert_int_equal(c.n_api_keys, 4);
    assert_int_equal(dol_config_key_priority(&c, "f1"), 2);
    assert_int_equal(dol_config_key_priority(&c, "k1"), 5);
    assert_int_equal(dol_config_key_priority(&c, "k2"), 0);
    assert_int_equal(dol_config_key_priority(&c, "a:b"), 7); /* last ':' splits */

    /* A flag before --config still wins over the file. */
    assert_int_equal(parse_args(&c, err, ARGS("--port", "9100", "--config", path)), 0);
    assert_int_equal(c.port, 9100);
    assert_int_equal(parse_args(&c, err, ARGS("--config=" "/dev/null", "--threads", "2")), 0);
    assert_int_equal(c.threads, 2);

    /* Later flags win; booleans in every spelling. */
    assert_int_equal(parse_args(&c, err, ARGS("--port", "1", "--port=2", "--warmup=false")), 0);
    assert_int_equal(c.port, 2);
    assert_false(c.warmup);
    assert_int_equal(parse_args(&c, err, ARGS("--no-warmup", "--warmup")), 0);
    assert_true(c.warmup);
    assert_int_equal(parse_args(&c, err, ARGS("--warmup=off")), 0);
    assert_false(c.warmup);
}

static void test_flags_every_field(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN];
    dol_config c;
    int rc = parse_args(&c, err, ARGS(
        "--host", "::1", "--port", "0", "--model", "m", "--served-model-name", "s",
        "--threads", "2", "--backend", "cpu", "--weights", "f16", "--context-len", "64",
        "--temperature", "0", "--top-p", "0.5", "--top-k", "3", "--max-tokens", "9",
        "--batch-window-ms", "10", "--max-batch-size", "4", "--batch-mode", "static",
        "--max-queue", "5", "--request-timeout-s", "1.5", "--memory-high-watermark", "0.5",
        "--kv-cache-tokens", "1000", "--kv-cache-bytes", "1000000", "--kv-block-size", "8",
        "--prefill-chunk", "32", "--default-priority", "4", "--drain-timeout-s", "2",
        "--vram-unready-ratio", "0.5", "--vram-unready-after-s", "3", "--log-level", "warn",
        "--max-body-bytes", "2048"));
    if (rc != 0) { print_error("%s\n", err); fail(); }
    assert_string_equal(c.host, "::1");
    assert_int_equal(c.port, 0);
    assert_string_equal(c.model, "m");
    assert_string_equal(c.served_model_name, "s");
    assert_int_equal(c.threads, 2);
    assert_int_equal(c.backend, DOL_BACKEND_CPU);
    assert_int_equal(c.weights, DOL_WEIGHTS_F16);
    assert_int_equal(c.context_len, 64);
    assert_true(c.temperature == 0.0f);
    assert_true(c.top_p == 0.5f);
    assert_int_equal(c.top_k, 3);
    assert_int_equal(c.max_tokens, 9);
    assert_int_equal(c.batch_window_ms, 10);
    assert_int_equal(c.max_batch_size, 4);
    assert_int_equal(c.batch_mode, DOL_BATCH_STATIC);
    assert_int_equal(c.max_queue, 5);
    assert_true(c.request_timeout_s == 1.5);
    assert_true(c.memory_high_watermark == 0.5);
    assert_int_equal(c.kv_cache_tokens, 1000);
    assert_int_equal(c.kv_cache_bytes, 1000000);
    assert_int_equal(c.kv_block_size, 8);
    assert_int_equal(c.prefill_chunk, 32);
    assert_int_equal(c.default_priority, 4);
    assert_true(c.drain_timeout_s == 2.0);
    assert_true(c.vram_unready_ratio == 0.5);
    assert_true(c.vram_unready_after_s == 3.0);
    assert_int_equal(c.log_level, DOL_LOG_WARN);
    assert_int_equal(c.max_body_bytes, 2048);
}

static void test_limit_settings(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN];
    dol_config c;
    int rc = parse_args(&c, err, ARGS(
        "--max-json-depth", "8", "--max-prompt-tokens", "100", "--max-tokens-cap", "50",
        "--max-n", "2", "--max-stop", "1", "--max-stop-len=1KiB", "--max-logit-bias", "3"));
    if (rc != 0) { print_error("%s\n", err); fail(); }
    assert_int_equal(c.max_json_depth, 8);
    assert_int_equal(c.max_prompt_tokens, 100);
    assert_int_equal(c.max_tokens_cap, 50);
    assert_int_equal(c.max_n, 2);
    assert_int_equal(c.max_stop, 1);
    assert_int_equal(c.max_stop_len, 1024);
    assert_int_equal(c.max_logit_bias, 3);

    dol_config_defaults(&c);
    rc = dol_config_load_yaml(&c, yaml("max_json_depth: 1000\nmax_prompt_tokens: 4096\n"
                                       "max_tokens_cap: 2048\nmax_n: 256\nmax_stop: 4\n"
                                       "max_stop_len: 64KiB\nmax_logit_bias: 300\n"),
                              err, sizeof err);
    if (rc != 0) { print_error("%s\n", err); fail(); }
    assert_int_equal(c.max_json_depth, 1000);
    assert_int_equal(c.max_prompt_tokens, 4096);
    assert_int_equal(c.max_tokens_cap, 2048);
    assert_int_equal(c.max_n, 256);
    assert_int_equal(c.max_stop_len, 65536);

    assert_int_equal(parse_args(&c, err, ARGS("--max-stop", "5")), -1);
    assert_string_equal(err, "flag --max-stop: out of range: 5 (must be between 1 and 4)");
    assert_int_equal(parse_args(&c, err, ARGS("--max-logit-bias", "0")), -1);
    assert_string_equal(err, "flag --max-logit-bias: out of range: 0 (must be between 1 and 300)");
}

static void test_flags_reset_to_defaults(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN];
    dol_config c, want;
    memset(&c, 0x5a, sizeof c);
    dol_config_defaults(&want);
    assert_int_equal(parse_args(&c, err, (const char *const[]){ NULL }, 0), 0);
    assert_memory_equal(&c, &want, sizeof c);
}

static void test_flags_bad(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN];
    dol_config c;
#define BAD(want, ...) do { \
        assert_int_equal(parse_args(&c, err, ARGS(__VA_ARGS__)), -1); \
        assert_string_equal(err, want); \
    } while (0)
    BAD("flag --port: not an integer: abc", "--port", "abc");
    BAD("flag --devices: not a list of integers (e.g. 0,1): 0;1", "--devices", "0;1");
    BAD("flag --layer-split: not a list of integers (e.g. 0,1): 2,", "--layer-split", "2,");
    BAD("flag --port: not an integer: abc", "--port=abc");
    BAD("flag --port: out of range: 70000 (must be between 0 and 65535)", "--port", "70000");
    BAD("unknown flag --foo (see --help)", "--foo");
    BAD("unknown flag --foo (see --help)", "--foo=1");
    BAD("unknown flag --no-port (see --help)", "--no-port");
    BAD("unknown flag --max_batch_size (see --help)", "--max_batch_size", "2");
    BAD("flag --model: missing value", "--model");
    BAD("flag --model: missing value", "--model", "--port", "1");
    BAD("flag --max-batch-size: not an integer: 1.5", "--max-batch-size", "1.5");
    BAD("flag --batch-mode: not one of continuous|static: dynamic", "--batch-mode", "dynamic");
    BAD("flag --warmup: not a boolean (true or false): maybe", "--warmup=maybe");
    BAD("flag --no-warmup: takes no value", "--no-warmup=1");
    BAD("flag --top-p: out of range: 0 (must be > 0 and <= 1)", "--top-p", "0");
    BAD("flag --temperature: not a number: nan", "--temperature", "nan");
    BAD("flag --temperature: not a number: ", "--temperature=");
    BAD("unexpected argument model-dir (see --help)", "model-dir");
    BAD("unexpected argument -p (see --help)", "-p", "8080");
    BAD("unexpected argument -- (see --help)", "--");
    BAD("flag --api-key: key must not be empty", "--api-key", "");
    BAD("flag --api-key: key must not be empty", "--api-key", ":3");
    BAD("flag --api-key: priority is not an integer: x", "--api-key", "k:x");
    BAD("flag --api-key: priority out of range: -1 (must be >= 0)", "--api-key", "k:-1");
    BAD("flag --api-key: key listed twice (as key 0 and 1)", "--api-key", "k:1", "--api-key", "k:2");
    BAD("flag --config: missing value", "--config");
    BAD("flag --config: missing value", "--config=");
    BAD("flag --config: given more than once", "--config", "a", "--config", "b");
    BAD("/nonexistent/x.yaml: cannot open: No such file or directory", "--config", "/nonexistent/x.yaml");
    BAD("/tmp: is a directory, not a YAML file", "--config", "/tmp");
#undef BAD
    /* A bad file through --config gives the file's own message. */
    assert_int_equal(parse_args(&c, err, ARGS("--config", yaml("port: 1\nwarmup: maybe\n"))), -1);
    assert_int_equal(strncmp(err, g_yaml, strlen(g_yaml)), 0);
    assert_contains(err, ":2: field warmup: not a boolean (true or false): maybe");
}

/* Run from_args with stdout sent to a file; return what it printed. */
static char *capture_stdout(int *rc, const char *const *args, int n)
{
    char path[PATH_MAX], err[DOL_ERR_LEN];
    snprintf(path, sizeof path, "%s/stdout.txt", g_dir);
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, STDOUT_FILENO);
    close(fd);
    dol_config c;
    *rc = parse_args(&c, err, args, n);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    char *out = slurp(path);
    unlink(path);
    return out;
}

static void test_help_and_version(void **state)
{
    (void)state;
    int rc;
    char *out = capture_stdout(&rc, ARGS("--help"));
    assert_int_equal(rc, 1);
    assert_contains(out, "Usage: dolphind");
    assert_contains(out, "--max-batch-size N");
    free(out);

    out = capture_stdout(&rc, ARGS("--port", "abc", "-h")); /* help wins */
    assert_int_equal(rc, 1);
    assert_contains(out, "--config FILE");
    free(out);

    out = capture_stdout(&rc, ARGS("--version"));
    assert_int_equal(rc, 1);
    assert_string_equal(out, "dolphind " DOL_VERSION "\n");
    free(out);
}

static void test_help_lists_every_flag(void **state)
{
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    dol_config_print_help(f, "/usr/bin/dolphind");
    fclose(f);
    for (size_t i = 0; i < N_KEYS; i++) {
        char flag[64];
        if (strcmp(KEYS[i], "api_keys") == 0) {
            snprintf(flag, sizeof flag, "  --api-key ");
        } else if (strcmp(KEYS[i], "warmup") == 0) {
            snprintf(flag, sizeof flag, "  --warmup, --no-warmup ");
        } else if (strcmp(KEYS[i], "allow_host_spill") == 0) {
            snprintf(flag, sizeof flag, "  --allow-host-spill, --no-allow-host-spill\n");
        } else if (strcmp(KEYS[i], "quantize_lm_head") == 0) {
            snprintf(flag, sizeof flag, "  --quantize-lm-head, --no-quantize-lm-head\n");
        } else if (strcmp(KEYS[i], "prefix_caching") == 0) {
            snprintf(flag, sizeof flag, "  --prefix-caching, --no-prefix-caching");
        } else {
            snprintf(flag, sizeof flag, "  --%s ", KEYS[i]);
            for (char *p = flag; *p; p++) if (*p == '_') *p = '-';
        }
        assert_contains(text, flag);
    }
    assert_contains(text, "Usage: dolphind ");
    assert_contains(text, "default 8080");
    assert_contains(text, "0..65535");
    assert_contains(text, "--backend auto|cpu|cuda");
    free(text);
}

/* ---------------------------------------------------------------- keys */

static void test_key_priority(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN];
    dol_config c;
    dol_config_defaults(&c);
    c.default_priority = 5;
    assert_int_equal(dol_config_key_priority(&c, NULL), 5); /* open: everyone */
    assert_int_equal(dol_config_key_priority(&c, "anything"), 5);

    assert_int_equal(parse_args(&c, err, ARGS("--api-key", "sk-gold:10", "--api-key", "sk-free",
                                              "--default-priority", "5")), 0);
    assert_int_equal(dol_config_key_priority(&c, "sk-gold"), 10);
    assert_int_equal(dol_config_key_priority(&c, "sk-free"), 0);
    assert_int_equal(dol_config_key_priority(&c, NULL), -1);
    assert_int_equal(dol_config_key_priority(&c, ""), -1);
    assert_int_equal(dol_config_key_priority(&c, "sk-gol"), -1);
    assert_int_equal(dol_config_key_priority(&c, "sk-gold2"), -1);
    assert_int_equal(dol_config_key_priority(&c, "SK-GOLD"), -1);
}

/* ----------------------------------------------------------------- log */

static void test_log_quote(void **state)
{
    (void)state;
    char b[64];
    assert_string_equal(dol_log_quote("abc", b, sizeof b), "abc");
    assert_string_equal(dol_log_quote("a/b-c.d", b, sizeof b), "a/b-c.d");
    assert_string_equal(dol_log_quote("a b", b, sizeof b), "\"a b\"");
    assert_string_equal(dol_log_quote("", b, sizeof b), "\"\"");
    assert_string_equal(dol_log_quote(NULL, b, sizeof b), "\"\"");
    assert_string_equal(dol_log_quote("x=y", b, sizeof b), "\"x=y\"");
    assert_string_equal(dol_log_quote("say \"hi\"\n", b, sizeof b), "\"say \\\"hi\\\"\\n\"");
    assert_string_equal(dol_log_quote("c:\\d", b, sizeof b), "\"c:\\\\d\"");
    assert_string_equal(dol_log_quote("\x01\t", b, sizeof b), "\"\\x01\\t\"");
    assert_string_equal(dol_log_quote("caf\xc3\xa9", b, sizeof b), "caf\xc3\xa9");
    /* Truncated output stays quoted and terminated. */
    char s[8];
    assert_string_equal(dol_log_quote("a b c d e f", s, sizeof s), "\"a b c\"");
    assert_string_equal(dol_log_quote("\"\"\"\"", s, sizeof s), "\"\\\"\\\"\"");

    assert_int_equal(dol_log_parse_level("debug"), DOL_LOG_DEBUG);
    assert_int_equal(dol_log_parse_level("info"), DOL_LOG_INFO);
    assert_int_equal(dol_log_parse_level("warn"), DOL_LOG_WARN);
    assert_int_equal(dol_log_parse_level("error"), DOL_LOG_ERROR);
    assert_int_equal(dol_log_parse_level("trace"), -1);
    assert_int_equal(dol_log_parse_level(NULL), -1);
}

static void test_log_lines(void **state)
{
    (void)state;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/stderr.txt", g_dir);
    int saved = dup(STDERR_FILENO);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, STDERR_FILENO);
    close(fd);

    char q[64], big[5001];
    memset(big, 'x', 5000);
    big[5000] = '\0';
    dol_log_set_level(DOL_LOG_INFO);
    dol_log(DOL_LOG_INFO, "start", "port=%d model=%s", 8080, dol_log_quote("a b", q, sizeof q));
    dol_log(DOL_LOG_DEBUG, "hidden", "x=1");
    dol_log(DOL_LOG_ERROR, "boom", NULL);
    dol_log(DOL_LOG_WARN, "big", "v=%s", big);
    /* a newline in an unquoted value stays on its line, escaped; DOL_LOG_Q
     * quotes like dol_log_quote */
    dol_log(DOL_LOG_INFO, "raw", "name=%s path=%s", "we\nird\x01", DOL_LOG_Q("a \"b\""));
    dol_log_set_level(DOL_LOG_ERROR);
    dol_log(DOL_LOG_WARN, "hidden", "x=2");
    dol_log_set_level(DOL_LOG_INFO);

    dup2(saved, STDERR_FILENO);
    close(saved);
    char *out = slurp(path);
    unlink(path);
    assert_non_null(out);

    regex_t re;
    assert_int_equal(regcomp(&re,
        "^ts=[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
        "level=info event=start port=8080 model=\"a b\"\n"
        "ts=[^ ]+Z level=error event=boom\n"
        "ts=[^ ]+Z level=warn event=big v=x+\n"
        "ts=[^ ]+Z level=info event=raw name=we\\\\nird\\\\x01 path=\"a \\\\\"b\\\\\"\"\n$",
        REG_EXTENDED), 0);
    int m = regexec(&re, out, 0, NULL, 0);
    regfree(&re);
    if (m != 0) { print_error("log output:\n%.300s\n", out); fail(); }
    assert_non_null(strstr(out, big));
    assert_null(strstr(out, "hidden"));
    free(out);
}

/* ------------------------------------------------------------- models */

static void test_models_list(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN];
    dol_config c;
    dol_config_defaults(&c);
    assert_int_equal(c.max_loaded_models, 3);
    assert_int_equal(c.memory_budget_bytes, 0);
    int rc = dol_config_load_yaml(&c, yaml(
        "models:\n"
        "  - name: chat\n"
        "    path: /m/llama-chat/\n"
        "    pinned: true\n"
        "    aliases: [gpt-4, default]\n"
        "  - path: /m/code\n"
        "    weights: nf4\n"
        "    aliases: coder\n"
        "  - name: small\n"
        "    path: /m/small\n"
        "    backend: cpu\n"
        "    context_len: 256\n"
        "max_loaded_models: 2\n"
        "memory_budget_bytes: 2GiB\n"
        "load_timeout_s: 60\n"
        "weights: f16\n"), err, sizeof err);
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(c.n_models, 3);
    assert_int_equal(c.max_loaded_models, 2);
    assert_int_equal(c.memory_budget_bytes, 2LL << 30);
    assert_true(c.load_timeout_s == 60);
    assert_string_equal(c.models[0].name, "chat");
    assert_true(c.models[0].pinned);
    assert_int_equal(c.models[0].n_aliases, 2);
    assert_string_equal(c.models[0].aliases[1], "default");
    /* a top-level key after the list still reaches the entries that leave it out */
    assert_int_equal(c.models[0].weights, DOL_WEIGHTS_F16);
    assert_string_equal(c.models[1].name, "code");   /* the path's last part */
    assert_int_equal(c.models[1].weights, DOL_WEIGHTS_NF4);
    assert_int_equal(c.models[1].n_aliases, 1);
    assert_string_equal(c.models[1].aliases[0], "coder");
    assert_false(c.models[1].pinned);
    assert_int_equal(c.models[2].backend, DOL_BACKEND_CPU);
    assert_int_equal(c.models[2].context_len, 256);
    assert_int_equal(c.models[0].backend, DOL_BACKEND_AUTO);

    /* a flag changes what the entries inherit, not what they set */
    const char *args[] = {"--config", g_yaml, "--weights", "f32"};
    assert_int_equal(parse_args(&c, err, args, 4), 0);
    assert_int_equal(c.models[0].weights, DOL_WEIGHTS_F32);
    assert_int_equal(c.models[1].weights, DOL_WEIGHTS_NF4);

    /* --model alone: a one-entry list named after the directory */
    assert_int_equal(parse_args(&c, err, ARGS("--model", "/x/y/tiny-llama2/", "--weights", "nf4")), 0);
    assert_int_equal(c.n_models, 1);
    assert_string_equal(c.models[0].name, "tiny-llama2");
    assert_string_equal(c.models[0].path, "/x/y/tiny-llama2/");
    assert_int_equal(c.models[0].weights, DOL_WEIGHTS_NF4);
    assert_int_equal(parse_args(&c, err, ARGS("--model", "/x/a", "--served-model-name", "n")), 0);
    assert_string_equal(c.models[0].name, "n");
}

/* A bad entry: one line naming the file, the entry and the field. */
static void test_models_bad(void **state)
{
    (void)state;
    static const struct { const char *text, *want; } cases[] = {
        {"models:\n  - name: a\n    path: /p\n  - name: a\n    path: /q\n",
         ":4: field models[1] 'a'.name: 'a' is already taken by models[0] 'a'"},
        {"models:\n  - name: a\n    path: /p\n    aliases: [x]\n  - name: b\n    path: /q\n"
         "    aliases: [y, x]\n",
         "field models[1] 'b'.aliases: 'x' is already taken by models[0] 'a'"},
        {"models:\n  - name: a\n    path: /p\n  - name: b\n    path: /q\n    aliases: a\n",
         "field models[1] 'b'.aliases: 'a' is already taken by models[0] 'a'"},
        {"models:\n  - name: a\n    aliases: [b, b]\n    path: /p\n",
         "field models[0] 'a'.aliases: 'b' is already taken by models[0] 'a'"},
        {"models:\n  - name: a\n    weights: nf4\n", ":2: field models[0] 'a'.path: missing"},
        {"models:\n  - name: a\n    path: /p\n    colour: red\n",
         ":4: field models[0] 'a'.colour: unknown key (want name, path"},
        {"models:\n  - name: a\n    path: /p\n    weights: int3\n",
         ":4: field models[0] 'a'.weights: not one of auto|f32|f16|nf4|int8: int3"},
        {"models:\n  - name: a\n    path: /p\n    pinned: maybe\n",
         "field models[0] 'a'.pinned: not a boolean"},
        {"models:\n  - name: a\n    path: /p\n    path: /q\n", "field models[0] 'a'.path: set twice"},
        {"models: /p\n", "field models: expected a list of entries"},
        {"models:\n  - /p\n", "field models[0]: expected a mapping"},
        {"model: /p\nmodels:\n  - path: /q\n", ".yaml: field model (--model): not together with a models list"},
        {"served_model_name: x\nmodels:\n  - path: /q\n", "field served_model_name: not together"},
        {"max_loaded_models: 1\nmodels:\n  - {path: /a, pinned: true}\n  - {path: /b, pinned: true}\n",
         "field max_loaded_models: 1, fewer than the 2 pinned models"},
        {"max_loaded_models: 0\n", "field max_loaded_models: out of range"},
        {"models:\n  - name: chat\n    path: /p\n  - path: ////\n",
         ":4: field models[1].name: missing, and path '////' has no last component"},
        {"model: /\n", "field model (--model): '/' has no last component"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[DOL_ERR_LEN] = "";
        dol_config c;
        dol_config_defaults(&c);
        if (dol_config_load_yaml(&c, yaml(cases[i].text), err, sizeof err) == 0) {
            print_error("case %zu accepted: %s\n", i, cases[i].text);
            fail();
        }
        assert_contains(err, g_yaml[0] && cases[i].want[0] == ':' ? cases[i].want : cases[i].want);
    }
    /* --model beside a file's list */
    char err[DOL_ERR_LEN];
    dol_config c;
    yaml("models:\n  - path: /q\n");
    assert_int_equal(parse_args(&c, err, ARGS("--config", g_yaml, "--model", "/p")), -1);
    assert_contains(err, "not together with a models list");
    assert_int_equal(parse_args(&c, err, ARGS("--models", "x")), -1);
    assert_contains(err, "flag --models: a list: set it in the config file");
}

/* Speculative settings per entry: the top level's reach every entry that
 * leaves them out, a top-level draft model is not its own draft, an entry
 * sets its own (flat keys or the mapping); draft_model is resolved to an
 * entry index (name or alias); bad ones are one line naming the entry. */
static void test_models_speculative(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN];
    dol_config c;
    dol_config_defaults(&c);
    int rc = dol_config_load_yaml(&c, yaml(
        "speculative: {mode: draft, draft_model: tiny, max_draft: 6}\n"
        "models:\n"
        "  - {name: big, path: /m/big}\n"
        "  - {name: small, path: /m/small, aliases: [tiny]}\n"
        "  - name: other\n"
        "    path: /m/other\n"
        "    speculative: {mode: ngram, ngram: 2}\n"
        "  - {name: flat, path: /m/flat, speculative_mode: draft, speculative_draft_model: big}\n"), err, sizeof err);
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(c.models[0].speculative_mode, DOL_SPEC_DRAFT);
    assert_int_equal(c.models[0].draft_index, 1);
    assert_int_equal(c.models[0].speculative_max_draft, 6);
    assert_int_equal(c.models[1].speculative_mode, DOL_SPEC_OFF);   /* not its own draft */
    assert_int_equal(c.models[1].draft_index, -1);
    assert_int_equal(c.models[2].speculative_mode, DOL_SPEC_NGRAM);
    assert_int_equal(c.models[2].speculative_ngram, 2);
    assert_int_equal(c.models[2].speculative_max_draft, 6);          /* inherited */
    assert_int_equal(c.models[3].draft_index, 0);
    /* a flag reaches the entries that leave the key out */
    assert_int_equal(parse_args(&c, err, ARGS("--config", g_yaml, "--speculative-max-draft", "3")), 0);
    assert_int_equal(c.models[0].speculative_max_draft, 3);

    static const struct { const char *text, *want; } bad[] = {
        {"speculative: {mode: draft}\nmodel: /m/a\n", "field speculative.draft_model: missing"},
        {"speculative: {mode: draft, draft_model: b}\nmodel: /m/a\n",
         "field speculative.draft_model: 'b' is no entry of models: (a)"},
        {"models:\n  - {name: a, path: /p, speculative: {mode: draft, draft_model: a}}\n",
         "field models[0] 'a'.speculative.draft_model: 'a' is this model itself"},
        {"models:\n  - {name: a, path: /p, speculative: {mode: draft, draft_model: zz}}\n",
         "field models[0] 'a'.speculative.draft_model: 'zz' is no entry of models: (a)"},
        {"models:\n  - {name: a, path: /p, speculative: {mode: draft}}\n",
         "field models[0] 'a'.speculative.draft_model: missing"},
        {"models:\n  - {name: a, path: /p, speculative: {modes: ngram}}\n",
         ":2: field models[0] 'a'.speculative.modes: unknown key"},
        {"models:\n  - {name: a, path: /p, speculative: {max_draft: 99}}\n",
         ":2: field models[0] 'a'.speculative.max_draft: "},
        {"models:\n  - {name: a, path: /p, speculative_mode: ngram, speculative: {mode: off}}\n",
         ":2: field models[0] 'a'.speculative.mode: set twice"},
        {"models:\n  - {name: a, path: /p, speculative: draft}\n",
         ":2: field models[0] 'a'.speculative: expected a mapping"},
        {"speculative: [ngram]\nmodel: /m/a\n", ":1: field speculative: expected a mapping"},
        {"speculative: {mode: ngram, draft_model: b}\nmodel: /m/a\n",
         "field speculative.draft_model: 'b' is no entry of models:"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dol_config_defaults(&c);
        err[0] = '\0';
        if (dol_config_load_yaml(&c, yaml(bad[i].text), err, sizeof err) == 0) {
            print_error("case %zu accepted: %s\n", i, bad[i].text);
            fail();
        }
        assert_contains(err, bad[i].want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_default_file),
        cmocka_unit_test(test_models_speculative),
        cmocka_unit_test(test_docs_cover_every_key),
        cmocka_unit_test(test_yaml_good),
        cmocka_unit_test(test_placement_lists),
        cmocka_unit_test(test_yaml_merges),
        cmocka_unit_test(test_yaml_bad),
        cmocka_unit_test(test_yaml_long_values),
        cmocka_unit_test(test_yaml_too_many_keys),
        cmocka_unit_test(test_yaml_cannot_open),
        cmocka_unit_test(test_size_suffixes),
        cmocka_unit_test(test_flags_override_file),
        cmocka_unit_test(test_flags_every_field),
        cmocka_unit_test(test_limit_settings),
        cmocka_unit_test(test_flags_reset_to_defaults),
        cmocka_unit_test(test_flags_bad),
        cmocka_unit_test(test_help_and_version),
        cmocka_unit_test(test_help_lists_every_flag),
        cmocka_unit_test(test_models_list),
        cmocka_unit_test(test_models_bad),
        cmocka_unit_test(test_key_priority),
        cmocka_unit_test(test_log_quote),
        cmocka_unit_test(test_log_lines),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
