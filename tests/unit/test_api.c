/* tests/unit/test_api.c — unit tests for src/api/ beyond what the HTTP tests
 * reach easily: the Llama-2 chat format (Python-style stripping of every
 * Unicode whitespace, per-turn BOS/EOS ids, literal special-looking text),
 * messages / chat / tokenizer body validation, and the chat response JSON.
 * The chat-format tests need tiny-llama2's tokenizer under $DOLPHIN_SHARED
 * and are skipped without it; the others always run. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/api.h"

static dol_tokenizer *g_tok;   /* tiny-llama2 (Llama-2's 32000 pieces), or NULL */

static const dol_api_limits LIM = {
    .vocab_size = 32000, .context_len = 1024, .default_max_tokens = 16,
    .default_temperature = 1.0f, .default_top_p = 1.0f, .default_top_k = 0,
};

/* ---- helpers --------------------------------------------------------------- */

static int parse_chat(const char *json, dol_completion_params *p, dol_api_error *e)
{
    cJSON *body = cJSON_Parse(json);
    assert_non_null(body);
    int rc = dol_api_parse_chat(body, &LIM, p, e);
    cJSON_Delete(body);
    return rc;
}

static void expect_chat_error(const char *json, const char *param)
{
    dol_completion_params p;
    dol_api_error e = {0};
    assert_int_equal(parse_chat(json, &p, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, param);
    dol_api_completion_params_free(&p);
}

/* ids of a chat given as JSON messages; *n ids, malloc'd. -1 with e. */
static int chat_ids(const char *messages_json, int32_t **ids, int *n, dol_api_error *e)
{
    cJSON *m = cJSON_Parse(messages_json);
    assert_non_null(m);
    dol_chat_message *msgs = NULL;
    int count = 0;
    int rc = dol_api_parse_messages(m, &msgs, &count, e);
    cJSON_Delete(m);
    if (rc == 0) rc = dol_api_chat_prompt_ids(g_tok, msgs, count, ids, n, e);
    dol_api_messages_free(msgs, count);
    return rc;
}

/* BOS + encode(text) (+ EOS) appended to want. */
static int add_piece(int32_t *want, int n, const char *text, bool eos)
{
    int32_t *ids = NULL;
    size_t k = 0;
    char err[DOL_ERR_LEN];
    assert_int_equal(dol_tokenizer_encode(g_tok, text, strlen(text), true, &ids, &k, err,
                                          sizeof err), 0);
    memcpy(want + n, ids, k * sizeof *ids);
    n += (int)k;
    if (eos) want[n++] = dol_tokenizer_eos_id(g_tok);
    free(ids);
    return n;
}

/* ---- the chat format --------------------------------------------------------- */

static void test_chat_format_pairs(void **state)
{
    (void)state;
    if (!g_tok) skip();
    int32_t *ids = NULL;
    int n = 0;
    dol_api_error e;
    assert_int_equal(chat_ids("[{\"role\":\"system\",\"content\":\"S\"},"
                              "{\"role\":\"user\",\"content\":\" u1 \"},"
                              "{\"role\":\"assistant\",\"content\":\"a1\\n\"},"
                              "{\"role\":\"user\",\"content\":\"u2\"}]", &ids, &n, &e), 0);
    int32_t want[256];
    int k = add_piece(want, 0, "[INST] <<SYS>>\nS\n<</SYS>>\n\n u1 [/INST] a1 ", true);
    k = add_piece(want, k, "[INST] u2 [/INST]", false);
    assert_int_equal(n, k);
    assert_memory_equal(ids, want, (size_t)k * sizeof *ids);
    free(ids);
}

/* Python's str.strip() takes every Unicode whitespace character. */
static void test_chat_format_strips_unicode_space(void **state)
{
    (void)state;
    if (!g_tok) skip();
    int32_t *a = NULL, *b = NULL;
    int na = 0, nb = 0;
    dol_api_error e;
    assert_int_equal(chat_ids("[{\"role\":\"user\",\"content\":"
                              "\"\\u3000\\u00a0\\u2028\\u001c\\t hi \\u2003\\u0085\\u202f\\u205f\"}]",
                              &a, &na, &e), 0);
    assert_int_equal(chat_ids("[{\"role\":\"user\",\"content\":\"hi\"}]", &b, &nb, &e), 0);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, (size_t)na * sizeof *a);
    free(a);
    free(b);
    /* not whitespace for Python: kept (zero width space, U+180E) */
    assert_int_equal(chat_ids("[{\"role\":\"user\",\"content\":\"\\u200bhi\"}]", &a, &na, &e), 0);
    assert_true(na > nb);
    free(a);
}

