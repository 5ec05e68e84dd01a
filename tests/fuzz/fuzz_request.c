/* tests/fuzz/fuzz_request.c — libFuzzer target for the request parsers and
 * validators of src/api/api.h: the input is a request body exactly as it
 * arrives off the wire. It goes through dol_api_parse_object (with a
 * lowered max_json_depth), then through
 * every body parser as the routes call them — /v1/completions
 * (dol_api_parse_completion, dol_api_error_from_reason), /v1/chat/completions
 * (dol_api_parse_chat and, with the stories260K tokenizer when
 * $DOLPHIN_SHARED has it, dol_api_chat_prompt_ids), /tokenize and
 * /detokenize — and every outcome is checked: an accepted request satisfies
 * every documented limit (the configurable ones set below their defaults
 * here, so that both sides of each are reached), a refused one carries a
 * 4xx OpenAI-shaped error that renders as JSON (500 is never an answer to
 * user input), and the token-count lower bound that lets the routes refuse
 * a prompt before encoding it never exceeds the real count. An accepted
 * response_format grammar (json_object, or a json_schema compiled from the
 * input) is then driven for a few tokens over the stories260K vocabulary:
 * every token its mask allows is accepted by the matcher, and a mask is
 * never empty before the value is complete. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "api/api.h"
#include "fuzz_util.h"

#ifndef DOLPHIN_FUZZ_SHARED_DEFAULT
#define DOLPHIN_FUZZ_SHARED_DEFAULT "../shared"
#endif

static dol_tokenizer *g_tok; /* NULL when the fixtures are absent */
static dol_grammar_vocab *g_vocab; /* the trie of g_tok, or NULL */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    const char *shared = getenv("DOLPHIN_SHARED");
    if (!shared || !*shared) shared = DOLPHIN_FUZZ_SHARED_DEFAULT;
    char path[1024], err[DOL_ERR_LEN];
    snprintf(path, sizeof path, "%s/models/stories260K/tokenizer.model", shared);
    if (dol_tokenizer_load(path, &g_tok, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_request: no tokenizer, chat prompts not built: %s\n", err);
        g_tok = NULL;
    }
    if (g_tok) g_vocab = dol_grammar_vocab_new(g_tok, dol_tokenizer_vocab_size(g_tok));
    return 0;
}

/* Limits of a small served model (stories260K's vocabulary and context),
 * with the configurable ones lowered. */
#define FUZZ_JSON_DEPTH 16
static const dol_api_limits LIMITS = {
    .vocab_size = 512,
    .context_len = 512,
    .default_max_tokens = 16,
    .default_temperature = 1.0f,
    .default_top_p = 1.0f,
    .default_top_k = 0,
    .max_prompt_tokens = 300,
    .max_tokens_cap = 256,
    .max_n = 4,
    .max_stop = 3,
    .max_stop_len = 32,
    .max_logit_bias = 20,
    .max_grammar_states = 2000,
};


/* Nesting depth of a parsed value (an object or array counts 1). */
static int tree_depth(const cJSON *v)
{
    int deepest = 0;
    for (const cJSON *c = v->child; c; c = c->next) {
        int d = tree_depth(c);
        if (d > deepest) deepest = d;
    }
    return (cJSON_IsObject(v) || cJSON_IsArray(v)) ? deepest + 1 : 0;
}

static void check_error(const dol_api_error *e)
{
    FUZZ_CHECK(e->status >= 400 && e->status <= 499);
    FUZZ_CHECK(e->message[0] != '\0');
    FUZZ_CHECK(memchr(e->message, '\0', sizeof e->message) != NULL);
    char *json = dol_api_error_json(e);
    FUZZ_CHECK(json != NULL);
    cJSON *back = cJSON_Parse(json);
    FUZZ_CHECK(back != NULL);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(back, "error");
    FUZZ_CHECK(cJSON_IsObject(err));
    FUZZ_CHECK(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(err, "message")));
    FUZZ_CHECK(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(err, "type")));
    cJSON_Delete(back);
    free(json);
}

static bool in(double v, double lo, double hi) { return v >= lo && v <= hi; }

/* Drive the grammar for a few tokens: each step takes the first allowed
 * token after a position picked from the grammar's own size, which the
 * matcher must accept; the mask is empty only after a complete value. */
