/* src/http/route_models.c — GET /v1/models and GET /v1/models/{id}: every
 * configured model as OpenAI's model object, with Dolphin's "dolphin"
 * extension (state, format, placement, counters; docs/openapi.yaml). */
#include "http/http.h"

#include <stdio.h>
#include <string.h>

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
    cJSON_AddStringToObject(x, "activations", in->activations);
    if (in->file_format) {
        cJSON_AddStringToObject(x, "file_format", in->file_format);
        cJSON_AddStringToObject(x, "file_types", in->file_types);
    } else {
        cJSON_AddNullToObject(x, "file_format");
        cJSON_AddNullToObject(x, "file_types");
    }
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