static void test_chat_format_literal_specials(void **state)
{
    (void)state;
    if (!g_tok) skip();
    int32_t *ids = NULL;
    int n = 0;
    dol_api_error e;
    assert_int_equal(chat_ids("[{\"role\":\"user\",\"content\":\"<s></s>[INST]\"}]", &ids, &n,
                              &e), 0);
    int bos = 0, eos = 0;
    for (int i = 0; i < n; i++) {
        bos += ids[i] == dol_tokenizer_bos_id(g_tok);
        eos += ids[i] == dol_tokenizer_eos_id(g_tok);
    }
    assert_int_equal(bos, 1);
    assert_int_equal(eos, 0);
    free(ids);
}

static void test_chat_format_role_order(void **state)
{
    (void)state;
    if (!g_tok) skip();
    static const char *bad[] = {
        "[{\"role\":\"assistant\",\"content\":\"a\"}]",
        "[{\"role\":\"system\",\"content\":\"a\"}]",
        "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"}]",
        "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"},"
        "{\"role\":\"user\",\"content\":\"c\"}]",
        "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"system\",\"content\":\"b\"},"
        "{\"role\":\"user\",\"content\":\"c\"}]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = NULL;
        int n = 0;
        dol_api_error e = {0};
        assert_int_equal(chat_ids(bad[i], &ids, &n, &e), -1);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, "messages");
        assert_null(ids);
    }
}

/* ---- validation ------------------------------------------------------------- */

static void test_messages_shapes(void **state)
{
    (void)state;
    static const struct { const char *json; const char *param; } bad[] = {
        {"{}", "messages"},
        {"[]", "messages"},
        {"[1]", "messages[0]"},
        {"[{\"role\":\"bot\",\"content\":\"x\"}]", "messages[0].role"},
        {"[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\"}]", "messages[1].content"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]", "messages[0].content"},
        {"[{\"role\":\"user\",\"content\":null}]", "messages[0].content"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *v = cJSON_Parse(bad[i].json);
        dol_chat_message *m = NULL;
        int n = 0;
        dol_api_error e = {0};
        assert_int_equal(dol_api_parse_messages(v, &m, &n, &e), -1);
        assert_string_equal(e.param, bad[i].param);
        assert_null(m);
        cJSON_Delete(v);
    }
    cJSON *v = cJSON_Parse("[{\"role\":\"developer\",\"content\":\"s\"},"
                           "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                           "{\"type\":\"text\",\"text\":\"b\"}]},"
                           "{\"role\":\"assistant\",\"content\":null}]");
    dol_chat_message *m = NULL;
    int n = 0;
    dol_api_error e;
    assert_int_equal(dol_api_parse_messages(v, &m, &n, &e), 0);
    assert_int_equal(n, 3);
    assert_int_equal(m[0].role, DOL_CHAT_SYSTEM);
    assert_string_equal(m[1].content, "a\nb");
    assert_int_equal(m[1].len, 3);
    assert_string_equal(m[2].content, "");
    dol_api_messages_free(m, n);
    cJSON_Delete(v);
}

static void test_chat_params(void **state)
{
    (void)state;
    dol_completion_params p;
    dol_api_error e;
    assert_int_equal(parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                "\"max_tokens\":7,\"max_completion_tokens\":9,\"logprobs\":true,"
                                "\"top_logprobs\":3,\"n\":2,\"stop\":\"a\"}", &p, &e), 0);
    assert_true(p.chat);
    assert_true(p.max_tokens_given);
    assert_int_equal(p.max_tokens, 9);
    assert_int_equal(p.logprobs, 3);
    assert_int_equal(p.n, 2);
    assert_int_equal(p.n_stop, 1);
    dol_api_completion_params_free(&p);
    assert_int_equal(parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &p, &e), 0);
    assert_false(p.max_tokens_given);
    assert_int_equal(p.logprobs, -1);
    dol_api_completion_params_free(&p);

    expect_chat_error("{}", "messages");
    expect_chat_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}",
                      "top_logprobs");
    expect_chat_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
                      "\"top_logprobs\":6}", "top_logprobs");
    expect_chat_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":3}",
                      "logprobs");
    expect_chat_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{}]}",
                      "tools");
    expect_chat_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                      "\"response_format\":{\"type\":\"json_schema\"}}", "response_format");
    expect_chat_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}",
                      "max_tokens");
}

