/* tests/fuzz/fuzz_config.c — libFuzzer target for the configuration parser
 * (src/config/config.c). Two modes, chosen by the first byte:
 *  - anything but 0x00: the whole input is a YAML file, merged into the
 *    defaults with dol_config_load_yaml (read from an in-memory file);
 *  - 0x00: the rest is a command line, one argument per '\n'-separated
 *    line, parsed by dol_config_from_args (--config is dropped so that no
 *    real file is read).
 * Either way a refusal is one line naming the place at fault and leaves the
 * settings untouched (YAML), and an accepted configuration is in range. */
#include <string.h>

#include "dolphin/config.h"
#include "dolphin/scheduler.h"
#include "fuzz_util.h"

#define MAX_ARGS 64

static fuzz_memfile g_file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    fuzz_memfile_init(&g_file, "fuzz.yaml");
    /* --help and --version print to stdout: keep the fuzzer's log readable. */
    if (!freopen("/dev/null", "w", stdout)) return 0;
    return 0;
}

static bool terminated(const char *s, size_t cap) { return memchr(s, '\0', cap) != NULL; }

/* Ranges from docs/configuration.md for an accepted configuration. */
static void check_config(const dol_config *c)
{
    FUZZ_CHECK(terminated(c->host, sizeof c->host) && c->host[0]);
    FUZZ_CHECK(terminated(c->model, sizeof c->model));
    FUZZ_CHECK(terminated(c->served_model_name, sizeof c->served_model_name));
    FUZZ_CHECK(c->backend >= DOL_BACKEND_AUTO && c->backend <= DOL_BACKEND_CUDA);
    FUZZ_CHECK(c->weights >= DOL_WEIGHTS_AUTO && c->weights <= DOL_WEIGHTS_NF4);
    FUZZ_CHECK(c->batch_mode == DOL_BATCH_CONTINUOUS || c->batch_mode == DOL_BATCH_STATIC);
    FUZZ_CHECK(c->log_level >= DOL_LOG_DEBUG && c->log_level <= DOL_LOG_ERROR);
    FUZZ_CHECK(c->gpu_memory_utilization > 0 && c->gpu_memory_utilization <= 1);
    FUZZ_CHECK(c->port >= 0 && c->port <= 65535);
    FUZZ_CHECK(c->max_body_bytes >= 1024);
    FUZZ_CHECK(c->max_json_depth >= 1 && c->max_json_depth <= 1000);
    FUZZ_CHECK(c->max_prompt_tokens >= 0 && c->max_tokens_cap >= 0);
    FUZZ_CHECK(c->max_n >= 1 && c->max_n <= 256);
    FUZZ_CHECK(c->max_stop >= 1 && c->max_stop <= DOL_MAX_STOP);
    FUZZ_CHECK(c->max_stop_len >= 1 && c->max_stop_len <= 65536);
    FUZZ_CHECK(c->max_logit_bias >= 1 && c->max_logit_bias <= DOL_MAX_LOGIT_BIAS);
    FUZZ_CHECK(c->threads >= 0 && c->threads <= 1024);
    FUZZ_CHECK(c->context_len >= 0);
    FUZZ_CHECK(c->temperature >= 0 && c->temperature <= 2);
    FUZZ_CHECK(c->top_p > 0 && c->top_p <= 1);
    FUZZ_CHECK(c->top_k >= 0 && c->max_tokens >= 1);
    FUZZ_CHECK(c->batch_window_ms >= 0 && c->batch_window_ms <= 60000);
    FUZZ_CHECK(c->max_batch_size >= 1 && c->max_batch_size <= 256);
    FUZZ_CHECK(c->max_queue >= 1);
    FUZZ_CHECK(c->request_timeout_s >= 0);
    FUZZ_CHECK(c->memory_high_watermark > 0 && c->memory_high_watermark <= 1);
    FUZZ_CHECK(c->kv_cache_tokens >= 0 && c->kv_cache_bytes >= 0);
    FUZZ_CHECK(c->kv_block_size >= 1 && c->kv_block_size <= 1024);
    FUZZ_CHECK(c->prefill_chunk >= 1);
    FUZZ_CHECK(c->n_api_keys >= 0 && c->n_api_keys <= DOL_MAX_API_KEYS);
    for (int i = 0; i < c->n_api_keys; i++) {
        FUZZ_CHECK(terminated(c->api_keys[i].key, sizeof c->api_keys[i].key));
        FUZZ_CHECK(c->api_keys[i].priority >= 0);
        FUZZ_CHECK(dol_config_key_priority(c, c->api_keys[i].key) >= 0);
    }
    FUZZ_CHECK(c->default_priority >= 0);
    FUZZ_CHECK(c->drain_timeout_s >= 0);
    FUZZ_CHECK(c->vram_unready_ratio > 0 && c->vram_unready_ratio <= 1);
    FUZZ_CHECK(c->vram_unready_after_s >= 0);
    FUZZ_CHECK(c->max_loaded_models >= 1 && c->max_loaded_models <= DOL_MAX_MODELS);
    FUZZ_CHECK(c->memory_budget_bytes >= 0 && c->load_timeout_s > 0 && c->load_retry_s >= 0);
    FUZZ_CHECK(c->n_models >= 0 && c->n_models <= DOL_MAX_MODELS);
    int pinned = 0;
    for (int i = 0; i < c->n_models; i++) {
        const dol_model_entry *e = &c->models[i];
        FUZZ_CHECK(terminated(e->name, sizeof e->name) && e->name[0]);
        FUZZ_CHECK(terminated(e->path, sizeof e->path) && e->path[0]);
        FUZZ_CHECK(e->n_aliases >= 0 && e->n_aliases <= DOL_MAX_ALIASES);
        FUZZ_CHECK(e->weights >= DOL_WEIGHTS_AUTO && e->weights <= DOL_WEIGHTS_NF4);
        FUZZ_CHECK(e->gpu_memory_utilization > 0 && e->gpu_memory_utilization <= 1);
        pinned += e->pinned;
        for (int j = 0; j < i; j++)   /* names unique (aliases too) */
            FUZZ_CHECK(strcmp(c->models[j].name, e->name) != 0);
    }
    FUZZ_CHECK(pinned <= c->max_loaded_models);
}

