/* tests/unit/test_grammar.c — the constrained-decoding module
 * (include/dolphin/grammar.h): texts the JSON and schema automata accept and
 * refuse, schemas refused with their keyword and pointer, and the masks
 * checked token by token against accepting each token on its own (both
 * fixture vocabularies: 512 and 32,000 pieces, byte fallback included). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "dolphin/grammar.h"
#include "test_fixtures.h"

static bool accepts(dol_grammar *g, const char *text, bool *complete)
{
    dol_matcher *m = dol_matcher_new(g);
    assert_non_null(m);
    bool ok = dol_matcher_accept_bytes(m, text, strlen(text));
    if (complete) *complete = ok && dol_matcher_complete(m);
    dol_matcher_free(m);
    return ok;
}

/* text is accepted and is a complete value */
static void full(dol_grammar *g, const char *text)
{
    bool c = false;
    if (!accepts(g, text, &c) || !c) fail_msg("not accepted as a whole: %s", text);
}

/* text is a prefix that can still be completed */
static void prefix(dol_grammar *g, const char *text)
{
    bool c = true;
    if (!accepts(g, text, &c) || c) fail_msg("not a live incomplete prefix: %s", text);
}

static void refused(dol_grammar *g, const char *text)
{
    if (accepts(g, text, NULL)) fail_msg("accepted: %s", text);
}

static dol_grammar *schema(const char *s)
{
    char msg[256];
    bool oom;
    dol_grammar *g = NULL;
    if (dol_grammar_from_schema(s, strlen(s), 0, &g, msg, sizeof msg, &oom) != 0)
        fail_msg("schema refused: %s: %s", s, msg);
    return g;
}

static void schema_error(const char *s, int max_states, const char *want)
{
    char msg[256] = "";
    bool oom;
    dol_grammar *g = NULL;
    assert_int_equal(dol_grammar_from_schema(s, strlen(s), max_states, &g, msg, sizeof msg, &oom), -1);
    assert_null(g);
    assert_false(oom);
    if (!strstr(msg, want)) fail_msg("error \"%s\" does not say \"%s\"", msg, want);
}

static void test_json_object(void **state)
{
    (void)state;
    dol_grammar *g = dol_grammar_json_object();
    assert_non_null(g);
    full(g, "{}");
    full(g, "{ }");
    full(g, "{\"a\":1}");
    full(g, "{\"a\": [1, -2.5e3, true, null, \"x\\u00e9\\n\"], \"b\": {\"c\": {}}}");
    full(g, "{\"\xc3\xa9\": \"\xe2\x82\xac\xf0\x9f\x98\x80\"}");
    prefix(g, "{\"a\": 12");
    prefix(g, "{\"a\": \"\xe2\x82");
    refused(g, " {}");           /* no leading whitespace */
    refused(g, "[]");            /* an object */
    refused(g, "{}x");
    refused(g, "{} ");
    refused(g, "{\"a\" 1}");
    refused(g, "{\"a\": 01}");
    full(g, "{\"a\": -0}");
    refused(g, "{\"a\": \"\x01\"}");
    refused(g, "{\"a\": \"\xc0\x80\"}");      /* overlong */
    refused(g, "{\"a\": \"\xed\xa0\x80\"}");  /* surrogate */
    refused(g, "{\"a\": \"\\ud800\"}");       /* escaped surrogate */
    refused(g, "{\"a\": \"\\q\"}");
    refused(g, "{\"a\":1,}");
    full(g, "{\n }");
    refused(g, "{   }");         /* more whitespace than the bound */
    refused(g, "{\"a\": tru}");
    dol_grammar_release(g);
}

