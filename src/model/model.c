/* src/model/model.c — loads a Hugging Face Llama checkpoint directory:
 * config.json (hyper-parameters, refusing what we do not implement) and the
 * weights from model.safetensors or the shards named by
 * model.safetensors.index.json, bound by their Hugging Face names and checked
 * against the config. Weights stay in the read-only mappings; only tensors
 * whose data is misaligned are copied. A regular file instead of a directory
 * goes to the GGUF loader (gguf_llama.c); the page hints, the source digest
 * and dol_model_free serve both. */
#include "dolphin/model.h"
#include "model_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nettle/sha2.h>

#define CONFIG_NAME "config.json"
#define WEIGHTS_NAME "model.safetensors"
#define INDEX_NAME "model.safetensors.index.json"
#define MAX_JSON_FILE (64u << 20)  /* config.json / index: far above any real one */
#define MAX_LAYERS 65536

const char *dol_model_format_name(dol_model_format f)
{
    return f == DOL_MODEL_GGUF ? "gguf" : "safetensors";
}

void *dol_model_own(model_priv *p, size_t n)
{
    if (p->n_owned == p->cap_owned) {
        int cap = p->cap_owned ? 2 * p->cap_owned : 16;
        void **o = realloc(p->owned, (size_t)cap * sizeof *o);
        if (!o) return NULL;
        p->owned = o;
        p->cap_owned = cap;
    }
    void *buf = NULL;
    if (posix_memalign(&buf, 64, n ? n : 1) != 0) return NULL;
    p->owned[p->n_owned++] = buf;
    return buf;
}

typedef struct {
    const char *name;
    int count;
} type_count;

static int type_count_cmp(const void *a, const void *b)
{
    const type_count *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return strcmp(x->name, y->name);
}

void dol_model_type_mix(const char *const *names, const int *counts, int n, char *buf, size_t len)
{
    type_count tc[64];
    int k = 0;
    for (int i = 0; i < n && k < 64; i++)
        if (counts[i] > 0) tc[k++] = (type_count){names[i], counts[i]};
    qsort(tc, (size_t)k, sizeof tc[0], type_count_cmp);
    size_t used = 0;
    if (len) buf[0] = '\0';
    for (int i = 0; i < k && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s %d", i ? ", " : "", tc[i].name,
                                 tc[i].count);
}

/* ----------------------------------------------------------------------------
 * small helpers */