static void check_grammar(dol_grammar *g)
{
    FUZZ_CHECK(dol_grammar_n_states(g) <= LIMITS.max_grammar_states);
    if (!g_vocab) return;
    dol_matcher *m = dol_matcher_new(g);
    FUZZ_CHECK(m != NULL);
    int vocab = dol_tokenizer_vocab_size(g_tok), eos = dol_tokenizer_eos_id(g_tok);
    uint64_t mask[(512 + 63) / 64 + 8];
    if ((vocab + 63) / 64 > (int)(sizeof mask / sizeof mask[0])) { dol_matcher_free(m); return; }
    for (int step = 0; step < 12; step++) {
        dol_matcher_mask(m, g_vocab, mask);
        FUZZ_CHECK(((mask[eos >> 6] >> (eos & 63)) & 1) == dol_matcher_complete(m));
        int start = (step * 131 + dol_grammar_n_states(g)) % vocab, pick = -1;
        for (int k = 0; k < vocab && pick < 0; k++) {
            int id = (start + k) % vocab;
            if (id != eos && (mask[id >> 6] >> (id & 63) & 1)) pick = id;
        }
        if (pick < 0) {        /* only EOS (or nothing): the value must be complete */
            FUZZ_CHECK(dol_matcher_complete(m));
            break;
        }
        FUZZ_CHECK(dol_matcher_accept(m, g_vocab, pick));
    }
    dol_matcher_free(m);
}

/* Every documented limit of an accepted request. */
static void check_params(const dol_completion_params *p)
{
    if (p->grammar) check_grammar(p->grammar);
    if (p->chat) {
        FUZZ_CHECK(p->n_prompts == 0 && p->n_messages >= 1 && p->messages != NULL);
        for (int i = 0; i < p->n_messages; i++) {
            const dol_chat_message *m = &p->messages[i];
            FUZZ_CHECK(m->content && strlen(m->content) == m->len);
            FUZZ_CHECK(fuzz_utf8_ok((const unsigned char *)m->content, m->len));
        }
        FUZZ_CHECK(!p->echo);
        FUZZ_CHECK(!p->max_tokens_given || p->max_tokens >= 1);
    } else {
        FUZZ_CHECK(p->n_prompts >= 1 && p->n_prompts <= DOL_API_MAX_PROMPTS);
        FUZZ_CHECK(p->prompts != NULL && p->n_messages == 0);
        FUZZ_CHECK(p->max_tokens > 0 || p->echo);
    }
    for (int i = 0; i < p->n_prompts; i++) {
        const dol_api_prompt *pr = &p->prompts[i];
        FUZZ_CHECK((pr->text != NULL) != (pr->ids != NULL));
        if (pr->text) {
            FUZZ_CHECK(strlen(pr->text) == pr->text_len);
            FUZZ_CHECK(fuzz_utf8_ok((const unsigned char *)pr->text, pr->text_len));
        } else {
            FUZZ_CHECK(pr->n_ids >= 1);
            for (int k = 0; k < pr->n_ids; k++)
                FUZZ_CHECK(pr->ids[k] >= 0 && pr->ids[k] < LIMITS.vocab_size);
        }
    }
    FUZZ_CHECK(p->max_tokens >= 0 && p->max_tokens <= LIMITS.max_tokens_cap);
    FUZZ_CHECK(p->n >= 1 && p->n <= LIMITS.max_n);
    FUZZ_CHECK(p->n_stop >= 0 && p->n_stop <= LIMITS.max_stop);
    for (int i = 0; i < p->n_stop; i++)
        FUZZ_CHECK(p->stop[i] && p->stop[i][0] &&
                   strlen(p->stop[i]) <= (size_t)LIMITS.max_stop_len);
    FUZZ_CHECK(p->logprobs >= -1 && p->logprobs <= DOL_MAX_LOGPROBS);
    FUZZ_CHECK(!p->include_usage || p->stream);

    const dol_sampling_params *s = &p->sampling;
    FUZZ_CHECK(in(s->temperature, 0, 2));
    FUZZ_CHECK(s->top_p > 0 && s->top_p <= 1);
    FUZZ_CHECK(s->top_k >= 0);
    FUZZ_CHECK(in(s->min_p, 0, 1));
    FUZZ_CHECK(in(s->presence_penalty, -2, 2));
    FUZZ_CHECK(in(s->frequency_penalty, -2, 2));
    FUZZ_CHECK(s->repetition_penalty > 0 && s->repetition_penalty <= 10);
    FUZZ_CHECK(s->n_logit_bias >= 0 && s->n_logit_bias <= LIMITS.max_logit_bias);
    for (int i = 0; i < s->n_logit_bias; i++) {
        FUZZ_CHECK(s->logit_bias_ids[i] >= 0 && s->logit_bias_ids[i] < LIMITS.vocab_size);
        FUZZ_CHECK(isfinite(s->logit_bias_vals[i]) && in(s->logit_bias_vals[i], -100, 100));
    }
}