static void test_schema_values(void **state)
{
    (void)state;
    dol_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\","
                            "\"minLength\":2,\"maxLength\":3},\"age\":{\"type\":\"integer\","
                            "\"minimum\":-5,\"maximum\":120},\"tags\":{\"type\":\"array\","
                            "\"items\":{\"enum\":[\"a\",\"ab\",\"b\"]},\"maxItems\":2}},"
                            "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}");
    full(g, "{\"name\":\"ab\",\"age\":7}");
    full(g, "{\"age\":-5,\"name\":\"\xc3\xa9\xc3\xa9\xc3\xa9\",\"tags\":[\"ab\",\"a\"]}");
    full(g, "{\"name\":\"ab\",\"age\":120,\"tags\":[]}");
    refused(g, "{\"name\":\"a\",");          /* too short */
    refused(g, "{\"name\":\"abcd");          /* too long */
    refused(g, "{\"name\":\"ab\"}");         /* age is required */
    refused(g, "{\"name\":\"ab\",\"age\":121");
    refused(g, "{\"name\":\"ab\",\"age\":-6");
    refused(g, "{\"name\":\"ab\",\"name\"");  /* twice */
    refused(g, "{\"nick\"");                  /* not declared */
    refused(g, "{\"name\":\"ab\",\"age\":1,\"tags\":[\"a\",\"b\",\"a\"");
    refused(g, "{\"name\":\"ab\",\"age\":1,\"tags\":[\"c\"");
    prefix(g, "{\"name\":\"ab\",\"age\":12");
    dol_grammar_release(g);

    g = schema("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":"
               "\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},"
               "\"required\":[\"v\",\"kids\"],\"additionalProperties\":false}},"
               "\"$ref\":\"#/$defs/node\"}");
    full(g, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"kids\":[{\"v\":3,\"kids\":[]}],\"v\":4}]}");
    refused(g, "{\"v\":1,\"kids\":[{\"v\":2}]}");
    dol_grammar_release(g);

    g = schema("{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"}},"
               "\"required\":[\"x\"],\"additionalProperties\":false},{\"type\":\"object\","
               "\"properties\":{\"y\":{\"type\":\"boolean\"}},\"required\":[\"y\"],"
               "\"additionalProperties\":false}]}");
    full(g, "{\"x\":1.5}");
    full(g, "{\"y\":false}");
    refused(g, "{\"x\":true}");
    refused(g, "{\"x\":1,\"y\":true}");
    dol_grammar_release(g);

    g = schema("{\"type\":[\"string\",\"null\"],\"format\":\"uuid\"}");
    full(g, "null");
    full(g, "\"123e4567-e89b-12d3-a456-426614174000\"");
    refused(g, "\"123e4567e");
    dol_grammar_release(g);

    g = schema("{\"type\":\"array\",\"prefixItems\":[{\"const\":1},{\"type\":\"boolean\"}],"
               "\"items\":false,\"minItems\":1}");
    full(g, "[1]");
    full(g, "[1,true]");
    refused(g, "[]");
    refused(g, "[2");
    refused(g, "[1,true,");
    dol_grammar_release(g);

    g = schema("{\"type\":\"integer\",\"minimum\":10,\"maximum\":12}");
    full(g, "11");
    prefix(g, "1");
    refused(g, "13");
    refused(g, "9");
    dol_grammar_release(g);
}

static void test_schema_refused(void **state)
{
    (void)state;
    schema_error("{\"type\":\"string\",\"pattern\":\"^a\"}", 0, "'pattern' at /pattern");
    schema_error("{\"properties\":{\"a b\":{\"type\":\"string\",\"format\":\"email\"}}}", 0,
                 "/properties/a b/format");
    schema_error("{\"type\":\"object\",\"properties\":{\"x\":{\"not\":{}}}}", 0,
                 "'not' at /properties/x/not");
    schema_error("{\"type\":\"number\",\"minimum\":1}", 0, "'minimum' at /minimum");
    schema_error("{\"type\":\"strin\"}", 0, "invalid schema");
    schema_error("{\"$ref\":\"#/$defs/missing\"}", 0, "names no definition");
    schema_error("{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"string\",\"maxLength\":3}]}", 0,
                 "oneOf");
    schema_error("{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", 0, "allOf");
    schema_error("{\"type\":\"object\",\"allOf\":[{\"properties\":{\"a\":{}}},{\"required\":[\"a\"]}],\"additionalProperties\":false}", 0, "additionalProperties");
    schema_error("{\"enum\":[\"aaaaaaaaaa\",\"bbbbbbbbbb\",\"cccccccccc\"]}", 20,
                 "max_grammar_states");
    schema_error("{\"type\":\"object\"", 0, "not JSON");
}

/* Schemas whose every value would nest without end are refused, naming the
 * requirement that recurses; satisfiable recursive schemas still compile. */
