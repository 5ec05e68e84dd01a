/* src/config/config.c — owns dol_config: its defaults, the YAML file
 * (libyaml document API), the command-line flags, --help and API-key
 * lookup. One table, FIELDS, describes every setting once (name, type,
 * place in the struct, range, allowed values, default, help); the defaults,
 * the YAML reader, the flag parser and the help text are all driven by it.
 */
#include "dolphin/config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <yaml.h>

/* ---------------------------------------------------------------- table */

typedef enum {
    F_STR,    /* char array; min = minimum length */
    F_ENUM,   /* an enum member: the index of the value in `choices` */
    F_INT,    /* int */
    F_I64,    /* int64_t */
    F_SIZE,   /* size_t */
    F_FLOAT,  /* float */
    F_DOUBLE, /* double */
    F_BOOL,   /* bool: --name / --no-name */
    F_KEYS,   /* api_keys: YAML sequence of {key, priority}; flag KEY[:PRIO] */
    F_MODELS, /* models: YAML sequence of entries (MODEL_FIELDS); no flag */
    F_ALIASES,/* an entry's aliases: a name or a sequence of names */
    F_LIST,   /* dol_int_list: YAML sequence of integers in [min, max], or "a,b,c" */
} field_type;

typedef struct {
    const char *name;    /* YAML key; the flag is --name with '_' -> '-' */
    const char *flag;    /* flag name when it differs from the key */
    field_type type;
    size_t off, size;    /* place of the member in dol_config (MODEL_FIELDS:
                            in dol_model_entry) */
    double min, max;     /* numeric range, inclusive (max HUGE_VAL = none) */
    bool min_open;       /* the range excludes min: (min, max] */
    bool bytes;          /* integer that accepts size suffixes (KiB, MiB…) */
    const char *const *choices; /* F_ENUM: the spellings, in the order of the
                                   enum's values, NULL-terminated */
    const char *def;     /* default as text: applied and shown by --help */
    const char *metavar; /* value name shown by --help */
    const char *help;
    const char *group;   /* --help heading starting at this field */
} field;

#define AT(m) .off = offsetof(dol_config, m), .size = sizeof(((dol_config *)0)->m)
#define NONE HUGE_VAL
#define CHOICES(...) ((const char *const[]){__VA_ARGS__, NULL})

