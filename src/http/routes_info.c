/* src/http/routes_info.c — the read-only endpoints: GET /v1/models,
 * GET /v1/models/{id}, GET /healthz (readiness, docs/deployment.md: 503 while loading,
 * warming up or draining, while device memory has stayed above
 * vram_unready_ratio for vram_unready_after_s, or while the scheduler makes
 * no progress with work pending; JSON with the reasons and the memory,
 * scheduler and KV-cache figures) and GET /livez (liveness: the scheduler
 * loop still ticks). What readiness is made of lives in readiness.c. */
#include "http/http.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dolphin/log.h"

int dol_http_not_ready(dol_http_req *c, dol_api_error *e)
{
    switch (dol_server_get_state(c->srv)) {
    case DOL_STATE_READY:
        return 0;
    case DOL_STATE_LOADING:
        dol_api_error_set(e, 503, "service_unavailable", NULL, "model_loading",
                          "The model is still loading; retry shortly.");
        return -1;
    case DOL_STATE_WARMING:
        dol_api_error_set(e, 503, "service_unavailable", NULL, "model_warming",
                          "The model is warming up; retry shortly.");
        return -1;
    default:
        dol_api_error_set(e, 503, "service_unavailable", NULL, "server_draining",
                          "The server is shutting down and accepts no new requests.");
        return -1;
    }
}

/* One configured model as OpenAI's model object, with Dolphin's own
 * extension field "dolphin": its state, format, placement and counters
 * (docs/openapi.yaml, ModelExtension). */
static cJSON *model_object(const dol_server *s, const dol_model_info *in)
{
    const dol_model_entry *me = in->entry;
    cJSON *m = cJSON_CreateObject();
    cJSON *x = cJSON_CreateObject();
    if (!m || !x) {
        cJSON_Delete(m);
        cJSON_Delete(x);
        return NULL;
    }
    cJSON_AddStringToObject(m, "id", in->name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->started);
    cJSON_AddStringToObject(m, "owned_by", "dolphin");
    if (in->context_len > 0) cJSON_AddNumberToObject(m, "max_model_len", in->context_len);
    else cJSON_AddNullToObject(m, "max_model_len");
    cJSON_AddItemToObject(m, "dolphin", x);
    cJSON_AddStringToObject(x, "state", dol_model_state_name(in->state));
    cJSON_AddStringToObject(x, "format", in->weights);
    cJSON *pl = cJSON_AddObjectToObject(x, "placement");
    if (pl) {
        cJSON_AddStringToObject(pl, "backend", in->backend ? in->backend
                                : dol_config_choice_name("backend", me->backend));
        cJSON_AddNumberToObject(pl, "gpu_memory_utilization", me->gpu_memory_utilization);
        /* once loaded: the blocks each device holds (layer placement) */
        cJSON *devs = in->has_stats ? cJSON_AddArrayToObject(pl, "devices") : NULL;
        for (int i = 0; devs && i < in->stats.n_devices; i++) {
            const dol_device_memory *d = &in->stats.devices[i];
            cJSON *o = cJSON_CreateObject();
            if (!o) break;
            cJSON_AddStringToObject(o, "device", d->name);
            cJSON_AddNumberToObject(o, "first_block", d->first_block);
            cJSON_AddNumberToObject(o, "blocks", d->n_blocks);
            cJSON_AddBoolToObject(o, "embed", d->embed);
            cJSON_AddBoolToObject(o, "head", d->head);
            cJSON_AddNumberToObject(o, "weight_bytes", (double)d->weight_bytes);
            cJSON_AddItemToArray(devs, o);
        }
    }
    cJSON_AddBoolToObject(x, "pinned", me->pinned);
    cJSON *al = cJSON_AddArrayToObject(x, "aliases");
    for (int i = 0; al && i < me->n_aliases; i++)
        cJSON_AddItemToArray(al, cJSON_CreateString(me->aliases[i]));
    cJSON_AddNumberToObject(x, "memory_bytes", (double)in->bytes);
    cJSON_AddNumberToObject(x, "active_requests", in->leases);
    cJSON_AddNumberToObject(x, "waiting_requests", in->waiting);
    cJSON_AddNumberToObject(x, "loads", (double)in->loads);
    cJSON_AddNumberToObject(x, "unloads", (double)in->unloads);
    cJSON_AddNumberToObject(x, "load_failures", (double)in->load_failures);
    if (in->loads > 0) cJSON_AddNumberToObject(x, "last_load_seconds", in->last_load_s);
    else cJSON_AddNullToObject(x, "last_load_seconds");
    if (in->error[0]) cJSON_AddStringToObject(x, "error", in->error);
    else cJSON_AddNullToObject(x, "error");
    return m;
}

enum MHD_Result dol_http_models(dol_http_req *c, const char *id)
{
    dol_api_error e;
    if (dol_http_not_ready(c, &e)) return dol_http_send_error(c, &e);
    dol_models *models = dol_http_models_of(c->srv);
    int n = models ? dol_models_count(models) : 0;
    dol_model_info in;
    if (id) {
        int idx = models ? dol_models_find(models, id) : -1;
        if (idx < 0 || !id[0]) {
            dol_api_error_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                              "The model '%.200s' does not exist.", id);
            return dol_http_send_error(c, &e);
        }
        dol_models_info(models, idx, &in);
        return dol_http_send_cjson(c, 200, model_object(c->srv, &in));
    }
    cJSON *root = cJSON_CreateObject();
    cJSON *data = root ? cJSON_AddArrayToObject(root, "data") : NULL;
    if (root) cJSON_AddStringToObject(root, "object", "list");
    for (int i = 0; data && i < n; i++) {
        dol_models_info(models, i, &in);
        cJSON *m = model_object(c->srv, &in);
        if (!m) {
            data = NULL;
            break;
        }
        cJSON_AddItemToArray(data, m);
    }
    if (!data) {
        cJSON_Delete(root);
        return dol_http_send_json(c, 500, NULL);
    }
    return dol_http_send_cjson(c, 200, root);
}

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