static void test_schema_no_finite_value(void **state)
{
    (void)state;
    schema_error("{\"$defs\":{\"n\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},"
                 "\"minItems\":1,\"maxItems\":1}},\"$ref\":\"#/$defs/n\"}", 0,
                 "'minItems' at /$defs/n/minItems");
    schema_error("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},"
                 "\"required\":[\"a\"],\"additionalProperties\":false}", 0,
                 "'required' at /required");
    schema_error("{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"array\",\"prefixItems\":[{\"$ref\":\"#\"}],"
                 "\"minItems\":1}]}", 0, "no finite value");
    schema_error("{\"$defs\":{\"a\":{\"type\":\"object\",\"properties\":{\"b\":{\"$ref\":\"#/$defs/b\"}},"
                 "\"required\":[\"b\"]},\"b\":{\"allOf\":[{\"$ref\":\"#/$defs/c\"}]},"
                 "\"c\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/a\"},\"minItems\":2}},"
                 "\"$ref\":\"#/$defs/a\"}", 0, "no finite value");
    /* one branch ends the recursion: accepted */
    dol_grammar *g = schema("{\"$defs\":{\"n\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"array\","
                            "\"items\":{\"$ref\":\"#/$defs/n\"},\"minItems\":1,\"maxItems\":1}]}},"
                            "\"$ref\":\"#/$defs/n\"}");
    full(g, "[[[null]]]");
    refused(g, "[]");
    dol_grammar_release(g);
    g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},\"additionalProperties\":false}");
    full(g, "{\"a\":{\"a\":{}}}");
    dol_grammar_release(g);
}

/* For every token: its mask bit against accepting it on a fresh matcher
 * that has read `pre`. */
static void check_masks(const char *model, dol_grammar *g, const char *const *prefixes, int n)
{
    char dir[1200], path[1300], err[256];
    test_fixture_model(dir, sizeof dir, model);
    snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    dol_tokenizer *tok = NULL;
    assert_int_equal(dol_tokenizer_load(path, &tok, err, sizeof err), 0);
    int vocab = dol_tokenizer_vocab_size(tok);
    dol_grammar_vocab *v = dol_grammar_vocab_new(tok, vocab);
    assert_non_null(v);
    uint64_t *mask = calloc((size_t)dol_grammar_mask_words(v), sizeof *mask);
    assert_non_null(mask);
    for (int p = 0; p < n; p++) {
        for (int round = 0; round < 2; round++) {   /* the second from the cache */
            dol_matcher *m = dol_matcher_new(g);
            assert_true(dol_matcher_accept_bytes(m, prefixes[p], strlen(prefixes[p])));
            dol_matcher_mask(m, v, mask);
            int allowed = 0;
            for (int id = 0; id < vocab; id++) {
                bool bit = mask[id >> 6] >> (id & 63) & 1;
                bool ok;
                if (id == dol_tokenizer_eos_id(tok)) {
                    ok = dol_matcher_complete(m);
                } else {
                    dol_matcher *t = dol_matcher_new(g);
                    assert_true(dol_matcher_accept_bytes(t, prefixes[p], strlen(prefixes[p])));
                    ok = dol_matcher_accept(t, v, id);
                    dol_matcher_free(t);
                }
                if (bit != ok)
                    fail_msg("%s, after '%s': token %d '%s' mask %d, accepted %d", model,
                             prefixes[p], id, dol_tokenizer_id_to_piece(tok, id), bit, ok);
                allowed += bit;
            }
            assert_true(allowed > 0);
            dol_matcher_free(m);
        }
    }
    free(mask);
    dol_grammar_vocab_free(v);
    dol_tokenizer_free(tok);
}

static const char *const JSON_PREFIXES[] = {
    "", "{", "{\"a", "{\"a\"", "{\"a\":", "{\"a\": 1", "{\"a\": 1.", "{\"a\":[", "{\"a\":[tr",
    "{\"a\":{\"b\":\"x\\", "{\"a\":\"\xe2", "{\"a\":{}}", "{\"a\":[1,{\"b\":null}", "{ ",
};

static void test_masks_json_small(void **state)
{
    (void)state;
    dol_grammar *g = dol_grammar_json_object();
    check_masks("stories260K", g, JSON_PREFIXES, (int)(sizeof JSON_PREFIXES / sizeof JSON_PREFIXES[0]));
    dol_grammar_release(g);
}

static void test_masks_json_llama(void **state)
{
    (void)state;
    dol_grammar *g = dol_grammar_json_object();
    static const char *const some[] = {"{\"a\": 1", "{\"a\":\"xy", "{\"a\":[1,{\"b\":null}", ""};
    check_masks("tiny-llama2", g, some, 4);
    dol_grammar_release(g);
}

static void test_masks_schema(void **state)
{
    (void)state;
    dol_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\","
                            "\"maxLength\":3},\"n\":{\"type\":\"integer\",\"minimum\":0,"
                            "\"maximum\":250},\"k\":{\"enum\":[\"red\",\"green\",7]}},"
                            "\"required\":[\"name\"],\"additionalProperties\":false}");
    static const char *const pre[] = {"", "{", "{\"n", "{\"n\":2", "{\"n\":25", "{\"name\":\"ab",
                                      "{\"name\":\"abc", "{\"k\":\"gr", "{\"k\":7",
                                      "{\"name\":\"\",\"n\":0,\"k\":\"red\""};
    check_masks("stories260K", g, pre, (int)(sizeof pre / sizeof pre[0]));
    dol_grammar_release(g);
}