static const field FIELDS[] = {
    /* server */
    { .name = "host", .type = F_STR, AT(host), .min = 1, .def = "127.0.0.1",
      .metavar = "ADDR", .help = "address to listen on (0.0.0.0 = every interface)",
      .group = "Server" },
    { .name = "port", .type = F_INT, AT(port), .min = 0, .max = 65535, .def = "8080",
      .metavar = "N", .help = "TCP port; 0 = any free port" },
    { .name = "max_body_bytes", .type = F_SIZE, AT(max_body_bytes), .min = 1024,
      .max = NONE, .bytes = true, .def = "1MiB", .metavar = "SIZE",
      .help = "largest request body; larger ones get 413" },
    { .name = "max_connections", .type = F_INT, AT(max_connections), .min = 1,
      .max = 65536, .def = "512", .metavar = "N",
      .help = "most open client connections; further ones wait to be accepted "
              "until one closes" },
    { .name = "max_connections_per_ip", .type = F_INT, AT(max_connections_per_ip),
      .min = 0, .max = 65536, .def = "0", .metavar = "N",
      .help = "most open connections from one client address; 0 = no limit "
              "(keep 0 behind a proxy)" },
    { .name = "connection_timeout_s", .type = F_INT, AT(connection_timeout_s), .min = 0,
      .max = 86400, .def = "75", .metavar = "S",
      .help = "close a connection after this long without traffic (a request waiting "
              "for its model output is exempt); 0 = never" },
    /* request limits; max_stop and max_logit_bias stay within the arrays
     * that hold them (DOL_MAX_STOP = 4, DOL_MAX_LOGIT_BIAS = 300) */
    { .name = "max_json_depth", .type = F_INT, AT(max_json_depth), .min = 1, .max = 1000,
      .def = "64", .metavar = "N",
      .help = "deepest nesting of objects and arrays in a request body; deeper: 400",
      .group = "Request limits (a request beyond one gets 400 naming the field)" },
    { .name = "max_prompt_tokens", .type = F_INT, AT(max_prompt_tokens), .min = 0,
      .max = NONE, .def = "0", .metavar = "N",
      .help = "most tokens in one prompt; 0 = the context length" },
    { .name = "max_tokens_cap", .type = F_INT, AT(max_tokens_cap), .min = 0, .max = NONE,
      .def = "0", .metavar = "N",
      .help = "largest max_tokens a request may ask for (also caps the defaults); "
              "0 = only the context limits it" },
    { .name = "max_n", .type = F_INT, AT(max_n), .min = 1, .max = 256, .def = "16",
      .metavar = "N", .help = "most choices per prompt (n); max_batch_size limits it too" },
    { .name = "max_stop", .type = F_INT, AT(max_stop), .min = 1, .max = 4, .def = "4",
      .metavar = "N", .help = "most stop strings in one request" },
    { .name = "max_stop_len", .type = F_INT, AT(max_stop_len), .min = 1, .max = 65536,
      .bytes = true, .def = "512", .metavar = "SIZE",
      .help = "longest stop string, in bytes" },
    { .name = "max_logit_bias", .type = F_INT, AT(max_logit_bias), .min = 1, .max = 300,
      .def = "300", .metavar = "N", .help = "most logit_bias entries in one request" },
    { .name = "max_grammar_states", .type = F_INT, AT(max_grammar_states), .min = 16,
      .max = 10000000, .def = "20000", .metavar = "N",
      .help = "most automaton states a response_format JSON schema may compile to" },
    /* model */
    { .name = "model", .type = F_STR, AT(model), .def = "", .metavar = "DIR",
      .help = "Hugging Face model directory, or a GGUF file (required; relative to the working directory)",
      .group = "Model" },
    { .name = "served_model_name", .type = F_STR, AT(served_model_name), .def = "",
      .metavar = "NAME", .help = "model id in the API; empty = the model directory's name" },
    { .name = "models", .type = F_MODELS, .def = "", .metavar = "LIST",
      .help = "several models (config file only): a list of {name, path, aliases, pinned, "
              "weights, quantize_lm_head, activations, backend, gpu_memory_utilization, context_len, "
              "weights_cache_dir}; "
              "see docs/configuration.md" },
    { .name = "max_loaded_models", .type = F_INT, AT(max_loaded_models), .min = 1,
      .max = DOL_MAX_MODELS, .def = "3", .metavar = "N",
      .help = "most models loaded at once; the least recently used idle one is unloaded "
              "to make room" },
    { .name = "memory_budget_bytes", .type = F_I64, AT(memory_budget_bytes), .min = 0,
      .max = NONE, .bytes = true, .def = "0", .metavar = "SIZE",
      .help = "most weight + KV-cache bytes (host and device) of the loaded models; "
              "0 = no budget" },
    { .name = "load_timeout_s", .type = F_DOUBLE, AT(load_timeout_s), .min = 0, .max = NONE,
      .min_open = true, .def = "300", .metavar = "S",
      .help = "how long loading a model (waiting for room included) may take before its "
              "requests get 503" },
    { .name = "load_retry_s", .type = F_DOUBLE, AT(load_retry_s), .min = 0, .max = NONE,
      .def = "10", .metavar = "S",
      .help = "after a failed load, requests get 503 for this long before a new try "
              "(doubling per failure, at most 10 minutes)" },
    { .name = "threads", .type = F_INT, AT(threads), .min = 0, .max = 1024, .def = "0",
      .metavar = "N", .help = "CPU compute threads; 0 = every online core" },
    { .name = "backend", .type = F_ENUM, AT(backend), .choices = CHOICES("auto", "cpu", "cuda"),
      .def = "auto", .help = "compute backend; auto = CUDA when a device is usable" },
    { .name = "gpu_memory_utilization", .type = F_DOUBLE, AT(gpu_memory_utilization),
      .min = 0, .max = 1, .min_open = true, .def = "0.90", .metavar = "R",
      .help = "CUDA: share of device memory for weights, KV cache and workspaces" },
    { .name = "devices", .type = F_LIST, AT(devices), .min = 0, .max = 63, .def = "",
      .metavar = "LIST", .help = "CUDA devices for the model's blocks, in order (e.g. 0,1); "
                                "empty = device 0" },
    { .name = "layer_split", .type = F_LIST, AT(layer_split), .min = 1, .max = 100000, .def = "",
      .metavar = "LIST", .help = "blocks per device, in the order of devices (e.g. 20,20); "
                                "empty = proportional to each device's free memory" },
    { .name = "gpu_layers", .type = F_INT, AT(gpu_layers), .min = -1, .max = 100000, .def = "-1",
      .metavar = "N", .help = "the first N blocks on the GPU(s), the rest on the CPU; "
                             "-1 = as many as fit" },
    { .name = "allow_host_spill", .type = F_BOOL, AT(allow_host_spill), .def = "true",
      .help = "when the model does not fit the GPU budget, run the blocks that do not fit "
              "on the CPU (false: refuse to start)" },
    { .name = "weights", .type = F_ENUM, AT(weights), .choices = CHOICES("auto", "f32", "f16", "nf4", "int8"),
      .def = "auto", .help = "weight format; auto = f16 on CUDA, the checkpoint's own dtype (f32/f16/bf16) on the CPU" },
    { .name = "quantize_lm_head", .type = F_BOOL, AT(quantize_lm_head), .def = "false",
      .help = "with weights nf4 or int8, quantize lm_head too (default: kept in its 16/32 bits)" },
    { .name = "activations", .type = F_ENUM, AT(activations), .choices = CHOICES("auto", "f32", "int8"),
      .def = "auto", .help = "CPU, quantized weights: int8 = 8-bit activations and integer dot "
                             "products, f32 = the exact products; auto = int8 where the CPU "
                             "has the kernels (docs/performance.md)" },
    { .name = "context_len", .type = F_INT, AT(context_len), .min = 0, .max = NONE,
      .def = "0", .metavar = "N", .help = "context length; 0 = max_position_embeddings" },
    { .name = "weights_cache_dir", .type = F_STR, AT(weights_cache_dir), .def = "",
      .metavar = "DIR",
      .help = "CPU: keep the converted weights in a cache file in DIR and map it at the next "
              "start; empty = off" },
    /* sampling */
    { .name = "temperature", .type = F_FLOAT, AT(temperature), .min = 0, .max = 2,
      .def = "1.0", .metavar = "T", .help = "default temperature; 0 = greedy",
      .group = "Sampling defaults (used when a request leaves a value out)" },
    { .name = "top_p", .type = F_FLOAT, AT(top_p), .min = 0, .max = 1, .min_open = true,
      .def = "1.0", .metavar = "P", .help = "default nucleus sampling mass; 1 = off" },
    { .name = "top_k", .type = F_INT, AT(top_k), .min = 0, .max = NONE, .def = "0",
      .metavar = "K", .help = "default top-k; 0 = off" },
    { .name = "max_tokens", .type = F_INT, AT(max_tokens), .min = 1, .max = NONE,
      .def = "16", .metavar = "N", .help = "default max_tokens for completions" },
    /* scheduler */
    { .name = "batch_window_ms", .type = F_INT, AT(batch_window_ms), .min = 0,
      .max = 60000, .def = "50", .metavar = "MS",
      .help = "how long an idle engine waits for more requests before a batch starts",
      .group = "Scheduler" },
    { .name = "max_batch_size", .type = F_INT, AT(max_batch_size), .min = 1, .max = 256,
      .def = "8", .metavar = "N", .help = "most sequences in one batch" },
    { .name = "batch_mode", .type = F_ENUM, AT(batch_mode), .choices = CHOICES("continuous", "static"),
      .def = "continuous", .help = "continuous: join/leave every step; static: run a batch to the end" },
    { .name = "max_queue", .type = F_INT, AT(max_queue), .min = 1, .max = NONE,
      .def = "256", .metavar = "N", .help = "most waiting requests; beyond: 429" },
    { .name = "request_timeout_s", .type = F_DOUBLE, AT(request_timeout_s), .min = 0,
      .max = NONE, .def = "600", .metavar = "S",
      .help = "queue wait + generation limit per request; 0 = none" },
    { .name = "memory_high_watermark", .type = F_DOUBLE, AT(memory_high_watermark),
      .min = 0, .max = 1, .min_open = true, .def = "0.80", .metavar = "R",
      .help = "KV/device memory use above which sequences are admitted one at a time" },
    { .name = "kv_cache_tokens", .type = F_I64, AT(kv_cache_tokens), .min = 0,
      .max = NONE, .def = "0", .metavar = "N", .help = "KV-cache capacity in tokens; 0 = derive" },
    { .name = "kv_cache_bytes", .type = F_I64, AT(kv_cache_bytes), .min = 0, .max = NONE,
      .bytes = true, .def = "0", .metavar = "SIZE",
      .help = "KV-cache capacity in bytes; 0 = derive" },
    { .name = "kv_cache_dtype", .type = F_ENUM, AT(kv_cache_dtype),
      .choices = CHOICES("auto", "f32", "f16", "q8_0"), .def = "auto",
      .help = "KV-cache element type: q8_0 = 8 bits a value (about twice the tokens of f16); "
              "auto = f32 with f32 weights on the CPU, else f16 (CUDA: f32 is held as f16)" },
    { .name = "kv_cache_dtype_k", .type = F_ENUM, AT(kv_cache_dtype_k),
      .choices = CHOICES("auto", "f32", "f16", "q8_0"), .def = "auto",
      .help = "element type of the K half alone; auto = kv_cache_dtype" },
    { .name = "kv_cache_dtype_v", .type = F_ENUM, AT(kv_cache_dtype_v),
      .choices = CHOICES("auto", "f32", "f16", "q8_0"), .def = "auto",
      .help = "element type of the V half alone; auto = kv_cache_dtype" },
    { .name = "kv_cache_memory_fraction", .type = F_DOUBLE, AT(kv_cache_memory_fraction),
      .min = 0, .max = 1, .min_open = true, .def = "0.90", .metavar = "R",
      .help = "CPU, pool size not set: share of the memory left after the weights for the KV cache" },
    { .name = "kv_block_size", .type = F_INT, AT(kv_block_size), .min = 1, .max = 1024,
      .def = "16", .metavar = "N", .help = "tokens per KV-cache block" },
    { .name = "prefix_caching", .type = F_BOOL, AT(prefix_caching), .def = "true",
      .help = "keep the K/V of whole prompt blocks for later prompts that start alike" },
    { .name = "batch_invariant", .type = F_BOOL, AT(batch_invariant), .def = "true",
      .help = "CPU: every sequence's logits bit-identical in any batch; false lets prefill "
              "products run on AMX, in AMX-INT8 or BF16x3 (faster, not the same bits)" },
    { .name = "prefill_chunk", .type = F_INT, AT(prefill_chunk), .min = 1, .max = NONE,
      .def = "512", .metavar = "N", .help = "most prompt tokens per sequence per step" },
    { .name = "speculative_mode", .type = F_ENUM, AT(speculative_mode), .choices = CHOICES("off", "ngram", "draft"),
      .def = "off", .help = "speculative decoding: ngram = propose the tokens that followed the last "
                            "few tokens earlier in the prompt or output; draft = the greedy tokens of "
                            "speculative_draft_model; verified in one step (the output is unchanged; "
                            "YAML: speculative: {mode: ngram, ...}, also per models: entry)" },
    { .name = "speculative_draft_model", .type = F_STR, AT(speculative_draft_model), .def = "",
      .metavar = "NAME", .help = "mode draft: the models: entry (name or alias) that proposes; the "
                                 "same vocabulary, loaded beside each model that uses it" },
    { .name = "speculative_max_draft", .type = F_INT, AT(speculative_max_draft), .min = 1,
      .max = DOL_SPEC_MAX_DRAFT, .def = "4", .metavar = "K", .help = "most tokens proposed per step" },
    { .name = "speculative_ngram", .type = F_INT, AT(speculative_ngram), .min = 1,
      .max = DOL_SPEC_MAX_NGRAM, .def = "3", .metavar = "N",
      .help = "n-gram lookup: the longest suffix looked up (then shorter ones)" },
    { .name = "speculative_min_acceptance", .type = F_DOUBLE, AT(speculative_min_acceptance), .min = 0,
      .max = 1, .def = "0.3", .metavar = "R",
      .help = "a sequence whose proposals are accepted less often pauses proposing "
              "(longer after each failing round)" },
    /* keys and priorities */
    { .name = "api_keys", .flag = "api-key", .type = F_KEYS, .min = 0, .max = NONE,
      .def = "", .metavar = "KEY[:PRIO]",
      .help = "accepted bearer key with its priority (repeatable, appends); none = open",
      .group = "API keys and priorities" },
    { .name = "default_priority", .type = F_INT, AT(default_priority), .min = 0,
      .max = NONE, .def = "0", .metavar = "N",
      .help = "priority of every request when no API keys are configured" },
    /* operations */
    { .name = "drain_timeout_s", .type = F_DOUBLE, AT(drain_timeout_s), .min = 0,
      .max = NONE, .def = "30", .metavar = "S",
      .help = "on SIGTERM/SIGINT, how long in-flight requests may finish",
      .group = "Operations" },
    { .name = "vram_unready_ratio", .type = F_DOUBLE, AT(vram_unready_ratio), .min = 0,
      .max = 1, .min_open = true, .def = "0.90", .metavar = "R",
      .help = "device memory use (fraction of total) that, held, makes /healthz 503" },
    { .name = "vram_unready_after_s", .type = F_DOUBLE, AT(vram_unready_after_s),
      .min = 0, .max = NONE, .def = "15", .metavar = "S",
      .help = "how long memory use must stay above vram_unready_ratio" },
    { .name = "log_level", .type = F_ENUM, AT(log_level), .choices = CHOICES("debug", "info", "warn", "error"),
      .def = "info", .help = "least severe log level printed" },
    { .name = "warmup", .type = F_BOOL, AT(warmup), .def = "true",
      .help = "run warm-up generations before reporting ready" },
};

#define N_FIELDS (sizeof FIELDS / sizeof FIELDS[0])

/* The keys of one models: entry. Those with `inherit` take the top-level
 * setting of the same name (at `top`) when the entry leaves them out. */
