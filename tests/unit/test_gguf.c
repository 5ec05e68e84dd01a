/* tests/unit/test_gguf.c — GGUF files: the reader (include/dolphin/gguf.h)
 * and the Llama loader (dol_model_load on a .gguf file) on small synthetic
 * files this test writes itself, one per class of broken file (each must be
 * refused with one line naming the file and the key or tensor, never a
 * crash: run under ASan too), every truncation of a valid one, and the
 * un-permuted q/k rows; then the shared fixtures: every GGUF file's tensor
 * table as the goldens list it, and the F32/F16 files against the
 * safetensors checkpoints they were made from (config, tokenizer, greedy
 * ids and logits bit for bit) and against the float64 reference. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dolphin/engine.h"
#include "dolphin/gguf.h"
#include "dolphin/model.h"
#include "dolphin/tokenizer.h"
#include "test_fixtures.h"

/* ---- a GGUF writer ---------------------------------------------------------------- */

typedef struct {
    uint8_t *b;
    size_t n, cap;
} buf;

static void put(buf *o, const void *p, size_t n)
{
    if (o->n + n > o->cap) {
        o->cap = (o->n + n) * 2 + 256;
        o->b = realloc(o->b, o->cap);
        assert_non_null(o->b);
    }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}
static void put_u32(buf *o, uint32_t v) { put(o, &v, 4); }   /* the test host is little-endian */
static void put_u64(buf *o, uint64_t v) { put(o, &v, 8); }
static void put_str(buf *o, const char *s)
{
    put_u64(o, strlen(s));
    put(o, s, strlen(s));
}

static void kv_u32(buf *o, const char *k, uint32_t v) { put_str(o, k); put_u32(o, 4); put_u32(o, v); }
static void kv_f32(buf *o, const char *k, float v) { put_str(o, k); put_u32(o, 6); put(o, &v, 4); }
static void kv_bool(buf *o, const char *k, uint8_t b)
{
    put_str(o, k);
    put_u32(o, 7);
    put(o, &b, 1);
}
static void kv_str(buf *o, const char *k, const char *v) { put_str(o, k); put_u32(o, 8); put_str(o, v); }

/* What the synthetic model looks like, and what to break. Defaults (all
 * zero) give a valid file: d 32, 4 heads of 8, 2 KV heads, FFN 64, one
 * layer, 8 tokens, F32 everywhere. */
typedef struct {
    uint32_t version;          /* 0: 3 */
    const char *magic;         /* NULL: "GGUF" */
    const char *arch;          /* NULL: llama */
    const char *tok_model;     /* NULL: llama */
    bool no_tokens, no_scores, no_types, no_block_count, no_tok_model;
    const char *rope_type;     /* NULL: no rope scaling keys */
    float rope_factor;
    uint32_t q_type;           /* ggml type of blk.0.attn_q */
    uint32_t all_type;         /* ggml type of every 2-D tensor (0: F32) */
    uint64_t q_rows;           /* 0: 32 */
    bool dup_tensor, dup_key, extra_tensor, extra_layer, no_output_norm, tied;
    uint64_t q_offset_add;     /* moves attn_q's data by this many bytes */
    uint64_t q_offset_set;     /* nonzero: attn_q's offset */
    bool overlap;              /* attn_k's offset = attn_q's */
    uint32_t alignment;        /* 0: key absent (32) */
    uint64_t n_kv_override, n_t_override;
    uint64_t tokens_count_override;
    bool bad_value_type;
    int token_type_bad;        /* nonzero: token 4's type */
    bool round_bf16;           /* F32 weights hold values BF16 can represent */
    uint8_t bos_raw;           /* nonzero: add_bos_token's byte (1 is true) */
} spec;

typedef struct {
    const char *name;
    uint32_t nd;
    uint64_t ne[2];
    uint32_t type;
} tinfo;

#define D 32
#define NH 4
#define HD 8
#define NKV 2
#define FF 64
#define NV 8

static const char *const TOKENS[NV] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b",
                                       "\xe2\x96\x81" "a", "\xe2\x96\x81" "b"};

/* The value of element c of row r of tensor k (so rows can be told apart). */
static float value_of(int k, uint64_t r, uint64_t c) { return (float)k * 1000.0f + (float)r + (float)c / 128.0f; }

