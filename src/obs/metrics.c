/* src/obs/metrics.c — the Prometheus figures of include/dolphin/metrics.h:
 * per-request counters and histograms kept under one mutex, and the text
 * exposition (format 0.0.4) that GET /metrics serves. Series are keyed by
 * route (a small fixed set chosen by the router), status and model (a
 * configured name, never what the client sent), so the number of series
 * stays bounded whatever clients send. */
#include "dolphin/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- bucket layouts (upper bounds in seconds; +Inf is implicit) ---------- */

/* Whole requests: from a probe (~1 ms) to a long generation (minutes). */
static const double DURATION_BUCKETS[] = {
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
};
/* Queue wait and time to first token: the latency users feel; fine around
 * the 500 ms alert threshold. */
static const double FIRST_TOKEN_BUCKETS[] = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 30, 60,
};
/* One decode step: ~1 ms for a small model, tens of ms for a 7B on a GPU,
 * up to seconds on a CPU. */
static const double PER_TOKEN_BUCKETS[] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5,
};

#define MAX_BUCKETS 16
#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct {
    uint64_t counts[MAX_BUCKETS + 1];   /* per bucket, not cumulative; last = +Inf */
    uint64_t count;
    double sum;
} histogram;

typedef enum { H_DURATION, H_QUEUE, H_TTFT, H_TPOT, N_HIST } hist_id;

static const struct {
    const char *name;
    const char *help;
    const double *bounds;
    int n_bounds;
} HISTS[N_HIST] = {
    [H_DURATION] = {"dolphin_request_duration_seconds",
                    "Time from the arrival of an HTTP request to its completion.",
                    DURATION_BUCKETS, N_OF(DURATION_BUCKETS)},
    [H_QUEUE] = {"dolphin_queue_time_seconds",
                 "Time a generation request waited in the scheduler's queue.",
                 FIRST_TOKEN_BUCKETS, N_OF(FIRST_TOKEN_BUCKETS)},
    [H_TTFT] = {"dolphin_time_to_first_token_seconds",
                "Time from the submission of a generation request to its first token.",
                FIRST_TOKEN_BUCKETS, N_OF(FIRST_TOKEN_BUCKETS)},
    [H_TPOT] = {"dolphin_time_per_output_token_seconds",
                "Mean time per generated token after the first, per request.",
                PER_TOKEN_BUCKETS, N_OF(PER_TOKEN_BUCKETS)},
};

#define LABEL_LEN 64

#define MODEL_LEN 256

typedef struct {
    char route[LABEL_LEN];
    char model[MODEL_LEN];
    histogram h[N_HIST];
} route_series;

typedef struct {
    char route[LABEL_LEN];
    char model[MODEL_LEN];
    int status;
    uint64_t n;
} request_count;

typedef struct {
    char model[MODEL_LEN];
    uint64_t prompt_tokens, generation_tokens;
} model_tokens;

struct dol_metrics {
    pthread_mutex_t mu;
    route_series *routes;
    int n_routes, cap_routes;
    request_count *counts;
    int n_counts, cap_counts;
    model_tokens *tokens;
    int n_tokens, cap_tokens;
};

dol_metrics *dol_metrics_new(void)
{
    dol_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

void dol_metrics_free(dol_metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m->routes);
    free(m->counts);
    free(m->tokens);
    free(m);
}

static dol_metrics *g_default;
static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;

static void make_default(void) { g_default = dol_metrics_new(); }

dol_metrics *dol_metrics_default(void)
{
    pthread_once(&g_default_once, make_default);
    return g_default;
}

/* ---- recording ------------------------------------------------------------ */

static void hist_observe(histogram *h, hist_id id, double v)
{
    if (!(v >= 0) || !isfinite(v)) return;
    int i = 0;
    while (i < HISTS[id].n_bounds && v > HISTS[id].bounds[i]) i++;
    h->counts[i]++;
    h->count++;
    h->sum += v;
}