/* Read a whole (small) file into a NUL-terminated buffer. */
static char *read_text_file(const char *path, const char *fname, size_t *len,
                            char *err, size_t errlen)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        dol_set_err(err, errlen, "%s: cannot open: %s", fname, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
        dol_set_err(err, errlen, "%s: not a regular file", fname);
        fclose(fp);
        return NULL;
    }
    if ((uint64_t)st.st_size > MAX_JSON_FILE) {
        dol_set_err(err, errlen, "%s: file too large (%lld bytes)", fname,
                    (long long)st.st_size);
        fclose(fp);
        return NULL;
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        dol_set_err(err, errlen, "%s: out of memory", fname);
        fclose(fp);
        return NULL;
    }
    size_t got = fread(buf, 1, n, fp);
    if (got != n || ferror(fp)) {
        dol_set_err(err, errlen, "%s: read error", fname);
        free(buf);
        fclose(fp);
        return NULL;
    }
    fclose(fp);
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Read and parse a JSON file that must hold an object. */
static cJSON *read_json_object(const char *path, const char *fname, char *err, size_t errlen)
{
    size_t len = 0;
    char *text = read_text_file(path, fname, &len, err, errlen);
    if (!text) return NULL;
    cJSON *root = cJSON_ParseWithLength(text, len + 1);   /* include the NUL */
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t pos = (at && at >= text && at <= text + len) ? (size_t)(at - text) : 0;
        dol_set_err(err, errlen, "%s: not valid JSON (near byte %zu)", fname, pos);
        free(text);
        return NULL;
    }
    free(text);
    if (!cJSON_IsObject(root)) {
        dol_set_err(err, errlen, "%s: not a JSON object", fname);
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* Messages must stay one line even when they quote names or values taken
 * from the files: control characters become '?'. */
static void one_line(char *err, size_t errlen)
{
    if (!err) return;
    for (size_t i = 0; i < errlen && err[i]; i++)
        if ((unsigned char)err[i] < 0x20 || err[i] == 0x7f) err[i] = '?';
}

/* Messages start with a file name relative to the model directory; the
 * reader wants the path as given ("/models/x/config.json"), so prefix it. */
static void name_in_dir(const char *dir, char *err, size_t errlen)
{
    if (!err || errlen == 0) return;
    char msg[DOL_ERR_LEN];
    snprintf(msg, sizeof msg, "%s", err);
    size_t n = strlen(dir);
    dol_set_err(err, errlen, "%s%s%s", dir, n > 0 && dir[n - 1] == '/' ? "" : "/", msg);
}

/* A short description of a JSON value for messages: 12, "gelu", true, ... */
static void describe(const cJSON *j, char *buf, size_t len)
{
    if (cJSON_IsNumber(j)) snprintf(buf, len, "%.17g", j->valuedouble);
    else if (cJSON_IsString(j)) snprintf(buf, len, "\"%.60s\"", j->valuestring);
    else if (cJSON_IsTrue(j)) snprintf(buf, len, "true");
    else if (cJSON_IsFalse(j)) snprintf(buf, len, "false");
    else if (cJSON_IsNull(j)) snprintf(buf, len, "null");
    else if (cJSON_IsArray(j)) snprintf(buf, len, "an array");
    else if (cJSON_IsObject(j)) snprintf(buf, len, "an object");
    else snprintf(buf, len, "?");
}

static bool absent(const cJSON *j) { return j == NULL || cJSON_IsNull(j); }

/* strcpy that truncates to fit dst. */
static void copy_str(char *dst, size_t len, const char *src)
{
    size_t n = strlen(src);
    if (n >= len) n = len - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ----------------------------------------------------------------------------
 * config.json */

/* An integer value in [lo, INT_MAX] for field `key`. Absent or null: `def`
 * unless required. */
static int cfg_int_value(const cJSON *j, const char *key, bool required, int lo, int def,
                         int *out, char *err, size_t errlen)
{
    if (absent(j)) {
        if (required) {
            dol_set_err(err, errlen, CONFIG_NAME ": field %s: missing", key);
            return -1;
        }
        *out = def;
        return 0;
    }
    if (cJSON_IsNumber(j) && j->valuedouble >= lo && j->valuedouble <= INT_MAX &&
        (double)(int)j->valuedouble == j->valuedouble) {
        *out = (int)j->valuedouble;
        return 0;
    }
    char got[96];
    describe(j, got, sizeof got);
    dol_set_err(err, errlen, CONFIG_NAME ": field %s: must be %s integer%s (got %s)", key,
                lo > 0 ? "a positive" : "a non-negative",
                cJSON_IsNumber(j) && j->valuedouble > INT_MAX ? " up to 2147483647" : "", got);
    return -1;
}

static int cfg_int(const cJSON *root, const char *key, bool required, int lo, int def,
                   int *out, char *err, size_t errlen)
{
    return cfg_int_value(cJSON_GetObjectItemCaseSensitive(root, key), key, required, lo, def,
                         out, err, errlen);
}

/* A positive finite number. Absent or null: `def`. */
static int cfg_pos_float(const cJSON *root, const char *key, float def, float *out,
                         char *err, size_t errlen)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (absent(j)) {
        *out = def;
        return 0;
    }
    if (cJSON_IsNumber(j) && isfinite(j->valuedouble) && j->valuedouble > 0 &&
        j->valuedouble <= 3.0e38) {
        *out = (float)j->valuedouble;
        if (*out > 0) return 0;   /* not lost to F32 underflow */
    }
    char got[96];
    describe(j, got, sizeof got);
    dol_set_err(err, errlen, CONFIG_NAME ": field %s: must be a positive number%s (got %s)",
                key, cJSON_IsNumber(j) && j->valuedouble > 0 ? " within float range (1e-38 to 3e38)" : "",
                got);
    return -1;
}

/* A boolean that must be absent/null/false (features we do not implement). */
static int cfg_must_be_false(const cJSON *root, const char *key, char *err, size_t errlen)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (absent(j) || cJSON_IsFalse(j)) return 0;
    char got[96];
    describe(j, got, sizeof got);
    dol_set_err(err, errlen, CONFIG_NAME ": field %s: unsupported value %s (only false)",
                key, got);
    return -1;
}

/* A token id, or a non-empty list of at most `max` of them (newer
 * configs list several end-of-sequence ids): out[0..*n). Absent: def. */
static int cfg_token_ids(const cJSON *root, const char *key, int def, int *out, int max,
                         int *n, char *err, size_t errlen)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    *n = 1;
    if (!cJSON_IsArray(j)) return cfg_int_value(j, key, false, 0, def, out, err, errlen);
    int len = cJSON_GetArraySize(j);
    if (len < 1 || len > max) {
        dol_set_err(err, errlen, CONFIG_NAME ": field %s: must be a token id or a list of 1 "
                    "to %d of them (got a list of %d)", key, max, len);
        return -1;
    }
    for (int i = 0; i < len; i++)
        if (cfg_int_value(cJSON_GetArrayItem(j, i), key, true, 0, def, &out[i], err, errlen))
            return -1;
    *n = len;
    return 0;
}

