/* src/api/chat.c — chat messages: validation of the "messages" array and the
 * Llama-2 chat format, built as token ids exactly the way Meta's reference
 * `chat_completion` (llama/generation.py) builds them (docs/api.md):
 *
 *   system merged into the first user turn: "<<SYS>>\n" + system +
 *       "\n<</SYS>>\n\n" + user
 *   each finished pair:  BOS + encode("[INST] " + strip(user) + " [/INST] " +
 *                                     strip(answer) + " ") + EOS
 *   the last user turn:  BOS + encode("[INST] " + strip(user) + " [/INST]")
 *
 * Each piece is encoded on its own, so no token ever spans two turns, and
 * BOS/EOS are ids, never the text "<s>" (which would be literal text). */
#include "api/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- messages ------------------------------------------------------------- */

void dol_api_messages_free(dol_chat_message *m, int n)
{
    if (!m) return;
    for (int i = 0; i < n; i++) free(m[i].content);
    free(m);
}

static int role_of(const char *s, dol_chat_role *out)
{
    if (strcmp(s, "system") == 0 || strcmp(s, "developer") == 0) *out = DOL_CHAT_SYSTEM;
    else if (strcmp(s, "user") == 0) *out = DOL_CHAT_USER;
    else if (strcmp(s, "assistant") == 0) *out = DOL_CHAT_ASSISTANT;
    else return -1;
    return 0;
}

/* content: "text" | [{"type":"text","text":"..."}, ...] (parts joined with
 * "\n", as vLLM does) | null for an assistant turn. */
static int parse_content(const cJSON *v, int index, dol_chat_message *m, dol_api_error *e)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", index);
    if (!v || cJSON_IsNull(v)) {
        if (m->role != DOL_CHAT_ASSISTANT) {
            dol_api_error_invalid(e, param, "'%s' is required.", param);
            return -1;
        }
        m->content = strdup("");
        return m->content ? 0 : dol_api_error_oom(e);
    }
    if (cJSON_IsString(v)) {
        m->len = strlen(v->valuestring);
        m->content = strdup(v->valuestring);
        return m->content ? 0 : dol_api_error_oom(e);
    }
    if (!cJSON_IsArray(v)) {
        dol_api_error_invalid(e, param, "'%s' must be a string or an array of text parts.",
                              param);
        return -1;
    }
    size_t total = 1;
    const cJSON *part;
    cJSON_ArrayForEach(part, v) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) ||
            strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(text)) {
            dol_api_error_invalid(e, param, "'%s' parts must be {\"type\": \"text\", \"text\": "
                                  "string}; this model reads text only.", param);
            return -1;
        }
        total += strlen(text->valuestring) + 1;
    }
    m->content = malloc(total);
    if (!m->content) return dol_api_error_oom(e);
    size_t o = 0;
    cJSON_ArrayForEach(part, v) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        if (part != v->child) m->content[o++] = '\n';
        size_t n = strlen(t);
        memcpy(m->content + o, t, n);
        o += n;
    }
    m->content[o] = '\0';
    m->len = o;
    return 0;
}

int dol_api_parse_messages(const cJSON *v, dol_chat_message **out, int *n,
                           dol_api_error *e)
{
    *out = NULL;
    *n = 0;
    if (!cJSON_IsArray(v)) {
        dol_api_error_invalid(e, "messages", "'messages' must be an array of message objects.");
        return -1;
    }
    int count = cJSON_GetArraySize(v);
    if (count == 0) {
        dol_api_error_invalid(e, "messages", "'messages' must not be empty.");
        return -1;
    }
    if (count > DOL_API_MAX_MESSAGES) {
        dol_api_error_invalid(e, "messages", "'messages' holds %d messages; at most %d are "
                              "allowed.", count, DOL_API_MAX_MESSAGES);
        return -1;
    }
    dol_chat_message *m = calloc((size_t)count, sizeof *m);
    if (!m) return dol_api_error_oom(e);
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, v) {
        char param[64];
        snprintf(param, sizeof param, "messages[%d].role", i);
        const cJSON *role = cJSON_IsObject(x) ? cJSON_GetObjectItemCaseSensitive(x, "role")
                                              : NULL;
        if (!cJSON_IsObject(x)) {
            snprintf(param, sizeof param, "messages[%d]", i);
            dol_api_error_invalid(e, param, "'%s' must be an object with 'role' and "
                                  "'content'.", param);
            goto fail;
        }
        if (!cJSON_IsString(role) || role_of(role->valuestring, &m[i].role) != 0) {
            dol_api_error_invalid(e, param, "'%s' must be one of \"system\", \"user\" or "
                                  "\"assistant\".", param);
            goto fail;
        }
        if (parse_content(cJSON_GetObjectItemCaseSensitive(x, "content"), i, &m[i], e))
            goto fail;
        i++;
    }
    *out = m;
    *n = count;
    return 0;
