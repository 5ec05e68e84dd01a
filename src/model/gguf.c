/* src/model/gguf.c — the GGUF reader of include/dolphin/gguf.h: maps a file
 * read-only, walks its header, metadata and tensor table with a cursor that
 * never moves past the end of the bytes, and keeps what it found (the
 * key/value pairs, a table of the strings of each string array, the tensor
 * table, name indexes). Knows the format only, nothing of Llama. */
#include "dolphin/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_ALIGNMENT (1u << 30)
#define GGUF_MAX_KEY 65535u          /* the format's limit on key length */
#define GGUF_MAX_NAME 255u           /* tensor names: ggml's own limit is 63 */
#define GGUF_MAX_NESTING 3           /* arrays of arrays of ... */

struct dol_gguf {
    char *path;
    const uint8_t *base;
    size_t size;
    bool mapped;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    dol_gguf_kv *kv;
    size_t n_kv;
    size_t *kv_sorted;               /* indexes into kv, by key */
    dol_gguf_str **str_tables;       /* the arr_str tables, to free */
    size_t n_str_tables;
    dol_gguf_tensor *t;
    size_t n_t;
    size_t *t_sorted;                /* indexes into t, by name */
};

/* ---- the type tables ---------------------------------------------------- */

/* ggml's type ids with their block layouts (facts of the format). */
static const struct {
    uint32_t id;
    dol_ggml_type_info info;
} TYPES[] = {
    {0, {"F32", 1, 4}},        {1, {"F16", 1, 2}},        {2, {"Q4_0", 32, 18}},
    {3, {"Q4_1", 32, 20}},     {6, {"Q5_0", 32, 22}},     {7, {"Q5_1", 32, 24}},
    {8, {"Q8_0", 32, 34}},     {9, {"Q8_1", 32, 36}},     {10, {"Q2_K", 256, 84}},
    {11, {"Q3_K", 256, 110}},  {12, {"Q4_K", 256, 144}},  {13, {"Q5_K", 256, 176}},
    {14, {"Q6_K", 256, 210}},  {15, {"Q8_K", 256, 292}},  {16, {"IQ2_XXS", 256, 66}},
    {17, {"IQ2_XS", 256, 74}}, {18, {"IQ3_XXS", 256, 98}}, {19, {"IQ1_S", 256, 50}},
    {20, {"IQ4_NL", 32, 18}},  {21, {"IQ3_S", 256, 110}}, {22, {"IQ2_S", 256, 82}},
    {23, {"IQ4_XS", 256, 136}}, {24, {"I8", 1, 1}},       {25, {"I16", 1, 2}},
    {26, {"I32", 1, 4}},       {27, {"I64", 1, 8}},       {28, {"F64", 1, 8}},
    {29, {"IQ1_M", 256, 56}},  {30, {"BF16", 1, 2}},      {34, {"TQ1_0", 256, 54}},
    {35, {"TQ2_0", 256, 66}},  {39, {"MXFP4", 32, 17}},
};

const dol_ggml_type_info *dol_ggml_type(uint32_t id)
{
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (TYPES[i].id == id) return &TYPES[i].info;
    return NULL;
}

const char *dol_gguf_vtype_name(uint32_t t)
{
    static const char *const N[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                    "bool", "string", "array", "u64", "i64", "f64"};
    return t < sizeof N / sizeof N[0] ? N[t] : "unknown";
}

