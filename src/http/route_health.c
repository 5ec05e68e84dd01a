/* src/http/route_health.c — the probes: GET /healthz (readiness,
 * docs/deployment.md: 503 while loading, warming up or draining, while
 * device memory has stayed above vram_unready_ratio for
 * vram_unready_after_s, or while the scheduler makes no progress with work
 * pending; JSON with the reasons and the memory, scheduler and KV-cache
 * figures) and GET /livez (liveness: the scheduler loop still ticks). What
 * readiness is made of lives in readiness.c. */
#include "http/http.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dolphin/log.h"

static const char *state_name(dol_server_state st)
{
    switch (st) {
    case DOL_STATE_LOADING: return "loading";
    case DOL_STATE_WARMING: return "warming";
    case DOL_STATE_READY: return "ready";
    default: return "draining";
    }
}

/* ---- GET /healthz, GET /livez ------------------------------------------- */

static void add_reason(cJSON *reasons, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_reason(cJSON *reasons, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON_AddItemToArray(reasons, cJSON_CreateString(msg));
}

enum MHD_Result dol_http_healthz(dol_http_req *c)
{
    const dol_config *cfg = c->srv->cfg;
    dol_http_readiness rd;
    dol_http_readiness_get(c->srv, &rd);
    const dol_scheduler_stats *st = &rd.st;
    dol_models *models = dol_http_models_of(c->srv);
    int n_models = models ? dol_models_count(models) : 0;

    cJSON *root = cJSON_CreateObject();
    cJSON *reasons = cJSON_CreateArray();
    if (!root || !reasons) {
        cJSON_Delete(root);
        cJSON_Delete(reasons);
        return dol_http_send_json(c, 500, NULL);
    }
    /* status: the state, or what keeps a READY server from serving */
    const char *status = state_name(rd.state);
    switch (rd.state) {
    case DOL_STATE_LOADING: add_reason(reasons, "model is loading"); break;
    case DOL_STATE_WARMING: add_reason(reasons, "warm-up in progress"); break;
    case DOL_STATE_DRAINING: add_reason(reasons, "server is draining"); break;
    default:
        if (!rd.models_ready) {
            add_reason(reasons, "a start-up model is not loaded");
            status = "loading";
        } else if (!rd.have_sched) {
            add_reason(reasons, "no scheduler");
            status = "stopping";
        }
        break;
    }
    if (rd.mem_unready) {
        add_reason(reasons,
                   "device memory use %.1f%% has stayed above vram_unready_ratio %.1f%% "
                   "for %.1f s (vram_unready_after_s %.1f)",
                   rd.mem_ratio * 100, cfg->vram_unready_ratio * 100, rd.mem_above_s,
                   cfg->vram_unready_after_s);
        if (rd.state == DOL_STATE_READY) status = "memory_pressure";
    }
    if (rd.stalled) {
        if (rd.progress_age_ms > DOL_HTTP_STALL_READY_MS)
            add_reason(reasons, "scheduler has made no progress for %.0f ms with work pending",
                       rd.progress_age_ms);
        else
            add_reason(reasons, "scheduler loop has not ticked for %.0f ms", rd.loop_age_ms);
        if (rd.state == DOL_STATE_READY) status = "stalled";
    }
    cJSON_AddStringToObject(root, "status", status);
    cJSON_AddBoolToObject(root, "ready", rd.ready);
    cJSON_AddStringToObject(root, "state", state_name(rd.state));
    cJSON_AddItemToObject(root, "reasons", reasons);
    /* "model": the first start-up model; "models": every one and its state */
    cJSON *ml = cJSON_CreateArray();
    const char *first = NULL;
    for (int i = 0; ml && i < n_models; i++) {
        dol_model_info in;
        dol_models_info(models, i, &in);
        if (in.startup && !first) first = in.name;
        cJSON *o = cJSON_CreateObject();
        if (!o) continue;
        cJSON_AddStringToObject(o, "id", in.name);
        cJSON_AddStringToObject(o, "state", dol_model_state_name(in.state));
        cJSON_AddBoolToObject(o, "startup", in.startup);
        if (in.file_format) {   /* once loaded: what it was loaded from */
            cJSON_AddStringToObject(o, "file_format", in.file_format);
            cJSON_AddStringToObject(o, "file_types", in.file_types);
        }
        if (in.has_stats) {   /* loaded: its own pool and devices (the totals below add them up) */
            const dol_scheduler_stats *ms = &in.stats;
            cJSON *kv = cJSON_AddObjectToObject(o, "kv_cache");
            if (kv) {
                const double tokens = (double)ms->kv_blocks_total * ms->kv_block_size;
                cJSON_AddNumberToObject(kv, "blocks_used", ms->kv_blocks_used);
                cJSON_AddNumberToObject(kv, "blocks_total", ms->kv_blocks_total);
                cJSON_AddNumberToObject(kv, "tokens_total", tokens);
                cJSON_AddNumberToObject(kv, "full_contexts",
                                        ms->context_len > 0 ? tokens / ms->context_len : 0.0);
                cJSON_AddStringToObject(kv, "dtype", ms->kv_dtype ? ms->kv_dtype : "f32");
                cJSON_AddStringToObject(kv, "dtype_k", ms->kv_dtype_k ? ms->kv_dtype_k : "f32");
                cJSON_AddStringToObject(kv, "dtype_v", ms->kv_dtype_v ? ms->kv_dtype_v : "f32");
            }
            cJSON *devs = cJSON_AddArrayToObject(o, "devices");
            for (int d = 0; devs && d < ms->n_devices; d++) {
                cJSON *dv = cJSON_CreateObject();
                if (!dv) break;
                cJSON_AddStringToObject(dv, "device", ms->devices[d].name);
                cJSON_AddNumberToObject(dv, "blocks", ms->devices[d].n_blocks);
                cJSON_AddNumberToObject(dv, "used_bytes", (double)ms->devices[d].used);
                cJSON_AddNumberToObject(dv, "total_bytes", (double)ms->devices[d].total);
                cJSON_AddItemToArray(devs, dv);
            }
        }
        cJSON_AddItemToArray(ml, o);
    }
    if (first) cJSON_AddStringToObject(root, "model", first);
    else cJSON_AddNullToObject(root, "model");
    if (ml) cJSON_AddItemToObject(root, "models", ml);
    if (rd.have_sched && st->backend) cJSON_AddStringToObject(root, "backend", st->backend);
    else cJSON_AddNullToObject(root, "backend");
    cJSON_AddNumberToObject(root, "inflight", dol_server_inflight(c->srv));

    /* the VRAM probe: the figures readiness watches, on both backends */
    cJSON *mem = cJSON_AddObjectToObject(root, "memory");
    if (mem) {
        bool device = rd.have_sched && st->backend && strcmp(st->backend, "cuda") == 0;
        cJSON_AddStringToObject(mem, "source", !rd.have_sched ? "none"
                                               : device      ? "device" : "kv_cache");
        cJSON_AddNumberToObject(mem, "used_bytes", (double)st->mem_used_bytes);
        cJSON_AddNumberToObject(mem, "total_bytes", (double)st->mem_total_bytes);
        cJSON_AddNumberToObject(mem, "ratio", rd.mem_ratio);
        cJSON_AddNumberToObject(mem, "unready_ratio", cfg->vram_unready_ratio);
        cJSON_AddNumberToObject(mem, "unready_after_s", cfg->vram_unready_after_s);
        cJSON_AddNumberToObject(mem, "above_for_s", rd.mem_above_s);
        cJSON_AddBoolToObject(mem, "unready", rd.mem_unready);
        cJSON_AddNumberToObject(mem, "weight_bytes", (double)st->weight_bytes);
        if (st->gpu_utilization >= 0)
            cJSON_AddNumberToObject(mem, "gpu_utilization_ratio", st->gpu_utilization);
        else
            cJSON_AddNullToObject(mem, "gpu_utilization_ratio");
        /* every device holding part of the model; used/total above is the fullest */
        cJSON *devs = cJSON_AddArrayToObject(mem, "devices");
        for (int i = 0; devs && rd.have_sched && i < st->n_devices; i++) {
            const dol_device_memory *d = &st->devices[i];
            cJSON *o = cJSON_CreateObject();
            if (!o) break;
            cJSON_AddStringToObject(o, "device", d->name);
            cJSON_AddNumberToObject(o, "blocks", d->n_blocks);
            cJSON_AddNumberToObject(o, "used_bytes", (double)d->used);
            cJSON_AddNumberToObject(o, "total_bytes", (double)d->total);
            cJSON_AddNumberToObject(o, "ratio", d->total ? (double)d->used / (double)d->total : 0);
            cJSON_AddItemToArray(devs, o);
        }
    }
    if (rd.have_sched) {
        cJSON *kv = cJSON_AddObjectToObject(root, "kv_cache");
        if (kv) {
            cJSON_AddNumberToObject(kv, "blocks_used", st->kv_blocks_used);
            cJSON_AddNumberToObject(kv, "blocks_total", st->kv_blocks_total);
            cJSON_AddNumberToObject(kv, "block_size", st->kv_block_size);
            const double tokens = (double)st->kv_blocks_total * st->kv_block_size;
            cJSON_AddNumberToObject(kv, "tokens_total", tokens);
            cJSON_AddNumberToObject(kv, "full_contexts",
                                    st->context_len > 0 ? tokens / st->context_len : 0.0);
            cJSON_AddStringToObject(kv, "dtype", st->kv_dtype ? st->kv_dtype : "f32");
            cJSON_AddStringToObject(kv, "dtype_k", st->kv_dtype_k ? st->kv_dtype_k : "f32");
            cJSON_AddStringToObject(kv, "dtype_v", st->kv_dtype_v ? st->kv_dtype_v : "f32");
            cJSON_AddNumberToObject(kv, "blocks_cached", st->kv_blocks_cached);
            cJSON_AddNumberToObject(kv, "prefix_cache_query_tokens",
                                    (double)st->prefix_cache_query_tokens);
            cJSON_AddNumberToObject(kv, "prefix_cache_hit_tokens",
                                    (double)st->prefix_cache_hit_tokens);
        }
        cJSON *sc = cJSON_AddObjectToObject(root, "scheduler");
        if (sc) {
            cJSON_AddNumberToObject(sc, "queued", st->queued);
            cJSON_AddNumberToObject(sc, "running_requests", st->running_requests);
            cJSON_AddNumberToObject(sc, "running_seqs", st->running_seqs);
            cJSON_AddNumberToObject(sc, "steps", (double)st->steps);
            cJSON_AddNumberToObject(sc, "tokens_prompt", (double)st->tokens_prompt);
            cJSON_AddNumberToObject(sc, "tokens_generated", (double)st->tokens_generated);
            cJSON_AddNumberToObject(sc, "stall_ms", rd.loop_age_ms);
            cJSON_AddNumberToObject(sc, "progress_age_ms", rd.progress_age_ms);
            cJSON_AddBoolToObject(sc, "idle", st->idle);
            cJSON_AddBoolToObject(sc, "draining", st->draining);
        }
    }
    return dol_http_send_cjson(c, rd.ready ? 200 : 503, root);
}

enum MHD_Result dol_http_livez(dol_http_req *c)
{
    dol_scheduler_stats st;
    double stalled = dol_http_sched_stats(c->srv, -1, &st)
                         ? dol_http_age_ms(st.last_step_ms, dol_now_ms()) : 0;
    cJSON *root = cJSON_CreateObject();
    bool alive = stalled <= DOL_HTTP_STALL_LIVE_MS;
    cJSON_AddStringToObject(root, "status", alive ? "alive" : "stalled");
    cJSON_AddNumberToObject(root, "stall_ms", stalled);
    return dol_http_send_cjson(c, alive ? 200 : 503, root);
}