fail:
    dol_api_messages_free(m, count);
    return -1;
}

/* ---- the chat format ------------------------------------------------------ */

/* Length of the whitespace character (as Python's str.isspace sees it) at
 * s[0..n), or 0. */
static size_t space_at(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return 1;
    if (n >= 2 && c == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0)) return 2;
    if (n >= 3 && c == 0xE1 && s[1] == 0x9A && s[2] == 0x80) return 3;      /* U+1680 */
    if (n >= 3 && c == 0xE2 && s[1] == 0x80 &&                             /* U+2000..200A, */
        ((s[2] >= 0x80 && s[2] <= 0x8A) || s[2] == 0xA8 || s[2] == 0xA9 ||  /* 2028, 2029, */
         s[2] == 0xAF))                                                    /* 202F */
        return 3;
    if (n >= 3 && c == 0xE2 && s[1] == 0x81 && s[2] == 0x9F) return 3;      /* U+205F */
    if (n >= 3 && c == 0xE3 && s[1] == 0x80 && s[2] == 0x80) return 3;      /* U+3000 */
    return 0;
}

/* Does s[0..n) end with a whitespace character? Returns its length or 0.
 * Valid UTF-8 is assumed, so the character starts at most 3 bytes back. */
static size_t space_before(const unsigned char *s, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        if ((s[n - k] & 0xC0) == 0x80) continue;   /* continuation byte */
        return space_at(s + n - k, k) == k ? k : 0;
    }
    return 0;
}

/* Python's str.strip(): [*b, *e) shrinks past leading/trailing whitespace. */
static void strip(const char **b, size_t *len)
{
    const unsigned char *s = (const unsigned char *)*b;
    size_t n = *len, k;
    while (n > 0 && (k = space_at(s, n)) > 0) { s += k; n -= k; }
    while (n > 0 && (k = space_before(s, n)) > 0) n -= k;
    *b = (const char *)s;
    *len = n;
}

typedef struct {
    int32_t *ids;
    int n, cap;
} id_list;

static int ids_push(id_list *l, const int32_t *ids, int n)
{
    if (l->n + n > l->cap) {
        int cap = l->cap ? l->cap : 256;
        while (cap < l->n + n) cap *= 2;
        int32_t *p = realloc(l->ids, (size_t)cap * sizeof *p);
        if (!p) return -1;
        l->ids = p;
        l->cap = cap;
    }
    memcpy(l->ids + l->n, ids, (size_t)n * sizeof *ids);
    l->n += n;
    return 0;
}

typedef struct {
    char *s;
    size_t n, cap;
} str_buf;

static int str_add(str_buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) return -1;
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
    return 0;
}

static int str_add_stripped(str_buf *b, const char *s, size_t n)
{
    strip(&s, &n);
    return str_add(b, s, n);
}

/* Append BOS + encode(text) (+ EOS). */
static int add_turn(const dol_tokenizer *tok, id_list *out, const str_buf *text, bool eos,
                    dol_api_error *e)
{
    int32_t bos = dol_tokenizer_bos_id(tok), eos_id = dol_tokenizer_eos_id(tok);
    int32_t *ids = NULL;
    size_t n = 0;
    char err[DOL_ERR_LEN];
    if (dol_tokenizer_encode(tok, text->s, text->n, false, &ids, &n, err, sizeof err)) {
        dol_api_error_set(e, 500, "internal_error", "messages", NULL,
                          "Tokenizing the messages failed: %s", err);
        return -1;
    }
    int rc = (bos >= 0 ? ids_push(out, &bos, 1) : 0) || ids_push(out, ids, (int)n) ||
             (eos && eos_id >= 0 ? ids_push(out, &eos_id, 1) : 0);
    free(ids);
    return rc ? dol_api_error_oom(e) : 0;
}

