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

/* response_format: compiled while parsing, on both routes; refusals name
 * response_format and, for a schema keyword, the keyword and its pointer. */
static void test_response_format(void **state)
{
    (void)state;
    static const char *const ok[] = {
        "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}",
        "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
        "{\"name\":\"n\",\"strict\":true,\"schema\":{\"type\":\"array\",\"items\":{\"enum\":[1,2]}}}}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":"
        "{\"type\":\"json_object\"}}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        cJSON *body = cJSON_Parse(ok[i]);
        dol_completion_params p;
        dol_api_error e = {0};
        int rc = i < 2 ? dol_api_parse_completion(body, &LIM, &p, &e)
                       : dol_api_parse_chat(body, &LIM, &p, &e);
        assert_int_equal(rc, 0);
        assert_non_null(p.grammar);
        dol_api_completion_params_free(&p);
        cJSON_Delete(body);
    }
    cJSON *body = cJSON_Parse("{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\","
                              "\"json_schema\":{\"schema\":{\"properties\":{\"a\":{\"type\":"
                              "\"string\",\"pattern\":\"x\"}}}}}}");
    dol_completion_params p;
    dol_api_error e = {0};
    assert_int_equal(dol_api_parse_completion(body, &LIM, &p, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "response_format");
    assert_non_null(strstr(e.message, "'pattern' at /properties/a/pattern"));
    assert_null(p.grammar);
    dol_api_completion_params_free(&p);
    cJSON_Delete(body);
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
    /* llama.cpp's spelling: `content`, BOS only with add_special */
    b = cJSON_Parse("{\"content\":\"hi\"}");
    assert_int_equal(dol_api_parse_tokenize(b, &p, &e), 0);
    assert_string_equal(p.prompt, "hi");
    assert_false(p.add_special_tokens);
    dol_api_tokenize_params_free(&p);
    cJSON_Delete(b);
    b = cJSON_Parse("{\"content\":\"hi\",\"add_special\":true}");
    assert_int_equal(dol_api_parse_tokenize(b, &p, &e), 0);
    assert_true(p.add_special_tokens);
    dol_api_tokenize_params_free(&p);
    cJSON_Delete(b);
    static const char *bad_tok[][2] = {{"{\"content\":\"a\",\"prompt\":\"a\"}", "content"},
                                       {"{\"content\":1}", "content"},
                                       {"{\"content\":\"a\",\"add_special\":0}", "add_special"},
                                       {"{}", "prompt"}};
    for (size_t i = 0; i < sizeof bad_tok / sizeof bad_tok[0]; i++) {
        b = cJSON_Parse(bad_tok[i][0]);
        assert_int_equal(dol_api_parse_tokenize(b, &p, &e), -1);
        assert_string_equal(e.param, bad_tok[i][1]);
        dol_api_tokenize_params_free(&p);
        cJSON_Delete(b);
    }

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
    dol_api_usage u = {3, 2, 1};
    cJSON *j = dol_api_chat_json(&m, &ch, 1, &u);
    char *s = cJSON_PrintUnformatted(j);
    assert_string_equal(s, "{\"id\":\"chatcmpl-x\",\"object\":\"chat.completion\",\"created\":7,"
                           "\"model\":\"m\",\"prompt_token_ids\":[1,2,3],\"choices\":[{\"index\":1,"
                           "\"message\":{\"role\":\"assistant\",\"content\":\"hi\xef\xbf\xbd\"},"
                           "\"logprobs\":null,\"finish_reason\":\"stop\",\"token_ids\":[4,5]}],"
                           "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,"
                           "\"total_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":1}}}");
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

/* ---- limits ------------------------------------------------------------------ */