static int config_from_json(const cJSON *root, dol_model_config *c, char *err, size_t errlen)
{
    char got[96];

    /* what we implement: LlamaForCausalLM, SiLU, plain RoPE, no biases */
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (!absent(arch)) {
        bool ok = false;
        const cJSON *a;
        if (cJSON_IsArray(arch))
            cJSON_ArrayForEach(a, arch)
                if (cJSON_IsString(a) && strcmp(a->valuestring, "LlamaForCausalLM") == 0)
                    ok = true;
        if (!ok) {
            const cJSON *first = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : arch;
            if (first) describe(first, got, sizeof got);
            else snprintf(got, sizeof got, "[]");
            dol_set_err(err, errlen, CONFIG_NAME ": field architectures: unsupported value "
                        "%s (only LlamaForCausalLM)", got);
            return -1;
        }
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!absent(type) && !(cJSON_IsString(type) && strcmp(type->valuestring, "llama") == 0)) {
        describe(type, got, sizeof got);
        dol_set_err(err, errlen, CONFIG_NAME ": field model_type: unsupported value %s "
                    "(only llama)", got);
        return -1;
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (!absent(act) && !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0)) {
        describe(act, got, sizeof got);
        dol_set_err(err, errlen, CONFIG_NAME ": field hidden_act: unsupported value %s "
                    "(only silu)", got);
        return -1;
    }
    /* a checkpoint quantized elsewhere (bitsandbytes, GPTQ, AWQ ...) holds
     * packed integers under the usual names: never read them as weights */
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (!absent(qc)) {
        const cJSON *qm = cJSON_IsObject(qc) ? cJSON_GetObjectItemCaseSensitive(qc, "quant_method") : NULL;
        if (qm) describe(qm, got, sizeof got);
        else snprintf(got, sizeof got, "unknown");
        dol_set_err(err, errlen, CONFIG_NAME ": field quantization_config: the checkpoint is already "
                    "quantized (quant_method %s); use its F16/BF16/F32 original (weights: nf4 or int8 "
                    "quantize at load)", got);
        return -1;
    }
    if (!absent(cJSON_GetObjectItemCaseSensitive(root, "rope_scaling"))) {
        dol_set_err(err, errlen, CONFIG_NAME ": field rope_scaling: unsupported value "
                    "(only null)");
        return -1;
    }
    if (cfg_must_be_false(root, "attention_bias", err, errlen) != 0) return -1;
    if (cfg_must_be_false(root, "mlp_bias", err, errlen) != 0) return -1;

    /* sizes */
    if (cfg_int(root, "hidden_size", true, 1, 0, &c->hidden_size, err, errlen) ||
        cfg_int(root, "intermediate_size", true, 1, 0, &c->intermediate_size, err, errlen) ||
        cfg_int(root, "num_hidden_layers", true, 1, 0, &c->n_layers, err, errlen) ||
        cfg_int(root, "num_attention_heads", true, 1, 0, &c->n_heads, err, errlen) ||
        cfg_int(root, "vocab_size", true, 1, 0, &c->vocab_size, err, errlen) ||
        cfg_int(root, "num_key_value_heads", false, 1, c->n_heads, &c->n_kv_heads, err, errlen) ||
        cfg_int(root, "max_position_embeddings", false, 1, 2048,
                &c->max_position_embeddings, err, errlen))
        return -1;
    if (c->n_layers > MAX_LAYERS) {
        dol_set_err(err, errlen, CONFIG_NAME ": field num_hidden_layers: %d is implausibly "
                    "large (limit %d)", c->n_layers, MAX_LAYERS);
        return -1;
    }
    if (c->hidden_size % c->n_heads != 0) {
        dol_set_err(err, errlen, CONFIG_NAME ": field hidden_size: %d is not divisible by "
                    "num_attention_heads %d", c->hidden_size, c->n_heads);
        return -1;
    }
    if (c->n_heads % c->n_kv_heads != 0) {
        dol_set_err(err, errlen, CONFIG_NAME ": field num_key_value_heads: %d does not "
                    "divide num_attention_heads %d", c->n_kv_heads, c->n_heads);
        return -1;
    }
    c->head_dim = c->hidden_size / c->n_heads;
    c->rope_scale = 1.0f;
    if (c->head_dim % 2 != 0) {
        dol_set_err(err, errlen, CONFIG_NAME ": field hidden_size: head dimension %d "
                    "(hidden_size / num_attention_heads) must be even for RoPE", c->head_dim);
        return -1;
    }
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    if (!absent(hd) && !(cJSON_IsNumber(hd) && hd->valuedouble == c->head_dim)) {
        describe(hd, got, sizeof got);
        dol_set_err(err, errlen, CONFIG_NAME ": field head_dim: unsupported value %s (only "
                    "hidden_size / num_attention_heads = %d)", got, c->head_dim);
        return -1;
    }

    /* the rest */
    if (cfg_pos_float(root, "rms_norm_eps", 1e-6f, &c->rms_norm_eps, err, errlen) ||
        cfg_pos_float(root, "rope_theta", 10000.0f, &c->rope_theta, err, errlen))
        return -1;
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    if (absent(tie)) {
        c->tie_word_embeddings = false;
    } else if (cJSON_IsBool(tie)) {
        c->tie_word_embeddings = cJSON_IsTrue(tie);
    } else {
        describe(tie, got, sizeof got);
        dol_set_err(err, errlen, CONFIG_NAME ": field tie_word_embeddings: must be true or "
                    "false (got %s)", got);
        return -1;
    }
    int bos[DOL_MAX_EOS_IDS], n_bos;   /* a list's first is the one used */
    if (cfg_token_ids(root, "bos_token_id", 1, bos, DOL_MAX_EOS_IDS, &n_bos, err, errlen) ||
        cfg_token_ids(root, "eos_token_id", 2, c->eos_token_ids, DOL_MAX_EOS_IDS,
                      &c->n_eos_token_ids, err, errlen))
        return -1;
    c->bos_token_id = bos[0];
    c->eos_token_id = c->eos_token_ids[0];
    if (c->bos_token_id >= c->vocab_size) {
        dol_set_err(err, errlen, CONFIG_NAME ": field bos_token_id: %d is not below "
                    "vocab_size %d", c->bos_token_id, c->vocab_size);
        return -1;
    }
    for (int i = 0; i < c->n_eos_token_ids; i++)
        if (c->eos_token_ids[i] >= c->vocab_size) {
            dol_set_err(err, errlen, CONFIG_NAME ": field eos_token_id: %d is not below "
                        "vocab_size %d", c->eos_token_ids[i], c->vocab_size);
            return -1;
        }
    return 0;
}

