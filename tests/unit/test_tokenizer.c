/* tests/unit/test_tokenizer.c — unit tests for include/dolphin/tokenizer.h:
 * the sentencepiece wrapper against the Llama-2 tokenizer goldens, and the
 * incremental detokenizer against sentencepiece's full decode (model goldens,
 * hand-picked byte-fallback cases, seeded random id sequences).
 * Needs the fixtures under $DOLPHIN_SHARED; exits 77 (skip) without them. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dolphin/tokenizer.h"

static char g_shared[4096];
static dol_tokenizer *g_llama;   /* tiny-llama2/tokenizer.model (32000) */
static dol_tokenizer *g_stories; /* stories260K/tokenizer.model (512) */

#define BOS 1
#define EOS 2
#define UNK 0
#define BYTE(b) ((int32_t)(b) + 3) /* <0x00> is id 3 in both vocabularies */
#define ID_HELLO 15043             /* "▁Hello" */
#define ID_WORLD 3186              /* "▁world" */
#define ID_SPACE 29871             /* "▁" */
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ---------------------------------------------------------------- helpers */

/* Well-formed UTF-8 (RFC 3629: no overlongs, surrogates or > U+10FFFF). */
static bool utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        const unsigned c = p[i];
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) { i++; continue; }
        else if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else return false;
        if (i + len > n) return false;
        if (p[i + 1] < lo || p[i + 1] > hi) return false;
        for (size_t k = 2; k < len; k++)
            if (p[i + k] < 0x80 || p[i + k] > 0xBF) return false;
        i += len;
    }
    return true;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf) buf[n] = '\0';
    fclose(f);
    return buf;
}

static cJSON *load_golden(const char *name)
{
    char path[8192];
    snprintf(path, sizeof path, "%s/golden/%s", g_shared, name);
    char *text = read_file(path);
    if (!text) fail_msg("cannot read %s", path);
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) fail_msg("cannot parse %s", path);
    return j;
}

static int32_t *json_ids(const cJSON *arr, size_t *n)
{
    assert_true(cJSON_IsArray(arr));
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    assert_non_null(ids);
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) ids[i++] = (int32_t)it->valueint;
    return ids;
}

static const char *json_str(const cJSON *obj, const char *key)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(obj, key);
    assert_true(cJSON_IsString(s));
    return s->valuestring;
}

static void assert_ids_eq(const int32_t *a, size_t na, const int32_t *b, size_t nb,
                          const char *what)
{
    if (na != nb) fail_msg("%s: %zu ids, expected %zu", what, na, nb);
    for (size_t i = 0; i < na; i++)
        if (a[i] != b[i]) fail_msg("%s: id %zu is %d, expected %d", what, i, a[i], b[i]);
}

static void assert_bytes_eq(const char *a, size_t na, const char *b, size_t nb,
                            const char *what)
{
    if (na != nb || memcmp(a, b, na) != 0)
        fail_msg("%s: got %zu bytes \"%.*s\", expected %zu bytes \"%.*s\"", what, na,
                 (int)na, a, nb, (int)nb, b);
}

static char *decode_ok(const dol_tokenizer *tok, const int32_t *ids, size_t n,
                       size_t *len)
{
    char err[DOL_ERR_LEN] = "";
    char *text = NULL;
    if (dol_tokenizer_decode(tok, ids, n, &text, len, err, sizeof err) != 0)
        fail_msg("decode failed: %s", err);
    assert_non_null(text);
    assert_int_equal(text[*len], '\0');
    return text;
}

/* decode(a + b) */
static char *decode_cat(const dol_tokenizer *tok, const int32_t *a, size_t na,
                        const int32_t *b, size_t nb, size_t *len)
{
    int32_t *all = malloc((na + nb + 1) * sizeof *all);
    assert_non_null(all);
    if (na) memcpy(all, a, na * sizeof *all);
    if (nb) memcpy(all + na, b, nb * sizeof *all);
    char *t = decode_ok(tok, all, na + nb, len);
    free(all);
    return t;
}

/* Stream gen through a detokenizer started on prompt. Every chunk must be
 * whole UTF-8 characters; returns the concatenation (malloc'd). */
static char *stream(const dol_tokenizer *tok, const int32_t *prompt, size_t np,
                    const int32_t *gen, size_t ng, size_t *len)
{
    dol_detok *d = dol_detok_new(tok, prompt, np);
    assert_non_null(d);
    char *out = NULL;
    size_t out_len = 0, out_cap = 0;
    for (size_t i = 0; i < ng; i++) {
        const size_t before = out_len;
        const int r = dol_detok_push(d, gen[i], &out, &out_len, &out_cap);
        if (r < 0) fail_msg("push of id %d (#%zu) failed", gen[i], i);
        assert_int_equal((size_t)r, out_len - before);
        assert_non_null(out);
        assert_int_equal(out[out_len], '\0');
        if (!utf8_valid(out + before, (size_t)r))
            fail_msg("chunk %zu (id %d) is not whole UTF-8: \"%.*s\"", i, gen[i], r,
                     out + before);
    }
    const size_t before = out_len;
    const int r = dol_detok_finish(d, &out, &out_len, &out_cap);
    assert_true(r >= 0);
    assert_int_equal((size_t)r, out_len - before);
    assert_non_null(out);
    if (!utf8_valid(out + before, (size_t)r)) fail_msg("final chunk is not whole UTF-8");
    dol_detok_free(d);
    *len = out_len;
    return out;
}

/* The text the detokenizer must produce: decode(prompt + gen) - decode(prompt).
 * For a prompt that ends inside a character (its last `tail` ids are bytes
 * of an incomplete character) that the generated bytes complete, the
 * subtraction is not defined by bytes; then the completed character counts
 * as generated: decode(prompt + gen) - decode(prompt minus its tail). */