static buf make_gguf(const spec *s)
{
    buf o = {0};
    put(&o, s->magic ? s->magic : "GGUF", 4);
    put_u32(&o, s->version ? s->version : 3);
    uint32_t align = s->alignment ? s->alignment : 32;

    tinfo t[20];
    int nt = 0;
    uint32_t w = s->all_type;
    t[nt++] = (tinfo){"token_embd.weight", 2, {D, NV}, w};
    t[nt++] = (tinfo){"blk.0.attn_norm.weight", 1, {D, 1}, 0};
    t[nt++] = (tinfo){"blk.0.attn_q.weight", 2, {D, s->q_rows ? s->q_rows : NH * HD}, s->q_type ? s->q_type : w};
    t[nt++] = (tinfo){"blk.0.attn_k.weight", 2, {D, NKV * HD}, w};
    t[nt++] = (tinfo){"blk.0.attn_v.weight", 2, {D, NKV * HD}, w};
    t[nt++] = (tinfo){"blk.0.attn_output.weight", 2, {NH * HD, D}, w};
    t[nt++] = (tinfo){"blk.0.ffn_norm.weight", 1, {D, 1}, 0};
    t[nt++] = (tinfo){"blk.0.ffn_gate.weight", 2, {D, FF}, w};
    t[nt++] = (tinfo){"blk.0.ffn_up.weight", 2, {D, FF}, w};
    t[nt++] = (tinfo){"blk.0.ffn_down.weight", 2, {FF, D}, w};
    if (!s->no_output_norm) t[nt++] = (tinfo){"output_norm.weight", 1, {D, 1}, 0};
    if (!s->tied) t[nt++] = (tinfo){"output.weight", 2, {D, NV}, w};
    if (s->dup_tensor) t[nt++] = (tinfo){"blk.0.ffn_norm.weight", 1, {D, 1}, 0};
    if (s->extra_tensor) t[nt++] = (tinfo){"rope_freqs.weight", 1, {HD / 2, 1}, 0};
    if (s->extra_layer) t[nt++] = (tinfo){"blk.1.attn_norm.weight", 1, {D, 1}, 0};

    /* the key/value pairs, into their own buffer to count them */
    buf kv = {0};
    uint64_t n_kv = 0;
#define KV(call) (call, n_kv++)
    KV(kv_str(&kv, "general.architecture", s->arch ? s->arch : "llama"));
    if (s->dup_key) KV(kv_str(&kv, "general.architecture", "llama"));
    if (s->alignment) KV(kv_u32(&kv, "general.alignment", s->alignment));
    KV(kv_u32(&kv, "llama.context_length", 64));
    KV(kv_u32(&kv, "llama.embedding_length", D));
    if (!s->no_block_count) KV(kv_u32(&kv, "llama.block_count", 1));
    KV(kv_u32(&kv, "llama.feed_forward_length", FF));
    KV(kv_u32(&kv, "llama.attention.head_count", NH));
    KV(kv_u32(&kv, "llama.attention.head_count_kv", NKV));
    KV(kv_f32(&kv, "llama.attention.layer_norm_rms_epsilon", 1e-5f));
    KV(kv_f32(&kv, "llama.rope.freq_base", 10000.0f));
    KV(kv_u32(&kv, "llama.rope.dimension_count", HD));
    if (s->rope_type) {
        KV(kv_str(&kv, "llama.rope.scaling.type", s->rope_type));
        KV(kv_f32(&kv, "llama.rope.scaling.factor", s->rope_factor));
    }
    if (s->bad_value_type) {
        put_str(&kv, "general.weird");
        put_u32(&kv, 13);
        put_u32(&kv, 0);
        n_kv++;
    }
    if (!s->no_tok_model) KV(kv_str(&kv, "tokenizer.ggml.model", s->tok_model ? s->tok_model : "llama"));
    if (!s->no_tokens) {
        put_str(&kv, "tokenizer.ggml.tokens");
        put_u32(&kv, 9);
        put_u32(&kv, 8);
        put_u64(&kv, s->tokens_count_override ? s->tokens_count_override : NV);
        for (int i = 0; i < NV; i++) put_str(&kv, TOKENS[i]);
        n_kv++;
    }
    if (!s->no_scores) {
        put_str(&kv, "tokenizer.ggml.scores");
        put_u32(&kv, 9);
        put_u32(&kv, 6);
        put_u64(&kv, NV);
        for (int i = 0; i < NV; i++) {
            float f = i < 3 ? 0.0f : -(float)(i - 2);
            put(&kv, &f, 4);
        }
        n_kv++;
    }
    if (!s->no_types) {
        put_str(&kv, "tokenizer.ggml.token_type");
        put_u32(&kv, 9);
        put_u32(&kv, 5);
        put_u64(&kv, NV);
        for (int i = 0; i < NV; i++) {
            int32_t ty = i == 0 ? 2 : i < 3 ? 3 : 1;
            if (i == 4 && s->token_type_bad) ty = s->token_type_bad;
            put(&kv, &ty, 4);
        }
        n_kv++;
    }
    KV(kv_u32(&kv, "tokenizer.ggml.bos_token_id", 1));
    KV(kv_u32(&kv, "tokenizer.ggml.eos_token_id", 2));
    KV(kv_bool(&kv, "tokenizer.ggml.add_bos_token", s->bos_raw ? s->bos_raw : 1));
#undef KV

    put_u64(&o, s->n_t_override ? s->n_t_override : (uint64_t)nt);
    put_u64(&o, s->n_kv_override ? s->n_kv_override : n_kv);
    put(&o, kv.b, kv.n);
    free(kv.b);

    /* tensor infos: offsets laid out one after another, aligned */
    uint64_t off[20], size[20], at = 0;
    for (int i = 0; i < nt; i++) {
        const dol_ggml_type_info *ti = dol_ggml_type(t[i].type);
        /* (an unknown type: as if F32, the reader stops at the type) */
        size[i] = ti ? t[i].ne[0] / ti->block * ti->block_bytes * t[i].ne[1] : t[i].ne[0] * 4 * t[i].ne[1];
        off[i] = at;
        at = (at + size[i] + align - 1) / align * align;
    }
    int qi = 2, ki = 3;
    if (s->q_offset_add) off[qi] += s->q_offset_add;
    if (s->q_offset_set) off[qi] = s->q_offset_set;
    if (s->overlap) off[ki] = off[qi];
    for (int i = 0; i < nt; i++) {
        put_str(&o, t[i].name);
        put_u32(&o, t[i].nd);
        for (uint32_t j = 0; j < t[i].nd; j++) put_u64(&o, t[i].ne[j]);
        put_u32(&o, t[i].type);
        put_u64(&o, off[i]);
    }
    while (o.n % align) put(&o, "", 1);
    size_t data0 = o.n;
    size_t total = data0 + at + (s->q_offset_add ? align : 0);
    while (o.n < total) put(&o, "\0\0\0\0\0\0\0\0", total - o.n < 8 ? total - o.n : 8);
    for (int i = 0; i < nt; i++) {
        if ((t[i].type != 0 && t[i].type != 30) || (s->q_offset_set && i == qi)) continue;
        uint8_t *at = o.b + data0 + off[i];
        for (uint64_t r = 0; r < t[i].ne[1]; r++)
            for (uint64_t c = 0; c < t[i].ne[0]; c++) {
                float v = t[i].nd == 1 ? 1.0f : value_of(i, r, c) / 4096.0f;
                if (s->round_bf16 || t[i].type == 30) v = dol_bf16_to_f32(dol_f32_to_bf16(v));
                size_t k = r * t[i].ne[0] + c;
                if (t[i].type == 30) {
                    uint16_t h = dol_f32_to_bf16(v);
                    memcpy(at + 2 * k, &h, 2);
                } else {
                    memcpy(at + 4 * k, &v, 4);
                }
            }
    }
    return o;
}