int dol_model_config_load(const char *dir, dol_model_config *cfg, char *err, size_t errlen)
{
    char path[2048];
    if (snprintf(path, sizeof path, "%s/" CONFIG_NAME, dir) >= (int)sizeof path) {
        dol_set_err(err, errlen, CONFIG_NAME ": path too long");
        return -1;
    }
    cJSON *root = read_json_object(path, CONFIG_NAME, err, errlen);
    int rc = -1;
    dol_model_config c;
    memset(&c, 0, sizeof c);
    if (root) rc = config_from_json(root, &c, err, errlen);
    cJSON_Delete(root);
    if (rc == 0) {
        *cfg = c;
    } else {
        name_in_dir(dir, err, errlen);
        one_line(err, errlen);
    }
    return rc;
}

/* ----------------------------------------------------------------------------
 * weights */

/* Where each tensor lives while loading. */
typedef struct {
    dol_model *m;
    model_priv *p;
    cJSON *weight_map;        /* index mode: the index's "weight_map", else NULL */
    cJSON *index;             /* index mode: the whole parsed index */
    int n_of_dtype[3];        /* tensors bound per dol_dtype (the type mix) */
} loader;

/* A shard name from the index must be a plain file name in the directory. */
static bool shard_name_ok(const char *s)
{
    return s[0] != '\0' && strchr(s, '/') == NULL && strstr(s, "..") == NULL;
}

static int open_file(loader *L, const char *fname, char *err, size_t errlen)
{
    char path[2048];
    if (snprintf(path, sizeof path, "%s/%s", L->m->dir, fname) >= (int)sizeof path) {
        dol_set_err(err, errlen, "%s: path too long", fname);
        return -1;
    }
    if (dol_st_open(&L->p->files[L->p->n_files], path, err, errlen) != 0) return -1;
    L->p->n_files++;
    return 0;
}

/* Index mode: parse the index, check its shard names, open each shard once
 * (L->p->files in order of first appearance). */
static int open_index(loader *L, const char *path, char *err, size_t errlen)
{
    L->index = read_json_object(path, INDEX_NAME, err, errlen);
    if (!L->index) return -1;
    L->weight_map = cJSON_GetObjectItemCaseSensitive(L->index, "weight_map");
    if (!cJSON_IsObject(L->weight_map)) {
        dol_set_err(err, errlen, INDEX_NAME ": field weight_map: missing or not an object");
        return -1;
    }
    int n = cJSON_GetArraySize(L->weight_map);
    L->p->files = calloc(n ? (size_t)n : 1, sizeof *L->p->files);
    if (!L->p->files) {
        dol_set_err(err, errlen, INDEX_NAME ": out of memory");
        return -1;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, L->weight_map) {
        if (!cJSON_IsString(e) || !shard_name_ok(e->valuestring)) {
            char got[96];
            describe(e, got, sizeof got);
            dol_set_err(err, errlen, INDEX_NAME ": tensor %s: shard %s is not a plain file "
                        "name in the model directory", e->string, got);
            return -1;
        }
        bool seen = false;
        for (int i = 0; i < L->p->n_files && !seen; i++)
            seen = strcmp(L->p->files[i].fname, e->valuestring) == 0;
        if (!seen && open_file(L, e->valuestring, err, errlen) != 0) return -1;
    }
    return 0;
}