static char *expected_delta(const dol_tokenizer *tok, const int32_t *prompt, size_t np,
                            size_t tail, const int32_t *gen, size_t ng, size_t *len)
{
    size_t lp, lf;
    char *p = decode_ok(tok, prompt, np, &lp);
    char *f = decode_cat(tok, prompt, np, gen, ng, &lf);
    if (lf < lp || memcmp(p, f, lp) != 0) {
        assert_true(tail > 0); /* only a partial prompt character can do that */
        free(p);
        p = decode_ok(tok, prompt, np - tail, &lp);
        assert_true(lf >= lp && memcmp(p, f, lp) == 0);
    }
    *len = lf - lp;
    char *r = malloc(*len + 1);
    assert_non_null(r);
    memcpy(r, f + lp, *len);
    r[*len] = '\0';
    free(p);
    free(f);
    return r;
}

static void check_stream(const dol_tokenizer *tok, const int32_t *prompt, size_t np,
                         size_t tail, const int32_t *gen, size_t ng, const char *what)
{
    size_t le, lg;
    char *exp = expected_delta(tok, prompt, np, tail, gen, ng, &le);
    char *got = stream(tok, prompt, np, gen, ng, &lg);
    assert_bytes_eq(got, lg, exp, le, what);
    free(exp);
    free(got);
}

/* Push ids one by one and check what each push appends. */
struct step {
    int32_t id;
    const char *appended;
};
static void check_steps(const int32_t *prompt, size_t np, const struct step *steps,
                        size_t n, const char *at_finish)
{
    dol_detok *d = dol_detok_new(g_llama, prompt, np);
    assert_non_null(d);
    char *out = NULL;
    size_t len = 0, cap = 0;
    for (size_t i = 0; i < n; i++) {
        const size_t before = len;
        const int r = dol_detok_push(d, steps[i].id, &out, &len, &cap);
        assert_true(r >= 0);
        assert_bytes_eq(out + before, (size_t)r, steps[i].appended,
                        strlen(steps[i].appended), "step");
    }
    const size_t before = len;
    const int r = dol_detok_finish(d, &out, &len, &cap);
    assert_true(r >= 0);
    assert_bytes_eq(out + before, (size_t)r, at_finish, strlen(at_finish), "finish");
    dol_detok_free(d);
    free(out);
}

/* xorshift64*: the random tests are seeded and reproducible. */
static uint64_t g_rng;
static uint32_t rnd(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 0x2545F4914F6CDD1Dull) >> 32);
}
static uint32_t rnd_below(uint32_t n) { return rnd() % n; }

/* Append the UTF-8 bytes of a random non-ASCII character as byte ids,
 * sometimes truncated so that it never completes. */
static size_t rnd_char_bytes(int32_t *ids, size_t room)
{
    uint32_t cp;
    switch (rnd_below(3)) {
    case 0: cp = 0x80 + rnd_below(0x800 - 0x80); break;
    case 1:
        do cp = 0x800 + rnd_below(0x10000 - 0x800);
        while (cp >= 0xD800 && cp <= 0xDFFF);
        break;
    default: cp = 0x10000 + rnd_below(0x110000 - 0x10000); break;
    }
    unsigned char b[4];
    size_t n;
    if (cp < 0x800) {
        b[0] = (unsigned char)(0xC0 | (cp >> 6));
        b[1] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (unsigned char)(0xE0 | (cp >> 12));
        b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        b[0] = (unsigned char)(0xF0 | (cp >> 18));
        b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    if (rnd_below(5) == 0) n = 1 + rnd_below((uint32_t)n); /* truncated */
    if (n > room) n = room;
    for (size_t i = 0; i < n; i++) ids[i] = BYTE(b[i]);
    return n;
}

/* A random generation of n ids mixing normal pieces, "▁", byte tokens (valid
 * characters, truncated ones, random bytes), BOS/EOS and <unk>. */
static void rnd_ids(int32_t *ids, size_t n, int vocab)
{
    size_t i = 0;
    while (i < n) {
        const uint32_t r = rnd_below(100);
        if (r < 20) i += rnd_char_bytes(ids + i, n - i);
        else if (r < 32) ids[i++] = BYTE(rnd_below(256));
        else if (r < 38) ids[i++] = rnd_below(2) ? BOS : EOS;
        else if (r < 40) ids[i++] = UNK;
        else if (r < 45) ids[i++] = vocab > 1000 ? ID_SPACE : 259;
        else ids[i++] = (int32_t)(259 + rnd_below((uint32_t)vocab - 259));
    }
}

/* ------------------------------------------------------------------ tests */

static void test_load_errors(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN] = "";
    dol_tokenizer *t = (dol_tokenizer *)&err; /* must be reset to NULL */
    assert_int_equal(dol_tokenizer_load("/nonexistent/tokenizer.model", &t, err, sizeof err), -1);
    assert_null(t);
    assert_non_null(strstr(err, "/nonexistent/tokenizer.model"));

    char path[8192];
    snprintf(path, sizeof path, "%s/golden/tokenizer-llama2.json", g_shared);
    err[0] = '\0';
    assert_int_equal(dol_tokenizer_load(path, &t, err, sizeof err), -1);
    assert_null(t);
    assert_non_null(strstr(err, "tokenizer-llama2.json"));
    dol_tokenizer_free(NULL);
}