/* Write b to a temporary .gguf file; its path into path. */
static void write_tmp(const buf *b, char *path, size_t n)
{
    snprintf(path, n, "/tmp/dolphin-test-gguf-XXXXXX.gguf");
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b->b, b->n), (ssize_t)b->n);
    close(fd);
}

/* Load spec as a model: 0 and *m, or -1 with err (checked: one line,
 * beginning with the path). */
static int load_spec(const spec *s, dol_model **m, char *err, size_t errlen)
{
    buf b = make_gguf(s);
    char path[128];
    write_tmp(&b, path, sizeof path);
    free(b.b);
    *m = NULL;
    int rc = dol_model_load(path, m, err, errlen);
    if (rc != 0) {
        assert_null(strchr(err, '\n'));
        assert_int_equal(strncmp(err, path, strlen(path)), 0);
    }
    unlink(path);
    return rc;
}

static void expect_refused(const spec *s, const char *want)
{
    char err[DOL_ERR_LEN] = "";
    dol_model *m = NULL;
    int rc = load_spec(s, &m, err, sizeof err);
    if (rc == 0) {
        dol_model_free(m);
        fail_msg("loaded, but should have been refused with \"%s\"", want);
    }
    if (!strstr(err, want)) fail_msg("error \"%s\" does not say \"%s\"", err, want);
}

/* ---- synthetic files ------------------------------------------------------------------ */