static void test_json_depth(void **state)
{
    (void)state;
    static const struct { const char *json; int depth; } cases[] = {
        {"{}", 1},
        {"{\"a\":[[1]]}", 3},
        {"{\"a\":[{},[],{\"b\":[]}]}", 4},
        {"{\"a\":\"[[[[{{\"}", 1},                 /* brackets inside a string */
        {"{\"a\":\"\\\"[[[\"}", 1},               /* an escaped quote stays inside */
        {"{\"a\":\"\\\\\",\"b\":[[]]}", 3},         /* an escaped backslash ends before the quote */
        {"{\"[\":{\"]\":{\"}\":[\"{\"]}}}", 4},         /* keys are strings too */
        {"\"no object\"", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *j = cases[i].json;
        assert_int_equal(dol_api_json_depth(j, strlen(j), 100), cases[i].depth);
    }
    /* Counting stops once past the limit. */
    char deep[2100];
    memset(deep, '[', 1000);
    memset(deep + 1000, ']', 1000);
    deep[2000] = '\0';
    assert_int_equal(dol_api_json_depth(deep, 2000, 1000), 1000);
    assert_int_equal(dol_api_json_depth(deep, 2000, 64), 65);

    /* dol_api_parse_object: exactly max_depth passes, one more is a 400
     * naming the setting; 0 leaves only cJSON's own limit. */
    const char *body = "{\"prompt\":[[1,2]],\"x\":{\"y\":{}}}";   /* depth 3 */
    dol_api_error e = {0};
    cJSON *root = dol_api_parse_object(body, strlen(body), 3, &e);
    assert_non_null(root);
    cJSON_Delete(root);
    assert_null(dol_api_parse_object(body, strlen(body), 2, &e));
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "");
    assert_non_null(strstr(e.message, "max_json_depth"));
    assert_non_null(strstr(e.message, "2"));
    root = dol_api_parse_object(body, strlen(body), 0, &e);
    assert_non_null(root);
    cJSON_Delete(root);
}

/* cJSON reads a \u escape with non-hex digits as U+0000 and cuts the string
 * there; such bodies are refused instead (found by fuzz_request). */
static void test_u_escapes(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "{\"prompt\":\"abc\\u12G4def\"}", "{\"prompt\":\"abc\\uZdef\"}",
        "{\"prompt\":\"\\u0000\"}", "{\"prompt\":\"\\ud83d\\u12\"}", "{\"prompt\":\"\\u",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dol_api_error e = {0};
        assert_null(dol_api_parse_object(bad[i], strlen(bad[i]), 64, &e));
        assert_int_equal(e.status, 400);
    }
    /* an escaped backslash before "u" is no escape; good escapes pass */
    const char *ok = "{\"a\":\"x\\\\u12G4\",\"b\":\"\\u00e9\\uD83D\\udc2c\\u0041\"}";
    dol_api_error e = {0};
    cJSON *root = dol_api_parse_object(ok, strlen(ok), 64, &e);
    assert_non_null(root);
    assert_string_equal(cJSON_GetObjectItem(root, "a")->valuestring, "x\\u12G4");
    assert_string_equal(cJSON_GetObjectItem(root, "b")->valuestring,
                        "\xC3\xA9\xF0\x9F\x90\xAC" "A");
    cJSON_Delete(root);
}

/* One /v1/completions body under lim: 0 or -1 with the error's param. */
static int parse_lim(const char *json, const dol_api_limits *lim, dol_completion_params *p,
                     dol_api_error *e)
{
    cJSON *body = cJSON_Parse(json);
    assert_non_null(body);
    int rc = dol_api_parse_completion(body, lim, p, e);
    cJSON_Delete(body);
    return rc;
}