#define MAT(m) .off = offsetof(dol_model_entry, m), .size = sizeof(((dol_model_entry *)0)->m)
static const field MODEL_FIELDS[] = {
    { .name = "name", .type = F_STR, MAT(name), .min = 1, .def = "" },
    { .name = "path", .type = F_STR, MAT(path), .min = 1, .def = "" },
    { .name = "aliases", .type = F_ALIASES, .def = "" },
    { .name = "pinned", .type = F_BOOL, MAT(pinned), .def = "false" },
    { .name = "weights", .type = F_ENUM, MAT(weights),
      .choices = CHOICES("auto", "f32", "f16", "nf4", "int8"), .def = "auto" },
    { .name = "quantize_lm_head", .type = F_BOOL, MAT(quantize_lm_head), .def = "false" },
    { .name = "activations", .type = F_ENUM, MAT(activations), .choices = CHOICES("auto", "f32", "int8"),
      .def = "auto" },
    { .name = "kv_cache_dtype", .type = F_ENUM, MAT(kv_cache_dtype),
      .choices = CHOICES("auto", "f32", "f16", "q8_0"), .def = "auto" },
    { .name = "kv_cache_dtype_k", .type = F_ENUM, MAT(kv_cache_dtype_k),
      .choices = CHOICES("auto", "f32", "f16", "q8_0"), .def = "auto" },
    { .name = "kv_cache_dtype_v", .type = F_ENUM, MAT(kv_cache_dtype_v),
      .choices = CHOICES("auto", "f32", "f16", "q8_0"), .def = "auto" },
    { .name = "backend", .type = F_ENUM, MAT(backend), .choices = CHOICES("auto", "cpu", "cuda"),
      .def = "auto" },
    { .name = "gpu_memory_utilization", .type = F_DOUBLE, MAT(gpu_memory_utilization),
      .min = 0, .max = 1, .min_open = true, .def = "0.90" },
    { .name = "context_len", .type = F_INT, MAT(context_len), .min = 0, .max = NONE, .def = "0" },
    { .name = "devices", .type = F_LIST, MAT(devices), .min = 0, .max = 63, .def = "" },
    { .name = "layer_split", .type = F_LIST, MAT(layer_split), .min = 1, .max = 100000, .def = "" },
    { .name = "gpu_layers", .type = F_INT, MAT(gpu_layers), .min = -1, .max = 100000, .def = "-1" },
    { .name = "allow_host_spill", .type = F_BOOL, MAT(allow_host_spill), .def = "true" },
    { .name = "weights_cache_dir", .type = F_STR, MAT(weights_cache_dir), .def = "" },
    { .name = "speculative_mode", .type = F_ENUM, MAT(speculative_mode), .choices = CHOICES("off", "ngram", "draft"),
      .def = "off" },
    { .name = "speculative_draft_model", .type = F_STR, MAT(speculative_draft_model), .def = "" },
    { .name = "speculative_max_draft", .type = F_INT, MAT(speculative_max_draft), .min = 1,
      .max = DOL_SPEC_MAX_DRAFT, .def = "4" },
    { .name = "speculative_ngram", .type = F_INT, MAT(speculative_ngram), .min = 1,
      .max = DOL_SPEC_MAX_NGRAM, .def = "3" },
    { .name = "speculative_min_acceptance", .type = F_DOUBLE, MAT(speculative_min_acceptance), .min = 0,
      .max = 1, .def = "0.3" },
};
#define N_MODEL_FIELDS (sizeof MODEL_FIELDS / sizeof MODEL_FIELDS[0])
/* The inherited keys: entry field -> the dol_config member it defaults to. */
static const struct { const char *name; size_t top; } INHERITED[] = {
    { "weights", offsetof(dol_config, weights) },
    { "quantize_lm_head", offsetof(dol_config, quantize_lm_head) },
    { "activations", offsetof(dol_config, activations) },
    { "kv_cache_dtype", offsetof(dol_config, kv_cache_dtype) },
    { "kv_cache_dtype_k", offsetof(dol_config, kv_cache_dtype_k) },
    { "kv_cache_dtype_v", offsetof(dol_config, kv_cache_dtype_v) },
    { "backend", offsetof(dol_config, backend) },
    { "gpu_memory_utilization", offsetof(dol_config, gpu_memory_utilization) },
    { "context_len", offsetof(dol_config, context_len) },
    { "devices", offsetof(dol_config, devices) },
    { "layer_split", offsetof(dol_config, layer_split) },
    { "gpu_layers", offsetof(dol_config, gpu_layers) },
    { "allow_host_spill", offsetof(dol_config, allow_host_spill) },
    { "weights_cache_dir", offsetof(dol_config, weights_cache_dir) },
    { "speculative_mode", offsetof(dol_config, speculative_mode) },
    { "speculative_draft_model", offsetof(dol_config, speculative_draft_model) },
    { "speculative_max_draft", offsetof(dol_config, speculative_max_draft) },
    { "speculative_ngram", offsetof(dol_config, speculative_ngram) },
    { "speculative_min_acceptance", offsetof(dol_config, speculative_min_acceptance) },
};
_Static_assert(DOL_SPEC_OFF == 0 && DOL_SPEC_NGRAM == 1 && DOL_SPEC_DRAFT == 2,
               "speculative_mode choices are off|ngram|draft");

/* F_ENUM fields hold an int; their `choices` list the enum's values in order. */
_Static_assert(sizeof(dol_backend_kind) == sizeof(int) && sizeof(dol_weight_format) == sizeof(int) &&
               sizeof(dol_batch_mode) == sizeof(int) && sizeof(dol_log_level) == sizeof(int) &&
               sizeof(dol_kv_dtype) == sizeof(int) && sizeof(dol_activations) == sizeof(int),
               "F_ENUM stores an int");
_Static_assert(DOL_BACKEND_AUTO == 0 && DOL_BACKEND_CPU == 1 && DOL_BACKEND_CUDA == 2,
               "backend choices are auto|cpu|cuda");
_Static_assert(DOL_WEIGHTS_AUTO == 0 && DOL_WEIGHTS_F32 == 1 && DOL_WEIGHTS_F16 == 2 &&
               DOL_WEIGHTS_NF4 == 3 && DOL_WEIGHTS_INT8 == 4,
               "weights choices are auto|f32|f16|nf4|int8");
_Static_assert(DOL_ACT_AUTO == 0 && DOL_ACT_F32 == 1 && DOL_ACT_INT8 == 2,
               "activations choices are auto|f32|int8");
_Static_assert(DOL_KV_AUTO == 0 && DOL_KV_F32 == 1 && DOL_KV_F16 == 2 && DOL_KV_Q8_0 == 3,
               "kv_cache_dtype choices are auto|f32|f16|q8_0");
_Static_assert(DOL_BATCH_CONTINUOUS == 0 && DOL_BATCH_STATIC == 1,
               "batch_mode choices are continuous|static");
_Static_assert(DOL_LOG_DEBUG == 0 && DOL_LOG_INFO == 1 && DOL_LOG_WARN == 2 && DOL_LOG_ERROR == 3,
               "log_level choices are debug|info|warn|error");

const char *dol_config_choice_name(const char *key, int v)
{
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field *f = &FIELDS[i];
        if (f->type != F_ENUM || strcmp(f->name, key) != 0) continue;
        for (int idx = 0; f->choices[idx]; idx++)
            if (idx == v) return f->choices[idx];
    }
    return "?";
}

/* "a|b|c": the choices of an F_ENUM field, for messages and --help. */
static const char *choice_list(const field *f, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; f->choices[i] && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? "|" : "", f->choices[i]);
    return buf;
}

#define MAX_PRIORITY INT_MAX

/* The flag name of a field (without "--"), e.g. "max-batch-size". */
static const char *flag_name(const field *f, char *buf, size_t n)
{
    if (f->flag) return f->flag;
    size_t i = 0;
    for (; f->name[i] && i + 1 < n; i++) buf[i] = f->name[i] == '_' ? '-' : f->name[i];
    buf[i] = '\0';
    return buf;
}

static const field *find_by_key(const char *key)
{
    for (size_t i = 0; i < N_FIELDS; i++)
        if (strcmp(FIELDS[i].name, key) == 0) return &FIELDS[i];
    return NULL;
}

static const field *find_by_flag(const char *name, size_t len)
{
    char buf[64];
    for (size_t i = 0; i < N_FIELDS; i++) {
        const char *fl = flag_name(&FIELDS[i], buf, sizeof buf);
        if (strlen(fl) == len && strncmp(fl, name, len) == 0) return &FIELDS[i];
    }
    return NULL;
}

/* ------------------------------------------------------------- parsing */

/* "must be between 0 and 65535", "must be > 0 and <= 1", "must be >= 1". */
static void describe_range(const field *f, char *buf, size_t n)
{
    const char *lo = f->min_open ? ">" : ">=";
    if (f->max == NONE)
        snprintf(buf, n, "must be %s %g", lo, f->min);
    else if (f->min_open)
        snprintf(buf, n, "must be > %g and <= %g", f->min, f->max);
    else
        snprintf(buf, n, "must be between %g and %g", f->min, f->max);
}

static bool in_range(const field *f, double v)
{
    if (v < f->min || (f->min_open && v == f->min)) return false;
    return v <= f->max;
}

/* Decimal integer with, when `bytes`, an optional size suffix. */
static int parse_integer(const char *s, bool bytes, long long *out, bool *overflow)
{
    *overflow = false;
    if (!*s || isspace((unsigned char)s[0])) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s) return -1;
    if (errno == ERANGE) { *overflow = true; return -1; }
    if (bytes && *end) {
        static const struct { const char *sfx; long long mul; } units[] = {
            { "B", 1 },
            { "KiB", 1LL << 10 }, { "MiB", 1LL << 20 }, { "GiB", 1LL << 30 }, { "TiB", 1LL << 40 },
            { "KB", 1000LL }, { "MB", 1000000LL }, { "GB", 1000000000LL }, { "TB", 1000000000000LL },
        };
        if (*end == ' ') end++;
        size_t i = 0;
        for (; i < sizeof units / sizeof units[0]; i++)
            if (strcasecmp(end, units[i].sfx) == 0) break;
        if (i == sizeof units / sizeof units[0]) return -1;
        if (v > LLONG_MAX / units[i].mul || v < LLONG_MIN / units[i].mul) {
            *overflow = true;
            return -1;
        }
        v *= units[i].mul;
        end += strlen(end);
    }
    if (*end) return -1;
    *out = v;
    return 0;
}

