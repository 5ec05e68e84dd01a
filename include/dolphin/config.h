/* include/dolphin/config.h — dolphind's settings: defaults, the YAML file
 * (configs/dolphin.yaml, read with libyaml) and command-line flags, in that
 * order of precedence (flags win). Every YAML key `some_key` has the flag
 * `--some-key`. docs/configuration.md documents each field.
 */
#ifndef DOLPHIN_CONFIG_H
#define DOLPHIN_CONFIG_H

#include "dolphin/common.h"
#include "dolphin/engine.h"
#include "dolphin/log.h"
#include "dolphin/scheduler.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DOL_MAX_API_KEYS 64

/* Version printed by --version (the CMake project version). */
#ifndef DOL_VERSION
#define DOL_VERSION "0.1.0"
#endif

/* A short list of integers (devices, layer_split): YAML [0, 1] or "0,1". */
typedef struct {
    int n;
    int v[DOL_MAX_DEVICES];
} dol_int_list;

typedef struct {
    char key[128];
    int priority;
} dol_api_key;

/* One entry of the models list (docs/configuration.md, "Several models"):
 * what to load and how. The placement and format keys left out of an
 * entry take the top-level setting of the same name (set_mask says which
 * the entry sets itself); a new per-model key is one more member here and
 * one more row in config.c's MODEL_FIELDS. */
#define DOL_MAX_MODELS 16
#define DOL_MAX_ALIASES 8
#define DOL_MODEL_NAME_LEN 256
typedef struct {
    char name[DOL_MODEL_NAME_LEN];   /* id in the API; default: the path's last part */
    char path[1024];                 /* model directory (required) */
    char aliases[DOL_MAX_ALIASES][DOL_MODEL_NAME_LEN]; /* other ids that pick it */
    int n_aliases;
    bool pinned;                     /* loaded at start-up, never unloaded */
    /* format and placement (inherited from the top level when not set) */
    dol_weight_format weights;
    bool quantize_lm_head;
    dol_activations activations;
    dol_kv_dtype kv_cache_dtype;     /* the KV cache's halves, as the top-level keys */
    dol_kv_dtype kv_cache_dtype_k;
    dol_kv_dtype kv_cache_dtype_v;
    dol_backend_kind backend;
    double gpu_memory_utilization;
    int context_len;
    dol_int_list devices;            /* layer placement, as the top-level keys */
    dol_int_list layer_split;
    int gpu_layers;
    bool allow_host_spill;
    char weights_cache_dir[1024];    /* CPU prepared-weights cache folder; "" = off */
    /* speculative decoding (as the top-level keys; docs/speculative.md) */
    dol_spec_mode speculative_mode;
    char speculative_draft_model[DOL_MODEL_NAME_LEN]; /* mode draft: an entry's name or alias */
    int draft_index;                 /* mode draft: that entry's index (resolved); else -1 */
    int speculative_max_draft;
    int speculative_ngram;
    double speculative_min_acceptance;
    unsigned set_mask;               /* bit i: MODEL_FIELDS[i] set by the entry */
    bool implicit;                   /* made from the single model: / --model */
} dol_model_entry;

