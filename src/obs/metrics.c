/* src/obs/metrics.c — the Prometheus figures of include/dolphin/metrics.h:
 * per-request counters and histograms kept under one mutex, and the text
 * exposition (format 0.0.4) that GET /metrics serves. Series are keyed by
 * route (a small fixed set chosen by the router) and status, so the number
 * of series stays bounded whatever clients send. */
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

typedef struct {
    char route[LABEL_LEN];
    histogram h[N_HIST];
} route_series;

typedef struct {
    char route[LABEL_LEN];
    int status;
    uint64_t n;
} request_count;

struct dol_metrics {
    pthread_mutex_t mu;
    route_series *routes;
    int n_routes, cap_routes;
    request_count *counts;
    int n_counts, cap_counts;
    uint64_t prompt_tokens, generation_tokens;
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

static route_series *route_get(dol_metrics *m, const char *route)
{
    for (int i = 0; i < m->n_routes; i++)
        if (strcmp(m->routes[i].route, route) == 0) return &m->routes[i];
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
    return r;
}

static request_count *count_get(dol_metrics *m, const char *route, int status)
{
    for (int i = 0; i < m->n_counts; i++)
        if (m->counts[i].status == status && strcmp(m->counts[i].route, route) == 0)
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
    c->status = status;
    return c;
}

void dol_metrics_observe(dol_metrics *m, const dol_metrics_request *r)
{
    if (!m || !r) return;
    const char *route = r->route && r->route[0] ? r->route : "unknown";
    int status = r->status >= 100 && r->status <= 999 ? r->status : 0;
    pthread_mutex_lock(&m->mu);
    request_count *c = count_get(m, route, status);
    if (c) c->n++;
    route_series *s = route_get(m, route);
    if (s) {
        hist_observe(&s->h[H_DURATION], H_DURATION, r->duration_s);
        hist_observe(&s->h[H_QUEUE], H_QUEUE, r->queue_s);
        hist_observe(&s->h[H_TTFT], H_TTFT, r->ttft_s);
        hist_observe(&s->h[H_TPOT], H_TPOT, r->tpot_s);
    }
    if (r->prompt_tokens > 0) m->prompt_tokens += (uint64_t)r->prompt_tokens;
    if (r->completion_tokens > 0) m->generation_tokens += (uint64_t)r->completion_tokens;
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

static void counter(out_buf *o, const char *name, const char *help, uint64_t v)
{
    family(o, name, "counter", help);
    put(o, "%s %llu\n", name, (unsigned long long)v);
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
        char route[2 * LABEL_LEN];
        label_value(s->route, route, sizeof route);
        uint64_t cum = 0;
        for (int b = 0; b < HISTS[id].n_bounds; b++) {
            cum += h->counts[b];
            put(o, "%s_bucket{route=\"%s\",le=\"%g\"} %llu\n", name, route, HISTS[id].bounds[b],
                (unsigned long long)cum);
        }
        put(o, "%s_bucket{route=\"%s\",le=\"+Inf\"} %llu\n", name, route,
            (unsigned long long)h->count);
        put(o, "%s_sum{route=\"%s\"} %.17g\n", name, route, h->sum);
        put(o, "%s_count{route=\"%s\"} %llu\n", name, route, (unsigned long long)h->count);
    }
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
    for (int i = 0; m && i < m->n_counts; i++)
        put(&o, "dolphin_requests_total{route=\"%s\",status=\"%d\"} %llu\n",
            label_value(m->counts[i].route, a, sizeof a), m->counts[i].status,
            (unsigned long long)m->counts[i].n);
    if (m) {
        for (int h = 0; h < N_HIST; h++) histogram_family(&o, m, (hist_id)h);
    } else {
        for (int h = 0; h < N_HIST; h++) family(&o, HISTS[h].name, "histogram", HISTS[h].help);
    }
    counter(&o, "dolphin_prompt_tokens_total", "Prompt tokens of completed generation requests.",
            m ? m->prompt_tokens : 0);
    counter(&o, "dolphin_generation_tokens_total",
            "Tokens generated for completed requests (all choices).",
            m ? m->generation_tokens : 0);
    if (m) pthread_mutex_unlock(&m->mu);

    gauge(&o, "dolphin_inflight_requests",
          "Generation requests accepted and not yet completed.", g->inflight);
    gauge(&o, "dolphin_queue_depth", "Requests waiting in the scheduler's queue.", g->queue_depth);
    gauge(&o, "dolphin_running_requests", "Requests in the running batch.", g->running_requests);
    gauge(&o, "dolphin_running_sequences",
          "Sequences in the running batch (the batch size; n > 1 counts each choice).",
          g->running_seqs);
    gauge(&o, "dolphin_kv_cache_blocks_used", "KV-cache blocks in use.", g->kv_blocks_used);
    gauge(&o, "dolphin_kv_cache_blocks_capacity", "KV-cache blocks in the pool.",
          g->kv_blocks_total);
    gauge(&o, "dolphin_kv_cache_block_size_tokens", "Tokens per KV-cache block.",
          g->kv_block_size);
    gauge(&o, "dolphin_kv_cache_usage_ratio", "Fraction of the KV-cache pool in use.",
          g->kv_blocks_total > 0 ? (double)g->kv_blocks_used / g->kv_blocks_total : 0.0);
    gauge(&o, "dolphin_kv_cache_blocks_cached",
          "KV-cache blocks no sequence holds that the prefix cache keeps (counted as free).",
          g->kv_blocks_cached);
    counter(&o, "dolphin_prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache.", g->prefix_cache_query_tokens);
    counter(&o, "dolphin_prefix_cache_hits_total",
            "Prompt tokens whose K/V came from the prefix cache.", g->prefix_cache_hit_tokens);
    gauge(&o, "dolphin_device_memory_used_bytes",
          "Device memory in use (CUDA: the whole device; CPU backend: the KV-cache pool).",
          (double)g->device_memory_used);
    gauge(&o, "dolphin_device_memory_total_bytes",
          "Device memory in all (CUDA: the whole device; CPU backend: the KV-cache pool).",
          (double)g->device_memory_total);
    family(&o, "dolphin_device_memory_per_device_used_bytes", "gauge",
           "Memory in use on each device holding part of the model (CUDA: the whole device; "
           "cpu: its KV-cache pool).");
    for (int i = 0; i < g->n_devices && i < DOL_METRICS_MAX_DEVICES; i++)
        put(&o, "dolphin_device_memory_per_device_used_bytes{device=\"%s\"} %.17g\n", g->devices[i].name,
            (double)g->devices[i].used);
    family(&o, "dolphin_device_memory_per_device_total_bytes", "gauge",
           "Memory in all on each device holding part of the model (CUDA: the whole device; "
           "cpu: its KV-cache pool).");
    for (int i = 0; i < g->n_devices && i < DOL_METRICS_MAX_DEVICES; i++)
        put(&o, "dolphin_device_memory_per_device_total_bytes{device=\"%s\"} %.17g\n", g->devices[i].name,
            (double)g->devices[i].total);
    family(&o, "dolphin_device_blocks", "gauge", "Transformer blocks each device holds.");
    for (int i = 0; i < g->n_devices && i < DOL_METRICS_MAX_DEVICES; i++)
        put(&o, "dolphin_device_blocks{device=\"%s\"} %d\n", g->devices[i].name, g->devices[i].blocks);
    family(&o, "dolphin_gpu_utilization_ratio", "gauge",
           "Fraction of time a kernel ran on the GPU over NVML's last sample period "
           "(no sample without NVML).");
    if (g->gpu_utilization >= 0) put(&o, "dolphin_gpu_utilization_ratio %.17g\n", g->gpu_utilization);
    gauge(&o, "dolphin_weight_bytes", "Resident bytes of the model weights as held.",
          (double)g->weight_bytes);
    counter(&o, "dolphin_scheduler_steps_total", "Forward steps run by the scheduler.", g->steps);
    gauge(&o, "dolphin_scheduler_heartbeat_age_seconds",
          "Seconds since the scheduler loop last made progress with work pending (0 when idle).",
          g->heartbeat_age_s);

    if (o.oom) {
        free(o.buf);
        return NULL;
    }
    if (len) *len = o.len;
    return o.buf;
}