/* The id of the token whose text is `piece` (or its byte token). */
static int token_id(const dol_tokenizer *tok, const char *piece, const char *byte)
{
    int id = dol_tokenizer_piece_to_id(tok, piece);
    if (id < 0 || id == dol_tokenizer_piece_to_id(tok, "<unk>"))
        id = dol_tokenizer_piece_to_id(tok, byte);
    assert_true(id >= 0);
    return id;
}

/* Near the depth bound a recursive schema whose shallowest value needs
 * several levels (here [[[null]]]) only lets values open that can close in
 * time: opening '[' greedily stops short of the bound, and from there the
 * mask is never empty and leads to a complete value (EOS allowed). */
static void test_depth_bound_keeps_a_completion(void **state)
{
    (void)state;
    dol_grammar *g = schema(
        "{\"$defs\":{\"n\":{\"anyOf\":[{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},"
        "\"minItems\":1,\"maxItems\":1},{\"type\":\"array\",\"minItems\":1,\"maxItems\":1,"
        "\"items\":{\"type\":\"array\",\"minItems\":1,\"maxItems\":1,\"items\":{\"type\":\"array\","
        "\"minItems\":1,\"maxItems\":1,\"items\":{\"type\":\"null\"}}}}]}},\"$ref\":\"#/$defs/n\"}");
    char dir[512], path[600], err[256];
    test_fixture_model(dir, sizeof dir, "stories260K");
    snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    dol_tokenizer *tok = NULL;
    assert_int_equal(dol_tokenizer_load(path, &tok, err, sizeof err), 0);
    int vocab = dol_tokenizer_vocab_size(tok), eos = dol_tokenizer_eos_id(tok);
    int open = token_id(tok, "[", "<0x5B>"), close = token_id(tok, "]", "<0x5D>");
    dol_grammar_vocab *v = dol_grammar_vocab_new(tok, vocab);
    assert_non_null(v);
    uint64_t *mask = calloc((size_t)dol_grammar_mask_words(v), sizeof *mask);
    assert_non_null(mask);
#define BIT(id) (mask[(id) >> 6] >> ((id) & 63) & 1)
    for (int round = 0; round < 2; round++) {   /* the second from the cache */
        dol_matcher *m = dol_matcher_new(g);
        int opened = 0, steps = 0;
        for (;;) {
            dol_matcher_mask(m, v, mask);
            if (!BIT(open)) break;
            assert_true(dol_matcher_accept(m, v, open));
            opened++;
        }
        assert_true(opened >= 500 && opened <= 511);
        /* close: EOS when allowed, else ']', else the lowest allowed token */
        for (;; steps++) {
            assert_true(steps < 4000);
            dol_matcher_mask(m, v, mask);
            if (BIT(eos)) break;
            int pick = BIT(close) ? close : -1;
            for (int id = 0; id < vocab && pick < 0; id++)
                if (BIT(id)) pick = id;
            if (pick < 0) fail_msg("empty mask after %d '[' and %d more tokens", opened, steps);
            assert_true(dol_matcher_accept(m, v, pick));
        }
        assert_true(dol_matcher_complete(m));
        dol_matcher_free(m);
    }
#undef BIT
    /* bytes: a recursive object stops offering its key where the value
     * could no longer close; closing every level then completes it */
    dol_grammar_release(g);
    g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},"
               "\"additionalProperties\":false}");
    dol_matcher *m = dol_matcher_new(g);
    int levels = 0;
    while (dol_matcher_accept_bytes(m, "{", 1)) {
        levels++;
        if (!dol_matcher_accept_bytes(m, "\"a\":", 4)) break;
    }
    assert_true(levels >= 200 && levels < 512);
    for (int i = 0; i < levels; i++) assert_true(dol_matcher_accept_bytes(m, "}", 1));
    assert_true(dol_matcher_complete(m));
    dol_matcher_free(m);
    free(mask);
    dol_grammar_vocab_free(v);
    dol_tokenizer_free(tok);
    dol_grammar_release(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_object),
        cmocka_unit_test(test_schema_values),
        cmocka_unit_test(test_schema_refused),
        cmocka_unit_test(test_schema_no_finite_value),
        cmocka_unit_test(test_masks_json_small),
        cmocka_unit_test(test_masks_json_llama),
        cmocka_unit_test(test_masks_schema),
        cmocka_unit_test(test_depth_bound_keeps_a_completion),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
