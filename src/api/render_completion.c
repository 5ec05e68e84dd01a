/* src/api/render_completion.c — response JSON for /v1/completions: the
 * text_completion object (whole responses and stream chunks), SSE framing,
 * the legacy logprobs object, and the helpers render_chat.c shares. */
#include "api/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when invalid. */
static size_t utf8_seq(const char *s, size_t n)
{
    unsigned char c = (unsigned char)s[0];
    size_t k = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c & 0xF0) == 0xE0 ? 3
             : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    return k && k <= n && dol_api_utf8_valid(s, k) ? k : 0;
}

/* NUL becomes U+FFFD too: cJSON's strings end at the first NUL. */
cJSON *dol_api_string_n(const char *s, size_t n)
{
    char *tmp = malloc(3 * n + 1);
    if (!tmp) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = s[i] ? utf8_seq(s + i, n - i) : 0;
        if (k) {
            memcpy(tmp + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(tmp + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    tmp[o] = '\0';
    cJSON *j = cJSON_CreateString(tmp);
    free(tmp);
    return j;
}

cJSON *dol_api_ids_json(const int32_t *ids, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) {
        cJSON *x = cJSON_CreateNumber(ids[i]);
        if (!x) {
            cJSON_Delete(a);
            return NULL;
        }
        cJSON_AddItemToArray(a, x);
    }
    return a;
}

int dol_api_add_usage(cJSON *root, const dol_api_usage *usage)
{
    if (!usage || usage->prompt_tokens < 0) return 0;
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    if (!u) return -1;
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)usage->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)usage->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens",
                            (double)(usage->prompt_tokens + usage->completion_tokens));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    if (!d || !cJSON_AddNumberToObject(d, "cached_tokens", (double)usage->cached_tokens)) return -1;
    return 0;
}

cJSON *dol_api_completion_json(const dol_api_meta *m, dol_api_choice *ch,
                               int n_choices, const dol_api_usage *usage)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) goto fail;
    cJSON_AddStringToObject(root, "id", m->id);
    cJSON_AddStringToObject(root, "object", "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)m->created);
    cJSON_AddStringToObject(root, "model", m->model);
    cJSON *arr = cJSON_AddArrayToObject(root, "choices");
    if (!arr) goto fail;
    for (int i = 0; i < n_choices; i++) {
        cJSON *c = cJSON_CreateObject();
        if (!c) goto fail;
        cJSON_AddItemToArray(arr, c);
        cJSON_AddNumberToObject(c, "index", ch[i].index);
        cJSON *t = dol_api_string_n(ch[i].text ? ch[i].text : "", ch[i].text ? ch[i].text_len : 0);
        if (!t) goto fail;
        cJSON_AddItemToObject(c, "text", t);
        cJSON_AddItemToObject(c, "logprobs",
                              ch[i].logprobs ? ch[i].logprobs : cJSON_CreateNull());
        ch[i].logprobs = NULL;
        cJSON_AddItemToObject(c, "finish_reason",
                              ch[i].finish ? cJSON_CreateString(ch[i].finish)
                                           : cJSON_CreateNull());
        if (ch[i].prompt_ids)
            cJSON_AddItemToObject(c, "prompt_token_ids",
                                  dol_api_ids_json(ch[i].prompt_ids, ch[i].n_prompt_ids));
        if (ch[i].token_ids)
            cJSON_AddItemToObject(c, "token_ids",
                                  dol_api_ids_json(ch[i].token_ids, ch[i].n_token_ids));
    }
    if (dol_api_add_usage(root, usage) != 0) goto fail;
    return root;
fail:
    for (int i = 0; i < n_choices; i++) {
        cJSON_Delete(ch[i].logprobs);
        ch[i].logprobs = NULL;
    }
    cJSON_Delete(root);
    return NULL;
}

