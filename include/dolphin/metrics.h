/* include/dolphin/metrics.h — the figures behind GET /metrics (docs/deployment.md), in
 * the Prometheus text exposition format (version 0.0.4).
 *
 * Two kinds of figures:
 * - per-request ones (counters and histograms), recorded by the HTTP layer
 *   once per request when it completes (dol_metrics_observe): requests by
 *   route and status, request duration, queue time, time to first token,
 *   time per output token, prompt and generated tokens;
 * - point-in-time ones (gauges), gathered by the caller at scrape time and
 *   passed to dol_metrics_render: readiness, queue depth, running batch,
 *   KV-cache blocks, device memory, weights, GPU utilisation.
 *
 * Every name starts with dolphin_ and carries its unit (_seconds, _bytes,
 * _ratio, _total for counters). A family whose value is unknown on this
 * machine (dolphin_gpu_utilization_ratio without NVML) is still declared
 * (# HELP / # TYPE) but has no sample, so that the name exists for alert
 * rules and dashboards while no made-up value is reported.
 *
 * Thread-safe: one mutex per dol_metrics guards the per-request figures.
 */
#ifndef DOLPHIN_METRICS_H
#define DOLPHIN_METRICS_H

#include "dolphin/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dol_metrics dol_metrics;

dol_metrics *dol_metrics_new(void);   /* NULL on OOM */
void dol_metrics_free(dol_metrics *m);
/* The process-wide instance that the HTTP server records into and renders
 * (created on first use, lives as long as the process). NULL on OOM. */
dol_metrics *dol_metrics_default(void);

/* One completed HTTP request. Negative times mean "does not apply" (no
 * generation, no token, fewer than two tokens per sequence). */
typedef struct {
    const char *route;       /* route label, e.g. "/v1/completions", "unknown" */
    const char *model;       /* the model it asked for (a configured name), or
                                NULL / "" for routes without one: the `model`
                                label of its series */
    int status;              /* HTTP status; 499 when the client left first */
    double duration_s;       /* from the request's arrival to its completion */
    int prompt_tokens;       /* prompt tokens of the generation it asked for */
    int completion_tokens;   /* tokens generated for it, all choices */
    double queue_s;          /* waiting in the scheduler's queue */
    double ttft_s;           /* time to the first generated token */
    double tpot_s;           /* mean time per output token after the first */
} dol_metrics_request;

void dol_metrics_observe(dol_metrics *m, const dol_metrics_request *r);

/* Most devices one model lists (the GPUs of a placement and the CPU). */
#define DOL_METRICS_MAX_DEVICES 9

/* One device holding part of a model (layer placement), in order. */
typedef struct {
    char name[16];           /* "cuda:0", "cuda:1", "cpu" (a copy) */
    size_t used, total;      /* bytes (the CPU: its KV pool) */
    int blocks;              /* transformer blocks held there */
} dol_metrics_device;

/* One configured model at scrape time: its scheduler's figures (when
 * loaded) and its load / unload counters. Rendered with a `model` label. */
typedef struct {
    const char *name;
    bool loaded;             /* the scheduler figures below hold */
    int waiting;             /* requests waiting for its load */
    int queue_depth, running_requests, running_seqs;
    int kv_blocks_used, kv_blocks_total, kv_block_size, kv_blocks_cached;
    int context_len;         /* tokens of one full context */
    const char *kv_dtype_k, *kv_dtype_v; /* the KV cache halves' element types */
    uint64_t prefix_cache_query_tokens, prefix_cache_hit_tokens;
    uint64_t spec_proposed, spec_accepted; /* speculative decoding's drafts */
    size_t device_memory_used, device_memory_total, weight_bytes;
    uint64_t steps;
    double heartbeat_age_s;
    uint64_t loads, load_failures, unloads;
    double load_seconds_total, last_load_s;
    int n_devices;           /* the devices holding it, when loaded */
    dol_metrics_device devices[DOL_METRICS_MAX_DEVICES];
} dol_metrics_model;

/* Point-in-time values for one scrape. With n_models > 0 the per-model
 * gauges (queue, batch, KV cache, memory, weights, steps, heartbeat) come
 * from models[] with a `model` label, one sample per loaded model, and the
 * same fields below are not used; with none they come from below,
 * unlabelled. */
typedef struct {
    const dol_metrics_model *models;
    int n_models;
    const char *version;     /* build info labels */
    const char *backend;     /* "cpu" | "cuda" | "" while loading */
    const char *model;       /* served model name, "" while loading */
    bool ready;              /* /healthz would answer 200 */
    bool draining;
    int inflight;            /* HTTP requests submitted, not yet completed */
    int queue_depth;         /* requests waiting for admission */
    int running_requests;
    int running_seqs;        /* sequences in the running batch */
    int kv_blocks_used, kv_blocks_total, kv_block_size;
    int kv_blocks_cached;    /* unused blocks the prefix cache keeps */
    int context_len;         /* tokens of one full context */
    const char *kv_dtype_k, *kv_dtype_v; /* the KV cache halves' element types */
    uint64_t prefix_cache_query_tokens, prefix_cache_hit_tokens;
    uint64_t spec_proposed, spec_accepted; /* speculative decoding's drafts */
    size_t device_memory_used, device_memory_total; /* bytes */
    /* every device holding part of the model (layer placement), in order;
     * like the gauges above, used only when n_models is 0 */
    int n_devices;
    dol_metrics_device devices[DOL_METRICS_MAX_DEVICES];
    size_t weight_bytes;
    double gpu_utilization;  /* 0..1; < 0 when unknown (no NVML) */
    uint64_t steps;          /* forward steps so far */
    double heartbeat_age_s;  /* since the scheduler loop last made progress */
} dol_metrics_gauges;

/* The whole exposition as a malloc'd NUL-terminated string (*len without
 * the NUL), or NULL on OOM. */
char *dol_metrics_render(dol_metrics *m, const dol_metrics_gauges *g, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