static int parse_bool(const char *s, bool *out)
{
    static const char *yes[] = { "true", "yes", "on", "1" }, *no[] = { "false", "no", "off", "0" };
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) { *out = true; return 0; }
        if (strcasecmp(s, no[i]) == 0) { *out = false; return 0; }
    }
    return -1;
}

/* Append one API key. Problems never echo the key: it is a secret. */
static int add_api_key(dol_config *c, const char *key, size_t len, int prio,
                       char *prob, size_t plen)
{
    if (len == 0) { dol_set_err(prob, plen, "key must not be empty"); return -1; }
    if (len >= sizeof c->api_keys[0].key) {
        dol_set_err(prob, plen, "key too long: %zu bytes (max %zu)", len,
                    sizeof c->api_keys[0].key - 1);
        return -1;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)key[i];
        if (ch <= ' ' || ch == 0x7f) {
            dol_set_err(prob, plen, "key contains whitespace or a control character");
            return -1;
        }
    }
    for (int i = 0; i < c->n_api_keys; i++) {
        if (strlen(c->api_keys[i].key) == len && memcmp(c->api_keys[i].key, key, len) == 0) {
            dol_set_err(prob, plen, "key listed twice (as key %d and %d)", i, c->n_api_keys);
            return -1;
        }
    }
    if (c->n_api_keys >= DOL_MAX_API_KEYS) {
        dol_set_err(prob, plen, "too many keys (max %d)", DOL_MAX_API_KEYS);
        return -1;
    }
    dol_api_key *k = &c->api_keys[c->n_api_keys++];
    memset(k->key, 0, sizeof k->key);
    memcpy(k->key, key, len);
    k->priority = prio;
    return 0;
}

/* Set field f of c from text. On failure writes the problem (without the
 * field name) into prob and returns -1. F_KEYS appends one "KEY[:PRIO]". */
static int set_field(void *base, const field *f, const char *val, char *prob, size_t plen)
{
    dol_config *c = base;   /* F_KEYS only: the other types write at base + off */
    char *dst = (char *)base + f->off;
    char range[96];
    describe_range(f, range, sizeof range);

    switch (f->type) {
    case F_STR: {
        size_t len = strlen(val);
        if (len >= f->size) {
            dol_set_err(prob, plen, "too long: %zu bytes (max %zu)", len, f->size - 1);
            return -1;
        }
        if ((double)len < f->min) { dol_set_err(prob, plen, "must not be empty"); return -1; }
        memset(dst, 0, f->size);
        memcpy(dst, val, len);
        return 0;
    }
    case F_ENUM: {
        for (int idx = 0; f->choices[idx]; idx++) {
            if (strcasecmp(f->choices[idx], val) == 0) {
                memcpy(dst, &idx, sizeof idx);
                return 0;
            }
        }
        char list[96];
        dol_set_err(prob, plen, "not one of %s: %s", choice_list(f, list, sizeof list), val);
        return -1;
    }
    case F_INT:
    case F_I64:
    case F_SIZE: {
        long long v;
        bool overflow;
        if (parse_integer(val, f->bytes, &v, &overflow) < 0) {
            if (overflow)
                dol_set_err(prob, plen, "out of range: %s (%s)", val, range);
            else if (f->bytes)
                dol_set_err(prob, plen,
                            "not a size (an integer, optionally with B, KiB, MiB, GiB, TiB, "
                            "KB, MB, GB or TB): %s", val);
            else
                dol_set_err(prob, plen, "not an integer: %s", val);
            return -1;
        }
        bool fits = in_range(f, (double)v);
        if (f->type == F_INT) fits = fits && v >= INT_MIN && v <= INT_MAX;
        if (!fits) { dol_set_err(prob, plen, "out of range: %s (%s)", val, range); return -1; }
        if (f->type == F_INT) *(int *)(void *)dst = (int)v;
        else if (f->type == F_I64) *(int64_t *)(void *)dst = (int64_t)v;
        else *(size_t *)(void *)dst = (size_t)v;
        return 0;
    }
    case F_FLOAT:
    case F_DOUBLE: {
        char *end = NULL;
        double v = 0;
        bool ok = *val && !isspace((unsigned char)val[0]);
        if (ok) {
            v = strtod(val, &end);
            ok = end != val && *end == '\0' && isfinite(v);
        }
        if (!ok) {
            dol_set_err(prob, plen, "not a number: %s", val);
            return -1;
        }
        /* a float field is checked as it will be stored: 5e-94 is > 0 as a
         * double but 0 as a float (found by tests/fuzz/fuzz_config) */
        if (f->type == F_FLOAT) v = (double)(float)v;
        if (!in_range(f, v)) { dol_set_err(prob, plen, "out of range: %s (%s)", val, range); return -1; }
        if (f->type == F_FLOAT) *(float *)(void *)dst = (float)v;
        else *(double *)(void *)dst = v;
        return 0;
    }
    case F_BOOL: {
        bool b;
        if (parse_bool(val, &b) < 0) {
            dol_set_err(prob, plen, "not a boolean (true or false): %s", val);
            return -1;
        }
        *(bool *)(void *)dst = b;
        return 0;
    }
    case F_LIST: {
        dol_int_list l = { 0 };
        const char *q = val;
        while (*q) {
            char *end;
            errno = 0;
            long v = strtol(q, &end, 10);
            if (end == q || errno == ERANGE || (*end && *end != ',') || (*end == ',' && !end[1])) {
                dol_set_err(prob, plen, "not a list of integers (e.g. 0,1): %s", val);
                return -1;
            }
            if (!in_range(f, (double)v)) {
                dol_set_err(prob, plen, "entry out of range: %ld (%s)", v, range);
                return -1;
            }
            if (l.n == DOL_MAX_DEVICES) {
                dol_set_err(prob, plen, "more than %d entries: %s", DOL_MAX_DEVICES, val);
                return -1;
            }
            l.v[l.n++] = (int)v;
            q = *end ? end + 1 : end;
        }
        memcpy(dst, &l, sizeof l);
        return 0;
    }
    case F_KEYS: {
        /* KEY[:PRIORITY]: the text after the last ':' is the priority. */
        const char *colon = strrchr(val, ':');
        long long prio = 0;
        bool overflow;
        if (colon) {
            if (parse_integer(colon + 1, false, &prio, &overflow) < 0) {
                dol_set_err(prob, plen, "priority is not an integer: %s", colon + 1);
                return -1;
            }
            if (prio < 0 || prio > MAX_PRIORITY) {
                dol_set_err(prob, plen, "priority out of range: %s (must be >= 0)", colon + 1);
                return -1;
            }
        }
        return add_api_key(c, val, colon ? (size_t)(colon - val) : strlen(val), (int)prio,
                           prob, plen);
    }
    case F_MODELS:
    case F_ALIASES:
        dol_set_err(prob, plen, "a list: set it in the config file (docs/configuration.md)");
        return -1;
    }
    return -1;
}

/* ------------------------------------------------------------- defaults */

void dol_config_defaults(dol_config *c)
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < N_FIELDS; i++) {
        if (FIELDS[i].type == F_KEYS || FIELDS[i].type == F_MODELS) continue; /* none */
        char prob[DOL_ERR_LEN];
        if (set_field(c, &FIELDS[i], FIELDS[i].def, prob, sizeof prob) < 0) {
            fprintf(stderr, "dolphin: bad built-in default for %s: %s\n", FIELDS[i].name, prob);
            abort();
        }
    }
}

/* ----------------------------------------------------------------- YAML */

static size_t line_of(const yaml_node_t *n) { return n->start_mark.line + 1; }

/* A plain empty / ~ / null scalar: YAML's null. */
static bool is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)n->data.scalar.value;
    return !*v || strcmp(v, "~") == 0 || strcasecmp(v, "null") == 0;
}

/* A scalar holding a NUL byte ("k1\0zz" in double quotes): C strings would
 * silently cut it there, so it is refused. libyaml keeps the true length. */
static bool has_nul(const yaml_node_t *n)
{
    return n->type == YAML_SCALAR_NODE &&
           strlen((const char *)n->data.scalar.value) != n->data.scalar.length;
}

static const char *node_kind(const yaml_node_t *n)
{
    return n->type == YAML_MAPPING_NODE ? "a mapping"
         : n->type == YAML_SEQUENCE_NODE ? "a sequence" : "a scalar";
}

