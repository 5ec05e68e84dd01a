/* src/http/route_metrics.c — GET /metrics (Prometheus text format, docs/deployment.md)
 * and the hook that records every completed HTTP request into the
 * process-wide dol_metrics (include/dolphin/metrics.h). The per-request
 * figures are the ones the request's log line carries; the gauges are read
 * at scrape time from the readiness view (scheduler stats, device memory)
 * and from NVML when present. */
#include "http/http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dolphin/metrics.h"

void dol_http_metrics_record(const dol_http_req *c, int status, int prompt_tokens,
                             int completion_tokens, double queue_ms, double ttft_ms,
                             double total_ms, int n_seqs)
{
    dol_metrics_request m = {
        .route = c->route,
        .model = c->model,
        .status = status,
        .duration_s = total_ms / 1000.0,
        .prompt_tokens = prompt_tokens,
        .completion_tokens = completion_tokens,
        .queue_s = -1,
        .ttft_s = -1,
        .tpot_s = -1,
    };
    if (n_seqs > 0) {   /* it reached the scheduler */
        if (queue_ms > 0) m.queue_s = queue_ms / 1000.0;
        if (ttft_ms > 0) m.ttft_s = ttft_ms / 1000.0;
        /* sequences decode side by side: per-sequence tokens after the first */
        int per_seq = n_seqs > 0 ? completion_tokens / n_seqs : 0;
        if (ttft_ms > 0 && per_seq >= 2 && total_ms > ttft_ms)
            m.tpot_s = (total_ms - ttft_ms) / 1000.0 / (per_seq - 1);
    }
    dol_metrics_observe(dol_metrics_default(), &m);
}

enum MHD_Result dol_http_metrics(dol_http_req *c)
{
    dol_http_readiness rd;
    dol_http_readiness_get(c->srv, &rd);
    dol_models *models = dol_http_models_of(c->srv);
    int n_models = models ? dol_models_count(models) : 0;
    dol_metrics_model ms[DOL_MAX_MODELS];
    for (int i = 0; i < n_models; i++) {
        dol_model_info in;
        dol_models_info(models, i, &in);
        const dol_scheduler_stats *st = &in.stats;
        ms[i] = (dol_metrics_model){
            .name = in.name, .loaded = in.has_stats, .waiting = in.waiting,
            .queue_depth = st->queued, .running_requests = st->running_requests,
            .running_seqs = st->running_seqs, .kv_blocks_used = st->kv_blocks_used,
            .kv_blocks_total = st->kv_blocks_total, .kv_block_size = st->kv_block_size,
            .kv_blocks_cached = st->kv_blocks_cached, .context_len = st->context_len,
            .kv_dtype_k = st->kv_dtype_k, .kv_dtype_v = st->kv_dtype_v,
            .prefix_cache_query_tokens = st->prefix_cache_query_tokens,
            .prefix_cache_hit_tokens = st->prefix_cache_hit_tokens,
            .spec_proposed = st->spec_proposed, .spec_accepted = st->spec_accepted,
            .device_memory_used = st->mem_used_bytes, .device_memory_total = st->mem_total_bytes,
            .weight_bytes = st->weight_bytes, .steps = st->steps,
            .heartbeat_age_s = st->idle ? 0 : dol_http_age_ms(st->last_progress_ms, dol_now_ms()) / 1000.0,
            .loads = in.loads, .load_failures = in.load_failures, .unloads = in.unloads,
            .load_seconds_total = in.load_seconds_total, .last_load_s = in.last_load_s,
        };
        /* copied: `in` ends with this iteration */
        for (int d = 0; in.has_stats && d < st->n_devices && d < DOL_METRICS_MAX_DEVICES; d++) {
            dol_metrics_device *dv = &ms[i].devices[d];
            snprintf(dv->name, sizeof dv->name, "%s", st->devices[d].name);
            dv->used = st->devices[d].used;
            dv->total = st->devices[d].total;
            dv->blocks = st->devices[d].n_blocks;
            ms[i].n_devices = d + 1;
        }
    }

    dol_metrics_gauges g = {0};
    g.models = ms;
    g.n_models = n_models;
    g.version = DOL_VERSION;
    g.backend = rd.have_sched && rd.st.backend ? rd.st.backend : "";
    dol_model_info first;
    if (n_models > 0) dol_models_info(models, 0, &first);
    g.model = n_models > 0 ? first.name : "";
    g.ready = rd.ready;
    g.draining = rd.state == DOL_STATE_DRAINING;
    g.inflight = dol_server_inflight(c->srv);
    g.queue_depth = rd.st.queued;
    g.running_requests = rd.st.running_requests;
    g.running_seqs = rd.st.running_seqs;
    g.kv_blocks_used = rd.st.kv_blocks_used;
    g.kv_blocks_total = rd.st.kv_blocks_total;
    g.kv_block_size = rd.st.kv_block_size;
    g.kv_blocks_cached = rd.st.kv_blocks_cached;
    g.context_len = rd.st.context_len;
    g.kv_dtype_k = rd.have_sched ? rd.st.kv_dtype_k : NULL;
    g.kv_dtype_v = rd.have_sched ? rd.st.kv_dtype_v : NULL;
    g.prefix_cache_query_tokens = rd.st.prefix_cache_query_tokens;
    g.prefix_cache_hit_tokens = rd.st.prefix_cache_hit_tokens;
    g.spec_proposed = rd.st.spec_proposed;
    g.spec_accepted = rd.st.spec_accepted;
    g.device_memory_used = rd.st.mem_used_bytes;
    g.device_memory_total = rd.st.mem_total_bytes;
    for (int i = 0; i < rd.st.n_devices && g.n_devices < DOL_METRICS_MAX_DEVICES; i++, g.n_devices++) {
        snprintf(g.devices[i].name, sizeof g.devices[i].name, "%s", rd.st.devices[i].name);
        g.devices[i].used = rd.st.devices[i].used;
        g.devices[i].total = rd.st.devices[i].total;
        g.devices[i].blocks = rd.st.devices[i].n_blocks;
    }
    g.weight_bytes = rd.st.weight_bytes;
    g.gpu_utilization = rd.have_sched ? rd.st.gpu_utilization : -1.0;
    g.steps = rd.st.steps;
    g.heartbeat_age_s = rd.progress_age_ms / 1000.0;

    size_t len = 0;
    char *body = dol_metrics_render(dol_metrics_default(), &g, &len);
    if (!body) return dol_http_send_json(c, 500, NULL);
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    return dol_http_queue(c, 200, resp, PH_RESPONDED);
}