/* Bytes of one scalar of type t; 0 for STRING, ARRAY and unknown types. */
static size_t scalar_size(uint32_t t)
{
    switch (t) {
    case DOL_GGUF_UINT8: case DOL_GGUF_INT8: case DOL_GGUF_BOOL: return 1;
    case DOL_GGUF_UINT16: case DOL_GGUF_INT16: return 2;
    case DOL_GGUF_UINT32: case DOL_GGUF_INT32: case DOL_GGUF_FLOAT32: return 4;
    case DOL_GGUF_UINT64: case DOL_GGUF_INT64: case DOL_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* ---- the cursor ---------------------------------------------------------- */

typedef struct {
    const uint8_t *base;
    size_t size;
    size_t pos;
    const char *path;
    char *err;
    size_t errlen;
} cursor;

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static bool has(const cursor *c, uint64_t n) { return n <= c->size - c->pos; }

/* Read an n-byte little-endian unsigned integer; false at the end. */
static bool rd(cursor *c, int n, uint64_t *v)
{
    if (!has(c, (uint64_t)n)) return false;
    *v = le(c->base + c->pos, n);
    c->pos += (size_t)n;
    return true;
}

/* A string: u64 length, then the bytes (inside the file). */
static bool rd_str(cursor *c, dol_gguf_str *s)
{
    uint64_t n;
    if (!rd(c, 8, &n) || !has(c, n)) return false;
    s->s = (const char *)c->base + c->pos;
    s->len = n;
    c->pos += (size_t)n;
    return true;
}

/* At most 200 bytes of a name, for "%.*s". */
static int shown(uint64_t len) { return len > 200 ? 200 : (int)len; }

/* ---- metadata ------------------------------------------------------------ */

/* Skip (checking) `n` values of type t; arrays nest at most GGUF_MAX_NESTING
 * deep. `key` names the pair in messages. */
static int skip_values(cursor *c, const dol_gguf_str *key, uint32_t t, uint64_t n, int depth)
{
    size_t sz = scalar_size(t);
    if (sz) {
        if (n > (c->size - c->pos) / sz) goto past;
        c->pos += (size_t)(n * sz);
        return 0;
    }
    if (t == DOL_GGUF_STRING) {
        if (n > (c->size - c->pos) / 8) goto past;
        for (uint64_t i = 0; i < n; i++) {
            dol_gguf_str s;
            if (!rd_str(c, &s)) goto past;
        }
        return 0;
    }
    if (t == DOL_GGUF_ARRAY) {
        if (depth >= GGUF_MAX_NESTING) {
            dol_set_err(c->err, c->errlen, "%s: key %.*s: arrays nested more than %d deep",
                        c->path, shown(key->len), key->s, GGUF_MAX_NESTING);
            return -1;
        }
        if (n > (c->size - c->pos) / 12) goto past;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t et, en;
            if (!rd(c, 4, &et) || !rd(c, 8, &en)) goto past;
            if (!scalar_size((uint32_t)et) && et != DOL_GGUF_STRING && et != DOL_GGUF_ARRAY) {
                dol_set_err(c->err, c->errlen, "%s: key %.*s: array of unknown value type %llu",
                            c->path, shown(key->len), key->s, (unsigned long long)et);
                return -1;
            }
            if (skip_values(c, key, (uint32_t)et, en, depth + 1) != 0) return -1;
        }
        return 0;
    }
    dol_set_err(c->err, c->errlen, "%s: key %.*s: unknown value type %u", c->path,
                shown(key->len), key->s, t);
    return -1;
past:
    dol_set_err(c->err, c->errlen, "%s: key %.*s: value runs past the end of the file "
                "(%zu bytes)", c->path, shown(key->len), key->s, c->size);
    return -1;
}

static int read_kv(dol_gguf *g, cursor *c, dol_gguf_kv *kv, uint64_t index)
{
    if (!rd_str(c, &kv->key)) {
        dol_set_err(c->err, c->errlen, "%s: key %llu: its name runs past the end of the file "
                    "(%zu bytes)", c->path, (unsigned long long)index, c->size);
        return -1;
    }
    const dol_gguf_str *k = &kv->key;
    if (k->len == 0 || k->len > GGUF_MAX_KEY) {
        dol_set_err(c->err, c->errlen, "%s: key %llu: name of %llu bytes (must be 1..%u)",
                    c->path, (unsigned long long)index, (unsigned long long)k->len, GGUF_MAX_KEY);
        return -1;
    }
    if (memchr(k->s, 0, (size_t)k->len)) {
        dol_set_err(c->err, c->errlen, "%s: key %.*s: name holds a NUL byte", c->path,
                    shown(k->len), k->s);
        return -1;
    }
    uint64_t t;
    if (!rd(c, 4, &t)) goto past;
    kv->type = (dol_gguf_vtype)t;
    size_t sz = scalar_size((uint32_t)t);
    if (sz) {
        uint64_t raw;
        if (!rd(c, (int)sz, &raw)) goto past;
        switch (t) {
        case DOL_GGUF_INT8: kv->v.i = (int8_t)raw; break;
        case DOL_GGUF_INT16: kv->v.i = (int16_t)raw; break;
        case DOL_GGUF_INT32: kv->v.i = (int32_t)raw; break;
        case DOL_GGUF_INT64: kv->v.i = (int64_t)raw; break;
        case DOL_GGUF_BOOL:
            if (raw > 1) {
                dol_set_err(c->err, c->errlen, "%s: key %.*s: bool of value %llu (must be 0 or 1)",
                            c->path, shown(k->len), k->s, (unsigned long long)raw);
                return -1;
            }
            kv->v.b = raw != 0;
            break;
        case DOL_GGUF_FLOAT32: {
            uint32_t u = (uint32_t)raw;
            float f;
            memcpy(&f, &u, sizeof f);
            kv->v.f = f;
            break;
        }
        case DOL_GGUF_FLOAT64: memcpy(&kv->v.f, &raw, sizeof kv->v.f); break;
        default: kv->v.u = raw; break;
        }
        return 0;
    }
    if (t == DOL_GGUF_STRING) {
        if (!rd_str(c, &kv->v.s)) goto past;
        return 0;
    }
    if (t != DOL_GGUF_ARRAY) {
        dol_set_err(c->err, c->errlen, "%s: key %.*s: unknown value type %llu", c->path,
                    shown(k->len), k->s, (unsigned long long)t);
        return -1;
    }
    uint64_t et, n;
    if (!rd(c, 4, &et) || !rd(c, 8, &n)) goto past;
    if (!scalar_size((uint32_t)et) && et != DOL_GGUF_STRING && et != DOL_GGUF_ARRAY) {
        dol_set_err(c->err, c->errlen, "%s: key %.*s: array of unknown value type %llu",
                    c->path, shown(k->len), k->s, (unsigned long long)et);
        return -1;
    }
    kv->arr_type = (dol_gguf_vtype)et;
    kv->arr_n = n;
    kv->arr_data = c->base + c->pos;
    if (et != DOL_GGUF_STRING) return skip_values(c, k, (uint32_t)et, n, 1);

    /* strings: index them (each checked to lie inside the file) */
    if (n > (c->size - c->pos) / 8) goto past;
    dol_gguf_str *tab = malloc((n ? n : 1) * sizeof *tab);
    if (!tab) {
        dol_set_err(c->err, c->errlen, "%s: key %.*s: out of memory for %llu strings",
                    c->path, shown(k->len), k->s, (unsigned long long)n);
        return -1;
    }
    g->str_tables[g->n_str_tables++] = tab;
    for (uint64_t i = 0; i < n; i++)
        if (!rd_str(c, &tab[i])) goto past;
    kv->arr_str = tab;
    return 0;
past:
    dol_set_err(c->err, c->errlen, "%s: key %.*s: value runs past the end of the file "
                "(%zu bytes)", c->path, shown(k->len), k->s, c->size);
    return -1;
}

/* Sorting the name indexes (qsort_r: the dol_gguf is the context). */
static int str_cmp(const char *a, uint64_t an, const char *b, uint64_t bn)
{
    uint64_t n = an < bn ? an : bn;
    int r = n ? memcmp(a, b, (size_t)n) : 0;
    if (r) return r;
    return an < bn ? -1 : an > bn;
}

static int kv_idx_cmp(const void *a, const void *b, void *ctx)
{
    const dol_gguf *g = ctx;
    const dol_gguf_kv *x = &g->kv[*(const size_t *)a];
    const dol_gguf_kv *y = &g->kv[*(const size_t *)b];
    return str_cmp(x->key.s, x->key.len, y->key.s, y->key.len);
}

static int t_idx_cmp(const void *a, const void *b, void *ctx)
{
    const dol_gguf *g = ctx;
    return strcmp(g->t[*(const size_t *)a].name, g->t[*(const size_t *)b].name);
}

static int t_off_cmp(const void *a, const void *b)
{
    const dol_gguf_tensor *x = *(const dol_gguf_tensor *const *)a;
    const dol_gguf_tensor *y = *(const dol_gguf_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static size_t *sorted_index(dol_gguf *g, size_t n, int (*cmp)(const void *, const void *, void *))
{
    size_t *ix = malloc((n ? n : 1) * sizeof *ix);
    if (!ix) return NULL;
    for (size_t i = 0; i < n; i++) ix[i] = i;
    qsort_r(ix, n, sizeof *ix, cmp, g);
    return ix;
}

/* ---- tensors -------------------------------------------------------------- */

static int read_tensor(cursor *c, dol_gguf_tensor *t, uint64_t index)
{
    dol_gguf_str name;
    if (!rd_str(c, &name)) {
        dol_set_err(c->err, c->errlen, "%s: tensor %llu of the table: its name runs past the "
                    "end of the file (%zu bytes)", c->path, (unsigned long long)index, c->size);
        return -1;
    }
    if (name.len == 0 || name.len > GGUF_MAX_NAME || memchr(name.s, 0, (size_t)name.len)) {
        dol_set_err(c->err, c->errlen, "%s: tensor %llu of the table: name of %llu bytes%s "
                    "(must be 1..%u bytes, no NUL)", c->path, (unsigned long long)index,
                    (unsigned long long)name.len,
                    name.len && name.len <= GGUF_MAX_NAME ? " holding a NUL" : "", GGUF_MAX_NAME);
        return -1;
    }
    t->name = strndup(name.s, (size_t)name.len);
    if (!t->name) {
        dol_set_err(c->err, c->errlen, "%s: out of memory", c->path);
        return -1;
    }
    const char *tn = t->name;
    uint64_t nd, type;
    if (!rd(c, 4, &nd)) goto past;
    if (nd < 1 || nd > DOL_GGUF_MAX_DIMS) {
        dol_set_err(c->err, c->errlen, "%s: tensor %s: %llu dimensions (must be 1..%d)", c->path,
                    tn, (unsigned long long)nd, DOL_GGUF_MAX_DIMS);
        return -1;
    }
    t->n_dims = (uint32_t)nd;
    uint64_t elems = 1;
    for (int i = 0; i < DOL_GGUF_MAX_DIMS; i++) t->ne[i] = 1;
    for (uint64_t i = 0; i < nd; i++) {
        if (!rd(c, 8, &t->ne[i])) goto past;
        if (t->ne[i] > (uint64_t)INT64_MAX ||
            __builtin_mul_overflow(elems, t->ne[i], &elems) || elems > (uint64_t)INT64_MAX) {
            dol_set_err(c->err, c->errlen, "%s: tensor %s: dimensions too large (2^63 elements "
                        "or more)", c->path, tn);
            return -1;
        }
    }
    if (!rd(c, 4, &type) || !rd(c, 8, &t->offset)) goto past;
    t->type = (uint32_t)type;
    const dol_ggml_type_info *ti = dol_ggml_type(t->type);
    if (!ti) {
        dol_set_err(c->err, c->errlen, "%s: tensor %s: unknown ggml type id %llu", c->path, tn,
                    (unsigned long long)type);
        return -1;
    }
    if (t->ne[0] % ti->block != 0) {
        dol_set_err(c->err, c->errlen, "%s: tensor %s: ne[0] %llu is not a multiple of the %u "
                    "elements of a %s block", c->path, tn, (unsigned long long)t->ne[0],
                    ti->block, ti->name);
        return -1;
    }
    /* bytes: (elements / block) * block bytes; elements < 2^63 so no overflow
     * while block_bytes / block <= 4 ... except F64/I64 (8): check anyway */
    uint64_t blocks = elems / ti->block;
    if (__builtin_mul_overflow(blocks, (uint64_t)ti->block_bytes, &t->nbytes)) {
        dol_set_err(c->err, c->errlen, "%s: tensor %s: too large (2^64 bytes or more)", c->path, tn);
        return -1;
    }
    return 0;
past:
    dol_set_err(c->err, c->errlen, "%s: tensor %s: its entry runs past the end of the file "
                "(%zu bytes)", c->path, tn, c->size);
    return -1;
}

/* Tensors: data inside the file, aligned, no overlaps; names unique. */
static int check_tensors(dol_gguf *g, cursor *c)
{
    uint64_t data_len = g->size - g->data_offset;
    for (size_t i = 0; i < g->n_t; i++) {
        dol_gguf_tensor *t = &g->t[i];
        if (t->offset % g->alignment != 0) {
            dol_set_err(c->err, c->errlen, "%s: tensor %s: misaligned data: offset %llu is not "
                        "a multiple of general.alignment %llu", c->path, t->name,
                        (unsigned long long)t->offset, (unsigned long long)g->alignment);
            return -1;
        }
        if (t->offset > data_len || t->nbytes > data_len - t->offset) {
            dol_set_err(c->err, c->errlen, "%s: tensor %s: data at offset %llu, %llu bytes, runs "
                        "past the end of the file (data section of %llu bytes)", c->path, t->name,
                        (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                        (unsigned long long)data_len);
            return -1;
        }
        t->data = g->base + g->data_offset + t->offset;
    }
    for (size_t i = 1; i < g->n_t; i++) {
        const dol_gguf_tensor *a = &g->t[g->t_sorted[i - 1]], *b = &g->t[g->t_sorted[i]];
        if (strcmp(a->name, b->name) == 0) {
            dol_set_err(c->err, c->errlen, "%s: tensor %s: listed twice in the tensor table",
                        c->path, b->name);
            return -1;
        }
    }
    if (g->n_t < 2) return 0;
    const dol_gguf_tensor **by = malloc(g->n_t * sizeof *by);
    if (!by) {
        dol_set_err(c->err, c->errlen, "%s: out of memory", c->path);
        return -1;
    }
    size_t n = 0;
    for (size_t i = 0; i < g->n_t; i++)
        if (g->t[i].nbytes) by[n++] = &g->t[i];
    qsort(by, n, sizeof *by, t_off_cmp);
    int rc = 0;
    const dol_gguf_tensor *last = NULL;
    for (size_t i = 0; i < n; i++) {
        if (last && by[i]->offset < last->offset + last->nbytes) {
            dol_set_err(c->err, c->errlen, "%s: tensors %s and %s overlap (offsets %llu and %llu)",
                        c->path, last->name, by[i]->name, (unsigned long long)last->offset,
                        (unsigned long long)by[i]->offset);
            rc = -1;
            break;
        }
        if (!last || by[i]->offset + by[i]->nbytes > last->offset + last->nbytes) last = by[i];
    }
    free(by);
    return rc;
}

/* ---- the whole file -------------------------------------------------------- */

static int parse(dol_gguf *g, char *err, size_t errlen)
{
    cursor c = {.base = g->base, .size = g->size, .pos = 0, .path = g->path, .err = err,
                .errlen = errlen};
    const char *p = g->path;
    if (g->size < 24) {
        if (g->size >= 4 && memcmp(g->base, "GGUF", 4) != 0) goto magic;
        dol_set_err(err, errlen, "%s: file too short (%zu bytes) for a GGUF header", p, g->size);
        return -1;
    }
    if (memcmp(g->base, "GGUF", 4) != 0) goto magic;
    uint64_t ver, n_t, n_kv;
    c.pos = 4;
    rd(&c, 4, &ver);
    rd(&c, 8, &n_t);
    rd(&c, 8, &n_kv);
    g->version = (uint32_t)ver;
    uint32_t swapped = __builtin_bswap32((uint32_t)ver);
    if (ver != 2 && ver != 3) {
        if ((ver & 0xffff) == 0 && swapped >= 1 && swapped <= 3)
            dol_set_err(err, errlen, "%s: a big-endian GGUF file (version %u): only little-endian "
                        "files are supported", p, swapped);
        else
            dol_set_err(err, errlen, "%s: GGUF version %llu is not supported (only 2 and 3)", p,
                        (unsigned long long)ver);
        return -1;
    }
    /* each pair takes at least 13 bytes, each tensor entry 33 */
    if (n_kv > (g->size - c.pos) / 13) {
        dol_set_err(err, errlen, "%s: header: key/value count %llu cannot fit in the file (%zu "
                    "bytes)", p, (unsigned long long)n_kv, g->size);
        return -1;
    }
    if (n_t > (g->size - c.pos) / 33) {
        dol_set_err(err, errlen, "%s: header: tensor count %llu cannot fit in the file (%zu "
                    "bytes)", p, (unsigned long long)n_t, g->size);
        return -1;
    }
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->str_tables = calloc(n_kv ? n_kv : 1, sizeof *g->str_tables);
    g->t = calloc(n_t ? n_t : 1, sizeof *g->t);
    if (!g->kv || !g->str_tables || !g->t) goto oom;
    for (uint64_t i = 0; i < n_kv; i++) {
        if (read_kv(g, &c, &g->kv[i], i) != 0) return -1;
        g->n_kv++;
    }
    if (!(g->kv_sorted = sorted_index(g, g->n_kv, kv_idx_cmp))) goto oom;
    for (size_t i = 1; i < g->n_kv; i++) {
        const dol_gguf_kv *a = &g->kv[g->kv_sorted[i - 1]], *b = &g->kv[g->kv_sorted[i]];
        if (str_cmp(a->key.s, a->key.len, b->key.s, b->key.len) == 0) {
            dol_set_err(err, errlen, "%s: key %.*s: listed twice", p, shown(b->key.len), b->key.s);
            return -1;
        }
    }

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const dol_gguf_kv *al = dol_gguf_find_kv(g, "general.alignment");
    if (al) {
        bool uns = al->type == DOL_GGUF_UINT8 || al->type == DOL_GGUF_UINT16 ||
                   al->type == DOL_GGUF_UINT32 || al->type == DOL_GGUF_UINT64;
        if (!uns || al->v.u == 0 || (al->v.u & (al->v.u - 1)) != 0 || al->v.u > GGUF_MAX_ALIGNMENT) {
            if (uns)
                dol_set_err(err, errlen, "%s: key general.alignment: %llu is not a power of two "
                            "from 1 to 2^30", p, (unsigned long long)al->v.u);
            else
                dol_set_err(err, errlen, "%s: key general.alignment: must be an unsigned integer "
                            "(got a %s)", p, dol_gguf_vtype_name(al->type));
            return -1;
        }
        g->alignment = al->v.u;
    }

    for (uint64_t i = 0; i < n_t; i++) {
        if (read_tensor(&c, &g->t[i], i) != 0) {
            g->n_t = (size_t)i + 1;   /* its name, if copied, is freed with the rest */
            return -1;
        }
        g->n_t++;
    }
    uint64_t end = c.pos;
    g->data_offset = (end + g->alignment - 1) / g->alignment * g->alignment;
    if (g->data_offset > g->size) {
        if (g->n_t > 0) {
            dol_set_err(err, errlen, "%s: the data section would start at byte %llu (the tensor "
                        "table ends at %llu, aligned to %llu), past the end of the file (%zu "
                        "bytes)", p, (unsigned long long)g->data_offset, (unsigned long long)end,
                        (unsigned long long)g->alignment, g->size);
            return -1;
        }
        g->data_offset = g->size;
    }
    if (!(g->t_sorted = sorted_index(g, g->n_t, t_idx_cmp))) goto oom;
    return check_tensors(g, &c);
magic:
    dol_set_err(err, errlen, "%s: not a GGUF file (bad magic %02x %02x %02x %02x, want \"GGUF\")",
                p, g->base[0], g->base[1], g->base[2], g->base[3]);
    return -1;
oom:
    dol_set_err(err, errlen, "%s: out of memory", p);
    return -1;
}

static void one_line(char *err, size_t errlen)
{
    if (!err || errlen == 0) return;
    for (char *q = err; *q; q++)
        if ((unsigned char)*q < 0x20 || *q == 0x7f) *q = '?';
}

void dol_gguf_close(dol_gguf *g)
{
    if (!g) return;
    for (size_t i = 0; i < g->n_str_tables; i++) free(g->str_tables[i]);
    free(g->str_tables);
    for (size_t i = 0; i < g->n_t; i++) free(g->t[i].name);
    free(g->t);
    free(g->t_sorted);
    free(g->kv);
    free(g->kv_sorted);
    if (g->mapped && g->base) munmap((void *)g->base, g->size);
    free(g->path);
    free(g);
}

static int open_common(dol_gguf *g, dol_gguf **out, char *err, size_t errlen)
{
    if (parse(g, err, errlen) != 0) {
        one_line(err, errlen);
        dol_gguf_close(g);
        return -1;
    }
    *out = g;
    return 0;
}

int dol_gguf_open_mem(const void *buf, size_t len, const char *name, dol_gguf **out,
                      char *err, size_t errlen)
{
    *out = NULL;
    dol_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(name ? name : "buffer"))) {
        free(g);
        dol_set_err(err, errlen, "%s: out of memory", name ? name : "buffer");
        return -1;
    }
    static const uint8_t empty[1];
    g->base = len ? buf : empty;
    g->size = len;
    return open_common(g, out, err, errlen);
}

int dol_gguf_open(const char *path, dol_gguf **out, char *err, size_t errlen)
{
    *out = NULL;
    dol_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
        free(g);
        dol_set_err(err, errlen, "%s: out of memory", path);
        return -1;
    }
    /* (O_NONBLOCK: a FIFO must not block the open; no effect on a file) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0) {
        dol_set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        dol_set_err(err, errlen, "%s: not a regular file", path);
        goto fail;
    }
    g->size = (size_t)st.st_size;
    if (g->size == 0) {
        dol_set_err(err, errlen, "%s: empty file, not a GGUF file", path);
        goto fail;
    }
    void *map = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        dol_set_err(err, errlen, "%s: cannot mmap: %s", path, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    g->base = map;
    g->mapped = true;
    return open_common(g, out, err, errlen);
fail:
    if (fd >= 0) close(fd);
    one_line(err, errlen);
    g->size = 0;
    dol_gguf_close(g);
    return -1;
}

/* ---- queries ---------------------------------------------------------------- */

const char *dol_gguf_path(const dol_gguf *g) { return g->path; }
uint32_t dol_gguf_version(const dol_gguf *g) { return g->version; }
uint64_t dol_gguf_alignment(const dol_gguf *g) { return g->alignment; }
uint64_t dol_gguf_file_size(const dol_gguf *g) { return g->size; }
uint64_t dol_gguf_data_offset(const dol_gguf *g) { return g->data_offset; }
const void *dol_gguf_base(const dol_gguf *g) { return g->base; }
bool dol_gguf_mapped(const dol_gguf *g) { return g->mapped; }
size_t dol_gguf_n_kv(const dol_gguf *g) { return g->n_kv; }
size_t dol_gguf_n_tensors(const dol_gguf *g) { return g->n_t; }

const dol_gguf_kv *dol_gguf_kv_at(const dol_gguf *g, size_t i)
{
    return i < g->n_kv ? &g->kv[i] : NULL;
}

const dol_gguf_tensor *dol_gguf_tensor_at(const dol_gguf *g, size_t i)
{
    return i < g->n_t ? &g->t[i] : NULL;
}

const dol_gguf_kv *dol_gguf_find_kv(const dol_gguf *g, const char *key)
{
    if (!g->kv_sorted) return NULL;
    size_t lo = 0, hi = g->n_kv, n = strlen(key);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const dol_gguf_kv *kv = &g->kv[g->kv_sorted[mid]];
        int r = str_cmp(kv->key.s, kv->key.len, key, n);
        if (r == 0) return kv;
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const dol_gguf_tensor *dol_gguf_find_tensor(const dol_gguf *g, const char *name)
{
    if (!g->t_sorted) return NULL;
    size_t lo = 0, hi = g->n_t;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const dol_gguf_tensor *t = &g->t[g->t_sorted[mid]];
        int r = strcmp(t->name, name);
        if (r == 0) return t;
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

bool dol_gguf_arr_int(const dol_gguf_kv *kv, uint64_t i, int64_t *out)
{
    if (kv->type != DOL_GGUF_ARRAY || i >= kv->arr_n) return false;
    size_t sz = scalar_size(kv->arr_type);
    if (!sz || kv->arr_type == DOL_GGUF_FLOAT32 || kv->arr_type == DOL_GGUF_FLOAT64) return false;
    uint64_t raw = le(kv->arr_data + i * sz, (int)sz);
    switch (kv->arr_type) {
    case DOL_GGUF_INT8: *out = (int8_t)raw; return true;
    case DOL_GGUF_INT16: *out = (int16_t)raw; return true;
    case DOL_GGUF_INT32: *out = (int32_t)raw; return true;
    case DOL_GGUF_INT64: *out = (int64_t)raw; return true;
    case DOL_GGUF_BOOL: *out = raw != 0; return true;
    case DOL_GGUF_UINT64:
        if (raw > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)raw;
        return true;
    default: *out = (int64_t)raw; return true;
    }
}

bool dol_gguf_arr_f32(const dol_gguf_kv *kv, uint64_t i, float *out)
{
    if (kv->type != DOL_GGUF_ARRAY || i >= kv->arr_n) return false;
    if (kv->arr_type == DOL_GGUF_FLOAT32) {
        uint32_t u = (uint32_t)le(kv->arr_data + i * 4, 4);
        memcpy(out, &u, sizeof *out);
        return true;
    }
    if (kv->arr_type == DOL_GGUF_FLOAT64) {
        uint64_t u = le(kv->arr_data + i * 8, 8);
        double d;
        memcpy(&d, &u, sizeof d);
        *out = (float)d;
        return true;
    }
    return false;
}

void dol_gguf_shape_str(const dol_gguf_tensor *t, char *buf, size_t len)
{
    if (len == 0) return;
    size_t n = (size_t)snprintf(buf, len, "[");
    for (uint32_t i = 0; i < t->n_dims && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%llu", i ? ", " : "",
                              (unsigned long long)t->ne[i]);
    if (n < len) snprintf(buf + n, len - n, "]");
}