/* api_keys: [ {key: "...", priority: N}, ... ] — replaces the list. */
static int load_api_keys(dol_config *c, yaml_document_t *doc, yaml_node_t *val,
                         const char *path, char *err, size_t errlen)
{
    c->n_api_keys = 0;
    if (is_null(val)) return 0;
    if (val->type != YAML_SEQUENCE_NODE) {
        dol_set_err(err, errlen, "%s:%zu: field api_keys: expected a sequence of "
                    "{key, priority} mappings, got %s", path, line_of(val), node_kind(val));
        return -1;
    }
    int idx = 0;
    for (yaml_node_item_t *it = val->data.sequence.items.start;
         it < val->data.sequence.items.top; it++, idx++) {
        yaml_node_t *ent = yaml_document_get_node(doc, *it);
        if (ent->type != YAML_MAPPING_NODE) {
            dol_set_err(err, errlen, "%s:%zu: field api_keys[%d]: expected a mapping "
                        "{key: ..., priority: N}, got %s", path, line_of(ent), idx,
                        node_kind(ent));
            return -1;
        }
        const char *key = NULL;
        long long prio = 0;
        for (yaml_node_pair_t *p = ent->data.mapping.pairs.start;
             p < ent->data.mapping.pairs.top; p++) {
            yaml_node_t *k = yaml_document_get_node(doc, p->key);
            yaml_node_t *v = yaml_document_get_node(doc, p->value);
            const char *kname = k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "?";
            if (k->type != YAML_SCALAR_NODE || (strcmp(kname, "key") && strcmp(kname, "priority"))) {
                dol_set_err(err, errlen, "%s:%zu: field api_keys[%d].%s: unknown key "
                            "(want key, priority)", path, line_of(k), idx, kname);
                return -1;
            }
            if (v->type != YAML_SCALAR_NODE) {
                dol_set_err(err, errlen, "%s:%zu: field api_keys[%d].%s: expected a scalar, "
                            "got %s", path, line_of(v), idx, kname, node_kind(v));
                return -1;
            }
            if (has_nul(k) || has_nul(v)) {
                dol_set_err(err, errlen, "%s:%zu: field api_keys[%d].%s: contains a NUL byte",
                            path, line_of(v), idx, kname);
                return -1;
            }
            const char *s = (const char *)v->data.scalar.value;
            if (strcmp(kname, "key") == 0) {
                key = is_null(v) ? "" : s;
                continue;
            }
            bool overflow;
            if (parse_integer(s, false, &prio, &overflow) < 0) {
                dol_set_err(err, errlen, "%s:%zu: field api_keys[%d].priority: not an "
                            "integer: %s", path, line_of(v), idx, s);
                return -1;
            }
            if (prio < 0 || prio > MAX_PRIORITY) {
                dol_set_err(err, errlen, "%s:%zu: field api_keys[%d].priority: out of range: "
                            "%s (must be >= 0)", path, line_of(v), idx, s);
                return -1;
            }
        }
        if (!key) {
            dol_set_err(err, errlen, "%s:%zu: field api_keys[%d]: missing key", path,
                        line_of(ent), idx);
            return -1;
        }
        char prob[DOL_ERR_LEN];
        if (add_api_key(c, key, strlen(key), (int)prio, prob, sizeof prob) < 0) {
            dol_set_err(err, errlen, "%s:%zu: field api_keys[%d].key: %s", path,
                        line_of(ent), idx, prob);
            return -1;
        }
    }
    return 0;
}

/* The last part of a directory path ("a/b/" -> "b"), or of a GGUF file's
 * without the extension ("a/m.gguf" -> "m"), into out. */
static void path_basename(const char *path, char *out, size_t n)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && path[start - 1] != '/') start--;
    /* a GGUF file is named without its extension ("k256-F16.gguf" -> "k256-F16") */
    if (len - start > 5 && path[len - 1] != '/' && strncmp(path + len - 5, ".gguf", 5) == 0)
        len -= 5;
    snprintf(out, n, "%.*s", (int)(len - start), path + start);
}

/* "models[1] 'chat'" or "models[1]": how an error names an entry. */
static const char *entry_label(const dol_model_entry *e, int idx, char *buf, size_t n)
{
    if (e->name[0]) snprintf(buf, n, "models[%d] '%s'", idx, e->name);
    else snprintf(buf, n, "models[%d]", idx);
    return buf;
}

/* Which entry (other than `self`) already answers to `id`, as name or alias. */
static const dol_model_entry *id_taken(const dol_model_entry *list, int n, int self,
                                       const char *id, int *who)
{
    for (int i = 0; i < n; i++) {
        if (i == self) continue;
        bool hit = strcmp(list[i].name, id) == 0;
        for (int a = 0; !hit && a < list[i].n_aliases; a++)
            hit = strcmp(list[i].aliases[a], id) == 0;
        if (hit) {
            *who = i;
            return &list[i];
        }
    }
    return NULL;
}

/* An entry's aliases: one name or a sequence of names. */
static int load_aliases(dol_model_entry *e, yaml_document_t *doc, yaml_node_t *v,
                        const char *path, const char *label, char *err, size_t errlen)
{
    e->n_aliases = 0;
    if (is_null(v)) return 0;
    yaml_node_item_t one = 0, *start, *top;
    if (v->type == YAML_SCALAR_NODE) {
        start = &one;
        top = &one + 1;
    } else if (v->type == YAML_SEQUENCE_NODE) {
        start = v->data.sequence.items.start;
        top = v->data.sequence.items.top;
    } else {
        dol_set_err(err, errlen, "%s:%zu: field %s.aliases: expected a name or a list of "
                    "names, got %s", path, line_of(v), label, node_kind(v));
        return -1;
    }
    for (yaml_node_item_t *it = start; it < top; it++) {
        yaml_node_t *a = v->type == YAML_SCALAR_NODE ? v : yaml_document_get_node(doc, *it);
        const char *s = a->type == YAML_SCALAR_NODE ? (const char *)a->data.scalar.value : "";
        if (a->type != YAML_SCALAR_NODE || has_nul(a) || is_null(a) || !*s) {
            dol_set_err(err, errlen, "%s:%zu: field %s.aliases: each alias must be a "
                        "non-empty name", path, line_of(a), label);
            return -1;
        }
        if (strlen(s) >= sizeof e->aliases[0]) {
            dol_set_err(err, errlen, "%s:%zu: field %s.aliases: too long: %zu bytes (max %zu)",
                        path, line_of(a), label, strlen(s), sizeof e->aliases[0] - 1);
            return -1;
        }
        if (e->n_aliases == DOL_MAX_ALIASES) {
            dol_set_err(err, errlen, "%s:%zu: field %s.aliases: too many (max %d)", path,
                        line_of(a), label, DOL_MAX_ALIASES);
            return -1;
        }
        snprintf(e->aliases[e->n_aliases++], sizeof e->aliases[0], "%s", s);
    }
    return 0;
}

/* models: [ {name, path, aliases, pinned, weights, ...}, ... ] — replaces
 * the list. Names and aliases are unique across the list. */
/* A YAML sequence of integers ([0, 1]) as the text set_field takes for an
 * F_LIST ("0,1"). -1 with the problem in prob. */
static int join_int_seq(yaml_document_t *doc, yaml_node_t *v, char *out, size_t n, char *prob,
                        size_t probn)
{
    size_t o = 0;
    out[0] = '\0';
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
        yaml_node_t *ent = yaml_document_get_node(doc, *it);
        if (ent->type != YAML_SCALAR_NODE || has_nul(ent) || is_null(ent) ||
            strchr((const char *)ent->data.scalar.value, ',')) {
            dol_set_err(prob, probn, "expected a list of integers");
            return -1;
        }
        o += (size_t)snprintf(out + o, o < n ? n - o : 0, "%s%s", o ? "," : "",
                              (const char *)ent->data.scalar.value);
        if (o >= n) {
            dol_set_err(prob, probn, "too long a list");
            return -1;
        }
    }
    return 0;
}

/* An entry's `speculative: {mode: ..., ...}`: its speculative_* keys. */
static int entry_group(dol_model_entry *e, yaml_document_t *doc, yaml_node_t *map, const char *path,
                       const char *label, char *err, size_t errlen)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        yaml_node_t *v = yaml_document_get_node(doc, p->value);
        const char *sub = k->type == YAML_SCALAR_NODE && !has_nul(k) ? (const char *)k->data.scalar.value : "?";
        char full[128];
        snprintf(full, sizeof full, "speculative_%s", sub);
        size_t fi = 0;
        while (fi < N_MODEL_FIELDS && strcmp(MODEL_FIELDS[fi].name, full) != 0) fi++;
        if (fi == N_MODEL_FIELDS) {
            dol_set_err(err, errlen, "%s:%zu: field %s.speculative.%s: unknown key (want mode, "
                        "draft_model, max_draft, ngram, min_acceptance)", path, line_of(k), label, sub);
            return -1;
        }
        if (e->set_mask & (1u << fi)) {
            dol_set_err(err, errlen, "%s:%zu: field %s.speculative.%s: set twice", path, line_of(k), label, sub);
            return -1;
        }
        e->set_mask |= 1u << fi;
        char prob[DOL_ERR_LEN];
        if (v->type != YAML_SCALAR_NODE || has_nul(v) || is_null(v)) {
            dol_set_err(err, errlen, "%s:%zu: field %s.speculative.%s: expected a single value", path,
                        line_of(v), label, sub);
            return -1;
        }
        if (set_field(e, &MODEL_FIELDS[fi], (const char *)v->data.scalar.value, prob, sizeof prob) < 0) {
            dol_set_err(err, errlen, "%s:%zu: field %s.speculative.%s: %s", path, line_of(v), label, sub, prob);
            return -1;
        }
    }
    return 0;
}

