/* src/api/render_chat.c — response JSON for /v1/chat/completions: the
 * chat.completion object, chat.completion.chunk stream events (the first
 * one of each choice carries the role, the last one the finish reason), and
 * logprobs in the chat format (token, logprob, bytes, top_logprobs). */
#include "api/api.h"

#include <stdlib.h>
#include <string.h>

static cJSON *base_object(const dol_api_meta *m, const char *object)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "id", m->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)m->created);
    cJSON_AddStringToObject(root, "model", m->model);
    if (m->prompt_ids)
        cJSON_AddItemToObject(root, "prompt_token_ids",
                              dol_api_ids_json(m->prompt_ids, m->n_prompt_ids));
    return root;
}

/* The fields every choice has, after "message" / "delta". */
static void add_choice_tail(cJSON *c, dol_api_choice *ch)
{
    cJSON_AddItemToObject(c, "logprobs", ch->logprobs ? ch->logprobs : cJSON_CreateNull());
    ch->logprobs = NULL;
    cJSON_AddItemToObject(c, "finish_reason",
                          ch->finish ? cJSON_CreateString(ch->finish) : cJSON_CreateNull());
    if (ch->token_ids)
        cJSON_AddItemToObject(c, "token_ids", dol_api_ids_json(ch->token_ids, ch->n_token_ids));
}

static void drop_logprobs(dol_api_choice *ch, int n)
{
    for (int i = 0; i < n; i++) {
        cJSON_Delete(ch[i].logprobs);
        ch[i].logprobs = NULL;
    }
}

cJSON *dol_api_chat_json(const dol_api_meta *m, dol_api_choice *ch, int n_choices,
                         const dol_api_usage *usage)
{
    cJSON *root = base_object(m, "chat.completion");
    cJSON *arr = root ? cJSON_AddArrayToObject(root, "choices") : NULL;
    if (!arr) goto fail;
    for (int i = 0; i < n_choices; i++) {
        cJSON *c = cJSON_CreateObject();
        if (!c) goto fail;
        cJSON_AddItemToArray(arr, c);
        cJSON_AddNumberToObject(c, "index", ch[i].index);
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON *t = dol_api_string_n(ch[i].text ? ch[i].text : "",
                                    ch[i].text ? ch[i].text_len : 0);
        if (!msg || !t) {
            cJSON_Delete(t);
            goto fail;
        }
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddItemToObject(msg, "content", t);
        add_choice_tail(c, &ch[i]);
    }
    if (dol_api_add_usage(root, usage)) goto fail;
    return root;
fail:
    drop_logprobs(ch, n_choices);
    cJSON_Delete(root);
    return NULL;
}

cJSON *dol_api_chat_chunk_json(const dol_api_meta *m, dol_api_choice *ch, int n_choices,
                               const dol_api_usage *usage)
{
    cJSON *root = base_object(m, "chat.completion.chunk");
    cJSON *arr = root ? cJSON_AddArrayToObject(root, "choices") : NULL;
    if (!arr) goto fail;
    for (int i = 0; i < n_choices; i++) {
        cJSON *c = cJSON_CreateObject();
        if (!c) goto fail;
        cJSON_AddItemToArray(arr, c);
        cJSON_AddNumberToObject(c, "index", ch[i].index);
        cJSON *delta = cJSON_AddObjectToObject(c, "delta");
        if (!delta) goto fail;
        if (ch[i].role) cJSON_AddStringToObject(delta, "role", "assistant");
        if (ch[i].text) {
            cJSON *t = dol_api_string_n(ch[i].text, ch[i].text_len);
            if (!t) goto fail;
            cJSON_AddItemToObject(delta, "content", t);
        }
        add_choice_tail(c, &ch[i]);
    }
    if (dol_api_add_usage(root, usage)) goto fail;
    return root;
fail:
    drop_logprobs(ch, n_choices);
    cJSON_Delete(root);
    return NULL;
}

/* The raw bytes a token stands for: a byte-fallback token its one byte, a
 * control token none, any other piece its text with "▁" as a space. */
static cJSON *token_bytes(const dol_tokenizer *tok, int32_t id, const char *text)
{
    cJSON *a = cJSON_CreateArray();
    if (!a) return NULL;
    const char *piece = dol_tokenizer_id_to_piece(tok, id);
    if (dol_tokenizer_is_byte(tok, id) && piece && strlen(piece) == 6) {
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)strtol(piece + 3, NULL, 16)));
        return a;
    }
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
    return a;
}

static cJSON *one_token(const dol_tokenizer *tok, int32_t id, float logprob)
{
    char buf[256];
    const char *text = dol_api_token_text(tok, id, buf, sizeof buf);
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "token", text);
    cJSON_AddNumberToObject(o, "logprob", logprob);
    cJSON_AddItemToObject(o, "bytes", token_bytes(tok, id, text));
    return o;
}

cJSON *dol_api_chat_logprobs_json(const dol_tokenizer *tok, const dol_token_logprob *lps,
                                  int n)
{
    cJSON *obj = cJSON_CreateObject();
    cJSON *content = obj ? cJSON_AddArrayToObject(obj, "content") : NULL;
    if (!content) {
        cJSON_Delete(obj);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        cJSON *t = one_token(tok, lps[i].id, lps[i].logprob);
        if (!t) break;
        cJSON_AddItemToArray(content, t);
        cJSON *top = cJSON_AddArrayToObject(t, "top_logprobs");
        int k = lps[i].n_top > DOL_MAX_LOGPROBS ? DOL_MAX_LOGPROBS : lps[i].n_top;
        for (int j = 0; top && j < k; j++) {
            cJSON *x = one_token(tok, lps[i].top_ids[j], lps[i].top_logprobs[j]);
            if (x) cJSON_AddItemToArray(top, x);
        }
    }
    return obj;
}