static void test_vocab(void **state)
{
    (void)state;
    assert_int_equal(dol_tokenizer_vocab_size(g_llama), 32000);
    assert_int_equal(dol_tokenizer_vocab_size(g_stories), 512);
    const dol_tokenizer *toks[] = {g_llama, g_stories};
    for (size_t k = 0; k < NELEM(toks); k++) {
        const dol_tokenizer *t = toks[k];
        assert_int_equal(dol_tokenizer_bos_id(t), BOS);
        assert_int_equal(dol_tokenizer_eos_id(t), EOS);
        assert_true(dol_tokenizer_is_control(t, BOS));
        assert_true(dol_tokenizer_is_control(t, EOS));
        assert_false(dol_tokenizer_is_control(t, UNK));
        assert_false(dol_tokenizer_is_control(t, 300));
        assert_false(dol_tokenizer_is_control(t, -1));
        assert_false(dol_tokenizer_is_control(t, dol_tokenizer_vocab_size(t)));
        for (int b = 0; b < 256; b++) {
            char piece[8];
            snprintf(piece, sizeof piece, "<0x%02X>", b);
            assert_true(dol_tokenizer_is_byte(t, BYTE(b)));
            assert_string_equal(dol_tokenizer_id_to_piece(t, BYTE(b)), piece);
            assert_int_equal(dol_tokenizer_piece_to_id(t, piece), BYTE(b));
        }
        assert_false(dol_tokenizer_is_byte(t, BOS));
        assert_false(dol_tokenizer_is_byte(t, 259));
        assert_false(dol_tokenizer_is_byte(t, -5));
        assert_string_equal(dol_tokenizer_id_to_piece(t, UNK), "<unk>");
        assert_string_equal(dol_tokenizer_id_to_piece(t, BOS), "<s>");
        assert_string_equal(dol_tokenizer_id_to_piece(t, EOS), "</s>");
        assert_int_equal(dol_tokenizer_piece_to_id(t, "<unk>"), UNK);
        assert_int_equal(dol_tokenizer_piece_to_id(t, "<s>"), BOS);
        assert_int_equal(dol_tokenizer_piece_to_id(t, "no-such-piece-\xE2\x98\x83"), -1);
        assert_int_equal(dol_tokenizer_piece_to_id(t, ""), -1);
        assert_null(dol_tokenizer_id_to_piece(t, -1));
        assert_null(dol_tokenizer_id_to_piece(t, dol_tokenizer_vocab_size(t)));
    }
}

static void test_llama_golden(void **state)
{
    (void)state;
    cJSON *g = load_golden("tokenizer-llama2.json");
    const cJSON *c;
    int n_cases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(g, "cases"))
    {
        const char *text = json_str(c, "text");
        size_t n_exp;
        int32_t *exp = json_ids(cJSON_GetObjectItemCaseSensitive(c, "ids"), &n_exp);
        char err[DOL_ERR_LEN];
        int32_t *ids = NULL;
        size_t n = 99;

        assert_int_equal(dol_tokenizer_encode(g_llama, text, strlen(text), false, &ids, &n,
                                              err, sizeof err), 0);
        assert_non_null(ids);
        assert_ids_eq(ids, n, exp, n_exp, text);
        free(ids);

        assert_int_equal(dol_tokenizer_encode(g_llama, text, strlen(text), true, &ids, &n,
                                              err, sizeof err), 0);
        assert_int_equal(n, n_exp + 1);
        assert_int_equal(ids[0], BOS);
        assert_ids_eq(ids + 1, n - 1, exp, n_exp, text);
        free(ids);

        const cJSON *pieces = cJSON_GetObjectItemCaseSensitive(c, "pieces");
        assert_int_equal((size_t)cJSON_GetArraySize(pieces), n_exp);
        for (size_t i = 0; i < n_exp; i++) {
            const char *piece = cJSON_GetArrayItem(pieces, (int)i)->valuestring;
            assert_string_equal(dol_tokenizer_id_to_piece(g_llama, exp[i]), piece);
            assert_int_equal(dol_tokenizer_piece_to_id(g_llama, piece), exp[i]);
        }

        const char *decoded = json_str(c, "decoded");
        size_t len;
        char *dec = decode_ok(g_llama, exp, n_exp, &len);
        assert_bytes_eq(dec, len, decoded, strlen(decoded), text);
        free(dec);
        /* BOS/EOS around it decode to nothing. */
        int32_t *wrapped = malloc((n_exp + 2) * sizeof *wrapped);
        assert_non_null(wrapped);
        wrapped[0] = BOS;
        if (n_exp) memcpy(wrapped + 1, exp, n_exp * sizeof *wrapped);
        wrapped[n_exp + 1] = EOS;
        dec = decode_ok(g_llama, wrapped, n_exp + 2, &len);
        assert_bytes_eq(dec, len, decoded, strlen(decoded), text);
        free(dec);
        free(wrapped);

        /* Streaming the whole text from an empty (BOS) prompt gives it back. */
        const int32_t bos[] = {BOS};
        char *s = stream(g_llama, bos, 1, exp, n_exp, &len);
        assert_bytes_eq(s, len, decoded, strlen(decoded), text);
        free(s);
        s = stream(g_llama, NULL, 0, exp, n_exp, &len);
        assert_bytes_eq(s, len, decoded, strlen(decoded), text);
        free(s);

        free(exp);
        n_cases++;
    }
    assert_true(n_cases >= 10);
    cJSON_Delete(g);
}

static void test_encode_edges(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN];
    int32_t *ids = NULL;
    size_t n = 99;
    /* Empty text: a non-NULL empty array; with BOS just [BOS]. */
    assert_int_equal(dol_tokenizer_encode(g_llama, "", 0, false, &ids, &n, err, sizeof err), 0);
    assert_non_null(ids);
    assert_int_equal(n, 0);
    free(ids);
    assert_int_equal(dol_tokenizer_encode(g_llama, NULL, 0, true, &ids, &n, err, sizeof err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], BOS);
    free(ids);
    /* Only `len` bytes are read. */
    assert_int_equal(dol_tokenizer_encode(g_llama, "Hello world", 5, false, &ids, &n, err,
                                          sizeof err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], ID_HELLO);
    free(ids);
    /* Invalid UTF-8 is accepted and comes back as U+FFFD. */
    const char bad[] = "a\xFF" "b\xE6";
    assert_int_equal(dol_tokenizer_encode(g_llama, bad, sizeof bad - 1, false, &ids, &n, err,
                                          sizeof err), 0);
    size_t len;
    char *dec = decode_ok(g_llama, ids, n, &len);
    assert_true(utf8_valid(dec, len));
    assert_non_null(strstr(dec, "\xEF\xBF\xBD"));
    free(dec);
    free(ids);
    /* Special-token text is literal. */
    assert_int_equal(dol_tokenizer_encode(g_llama, "</s>", 4, false, &ids, &n, err, sizeof err), 0);
    for (size_t i = 0; i < n; i++) assert_false(dol_tokenizer_is_control(g_llama, ids[i]));
    free(ids);
}

