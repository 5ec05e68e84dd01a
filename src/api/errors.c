/* src/api/errors.c — OpenAI-shaped error objects, and the first checks every
 * JSON request body goes through: Content-Type, UTF-8 validity, NUL bytes,
 * and parsing into exactly one JSON object. */
#include "api/api.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void copy_str(char *dst, size_t n, const char *src)
{
    if (!src) src = "";
    snprintf(dst, n, "%s", src);
}

static void error_vset(dol_api_error *e, int status, const char *type,
                       const char *param, const char *code,
                       const char *fmt, va_list ap)
{
    e->status = status;
    copy_str(e->type, sizeof e->type, type);
    copy_str(e->param, sizeof e->param, param);
    copy_str(e->code, sizeof e->code, code);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
}

void dol_api_error_set(dol_api_error *e, int status, const char *type,
                       const char *param, const char *code,
                       const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, status, type, param, code, fmt, ap);
    va_end(ap);
}

void dol_api_error_invalid(dol_api_error *e, const char *param,
                           const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, 400, "invalid_request_error", param, NULL, fmt, ap);
    va_end(ap);
}

static cJSON *string_or_null(const char *s)
{
    return (s && s[0]) ? cJSON_CreateString(s) : cJSON_CreateNull();
}

char *dol_api_error_json(const dol_api_error *e)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    if (!err) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type[0] ? e->type : "api_error");
    cJSON_AddItemToObject(err, "param", string_or_null(e->param));
    cJSON_AddItemToObject(err, "code", string_or_null(e->code));
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

bool dol_api_utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    const unsigned char *end = p + n;
    while (p < end) {
        unsigned c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        size_t k;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) {
            k = 1; cp = c & 0x1F; min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            k = 2; cp = c & 0x0F; min = 0x800;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3; cp = c & 0x07; min = 0x10000;
        } else {
            return false;
        }
        if ((size_t)(end - p) <= k) return false;
        for (size_t i = 1; i <= k; i++) {
            if ((p[i] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (p[i] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        p += k + 1;
    }
    return true;
}

static bool is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* \u escapes cJSON would turn into a NUL and cut the string there silently:
 * "\u0000" (1), and one whose four characters are not all hex digits (2;
 * cJSON reads those as 0 too, found by fuzz_request). 0 when there is none.
 * An escaped backslash is skipped, so "\\\\u0000" is fine. */
static int bad_u_escape(const char *s, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] != '\\') continue;
        if (s[i + 1] != 'u') {
            i++;  /* skip the escaped character */
            continue;
        }
        if (i + 6 > n || !is_hex(s[i + 2]) || !is_hex(s[i + 3]) || !is_hex(s[i + 4]) ||
            !is_hex(s[i + 5]))
            return 2;
        if (memcmp(s + i + 2, "0000", 4) == 0) return 1;
        i += 5;
    }
    return 0;
}

int dol_api_json_depth(const char *s, size_t n, int stop)
{
    int depth = 0, deepest = 0;
    bool in_string = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_string) {
            if (c == '\\') i++;          /* skip the escaped character */
            else if (c == '"') in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            if (++depth > deepest) {
                deepest = depth;
                if (deepest > stop) return stop + 1;
            }
        } else if (c == '}' || c == ']') {
            if (depth > 0) depth--;
        }
    }
    return deepest;
}