/* Find the header entry for `name`: the file it is in, or an error naming
 * the file (or the index) that should have held it. */
static const dol_st_tensor *find_tensor(loader *L, const char *name, const dol_st_file **file,
                                        const char *why, char *err, size_t errlen)
{
    const dol_st_file *f = &L->p->files[0];
    if (L->weight_map) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(L->weight_map, name);
        if (!s) {
            dol_set_err(err, errlen, INDEX_NAME ": missing tensor %s%s", name, why);
            return NULL;
        }
        for (int i = 0; i < L->p->n_files; i++)
            if (strcmp(L->p->files[i].fname, s->valuestring) == 0) f = &L->p->files[i];
    }
    const dol_st_tensor *t = dol_st_find(f, name);
    if (!t) {
        dol_set_err(err, errlen, "%s: missing tensor %s%s", f->fname, name, why);
        return NULL;
    }
    *file = f;
    return t;
}

/* Bind tensor `name` into dst, checking dtype and shape [rows, cols]
 * (rows == 0: a 1-D tensor of `cols` elements). */
static int bind(loader *L, const char *name, int64_t rows, int64_t cols, dol_tensor *dst,
                char *err, size_t errlen)
{
    const dol_st_file *f = NULL;
    const dol_st_tensor *t = find_tensor(L, name, &f, "", err, errlen);
    if (!t) return -1;

    if (!t->supported) {
        dol_set_err(err, errlen, "%s: tensor %s: unsupported dtype %s (only F32, F16, BF16)",
                    f->fname, name, t->dtype);
        return -1;
    }
    int64_t want[2] = {rows, cols};
    int want_ndim = rows ? 2 : 1;
    const int64_t *w = rows ? want : want + 1;
    bool same = t->ndim == want_ndim;
    for (int i = 0; same && i < want_ndim; i++) same = t->shape[i] == w[i];
    if (!same) {
        char have[160], need[64];
        dol_st_shape_str(t->shape, t->ndim, have, sizeof have);
        dol_st_shape_str(w, want_ndim, need, sizeof need);
        dol_set_err(err, errlen, "%s: tensor %s: shape %s but config says %s",
                    f->fname, name, have, need);
        return -1;
    }

    size_t esize = dol_dtype_size(t->type);
    size_t nbytes = (size_t)(t->end - t->begin);
    const uint8_t *src = f->data + t->begin;
    const void *data = src;
    if ((uintptr_t)src % esize != 0) {
        /* misaligned inside the mapping: keep an aligned copy */
        void *copy = dol_model_own(L->p, nbytes);
        if (!copy) {
            dol_set_err(err, errlen, "%s: tensor %s: out of memory for an aligned copy",
                        f->fname, name);
            return -1;
        }
        memcpy(copy, src, nbytes);
        data = copy;
    }
    L->n_of_dtype[t->type]++;
    dst->dtype = t->type;
    dst->rows = rows ? rows : 1;
    dst->cols = cols;
    dst->data = data;
    L->m->weight_bytes += nbytes;
    return 0;
}

static int bind_all(loader *L, char *err, size_t errlen)
{
    dol_model *m = L->m;
    const dol_model_config *c = &m->cfg;
    int64_t d = c->hidden_size, f = c->intermediate_size, h = c->head_dim;
    int64_t q = (int64_t)c->n_heads * h, kv = (int64_t)c->n_kv_heads * h;
    char name[128];

    if (bind(L, "model.embed_tokens.weight", c->vocab_size, d, &m->embed, err, errlen))
        return -1;
    for (int i = 0; i < c->n_layers; i++) {
        dol_layer_weights *l = &m->layers[i];
        const struct { const char *suffix; int64_t rows, cols; dol_tensor *dst; } w[] = {
            {"input_layernorm.weight", 0, d, &l->attn_norm},
            {"self_attn.q_proj.weight", q, d, &l->q},
            {"self_attn.k_proj.weight", kv, d, &l->k},
            {"self_attn.v_proj.weight", kv, d, &l->v},
            {"self_attn.o_proj.weight", d, q, &l->o},
            {"post_attention_layernorm.weight", 0, d, &l->ffn_norm},
            {"mlp.gate_proj.weight", f, d, &l->gate},
            {"mlp.up_proj.weight", f, d, &l->up},
            {"mlp.down_proj.weight", d, f, &l->down},
        };
        for (size_t j = 0; j < sizeof w / sizeof w[0]; j++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", i, w[j].suffix);
            if (bind(L, name, w[j].rows, w[j].cols, w[j].dst, err, errlen)) return -1;
        }
    }
    if (bind(L, "model.norm.weight", 0, d, &m->final_norm, err, errlen)) return -1;

    /* Tied: the output projection is the embedding, as in Hugging Face, even
     * if the checkpoint also stores an lm_head.weight. */
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
        return 0;
    }
    return bind(L, "lm_head.weight", c->vocab_size, d, &m->lm_head, err, errlen);
}