static void test_decode_errors(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN] = "";
    char *text = (char *)err;
    size_t len = 7;
    const int32_t too_big[] = {ID_HELLO, 32000};
    assert_int_equal(dol_tokenizer_decode(g_llama, too_big, 2, &text, &len, err, sizeof err), -1);
    assert_null(text);
    assert_int_equal(len, 0);
    assert_non_null(strstr(err, "32000"));
    const int32_t negative[] = {-1};
    err[0] = '\0';
    assert_int_equal(dol_tokenizer_decode(g_llama, negative, 1, &text, &len, err, sizeof err), -1);
    assert_true(err[0] != '\0');
    const int32_t stories_big[] = {600};
    assert_int_equal(dol_tokenizer_decode(g_stories, stories_big, 1, &text, &len, NULL, 0), -1);
    /* Empty input is fine. */
    assert_int_equal(dol_tokenizer_decode(g_llama, NULL, 0, &text, &len, err, sizeof err), 0);
    assert_non_null(text);
    assert_int_equal(len, 0);
    assert_string_equal(text, "");
    free(text);
}

/* Facts about sentencepiece 0.1.97's decoding that the detokenizer relies on. */
static void test_decode_behaviour(void **state)
{
    (void)state;
    static const struct {
        int32_t ids[6];
        size_t n;
        const char *text;
    } cases[] = {
        {{BOS, ID_HELLO}, 2, "Hello"},                   /* BOS is not text */
        {{BOS, BOS, EOS, ID_HELLO}, 4, "Hello"},         /* nor any control */
        {{ID_SPACE, ID_HELLO}, 2, " Hello"},             /* "▁" is the first piece */
        {{BYTE('\n'), ID_HELLO}, 2, "\n Hello"},         /* so is a byte */
        {{BYTE(0x80), ID_HELLO}, 2, "\xEF\xBF\xBD Hello"},   /* an invalid one too */
        {{UNK, ID_HELLO}, 2, " \xE2\x81\x87  Hello"},   /* <unk> is " ⁇ " */
        {{ID_HELLO, EOS, ID_HELLO}, 3, "Hello Hello"},
        {{BYTE(0xE6), BYTE(0x8E), BYTE(0xA8)}, 3, "\xE6\x8E\xA8"},
        {{BYTE(0xE6), BYTE(0x8E)}, 2, "\xEF\xBF\xBD\xEF\xBF\xBD"}, /* one per byte */
        {{BYTE(0xE6), EOS, BYTE(0x8E), BYTE(0xA8)}, 4,               /* EOS breaks */
         "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {{BYTE(0xE0), BYTE(0x80), BYTE(0x80)}, 3,                   /* overlong */
         "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {{BYTE(0xED), BYTE(0xA0), BYTE(0x80)}, 3,                   /* surrogate */
         "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {{BYTE(0xEF), BYTE(0xBF), BYTE(0xBD)}, 3, "\xEF\xBF\xBD"},  /* real U+FFFD */
        {{BYTE(0xF0), BYTE('A')}, 2, "\xEF\xBF\xBD" "A"},
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        size_t len;
        char *t = decode_ok(g_llama, cases[i].ids, cases[i].n, &len);
        assert_bytes_eq(t, len, cases[i].text, strlen(cases[i].text), "decode behaviour");
        free(t);
    }
    /* <0x00> decodes to a NUL byte: decoded text can hold NULs. */
    const int32_t nul[] = {BYTE(0), ID_HELLO};
    size_t len;
    char *t = decode_ok(g_llama, nul, 2, &len);
    assert_bytes_eq(t, len, "\0 Hello", 7, "NUL byte");
    free(t);
}

static void run_model_golden(const char *file, const dol_tokenizer *tok)
{
    cJSON *g = load_golden(file);
    const cJSON *c;
    int n_cases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(g, "cases"))
    {
        const char *prompt = json_str(c, "prompt");
        const char *greedy_text = json_str(c, "greedy_text");
        size_t np, ng, n;
        int32_t *pids = json_ids(cJSON_GetObjectItemCaseSensitive(c, "prompt_ids"), &np);
        int32_t *gids = json_ids(cJSON_GetObjectItemCaseSensitive(c, "greedy_ids"), &ng);
        int32_t *ids = NULL;
        char err[DOL_ERR_LEN];
        assert_int_equal(dol_tokenizer_encode(tok, prompt, strlen(prompt), true, &ids, &n,
                                              err, sizeof err), 0);
        assert_ids_eq(ids, n, pids, np, prompt);
        free(ids);

        size_t len;
        char *s = stream(tok, pids, np, gids, ng, &len);
        assert_bytes_eq(s, len, greedy_text, strlen(greedy_text), prompt);
        free(s);
        check_stream(tok, pids, np, 0, gids, ng, prompt);
        free(pids);
        free(gids);
        n_cases++;
    }
    assert_true(n_cases > 0);
    cJSON_Delete(g);
}

static void test_golden_stories260K(void **state)
{
    (void)state;
    run_model_golden("stories260K.json", g_stories);
}

static void test_golden_tiny_llama2(void **state)
{
    (void)state;
    run_model_golden("tiny-llama2.json", g_llama);
}

/* The CJK / emoji / accented golden strings, streamed token by token after
 * several prompts: no chunk ever holds part of a character, and a byte-split
 * character appears exactly when its last byte arrives. */
