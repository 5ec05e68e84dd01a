/* src/model/gguf_llama.c — a GGUF file as a Llama dol_model (what
 * dol_model_load_gguf promises in include/dolphin/model.h): the llama.*
 * hyperparameters, the tokenizer keys (checked at load, built into a
 * sentencepiece tokenizer by dol_model_tokenizer), and the tensors bound by
 * llama.cpp's names with their shapes and types checked. attn_q / attn_k
 * are un-permuted into Hugging Face's row order (copies the model owns);
 * every other tensor stays in the read-only mapping. */
#include "dolphin/gguf.h"
#include "dolphin/model.h"
#include "dolphin/tokenizer.h"
#include "model_internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_LAYERS 65536
#define MAX_DIM (1 << 20)
#define SERVED "this build serves F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K tensors"

/* What is being loaded. */
typedef struct {
    dol_model *m;
    model_priv *p;
    const dol_gguf *g;
    const char *path;
    bool *used;           /* per tensor of the file: bound to the model */
    char *err;
    size_t errlen;
} gl;

/* ---- keys ------------------------------------------------------------------ */

static bool is_int_type(dol_gguf_vtype t)
{
    return t == DOL_GGUF_UINT8 || t == DOL_GGUF_INT8 || t == DOL_GGUF_UINT16 ||
           t == DOL_GGUF_INT16 || t == DOL_GGUF_UINT32 || t == DOL_GGUF_INT32 ||
           t == DOL_GGUF_UINT64 || t == DOL_GGUF_INT64;
}

static bool is_unsigned(dol_gguf_vtype t)
{
    return t == DOL_GGUF_UINT8 || t == DOL_GGUF_UINT16 || t == DOL_GGUF_UINT32 ||
           t == DOL_GGUF_UINT64;
}

/* The type of a value for messages: "u32", "array of string". */
static void type_str(const dol_gguf_kv *kv, char *buf, size_t len)
{
    if (kv->type == DOL_GGUF_ARRAY)
        snprintf(buf, len, "an array of %s", dol_gguf_vtype_name(kv->arr_type));
    else
        snprintf(buf, len, "a %s", dol_gguf_vtype_name(kv->type));
}

static bool is_float_type(dol_gguf_vtype t) { return t == DOL_GGUF_FLOAT32 || t == DOL_GGUF_FLOAT64; }
static bool is_bool_type(dol_gguf_vtype t) { return t == DOL_GGUF_BOOL; }
static bool is_string_type(dol_gguf_vtype t) { return t == DOL_GGUF_STRING; }

/* The scalar key `key` whose type passes `ok` (`what` names the type for the
 * message): 1 with *kv set; 0 when absent and not required; -1 (error set)
 * when absent and required, or of another type. */
static int find_key(gl *L, const char *key, bool required, bool (*ok)(dol_gguf_vtype),
                    const char *what, const dol_gguf_kv **kv)
{
    *kv = dol_gguf_find_kv(L->g, key);
    if (!*kv) {
        if (!required) return 0;
        dol_set_err(L->err, L->errlen, "%s: key %s: missing", L->path, key);
        return -1;
    }
    if (!ok((*kv)->type)) {
        char t[48];
        type_str(*kv, t, sizeof t);
        dol_set_err(L->err, L->errlen, "%s: key %s: must be %s (got %s)", L->path, key, what, t);
        return -1;
    }
    return 1;
}