static route_series *route_get(dol_metrics *m, const char *route, const char *model)
{
    for (int i = 0; i < m->n_routes; i++)
        if (strcmp(m->routes[i].route, route) == 0 && strcmp(m->routes[i].model, model) == 0)
            return &m->routes[i];
    if (m->n_routes == m->cap_routes) {
        int cap = m->cap_routes ? m->cap_routes * 2 : 8;
        route_series *n = realloc(m->routes, sizeof *n * (size_t)cap);
        if (!n) return NULL;
        m->routes = n;
        m->cap_routes = cap;
    }
    route_series *r = &m->routes[m->n_routes++];
    memset(r, 0, sizeof *r);
    snprintf(r->route, sizeof r->route, "%s", route);
    snprintf(r->model, sizeof r->model, "%s", model);
    return r;
}

static model_tokens *tokens_get(dol_metrics *m, const char *model)
{
    for (int i = 0; i < m->n_tokens; i++)
        if (strcmp(m->tokens[i].model, model) == 0) return &m->tokens[i];
    if (m->n_tokens == m->cap_tokens) {
        int cap = m->cap_tokens ? m->cap_tokens * 2 : 4;
        model_tokens *n = realloc(m->tokens, sizeof *n * (size_t)cap);
        if (!n) return NULL;
        m->tokens = n;
        m->cap_tokens = cap;
    }
    model_tokens *t = &m->tokens[m->n_tokens++];
    memset(t, 0, sizeof *t);
    snprintf(t->model, sizeof t->model, "%s", model);
    return t;
}

static request_count *count_get(dol_metrics *m, const char *route, int status,
                                const char *model)
{
    for (int i = 0; i < m->n_counts; i++)
        if (m->counts[i].status == status && strcmp(m->counts[i].route, route) == 0 &&
            strcmp(m->counts[i].model, model) == 0)
            return &m->counts[i];
    if (m->n_counts == m->cap_counts) {
        int cap = m->cap_counts ? m->cap_counts * 2 : 16;
        request_count *n = realloc(m->counts, sizeof *n * (size_t)cap);
        if (!n) return NULL;
        m->counts = n;
        m->cap_counts = cap;
    }
    request_count *c = &m->counts[m->n_counts++];
    memset(c, 0, sizeof *c);
    snprintf(c->route, sizeof c->route, "%s", route);
    snprintf(c->model, sizeof c->model, "%s", model);
    c->status = status;
    return c;
}

void dol_metrics_observe(dol_metrics *m, const dol_metrics_request *r)
{
    if (!m || !r) return;
    const char *route = r->route && r->route[0] ? r->route : "unknown";
    int status = r->status >= 100 && r->status <= 999 ? r->status : 0;
    const char *model = r->model ? r->model : "";
    pthread_mutex_lock(&m->mu);
    request_count *c = count_get(m, route, status, model);
    if (c) c->n++;
    route_series *s = route_get(m, route, model);
    if (s) {
        hist_observe(&s->h[H_DURATION], H_DURATION, r->duration_s);
        hist_observe(&s->h[H_QUEUE], H_QUEUE, r->queue_s);
        hist_observe(&s->h[H_TTFT], H_TTFT, r->ttft_s);
        hist_observe(&s->h[H_TPOT], H_TPOT, r->tpot_s);
    }
    if (r->prompt_tokens > 0 || r->completion_tokens > 0) {
        model_tokens *t = tokens_get(m, model);
        if (t && r->prompt_tokens > 0) t->prompt_tokens += (uint64_t)r->prompt_tokens;
        if (t && r->completion_tokens > 0) t->generation_tokens += (uint64_t)r->completion_tokens;
    }
    pthread_mutex_unlock(&m->mu);
}

/* ---- rendering ------------------------------------------------------------ */

typedef struct {
    char *buf;
    size_t len, cap;
    bool oom;
} out_buf;

static void put(out_buf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out_buf *o, const char *fmt, ...)
{
    if (o->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (n < 0) { o->oom = true; return; }
        if ((size_t)n < o->cap - o->len) { o->len += (size_t)n; return; }
        size_t cap = o->cap * 2;
        while (cap - o->len <= (size_t)n) cap *= 2;
        char *nb = realloc(o->buf, cap);
        if (!nb) { o->oom = true; return; }
        o->buf = nb;
        o->cap = cap;
    }
}

/* A label value with \, " and newline escaped as the format requires. */
static const char *label_value(const char *s, char *buf, size_t n)
{
    size_t o = 0;
    for (; s && *s && o + 3 < n; s++) {
        if (*s == '\\' || *s == '"') { buf[o++] = '\\'; buf[o++] = *s; }
        else if (*s == '\n') { buf[o++] = '\\'; buf[o++] = 'n'; }
        else buf[o++] = *s;
    }
    buf[o] = '\0';
    return buf;
}

