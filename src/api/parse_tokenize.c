/* src/api/parse_tokenize.c — validation of POST /tokenize and POST /detokenize
 * bodies (the vLLM-style tokenizer endpoints). /tokenize takes a prompt
 * string (with add_special_tokens, default true, adding BOS), the same text
 * as llama.cpp's `content` (whose `add_special` defaults to false), or chat
 * messages (encoded in the Llama-2 chat format, see chat.c); /detokenize
 * takes a list of token ids. Unknown fields are ignored. */
#include "api/api.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int get_model(const cJSON *body, char **model, dol_api_error *e)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(body, "model");
    *model = NULL;
    if (!m || cJSON_IsNull(m)) return 0;
    if (!cJSON_IsString(m)) {
        dol_api_error_invalid(e, "model", "'model' must be a string.");
        return -1;
    }
    *model = strdup(m->valuestring);
    if (!*model) {
        dol_api_error_oom(e);
        return -1;
    }
    return 0;
}

int dol_api_parse_tokenize(const cJSON *body, dol_tokenize_params *p, dol_api_error *e)
{
    memset(p, 0, sizeof *p);
    p->add_special_tokens = true;
    if (!cJSON_IsObject(body)) {
        dol_api_error_invalid(e, NULL, "The request body must be a JSON object.");
        return -1;
    }
    if (get_model(body, &p->model, e)) return -1;
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(body, "content");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    if (prompt && cJSON_IsNull(prompt)) prompt = NULL;
    if (content && cJSON_IsNull(content)) content = NULL;
    if (msgs && cJSON_IsNull(msgs)) msgs = NULL;
    int given = !!prompt + !!content + !!msgs;
    if (given != 1) {
        dol_api_error_invalid(e, !given ? "prompt" : msgs ? "messages" : "content",
                              "Give exactly one of 'prompt' (or llama.cpp's 'content', a "
                              "string) or 'messages'.");
        return -1;
    }
    /* llama.cpp's `content` comes with its `add_special` (default false);
     * `add_special_tokens`, when given, wins for either spelling. */
    const char *flags[2] = {"add_special_tokens", "add_special"};
    if (content) p->add_special_tokens = false;
    for (int i = 1; i >= 0; i--) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(body, flags[i]);
        if (!f || cJSON_IsNull(f)) continue;
        if (!cJSON_IsBool(f)) {
            dol_api_error_invalid(e, flags[i], "'%s' must be a boolean.", flags[i]);
            return -1;
        }
        p->add_special_tokens = cJSON_IsTrue(f);
    }
    if (msgs) return dol_api_parse_messages(msgs, &p->messages, &p->n_messages, e);
    const char *field = content ? "content" : "prompt";
    if (content) prompt = content;
    if (!cJSON_IsString(prompt)) {
        dol_api_error_invalid(e, field, "'%s' must be a string.", field);
        return -1;
    }
    p->prompt_len = strlen(prompt->valuestring);
    p->prompt = strdup(prompt->valuestring);
    if (!p->prompt) {
        dol_api_error_oom(e);
        return -1;
    }
    return 0;
}

void dol_api_tokenize_params_free(dol_tokenize_params *p)
{
    if (!p) return;
    free(p->model);
    free(p->prompt);
    dol_api_messages_free(p->messages, p->n_messages);
    memset(p, 0, sizeof *p);
}

int dol_api_parse_detokenize(const cJSON *body, int vocab_size, char **model,
                             int32_t **ids, int *n, dol_api_error *e)
{
    *ids = NULL;
    *n = 0;
    *model = NULL;
    if (!cJSON_IsObject(body)) {
        dol_api_error_invalid(e, NULL, "The request body must be a JSON object.");
        return -1;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(body, "tokens");
    if (!cJSON_IsArray(t)) {
        dol_api_error_invalid(e, "tokens", "'tokens' must be an array of token ids.");
        return -1;
    }
    int count = cJSON_GetArraySize(t);
    int32_t *out = malloc((size_t)(count ? count : 1) * sizeof *out);
    if (!out) {
        dol_api_error_oom(e);
        return -1;
    }
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, t) {
        double d = cJSON_IsNumber(x) ? x->valuedouble : NAN;
        if (!isfinite(d) || d != floor(d) || d < 0 || d >= (double)vocab_size) {
            dol_api_error_invalid(e, "tokens", "'tokens' element %d is not a token id in "
                                  "[0, %d).", i, vocab_size);
            free(out);
            return -1;
        }
        out[i++] = (int32_t)d;
    }
    if (get_model(body, model, e)) {
        free(out);
        return -1;
    }
    *ids = out;
    *n = count;
    return 0;
}