/* Prompt-length and context checks as the route does them after
 * tokenizing; false when the request is refused. */
static bool check_context(int n_prompt, int64_t max_tokens, const char *param)
{
    dol_api_error e;
    memset(&e, 0, sizeof e);
    if (dol_api_check_prompt_tokens(n_prompt, &LIMITS, param, &e) != 0) {
        FUZZ_CHECK(n_prompt > LIMITS.max_prompt_tokens);
        FUZZ_CHECK(e.status == 400 && strcmp(e.code, "context_length_exceeded") == 0);
        FUZZ_CHECK(strcmp(e.param, param) == 0);
        check_error(&e);
        return false;
    }
    FUZZ_CHECK(n_prompt <= LIMITS.max_prompt_tokens);
    if ((int64_t)n_prompt + max_tokens <= LIMITS.context_len) return true;
    /* the scheduler says CONTEXT_OVERFLOW (dol_scheduler_fit); its error */
    memset(&e, 0, sizeof e);
    dol_reason_info in = {.reason = DOL_REASON_CONTEXT_OVERFLOW, .n_prompt = n_prompt,
                          .max_tokens = max_tokens > INT_MAX ? INT_MAX : (int)max_tokens,
                          .n = 1, .limit = LIMITS.context_len};
    dol_api_error_from_reason(&e, &in, param);
    FUZZ_CHECK(e.status == 400 && strcmp(e.code, "context_length_exceeded") == 0);
    check_error(&e);
    return false;
}

/* The check the routes run before tokenizing, from a lower bound min on a
 * prompt whose real count is n: it may only refuse what the checks after
 * tokenizing refuse too. */
static void check_bound(int64_t min, int n, int64_t max_tokens, const char *param)
{
    FUZZ_CHECK(min >= 0 && min <= n);
    dol_api_error e;
    memset(&e, 0, sizeof e);
    if (dol_api_check_prompt_bound(min, &LIMITS, param, &e) != 0) {
        FUZZ_CHECK(e.status == 400 && strcmp(e.code, "context_length_exceeded") == 0);
        check_error(&e);
        FUZZ_CHECK(!check_context(n, max_tokens, param));
    }
}

static void fuzz_completion(const cJSON *root)
{
    dol_api_error e;
    memset(&e, 0, sizeof e);
    dol_completion_params p;
    if (dol_api_parse_completion(root, &LIMITS, &p, &e) == 0) {
        FUZZ_CHECK(!p.chat);
        check_params(&p);
        for (int i = 0; i < p.n_prompts; i++) {
            const dol_api_prompt *pr = &p.prompts[i];
            if (pr->ids) {
                check_context(pr->n_ids, p.max_tokens, "prompt");
            } else if (g_tok) {
                int32_t *ids = NULL;
                size_t n = 0;
                char err[DOL_ERR_LEN];
                FUZZ_CHECK(dol_tokenizer_encode(g_tok, pr->text, pr->text_len, true, &ids, &n,
                                                err, sizeof err) == 0);
                int64_t min = (int64_t)dol_tokenizer_min_tokens(g_tok, pr->text,
                                                                pr->text_len) + 1;
                check_bound(min, (int)n, p.max_tokens, "prompt");
                check_context((int)n, p.max_tokens, "prompt");
                free(ids);
            } else {
                /* Without the tokenizer, the text's length stands in for its
                 * token count (at most one a byte, plus BOS). */
                check_context((int)(pr->text_len > 100000 ? 100000 : pr->text_len + 1),
                              p.max_tokens, "prompt");
            }
        }
    } else {
        check_error(&e);
    }
    dol_api_completion_params_free(&p);
}