static void expect_limit(const char *json, const dol_api_limits *lim, const char *param,
                         const char *setting)
{
    dol_completion_params p;
    dol_api_error e = {0};
    assert_int_equal(parse_lim(json, lim, &p, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, param);
    if (!strstr(e.message, setting)) {
        print_error("\"%s\" does not name %s\n", e.message, setting);
        fail();
    }
    dol_api_completion_params_free(&p);
}

static void expect_ok(const char *json, const dol_api_limits *lim)
{
    dol_completion_params p;
    dol_api_error e = {0};
    if (parse_lim(json, lim, &p, &e) != 0) {
        print_error("%s: %s\n", json, e.message);
        fail();
    }
    dol_api_completion_params_free(&p);
}

static void test_configured_limits(void **state)
{
    (void)state;
    dol_api_limits lim = LIM;
    lim.max_n = 2;
    lim.max_stop = 2;
    lim.max_stop_len = 5;
    lim.max_logit_bias = 2;
    lim.max_tokens_cap = 50;
    expect_ok("{\"prompt\":\"x\",\"n\":2,\"best_of\":2,\"stop\":[\"abcde\",\"b\"],"
              "\"logit_bias\":{\"5\":1,\"6\":2},\"max_tokens\":50}", &lim);
    expect_limit("{\"prompt\":\"x\",\"n\":3}", &lim, "n", "max_n");
    expect_limit("{\"prompt\":\"x\",\"best_of\":3,\"n\":2}", &lim, "best_of", "max_n");
    expect_limit("{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\"]}", &lim, "stop", "max_stop");
    expect_limit("{\"prompt\":\"x\",\"stop\":\"abcdef\"}", &lim, "stop", "max_stop_len");
    expect_limit("{\"prompt\":\"x\",\"stop\":[\"a\",\"abcdef\"]}", &lim, "stop", "max_stop_len");
    expect_limit("{\"prompt\":\"x\",\"logit_bias\":{\"5\":1,\"6\":2,\"7\":3}}", &lim,
                 "logit_bias", "max_logit_bias");
    expect_limit("{\"prompt\":\"x\",\"max_tokens\":51}", &lim, "max_tokens", "max_tokens_cap");
    /* a huge value is echoed short, not as 309 digits */
    expect_limit("{\"prompt\":\"x\",\"max_tokens\":1e308}", &lim, "max_tokens", "(got 1e+308)");

    /* The default max_tokens never exceeds the cap. */
    dol_completion_params p;
    dol_api_error e = {0};
    lim.default_max_tokens = 100;
    assert_int_equal(parse_lim("{\"prompt\":\"x\"}", &lim, &p, &e), 0);
    assert_int_equal(p.max_tokens, 50);
    dol_api_completion_params_free(&p);

    /* chat: max_completion_tokens too */
    cJSON *body = cJSON_Parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                              "\"max_completion_tokens\":51}");
    assert_int_equal(dol_api_parse_chat(body, &lim, &p, &e), -1);
    assert_string_equal(e.param, "max_completion_tokens");
    assert_non_null(strstr(e.message, "max_tokens_cap"));
    dol_api_completion_params_free(&p);
    cJSON_Delete(body);

    /* 0 = the built-in defaults; limits past the arrays are held to them. */
    lim = LIM;
    expect_ok("{\"prompt\":\"x\",\"n\":16,\"stop\":[\"a\",\"b\",\"c\",\"d\"]}", &lim);
    expect_limit("{\"prompt\":\"x\",\"n\":17}", &lim, "n", "max_n");
    expect_limit("{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", &lim, "stop",
                 "max_stop");
    lim.max_stop = 10;
    lim.max_logit_bias = 1000;
    expect_limit("{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", &lim, "stop",
                 "max_stop");
    char json[8192] = "{\"prompt\":\"x\",\"logit_bias\":{";
    for (int i = 0; i < 301; i++)
        snprintf(json + strlen(json), sizeof json - strlen(json), "%s\"%d\":1", i ? "," : "", i);
    strcat(json, "}}");
    expect_limit(json, &lim, "logit_bias", "max_logit_bias");
    char stop[600], json2[700];
    memset(stop, 'a', 513);
    stop[513] = '\0';
    snprintf(json2, sizeof json2, "{\"prompt\":\"x\",\"stop\":\"%s\"}", stop);
    expect_limit(json2, &lim, "stop", "max_stop_len");
    stop[512] = '\0';
    snprintf(json2, sizeof json2, "{\"prompt\":\"x\",\"stop\":\"%s\"}", stop);
    expect_ok(json2, &lim);
}