static int cmp_keys(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* A key that appears twice in one object of the tree (parsers disagree on
 * which one counts: cJSON takes the first, Python's json the last), or NULL.
 * Sorting the keys keeps this O(k log k) for an object of k keys. 1 in *oom
 * when out of memory. */
static const char *duplicate_key(const cJSON *node, bool *oom)
{
    int k = 0;
    const cJSON *c;
    for (c = node->child; c; c = c->next) k++;
    if (cJSON_IsObject(node) && k > 1) {
        const cJSON **keys = malloc(sizeof *keys * (size_t)k);
        if (!keys) {
            *oom = true;
            return NULL;
        }
        int i = 0;
        for (c = node->child; c; c = c->next) keys[i++] = c;
        qsort(keys, (size_t)k, sizeof *keys, cmp_keys);
        const char *dup = NULL;
        for (i = 1; i < k && !dup; i++)
            if (strcmp(keys[i - 1]->string, keys[i]->string) == 0) dup = keys[i]->string;
        free(keys);
        if (dup) return dup;
    }
    for (c = node->child; c; c = c->next) {
        const char *d = duplicate_key(c, oom);
        if (d || *oom) return d;
    }
    return NULL;
}

cJSON *dol_api_parse_object(const char *body, size_t len, int max_depth,
                            dol_api_error *e)
{
    if (!body || len == 0) {
        dol_api_error_invalid(e, NULL, "The request body is empty; expected a JSON object.");
        return NULL;
    }
    if (!dol_api_utf8_valid(body, len)) {
        dol_api_error_invalid(e, NULL, "The request body is not valid UTF-8.");
        return NULL;
    }
    if (memchr(body, '\0', len)) {
        dol_api_error_invalid(e, NULL, "The request body contains a NUL byte.");
        return NULL;
    }
    switch (bad_u_escape(body, len)) {
    case 1:
        dol_api_error_invalid(e, NULL, "Strings in the request body must not contain \\u0000.");
        return NULL;
    case 2:
        dol_api_error_invalid(e, NULL, "The request body has a \\u escape that is not followed "
                              "by four hexadecimal digits.");
        return NULL;
    default:
        break;
    }
    /* Nesting is checked before cJSON recurses into it (cJSON itself stops
     * at CJSON_NESTING_LIMIT, 1000, with a plain parse error). */
    if (max_depth > 0 && dol_api_json_depth(body, len, max_depth) > max_depth) {
        dol_api_error_invalid(e, NULL, "The request body nests objects and arrays more than "
                              "%d levels deep; at most %d are allowed (max_json_depth).",
                              max_depth, max_depth);
        return NULL;
    }
    /* The caller's buffer is NUL-terminated at body[len]; passing len + 1
     * lets cJSON see that terminator, which require_null_terminated checks
     * for (anything but whitespace after the value is an error). */
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len + 1, &end, 1);
    if (!root) {
        size_t off = end && end >= body ? (size_t)(end - body) : 0;
        if (off > len) off = len;
        dol_api_error_invalid(e, NULL,
                              "We could not parse the JSON body of your request "
                              "(error near byte %zu). The body must be one JSON object.",
                              off);
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        dol_api_error_invalid(e, NULL, "The request body must be a JSON object.");
        cJSON_Delete(root);
        return NULL;
    }
    bool oom = false;
    const char *dup = duplicate_key(root, &oom);
    if (dup || oom) {
        if (oom) dol_api_error_oom(e);
        else dol_api_error_invalid(e, NULL, "The key '%.100s' appears twice in one object of "
                                   "the request body.", dup);
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

bool dol_api_content_type_is_json(const char *ct)
{
    if (!ct) return true;
    while (*ct == ' ' || *ct == '\t') ct++;
    size_t n = strcspn(ct, ";");
    while (n > 0 && (ct[n - 1] == ' ' || ct[n - 1] == '\t')) n--;
    static const char want[] = "application/json";
    return n == sizeof want - 1 && strncasecmp(ct, want, n) == 0;
}

/* ---- one message per condition ------------------------------------------ */

int dol_api_error_oom(dol_api_error *e)
{
    dol_api_error_set(e, 500, "internal_error", NULL, NULL, "Out of memory.");
    return -1;
}

void dol_api_error_draining(dol_api_error *e)
{
    dol_api_error_set(e, 503, "service_unavailable", NULL, "server_draining",
                      "The server is shutting down and accepts no new requests; retry on "
                      "another replica.");
}

void dol_api_error_timeout(dol_api_error *e, double timeout_s, const char *while_doing)
{
    dol_api_error_set(e, 504, "timeout_error", NULL, "request_timeout",
                      "The request did not finish within request_timeout_s (%g s)%s%s.",
                      timeout_s, while_doing ? ": " : "", while_doing ? while_doing : "");
}

/* The context-length message, whichever way the limit was met:
 * the tokens asked for (prompt + max_tokens), no room left after a prompt
 * when max_tokens was not given, or a prompt too long judged from its
 * length before it is tokenized (estimated). */
static void context_exceeded(dol_api_error *e, const dol_reason_info *in, const char *param,
                             bool estimated)
{
    const char *what = in->max_tokens >= 0 && !estimated && in->n_prompt < in->limit
                           ? "max_tokens" : param;
    char detail[320];
    if (estimated)
        snprintf(detail, sizeof detail, "the %s alone is at least %d tokens long (judged from "
                 "its length, without tokenizing it), which leaves no room for the completion",
                 param, in->n_prompt);
    else if (in->max_tokens < 0)
        snprintf(detail, sizeof detail, "the %s take %d, which leaves no room for the answer",
                 param, in->n_prompt);
    else
        snprintf(detail, sizeof detail, "you requested %lld tokens (%d in the %s, %d for the "
                 "completion)", (long long)in->n_prompt + in->max_tokens, in->n_prompt, param,
                 in->max_tokens);
    dol_api_error_set(e, 400, "invalid_request_error", what, "context_length_exceeded",
                      "This model's maximum context length is %d tokens. However, %s. Please "
                      "reduce the length of the %s%s.", in->limit, detail, param,
                      in->max_tokens > 0 && !estimated ? " or max_tokens" : "");
}

static void map_reason(dol_api_error *e, const dol_reason_info *in, const char *param,
                       bool estimated)
{
    if (!param) param = "prompt";
    switch (in->reason) {
    case DOL_REASON_NONE:
        dol_api_error_set(e, 500, "internal_error", NULL, NULL, "The request failed.");
        return;
    case DOL_REASON_QUEUE_FULL:
        dol_api_error_set(e, 429, "rate_limit_exceeded", NULL, "queue_full",
                          "The server is busy: %d requests are already waiting (max_queue). "
                          "Retry shortly.", in->limit);
        return;
    case DOL_REASON_DRAINING:
        dol_api_error_draining(e);
        return;
    case DOL_REASON_CONTEXT_OVERFLOW:
        context_exceeded(e, in, param, estimated);
        return;
    case DOL_REASON_KV_OVERFLOW:
        if (in->max_tokens < 0 || estimated)
            dol_api_error_set(e, 400, "invalid_request_error", param, "context_length_exceeded",
                              "The %s (%s%d tokens) leaves no room for an answer of %d "
                              "choice(s) in the KV cache (%d tokens). Please reduce the length "
                              "of the %s or n.", param, estimated ? "at least " : "",
                              in->n_prompt, in->n, in->limit, param);
        else
            dol_api_error_set(e, 400, "invalid_request_error", "max_tokens",
                              "context_length_exceeded",
                              "The %s (%d tokens) plus max_tokens (%d) for each of %d choice(s) "
                              "can never fit in the KV cache (%d tokens). Please reduce the "
                              "length of the %s, max_tokens or n.", param, in->n_prompt,
                              in->max_tokens, in->n, in->limit, param);
        return;
    case DOL_REASON_BAD_TOKEN:
        dol_api_error_invalid(e, param, "Token id %d at position %d of the %s is out of range "
                              "[0, %d).", in->token, in->position, param, in->limit);
        return;
    case DOL_REASON_TOO_MANY_CHOICES:
        dol_api_error_invalid(e, "n", "'n' is %d but this server runs at most %d sequences "
                              "at once (max_batch_size).", in->n, in->limit);
        return;
    case DOL_REASON_INVALID:
        dol_api_error_invalid(e, NULL, "Invalid request: n must be at least 1, the %s must "
                              "not be empty and max_tokens not negative.", param);
        return;
    case DOL_REASON_CANCELLED:
        /* nobody reads it (the client is gone); the log shows status 499 */
        dol_api_error_set(e, 499, "cancelled", NULL, NULL, "The client closed the connection.");
        return;
    case DOL_REASON_TIMED_OUT:
        dol_api_error_timeout(e, in->timeout_ms / 1000.0, NULL);
        return;
    case DOL_REASON_NO_MEMORY:
        dol_api_error_oom(e);
        return;
    case DOL_REASON_BACKEND_FAILURE:
        dol_api_error_set(e, 500, "server_error", NULL, NULL,
                          "Internal error in the forward pass (the server log has the cause).");
        return;
    case DOL_REASON_GRAMMAR_BROKEN:
        dol_api_error_set(e, 500, "server_error", NULL, NULL,
                          "Structured output: the sampler picked a token the grammar does not "
                          "allow.");
        return;
    }
    dol_api_error_set(e, 500, "internal_error", NULL, NULL, "The request failed.");
}

void dol_api_error_from_reason(dol_api_error *e, const dol_reason_info *in, const char *param)
{
    map_reason(e, in, param, false);
}

void dol_api_error_prompt_too_long(dol_api_error *e, const dol_reason_info *in,
                                   const char *param)
{
    map_reason(e, in, param, true);
}

void dol_api_error_not_loaded(dol_api_error *e)
{
    dol_api_error_set(e, 503, "service_unavailable", NULL, "model_loading",
                      "The model is not loaded yet; retry shortly.");
}