/* Layer N of a tensor named "model.layers.N.…", or -1 for any other name. */
static long layer_of(const char *name)
{
    static const char pre[] = "model.layers.";
    if (strncmp(name, pre, sizeof pre - 1) != 0) return -1;
    const char *p = name + sizeof pre - 1;
    long n = 0;
    if (*p < '0' || *p > '9') return -1;
    for (; *p >= '0' && *p <= '9'; p++)
        if (n <= INT_MAX) n = n * 10 + (*p - '0');   /* saturates: only "too many" matters */
    return *p == '.' ? n : -1;
}

/* What a tensor of a checkpoint quantized by another tool looks like, by the
 * end of its name: bitsandbytes' 4/8-bit state next to each weight, GPTQ's
 * and AWQ's packed integers with their zero points and scales. NULL for a
 * plain name. */
static const char *prequantized_kind(const char *name)
{
    static const struct { const char *suffix, *kind; } K[] = {
        { ".absmax", "bitsandbytes quantization state (absmax)" },
        { ".quant_map", "bitsandbytes quantization state (quant_map)" },
        { ".nested_absmax", "bitsandbytes quantization state (nested_absmax)" },
        { ".nested_quant_map", "bitsandbytes quantization state (nested_quant_map)" },
        { ".SCB", "bitsandbytes int8 scales (SCB)" },
        { ".qweight", "GPTQ/AWQ packed weights (qweight)" },
        { ".qzeros", "GPTQ/AWQ packed zero points (qzeros)" },
        { ".scales", "GPTQ/AWQ scales" },
        { ".g_idx", "GPTQ group index (g_idx)" },
    };
    if (strstr(name, ".quant_state.")) return "bitsandbytes quantization state (quant_state)";
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof K / sizeof K[0]; i++) {
        size_t k = strlen(K[i].suffix);
        if (n > k && strcmp(name + n - k, K[i].suffix) == 0) return K[i].kind;
    }
    return NULL;
}

/* Refuse a checkpoint that another tool already quantized, naming the file
 * and the first such tensor, before anything is read as weights. */
static int check_not_prequantized(const loader *L, char *err, size_t errlen)
{
    for (int i = 0; i < L->p->n_files; i++) {
        const dol_st_file *f = &L->p->files[i];
        for (size_t j = 0; j < f->n_tensors; j++) {
            const char *kind = prequantized_kind(f->tensors[j].name);
            if (!kind) continue;
            dol_set_err(err, errlen, "%s: tensor %s: looks like %s, a checkpoint already "
                        "quantized; use its F16/BF16/F32 original (weights: nf4 or int8 "
                        "quantize at load)", f->fname, f->tensors[j].name, kind);
            return -1;
        }
    }
    return 0;
}

/* Layers stored beyond num_hidden_layers would be silently left out: the
 * config describes a different model than the weights. */
static int check_layer_count(const loader *L, char *err, size_t errlen)
{
    int n_layers = L->m->cfg.n_layers;
    long top = -1;
    const char *top_name = NULL, *top_file = NULL;
    for (int i = 0; i < L->p->n_files; i++) {
        const dol_st_file *f = &L->p->files[i];
        for (size_t j = 0; j < f->n_tensors; j++) {
            long k = layer_of(f->tensors[j].name);
            if (k > top) {
                top = k;
                top_name = f->tensors[j].name;
                top_file = f->fname;
            }
        }
    }
    if (top < n_layers) return 0;
    dol_set_err(err, errlen, CONFIG_NAME ": field num_hidden_layers: %d (layers 0..%d), but %s "
                "holds tensor %s", n_layers, n_layers - 1, top_file, top_name);
    return -1;
}

/* The model id: basename of dir without trailing slashes ("." resolved). */
static void set_name(dol_model *m)
{
    char buf[sizeof m->dir];
    copy_str(buf, sizeof buf, m->dir);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    const char *slash = strrchr(buf, '/');
    const char *base = slash ? slash + 1 : buf;
    if (!base[0] || strcmp(base, ".") == 0 || strcmp(base, "..") == 0) {
        char *real = realpath(m->dir, NULL);
        if (real) {
            const char *s = strrchr(real, '/');
            copy_str(m->name, sizeof m->name, s && s[1] ? s + 1 : "model");
            free(real);
            return;
        }
        base = "model";
    }
    copy_str(m->name, sizeof m->name, base);
}