/* An integer key in [lo, hi]. Absent: `def`, or an error when required. */
static int key_int(gl *L, const char *key, bool required, int64_t def, int64_t lo, int64_t hi,
                   int64_t *out)
{
    const dol_gguf_kv *kv;
    int found = find_key(L, key, required, is_int_type, "an integer", &kv);
    if (found <= 0) {
        *out = def;
        return found;
    }
    bool big = is_unsigned(kv->type) && kv->v.u > (uint64_t)INT64_MAX;
    int64_t v = is_unsigned(kv->type) ? (int64_t)kv->v.u : kv->v.i;
    if (big || v < lo || v > hi) {
        if (is_unsigned(kv->type))
            dol_set_err(L->err, L->errlen, "%s: key %s: %llu is out of range (%lld..%lld)",
                        L->path, key, (unsigned long long)kv->v.u, (long long)lo, (long long)hi);
        else
            dol_set_err(L->err, L->errlen, "%s: key %s: %lld is out of range (%lld..%lld)",
                        L->path, key, (long long)v, (long long)lo, (long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int key_i32(gl *L, const char *key, bool required, int def, int lo, int hi, int *out)
{
    int64_t v;
    if (key_int(L, key, required, def, lo, hi, &v) != 0) return -1;
    *out = (int)v;
    return 0;
}

/* A finite positive float key (f32 or f64). */
static int key_pos_float(gl *L, const char *key, bool required, double def, double *out)
{
    const dol_gguf_kv *kv;
    int found = find_key(L, key, required, is_float_type, "a float", &kv);
    if (found <= 0) {
        *out = def;
        return found;
    }
    if (!isfinite(kv->v.f) || kv->v.f <= 0 || kv->v.f > 3.0e38 || (float)kv->v.f <= 0) {
        dol_set_err(L->err, L->errlen, "%s: key %s: %g is not a positive finite number", L->path,
                    key, kv->v.f);
        return -1;
    }
    *out = kv->v.f;
    return 0;
}

static int key_bool(gl *L, const char *key, bool def, bool *out)
{
    const dol_gguf_kv *kv;
    int found = find_key(L, key, false, is_bool_type, "a bool", &kv);
    if (found <= 0) {
        *out = def;
        return found;
    }
    *out = kv->v.b;
    return 0;
}

/* A string key; absent: NULL when optional. */
static int key_str(gl *L, const char *key, bool required, dol_gguf_str *out, bool *present)
{
    const dol_gguf_kv *kv;
    int found = find_key(L, key, required, is_string_type, "a string", &kv);
    *present = found > 0;
    if (found <= 0) return found;
    *out = kv->v.s;
    return 0;
}

static bool str_is(const dol_gguf_str *s, const char *want)
{
    return s->len == strlen(want) && memcmp(s->s, want, (size_t)s->len) == 0;
}

static int shown(uint64_t len) { return len > 60 ? 60 : (int)len; }

/* ---- hyperparameters ----------------------------------------------------------- */

static int rope_scaling(gl *L, dol_model_config *c)
{
    dol_gguf_str type = {0};
    bool has_type = false;
    double factor = 1.0;
    if (key_str(L, "llama.rope.scaling.type", false, &type, &has_type) != 0) return -1;
    bool has_factor = dol_gguf_find_kv(L->g, "llama.rope.scaling.factor") != NULL;
    bool has_legacy = dol_gguf_find_kv(L->g, "llama.rope.scale_linear") != NULL;
    const char *fkey = has_factor ? "llama.rope.scaling.factor" : "llama.rope.scale_linear";
    if ((has_factor || has_legacy) && key_pos_float(L, fkey, true, 1.0, &factor) != 0) return -1;
    if (has_type && str_is(&type, "none")) {
        c->rope_scale = 1.0f;
        return 0;
    }
    if (has_type && !str_is(&type, "linear")) {
        dol_set_err(L->err, L->errlen, "%s: key llama.rope.scaling.type: \"%.*s\" is not "
                    "supported (only none and linear)", L->path, shown(type.len), type.s);
        return -1;
    }
    if (has_type && !has_factor && !has_legacy) {
        dol_set_err(L->err, L->errlen, "%s: key llama.rope.scaling.factor: missing (rope scaling "
                    "type linear needs it)", L->path);
        return -1;
    }
    c->rope_scale = (float)factor;
    return 0;
}

static int hyperparameters(gl *L)
{
    dol_model_config *c = &L->m->cfg;
    dol_gguf_str arch;
    bool present;
    if (key_str(L, "general.architecture", true, &arch, &present) != 0) return -1;
    if (!str_is(&arch, "llama")) {
        dol_set_err(L->err, L->errlen, "%s: key general.architecture: \"%.*s\" is not supported "
                    "(only llama)", L->path, shown(arch.len), arch.s);
        return -1;
    }
    if (key_i32(L, "llama.context_length", true, 0, 1, INT_MAX, &c->max_position_embeddings) ||
        key_i32(L, "llama.embedding_length", true, 0, 1, MAX_DIM, &c->hidden_size) ||
        key_i32(L, "llama.block_count", true, 0, 1, MAX_LAYERS, &c->n_layers) ||
        key_i32(L, "llama.feed_forward_length", true, 0, 1, MAX_DIM, &c->intermediate_size) ||
        key_i32(L, "llama.attention.head_count", true, 0, 1, c->hidden_size, &c->n_heads) ||
        key_i32(L, "llama.attention.head_count_kv", false, c->n_heads, 1, c->n_heads,
                &c->n_kv_heads))
        return -1;
    if (c->hidden_size % c->n_heads != 0) {
        dol_set_err(L->err, L->errlen, "%s: key llama.embedding_length: %d is not divisible by "
                    "llama.attention.head_count %d", L->path, c->hidden_size, c->n_heads);
        return -1;
    }
    if (c->n_heads % c->n_kv_heads != 0) {
        dol_set_err(L->err, L->errlen, "%s: key llama.attention.head_count_kv: %d does not divide "
                    "llama.attention.head_count %d", L->path, c->n_kv_heads, c->n_heads);
        return -1;
    }
    c->head_dim = c->hidden_size / c->n_heads;
    if (c->head_dim % 2 != 0) {
        dol_set_err(L->err, L->errlen, "%s: key llama.embedding_length: head dimension %d must be "
                    "even for RoPE", L->path, c->head_dim);
        return -1;
    }
    /* what must equal the head dimension, when given */
    static const char *const same_as_head[] = {"llama.rope.dimension_count",
                                               "llama.attention.key_length",
                                               "llama.attention.value_length"};
    for (size_t i = 0; i < sizeof same_as_head / sizeof same_as_head[0]; i++) {
        int v;
        if (key_i32(L, same_as_head[i], false, c->head_dim, 0, INT_MAX, &v) != 0) return -1;
        if (v != c->head_dim) {
            dol_set_err(L->err, L->errlen, "%s: key %s: %d, but the head dimension is %d (only "
                        "equal is supported)", L->path, same_as_head[i], v, c->head_dim);
            return -1;
        }
    }
    int experts;
    if (key_i32(L, "llama.expert_count", false, 0, 0, INT_MAX, &experts) != 0) return -1;
    if (experts > 0) {
        dol_set_err(L->err, L->errlen, "%s: key llama.expert_count: %d experts: mixture of experts "
                    "is not supported", L->path, experts);
        return -1;
    }
    double eps, theta;
    if (key_pos_float(L, "llama.attention.layer_norm_rms_epsilon", true, 0, &eps) ||
        key_pos_float(L, "llama.rope.freq_base", false, 10000.0, &theta))
        return -1;
    c->rms_norm_eps = (float)eps;
    c->rope_theta = (float)theta;
    return rope_scaling(L, c);
}

/* ---- the tokenizer keys ---------------------------------------------------------- */

/* The arrays and ids of the tokenizer, checked (no copies: views into g). */
typedef struct {
    const dol_gguf_kv *tokens, *scores, *types;
    int32_t n, unk, bos, eos, pad;
    bool add_space_prefix, remove_extra_ws;
} tok_keys;

static int tokenizer_keys(gl *L, tok_keys *k)
{
    memset(k, 0, sizeof *k);
    dol_gguf_str model;
    bool present;
    if (key_str(L, "tokenizer.ggml.model", true, &model, &present) != 0) return -1;
    if (!str_is(&model, "llama")) {
        dol_set_err(L->err, L->errlen, "%s: key tokenizer.ggml.model: tokenizer \"%.*s\" is not "
                    "supported (only llama, SentencePiece)", L->path, shown(model.len), model.s);
        return -1;
    }
    static const struct { const char *key; int kind; } arrays[] = {
        {"tokenizer.ggml.tokens", 0}, {"tokenizer.ggml.scores", 1}, {"tokenizer.ggml.token_type", 2},
    };
    const dol_gguf_kv *kv[3];
    for (int i = 0; i < 3; i++) {
        const char *key = arrays[i].key;
        kv[i] = dol_gguf_find_kv(L->g, key);
        if (!kv[i]) {
            dol_set_err(L->err, L->errlen, "%s: key %s: missing", L->path, key);
            return -1;
        }
        bool ok = kv[i]->type == DOL_GGUF_ARRAY &&
                  (arrays[i].kind == 0 ? kv[i]->arr_type == DOL_GGUF_STRING
                   : arrays[i].kind == 1 ? (kv[i]->arr_type == DOL_GGUF_FLOAT32 ||
                                            kv[i]->arr_type == DOL_GGUF_FLOAT64)
                                         : is_int_type(kv[i]->arr_type));
        if (!ok) {
            char t[48];
            type_str(kv[i], t, sizeof t);
            dol_set_err(L->err, L->errlen, "%s: key %s: must be an array of %s (got %s)", L->path,
                        key, arrays[i].kind == 0 ? "strings" : arrays[i].kind == 1 ? "floats"
                                                                                   : "integers", t);
            return -1;
        }
        if (i == 0 && (kv[0]->arr_n == 0 || kv[0]->arr_n > (uint64_t)INT32_MAX)) {
            dol_set_err(L->err, L->errlen, "%s: key %s: %llu tokens (must be 1..%d)", L->path, key,
                        (unsigned long long)kv[0]->arr_n, INT32_MAX);
            return -1;
        }
        if (i > 0 && kv[i]->arr_n != kv[0]->arr_n) {
            dol_set_err(L->err, L->errlen, "%s: key %s: %llu entries but tokenizer.ggml.tokens has "
                        "%llu", L->path, key, (unsigned long long)kv[i]->arr_n,
                        (unsigned long long)kv[0]->arr_n);
            return -1;
        }
    }
    k->tokens = kv[0];
    k->scores = kv[1];
    k->types = kv[2];
    k->n = (int32_t)kv[0]->arr_n;
    for (int32_t i = 0; i < k->n; i++) {
        int64_t t;
        if (!dol_gguf_arr_int(k->types, (uint64_t)i, &t) || t < 1 || t > 6) {
            dol_set_err(L->err, L->errlen, "%s: key tokenizer.ggml.token_type: token %d has type "
                        "%lld (sentencepiece's are 1..6)", L->path, (int)i, (long long)t);
            return -1;
        }
        if (k->tokens->arr_str[i].len == 0) {
            dol_set_err(L->err, L->errlen, "%s: key tokenizer.ggml.tokens: token %d is empty",
                        L->path, (int)i);
            return -1;
        }
    }
    if (key_i32(L, "tokenizer.ggml.unknown_token_id", false, 0, 0, k->n - 1, &k->unk) ||
        key_i32(L, "tokenizer.ggml.bos_token_id", false, k->n > 1 ? 1 : 0, 0, k->n - 1, &k->bos) ||
        key_i32(L, "tokenizer.ggml.eos_token_id", false, k->n > 2 ? 2 : 0, 0, k->n - 1, &k->eos) ||
        key_i32(L, "tokenizer.ggml.padding_token_id", false, -1, -1, k->n - 1, &k->pad))
        return -1;
    bool add_bos, add_eos;
    if (key_bool(L, "tokenizer.ggml.add_bos_token", true, &add_bos) ||
        key_bool(L, "tokenizer.ggml.add_eos_token", false, &add_eos) ||
        key_bool(L, "tokenizer.ggml.add_space_prefix", true, &k->add_space_prefix) ||
        key_bool(L, "tokenizer.ggml.remove_extra_whitespaces", false, &k->remove_extra_ws))
        return -1;
    if (!add_bos) {
        dol_set_err(L->err, L->errlen, "%s: key tokenizer.ggml.add_bos_token: false is not "
                    "supported (prompts always begin with BOS)", L->path);
        return -1;
    }
    if (add_eos) {
        dol_set_err(L->err, L->errlen, "%s: key tokenizer.ggml.add_eos_token: true is not "
                    "supported (prompts never end with EOS)", L->path);
        return -1;
    }
    if (dol_gguf_find_kv(L->g, "tokenizer.ggml.precompiled_charsmap")) {
        dol_set_err(L->err, L->errlen, "%s: key tokenizer.ggml.precompiled_charsmap: a normalizer "
                    "character map is not supported", L->path);
        return -1;
    }
    return 0;
}

/* ---- tensors ------------------------------------------------------------------------ */

static bool dtype_of(uint32_t ggml, dol_dtype *out)
{
    switch (ggml) {
    case 0: *out = DOL_DTYPE_F32; return true;
    case 1: *out = DOL_DTYPE_F16; return true;
    case 2: *out = DOL_DTYPE_Q4_0; return true;
    case 3: *out = DOL_DTYPE_Q4_1; return true;
    case 6: *out = DOL_DTYPE_Q5_0; return true;
    case 7: *out = DOL_DTYPE_Q5_1; return true;
    case 8: *out = DOL_DTYPE_Q8_0; return true;
    case 10: *out = DOL_DTYPE_Q2_K; return true;
    case 11: *out = DOL_DTYPE_Q3_K; return true;
    case 12: *out = DOL_DTYPE_Q4_K; return true;
    case 13: *out = DOL_DTYPE_Q5_K; return true;
    case 14: *out = DOL_DTYPE_Q6_K; return true;
    case 30: *out = DOL_DTYPE_BF16; return true;
    default: return false;
    }
}

/* Un-permute the rows of attn_q / attn_k: llama.cpp's converter stores head
 * h's row 2i + j (i < head_dim/2, j in {0, 1}) where Hugging Face has row
 * j * head_dim/2 + i. Whole rows move; `heads` heads of head_dim rows of
 * `row_bytes` each. */
static void unpermute(uint8_t *dst, const uint8_t *src, int heads, int head_dim, size_t row_bytes)
{
    int half = head_dim / 2;
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < half; i++)
            for (int j = 0; j < 2; j++) {
                size_t to = (size_t)h * head_dim + (size_t)j * half + i;
                size_t from = (size_t)h * head_dim + 2 * (size_t)i + j;
                memcpy(dst + to * row_bytes, src + from * row_bytes, row_bytes);
            }
}

/* Drop the pages of [p, p + n) from this process (the mapping is read-only:
 * they fault back in from the file if read again). */
static void drop_pages(const gl *L, const void *p, size_t n)
{
    if (!dol_gguf_mapped(L->g) || n == 0) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t m0 = (uintptr_t)dol_gguf_base(L->g);
    uintptr_t m1 = (m0 + (uintptr_t)dol_gguf_file_size(L->g) + page - 1) & ~(page - 1);
    uintptr_t a = (uintptr_t)p & ~(page - 1);
    uintptr_t b = ((uintptr_t)p + n + page - 1) & ~(page - 1);
    if (b > m1) b = m1;
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Bind tensor `name` of GGUF shape {cols} (rows == 0) or {cols, rows};
 * permute_heads > 0: un-permute its rows in heads of head_dim. */
static int bind(gl *L, const char *name, int64_t rows, int64_t cols, dol_tensor *dst,
                int permute_heads)
{
    const dol_gguf_tensor *t = dol_gguf_find_tensor(L->g, name);
    if (!t) {
        dol_set_err(L->err, L->errlen, "%s: tensor %s: missing", L->path, name);
        return -1;
    }
    L->used[t - dol_gguf_tensor_at(L->g, 0)] = true;
    uint32_t want_dims = rows ? 2 : 1;
    if (t->n_dims != want_dims || t->ne[0] != (uint64_t)cols ||
        (rows && t->ne[1] != (uint64_t)rows)) {
        char have[128], need[64];
        dol_gguf_shape_str(t, have, sizeof have);
        if (rows) snprintf(need, sizeof need, "[%lld, %lld]", (long long)cols, (long long)rows);
        else snprintf(need, sizeof need, "[%lld]", (long long)cols);
        dol_set_err(L->err, L->errlen, "%s: tensor %s: shape %s but the llama.* keys say %s",
                    L->path, name, have, need);
        return -1;
    }
    dol_dtype dt;
    if (!dtype_of(t->type, &dt)) {
        const dol_ggml_type_info *ti = dol_ggml_type(t->type);
        dol_set_err(L->err, L->errlen, "%s: tensor %s: type %s is not supported (" SERVED ")",
                    L->path, name, ti ? ti->name : "?");
        return -1;
    }
    if (!rows && dol_dtype_is_block(dt)) {
        dol_set_err(L->err, L->errlen, "%s: tensor %s: type %s is not supported for a 1-D "
                    "tensor (norms are F32, F16 or BF16)", L->path, name, dol_dtype_name(dt));
        return -1;
    }
    /* block types are read byte by byte: any address will do */
    size_t esize = dol_dtype_is_block(dt) ? 1 : dol_dtype_size(dt);
    const uint8_t *src = t->data;
    const void *data = src;
    size_t nbytes = (size_t)t->nbytes;
    if (permute_heads > 0 || (uintptr_t)src % esize != 0) {
        uint8_t *copy = dol_model_own(L->p, nbytes);
        if (!copy) {
            dol_set_err(L->err, L->errlen, "%s: tensor %s: out of memory for a copy", L->path, name);
            return -1;
        }
        if (permute_heads > 0)
            unpermute(copy, src, permute_heads, L->m->cfg.head_dim, dol_dtype_row_bytes(dt, cols));
        else
            memcpy(copy, src, nbytes);
        drop_pages(L, src, nbytes);
        data = copy;
    }
    dst->dtype = dt;
    dst->rows = rows ? rows : 1;
    dst->cols = cols;
    dst->data = data;
    L->m->weight_bytes += nbytes;
    return 0;
}

/* N of a name "blk.N.…" (saturating: only "too large" matters), else -1. */
static long layer_of(const char *name)
{
    if (strncmp(name, "blk.", 4) != 0) return -1;
    const char *p = name + 4;
    if (*p < '0' || *p > '9') return -1;
    long n = 0;
    for (; *p >= '0' && *p <= '9'; p++)
        if (n <= INT_MAX) n = n * 10 + (*p - '0');
    return *p == '.' ? n : -1;
}

static int bind_all(gl *L)
{
    dol_model *m = L->m;
    const dol_model_config *c = &m->cfg;
    int64_t d = c->hidden_size, f = c->intermediate_size, h = c->head_dim;
    int64_t q = (int64_t)c->n_heads * h, kv = (int64_t)c->n_kv_heads * h;
    char name[96];

    if (bind(L, "token_embd.weight", c->vocab_size, d, &m->embed, 0)) return -1;
    for (int i = 0; i < c->n_layers; i++) {
        dol_layer_weights *l = &m->layers[i];
        const struct { const char *suffix; int64_t rows, cols; dol_tensor *dst; int heads; } w[] = {
            {"attn_norm", 0, d, &l->attn_norm, 0},
            {"attn_q", q, d, &l->q, c->n_heads},
            {"attn_k", kv, d, &l->k, c->n_kv_heads},
            {"attn_v", kv, d, &l->v, 0},
            {"attn_output", d, q, &l->o, 0},
            {"ffn_norm", 0, d, &l->ffn_norm, 0},
            {"ffn_gate", f, d, &l->gate, 0},
            {"ffn_up", f, d, &l->up, 0},
            {"ffn_down", d, f, &l->down, 0},
        };
        for (size_t j = 0; j < sizeof w / sizeof w[0]; j++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", i, w[j].suffix);
            if (bind(L, name, w[j].rows, w[j].cols, w[j].dst, w[j].heads)) return -1;
        }
    }
    if (bind(L, "output_norm.weight", 0, d, &m->final_norm, 0)) return -1;
    if (dol_gguf_find_tensor(L->g, "output.weight")) {
        m->cfg.tie_word_embeddings = false;
        if (bind(L, "output.weight", c->vocab_size, d, &m->lm_head, 0)) return -1;
    } else {
        m->cfg.tie_word_embeddings = true;
        m->lm_head = m->embed;
    }
    /* nothing left over: a tensor the model does not use means a model this
     * loader does not understand */
    for (size_t i = 0; i < dol_gguf_n_tensors(L->g); i++) {
        if (L->used[i]) continue;
        const char *tn = dol_gguf_tensor_at(L->g, i)->name;
        long layer = layer_of(tn);
        if (layer >= c->n_layers)
            dol_set_err(L->err, L->errlen, "%s: tensor %s: layer %ld, but llama.block_count is %d",
                        L->path, tn, layer, c->n_layers);
        else
            dol_set_err(L->err, L->errlen, "%s: tensor %s: not a tensor of a Llama model (this "
                        "loader does not know what to do with it)", L->path, tn);
        return -1;
    }
    return 0;
}

/* ---- the model ------------------------------------------------------------------------ */

static void set_name(dol_model *m, const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t n = strlen(base);
    if (n > 5 && strcmp(base + n - 5, ".gguf") == 0) n -= 5;
    if (n >= sizeof m->name) n = sizeof m->name - 1;
    memcpy(m->name, base, n);
    m->name[n] = '\0';
}

static void type_mix(gl *L)
{
    const char *names[64];
    int counts[64], k = 0;
    for (size_t i = 0; i < dol_gguf_n_tensors(L->g); i++) {
        const dol_ggml_type_info *ti = dol_ggml_type(dol_gguf_tensor_at(L->g, i)->type);
        const char *nm = ti ? ti->name : "?";
        int j = 0;
        while (j < k && strcmp(names[j], nm) != 0) j++;
        if (j == k) {
            if (k == 64) continue;
            names[k] = nm;
            counts[k++] = 0;
        }
        counts[j]++;
    }
    dol_model_type_mix(names, counts, k, L->m->type_mix, sizeof L->m->type_mix);
}

int dol_model_gguf_fill(dol_model *m, const char *path, char *err, size_t errlen)
{
    model_priv *p = m->priv;
    if (strlen(path) >= sizeof m->dir) {
        dol_set_err(err, errlen, "%s: path too long (limit %zu bytes)", path, sizeof m->dir - 1);
        return -1;
    }
    strcpy(m->dir, path);
    set_name(m, path);
    if (dol_gguf_open(path, &p->gguf, err, errlen) != 0) return -1;
    gl L = {.m = m, .p = p, .g = p->gguf, .path = path, .err = err, .errlen = errlen};
    if (hyperparameters(&L) != 0) return -1;
    tok_keys k;
    if (tokenizer_keys(&L, &k) != 0) return -1;
    m->cfg.vocab_size = k.n;
    m->cfg.bos_token_id = k.bos;
    m->cfg.eos_token_id = k.eos;
    m->cfg.eos_token_ids[0] = k.eos;
    m->cfg.n_eos_token_ids = 1;
    int vs;
    if (key_i32(&L, "llama.vocab_size", false, k.n, 0, INT_MAX, &vs) != 0) return -1;
    if (vs != k.n) {
        dol_set_err(err, errlen, "%s: key llama.vocab_size: %d, but tokenizer.ggml.tokens has %d "
                    "tokens", path, vs, k.n);
        return -1;
    }
    m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    L.used = calloc(dol_gguf_n_tensors(p->gguf) + 1, sizeof *L.used);
    if (!m->layers || !L.used) {
        free(L.used);
        dol_set_err(err, errlen, "%s: out of memory", path);
        return -1;
    }
    int rc = bind_all(&L);
    free(L.used);
    if (rc != 0) return -1;
    type_mix(&L);
    return 0;
}

int dol_model_tokenizer(const dol_model *m, dol_tokenizer **out, char *err, size_t errlen)
{
    *out = NULL;
    const model_priv *p = m->priv;
    if (!p || !p->gguf) {
        dol_set_err(err, errlen, "%s: not a GGUF model: its tokenizer is tokenizer.model", m->dir);
        return -1;
    }
    gl L = {.m = (dol_model *)m, .g = p->gguf, .path = m->dir, .err = err, .errlen = errlen};
    tok_keys k;
    if (tokenizer_keys(&L, &k) != 0) return -1;
    const char **piece = malloc((size_t)k.n * sizeof *piece);
    size_t *len = malloc((size_t)k.n * sizeof *len);
    float *score = malloc((size_t)k.n * sizeof *score);
    int32_t *type = malloc((size_t)k.n * sizeof *type);
    int rc = -1;
    if (!piece || !len || !score || !type) {
        dol_set_err(err, errlen, "%s: out of memory for the tokenizer", m->dir);
        goto done;
    }
    for (int32_t i = 0; i < k.n; i++) {
        int64_t t = 1;
        piece[i] = k.tokens->arr_str[i].s;
        len[i] = (size_t)k.tokens->arr_str[i].len;
        if (!dol_gguf_arr_f32(k.scores, (uint64_t)i, &score[i])) score[i] = 0;
        (void)dol_gguf_arr_int(k.types, (uint64_t)i, &t);
        type[i] = (int32_t)t;
    }
    dol_tokenizer_spec spec = {
        .n_pieces = k.n, .piece = piece, .piece_len = len, .score = score, .type = type,
        .unk_id = k.unk, .bos_id = k.bos, .eos_id = k.eos, .pad_id = k.pad,
        .add_dummy_prefix = k.add_space_prefix, .remove_extra_whitespaces = k.remove_extra_ws,
        .source = m->dir,
    };
    rc = dol_tokenizer_from_spec(&spec, out, err, errlen);
done:
    free(piece);
    free(len);
    free(score);
    free(type);
    if (rc != 0 && err)
        for (char *q = err; *q; q++)
            if ((unsigned char)*q < 0x20 || *q == 0x7f) *q = '?';
    return rc;
}