static void fuzz_yaml(const uint8_t *data, size_t size)
{
    fuzz_memfile_set(&g_file, data, size);
    dol_config *c = malloc(sizeof *c), *before = malloc(sizeof *before);
    FUZZ_CHECK(c && before);
    dol_config_defaults(c);
    memcpy(before, c, sizeof *c);
    char err[DOL_ERR_LEN] = "";
    if (dol_config_load_yaml(c, g_file.path, err, sizeof err) == 0) {
        check_config(c);
    } else {
        size_t n = strlen(g_file.path);
        FUZZ_CHECK(strncmp(err, g_file.path, n) == 0 && err[n] == ':');
        FUZZ_CHECK(memcmp(c, before, sizeof *c) == 0); /* all or nothing */
    }
    free(c);
    free(before);
}

static void fuzz_args(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    FUZZ_CHECK(text != NULL);
    memcpy(text, data, size);
    text[size] = '\0';
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = "dolphind";
    for (char *line = text, *next; line && argc < MAX_ARGS + 1; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        /* No real files: drop --config and the argument after it. */
        if (strncmp(line, "--config", 8) == 0) {
            if (!line[8] && next) {
                char *nl = strchr(next, '\n');
                next = nl ? nl + 1 : NULL;
            }
            continue;
        }
        argv[argc++] = line;
    }
    argv[argc] = NULL;

    dol_config *c = malloc(sizeof *c);
    FUZZ_CHECK(c != NULL);
    char err[DOL_ERR_LEN] = "";
    int rc = dol_config_from_args(c, argc, argv, err, sizeof err);
    FUZZ_CHECK(rc >= -1 && rc <= 1);
    if (rc == 0) check_config(c);
    if (rc == -1) FUZZ_CHECK(err[0] != '\0');
    free(c);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 0 && data[0] == 0x00) fuzz_args(data + 1, size - 1);
    else fuzz_yaml(data, size);
    return 0;
}