static void fuzz_chat(const cJSON *root)
{
    dol_api_error e;
    memset(&e, 0, sizeof e);
    dol_completion_params p;
    if (dol_api_parse_chat(root, &LIMITS, &p, &e) == 0) {
        FUZZ_CHECK(p.chat);
        check_params(&p);
        int32_t *ids = NULL;
        int n = 0;
        int64_t min = -1;
        dol_api_error me;
        memset(&me, 0, sizeof me);
        bool roles_ok = g_tok && dol_api_chat_min_tokens(g_tok, p.messages, p.n_messages,
                                                         &min, &me) == 0;
        if (g_tok && !roles_ok) check_error(&me);
        if (g_tok && dol_api_chat_prompt_ids(g_tok, p.messages, p.n_messages, &ids, &n, &e) == 0) {
            FUZZ_CHECK(roles_ok);
            FUZZ_CHECK(ids != NULL && n >= 1);
            FUZZ_CHECK(ids[0] == dol_tokenizer_bos_id(g_tok));
            for (int i = 0; i < n; i++)
                FUZZ_CHECK(ids[i] >= 0 && ids[i] < dol_tokenizer_vocab_size(g_tok));
            check_bound(min, n, p.max_tokens_given ? p.max_tokens : 1, "messages");
            check_context(n, p.max_tokens, "messages");
        } else if (g_tok) {
            FUZZ_CHECK(!roles_ok);
            FUZZ_CHECK(ids == NULL);
            check_error(&e);
        }
        free(ids);
    } else {
        check_error(&e);
    }
    dol_api_completion_params_free(&p);
}

static void fuzz_tokenize(const cJSON *root)
{
    dol_api_error e;
    memset(&e, 0, sizeof e);
    dol_tokenize_params tp;
    if (dol_api_parse_tokenize(root, &tp, &e) == 0) {
        FUZZ_CHECK((tp.prompt != NULL) != (tp.messages != NULL));
        if (tp.prompt) {
            FUZZ_CHECK(strlen(tp.prompt) == tp.prompt_len);
            FUZZ_CHECK(fuzz_utf8_ok((const unsigned char *)tp.prompt, tp.prompt_len));
        }
    } else {
        check_error(&e);
    }
    dol_api_tokenize_params_free(&tp);

    memset(&e, 0, sizeof e);
    char *model = NULL;
    int32_t *ids = NULL;
    int n = -1;
    if (dol_api_parse_detokenize(root, LIMITS.vocab_size, &model, &ids, &n, &e) == 0) {
        FUZZ_CHECK(ids != NULL && n >= 0);
        for (int i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < LIMITS.vocab_size);
    } else {
        check_error(&e);
    }
    free(model);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The server keeps a body NUL-terminated at body[len]; so does this. */
    char *body = malloc(size + 1);
    FUZZ_CHECK(body != NULL);
    memcpy(body, data, size);
    body[size] = '\0';

    /* The project's UTF-8 check must agree with the standard's table. */
    FUZZ_CHECK(dol_api_utf8_valid(body, size) == fuzz_utf8_ok(data, size));
    if (size < 256) (void)dol_api_content_type_is_json(body);

    dol_api_error e;
    memset(&e, 0, sizeof e);
    int depth = dol_api_json_depth(body, size, FUZZ_JSON_DEPTH);
    FUZZ_CHECK(depth >= 0 && depth <= FUZZ_JSON_DEPTH + 1);
    cJSON *root = dol_api_parse_object(body, size, FUZZ_JSON_DEPTH, &e);
    if (!root) {
        check_error(&e);
        free(body);
        return 0;
    }
    FUZZ_CHECK(cJSON_IsObject(root));
    FUZZ_CHECK(tree_depth(root) == depth && depth <= FUZZ_JSON_DEPTH);
    FUZZ_CHECK(fuzz_utf8_ok(data, size) && !memchr(data, '\0', size));

    fuzz_completion(root);
    fuzz_chat(root);
    fuzz_tokenize(root);
    cJSON_Delete(root);
    free(body);
    return 0;
}
