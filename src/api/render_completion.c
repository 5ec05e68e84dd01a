/* src/api/render_completion.c — response JSON for /v1/completions: the
 * text_completion object (whole responses and stream chunks), SSE framing,
 * the legacy logprobs object, and the helpers render_chat.c shares. */
#include "api/api.h"

#include <limits.h>
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

/* Text of a token that starts the sequence (only control tokens before it):
 * sentencepiece drops the leading "▁" of that piece when it decodes, so its
 * text is decode([id]) where that is dol_api_token_text without the space. */
static const char *token_text_at(const dol_tokenizer *tok, int32_t id, bool at_start,
                                 char *buf, size_t n)
{
    dol_api_token_text(tok, id, buf, n);
    if (!at_start || buf[0] != ' ' || dol_tokenizer_is_byte(tok, id)) return buf;
    char *d = NULL;
    size_t len = 0;
    if (dol_tokenizer_decode(tok, &id, 1, &d, &len, NULL, 0) == 0 && len + 1 == strlen(buf) &&
        memcmp(d, buf + 1, len) == 0)
        memmove(buf, buf + 1, len + 1);
    free(d);
    return buf;
}

/* Entries i of lps, at offsets[i]. With spell (spell_len bytes, starting
 * at offset base of the choice's text), a token's text is spell[offsets[i],
 * offsets[i + 1]) less base (the last one's runs to end), both ends clamped
 * to spell, except that control tokens read "" and non-ASCII byte-fallback
 * tokens bytes:\xNN; without it, the token's piece (token_text_at). */
static size_t clamp_at(int v, size_t len)
{
    return v <= 0 ? 0 : (size_t)v > len ? len : (size_t)v;
}

static int logprobs_append(cJSON *obj, const dol_tokenizer *tok,
                           const dol_token_logprob *lps, const int *offsets, int n,
                           bool at_start, const char *spell, size_t spell_len, int base,
                           int end)
{
    cJSON *tokens = cJSON_GetObjectItemCaseSensitive(obj, "tokens");
    cJSON *tlp = cJSON_GetObjectItemCaseSensitive(obj, "token_logprobs");
    cJSON *top = cJSON_GetObjectItemCaseSensitive(obj, "top_logprobs");
    cJSON *off = cJSON_GetObjectItemCaseSensitive(obj, "text_offset");
    if (!tokens || !tlp || !top || !off) return -1;
    char buf[256];
    for (int i = 0; i < n; i++) {
        const dol_token_logprob *lp = &lps[i];
        const char *piece = token_text_at(tok, lp->id, at_start, buf, sizeof buf);
        if (spell && !dol_tokenizer_is_control(tok, lp->id) &&
            !(dol_tokenizer_is_byte(tok, lp->id) && strncmp(piece, "bytes:", 6) == 0)) {
            size_t a = clamp_at(offsets[i] - base, spell_len);
            size_t b = clamp_at((i + 1 < n ? offsets[i + 1] : end) - base, spell_len);
            cJSON_AddItemToArray(tokens, dol_api_string_n(spell + a, b > a ? b - a : 0));
        } else {
            cJSON_AddItemToArray(tokens, cJSON_CreateString(piece));
        }
        if (lp->n_top < 0) {
            cJSON_AddItemToArray(tlp, cJSON_CreateNull());
            cJSON_AddItemToArray(top, cJSON_CreateNull());
        } else {
            cJSON_AddItemToArray(tlp, cJSON_CreateNumber(lp->logprob));
            cJSON *t = cJSON_CreateObject();
            int k = lp->n_top > DOL_MAX_LOGPROBS ? DOL_MAX_LOGPROBS : lp->n_top;
            for (int j = 0; j < k && t; j++) {
                /* Two alternatives can read the same ("A" and the byte
                 * <0x41>; "▁A" and "A" at the start): the likelier is kept. */
                const char *key = token_text_at(tok, lp->top_ids[j], at_start, buf, sizeof buf);
                if (!cJSON_GetObjectItemCaseSensitive(t, key))
                    cJSON_AddNumberToObject(t, key, lp->top_logprobs[j]);
            }
            cJSON_AddItemToArray(top, t ? t : cJSON_CreateNull());
        }
        int at = offsets ? offsets[i] : 0;
        if (spell) at = base + (int)clamp_at(at - base, spell_len); /* a cut token's: the end */
        cJSON_AddItemToArray(off, cJSON_CreateNumber(at));
        if (at_start && !dol_tokenizer_is_control(tok, lp->id)) at_start = false;
    }
    return 0;
}