static void test_valid_file(void **state)
{
    (void)state;
    spec s = {0};
    char err[DOL_ERR_LEN] = "";
    dol_model *m = NULL;
    if (load_spec(&s, &m, err, sizeof err) != 0) fail_msg("%s", err);
    const dol_model_config *c = &m->cfg;
    assert_int_equal(m->format, DOL_MODEL_GGUF);
    assert_int_equal(c->hidden_size, D);
    assert_int_equal(c->n_heads, NH);
    assert_int_equal(c->n_kv_heads, NKV);
    assert_int_equal(c->head_dim, HD);
    assert_int_equal(c->intermediate_size, FF);
    assert_int_equal(c->n_layers, 1);
    assert_int_equal(c->vocab_size, NV);
    assert_int_equal(c->max_position_embeddings, 64);
    assert_false(c->tie_word_embeddings);
    assert_float_equal(c->rope_scale, 1.0f, 0);
    assert_string_equal(m->type_mix, "F32 12");
    assert_int_equal(m->embed.rows, NV);
    assert_int_equal(m->embed.cols, D);
    assert_int_equal(m->layers[0].down.rows, D);
    assert_int_equal(m->layers[0].down.cols, FF);
    /* attn_q (tensor 2) / attn_k (3): HF row h*HD + j*HD/2 + i is the file's h*HD + 2i + j */
    for (int which = 0; which < 2; which++) {
        const dol_tensor *t = which ? &m->layers[0].k : &m->layers[0].q;
        int heads = which ? NKV : NH, k = which ? 3 : 2;
        const float *f = t->data;
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < HD / 2; i++)
                for (int j = 0; j < 2; j++) {
                    int hf = h * HD + j * HD / 2 + i, file = h * HD + 2 * i + j;
                    for (int col = 0; col < D; col += 7)
                        assert_float_equal(f[hf * D + col], value_of(k, (uint64_t)file, (uint64_t)col) / 4096.0f, 0);
                }
    }
    /* v is used in place, rows as stored */
    const float *v = m->layers[0].v.data;
    assert_float_equal(v[3 * D + 5], value_of(4, 3, 5) / 4096.0f, 0);

    /* its tokenizer */
    dol_tokenizer *tok = NULL;
    if (dol_model_tokenizer(m, &tok, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(dol_tokenizer_vocab_size(tok), NV);
    assert_int_equal(dol_tokenizer_bos_id(tok), 1);
    assert_int_equal(dol_tokenizer_eos_id(tok), 2);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(dol_tokenizer_encode(tok, "a b", 3, true, &ids, &n, err, sizeof err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 6);   /* "▁a" */
    assert_int_equal(ids[2], 7);   /* "▁b" */
    free(ids);
    dol_tokenizer_free(tok);

    /* an engine runs it */
    dol_engine *e = NULL;
    dol_engine_params p = { .activations = DOL_ACT_F32, .n_threads = 1, .kv_block_size = 16, .kv_cache_tokens = 64,
                           .max_seqs = 2, .max_batch_tokens = 64, .kv_dtype = DOL_KV_F32,
                           .backend = DOL_BACKEND_CPU};
    if (dol_engine_create(m, &p, &e, err, sizeof err) != 0) fail_msg("%s", err);
    int32_t prompt[3] = {1, 6, 7}, out[4];
    float first[NV];
    test_greedy(e, prompt, 3, 4, out, NULL, first);
    for (int i = 0; i < NV; i++) assert_true(isfinite(first[i]));
    dol_engine_free(e);
    dol_model_free(m);
}

static void test_tied_bf16_and_linear_rope(void **state)
{
    (void)state;
    spec s = {.tied = true, .all_type = 30, .rope_type = "linear", .rope_factor = 4.0f,
              .alignment = 64};
    char err[DOL_ERR_LEN] = "";
    dol_model *m = NULL;
    if (load_spec(&s, &m, err, sizeof err) != 0) fail_msg("%s", err);
    assert_true(m->cfg.tie_word_embeddings);
    assert_ptr_equal(m->lm_head.data, m->embed.data);
    assert_int_equal(m->embed.dtype, DOL_DTYPE_BF16);
    assert_int_equal(m->layers[0].q.dtype, DOL_DTYPE_BF16);
    assert_float_equal(m->cfg.rope_scale, 4.0f, 0);
    assert_string_equal(m->type_mix, "BF16 8, F32 3");
    dol_model_free(m);
}

/* A BF16 file runs through the engine like the F32 file of the same
 * (BF16-representable) values. */
static void test_bf16_in_the_engine(void **state)
{
    (void)state;
    char err[DOL_ERR_LEN] = "";
    float logits[2][3 * NV];
    for (int k = 0; k < 2; k++) {
        spec s = {.all_type = k ? 30 : 0, .round_bf16 = true};
        dol_model *m = NULL;
        if (load_spec(&s, &m, err, sizeof err) != 0) fail_msg("%s", err);
        assert_int_equal(m->layers[0].q.dtype, k ? DOL_DTYPE_BF16 : DOL_DTYPE_F32);
        dol_engine *e = NULL;
        dol_engine_params p = { .activations = DOL_ACT_F32, .n_threads = 1, .kv_block_size = 16, .kv_cache_tokens = 64,
                               .max_seqs = 2, .max_batch_tokens = 64, .kv_dtype = DOL_KV_F32,
                               .backend = DOL_BACKEND_CPU};
        if (dol_engine_create(m, &p, &e, err, sizeof err) != 0) fail_msg("%s", err);
        int32_t ids[3] = {1, 6, 7};
        test_forward_all(e, ids, 3, logits[k]);
        dol_engine_free(e);
        dol_model_free(m);
    }
    for (int i = 0; i < 3 * NV; i++) {
        assert_true(isfinite(logits[1][i]));
        assert_float_equal(logits[1][i], logits[0][i], 1e-3 * (1 + fabsf(logits[0][i])));
    }
}

static bool have_gguf(const char *file, char *path, size_t n)
{
    snprintf(path, n, "%s/models/gguf/%s", test_shared_dir(), file);
    if (access(path, R_OK) == 0) return true;
    print_message("  note: %s not found (set DOLPHIN_SHARED); skipped\n", path);
    return false;
}

/* Linear RoPE scaling reaches the engine (on stories260K-F32.gguf, with
 * rope_scale set as llama.rope.scaling.factor 2 would): position 0 is
 * unchanged, later positions are not. The keys' path to rope_scale is
 * test_tied_bf16_and_linear_rope's. */
static void test_linear_rope_in_the_engine(void **state)
{
    (void)state;
    char path[1200], err[DOL_ERR_LEN];
    if (!have_gguf("stories260K-F32.gguf", path, sizeof path)) skip();
    enum { NT = 5, V = 512 };
    static float logits[2][NT * V];
    for (int k = 0; k < 2; k++) {
        dol_model *m = NULL;
        if (dol_model_load(path, &m, err, sizeof err) != 0) fail_msg("%s", err);
        assert_int_equal(m->cfg.vocab_size, V);
        if (k) m->cfg.rope_scale = 2.0f;
        dol_engine *e = NULL;
        dol_engine_params p = { .activations = DOL_ACT_F32, .n_threads = 1, .kv_block_size = 16, .kv_cache_tokens = 64,
                               .max_seqs = 2, .max_batch_tokens = 64, .kv_dtype = DOL_KV_F32,
                               .backend = DOL_BACKEND_CPU};
        if (dol_engine_create(m, &p, &e, err, sizeof err) != 0) fail_msg("%s", err);
        int32_t ids[NT] = {1, 403, 407, 261, 378};
        test_forward_all(e, ids, NT, logits[k]);
        dol_engine_free(e);
        dol_model_free(m);
    }
    assert_memory_equal(logits[0], logits[1], sizeof(float) * V);   /* position 0 */
    assert_memory_not_equal(logits[0] + (NT - 1) * V, logits[1] + (NT - 1) * V, sizeof(float) * V);
}

static void test_refused_header(void **state)
{
    (void)state;
    expect_refused(&(spec){.magic = "GGML"}, "not a GGUF file (bad magic");
    expect_refused(&(spec){.version = 1}, "GGUF version 1 is not supported (only 2 and 3)");
    expect_refused(&(spec){.version = 4}, "GGUF version 4 is not supported");
    expect_refused(&(spec){.version = 0x03000000u}, "a big-endian GGUF file (version 3)");
    expect_refused(&(spec){.n_kv_override = 1ull << 40}, "key/value count 1099511627776 cannot fit");
    expect_refused(&(spec){.n_t_override = 1ull << 40}, "tensor count 1099511627776 cannot fit");
    expect_refused(&(spec){.n_t_override = 40}, "tensor 12 of the table: ");
    expect_refused(&(spec){.tokens_count_override = 1ull << 62}, "key tokenizer.ggml.tokens: value runs past the end of the file");
    expect_refused(&(spec){.bad_value_type = true}, "key general.weird: unknown value type 13");
    expect_refused(&(spec){.dup_key = true}, "key general.architecture: listed twice");
    expect_refused(&(spec){.alignment = 24}, "key general.alignment: 24 is not a power of two");
}

static void test_refused_tensors(void **state)
{
    (void)state;
    expect_refused(&(spec){.q_offset_add = 4}, "tensor blk.0.attn_q.weight: misaligned data: offset");
    expect_refused(&(spec){.q_offset_set = 1ull << 32}, "tensor blk.0.attn_q.weight: data at offset 4294967296");
    expect_refused(&(spec){.overlap = true}, "overlap");
    expect_refused(&(spec){.dup_tensor = true}, "tensor blk.0.ffn_norm.weight: listed twice in the tensor table");
    expect_refused(&(spec){.q_type = 99}, "tensor blk.0.attn_q.weight: unknown ggml type id 99");
    expect_refused(&(spec){.q_type = 4}, "tensor blk.0.attn_q.weight: unknown ggml type id 4");
    expect_refused(&(spec){.q_type = 12}, "tensor blk.0.attn_q.weight: ne[0] 32 is not a multiple of the 256 elements of a Q4_K block");
    expect_refused(&(spec){.q_type = 9}, "tensor blk.0.attn_q.weight: type Q8_1 is not supported (this build serves F32, F16, BF16, Q8_0, Q4_0");
    expect_refused(&(spec){.q_type = 20}, "tensor blk.0.attn_q.weight: type IQ4_NL is not supported (this build");
    expect_refused(&(spec){.q_rows = 30}, "tensor blk.0.attn_q.weight: shape [32, 30] but the llama.* keys say [32, 32]");
    expect_refused(&(spec){.no_output_norm = true}, "tensor output_norm.weight: missing");
    expect_refused(&(spec){.extra_tensor = true}, "tensor rope_freqs.weight: not a tensor of a Llama model");
    expect_refused(&(spec){.extra_layer = true}, "tensor blk.1.attn_norm.weight: layer 1, but llama.block_count is 1");
}

static void test_refused_keys(void **state)
{
    (void)state;
    expect_refused(&(spec){.arch = "falcon"}, "key general.architecture: \"falcon\" is not supported (only llama)");
    expect_refused(&(spec){.no_block_count = true}, "key llama.block_count: missing");
    expect_refused(&(spec){.rope_type = "yarn", .rope_factor = 4}, "key llama.rope.scaling.type: \"yarn\" is not supported (only none and linear)");
    expect_refused(&(spec){.tok_model = "gpt2"}, "key tokenizer.ggml.model: tokenizer \"gpt2\" is not supported (only llama, SentencePiece)");
    expect_refused(&(spec){.no_tok_model = true}, "key tokenizer.ggml.model: missing");
    expect_refused(&(spec){.no_tokens = true}, "key tokenizer.ggml.tokens: missing");
    expect_refused(&(spec){.no_scores = true}, "key tokenizer.ggml.scores: missing");
    expect_refused(&(spec){.no_types = true}, "key tokenizer.ggml.token_type: missing");
    expect_refused(&(spec){.token_type_bad = 9}, "key tokenizer.ggml.token_type: token 4 has type 9");
    expect_refused(&(spec){.bos_raw = 2}, "key tokenizer.ggml.add_bos_token: bool of value 2 (must be 0 or 1)");
}

/* A path named *.gguf that is not a regular file is refused as the file it
 * names (not read as a Hugging Face directory); so is a missing one. */
static void test_refused_paths(void **state)
{
    (void)state;
    char dir[] = "/tmp/dolphin-test-gguf-XXXXXX", path[128], want[256];
    assert_non_null(mkdtemp(dir));
    const char *names[] = {"a-dir.gguf", "a-fifo.GGUF", "missing.gguf"};
    const char *why[] = {"not a regular file", "not a regular file", "cannot open: No such file"};
    snprintf(path, sizeof path, "%s/%s", dir, names[0]);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/%s", dir, names[1]);
    assert_int_equal(mkfifo(path, 0600), 0);
    for (int i = 0; i < 3; i++) {
        char err[DOL_ERR_LEN] = "";
        dol_model *m = NULL;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        assert_true(dol_model_path_is_gguf(path));
        assert_int_equal(dol_model_load(path, &m, err, sizeof err), -1);
        assert_null(m);
        snprintf(want, sizeof want, "%s: %s", path, why[i]);
        if (strncmp(err, want, strlen(want)) != 0) fail_msg("error \"%s\" is not \"%s...\"", err, want);
    }
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (i == 0) rmdir(path); else unlink(path);
    }
    rmdir(dir);
}

/* The source digest (the prepared-weights cache's key) of a GGUF model
 * changes with the bytes before the data and with the file's mtime, and
 * not from one load to the next. */
static void test_source_digest(void **state)
{
    (void)state;
    spec s = {0};
    buf b = make_gguf(&s);
    char path[128], err[DOL_ERR_LEN];
    write_tmp(&b, path, sizeof path);
    uint8_t d1[32], d2[32], d3[32];
    dol_model *m = NULL;
    if (dol_model_load(path, &m, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(dol_model_source_digest(m, d1, err, sizeof err), 0);
    dol_model_free(m);
    if (dol_model_load(path, &m, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(dol_model_source_digest(m, d2, err, sizeof err), 0);
    dol_model_free(m);
    assert_memory_equal(d1, d2, 32);
    /* the same file with another rms epsilon, same size */
    size_t at = 0;
    for (size_t i = 0; i + 38 < b.n; i++)
        if (memcmp(b.b + i, "llama.attention.layer_norm_rms_epsilon", 38) == 0) at = i + 38 + 4;
    assert_true(at > 0);
    float eps = 2e-5f;
    memcpy(b.b + at, &eps, 4);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fwrite(b.b, 1, b.n, f), b.n);
    fclose(f);
    if (dol_model_load(path, &m, err, sizeof err) != 0) fail_msg("%s", err);
    assert_float_equal(m->cfg.rms_norm_eps, 2e-5f, 0);
    assert_int_equal(dol_model_source_digest(m, d3, err, sizeof err), 0);
    dol_model_free(m);
    assert_memory_not_equal(d1, d3, 32);
    unlink(path);
    free(b.b);
}

/* Every prefix of a valid file is refused by the reader, cleanly. */
static void test_truncations(void **state)
{
    (void)state;
    spec s = {0};
    buf b = make_gguf(&s);
    char err[DOL_ERR_LEN];
    dol_gguf *g = NULL;
    assert_int_equal(dol_gguf_open_mem(b.b, b.n, "whole.gguf", &g, err, sizeof err), 0);
    assert_int_equal(dol_gguf_n_tensors(g), 12);
    assert_int_equal(dol_gguf_version(g), 3);
    assert_int_equal(dol_gguf_alignment(g), 32);
    const dol_gguf_tensor *q = dol_gguf_find_tensor(g, "blk.0.attn_q.weight");
    assert_non_null(q);
    assert_int_equal(q->ne[0], D);
    assert_int_equal(q->ne[1], NH * HD);
    assert_int_equal(q->nbytes, (uint64_t)D * NH * HD * 4);
    assert_null(dol_gguf_find_tensor(g, "nope"));
    const dol_gguf_kv *kv = dol_gguf_find_kv(g, "llama.embedding_length");
    assert_non_null(kv);
    assert_int_equal(kv->v.u, D);
    dol_gguf_close(g);
    size_t data0 = 0;
    for (size_t len = 0; len < b.n; len++) {
        /* a copy of exactly len bytes, so ASan sees any read past it */
        uint8_t *cut = malloc(len ? len : 1);
        memcpy(cut, b.b, len);
        err[0] = '\0';
        int rc = dol_gguf_open_mem(cut, len, "cut.gguf", &g, err, sizeof err);
        if (rc == 0) {
            data0 = dol_gguf_data_offset(g);
            dol_gguf_close(g);
        }
        free(cut);
        /* the last tensor ends the file: no prefix holds every tensor */
        if (rc == 0) fail_msg("prefix of %zu of %zu bytes accepted (data at %zu)", len, b.n, data0);
        assert_null(strchr(err, '\n'));
        assert_int_equal(strncmp(err, "cut.gguf: ", 10), 0);
    }
    free(b.b);
}

/* ---- the shared fixtures ---------------------------------------------------------------- */


/* Every shared GGUF file opens, with the tensor types its golden lists. */
static void test_shared_tables(void **state)
{
    (void)state;
    static const char *const models[] = {"k256", "stories260K", "tiny-llama2"};
    int seen = 0;
    for (size_t mi = 0; mi < 3; mi++) {
        char rel[96];
        snprintf(rel, sizeof rel, "golden/gguf-%s.json", models[mi]);
        cJSON *gold = fixture_json(rel);
        if (!gold) continue;
        const cJSON *file;
        cJSON_ArrayForEach(file, cJSON_GetObjectItem(gold, "files")) {
            char path[1200], err[DOL_ERR_LEN];
            if (!have_gguf(cJSON_GetObjectItem(file, "file")->valuestring, path, sizeof path)) continue;
            dol_gguf *g = NULL;
            if (dol_gguf_open(path, &g, err, sizeof err) != 0) fail_msg("%s", err);
            const cJSON *types = cJSON_GetObjectItem(file, "tensor_types");
            assert_int_equal(dol_gguf_n_tensors(g), cJSON_GetArraySize(types));
            const cJSON *ty;
            cJSON_ArrayForEach(ty, types) {
                const dol_gguf_tensor *t = dol_gguf_find_tensor(g, ty->string);
                if (!t) fail_msg("%s: no tensor %s", path, ty->string);
                assert_string_equal(dol_ggml_type(t->type)->name, ty->valuestring);
            }
            assert_int_equal(dol_gguf_file_size(g), (uint64_t)cJSON_GetObjectItem(file, "bytes")->valuedouble);
            dol_gguf_close(g);
            seen++;
        }
        cJSON_Delete(gold);
    }
    if (!seen) skip();
}

static dol_engine *cpu_engine(dol_model *m)
{
    dol_engine *e = NULL;
    char err[DOL_ERR_LEN];
    dol_engine_params p = { .activations = DOL_ACT_F32, .n_threads = 2, .kv_block_size = 16, .kv_cache_tokens = 1024,
                           .max_seqs = 2, .max_batch_tokens = 256, .kv_dtype = DOL_KV_F32,
                           .backend = DOL_BACKEND_CPU};
    if (dol_engine_create(m, &p, &e, err, sizeof err) != 0) fail_msg("%s", err);
    return e;
}

/* The golden's cases on engine eg with tokenizer tg (file `file`): the
 * prompt ids are llama.cpp's, the greedy ids the float64 reference's up to
 * the first step whose margin is below 1e-3, the last position's top 8
 * logits within 1e-3; with eh (the checkpoint's engine) also the same ids
 * and logits bit for bit. */
static void check_cases(const char *file, const cJSON *entry, dol_engine *eg, dol_tokenizer *tg,
                        dol_engine *eh, int V)
{
    char err[DOL_ERR_LEN];
    const cJSON *ref = cJSON_GetObjectItem(cJSON_GetObjectItem(entry, "reference"), "cases");
    const cJSON *lcpp = cJSON_GetObjectItem(cJSON_GetObjectItem(entry, "llama_cpp"), "cases");
    assert_int_equal(cJSON_GetArraySize(ref), cJSON_GetArraySize(lcpp));
    float *fg = malloc(sizeof(float) * (size_t)V), *fh = malloc(sizeof(float) * (size_t)V);
    for (int ci = 0; ci < cJSON_GetArraySize(ref); ci++) {
        const cJSON *rc = cJSON_GetArrayItem(ref, ci), *lc = cJSON_GetArrayItem(lcpp, ci);
        const char *prompt = cJSON_GetObjectItem(rc, "prompt")->valuestring;
        int32_t want_prompt[64], *ids = NULL;
        int np = fixture_ids(cJSON_GetObjectItem(lc, "prompt_ids"), want_prompt, 64);
        size_t n = 0;
        assert_int_equal(dol_tokenizer_encode(tg, prompt, strlen(prompt), true, &ids, &n, err, sizeof err), 0);
        assert_int_equal((int)n, np);
        assert_memory_equal(ids, want_prompt, n * sizeof *ids);
        free(ids);

        int max_new = cJSON_GetObjectItem(rc, "max_tokens")->valueint;
        int32_t og[128], oh[128], want[128];
        double margins[128];
        int ng = test_greedy(eg, want_prompt, np, max_new, og, NULL, fg);
        if (eh) {   /* bit for bit the checkpoint's */
            int nh = test_greedy(eh, want_prompt, np, max_new, oh, NULL, fh);
            assert_int_equal(ng, nh);
            assert_memory_equal(og, oh, (size_t)ng * sizeof *og);
            assert_memory_equal(fg, fh, sizeof(float) * (size_t)V);
        }
        /* the float64 reference: ids up to the first undecided step, the
         * last position's top 8 within 1e-3 */
        int nw = fixture_ids(cJSON_GetObjectItem(rc, "greedy_ids"), want, 128);
        const cJSON *mg = cJSON_GetObjectItem(rc, "greedy_margins");
        int k = 0;
        for (; k < nw; k++) {
            margins[k] = cJSON_GetArrayItem(mg, k)->valuedouble;
            if (margins[k] < 1e-3) break;
        }
        for (int s2 = 0; s2 < k; s2++)
            if (s2 >= ng || og[s2] != want[s2])
                fail_msg("%s case %d: step %d: id %d, reference %d", file, ci, s2,
                         s2 < ng ? og[s2] : -1, want[s2]);
        const cJSON *top;
        cJSON_ArrayForEach(top, cJSON_GetObjectItem(rc, "last_logits_top8")) {
            int id = cJSON_GetArrayItem(top, 0)->valueint;
            double v = cJSON_GetArrayItem(top, 1)->valuedouble;
            if (fabs(fg[id] - v) > 1e-3)
                fail_msg("%s case %d: logit %d = %.6f, reference %.6f", file, ci, id, fg[id], v);
        }
    }
    free(fg);
    free(fh);
}

/* GGUF file `file` against the safetensors directory `dir` it was made from
 * and the golden gguf-<golden>.json, entry `key`. */
static void against_checkpoint(const char *file, const char *dir_name, const char *golden,
                               const char *key, bool keeps_spaces)
{
    char path[1200], dir[1200], err[DOL_ERR_LEN], rel[96];
    if (!have_gguf(file, path, sizeof path)) skip();
    test_fixture_model(dir, sizeof dir, dir_name);
    snprintf(rel, sizeof rel, "golden/gguf-%s.json", golden);
    cJSON *gold = fixture_json(rel);
    if (!gold) skip();
    const cJSON *entry = cJSON_GetObjectItem(cJSON_GetObjectItem(gold, "files"), key);
    assert_non_null(entry);

    dol_model *g = NULL, *h = NULL;
    if (dol_model_load(path, &g, err, sizeof err) != 0) fail_msg("%s", err);
    if (dol_model_load(dir, &h, err, sizeof err) != 0) fail_msg("%s", err);
    const dol_model_config *a = &g->cfg, *b = &h->cfg;
    assert_int_equal(a->hidden_size, b->hidden_size);
    assert_int_equal(a->intermediate_size, b->intermediate_size);
    assert_int_equal(a->n_layers, b->n_layers);
    assert_int_equal(a->n_heads, b->n_heads);
    assert_int_equal(a->n_kv_heads, b->n_kv_heads);
    assert_int_equal(a->vocab_size, b->vocab_size);
    assert_int_equal(a->max_position_embeddings, b->max_position_embeddings);
    assert_float_equal(a->rms_norm_eps, b->rms_norm_eps, 0);
    assert_float_equal(a->rope_theta, b->rope_theta, 0);
    assert_int_equal(a->tie_word_embeddings, b->tie_word_embeddings);
    assert_int_equal(a->bos_token_id, b->bos_token_id);
    assert_int_equal(a->eos_token_id, b->eos_token_id);

    /* the tokenizer from the file: llama.cpp's prompt ids, and the same
     * ids as the checkpoint's tokenizer.model */
    dol_tokenizer *tg = NULL, *th = NULL;
    char tok_path[1300];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.model", dir);
    if (dol_model_tokenizer(g, &tg, err, sizeof err) != 0) fail_msg("%s", err);
    if (dol_tokenizer_load(tok_path, &th, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(dol_tokenizer_vocab_size(tg), dol_tokenizer_vocab_size(th));
    const cJSON *ref = cJSON_GetObjectItem(cJSON_GetObjectItem(entry, "reference"), "cases");
    const cJSON *lcpp = cJSON_GetObjectItem(cJSON_GetObjectItem(entry, "llama_cpp"), "cases");
    assert_int_equal(cJSON_GetArraySize(ref), cJSON_GetArraySize(lcpp));
    /* (a GGUF file does not say whether its tokenizer.model removed extra
     * whitespace: like llama.cpp, the tokenizer built from it keeps it,
     * which stories260K's tokenizer.model, trained with the default, does
     * not; Llama-2's keeps it too) */
    const char *extra[] = {"tabs\tand\nnewlines\n", "caf\xc3\xa9 \xe5\xa4\xa7", "<s> not a control", "",
                           "  two  spaces "};
    size_t n_extra = sizeof extra / sizeof extra[0] - (keeps_spaces ? 0 : 1);
    for (size_t i = 0; i < n_extra; i++) {
        int32_t *x = NULL, *y = NULL;
        size_t nx = 0, ny = 0;
        assert_int_equal(dol_tokenizer_encode(tg, extra[i], strlen(extra[i]), true, &x, &nx, err, sizeof err), 0);
        assert_int_equal(dol_tokenizer_encode(th, extra[i], strlen(extra[i]), true, &y, &ny, err, sizeof err), 0);
        assert_int_equal(nx, ny);
        assert_memory_equal(x, y, nx * sizeof *x);
        char *dx = NULL, *dy = NULL;
        size_t lx, ly;
        assert_int_equal(dol_tokenizer_decode(tg, x, nx, &dx, &lx, err, sizeof err), 0);
        assert_int_equal(dol_tokenizer_decode(th, y, ny, &dy, &ly, err, sizeof err), 0);
        assert_string_equal(dx, dy);
        free(dx), free(dy), free(x), free(y);
    }

    dol_engine *eg = cpu_engine(g), *eh = cpu_engine(h);
    /* the engine holds q / k in its own format: the model's un-permuted
     * copies go (as the registry does), and nothing changes */
    const dol_tensor *q0 = &g->layers[0].q;
    size_t qk = 0;
    for (int l = 0; l < a->n_layers; l++)
        qk += (size_t)(g->layers[l].q.rows * g->layers[l].q.cols + g->layers[l].k.rows * g->layers[l].k.cols) *
              dol_dtype_size(q0->dtype);
    assert_int_equal(dol_model_drop_copies(g), qk);
    assert_null(g->layers[0].q.data);
    assert_null(g->layers[0].k.data);
    assert_non_null(g->layers[0].v.data);
    assert_int_equal(dol_model_drop_copies(h), 0);
    check_cases(file, entry, eg, tg, eh, a->vocab_size);
    dol_engine_free(eg);
    dol_engine_free(eh);
    dol_tokenizer_free(tg);
    dol_tokenizer_free(th);
    dol_model_free(g);
    dol_model_free(h);
    cJSON_Delete(gold);
}

/* Every quantized file of the goldens (k256 in ten types, tiny-llama2's
 * Q4_K_M mix) on the CPU against the float64 reference on gguf-py's
 * dequantized weights, with the F32 KV cache; the block-quantized layers
 * are read in place, so dropping copies leaves them. */
static void test_shared_quantized(void **state)
{
    (void)state;
    static const char *const models[] = {"k256", "tiny-llama2"};
    int seen = 0;
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        char rel[96], path[1200], err[DOL_ERR_LEN];
        snprintf(rel, sizeof rel, "golden/gguf-%s.json", models[mi]);
        cJSON *gold = fixture_json(rel);
        if (!gold) continue;
        const cJSON *entry;
        cJSON_ArrayForEach(entry, cJSON_GetObjectItem(gold, "files")) {
            const char *file = cJSON_GetObjectItem(entry, "file")->valuestring;
            if (strcmp(entry->string, "F16") == 0 || strcmp(entry->string, "F32") == 0) continue;
            if (!have_gguf(file, path, sizeof path)) continue;
            dol_model *g = NULL;
            if (dol_model_load(path, &g, err, sizeof err) != 0) fail_msg("%s", err);
            dol_tokenizer *tg = NULL;
            if (dol_model_tokenizer(g, &tg, err, sizeof err) != 0) fail_msg("%s", err);
            dol_engine *eg = cpu_engine(g);
            size_t plain = 0;
            for (int l = 0; l < g->cfg.n_layers; l++)
                for (int i = 0; i < 2; i++) {
                    const dol_tensor *t = i ? &g->layers[l].k : &g->layers[l].q;
                    if (!dol_dtype_is_block(t->dtype)) plain += dol_tensor_bytes(t);
                }
            assert_int_equal(dol_model_drop_copies(g), plain);
            if (dol_dtype_is_block(g->layers[0].q.dtype)) assert_non_null(g->layers[0].q.data);
            check_cases(file, entry, eg, tg, NULL, g->cfg.vocab_size);
            dol_engine_free(eg);
            dol_tokenizer_free(tg);
            dol_model_free(g);
            seen++;
        }
        cJSON_Delete(gold);
    }
    if (!seen) skip();
}

static void test_shared_stories_f32(void **state)
{
    (void)state;
    against_checkpoint("stories260K-F32.gguf", "stories260K", "stories260K", "F32", false);
}

static void test_shared_k256_f16(void **state)
{
    (void)state;
    against_checkpoint("k256-F16.gguf", "k256", "k256", "F16", false);
}

static void test_shared_tiny_llama2_f16(void **state)
{
    (void)state;
    against_checkpoint("tiny-llama2-F16.gguf", "tiny-llama2", "tiny-llama2", "F16", true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_file),
        cmocka_unit_test(test_tied_bf16_and_linear_rope),
        cmocka_unit_test(test_bf16_in_the_engine),
        cmocka_unit_test(test_linear_rope_in_the_engine),
        cmocka_unit_test(test_refused_header),
        cmocka_unit_test(test_refused_tensors),
        cmocka_unit_test(test_refused_keys),
        cmocka_unit_test(test_refused_paths),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_source_digest),
        cmocka_unit_test(test_shared_tables),
        cmocka_unit_test(test_shared_quantized),
        cmocka_unit_test(test_shared_stories_f32),
        cmocka_unit_test(test_shared_k256_f16),
        cmocka_unit_test(test_shared_tiny_llama2_f16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
