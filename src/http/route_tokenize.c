/* src/http/route_tokenize.c — the tokenizer endpoints, shaped like vLLM's:
 *
 *   POST /tokenize   {"prompt": "text", "add_special_tokens": true}
 *                    or llama.cpp's {"content": "text", "add_special": false}
 *                    or {"messages": [...]} (the chat format's prompt ids,
 *                    exactly what /v1/chat/completions feeds the model)
 *                 -> {"tokens": [...], "count": n, "max_model_len": ctx}
 *   POST /detokenize {"tokens": [...]} -> {"prompt": "text", "content": "text"}
 *                    (vLLM's and llama.cpp's names for the same text)
 *
 * Neither touches the scheduler; both answer at once. */
#include "http/http.h"

#include <stdlib.h>

/* The model (loaded: 0; loading: 1, the connection suspended), then the
 * body: shared by both routes. -1 with e. */
static int begin(dol_http_req *c, dol_http_attached *a, cJSON **body, dol_api_error *e)
{
    int w = dol_http_model_acquire(c, a, e);
    if (w != 0) return w;
    *body = dol_http_body_json(c, e);
    return *body ? 0 : -1;
}

enum MHD_Result dol_http_tokenize(dol_http_req *c)
{
    dol_api_error e;
    dol_http_attached a;
    cJSON *body = NULL;
    int w = begin(c, &a, &body, &e);
    if (w > 0) return MHD_YES;
    if (w < 0) return dol_http_send_error(c, &e);
    dol_tokenize_params p;
    int rc = dol_api_parse_tokenize(body, &p, &e);
    int32_t *ids = NULL;
    int n = 0;
    if (rc == 0) rc = dol_http_check_model(c, p.model, &a, &e);
    if (rc == 0 && p.messages) {
        rc = dol_api_chat_prompt_ids(a.tok, p.messages, p.n_messages, &ids, &n, &e);
    } else if (rc == 0) {
        char err[DOL_ERR_LEN];
        size_t cnt = 0;
        rc = dol_tokenizer_encode(a.tok, p.prompt, p.prompt_len, p.add_special_tokens, &ids,
                                  &cnt, err, sizeof err);
        if (rc) dol_api_error_set(&e, 500, "internal_error", "prompt", NULL,
                                  "Tokenizing the prompt failed: %s", err);
        n = (int)cnt;
    }
    dol_api_tokenize_params_free(&p);
    if (rc) {
        free(ids);
        return dol_http_send_error(c, &e);
    }
    cJSON *root = cJSON_CreateObject();
    if (root) {
        cJSON_AddItemToObject(root, "tokens", dol_api_ids_json(ids, n));
        cJSON_AddNumberToObject(root, "count", n);
        cJSON_AddNumberToObject(root, "max_model_len", a.context_len);
    }
    free(ids);
    return dol_http_send_cjson(c, 200, root);
}

enum MHD_Result dol_http_detokenize(dol_http_req *c)
{
    dol_api_error e;
    dol_http_attached a;
    cJSON *body = NULL;
    int w = begin(c, &a, &body, &e);
    if (w > 0) return MHD_YES;
    if (w < 0) return dol_http_send_error(c, &e);
    char *model = NULL;
    int32_t *ids = NULL;
    int n = 0;
    int rc = dol_api_parse_detokenize(body, dol_tokenizer_vocab_size(a.tok), &model, &ids, &n,
                                      &e);
    if (rc == 0) rc = dol_http_check_model(c, model, &a, &e);
    free(model);
    char *text = NULL;
    size_t len = 0;
    if (rc == 0) {
        char err[DOL_ERR_LEN];
        rc = dol_tokenizer_decode(a.tok, ids, (size_t)n, &text, &len, err, sizeof err);
        if (rc) dol_api_error_set(&e, 500, "internal_error", "tokens", NULL,
                                  "Decoding the tokens failed: %s", err);
    }
    free(ids);
    if (rc) return dol_http_send_error(c, &e);
    cJSON *root = cJSON_CreateObject();
    cJSON *t = dol_api_string_n(text, len);
    free(text);
    if (!root || !t) {
        cJSON_Delete(root);
        cJSON_Delete(t);
        return dol_http_send_json(c, 500, NULL);
    }
    cJSON_AddItemToObject(root, "prompt", t);
    cJSON *dup = cJSON_Duplicate(t, false);
    if (!dup) {
        cJSON_Delete(root);
        return dol_http_send_json(c, 500, NULL);
    }
    cJSON_AddItemToObject(root, "content", dup);
    return dol_http_send_cjson(c, 200, root);
}
