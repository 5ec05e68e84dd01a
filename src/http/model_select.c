/* src/http/model_select.c — the HTTP side of several models: which model a
 * request's body picks, the lease on it (include/dolphin/models.h), and
 * waiting for a model that loads with the connection suspended (the route
 * is dispatched again when the registry wakes it). Also the scheduler
 * calls of the handlers (submit, fit, figures), which go through the
 * registry, and the sum of every loaded model's figures that readiness and
 * /livez judge. */
#include "http/http.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

dol_models *dol_http_models_of(dol_server *s)
{
    pthread_mutex_lock(&s->mu);
    dol_models *m = s->models;
    pthread_mutex_unlock(&s->mu);
    return m;
}

dol_reason dol_http_sched_submit(dol_server *s, int idx, dol_request *r, dol_reason_info *why)
{
    dol_models *m = dol_http_models_of(s);
    if (!m) {
        *why = (dol_reason_info){.reason = DOL_REASON_DRAINING};
        return why->reason;
    }
    return dol_models_submit(m, idx, r, why);
}

dol_reason dol_http_sched_fit(dol_server *s, int idx, int n_prompt, int n, int max_new,
                              int *fit, dol_reason_info *why)
{
    dol_models *m = dol_http_models_of(s);
    if (!m) {
        *fit = 0;
        *why = (dol_reason_info){.reason = DOL_REASON_DRAINING};
        return why->reason;
    }
    return dol_models_fit(m, idx, n_prompt, n, max_new, fit, why);
}

/* Sum b into a: counts add up; clocks take the oldest; the device's own
 * memory figures (CUDA: the whole device) are not added twice. */
static void stats_add(dol_scheduler_stats *a, const dol_scheduler_stats *b, bool first)
{
    if (first) {
        *a = *b;
        return;
    }
    a->queued += b->queued;
    a->running_seqs += b->running_seqs;
    a->running_requests += b->running_requests;
    a->kv_blocks_total += b->kv_blocks_total;
    a->kv_blocks_used += b->kv_blocks_used;
    a->kv_blocks_cached += b->kv_blocks_cached;
    a->steps += b->steps;
    a->tokens_prompt += b->tokens_prompt;
    a->tokens_generated += b->tokens_generated;
    a->prefix_cache_query_tokens += b->prefix_cache_query_tokens;
    a->prefix_cache_hit_tokens += b->prefix_cache_hit_tokens;
    a->spec_proposed += b->spec_proposed;
    a->spec_accepted += b->spec_accepted;
    if (b->last_step_ms < a->last_step_ms) a->last_step_ms = b->last_step_ms;
    if (!b->idle && (a->idle || b->last_progress_ms < a->last_progress_ms))
        a->last_progress_ms = b->last_progress_ms;
    a->idle = a->idle && b->idle;
    a->draining = a->draining || b->draining;
    bool device = b->backend && strcmp(b->backend, "cuda") == 0;
    if (device) {
        if (b->mem_used_bytes > a->mem_used_bytes) a->mem_used_bytes = b->mem_used_bytes;
        if (b->mem_total_bytes > a->mem_total_bytes) a->mem_total_bytes = b->mem_total_bytes;
    } else {
        a->mem_used_bytes += b->mem_used_bytes;
        a->mem_total_bytes += b->mem_total_bytes;
    }
    a->weight_bytes += b->weight_bytes;
    if (b->gpu_utilization > a->gpu_utilization) a->gpu_utilization = b->gpu_utilization;
}

bool dol_http_sched_stats(dol_server *s, int idx, dol_scheduler_stats *st)
{
    memset(st, 0, sizeof *st);
    dol_models *m = dol_http_models_of(s);
    if (!m) return false;
    if (idx >= 0) return dol_models_sched_stats(m, idx, st);
    bool any = false;
    for (int i = 0; i < dol_models_count(m); i++) {
        dol_scheduler_stats x;
        if (!dol_models_sched_stats(m, i, &x)) continue;
        stats_add(st, &x, !any);
        any = true;
    }
    return any;
}

/* The registry's wake-up for a request waiting on a load: as a scheduler
 * event, it resumes the connection (or marks it pending). */