static void family(out_buf *o, const char *name, const char *type, const char *help)
{
    put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void gauge(out_buf *o, const char *name, const char *help, double v)
{
    family(o, name, "gauge", help);
    put(o, "%s %.17g\n", name, v);
}

static void histogram_family(out_buf *o, const dol_metrics *m, hist_id id)
{
    const char *name = HISTS[id].name;
    family(o, name, "histogram", HISTS[id].help);
    for (int i = 0; i < m->n_routes; i++) {
        const route_series *s = &m->routes[i];
        const histogram *h = &s->h[id];
        /* a route that never had such a figure (/healthz has no first token)
         * gets no series */
        if (h->count == 0 && id != H_DURATION) continue;
        char route[2 * LABEL_LEN], model[2 * MODEL_LEN], lab[2 * LABEL_LEN + 2 * MODEL_LEN + 32];
        label_value(s->route, route, sizeof route);
        if (s->model[0])
            snprintf(lab, sizeof lab, "route=\"%s\",model=\"%s\"", route,
                     label_value(s->model, model, sizeof model));
        else
            snprintf(lab, sizeof lab, "route=\"%s\"", route);
        uint64_t cum = 0;
        for (int b = 0; b < HISTS[id].n_bounds; b++) {
            cum += h->counts[b];
            put(o, "%s_bucket{%s,le=\"%g\"} %llu\n", name, lab, HISTS[id].bounds[b],
                (unsigned long long)cum);
        }
        put(o, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, lab, (unsigned long long)h->count);
        put(o, "%s_sum{%s} %.17g\n", name, lab, h->sum);
        put(o, "%s_count{%s} %llu\n", name, lab, (unsigned long long)h->count);
    }
}

/* ---- per-model families -------------------------------------------------- */

typedef enum {
    MF_QUEUE, MF_RUN_REQ, MF_RUN_SEQ, MF_KV_USED, MF_KV_CAP, MF_KV_BS, MF_KV_RATIO,
    MF_KV_CACHED, MF_KV_TOKENS, MF_KV_CONTEXTS, MF_PC_Q, MF_PC_H, MF_SPEC_P, MF_SPEC_A, MF_SPEC_R, MF_MEM_USED, MF_MEM_TOTAL, MF_WEIGHTS, MF_STEPS, MF_HEART,
    MF_LOADED, MF_WAITING, MF_LOADS, MF_LOAD_FAILS, MF_UNLOADS, MF_LOAD_S, MF_LAST_LOAD_S,
} model_fig;

/* In model_fig order. per_entry: a sample for every configured model (not
 * only the loaded ones), and none at all without models. */
static const struct {
    const char *name, *type, *help;
    bool per_entry;
} MODEL_FAMILIES[] = {
    {"dolphin_queue_depth", "gauge", "Requests waiting in the scheduler's queue.", false},
    {"dolphin_running_requests", "gauge", "Requests in the running batch.", false},
    {"dolphin_running_sequences", "gauge",
     "Sequences in the running batch (the batch size; n > 1 counts each choice).", false},
    {"dolphin_kv_cache_blocks_used", "gauge", "KV-cache blocks in use.", false},
    {"dolphin_kv_cache_blocks_capacity", "gauge", "KV-cache blocks in the pool.", false},
    {"dolphin_kv_cache_block_size_tokens", "gauge", "Tokens per KV-cache block.", false},
    {"dolphin_kv_cache_usage_ratio", "gauge", "Fraction of the KV-cache pool in use.", false},
    {"dolphin_kv_cache_blocks_cached", "gauge",
     "KV-cache blocks no sequence holds that the prefix cache keeps (counted as free).", false},
    {"dolphin_kv_cache_tokens_capacity", "gauge", "Tokens the KV-cache pool holds in all.", false},
    {"dolphin_kv_cache_full_contexts", "gauge",
     "Full contexts (context_len tokens each) the KV-cache pool holds.", false},
    {"dolphin_prefix_cache_queries_total", "counter",
     "Prompt tokens looked up in the prefix cache.", false},
    {"dolphin_prefix_cache_hits_total", "counter",
     "Prompt tokens whose K/V came from the prefix cache.", false},
    {"dolphin_spec_proposed_tokens_total", "counter",
     "Speculative decoding: draft tokens proposed (and checked in a forward step).", false},
    {"dolphin_spec_accepted_tokens_total", "counter",
     "Speculative decoding: draft tokens the model agreed with (each one a forward step saved).", false},
    {"dolphin_spec_acceptance_ratio", "gauge",
     "Speculative decoding: accepted / proposed draft tokens so far (0 before any).", false},
    {"dolphin_device_memory_used_bytes", "gauge",
     "Device memory in use (CUDA: the whole device; CPU backend: the KV-cache pool).", false},
    {"dolphin_device_memory_total_bytes", "gauge",
     "Device memory in all (CUDA: the whole device; CPU backend: the KV-cache pool).", false},
    {"dolphin_weight_bytes", "gauge", "Resident bytes of the model weights as held.", false},
    {"dolphin_scheduler_steps_total", "counter", "Forward steps run by the scheduler.", false},
    {"dolphin_scheduler_heartbeat_age_seconds", "gauge",
     "Seconds since the scheduler loop last made progress with work pending (0 when idle).",
     false},
    {"dolphin_model_loaded", "gauge", "1 while the model is loaded, else 0.", true},
    {"dolphin_model_waiting_requests", "gauge", "Requests waiting for the model to load.", true},
    {"dolphin_model_loads_total", "counter", "Successful loads of the model.", true},
    {"dolphin_model_load_failures_total", "counter",
     "Failed loads of the model (errors, load_timeout_s, no room).", true},
    {"dolphin_model_unloads_total", "counter",
     "Unloads of the model to make room (least recently used first).", true},
    {"dolphin_model_load_seconds_total", "counter",
     "Seconds spent in the model's successful loads (warm-up included).", true},
    {"dolphin_model_last_load_seconds", "gauge",
     "Seconds the model's last successful load took (warm-up included).", true},
};

static double model_value(const dol_metrics_model *x, model_fig f)
{
    switch (f) {
    case MF_QUEUE: return x->queue_depth;
    case MF_RUN_REQ: return x->running_requests;
    case MF_RUN_SEQ: return x->running_seqs;
    case MF_KV_USED: return x->kv_blocks_used;
    case MF_KV_CAP: return x->kv_blocks_total;
    case MF_KV_BS: return x->kv_block_size;
    case MF_KV_RATIO:
        return x->kv_blocks_total > 0 ? (double)x->kv_blocks_used / x->kv_blocks_total : 0.0;
    case MF_KV_CACHED: return x->kv_blocks_cached;
    case MF_KV_TOKENS: return (double)x->kv_blocks_total * x->kv_block_size;
    case MF_KV_CONTEXTS:
        return x->context_len > 0 ? (double)x->kv_blocks_total * x->kv_block_size / x->context_len : 0.0;
    case MF_PC_Q: return (double)x->prefix_cache_query_tokens;
    case MF_PC_H: return (double)x->prefix_cache_hit_tokens;
    case MF_SPEC_P: return (double)x->spec_proposed;
    case MF_SPEC_A: return (double)x->spec_accepted;
    case MF_SPEC_R: return x->spec_proposed ? (double)x->spec_accepted / (double)x->spec_proposed : 0.0;
    case MF_MEM_USED: return (double)x->device_memory_used;
    case MF_MEM_TOTAL: return (double)x->device_memory_total;
    case MF_WEIGHTS: return (double)x->weight_bytes;
    case MF_STEPS: return (double)x->steps;
    case MF_HEART: return x->heartbeat_age_s;
    case MF_LOADED: return x->loaded ? 1 : 0;
    case MF_WAITING: return x->waiting;
    case MF_LOADS: return (double)x->loads;
    case MF_LOAD_FAILS: return (double)x->load_failures;
    case MF_UNLOADS: return (double)x->unloads;
    case MF_LOAD_S: return x->load_seconds_total;
    case MF_LAST_LOAD_S: return x->last_load_s;
    }
    return 0;
}

char *dol_metrics_render(dol_metrics *m, const dol_metrics_gauges *g, size_t *len)
{
    out_buf o = {malloc(8192), 0, 8192, false};
    if (!o.buf) return NULL;
    o.buf[0] = '\0';
    char a[128], b[128], c[300];

    family(&o, "dolphin_build_info", "gauge",
           "Always 1; the labels say which dolphind this is and what it serves.");
    put(&o, "dolphin_build_info{version=\"%s\",backend=\"%s\",model=\"%s\"} 1\n",
        label_value(g->version, a, sizeof a), label_value(g->backend, b, sizeof b),
        label_value(g->model, c, sizeof c));
    gauge(&o, "dolphin_ready", "1 when GET /healthz answers 200 (loaded, warmed up, not draining, "
          "memory and scheduler healthy), else 0.", g->ready ? 1 : 0);
    gauge(&o, "dolphin_draining", "1 after SIGTERM/SIGINT while in-flight requests finish.",
          g->draining ? 1 : 0);

    if (m) pthread_mutex_lock(&m->mu);
    family(&o, "dolphin_requests_total", "counter",
           "HTTP requests completed, by route and status (499: the client left first).");
    for (int i = 0; m && i < m->n_counts; i++) {
        char ml[2 * MODEL_LEN + 16] = "";
        if (m->counts[i].model[0])
            snprintf(ml, sizeof ml, ",model=\"%s\"", label_value(m->counts[i].model, c, sizeof c));
        put(&o, "dolphin_requests_total{route=\"%s\",status=\"%d\"%s} %llu\n",
            label_value(m->counts[i].route, a, sizeof a), m->counts[i].status, ml,
            (unsigned long long)m->counts[i].n);
    }
    if (m) {
        for (int h = 0; h < N_HIST; h++) histogram_family(&o, m, (hist_id)h);
    } else {
        for (int h = 0; h < N_HIST; h++) family(&o, HISTS[h].name, "histogram", HISTS[h].help);
    }
    static const char *const TOKEN_FAMILIES[2][2] = {
        {"dolphin_prompt_tokens_total", "Prompt tokens of completed generation requests."},
        {"dolphin_generation_tokens_total", "Tokens generated for completed requests (all choices)."},
    };
    for (int f = 0; f < 2; f++) {
        family(&o, TOKEN_FAMILIES[f][0], "counter", TOKEN_FAMILIES[f][1]);
        if (!m || m->n_tokens == 0) put(&o, "%s 0\n", TOKEN_FAMILIES[f][0]);
        for (int i = 0; m && i < m->n_tokens; i++) {
            uint64_t v = f == 0 ? m->tokens[i].prompt_tokens : m->tokens[i].generation_tokens;
            if (m->tokens[i].model[0])
                put(&o, "%s{model=\"%s\"} %llu\n", TOKEN_FAMILIES[f][0],
                    label_value(m->tokens[i].model, c, sizeof c), (unsigned long long)v);
            else
                put(&o, "%s %llu\n", TOKEN_FAMILIES[f][0], (unsigned long long)v);
        }
    }
    if (m) pthread_mutex_unlock(&m->mu);

    gauge(&o, "dolphin_inflight_requests",
          "Generation requests accepted and not yet completed.", g->inflight);
    /* the per-model figures: one sample per loaded model (per configured
     * model for the load counters), or unlabelled from g without models */
    dol_metrics_model one = {
        .name = NULL, .loaded = true, .queue_depth = g->queue_depth,
        .running_requests = g->running_requests, .running_seqs = g->running_seqs,
        .kv_blocks_used = g->kv_blocks_used, .kv_blocks_total = g->kv_blocks_total,
        .kv_block_size = g->kv_block_size, .kv_blocks_cached = g->kv_blocks_cached,
        .context_len = g->context_len, .kv_dtype_k = g->kv_dtype_k, .kv_dtype_v = g->kv_dtype_v,
        .prefix_cache_query_tokens = g->prefix_cache_query_tokens,
        .prefix_cache_hit_tokens = g->prefix_cache_hit_tokens,
        .spec_proposed = g->spec_proposed, .spec_accepted = g->spec_accepted,
        .device_memory_used = g->device_memory_used, .device_memory_total = g->device_memory_total,
        .weight_bytes = g->weight_bytes, .steps = g->steps, .heartbeat_age_s = g->heartbeat_age_s,
        .n_devices = g->n_devices,
    };
    memcpy(one.devices, g->devices, sizeof one.devices);
    const dol_metrics_model *ms = g->n_models > 0 ? g->models : &one;
    int n_ms = g->n_models > 0 ? g->n_models : 1;
    for (size_t f = 0; f < sizeof MODEL_FAMILIES / sizeof MODEL_FAMILIES[0]; f++) {
        const char *name = MODEL_FAMILIES[f].name;
        bool per_entry = MODEL_FAMILIES[f].per_entry;
        if (per_entry && g->n_models == 0) {
            family(&o, name, MODEL_FAMILIES[f].type, MODEL_FAMILIES[f].help);
            continue;
        }
        family(&o, name, MODEL_FAMILIES[f].type, MODEL_FAMILIES[f].help);
        /* counters go on (from the loads before) while unloaded */
        bool counter = strcmp(MODEL_FAMILIES[f].type, "counter") == 0;
        for (int i = 0; i < n_ms; i++) {
            if (!per_entry && !counter && !ms[i].loaded) continue;
            double v = model_value(&ms[i], (model_fig)f);
            if (ms[i].name)
                put(&o, "%s{model=\"%s\"} %.17g\n", name, label_value(ms[i].name, c, sizeof c), v);
            else
                put(&o, "%s %.17g\n", name, v);
        }
        if (f == MF_KV_CACHED) {   /* keep the exposition's old order */
            family(&o, "dolphin_gpu_utilization_ratio", "gauge",
                   "Fraction of time a kernel ran on the GPU over NVML's last sample period "
                   "(no sample without NVML).");
            if (g->gpu_utilization >= 0)
                put(&o, "dolphin_gpu_utilization_ratio %.17g\n", g->gpu_utilization);
        }
    }
    /* the KV cache's element types, as labels of an info gauge */
    family(&o, "dolphin_kv_cache_info", "gauge",
           "Always 1; the labels give the KV cache's element type per half (f32, f16, q8_0).");
    for (int i = 0; i < n_ms; i++) {
        if (!ms[i].loaded || !ms[i].kv_dtype_k || !ms[i].kv_dtype_v) continue;
        if (ms[i].name)
            put(&o, "dolphin_kv_cache_info{model=\"%s\",dtype_k=\"%s\",dtype_v=\"%s\"} 1\n",
                label_value(ms[i].name, c, sizeof c), ms[i].kv_dtype_k, ms[i].kv_dtype_v);
        else
            put(&o, "dolphin_kv_cache_info{dtype_k=\"%s\",dtype_v=\"%s\"} 1\n", ms[i].kv_dtype_k,
                ms[i].kv_dtype_v);
    }
    /* memory and blocks per device holding part of a loaded model */
    static const struct { const char *name, *help; } DEV_FAMILIES[] = {
        {"dolphin_device_memory_per_device_used_bytes",
         "Memory in use on each device holding part of the model (CUDA: the whole device; "
         "cpu: its KV-cache pool)."},
        {"dolphin_device_memory_per_device_total_bytes",
         "Memory in all on each device holding part of the model (CUDA: the whole device; "
         "cpu: its KV-cache pool)."},
        {"dolphin_device_blocks", "Transformer blocks each device holds."},
    };
    for (int f = 0; f < 3; f++) {
        family(&o, DEV_FAMILIES[f].name, "gauge", DEV_FAMILIES[f].help);
        for (int i = 0; i < n_ms; i++) {
            if (!ms[i].loaded) continue;
            for (int d = 0; d < ms[i].n_devices && d < DOL_METRICS_MAX_DEVICES; d++) {
                const dol_metrics_device *dv = &ms[i].devices[d];
                double v = f == 0 ? (double)dv->used : f == 1 ? (double)dv->total : dv->blocks;
                if (ms[i].name) {
                    char dl[128];
                    put(&o, "%s{model=\"%s\",device=\"%s\"} %.17g\n", DEV_FAMILIES[f].name,
                        label_value(ms[i].name, c, sizeof c), label_value(dv->name, dl, sizeof dl), v);
                } else {
                    put(&o, "%s{device=\"%s\"} %.17g\n", DEV_FAMILIES[f].name, dv->name, v);
                }
            }
        }
    }

    if (o.oom) {
        free(o.buf);
        return NULL;
    }
    if (len) *len = o.len;
    return o.buf;
}