bool dol_model_path_is_gguf(const char *path)
{
    struct stat st;
    size_t n = strlen(path);
    if (n >= 5 && strcasecmp(path + n - 5, ".gguf") == 0) return true;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* An empty model with its private part; NULL (err names path) when out of
 * memory. */
static dol_model *model_new(const char *path, char *err, size_t errlen)
{
    dol_model *m = calloc(1, sizeof *m);
    model_priv *p = calloc(1, sizeof *p);
    if (!m || !p) {
        free(m);
        free(p);
        dol_set_err(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    m->priv = p;
    return m;
}

int dol_model_load_gguf(const char *path, dol_model **out, char *err, size_t errlen)
{
    dol_model *m = model_new(path, err, errlen);
    if (!m) return -1;
    m->format = DOL_MODEL_GGUF;
    if (dol_model_gguf_fill(m, path, err, errlen) != 0) {
        one_line(err, errlen);
        dol_model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

int dol_model_load(const char *dir, dol_model **out, char *err, size_t errlen)
{
    if (dol_model_path_is_gguf(dir))
        return dol_model_load_gguf(dir, out, err, errlen);
    dol_model *m = model_new(dir, err, errlen);
    if (!m) return -1;
    model_priv *p = m->priv;
    loader L = {.m = m, .p = p};
    int rc = -1;
    bool named = false;   /* err already starts with the directory */

    if (strlen(dir) >= sizeof m->dir) {
        dol_set_err(err, errlen, "model directory path too long (%zu bytes, limit %zu)",
                    strlen(dir), sizeof m->dir - 1);
        named = true;
        goto done;
    }
    strcpy(m->dir, dir);
    set_name(m);
    if (dol_model_config_load(dir, &m->cfg, err, errlen) != 0) {
        named = true;
        goto done;
    }

    char path[2048];
    struct stat st;
    snprintf(path, sizeof path, "%s/" WEIGHTS_NAME, dir);
    if (stat(path, &st) == 0 || errno != ENOENT) {
        p->files = calloc(1, sizeof *p->files);
        if (!p->files) {
            dol_set_err(err, errlen, WEIGHTS_NAME ": out of memory");
            goto done;
        }
        if (open_file(&L, WEIGHTS_NAME, err, errlen) != 0) goto done;
    } else {
        snprintf(path, sizeof path, "%s/" INDEX_NAME, dir);
        if (stat(path, &st) != 0 && errno == ENOENT) {
            dol_set_err(err, errlen, WEIGHTS_NAME ": cannot open: No such file or directory "
                        "(nor " INDEX_NAME ")");
            goto done;
        }
        if (open_index(&L, path, err, errlen) != 0) goto done;
    }

    m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    if (!m->layers) {
        dol_set_err(err, errlen, CONFIG_NAME ": out of memory for %d layers", m->cfg.n_layers);
        goto done;
    }
    if (check_not_prequantized(&L, err, errlen) != 0) goto done;
    if (check_layer_count(&L, err, errlen) != 0) goto done;
    if (bind_all(&L, err, errlen) != 0) goto done;
    {
        const char *names[3] = {"F32", "F16", "BF16"};
        dol_model_type_mix(names, L.n_of_dtype, 3, m->type_mix, sizeof m->type_mix);
    }
    rc = 0;

done:
    cJSON_Delete(L.index);
    if (rc != 0) {
        if (!named) name_in_dir(dir, err, errlen);
        one_line(err, errlen);
        dol_model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void dol_model_free(dol_model *m)
{
    if (!m) return;
    model_priv *p = m->priv;
    if (p) {
        for (int i = 0; i < p->n_files; i++) dol_st_close(&p->files[i]);
        free(p->files);
        for (int i = 0; i < p->n_owned; i++) free(p->owned[i]);
        free(p->owned);
        dol_gguf_close(p->gguf);
        free(p);
    }
    free(m->layers);
    free(m);
}

size_t dol_model_drop_copies(dol_model *m)
{
    model_priv *p = m ? m->priv : NULL;
    if (!p || p->n_owned == 0) return 0;
    size_t freed = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        dol_layer_weights *w = &m->layers[l];
        dol_tensor *t[7] = {&w->q, &w->k, &w->v, &w->o, &w->gate, &w->up, &w->down};
        for (int i = 0; i < 7; i++)
            for (int k = 0; k < p->n_owned; k++) {
                /* block-quantized layers are read where they are */
                if (p->owned[k] != t[i]->data || dol_dtype_is_block(t[i]->dtype)) continue;
                freed += dol_tensor_bytes(t[i]);
                free(p->owned[k]);
                p->owned[k] = p->owned[--p->n_owned];
                t[i]->data = NULL;
                break;
            }
    }
    return freed;
}

/* ----------------------------------------------------------------------------
 * page hints */

/* The page-aligned range [*a, *b) of the mapping that holds t's bytes, or
 * false when t is not inside any mapping (an aligned copy). */
static bool tensor_pages(const dol_model *m, const dol_tensor *t, uintptr_t *a, uintptr_t *b)
{
    const model_priv *p = m ? m->priv : NULL;
    if (!p || !t || !t->data) return false;
    uintptr_t lo = (uintptr_t)t->data;
    uintptr_t hi = lo + (uintptr_t)dol_tensor_bytes(t);
    int n_maps = p->gguf ? 1 : p->n_files;
    for (int i = 0; i < n_maps; i++) {
        uintptr_t m0, m1;
        if (p->gguf) {
            if (!dol_gguf_mapped(p->gguf)) return false;
            m0 = (uintptr_t)dol_gguf_base(p->gguf);
            m1 = m0 + (uintptr_t)dol_gguf_file_size(p->gguf);
        } else {
            m0 = (uintptr_t)p->files[i].map;
            m1 = m0 + p->files[i].map_len;
        }
        if (lo < m0 || hi > m1) continue;
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
        *a = lo & ~(page - 1);
        *b = (hi + page - 1) & ~(page - 1);
        if (*b > ((m1 + page - 1) & ~(page - 1))) *b = (m1 + page - 1) & ~(page - 1);
        return *b > *a;
    }
    return false;
}

void dol_model_prefetch(const dol_model *m, const dol_tensor *t)
{
    uintptr_t a, b;
    if (tensor_pages(m, t, &a, &b)) (void)madvise((void *)a, b - a, MADV_WILLNEED);
}

size_t dol_model_release(const dol_model *m, const dol_tensor *t)
{
    uintptr_t a, b;
    if (!tensor_pages(m, t, &a, &b)) return 0;
    /* read-only private file mapping never written: the pages are the page
     * cache's, so dropping them loses nothing */
    return madvise((void *)a, b - a, MADV_DONTNEED) == 0 ? (size_t)(b - a) : 0;
}

/* ----------------------------------------------------------------------------
 * source digest */

static void digest_bytes(struct sha256_ctx *ctx, const void *data, size_t len)
{
    sha256_update(ctx, len, data);
}

static void digest_u64(struct sha256_ctx *ctx, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i)); /* little-endian, any host */
    digest_bytes(ctx, b, sizeof b);
}

/* A small text file's length and bytes into ctx; absent (ENOENT) is
 * hashed as length UINT64_MAX when `optional`. */
static int digest_file(struct sha256_ctx *ctx, const char *dir, const char *fname, bool optional,
                       char *err, size_t errlen)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    struct stat st;
    if (optional && stat(path, &st) != 0 && errno == ENOENT) {
        digest_u64(ctx, UINT64_MAX);
        return 0;
    }
    size_t len = 0;
    char *buf = read_text_file(path, fname, &len, err, errlen);
    if (!buf) return -1;
    digest_u64(ctx, len);
    digest_bytes(ctx, buf, len);
    free(buf);
    return 0;
}

int dol_model_source_digest(const dol_model *m, uint8_t out[32], char *err, size_t errlen)
{
    const model_priv *p = m->priv;
    struct sha256_ctx sha, *ctx = &sha;
    sha256_init(ctx);
    if (p->gguf) {
        /* the file's name, size, mtime and everything before its data */
        const char *path = dol_gguf_path(p->gguf);
        const char *slash = strrchr(path, '/');
        const char *base = slash ? slash + 1 : path;
        struct stat st;
        if (stat(path, &st) != 0) {
            dol_set_err(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
            return -1;
        }
        digest_bytes(ctx, "gguf", 4);
        digest_u64(ctx, strlen(base));
        digest_bytes(ctx, base, strlen(base));
        digest_u64(ctx, (uint64_t)st.st_size);
        digest_u64(ctx, (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec);
        digest_u64(ctx, dol_gguf_data_offset(p->gguf));
        digest_bytes(ctx, dol_gguf_base(p->gguf), (size_t)dol_gguf_data_offset(p->gguf));
        sha256_digest(ctx, SHA256_DIGEST_SIZE, out);
        return 0;
    }
    if (digest_file(ctx, m->dir, CONFIG_NAME, false, err, errlen) != 0) goto named;
    if (digest_file(ctx, m->dir, INDEX_NAME, true, err, errlen) != 0) goto named;
    digest_u64(ctx, (uint64_t)p->n_files);
    for (int i = 0; i < p->n_files; i++) {
        const dol_st_file *f = &p->files[i];
        struct stat st;
        if (stat(f->path, &st) != 0) {
            dol_set_err(err, errlen, "%s: cannot stat: %s", f->fname, strerror(errno));
            goto named;
        }
        digest_u64(ctx, strlen(f->fname));
        digest_bytes(ctx, f->fname, strlen(f->fname));
        digest_u64(ctx, (uint64_t)st.st_size);
        digest_u64(ctx, (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec);
        /* the JSON header: the bytes between the 8-byte length and the data */
        const uint8_t *h = (const uint8_t *)f->map + 8;
        digest_u64(ctx, (uint64_t)(f->data - h));
        digest_bytes(ctx, h, (size_t)(f->data - h));
    }
    sha256_digest(ctx, SHA256_DIGEST_SIZE, out);
    return 0;
named:
    name_in_dir(m->dir, err, errlen);
    one_line(err, errlen);
    return -1;
}