static void test_stream_multibyte(void **state)
{
    (void)state;
    cJSON *g = load_golden("tokenizer-llama2.json");
    const int32_t p_bos[] = {BOS};
    const int32_t p_hello[] = {BOS, ID_HELLO};
    const int32_t p_cjk[] = {BOS, ID_SPACE, 30257, BYTE(0xE6), BYTE(0x8E), BYTE(0xA8)};
    const struct {
        const int32_t *ids;
        size_t n;
    } prompts[] = {{NULL, 0}, {p_bos, 1}, {p_hello, 2}, {p_cjk, NELEM(p_cjk)}};
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(g, "cases"))
    {
        const char *text = json_str(c, "text");
        size_t n;
        int32_t *ids = json_ids(cJSON_GetObjectItemCaseSensitive(c, "ids"), &n);
        for (size_t p = 0; p < NELEM(prompts); p++)
            check_stream(g_llama, prompts[p].ids, prompts[p].n, 0, ids, n, text);
        free(ids);
    }
    cJSON_Delete(g);

    /* 推 = <0xE6><0x8E><0xA8>, 🦙 = <0xF0><0x9F><0xA6><0x99> */
    const struct step cjk[] = {
        {ID_SPACE, ""}, {30257, "\xE5\xA4\xA7"}, {BYTE(0xE6), ""}, {BYTE(0x8E), ""},
        {BYTE(0xA8), "\xE6\x8E\xA8"}, {30687, "\xE7\x90\x86"},
    };
    check_steps(p_bos, 1, cjk, NELEM(cjk), "");
    const struct step emoji[] = {
        {953, "em"},          {ID_SPACE, " "},      {BYTE(0xF0), ""},
        {BYTE(0x9F), ""},     {BYTE(0xA6), ""},     {BYTE(0x99), "\xF0\x9F\xA6\x99"},
        {BYTE(0xF0), ""},     {BYTE(0x9F), ""},     {BYTE(0x9A), ""},
        {BYTE(0x80), "\xF0\x9F\x9A\x80"}, {3431, " ok"},
    };
    check_steps(p_bos, 1, emoji, NELEM(emoji), "");
    /* ASCII bytes and a 2-byte character go out at once. */
    const struct step ascii[] = {
        {BYTE('\n'), "\n"}, {BYTE('\t'), "\t"}, {BYTE(0xC3), ""}, {BYTE(0xA9), "\xC3\xA9"},
    };
    const int32_t p_space[] = {BOS, ID_HELLO, ID_SPACE};
    check_steps(p_space, NELEM(p_space), ascii, NELEM(ascii), "");
}

/* Bytes that can never become a character turn into U+FFFD, one per byte,
 * as soon as that is certain; bytes still incomplete at the end likewise. */
static void test_invalid_bytes(void **state)
{
    (void)state;
    const int32_t p_bos[] = {BOS};
    const int32_t p_hello[] = {BOS, ID_HELLO};
#define R "\xEF\xBF\xBD"
    const struct step lone[] = {{BYTE(0x80), R}};
    check_steps(p_bos, 1, lone, NELEM(lone), "");
    const struct step lone_ff[] = {{BYTE(0xFF), R}, {BYTE(0xC0), R}, {BYTE(0xF5), R}};
    check_steps(p_hello, 2, lone_ff, NELEM(lone_ff), "");
    const struct step then_word[] = {{BYTE(0xE6), ""}, {ID_HELLO, R " Hello"}};
    check_steps(p_hello, 2, then_word, NELEM(then_word), "");
    const struct step then_ascii[] = {{BYTE(0xE6), ""}, {BYTE('A'), R "A"}};
    check_steps(p_bos, 1, then_ascii, NELEM(then_ascii), "");
    const struct step two_then_lead[] = {{BYTE(0xE6), ""}, {BYTE(0x8E), ""}, {BYTE(0xE6), R R}};
    check_steps(p_bos, 1, two_then_lead, NELEM(two_then_lead), R);
    const struct step at_end[] = {{BYTE(0xF0), ""}, {BYTE(0x9F), ""}, {BYTE(0xA6), ""}};
    check_steps(p_bos, 1, at_end, NELEM(at_end), R R R);
    const struct step eos_breaks[] = {
        {BYTE(0xE6), ""}, {EOS, R}, {BYTE(0x8E), R}, {BYTE(0xA8), R}};
    check_steps(p_bos, 1, eos_breaks, NELEM(eos_breaks), "");
    const struct step overlong[] = {{BYTE(0xE0), ""}, {BYTE(0x80), R R}};
    check_steps(p_bos, 1, overlong, NELEM(overlong), "");
    const struct step surrogate[] = {{BYTE(0xED), ""}, {BYTE(0xA0), R R}};
    check_steps(p_bos, 1, surrogate, NELEM(surrogate), "");
    const struct step too_big[] = {{BYTE(0xF4), ""}, {BYTE(0x90), R R}};
    check_steps(p_bos, 1, too_big, NELEM(too_big), "");
    const struct step real_fffd[] = {{BYTE(0xEF), ""}, {BYTE(0xBF), ""}, {BYTE(0xBD), R}};
    check_steps(p_bos, 1, real_fffd, NELEM(real_fffd), "");
    const struct step unk[] = {{UNK, " \xE2\x81\x87 "}, {ID_HELLO, " Hello"}};
    check_steps(p_bos, 1, unk, NELEM(unk), "");
    check_steps(p_hello, 2, unk, NELEM(unk), "");
#undef R
}

/* The first generated word keeps its space only after prompt text; control
 * ids (before or mid-stream) are not text and decode to nothing. */