char *dol_api_sse_event(cJSON *j, size_t *len)
{
    static const char done[] = "data: [DONE]\n\n";
    if (!j) {
        char *s = strdup(done);
        if (s && len) *len = sizeof done - 1;
        return s;
    }
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!body) return NULL;
    size_t n = strlen(body);
    char *s = malloc(n + 9);
    if (s) {
        memcpy(s, "data: ", 6);
        memcpy(s + 6, body, n);
        memcpy(s + 6 + n, "\n\n", 3);
        if (len) *len = n + 8;
    }
    free(body);
    return s;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

const char *dol_api_token_text(const dol_tokenizer *tok, int32_t id,
                               char *buf, size_t n)
{
    if (n == 0) return buf;
    buf[0] = '\0';
    const char *piece = tok ? dol_tokenizer_id_to_piece(tok, id) : NULL;
    if (!piece || dol_tokenizer_is_control(tok, id)) return buf;
    if (dol_tokenizer_is_byte(tok, id) && strlen(piece) == 6) {
        int b = hexval(piece[3]) * 16 + hexval(piece[4]);
        if (b >= 0 && b < 0x80) snprintf(buf, n, "%c", b);
        else if (b >= 0) snprintf(buf, n, "bytes:\\x%02x", b);
        return buf;
    }
    /* "▁" (U+2581, E2 96 81) stands for a space. */
    size_t o = 0;
    for (const char *p = piece; *p && o + 1 < n;) {
        if ((unsigned char)p[0] == 0xE2 && (unsigned char)p[1] == 0x96 &&
            (unsigned char)p[2] == 0x81) {
            buf[o++] = ' ';
            p += 3;
        } else {
            buf[o++] = *p++;
        }
    }
    buf[o] = '\0';
    return buf;
}

int dol_api_logprobs_append(cJSON *obj, const dol_tokenizer *tok,
                            const dol_token_logprob *lps, const int *offsets,
                            int n)
{
    cJSON *tokens = cJSON_GetObjectItemCaseSensitive(obj, "tokens");
    cJSON *tlp = cJSON_GetObjectItemCaseSensitive(obj, "token_logprobs");
    cJSON *top = cJSON_GetObjectItemCaseSensitive(obj, "top_logprobs");
    cJSON *off = cJSON_GetObjectItemCaseSensitive(obj, "text_offset");
    if (!tokens || !tlp || !top || !off) return -1;
    char buf[256];
    for (int i = 0; i < n; i++) {
        const dol_token_logprob *lp = &lps[i];
        cJSON_AddItemToArray(tokens, cJSON_CreateString(
                                         dol_api_token_text(tok, lp->id, buf, sizeof buf)));
        if (lp->n_top < 0) {
            cJSON_AddItemToArray(tlp, cJSON_CreateNull());
            cJSON_AddItemToArray(top, cJSON_CreateNull());
        } else {
            cJSON_AddItemToArray(tlp, cJSON_CreateNumber(lp->logprob));
            cJSON *t = cJSON_CreateObject();
            int k = lp->n_top > DOL_MAX_LOGPROBS ? DOL_MAX_LOGPROBS : lp->n_top;
            for (int j = 0; j < k && t; j++)
                cJSON_AddNumberToObject(
                    t, dol_api_token_text(tok, lp->top_ids[j], buf, sizeof buf),
                    lp->top_logprobs[j]);
            cJSON_AddItemToArray(top, t ? t : cJSON_CreateNull());
        }
        cJSON_AddItemToArray(off, cJSON_CreateNumber(offsets ? offsets[i] : 0));
    }
    return 0;
}

cJSON *dol_api_logprobs_json(const dol_tokenizer *tok,
                             const dol_token_logprob *lps, const int *offsets,
                             int n)
{
    cJSON *obj = cJSON_CreateObject();
    if (!obj) return NULL;
    if (!cJSON_AddArrayToObject(obj, "tokens") ||
        !cJSON_AddArrayToObject(obj, "token_logprobs") ||
        !cJSON_AddArrayToObject(obj, "top_logprobs") ||
        !cJSON_AddArrayToObject(obj, "text_offset") ||
        dol_api_logprobs_append(obj, tok, lps, offsets, n)) {
        cJSON_Delete(obj);
        return NULL;
    }
    return obj;
}