typedef struct {
    /* server */
    char host[128];              /* default "127.0.0.1" */
    int port;                    /* default 8080; 0 = any free port */
    size_t max_body_bytes;       /* default 1 MiB; larger bodies get 413 */
    int max_connections;         /* default 512; more wait to be accepted */
    int max_connections_per_ip;  /* default 0 = no per-address limit */
    int connection_timeout_s;    /* default 75; idle connections closed; 0 = never */
    /* request limits (docs/robustness.md); each refusal is a 400 naming
     * the field and the limit */
    int max_json_depth;          /* default 64 nested objects/arrays (<= 1000) */
    int max_prompt_tokens;       /* default 0 = the context length */
    int max_tokens_cap;          /* default 0 = none beyond the context */
    int max_n;                   /* default 16 choices per prompt */
    int max_stop;                /* default 4 stop strings (<= DOL_MAX_STOP) */
    int max_stop_len;            /* default 512 bytes per stop string */
    int max_logit_bias;          /* default 300 entries (<= DOL_MAX_LOGIT_BIAS) */
    int max_grammar_states;      /* default 20000 automaton states per response_format schema */
    char model[1024];            /* model directory; default "" (the single-model form) */
    char served_model_name[256]; /* model id in the API; "" = dir basename */
    /* several models: the list (a single model: or --model becomes a
     * one-entry list with implicit set), at most max_loaded_models loaded
     * at once, and optionally at most memory_budget_bytes of weights + KV
     * cache (host and device) */
    dol_model_entry models[DOL_MAX_MODELS];
    int n_models;
    int max_loaded_models;       /* default 3 */
    int64_t memory_budget_bytes; /* default 0 = no budget */
    double load_timeout_s;       /* default 300: a load (waiting for room included) */
    double load_retry_s;         /* default 10: back-off after a failed load (doubles) */
    int threads;                 /* compute threads; 0 = all online cores */
    dol_backend_kind backend;    /* auto | cpu | cuda (default auto) */
    double gpu_memory_utilization; /* CUDA: share of device memory for weights,
                                    KV cache and workspaces (default 0.90) */
    /* layer placement (docs/configuration.md, "Layer placement") */
    dol_int_list devices;        /* CUDA device ids; default empty = device 0 */
    dol_int_list layer_split;    /* blocks per device; default empty = automatic */
    int gpu_layers;              /* first N blocks on the GPU(s); default -1 = automatic */
    bool allow_host_spill;       /* default true: blocks that do not fit go to the CPU */
    dol_weight_format weights;   /* auto | f32 | f16 | nf4 | int8 (default auto) */
    bool quantize_lm_head;       /* weights nf4 / int8: quantize lm_head too (default false) */
    dol_activations activations; /* auto | f32 | int8 (default auto): the CPU's
                                    products over quantized weights */
    int context_len;             /* 0 = max_position_embeddings */
    char weights_cache_dir[1024];/* CPU: folder of the prepared-weights cache; default "" = off */
    /* default sampling values, used when a request leaves them out */
    float temperature;           /* default 1.0 (OpenAI's) */
    float top_p;                 /* default 1.0 */
    int top_k;                   /* default 0 (off) */
    int max_tokens;              /* default 16 */
    /* scheduler */
    int batch_window_ms;         /* default 50 */
    int max_batch_size;          /* default 8 */
    dol_batch_mode batch_mode;   /* continuous | static (default continuous) */
    int max_queue;               /* default 256 */
    double request_timeout_s;    /* default 600; 0 = none */
    double memory_high_watermark;/* default 0.80 */
    int64_t kv_cache_tokens;     /* default 0 = derive */
    bool prefix_caching;         /* default true */
    bool batch_invariant;        /* default true; false: CPU prefill products
                                    may run on AMX, AMX-INT8 or BF16x3
                                    (faster, not bit-identical across
                                    batches) */
    int64_t kv_cache_bytes;      /* default 0 = derive */
    dol_kv_dtype kv_cache_dtype; /* auto | f32 | f16 | q8_0 (default auto) */
    dol_kv_dtype kv_cache_dtype_k; /* the K half; auto = kv_cache_dtype */
    dol_kv_dtype kv_cache_dtype_v; /* the V half; auto = kv_cache_dtype */
    double kv_cache_memory_fraction; /* CPU default pool: share of available
                                    memory after the weights (default 0.90) */
    int kv_block_size;           /* default 16 */
    int prefill_chunk;           /* default 512 tokens per sequence per step */
    /* speculative decoding (docs/speculative.md); in YAML also as a mapping
     * `speculative: {mode, draft_model, max_draft, ngram, min_acceptance}`;
     * every models: entry takes these unless it sets its own */
    dol_spec_mode speculative_mode;      /* off | ngram | draft (default off) */
    char speculative_draft_model[DOL_MODEL_NAME_LEN]; /* draft: a models: entry (default "") */
    int speculative_max_draft;           /* default 4 */
    int speculative_ngram;               /* default 3 */
    double speculative_min_acceptance;   /* default 0.3 */
    /* keys and priorities */
    dol_api_key api_keys[DOL_MAX_API_KEYS];
    int n_api_keys;              /* 0 = no authentication */
    int default_priority;        /* default 0 */
    /* operations */
    double drain_timeout_s;      /* default 30 */
    double vram_unready_ratio;   /* default 0.90 */
    double vram_unready_after_s; /* default 15 */
    dol_log_level log_level;     /* debug | info | warn | error (default info) */
    bool warmup;                 /* default true */
} dol_config;

/* Fill with the defaults above. */
void dol_config_defaults(dol_config *c);

/* Merge a YAML file into c.  A `models:` list replaces the list in c; its
 * errors name the entry and the field: "<path>:<line>: field
 * models[1].aliases: ...".  Unknown keys, wrong types and out-of-range values
 * are errors: -1 and one line "<path>:<line>: field <key>: <problem>".
 * All or nothing: on error c is left unchanged. An api_keys list in the file
 * replaces the keys already in c. An empty file changes nothing. */
int dol_config_load_yaml(dol_config *c, const char *path,
                         char *err, size_t errlen);

/* Parse argv: c is reset to the defaults, `--config FILE` is applied first
 * (defaults, then the file), then every other flag overrides it (in order;
 * --api-key appends to the file's keys). Flags are `--name VALUE` or
 * `--name=VALUE`; booleans also accept `--name` / `--no-name`.
 * Returns 0 ok, 1 when --help or --version was printed to stdout (caller
 * exits 0), -1 with one line in err (caller exits 2). */
int dol_config_from_args(dol_config *c, int argc, char **argv,
                         char *err, size_t errlen);

/* Print the flag list (--help) to f (a FILE*). */
void dol_config_print_help(void *f, const char *argv0);

/* The canonical spelling of value `v` of the choice setting `key`
 * ("backend", "weights", "batch_mode", "log_level"), as the YAML file and
 * the flags write it; "?" for an unknown key or value. A static string. */
const char *dol_config_choice_name(const char *key, int v);

/* Priority for an Authorization bearer key: the configured key's priority,
 * or -1 when keys are configured and `key` is NULL/unknown (401). With no
 * keys configured returns default_priority. */
int dol_config_key_priority(const dol_config *c, const char *key);

#ifdef __cplusplus
}
#endif
#endif
