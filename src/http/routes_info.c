/* src/http/routes_info.c — the read-only endpoints: GET /v1/models,
 * GET /v1/models/{id}, GET /healthz (readiness, with reasons and scheduler /
 * KV-cache figures) and GET /livez (liveness: the scheduler heartbeat). */
#include "http/http.h"

#include <stdio.h>
#include <string.h>

/* A scheduler loop that has not finished an iteration for this long (it
 * ticks at least every 200 ms, idle or not) is considered stuck: first for
 * readiness, then for liveness. */
#define STALL_READY_MS 30000.0
#define STALL_LIVE_MS 60000.0

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

static cJSON *model_object(const dol_server *s, const dol_http_attached *a)
{
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    cJSON_AddStringToObject(m, "id", a->name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->started);
    cJSON_AddStringToObject(m, "owned_by", "dolphin");
    cJSON_AddNumberToObject(m, "max_model_len", a->context_len);
    return m;
}

enum MHD_Result dol_http_models(dol_http_req *c, const char *id)
{
    dol_api_error e;
    if (dol_http_not_ready(c, &e)) return dol_http_send_error(c, &e);
    dol_http_attached a;
    dol_http_attached_get(c->srv, &a);
    if (id) {
        if (strcmp(id, a.name) != 0) {
            dol_api_error_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                              "The model '%.200s' does not exist.", id);
            return dol_http_send_error(c, &e);
        }
        return dol_http_send_cjson(c, 200, model_object(c->srv, &a));
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON *m = model_object(c->srv, &a);
    if (!data || !m) {
        cJSON_Delete(m);
        cJSON_Delete(root);
        return dol_http_send_json(c, 500, NULL);
    }
    cJSON_AddItemToArray(data, m);
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

/* Milliseconds since the scheduler's last loop iteration (0 before it has
 * run). Its loop also ticks while idle (a timed wait), so a stale heartbeat
 * means a stuck step or a dead thread either way. */
static double stall_ms(const dol_scheduler_stats *st)
{
    if (st->last_step_ms <= 0) return 0;
    double age = dol_now_ms() - st->last_step_ms;
    return age > 0 ? age : 0;
}

enum MHD_Result dol_http_healthz(dol_http_req *c)
{
    dol_server_state state = dol_server_get_state(c->srv);
    dol_http_attached a;
    dol_http_attached_get(c->srv, &a);
    dol_scheduler_stats st;
    bool have_sched = dol_http_sched_stats(c->srv, &st);

    cJSON *root = cJSON_CreateObject();
    cJSON *reasons = cJSON_CreateArray();
    const char *status = state_name(state);
    switch (state) {
    case DOL_STATE_LOADING:
        cJSON_AddItemToArray(reasons, cJSON_CreateString("model is loading"));
        break;
    case DOL_STATE_WARMING:
        cJSON_AddItemToArray(reasons, cJSON_CreateString("warm-up in progress"));
        break;
    case DOL_STATE_DRAINING:
        cJSON_AddItemToArray(reasons, cJSON_CreateString("server is draining"));
        break;
    default:
        break;
    }
    double stalled = have_sched ? stall_ms(&st) : 0;
    if (stalled > STALL_READY_MS) {
        char msg[128];
        snprintf(msg, sizeof msg,
                 "scheduler loop has made no progress for %.0f ms", stalled);
        cJSON_AddItemToArray(reasons, cJSON_CreateString(msg));
        if (state == DOL_STATE_READY) status = "stalled";
    }
    bool ready = cJSON_GetArraySize(reasons) == 0;
    cJSON_AddStringToObject(root, "status", status);
    cJSON_AddItemToObject(root, "reasons", reasons);
    if (a.name[0]) cJSON_AddStringToObject(root, "model", a.name);
    else cJSON_AddNullToObject(root, "model");
    cJSON_AddNumberToObject(root, "inflight", dol_server_inflight(c->srv));
    if (have_sched) {
        cJSON *kv = cJSON_AddObjectToObject(root, "kv_cache");
        if (kv) {
            cJSON_AddNumberToObject(kv, "blocks_used", st.kv_blocks_used);
            cJSON_AddNumberToObject(kv, "blocks_total", st.kv_blocks_total);
            cJSON_AddNumberToObject(kv, "block_size", st.kv_block_size);
        }
        cJSON *sc = cJSON_AddObjectToObject(root, "scheduler");
        if (sc) {
            cJSON_AddNumberToObject(sc, "queued", st.queued);
            cJSON_AddNumberToObject(sc, "running_requests", st.running_requests);
            cJSON_AddNumberToObject(sc, "running_seqs", st.running_seqs);
            cJSON_AddNumberToObject(sc, "steps", (double)st.steps);
            cJSON_AddNumberToObject(sc, "tokens_prompt", (double)st.tokens_prompt);
            cJSON_AddNumberToObject(sc, "tokens_generated", (double)st.tokens_generated);
            cJSON_AddNumberToObject(sc, "stall_ms", stalled);
            cJSON_AddBoolToObject(sc, "idle", st.idle);
            cJSON_AddBoolToObject(sc, "draining", st.draining);
        }
    }
    return dol_http_send_cjson(c, ready ? 200 : 503, root);
}

enum MHD_Result dol_http_livez(dol_http_req *c)
{
    dol_scheduler_stats st;
    double stalled = dol_http_sched_stats(c->srv, &st) ? stall_ms(&st) : 0;
    cJSON *root = cJSON_CreateObject();
    bool alive = stalled <= STALL_LIVE_MS;
    cJSON_AddStringToObject(root, "status", alive ? "alive" : "stalled");
    cJSON_AddNumberToObject(root, "stall_ms", stalled);
    return dol_http_send_cjson(c, alive ? 200 : 503, root);
}