/* The role order: after an optional leading system message, user,
 * assistant, ..., user. Returns the index of the first user message, or -1
 * with a 400 naming "messages". */
static int check_roles(const dol_chat_message *m, int n, dol_api_error *e)
{
    int first = n > 0 && m[0].role == DOL_CHAT_SYSTEM ? 1 : 0;
    /* Roles after the optional system message: user, assistant, user, ...,
     * user. */
    if (n - first < 1 || (n - first) % 2 == 0) {
        dol_api_error_invalid(e, "messages", "'messages' must end with a user message (after "
                              "an optional leading system message, roles alternate user, "
                              "assistant, user, ...).");
        return -1;
    }
    for (int i = first; i < n; i++) {
        dol_chat_role want = (i - first) % 2 == 0 ? DOL_CHAT_USER : DOL_CHAT_ASSISTANT;
        if (m[i].role != want) {
            dol_api_error_invalid(e, "messages", "'messages[%d]' has role %s where %s was "
                                  "expected: after an optional leading system message, roles "
                                  "must alternate user, assistant, user, ... and end with "
                                  "user.", i,
                                  m[i].role == DOL_CHAT_SYSTEM ? "system"
                                  : m[i].role == DOL_CHAT_USER ? "user" : "assistant",
                                  want == DOL_CHAT_USER ? "user" : "assistant");
            return -1;
        }
    }
    return first;
}

/* The text of the turn starting at user message i (first: index of the
 * first user message) into turn, using user as scratch: "[INST] {user}
 * [/INST]", followed by " {answer} " unless it is the last turn. -1 on
 * OOM. */
static int turn_text(const dol_chat_message *m, int n, int first, int i, str_buf *user,
                     str_buf *turn)
{
    /* The user's content, with the system prompt merged into the first. */
    user->n = 0;
    if (i == first && first == 1) {
        if (str_add(user, "<<SYS>>\n", 8) || str_add(user, m[0].content, m[0].len) ||
            str_add(user, "\n<</SYS>>\n\n", 11))
            return -1;
    }
    if (str_add(user, m[i].content, m[i].len)) return -1;
    turn->n = 0;
    if (str_add(turn, "[INST] ", 7) || str_add_stripped(turn, user->s, user->n) ||
        str_add(turn, " [/INST]", 8))
        return -1;
    if (i != n - 1 && (str_add(turn, " ", 1) ||
                       str_add_stripped(turn, m[i + 1].content, m[i + 1].len) ||
                       str_add(turn, " ", 1)))
        return -1;
    return 0;
}

int dol_api_chat_prompt_ids(const dol_tokenizer *tok, const dol_chat_message *m,
                            int n, int32_t **ids, int *n_ids, dol_api_error *e)
{
    *ids = NULL;
    *n_ids = 0;
    int first = check_roles(m, n, e);
    if (first < 0) return -1;
    id_list out = {0};
    str_buf user = {0}, turn = {0};
    int rc = -1;
    for (int i = first; i < n; i += 2) {
        if (turn_text(m, n, first, i, &user, &turn)) goto oom;
        if (add_turn(tok, &out, &turn, i != n - 1, e)) goto done;
    }
    *ids = out.ids;
    *n_ids = out.n;
    out.ids = NULL;
    rc = 0;
    goto done;
oom:
    dol_api_error_oom(e);
done:
    free(out.ids);
    free(user.s);
    free(turn.s);
    return rc;
}

int dol_api_chat_min_tokens(const dol_tokenizer *tok, const dol_chat_message *m,
                            int n, int64_t *min_ids, dol_api_error *e)
{
    *min_ids = 0;
    int first = check_roles(m, n, e);
    if (first < 0) return -1;
    int32_t bos = dol_tokenizer_bos_id(tok), eos_id = dol_tokenizer_eos_id(tok);
    str_buf user = {0}, turn = {0};
    int64_t total = 0;
    int rc = 0;
    for (int i = first; i < n; i += 2) {
        if (turn_text(m, n, first, i, &user, &turn)) {
            rc = dol_api_error_oom(e);
            break;
        }
        total += (bos >= 0) + (int64_t)dol_tokenizer_min_tokens(tok, turn.s, turn.n) +
                 (i != n - 1 && eos_id >= 0);
    }
    free(user.s);
    free(turn.s);
    if (rc == 0) *min_ids = total;
    return rc;
}