static void test_leading_space(void **state)
{
    (void)state;
    const struct step hello[] = {{ID_HELLO, "Hello"}, {ID_WORLD, " world"}};
    const struct step s_hello[] = {{ID_HELLO, " Hello"}, {ID_WORLD, " world"}};
    const int32_t p_bos[] = {BOS};
    const int32_t p_ctl[] = {BOS, EOS, BOS, EOS, EOS, EOS, EOS, EOS};
    const int32_t hi = dol_tokenizer_piece_to_id(g_llama, "\xE2\x96\x81Hi"); /* "▁Hi" */
    assert_true(hi > 0);
    const int32_t p_hi[] = {BOS, hi};
    const int32_t p_hi_ctl[] = {BOS, hi, EOS, EOS, BOS, EOS, BOS, EOS, EOS, EOS};
    const int32_t p_space[] = {BOS, ID_SPACE}; /* "▁" alone decodes to "" */
    const int32_t p_nl[] = {BYTE('\n')};
    check_steps(NULL, 0, hello, NELEM(hello), "");
    check_steps(p_bos, 1, hello, NELEM(hello), "");
    check_steps(p_ctl, NELEM(p_ctl), hello, NELEM(hello), "");
    check_steps(p_hi, NELEM(p_hi), s_hello, NELEM(s_hello), "");
    check_steps(p_hi_ctl, NELEM(p_hi_ctl), s_hello, NELEM(s_hello), "");
    check_steps(p_space, NELEM(p_space), s_hello, NELEM(s_hello), "");
    check_steps(p_nl, NELEM(p_nl), s_hello, NELEM(s_hello), "");
    /* BOS/EOS generated mid-stream. */
    const struct step mid[] = {{EOS, ""}, {BOS, ""}, {ID_HELLO, "Hello"}, {EOS, ""},
                               {EOS, ""}, {EOS, ""}, {EOS, ""}, {EOS, ""},
                               {BOS, ""}, {ID_WORLD, " world"}};
    check_steps(p_bos, 1, mid, NELEM(mid), "");
    for (int i = 0; i < 8; i++) {
        /* many controls after the first word must not make it "first" again */
        int32_t gen[16];
        size_t n = 0;
        gen[n++] = ID_HELLO;
        for (int k = 0; k < i; k++) gen[n++] = k % 2 ? BOS : EOS;
        gen[n++] = ID_WORLD;
        check_stream(g_llama, p_bos, 1, 0, gen, n, "controls mid-stream");
    }
}

/* Prompts ending inside a character (token-id prompts are taken as given). */
static void test_prompt_partial_char(void **state)
{
    (void)state;
#define R "\xEF\xBF\xBD"
    const int32_t p_e6[] = {BOS, ID_HELLO, BYTE(0xE6)};
    const int32_t p_f09f[] = {BOS, BYTE(0xF0), BYTE(0x9F)};
    const struct step complete[] = {{BYTE(0x8E), ""}, {BYTE(0xA8), "\xE6\x8E\xA8"}};
    check_steps(p_e6, NELEM(p_e6), complete, NELEM(complete), "");
    const struct step broken[] = {{ID_WORLD, " world"}};
    check_steps(p_e6, NELEM(p_e6), broken, NELEM(broken), "");
    const struct step broken_byte[] = {{BYTE(0x8E), ""}, {BYTE('A'), R "A"}};
    check_steps(p_e6, NELEM(p_e6), broken_byte, NELEM(broken_byte), "");
    const struct step none[] = {{BYTE(0x8E), ""}};
    check_steps(p_e6, NELEM(p_e6), none, NELEM(none), R);
    check_steps(p_e6, NELEM(p_e6), NULL, 0, "");
    const struct step emoji[] = {{BYTE(0xA6), ""}, {BYTE(0x99), "\xF0\x9F\xA6\x99"}, {ID_WORLD, " world"}};
    check_steps(p_f09f, NELEM(p_f09f), emoji, NELEM(emoji), "");
    const struct step emoji_broken[] = {{BYTE(0x41), "A"}};
    check_steps(p_f09f, NELEM(p_f09f), emoji_broken, NELEM(emoji_broken), "");
    const struct step eos[] = {{EOS, ""}, {BYTE(0xA6), R}};
    check_steps(p_f09f, NELEM(p_f09f), eos, NELEM(eos), "");
#undef R
    g_rng = 0x243F6A8885A308D3ull;
    for (int i = 0; i < 50; i++) {
        int32_t gen[24];
        rnd_ids(gen, NELEM(gen), 32000);
        if (i % 2) gen[0] = BYTE(0x8E), gen[1] = BYTE(0xA8);
        check_stream(g_llama, p_e6, NELEM(p_e6), 1, gen, NELEM(gen), "partial prompt E6");
        if (i % 2) gen[0] = BYTE(0xA6), gen[1] = BYTE(0x99);
        check_stream(g_llama, p_f09f, NELEM(p_f09f), 2, gen, NELEM(gen), "partial prompt F09F");
    }
}

/* Random id sequences after several prompts: the streamed chunks concatenate
 * exactly to the full decode, and every chunk is whole UTF-8. */
static void test_random_sequences(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN];
    int32_t *p_cjk = NULL;
    size_t n_cjk = 0;
    const char *cjk = "\xE5\xA4\xA7\xE6\xA8\xA1\xE5\x9E\x8B\xE6\x8E\xA8\xE7\x90\x86"; /* 大模型推理 */
    assert_int_equal(dol_tokenizer_encode(g_llama, cjk, strlen(cjk), true, &p_cjk, &n_cjk,
                                          err, sizeof err), 0);
    const int32_t p_bos[] = {BOS};
    const int32_t p_hello[] = {BOS, ID_HELLO};
    const int32_t p_ctl[] = {BOS, EOS, EOS, EOS, EOS, EOS};
    const int32_t p_txt_ctl[] = {BOS, ID_HELLO, EOS, EOS, EOS, EOS, EOS, EOS};
    const int32_t p_space[] = {ID_SPACE};
    const int32_t p_unk[] = {UNK};
    const int32_t p_bytes[] = {BYTE(0xE6), BYTE(0x8E), BYTE(0xA8)};
    const int32_t p_bad[] = {BOS, ID_HELLO, BYTE(0xE0), BYTE(0x80)}; /* decided */
    const struct {
        const int32_t *ids;
        size_t n;
    } prompts[] = {
        {NULL, 0},           {p_bos, 1},           {p_hello, 2},
        {p_cjk, n_cjk},      {p_ctl, NELEM(p_ctl)}, {p_txt_ctl, NELEM(p_txt_ctl)},
        {p_space, 1},        {p_unk, 1},           {p_bytes, NELEM(p_bytes)},
        {p_bad, NELEM(p_bad)},
    };
    g_rng = 0x9E3779B97F4A7C15ull;
    int32_t gen[96];
    for (int s = 0; s < 200; s++) {
        const size_t n = 1 + rnd_below(NELEM(gen));
        rnd_ids(gen, n, 32000);
        for (size_t p = 0; p < NELEM(prompts); p++)
            check_stream(g_llama, prompts[p].ids, prompts[p].n, 0, gen, n, "random llama");
    }
    /* stories260K: half its vocabulary is byte tokens. */
    const int32_t s_prompt[] = {BOS, 403, 407, 261, 378};
    for (int s = 0; s < 200; s++) {
        const size_t n = 1 + rnd_below(NELEM(gen));
        rnd_ids(gen, n, 512);
        check_stream(g_stories, p_bos, 1, 0, gen, n, "random stories");
        check_stream(g_stories, s_prompt, NELEM(s_prompt), 0, gen, n, "random stories");
    }
    /* One long generation: the window never loses track. */
    const size_t n_long = 5000;
    int32_t *lg = malloc(n_long * sizeof *lg);
    assert_non_null(lg);
    rnd_ids(lg, n_long, 32000);
    check_stream(g_llama, p_hello, 2, 0, lg, n_long, "long random");
    check_stream(g_llama, NULL, 0, 0, lg, n_long, "long random");
    free(lg);
    free(p_cjk);
}