static int load_models(dol_config *c, yaml_document_t *doc, yaml_node_t *val,
                       const char *path, char *err, size_t errlen)
{
    c->n_models = 0;
    if (is_null(val)) return 0;
    if (val->type != YAML_SEQUENCE_NODE) {
        dol_set_err(err, errlen, "%s:%zu: field models: expected a list of entries "
                    "({name, path, ...}), got %s", path, line_of(val), node_kind(val));
        return -1;
    }
    int idx = 0;
    for (yaml_node_item_t *it = val->data.sequence.items.start;
         it < val->data.sequence.items.top; it++, idx++) {
        yaml_node_t *ent = yaml_document_get_node(doc, *it);
        char label[DOL_MODEL_NAME_LEN + 32];
        snprintf(label, sizeof label, "models[%d]", idx);
        if (ent->type != YAML_MAPPING_NODE) {
            dol_set_err(err, errlen, "%s:%zu: field %s: expected a mapping {name: ..., path: "
                        "...}, got %s", path, line_of(ent), label, node_kind(ent));
            return -1;
        }
        if (idx >= DOL_MAX_MODELS) {
            dol_set_err(err, errlen, "%s:%zu: field models: too many entries (max %d)", path,
                        line_of(ent), DOL_MAX_MODELS);
            return -1;
        }
        dol_model_entry *e = &c->models[idx];
        memset(e, 0, sizeof *e);
        for (size_t i = 0; i < N_MODEL_FIELDS; i++) {
            char prob[DOL_ERR_LEN];
            if (MODEL_FIELDS[i].type != F_ALIASES && MODEL_FIELDS[i].type != F_STR &&
                set_field(e, &MODEL_FIELDS[i], MODEL_FIELDS[i].def, prob, sizeof prob) < 0)
                abort();   /* a bad built-in default */
        }
        /* the name first, so that every later message can say it */
        for (yaml_node_pair_t *p = ent->data.mapping.pairs.start;
             p < ent->data.mapping.pairs.top; p++) {
            yaml_node_t *k = yaml_document_get_node(doc, p->key);
            yaml_node_t *v = yaml_document_get_node(doc, p->value);
            if (k->type == YAML_SCALAR_NODE && strcmp((const char *)k->data.scalar.value, "name") == 0 &&
                v->type == YAML_SCALAR_NODE && !has_nul(v) &&
                strlen((const char *)v->data.scalar.value) < sizeof e->name)
                snprintf(label, sizeof label, "models[%d] '%s'", idx,
                         (const char *)v->data.scalar.value);
        }
        for (yaml_node_pair_t *p = ent->data.mapping.pairs.start;
             p < ent->data.mapping.pairs.top; p++) {
            yaml_node_t *k = yaml_document_get_node(doc, p->key);
            yaml_node_t *v = yaml_document_get_node(doc, p->value);
            const char *kname = k->type == YAML_SCALAR_NODE && !has_nul(k)
                                    ? (const char *)k->data.scalar.value : "?";
            if (strcmp(kname, "speculative") == 0) {
                /* the speculative_* keys as one mapping */
                if (v->type != YAML_MAPPING_NODE) {
                    dol_set_err(err, errlen, "%s:%zu: field %s.speculative: expected a mapping {mode: ..., "
                                "draft_model: ..., ...}, got %s", path, line_of(v), label,
                                is_null(v) ? "nothing" : node_kind(v));
                    return -1;
                }
                if (entry_group(e, doc, v, path, label, err, errlen) < 0) return -1;
                continue;
            }
            size_t fi = 0;
            while (fi < N_MODEL_FIELDS && strcmp(MODEL_FIELDS[fi].name, kname) != 0) fi++;
            if (fi == N_MODEL_FIELDS) {
                char keys[400];
                size_t o = 0;
                for (size_t i = 0; i < N_MODEL_FIELDS && o < sizeof keys; i++)
                    o += (size_t)snprintf(keys + o, sizeof keys - o, "%s%s", i ? ", " : "",
                                          MODEL_FIELDS[i].name);
                dol_set_err(err, errlen, "%s:%zu: field %s.%s: unknown key (want %s)", path,
                            line_of(k), label, kname, keys);
                return -1;
            }
            const field *f = &MODEL_FIELDS[fi];
            if (e->set_mask & (1u << fi)) {
                dol_set_err(err, errlen, "%s:%zu: field %s.%s: set twice", path, line_of(k),
                            label, kname);
                return -1;
            }
            e->set_mask |= 1u << fi;
            if (f->type == F_ALIASES) {
                if (load_aliases(e, doc, v, path, label, err, errlen) < 0) return -1;
                continue;
            }
            if (f->type == F_LIST && v->type == YAML_SEQUENCE_NODE) {
                char joined[256], prob[DOL_ERR_LEN];
                if (join_int_seq(doc, v, joined, sizeof joined, prob, sizeof prob) < 0 ||
                    set_field(e, f, joined, prob, sizeof prob) < 0) {
                    dol_set_err(err, errlen, "%s:%zu: field %s.%s: %s", path, line_of(v), label,
                                kname, prob);
                    return -1;
                }
                continue;
            }
            if (v->type != YAML_SCALAR_NODE || has_nul(v) ||
                (is_null(v) && f->type != F_STR && f->type != F_LIST)) {
                dol_set_err(err, errlen, "%s:%zu: field %s.%s: expected a single value", path,
                            line_of(v), label, kname);
                return -1;
            }
            char prob[DOL_ERR_LEN];
            const char *s = is_null(v) ? "" : (const char *)v->data.scalar.value;
            if (set_field(e, f, s, prob, sizeof prob) < 0) {
                dol_set_err(err, errlen, "%s:%zu: field %s.%s: %s", path, line_of(v), label,
                            kname, prob);
                return -1;
            }
        }
        if (!e->path[0]) {
            dol_set_err(err, errlen, "%s:%zu: field %s.path: missing (the model directory)",
                        path, line_of(ent), label);
            return -1;
        }
        if (!e->name[0]) path_basename(e->path, e->name, sizeof e->name);
        if (!e->name[0]) {   /* a path such as "/" names no directory */
            dol_set_err(err, errlen, "%s:%zu: field %s.name: missing, and path '%s' has no "
                        "last component to take it from", path, line_of(ent), label, e->path);
            return -1;
        }
        entry_label(e, idx, label, sizeof label);
        int who;
        if (id_taken(c->models, idx, -1, e->name, &who)) {
            char other[DOL_MODEL_NAME_LEN + 32];
            dol_set_err(err, errlen, "%s:%zu: field %s.name: '%s' is already taken by %s", path,
                        line_of(ent), label, e->name,
                        entry_label(&c->models[who], who, other, sizeof other));
            return -1;
        }
        for (int a = 0; a < e->n_aliases; a++) {
            bool twice = strcmp(e->aliases[a], e->name) == 0;
            for (int b = 0; b < a; b++) twice = twice || strcmp(e->aliases[a], e->aliases[b]) == 0;
            if (twice || id_taken(c->models, idx, -1, e->aliases[a], &who)) {
                char other[DOL_MODEL_NAME_LEN + 32];
                dol_set_err(err, errlen, "%s:%zu: field %s.aliases: '%s' is already taken by %s",
                            path, line_of(ent), label, e->aliases[a],
                            twice ? label : entry_label(&c->models[who], who, other, sizeof other));
                return -1;
            }
        }
        c->n_models = idx + 1;
    }
    return 0;
}

/* Speculative decoding with a draft model: each entry's draft_model names
 * another entry (draft_index). A top-level draft setting does not apply to
 * the draft itself; an entry's own setting that names itself is an error. */
static int resolve_drafts(dol_config *c, char *err, size_t errlen)
{
    size_t fm = 0, fd = 0;
    while (strcmp(MODEL_FIELDS[fm].name, "speculative_mode") != 0) fm++;
    while (strcmp(MODEL_FIELDS[fd].name, "speculative_draft_model") != 0) fd++;
    for (int i = 0; i < c->n_models; i++) {
        dol_model_entry *e = &c->models[i];
        char label[DOL_MODEL_NAME_LEN + 32], names[512], where[DOL_MODEL_NAME_LEN + 40];
        e->draft_index = -1;
        const bool own = e->set_mask & (1u << fm | 1u << fd);
        entry_label(e, i, label, sizeof label);
        /* the entry's own setting is named by the entry, an inherited one by the top level's */
        snprintf(where, sizeof where, "%s%s", own ? label : "", own ? "." : "");
        if (e->speculative_mode != DOL_SPEC_DRAFT) {
            int who;   /* a draft_model set for later still names an entry */
            if (e->speculative_draft_model[0] &&
                !id_taken(c->models, c->n_models, -1, e->speculative_draft_model, &who)) {
                dol_set_err(err, errlen, "field %sspeculative.draft_model: '%s' is no entry of models:",
                            where, e->speculative_draft_model);
                return -1;
            }
            continue;
        }
        if (!e->speculative_draft_model[0]) {
            dol_set_err(err, errlen, "field %sspeculative.draft_model: missing (mode draft proposes with "
                        "another entry of models:, named here)", where);
            return -1;
        }
        int who = -1;
        if (!id_taken(c->models, c->n_models, -1, e->speculative_draft_model, &who)) {
            size_t o = 0;
            names[0] = '\0';
            for (int k = 0; k < c->n_models && o < sizeof names; k++)
                o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", k ? ", " : "", c->models[k].name);
            dol_set_err(err, errlen, "field %sspeculative.draft_model: '%s' is no entry of models: (%s)",
                        where, e->speculative_draft_model, names);
            return -1;
        }
        if (who == i && !own) {   /* the top level's draft: not for itself */
            e->speculative_mode = DOL_SPEC_OFF;
            continue;
        }
        if (who == i) {
            dol_set_err(err, errlen, "field %s.speculative.draft_model: '%s' is this model itself", label,
                        e->speculative_draft_model);
            return -1;
        }
        e->draft_index = who;
    }
    return 0;
}