static void wake(void *user)
{
    dol_http_on_event(NULL, user);
}

/* The entry the body names (the body is parsed here, once, and kept for
 * the route); -1 with e (415, 400, 404). */
static int pick(dol_http_req *c, dol_models *m, dol_api_error *e)
{
    cJSON *body = dol_http_body_json(c, e);
    if (!body) return -1;
    const cJSON *mj = cJSON_GetObjectItemCaseSensitive(body, "model");
    /* a "model" that is not a string is the route parser's 400 to give */
    const char *id = cJSON_IsString(mj) ? mj->valuestring : NULL;
    int idx = dol_models_find(m, id);
    if (idx < 0) {
        char names[1024];
        dol_models_names(m, names, sizeof names);
        dol_api_error_set(e, 404, "invalid_request_error", "model", "model_not_found",
                          "The model '%.200s' does not exist; this server serves %s.", id, names);
    }
    return idx;
}

int dol_http_model_acquire(dol_http_req *c, dol_http_attached *a, dol_api_error *e)
{
    memset(a, 0, sizeof *a);
    /* a request that waited for a load goes on through a drain: the
     * registry decides (docs/configuration.md, "Several models") */
    if (!c->model_wait && dol_http_not_ready(c, e)) return -1;
    dol_models *m = dol_http_models_of(c->srv);
    if (!m) {
        dol_api_error_not_loaded(e);
        return -1;
    }
    if (!c->model[0]) {
        int idx = pick(c, m, e);
        if (idx < 0) return -1;
        c->model_idx = idx;
        snprintf(c->model, sizeof c->model, "%s", dol_models_name(m, idx));
    }
    double timeout_ms = c->srv->cfg->request_timeout_s * 1000.0;
    double deadline = timeout_ms > 0 ? c->t0_ms + timeout_ms : 0;
    for (;;) {
        if (deadline > 0 && dol_now_ms() >= deadline) {
            char what[300];
            snprintf(what, sizeof what, "model '%s' was still loading", c->model);
            dol_api_error_timeout(e, c->srv->cfg->request_timeout_s, what);
            return -1;
        }
        dol_model_lease lease;
        char reason[DOL_ERR_LEN] = "";
        double retry = 0;
        dol_acquire_result res = dol_models_acquire(m, c->model_idx, wake,
                                                    (void *)(uintptr_t)c->handle, deadline,
                                                    &lease, reason, sizeof reason, &retry);
        c->model_wait = res == DOL_ACQUIRE_WAIT;
        switch (res) {
        case DOL_ACQUIRE_OK:
            c->leased = true;
            a->model = lease.model;
            a->tok = lease.tok;
            a->has_sched = true;
            a->context_len = lease.context_len;
            a->model_idx = lease.index;
            snprintf(a->name, sizeof a->name, "%s", lease.name);
            return 0;
        case DOL_ACQUIRE_FAILED:
            c->retry_after_s = (int)ceil(retry);
            dol_api_error_set(e, 503, "service_unavailable", "model", "model_unavailable",
                              "The model '%s' is not available: %.300s", c->model, reason);
            return -1;
        case DOL_ACQUIRE_STOPPING:
            dol_api_error_draining(e);
            return -1;
        case DOL_ACQUIRE_WAIT:
            break;
        }
        switch (dol_http_suspend(c)) {
        case DOL_WAIT_SUSPENDED: return 1;
        case DOL_WAIT_PENDING: continue;   /* woken already: ask again */
        default:
            dol_models_cancel_wait(m, c->model_idx, (void *)(uintptr_t)c->handle);
            c->model_wait = false;
            dol_api_error_draining(e);
            return -1;
        }
    }
}

void dol_http_model_done(dol_http_req *c)
{
    dol_models *m = dol_http_models_of(c->srv);
    if (!m || !c->model[0]) return;
    if (c->model_wait) dol_models_cancel_wait(m, c->model_idx, (void *)(uintptr_t)c->handle);
    if (c->leased) dol_models_release(m, c->model_idx);
    c->model_wait = c->leased = false;
}