static void test_detok_errors(void **state)
{
    (void)state;
    const int32_t bad_prompt[] = {BOS, 32000};
    assert_null(dol_detok_new(g_llama, bad_prompt, 2));
    assert_null(dol_detok_new(NULL, NULL, 0));
    dol_detok_free(NULL);

    const int32_t p_bos[] = {BOS};
    dol_detok *d = dol_detok_new(g_llama, p_bos, 1);
    assert_non_null(d);
    char *out = NULL;
    size_t len = 0, cap = 0;
    /* Nothing appended still leaves a NUL-terminated buffer. */
    assert_int_equal(dol_detok_push(d, BYTE(0xE6), &out, &len, &cap), 0);
    assert_non_null(out);
    assert_int_equal(len, 0);
    assert_string_equal(out, "");
    /* A bad id fails and leaves the state alone. */
    assert_int_equal(dol_detok_push(d, 32000, &out, &len, &cap), -1);
    assert_int_equal(dol_detok_push(d, -1, &out, &len, &cap), -1);
    assert_int_equal(dol_detok_push(d, BYTE(0x8E), &out, &len, &cap), 0);
    assert_int_equal(dol_detok_push(d, BYTE(0xA8), &out, &len, &cap), 3);
    assert_int_equal(dol_detok_finish(d, &out, &len, &cap), 0);
    assert_string_equal(out, "\xE6\x8E\xA8");
    assert_int_equal(dol_detok_push(d, ID_HELLO, NULL, &len, &cap), -1);
    dol_detok_free(d);
    free(out);
}

/* dol_tokenizer_max_piece_bytes, worked out again from the public API:
 * the heaviest piece encoding can produce, "▁" weighing 1, byte pieces 1,
 * control pieces and (byte fallback being on in both models) <unk> none.
 * With chars, characters instead of bytes. */
static int heaviest_piece(const dol_tokenizer *t, bool chars)
{
    int most = 1;
    for (int id = 0; id < dol_tokenizer_vocab_size(t); id++) {
        if (dol_tokenizer_is_control(t, id) || id == UNK) continue;
        int w = 1;
        if (!dol_tokenizer_is_byte(t, id)) {
            const char *p = dol_tokenizer_id_to_piece(t, id);
            w = 0;
            for (size_t i = 0; p[i]; i++) {
                if (!chars || ((unsigned char)p[i] & 0xC0) != 0x80) w++;
                if (strncmp(p + i, "\xE2\x96\x81", 3) == 0) i += 2;
            }
        }
        if (w > most) most = w;
    }
    return most;
}

/* encode(text) has at least dol_tokenizer_min_tokens(text) ids. */
static void assert_bound(const dol_tokenizer *t, const char *text, size_t len)
{
    int32_t *ids = NULL;
    size_t n = 0;
    char err[DOL_ERR_LEN];
    assert_int_equal(dol_tokenizer_encode(t, text, len, false, &ids, &n, err, sizeof err), 0);
    size_t min = dol_tokenizer_min_tokens(t, text, len);
    if (min > n) {
        print_error("min_tokens %zu > %zu tokens for %zu bytes \"%.60s\"\n", min, n, len, text);
        fail();
    }
    free(ids);
}