static void test_prompt_limits(void **state)
{
    (void)state;
    dol_api_limits lim = LIM;   /* context 1024 */
    dol_api_error e = {0};
    /* At the context, the scheduler's fit is the check (test_scheduler.c). */
    assert_int_equal(dol_api_check_prompt_tokens(5000, &lim, "prompt", &e), 0);
    lim.max_prompt_tokens = 100;
    assert_int_equal(dol_api_check_prompt_tokens(100, &lim, "prompt", &e), 0);
    assert_int_equal(dol_api_check_prompt_tokens(101, &lim, "messages", &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "messages");
    assert_string_equal(e.code, "context_length_exceeded");
    assert_non_null(strstr(e.message, "max_prompt_tokens"));
    assert_non_null(strstr(e.message, "101"));

    /* The bound before tokenizing: over max_prompt_tokens. Whether the
     * prompt leaves room in the context is the scheduler's fit. */
    assert_int_equal(dol_api_check_prompt_bound(100, &lim, "prompt", &e), 0);
    assert_int_equal(dol_api_check_prompt_bound(101, &lim, "prompt", &e), -1);
    assert_string_equal(e.param, "prompt");
    assert_string_equal(e.code, "context_length_exceeded");
    assert_non_null(strstr(e.message, "max_prompt_tokens"));
    lim.max_prompt_tokens = 0;
    assert_int_equal(dol_api_check_prompt_bound(5000, &lim, "prompt", &e), 0);
}

/* Each scheduler reason maps to one status, type, code and param, and the
 * context-length message names the figures. */
static void test_reason_errors(void **state)
{
    (void)state;
    dol_api_error e = {0};
    dol_reason_info in = {.reason = DOL_REASON_CONTEXT_OVERFLOW, .n_prompt = 1000,
                          .max_tokens = 100, .n = 1, .limit = 1024};
    dol_api_error_from_reason(&e, &in, "prompt");
    assert_int_equal(e.status, 400);
    assert_string_equal(e.code, "context_length_exceeded");
    assert_string_equal(e.param, "max_tokens");
    assert_non_null(strstr(e.message, "maximum context length is 1024 tokens"));
    assert_non_null(strstr(e.message, "1100 tokens (1000 in the prompt, 100 for the completion)"));
    in.n_prompt = 1024;
    dol_api_error_from_reason(&e, &in, "prompt");
    assert_string_equal(e.param, "prompt");
    in.max_tokens = -1;   /* chat without max_tokens: no room left */
    dol_api_error_from_reason(&e, &in, "messages");
    assert_string_equal(e.param, "messages");
    assert_non_null(strstr(e.message, "no room for the answer"));
    in.max_tokens = 1;
    dol_api_error_prompt_too_long(&e, &in, "messages");
    assert_string_equal(e.param, "messages");
    assert_non_null(strstr(e.message, "without tokenizing"));

    static const struct { dol_reason r; int status; const char *type, *code; } map[] = {
        {DOL_REASON_QUEUE_FULL, 429, "rate_limit_exceeded", "queue_full"},
        {DOL_REASON_DRAINING, 503, "service_unavailable", "server_draining"},
        {DOL_REASON_KV_OVERFLOW, 400, "invalid_request_error", "context_length_exceeded"},
        {DOL_REASON_BAD_TOKEN, 400, "invalid_request_error", ""},
        {DOL_REASON_TOO_MANY_CHOICES, 400, "invalid_request_error", ""},
        {DOL_REASON_INVALID, 400, "invalid_request_error", ""},
        {DOL_REASON_TIMED_OUT, 504, "timeout_error", "request_timeout"},
        {DOL_REASON_NO_MEMORY, 500, "internal_error", ""},
        {DOL_REASON_BACKEND_FAILURE, 500, "server_error", ""},
        {DOL_REASON_GRAMMAR_BROKEN, 500, "server_error", ""},
        {DOL_REASON_CANCELLED, 499, "cancelled", ""},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        dol_reason_info x = {.reason = map[i].r, .n_prompt = 10, .max_tokens = 5, .n = 2,
                             .limit = 8, .timeout_ms = 2500};
        memset(&e, 0, sizeof e);
        dol_api_error_from_reason(&e, &x, "prompt");
        assert_int_equal(e.status, map[i].status);
        assert_string_equal(e.type, map[i].type);
        assert_string_equal(e.code, map[i].code);
        assert_true(e.message[0] != '\0');
    }
    dol_reason_info t = {.reason = DOL_REASON_TIMED_OUT, .timeout_ms = 2500};
    dol_api_error_from_reason(&e, &t, NULL);
    assert_non_null(strstr(e.message, "2.5 s"));
    dol_reason_info n = {.reason = DOL_REASON_TOO_MANY_CHOICES, .n = 9, .limit = 8};
    dol_api_error_from_reason(&e, &n, NULL);
    assert_string_equal(e.param, "n");
    assert_non_null(strstr(e.message, "max_batch_size"));
}

/* dol_api_chat_min_tokens never exceeds the real count, and checks the
 * roles as dol_api_chat_prompt_ids does. */
static void test_chat_min_tokens(void **state)
{
    (void)state;
    if (!g_tok) skip();
    static const char *const convs[] = {
        "[{\"role\":\"user\",\"content\":\"hi\"}]",
        "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\" u1 \"},"
        "{\"role\":\"assistant\",\"content\":\"a1\\n\"},{\"role\":\"user\",\"content\":\"u2\"}]",
        "[{\"role\":\"user\",\"content\":\"                                                 \"}]",
        "[{\"role\":\"user\",\"content\":\"\u0430\u0434\u043c\u0438\u043d\u0438\u0441\u0442\"}]",
    };
    for (size_t i = 0; i < sizeof convs / sizeof convs[0]; i++) {
        cJSON *m = cJSON_Parse(convs[i]);
        assert_non_null(m);
        dol_chat_message *msgs = NULL;
        int count = 0;
        dol_api_error e = {0};
        assert_int_equal(dol_api_parse_messages(m, &msgs, &count, &e), 0);
        int64_t min = -1;
        int32_t *ids = NULL;
        int n = 0;
        assert_int_equal(dol_api_chat_min_tokens(g_tok, msgs, count, &min, &e), 0);
        assert_int_equal(dol_api_chat_prompt_ids(g_tok, msgs, count, &ids, &n, &e), 0);
        assert_true(min >= 1 && min <= n);
        free(ids);
        dol_api_messages_free(msgs, count);
        cJSON_Delete(m);
    }
    cJSON *m = cJSON_Parse("[{\"role\":\"assistant\",\"content\":\"x\"}]");
    dol_chat_message *msgs = NULL;
    int count = 0;
    dol_api_error e = {0};
    assert_int_equal(dol_api_parse_messages(m, &msgs, &count, &e), 0);
    int64_t min = -1;
    assert_int_equal(dol_api_chat_min_tokens(g_tok, msgs, count, &min, &e), -1);
    assert_string_equal(e.param, "messages");
    dol_api_messages_free(msgs, count);
    cJSON_Delete(m);
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
        cmocka_unit_test(test_response_format),
        cmocka_unit_test(test_tokenizer_bodies),
        cmocka_unit_test(test_chat_json),
        cmocka_unit_test(test_json_depth),
        cmocka_unit_test(test_u_escapes),
        cmocka_unit_test(test_configured_limits),
        cmocka_unit_test(test_prompt_limits),
        cmocka_unit_test(test_reason_errors),
        cmocka_unit_test(test_chat_min_tokens),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    dol_tokenizer_free(g_tok);
    return rc;
}