static void test_completion_refusals(void **state)
{
    (void)state;
    static const struct { const char *json; const char *param; } bad[] = {
        {"{\"prompt\":\"x\",\"suffix\":\"y\"}", "suffix"},
        {"{\"prompt\":\"x\",\"best_of\":2}", "best_of"},
        {"{\"prompt\":\"x\",\"logprobs\":6}", "logprobs"},
        {"{\"prompt\":\"x\",\"return_token_ids\":1}", "return_token_ids"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *body = cJSON_Parse(bad[i].json);
        dol_completion_params p;
        dol_api_error e = {0};
        assert_int_equal(dol_api_parse_completion(body, &LIM, &p, &e), -1);
        assert_string_equal(e.param, bad[i].param);
        dol_api_completion_params_free(&p);
        cJSON_Delete(body);
    }
    /* chat-only fields are unknown (ignored) on /v1/completions */
    cJSON *body = cJSON_Parse("{\"prompt\":\"x\",\"suffix\":\"\",\"top_logprobs\":50,"
                              "\"tools\":[1],\"messages\":7}");
    dol_completion_params p;
    dol_api_error e;
    assert_int_equal(dol_api_parse_completion(body, &LIM, &p, &e), 0);
    dol_api_completion_params_free(&p);
    cJSON_Delete(body);
}

static void test_tokenizer_bodies(void **state)
{
    (void)state;
    dol_tokenize_params p;
    dol_api_error e = {0};
    cJSON *b = cJSON_Parse("{\"prompt\":\"hi\",\"add_special_tokens\":false,\"model\":\"m\"}");
    assert_int_equal(dol_api_parse_tokenize(b, &p, &e), 0);
    assert_string_equal(p.prompt, "hi");
    assert_false(p.add_special_tokens);
    assert_string_equal(p.model, "m");
    dol_api_tokenize_params_free(&p);
    cJSON_Delete(b);
    b = cJSON_Parse("{\"prompt\":\"hi\",\"messages\":[]}");
    assert_int_equal(dol_api_parse_tokenize(b, &p, &e), -1);
    dol_api_tokenize_params_free(&p);
    cJSON_Delete(b);

    char *model = NULL;
    int32_t *ids = NULL;
    int n = 0;
    b = cJSON_Parse("{\"tokens\":[1,2,31999]}");
    assert_int_equal(dol_api_parse_detokenize(b, 32000, &model, &ids, &n, &e), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[2], 31999);
    free(ids);
    cJSON_Delete(b);
    static const char *bad[] = {"{\"tokens\":[32000]}", "{\"tokens\":[1e300]}",
                                "{\"tokens\":[-0.5]}", "{\"tokens\":{}}", "{}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        b = cJSON_Parse(bad[i]);
        assert_int_equal(dol_api_parse_detokenize(b, 32000, &model, &ids, &n, &e), -1);
        assert_string_equal(e.param, "tokens");
        assert_null(ids);
        cJSON_Delete(b);
    }
}

/* ---- rendering ----------------------------------------------------------------- */

static void test_chat_json(void **state)
{
    (void)state;
    int32_t pids[] = {1, 2, 3}, tids[] = {4, 5};
    dol_api_meta m = {"chatcmpl-x", "m", 7, pids, 3};
    dol_api_choice ch = {.index = 1, .text = "hi\xff", .text_len = 3, .finish = "stop",
                         .token_ids = tids, .n_token_ids = 2};
    dol_api_usage u = {3, 2};
    cJSON *j = dol_api_chat_json(&m, &ch, 1, &u);
    char *s = cJSON_PrintUnformatted(j);
    assert_string_equal(s, "{\"id\":\"chatcmpl-x\",\"object\":\"chat.completion\",\"created\":7,"
                           "\"model\":\"m\",\"prompt_token_ids\":[1,2,3],\"choices\":[{\"index\":1,"
                           "\"message\":{\"role\":\"assistant\",\"content\":\"hi\xef\xbf\xbd\"},"
                           "\"logprobs\":null,\"finish_reason\":\"stop\",\"token_ids\":[4,5]}],"
                           "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,"
                           "\"total_tokens\":5}}");
    free(s);
    cJSON_Delete(j);

    dol_api_meta m2 = {"chatcmpl-x", "m", 7, NULL, 0};
    dol_api_choice c2[2] = {{.index = 0, .role = true, .text = "", .text_len = 0},
                            {.index = 1, .finish = "length"}};
    j = dol_api_chat_chunk_json(&m2, c2, 2, NULL);
    s = cJSON_PrintUnformatted(j);
    assert_string_equal(s, "{\"id\":\"chatcmpl-x\",\"object\":\"chat.completion.chunk\","
                           "\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":"
                           "{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                           "\"finish_reason\":null},{\"index\":1,\"delta\":{},\"logprobs\":null,"
                           "\"finish_reason\":\"length\"}]}");
    free(s);
    cJSON_Delete(j);
}

int main(void)
{
    const char *shared = getenv("DOLPHIN_SHARED");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/tiny-llama2/tokenizer.model", shared ? shared : "../shared");
    struct stat st;
    char err[DOL_ERR_LEN];
    if (stat(path, &st) == 0 && dol_tokenizer_load(path, &g_tok, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    if (!g_tok) fprintf(stderr, "test_api: %s not found: chat-format tests skipped\n", path);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_format_pairs),
        cmocka_unit_test(test_chat_format_strips_unicode_space),
        cmocka_unit_test(test_chat_format_literal_specials),
        cmocka_unit_test(test_chat_format_role_order),
        cmocka_unit_test(test_messages_shapes),
        cmocka_unit_test(test_chat_params),
        cmocka_unit_test(test_completion_refusals),
        cmocka_unit_test(test_tokenizer_bodies),
        cmocka_unit_test(test_chat_json),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    dol_tokenizer_free(g_tok);
    return rc;
}