static void test_min_tokens(void **state)
{
    (void)state;
    assert_int_equal(dol_tokenizer_max_piece_bytes(NULL), 0);
    assert_int_equal(dol_tokenizer_min_tokens(NULL, "abc", 3), 0);
    /* Llama-2's heaviest piece is "▁административ" (27 bytes, 14
     * characters; in characters "▁" x 16 is), stories260K's "▁little". */
    assert_int_equal(dol_tokenizer_max_piece_bytes(g_llama), heaviest_piece(g_llama, false));
    assert_int_equal(dol_tokenizer_max_piece_bytes(g_stories),
                     heaviest_piece(g_stories, false));
    assert_int_equal(dol_tokenizer_max_piece_bytes(g_llama), 27);
    assert_int_equal(heaviest_piece(g_llama, true), 16);
    assert_int_equal(dol_tokenizer_max_piece_bytes(g_stories), 7);
    assert_int_equal(heaviest_piece(g_stories, true), 7);

    /* Spaces: Llama keeps every one (16 make one piece); stories260K's
     * normalizer removes extra whitespace, so spaces count for nothing. */
    assert_int_equal(dol_tokenizer_min_tokens(g_llama, "                ", 16), 1);
    assert_int_equal(dol_tokenizer_min_tokens(g_llama, "                 ", 17), 2);
    assert_int_equal(dol_tokenizer_min_tokens(g_stories, "                 ", 17), 0);
    /* A literal "▁" weighs 1, like the space it looks like; and when extra
     * whitespace is removed, trailing ones vanish like spaces (found by
     * fuzz_request: "    ▁" is no token at all for stories260K). */
    assert_int_equal(dol_tokenizer_min_tokens(g_llama, "\xE2\x96\x81\xE2\x96\x81", 6), 1);
    assert_int_equal(dol_tokenizer_min_tokens(g_stories, "    \xE2\x96\x81", 7), 0);
    assert_int_equal(dol_tokenizer_min_tokens(g_stories, "a\xE2\x96\x81\xE2\x96\x81", 7), 1);
    assert_int_equal(dol_tokenizer_min_tokens(g_stories, "abcdefghijklmno", 15), 3);
    assert_int_equal(dol_tokenizer_min_tokens(g_stories, "", 0), 0);
    /* Characters bound ASCII text (33 / 16), bytes CJK text (3 x 10 / 27). */
    assert_int_equal(dol_tokenizer_min_tokens(g_llama, "abcdefghijklmnopqrstuvwxyzabcdefg", 33),
                     3);
    assert_int_equal(dol_tokenizer_min_tokens(g_llama, "\xE6\x8E\xA8\xE6\x8E\xA8\xE6\x8E\xA8"
                     "\xE6\x8E\xA8\xE6\x8E\xA8\xE6\x8E\xA8\xE6\x8E\xA8\xE6\x8E\xA8\xE6\x8E\xA8"
                     "\xE6\x8E\xA8", 30), 2);

    static const char *const texts[] = {
        "", " ", "  ", "a", "a     b", "   leading and trailing   ",
        "Once upon a time, there was a little girl named Lily.",
        "\xE2\x96\x81\xE2\x96\x81\xE2\x96\x81x\xE2\x96\x81 \xE2\x96\x81  y",
        "\n\n\n\t\t  \r\n", "\xE6\x8E\xA8\xE7\x90\x86 \xF0\x9F\x98\x80\xF0\x9F\x98\x80",
        "\xFF\xFE invalid \xC0\xAF bytes \xE2\x96", "<s></s><unk>[INST]",
        "    \xE2\x96\x81", "\xE2\x96\x81\xE2\x96\x81\xE2\x96\x81", "a \xE2\x96\x81 \xE2\x96\x81  ",
        "                                                                  x",
    };
    const dol_tokenizer *toks[] = {g_llama, g_stories};
    for (size_t k = 0; k < NELEM(toks); k++) {
        for (size_t i = 0; i < NELEM(texts); i++) assert_bound(toks[k], texts[i], strlen(texts[i]));
        /* Random text over an alphabet heavy in spaces, "▁", repeats of the
         * vocabulary's own pieces and multi-byte characters. */
        static const char *const alpha[] = {
            " ", " ", "  ", "\xE2\x96\x81", "e", "the", "ing", "\n", "\xC3\xA9",
            "\xE6\x8E\xA8", "\xF0\x9F\x98\x80", "                ", "Lily", ".", "0",
        };
        char buf[4096];
        for (int round = 0; round < 300; round++) {
            size_t len = 0, want = 1 + rnd_below(sizeof buf - 64);
            while (len < want) {
                const char *a = rnd_below(3) == 0
                    ? dol_tokenizer_id_to_piece(toks[k], (int32_t)(259 + rnd_below(
                          (uint32_t)dol_tokenizer_vocab_size(toks[k]) - 259)))
                    : alpha[rnd_below(NELEM(alpha))];
                size_t n = strlen(a);
                if (len + n >= sizeof buf) break;
                memcpy(buf + len, a, n);
                len += n;
            }
            buf[len] = '\0';
            assert_bound(toks[k], buf, len);
        }
    }

    /* A megabyte of prose is refused long before it is encoded: the bound
     * is far past any context, and takes no time to compute. */
    size_t big = 1 << 20;
    char *text = malloc(big + 1);
    assert_non_null(text);
    static const char prose[] = "Once upon a time, there was a little girl named Lily. ";
    for (size_t i = 0; i < big; i++) text[i] = prose[i % (sizeof prose - 1)];
    text[big] = '\0';
    assert_true(dol_tokenizer_min_tokens(g_llama, text, big) > 4096 * 8);
    assert_true(dol_tokenizer_min_tokens(g_stories, text, big) > 4096 * 8);
    free(text);
}

int main(void)
{
    const char *env = getenv("DOLPHIN_SHARED");
    snprintf(g_shared, sizeof g_shared, "%s", env && *env ? env : "../shared");
    char p_llama[8192], p_stories[8192], p_golden[8192];
    snprintf(p_llama, sizeof p_llama, "%s/models/tiny-llama2/tokenizer.model", g_shared);
    snprintf(p_stories, sizeof p_stories, "%s/models/stories260K/tokenizer.model", g_shared);
    snprintf(p_golden, sizeof p_golden, "%s/golden/tokenizer-llama2.json", g_shared);
    struct stat st;
    if (stat(p_llama, &st) != 0 || stat(p_stories, &st) != 0 || stat(p_golden, &st) != 0) {
        printf("test_tokenizer: skipped: fixtures not found under %s "
               "(set DOLPHIN_SHARED to the shared fixture directory)\n", g_shared);
        return 77;
    }
    char err[DOL_ERR_LEN];
    if (dol_tokenizer_load(p_llama, &g_llama, err, sizeof err) != 0 ||
        dol_tokenizer_load(p_stories, &g_stories, err, sizeof err) != 0) {
        fprintf(stderr, "test_tokenizer: %s\n", err);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_vocab),
        cmocka_unit_test(test_llama_golden),
        cmocka_unit_test(test_encode_edges),
        cmocka_unit_test(test_decode_errors),
        cmocka_unit_test(test_decode_behaviour),
        cmocka_unit_test(test_golden_stories260K),
        cmocka_unit_test(test_golden_tiny_llama2),
        cmocka_unit_test(test_stream_multibyte),
        cmocka_unit_test(test_invalid_bytes),
        cmocka_unit_test(test_leading_space),
        cmocka_unit_test(test_prompt_partial_char),
        cmocka_unit_test(test_random_sequences),
        cmocka_unit_test(test_detok_errors),
        cmocka_unit_test(test_min_tokens),
    };
    const int rc = cmocka_run_group_tests_name("tokenizer", tests, NULL, NULL);
    dol_tokenizer_free(g_llama);
    dol_tokenizer_free(g_stories);
    return rc;
}