/* After the file and after the flags: the single model: (or --model) as a
 * one-entry list, and every key an entry leaves out taken from the top
 * level. Idempotent. -1 with err when the two forms are mixed. */
static int finalize_models(dol_config *c, char *err, size_t errlen)
{
    bool explicit_list = c->n_models > 0 && !c->models[0].implicit;
    if (explicit_list) {
        if (c->model[0]) {
            dol_set_err(err, errlen, "field model (--model): not together with a models list; "
                        "add the directory as an entry of models");
            return -1;
        }
        if (c->served_model_name[0]) {
            dol_set_err(err, errlen, "field served_model_name: not together with a models "
                        "list; each entry has its own name");
            return -1;
        }
    } else if (c->model[0]) {
        dol_model_entry *e = &c->models[0];
        memset(e, 0, sizeof *e);
        e->implicit = true;
        snprintf(e->path, sizeof e->path, "%s", c->model);
        if (c->served_model_name[0]) snprintf(e->name, sizeof e->name, "%s", c->served_model_name);
        else path_basename(c->model, e->name, sizeof e->name);
        if (!e->name[0]) {
            dol_set_err(err, errlen, "field model (--model): '%s' has no last component to "
                        "name the model by; set served_model_name", c->model);
            return -1;
        }
        c->n_models = 1;
    } else {
        c->n_models = 0;
    }
    for (int i = 0; i < c->n_models; i++) {
        dol_model_entry *e = &c->models[i];
        for (size_t k = 0; k < sizeof INHERITED / sizeof INHERITED[0]; k++) {
            size_t fi = 0;
            while (strcmp(MODEL_FIELDS[fi].name, INHERITED[k].name) != 0) fi++;
            if (e->set_mask & (1u << fi)) continue;
            memcpy((char *)e + MODEL_FIELDS[fi].off, (const char *)c + INHERITED[k].top,
                   MODEL_FIELDS[fi].size);
        }
    }
    if (resolve_drafts(c, err, errlen) < 0) return -1;
    int pinned = 0;
    for (int i = 0; i < c->n_models; i++) pinned += c->models[i].pinned;
    if (pinned > c->max_loaded_models) {
        dol_set_err(err, errlen, "field max_loaded_models: %d, fewer than the %d pinned models "
                    "(pinned models stay loaded)", c->max_loaded_models, pinned);
        return -1;
    }
    return 0;
}

/* Apply the root mapping of doc to c. */
/* `group: {key: value, ...}` sets the scalar fields group_key. */
static int apply_group(dol_config *c, yaml_document_t *doc, yaml_node_t *map, const char *group,
                       const char *path, size_t *seen, char *err, size_t errlen)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        yaml_node_t *v = yaml_document_get_node(doc, p->value);
        char full[128];
        const char *sub = k->type == YAML_SCALAR_NODE && !has_nul(k) ? (const char *)k->data.scalar.value : "?";
        snprintf(full, sizeof full, "%s_%s", group, sub);
        const field *f = k->type == YAML_SCALAR_NODE && !has_nul(k) ? find_by_key(full) : NULL;
        if (!f) {
            dol_set_err(err, errlen, "%s:%zu: field %s.%s: unknown key", path, line_of(k), group, sub);
            return -1;
        }
        const size_t fi = (size_t)(f - FIELDS);
        if (seen[fi]) {
            dol_set_err(err, errlen, "%s:%zu: field %s.%s: set twice (first at line %zu)", path, line_of(k),
                        group, sub, seen[fi]);
            return -1;
        }
        seen[fi] = line_of(k);
        if (v->type != YAML_SCALAR_NODE || has_nul(v) || is_null(v)) {
            dol_set_err(err, errlen, "%s:%zu: field %s.%s: expected a single value, got %s", path, line_of(v),
                        group, sub, is_null(v) ? "nothing" : has_nul(v) ? "a NUL byte" : node_kind(v));
            return -1;
        }
        char prob[DOL_ERR_LEN];
        if (set_field(c, f, (const char *)v->data.scalar.value, prob, sizeof prob) < 0) {
            dol_set_err(err, errlen, "%s:%zu: field %s.%s: %s", path, line_of(v), group, sub, prob);
            return -1;
        }
    }
    return 0;
}

static int apply_document(dol_config *c, yaml_document_t *doc, const char *path,
                          char *err, size_t errlen)
{
    yaml_node_t *root = yaml_document_get_root_node(doc);
    if (!root || is_null(root)) return 0; /* empty file: no changes */
    if (root->type != YAML_MAPPING_NODE) {
        dol_set_err(err, errlen, "%s:%zu: expected a mapping of `key: value` lines at the "
                    "top level, got %s", path, line_of(root), node_kind(root));
        return -1;
    }
    size_t seen[N_FIELDS] = { 0 }; /* line where each key was set, to catch repeats */
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
         p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        yaml_node_t *v = yaml_document_get_node(doc, p->value);
        if (k->type != YAML_SCALAR_NODE) {
            dol_set_err(err, errlen, "%s:%zu: a key must be a plain name, not %s", path,
                        line_of(k), node_kind(k));
            return -1;
        }
        const char *name = (const char *)k->data.scalar.value;
        if (has_nul(k)) {
            dol_set_err(err, errlen, "%s:%zu: field %s: the key contains a NUL byte", path,
                        line_of(k), name);
            return -1;
        }
        const field *f = find_by_key(name);
        if (!f && strcmp(name, "speculative") == 0) {
            /* the speculative_* keys as one mapping */
            if (v->type != YAML_MAPPING_NODE) {
                dol_set_err(err, errlen, "%s:%zu: field speculative: expected a mapping {mode: ..., "
                            "draft_model: ..., ...}, got %s", path, line_of(v), is_null(v) ? "nothing" : node_kind(v));
                return -1;
            }
            if (apply_group(c, doc, v, name, path, seen, err, errlen) < 0) return -1;
            continue;
        }
        if (!f) {
            /* A dashed spelling (max-batch-size) is a common slip: say so. */
            char alt[64];
            snprintf(alt, sizeof alt, "%s", name);
            for (char *q = alt; *q; q++) if (*q == '-') *q = '_';
            const field *g = find_by_key(alt);
            if (g)
                dol_set_err(err, errlen, "%s:%zu: field %s: unknown key (did you mean %s?)",
                            path, line_of(k), name, g->name);
            else
                dol_set_err(err, errlen, "%s:%zu: field %s: unknown key", path, line_of(k), name);
            return -1;
        }
        size_t fi = (size_t)(f - FIELDS);
        if (seen[fi]) {
            dol_set_err(err, errlen, "%s:%zu: field %s: set twice (first at line %zu)", path,
                        line_of(k), name, seen[fi]);
            return -1;
        }
        seen[fi] = line_of(k);

        if (f->type == F_KEYS) {
            if (load_api_keys(c, doc, v, path, err, errlen) < 0) return -1;
            continue;
        }
        if (f->type == F_MODELS) {
            if (load_models(c, doc, v, path, err, errlen) < 0) return -1;
            continue;
        }
        if (f->type == F_LIST && v->type == YAML_SEQUENCE_NODE) {
            char joined[256], prob[DOL_ERR_LEN];
            if (join_int_seq(doc, v, joined, sizeof joined, prob, sizeof prob) < 0 ||
                set_field(c, f, joined, prob, sizeof prob) < 0) {
                dol_set_err(err, errlen, "%s:%zu: field %s: %s", path, line_of(v), name, prob);
                return -1;
            }
            continue;
        }
        if (v->type != YAML_SCALAR_NODE) {
            dol_set_err(err, errlen, "%s:%zu: field %s: expected a single value, got %s", path,
                        line_of(v), name, node_kind(v));
            return -1;
        }
        if (has_nul(v)) {
            dol_set_err(err, errlen, "%s:%zu: field %s: the value contains a NUL byte", path,
                        line_of(v), name);
            return -1;
        }
        const char *s = (const char *)v->data.scalar.value;
        if (is_null(v)) {
            if (f->type != F_STR && f->type != F_LIST) {
                dol_set_err(err, errlen, "%s:%zu: field %s: missing value", path, line_of(v), name);
                return -1;
            }
            s = "";
        }
        char prob[DOL_ERR_LEN];
        if (set_field(c, f, s, prob, sizeof prob) < 0) {
            dol_set_err(err, errlen, "%s:%zu: field %s: %s", path, line_of(v), name, prob);
            return -1;
        }
    }
    return 0;
}

static void syntax_error(const yaml_parser_t *ps, const char *path, char *err, size_t errlen)
{
    const char *prob = ps->problem ? ps->problem : "malformed YAML";
    if (ps->error == YAML_READER_ERROR) {
        dol_set_err(err, errlen, "%s: byte %zu: %s", path, ps->problem_offset, prob);
    } else if (ps->context) {
        dol_set_err(err, errlen, "%s:%zu: %s (%s at line %zu)", path, ps->problem_mark.line + 1,
                    prob, ps->context, ps->context_mark.line + 1);
    } else {
        dol_set_err(err, errlen, "%s:%zu: %s", path, ps->problem_mark.line + 1, prob);
    }
}