int dol_api_logprobs_append(cJSON *obj, const dol_tokenizer *tok,
                            const dol_token_logprob *lps, const int *offsets,
                            int n)
{
    return logprobs_append(obj, tok, lps, offsets, n, false, NULL, 0, 0, 0);
}

static cJSON *logprobs_json(const dol_tokenizer *tok, const dol_token_logprob *lps,
                            const int *offsets, int n, bool at_start, const char *spell,
                            size_t spell_len, int base, int end)
{
    cJSON *obj = cJSON_CreateObject();
    if (!obj) return NULL;
    if (!cJSON_AddArrayToObject(obj, "tokens") ||
        !cJSON_AddArrayToObject(obj, "token_logprobs") ||
        !cJSON_AddArrayToObject(obj, "top_logprobs") ||
        !cJSON_AddArrayToObject(obj, "text_offset") ||
        logprobs_append(obj, tok, lps, offsets, n, at_start, spell, spell_len, base, end)) {
        cJSON_Delete(obj);
        return NULL;
    }
    return obj;
}

cJSON *dol_api_logprobs_json_at(const dol_tokenizer *tok, const dol_token_logprob *lps,
                                const int *offsets, int n, bool at_start, const char *text,
                                size_t text_len, int base, int end)
{
    return logprobs_json(tok, lps, offsets, n, at_start, text, text_len, base, end);
}

cJSON *dol_api_logprobs_json(const dol_tokenizer *tok,
                             const dol_token_logprob *lps, const int *offsets,
                             int n)
{
    return logprobs_json(tok, lps, offsets, n, false, NULL, 0, 0, 0);
}

/* Offsets of ids in echo when echo encodes to them (after their leading
 * control tokens): where sentencepiece says each piece's text begins, the
 * first at 0 (whitespace the normalizer drops at the start is its text).
 * 0, or -1 when echo encodes to other ids. */
static int span_offsets(const dol_tokenizer *tok, const int32_t *ids, int n,
                        const char *echo, size_t echo_len, int *off)
{
    int c = 0;
    while (c < n && dol_tokenizer_is_control(tok, ids[c])) off[c++] = 0;
    int32_t *enc = NULL;
    size_t *begin = NULL, m = 0;
    int rc = -1;
    if (echo_len > (size_t)INT_MAX ||
        dol_tokenizer_encode_spans(tok, echo, echo_len, &enc, &begin, &m, NULL, 0))
        goto out;
    if (m != (size_t)(n - c)) goto out;
    for (size_t i = 0; i < m; i++) {
        if (enc[i] != ids[c + i] || (i > 0 && begin[i] < begin[i - 1])) goto out;
        off[c + (int)i] = i == 0 ? 0 : (int)begin[i];
    }
    rc = 0;
out:
    free(enc);
    free(begin);
    return rc;
}

/* Offsets of ids in decode(ids), found with the incremental detokenizer,
 * capped at echo_len. 0 or -1. */
static int decode_offsets(const dol_tokenizer *tok, const int32_t *ids, int n,
                          size_t echo_len, int *off)
{
    dol_detok *d = dol_detok_new(tok, ids, 0);
    if (!d) return -1;
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (int j = 0; j < n; j++) {
        off[j] = (int)(len < echo_len ? len : echo_len);
        if (dol_detok_push(d, ids[j], &text, &len, &cap) < 0) len = echo_len;
    }
    dol_detok_free(d);
    free(text);
    return 0;
}

cJSON *dol_api_echo_logprobs_json(const dol_tokenizer *tok, const dol_token_logprob *lps,
                                  const int32_t *ids, int n, const char *echo,
                                  size_t echo_len)
{
    if (!lps || n <= 0) return dol_api_logprobs_json(tok, NULL, NULL, 0);
    int *off = malloc((size_t)n * sizeof *off);
    if (!off) return NULL;
    cJSON *lp = NULL;
    if (span_offsets(tok, ids, n, echo, echo_len, off) == 0)
        lp = logprobs_json(tok, lps, off, n, true, echo, echo_len, 0, (int)echo_len);
    else if (decode_offsets(tok, ids, n, echo_len, off) == 0)
        lp = logprobs_json(tok, lps, off, n, true, NULL, 0, 0, 0);
    free(off);
    return lp;
}