int dol_config_load_yaml(dol_config *c, const char *path, char *err, size_t errlen)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        dol_set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;   /* a pipe (--config <(...)) is fine, a directory is not */
    if (fstat(fileno(fp), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(fp);
        dol_set_err(err, errlen, "%s: is a directory, not a YAML file", path);
        return -1;
    }
    yaml_parser_t ps;
    if (!yaml_parser_initialize(&ps)) {
        fclose(fp);
        dol_set_err(err, errlen, "%s: cannot initialise the YAML parser", path);
        return -1;
    }
    yaml_parser_set_input_file(&ps, fp);

    /* Work on a copy so a bad file leaves c untouched. */
    dol_config *tmp = malloc(sizeof *tmp);
    int rc = -1;
    yaml_document_t doc;
    if (!tmp) {
        dol_set_err(err, errlen, "%s: out of memory", path);
    } else if (!yaml_parser_load(&ps, &doc)) {
        syntax_error(&ps, path, err, errlen);
    } else {
        *tmp = *c;
        rc = apply_document(tmp, &doc, path, err, errlen);
        yaml_document_delete(&doc);
        if (rc == 0) {
            /* A second document ("---") would be silently ignored: refuse it. */
            if (!yaml_parser_load(&ps, &doc)) {
                syntax_error(&ps, path, err, errlen);
                rc = -1;
            } else {
                yaml_node_t *r2 = yaml_document_get_root_node(&doc);
                if (r2) {
                    dol_set_err(err, errlen, "%s:%zu: only one YAML document is allowed", path,
                                line_of(r2));
                    rc = -1;
                }
                yaml_document_delete(&doc);
            }
        }
        if (rc == 0) {
            char prob[DOL_ERR_LEN];
            rc = finalize_models(tmp, prob, sizeof prob);
            if (rc) dol_set_err(err, errlen, "%s: %s", path, prob);
        }
        if (rc == 0) *c = *tmp;
    }
    free(tmp);
    yaml_parser_delete(&ps);
    fclose(fp);
    return rc;
}

/* ---------------------------------------------------------------- flags */

static bool is_help(const char *a) { return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0; }

/* Does `--name` (no '=') take the next argument as its value? */
static bool takes_value(const char *arg)
{
    if (strncmp(arg, "--", 2) != 0 || strchr(arg, '=')) return false;
    if (strcmp(arg, "--config") == 0) return true;
    const field *f = find_by_flag(arg + 2, strlen(arg + 2));
    return f && f->type != F_BOOL;
}

/* The value of a flag: after '=' or the next argument (which must not be
 * another --flag). Advances *i past a consumed argument. */
static const char *flag_value(int argc, char **argv, int *i, const char *eq)
{
    if (eq) return eq + 1;
    if (*i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0) return argv[++*i];
    return NULL;
}

int dol_config_from_args(dol_config *c, int argc, char **argv, char *err, size_t errlen)
{
    /* Pass 1: --help/--version, and --config (defaults, then the file). */
    const char *config_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (is_help(a)) {
            dol_config_print_help(stdout, argv[0]);
            return 1;
        }
        if (strcmp(a, "--version") == 0) {
            printf("dolphind %s\n", DOL_VERSION);
            return 1;
        }
        if (strcmp(a, "--config") == 0 || strncmp(a, "--config=", 9) == 0) {
            const char *v = flag_value(argc, argv, &i, strchr(a, '='));
            if (!v || !*v) { dol_set_err(err, errlen, "flag --config: missing value"); return -1; }
            if (config_path) {
                dol_set_err(err, errlen, "flag --config: given more than once");
                return -1;
            }
            config_path = v;
            continue;
        }
        if (takes_value(a) && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) i++;
    }
    dol_config_defaults(c);
    if (config_path && dol_config_load_yaml(c, config_path, err, errlen) < 0) return -1;

    /* Pass 2: every other flag, in order; later ones win. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            dol_set_err(err, errlen, "unexpected argument %s (see --help)", a);
            return -1;
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        if (len == 6 && strncmp(name, "config", 6) == 0) {
            flag_value(argc, argv, &i, eq); /* applied in pass 1 */
            continue;
        }
        const field *f = find_by_flag(name, len);
        bool negated = false;
        if (!f && len > 3 && strncmp(name, "no-", 3) == 0) {
            f = find_by_flag(name + 3, len - 3);
            if (f && f->type != F_BOOL) f = NULL;
            negated = f != NULL;
        }
        if (!f) {
            dol_set_err(err, errlen, "unknown flag --%.*s (see --help)", (int)len, name);
            return -1;
        }
        char prob[DOL_ERR_LEN];
        const char *v;
        if (f->type == F_BOOL) {
            if (negated && eq) {
                dol_set_err(err, errlen, "flag --%.*s: takes no value", (int)len, name);
                return -1;
            }
            v = negated ? "false" : eq ? eq + 1 : "true";
        } else {
            v = flag_value(argc, argv, &i, eq);
            if (!v) {
                dol_set_err(err, errlen, "flag --%.*s: missing value", (int)len, name);
                return -1;
            }
        }
        if (set_field(c, f, v, prob, sizeof prob) < 0) {
            dol_set_err(err, errlen, "flag --%.*s: %s", (int)len, name, prob);
            return -1;
        }
    }
    return finalize_models(c, err, errlen);
}

/* ----------------------------------------------------------------- help */

/* Print `left` in a 30-column gutter, then `text` word-wrapped, then `tail`
 * (kept whole on one line, e.g. "[0..65535; default 8080]"). */
static void help_line(FILE *f, const char *left, const char *text, const char *tail)
{
    enum { GUTTER = 30, WIDTH = 80 };
    int col = fprintf(f, "  %s", left);
    if (col >= GUTTER) { fputc('\n', f); col = 0; }
    fprintf(f, "%*s", GUTTER - col, "");
    col = GUTTER;
    bool in_tail = false;
    for (;;) {
        if (!*text) {
            if (in_tail || !tail || !*tail) break;
            text = tail;
            in_tail = true;
        }
        size_t w = in_tail ? strlen(text) : strcspn(text, " ");
        if (col > GUTTER && col + 1 + (int)w > WIDTH) {
            fprintf(f, "\n%*s", GUTTER, "");
            col = GUTTER;
        } else if (col > GUTTER) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", (int)w, text);
        col += (int)w;
        text += w;
        while (*text == ' ') text++;
    }
    fputc('\n', f);
}

void dol_config_print_help(void *fp, const char *argv0)
{
    FILE *f = fp;
    const char *prog = argv0 && *argv0 ? argv0 : "dolphind";
    const char *slash = strrchr(prog, '/');
    if (slash && slash[1]) prog = slash + 1;

    fprintf(f,
            "Usage: %s [--config FILE] [--FLAG VALUE | --FLAG=VALUE]...\n"
            "\n"
            "Dolphin %s, an OpenAI-compatible inference server for Llama-2 models.\n"
            "Settings come from the defaults, then the YAML file given with --config, then\n"
            "these flags (flags win). The YAML key of --some-flag is some_flag (--api-key:\n"
            "api_keys). Booleans: --flag, --no-flag or --flag=true|false. Sizes take B, KiB,\n"
            "MiB, GiB, TiB, KB, MB, GB or TB. Relative paths are relative to the working\n"
            "directory.\n\n",
            prog, DOL_VERSION);
    help_line(f, "--config FILE", "YAML config file (e.g. configs/dolphin.yaml)", NULL);
    help_line(f, "-h, --help", "print this help and exit", NULL);
    help_line(f, "--version", "print the version and exit", NULL);

    for (size_t i = 0; i < N_FIELDS; i++) {
        const field *fd = &FIELDS[i];
        if (fd->group) fprintf(f, "\n%s:\n", fd->group);

        char fbuf[64], left[160], list[96];
        const char *fl = flag_name(fd, fbuf, sizeof fbuf);
        if (fd->type == F_MODELS)
            snprintf(left, sizeof left, "%s: (file only)", fd->name);
        else if (fd->type == F_BOOL)
            snprintf(left, sizeof left, "--%s, --no-%s", fl, fl);
        else
            snprintf(left, sizeof left, "--%s %s", fl,
                     fd->type == F_ENUM ? choice_list(fd, list, sizeof list) : fd->metavar);

        /* help text, then "[range; default X]" */
        char range[96] = "", tail[160];
        switch (fd->type) {
        case F_INT: case F_I64: case F_SIZE: case F_FLOAT: case F_DOUBLE:
            if (fd->max == NONE)
                snprintf(range, sizeof range, "%s%g; ", fd->min_open ? ">" : ">=", fd->min);
            else
                snprintf(range, sizeof range, "%s%g..%g%s; ", fd->min_open ? "(" : "",
                         fd->min, fd->max, fd->min_open ? "]" : "");
            break;
        default:
            break;
        }
        snprintf(tail, sizeof tail, "[%sdefault %s]", range,
                 fd->type == F_KEYS || fd->type == F_MODELS ? "none"
                 : *fd->def ? fd->def : "\"\"");
        help_line(f, left, fd->help, tail);
    }
}

/* ----------------------------------------------------------------- keys */

int dol_config_key_priority(const dol_config *c, const char *key)
{
    if (c->n_api_keys == 0) return c->default_priority;
    if (!key) return -1;
    /* Compare against every key without stopping early, so the time taken
     * does not tell how much of a guess was right. */
    size_t len = strlen(key);
    int found = -1;
    for (int i = 0; i < c->n_api_keys; i++) {
        const char *k = c->api_keys[i].key;
        size_t klen = strlen(k);
        unsigned diff = (unsigned)(klen != len);
        for (size_t j = 0; j < sizeof c->api_keys[i].key; j++) {
            unsigned char a = j < len ? (unsigned char)key[j] : 0;
            diff |= (unsigned)(a ^ (unsigned char)k[j]);
        }
        if (diff == 0 && found < 0) found = c->api_keys[i].priority;
    }
    return found;
}
