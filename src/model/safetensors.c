/* src/model/safetensors.c — reads one safetensors file: an 8-byte
 * little-endian header length N, N bytes of JSON describing each tensor
 * (dtype, shape, data_offsets relative to the data section), then the data.
 * The file is memory-mapped read-only and every header field is validated
 * before anyone gets a pointer into it. */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Same limit as the reference implementation (safetensors' MAX_HEADER_SIZE). */
#define ST_MAX_HEADER (100u * 1000u * 1000u)
/* Largest integer a JSON number (a double) holds exactly. */
#define ST_MAX_INT 9007199254740992.0

/* Element sizes of the dtypes safetensors knows, so that byte ranges of
 * tensors we will not use can still be checked. 0 = unknown. */
static size_t st_dtype_size(const char *s)
{
    static const struct { const char *name; size_t size; } table[] = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2},
        {"I64", 8}, {"U64", 8}, {"I32", 4}, {"U32", 4},
        {"I16", 2}, {"U16", 2}, {"I8", 1}, {"U8", 1}, {"BOOL", 1},
        {"F8_E4M3", 1}, {"F8_E5M2", 1},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(s, table[i].name) == 0) return table[i].size;
    return 0;
}

static bool st_supported(const char *s, dol_dtype *t)
{
    if (strcmp(s, "F32") == 0) { *t = DOL_DTYPE_F32; return true; }
    if (strcmp(s, "F16") == 0) { *t = DOL_DTYPE_F16; return true; }
    if (strcmp(s, "BF16") == 0) { *t = DOL_DTYPE_BF16; return true; }
    return false;
}

/* A JSON number that is a non-negative integer a double holds exactly. */
static bool st_uint(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j)) return false;
    double v = j->valuedouble;
    if (!(v >= 0.0 && v <= ST_MAX_INT)) return false;   /* also rejects nan */
    uint64_t u = (uint64_t)v;
    if ((double)u != v) return false;
    *out = u;
    return true;
}

void dol_st_shape_str(const int64_t *shape, int ndim, char *buf, size_t len)
{
    size_t n = 0;
    if (len == 0) return;
    buf[0] = '\0';
    n += (size_t)snprintf(buf + n, len - n, "[");
    for (int i = 0; i < ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "",
                              (long long)shape[i]);
    if (n < len) snprintf(buf + n, len - n, "]");
}

/* Parse one header entry into t (t->name is set by the caller). */
static int st_parse_entry(const dol_st_file *f, const cJSON *item,
                          dol_st_tensor *t, char *err, size_t errlen)
{
    const char *fn = f->fname, *tn = t->name;

    if (!cJSON_IsObject(item)) {
        dol_set_err(err, errlen, "%s: tensor %s: header entry is not an object", fn, tn);
        return -1;
    }

    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    if (!cJSON_IsString(dtype) || !dtype->valuestring[0]) {
        dol_set_err(err, errlen, "%s: tensor %s: dtype missing or not a string", fn, tn);
        return -1;
    }
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype->valuestring);
    t->supported = st_supported(dtype->valuestring, &t->type);

    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    if (!cJSON_IsArray(shape)) {
        dol_set_err(err, errlen, "%s: tensor %s: shape missing or not an array", fn, tn);
        return -1;
    }
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > DOL_ST_MAX_DIMS) {
        dol_set_err(err, errlen, "%s: tensor %s: shape has %d dimensions (at most %d)",
                    fn, tn, ndim, DOL_ST_MAX_DIMS);
        return -1;
    }
    t->ndim = 0;
    const cJSON *dim;
    cJSON_ArrayForEach(dim, shape) {
        uint64_t v;
        if (!st_uint(dim, &v)) {
            dol_set_err(err, errlen, "%s: tensor %s: shape entries must be non-negative integers",
                        fn, tn);
            return -1;
        }
        t->shape[t->ndim++] = (int64_t)v;
    }

    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !st_uint(cJSON_GetArrayItem(offs, 0), &t->begin) ||
        !st_uint(cJSON_GetArrayItem(offs, 1), &t->end)) {
        dol_set_err(err, errlen, "%s: tensor %s: data_offsets must be [begin, end], "
                    "two non-negative integers", fn, tn);
        return -1;
    }
    if (t->begin > t->end) {
        dol_set_err(err, errlen, "%s: tensor %s: data_offsets [%llu,%llu] begin after end",
                    fn, tn, (unsigned long long)t->begin, (unsigned long long)t->end);
        return -1;
    }
    if (t->end > f->data_len) {
        dol_set_err(err, errlen, "%s: tensor %s: data_offsets [%llu,%llu] past the end "
                    "of the data (size %llu)", fn, tn, (unsigned long long)t->begin,
                    (unsigned long long)t->end, (unsigned long long)f->data_len);
        return -1;
    }

    /* byte size must be product(shape) * element size */
    size_t esize = st_dtype_size(t->dtype);
    if (esize) {
        uint64_t n = esize;
        bool overflow = false, zero = false;
        for (int i = 0; i < t->ndim; i++) {
            zero |= t->shape[i] == 0;
            overflow |= __builtin_mul_overflow(n, (uint64_t)t->shape[i], &n);
        }
        if (zero) n = 0, overflow = false;
        char sh[160];
        dol_st_shape_str(t->shape, t->ndim, sh, sizeof sh);
        if (overflow) {
            dol_set_err(err, errlen, "%s: tensor %s: dtype %s shape %s is too large "
                        "(2^64 bytes or more)", fn, tn, t->dtype, sh);
            return -1;
        }
        if (n != t->end - t->begin) {
            dol_set_err(err, errlen, "%s: tensor %s: dtype %s shape %s needs %llu bytes "
                        "but data_offsets [%llu,%llu] hold %llu", fn, tn, t->dtype, sh,
                        (unsigned long long)n, (unsigned long long)t->begin,
                        (unsigned long long)t->end, (unsigned long long)(t->end - t->begin));
            return -1;
        }
    }
    return 0;
}

static int st_cmp_name(const void *a, const void *b)
{
    return strcmp(((const dol_st_tensor *)a)->name, ((const dol_st_tensor *)b)->name);
}

static int st_cmp_begin(const void *a, const void *b)
{
    const dol_st_tensor *x = *(const dol_st_tensor *const *)a;
    const dol_st_tensor *y = *(const dol_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Duplicate names and overlapping byte ranges. Tensors are sorted by name. */
static int st_check_layout(const dol_st_file *f, char *err, size_t errlen)
{
    for (size_t i = 1; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0) {
            dol_set_err(err, errlen, "%s: tensor %s: listed twice in the header",
                        f->fname, f->tensors[i].name);
            return -1;
        }

    if (f->n_tensors < 2) return 0;
    const dol_st_tensor **by = malloc(f->n_tensors * sizeof *by);
    if (!by) {
        dol_set_err(err, errlen, "%s: out of memory", f->fname);
        return -1;
    }
    size_t n = 0;
    for (size_t i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].end > f->tensors[i].begin) by[n++] = &f->tensors[i];
    qsort(by, n, sizeof *by, st_cmp_begin);

    int rc = 0;
    const dol_st_tensor *last = NULL;  /* the range reaching furthest so far */
    for (size_t i = 0; i < n; i++) {
        if (last && by[i]->begin < last->end) {
            dol_set_err(err, errlen, "%s: tensors %s and %s overlap "
                        "(data_offsets [%llu,%llu] and [%llu,%llu])", f->fname,
                        last->name, by[i]->name,
                        (unsigned long long)last->begin, (unsigned long long)last->end,
                        (unsigned long long)by[i]->begin, (unsigned long long)by[i]->end);
            rc = -1;
            break;
        }
        if (!last || by[i]->end > last->end) last = by[i];
    }
    free(by);
    return rc;
}

/* Parse and validate the JSON header (already known to lie inside the file). */
static int st_parse_header(dol_st_file *f, const uint8_t *hdr, size_t n,
                           char *err, size_t errlen)
{
    /* Copy into a NUL-terminated buffer: cJSON must never read past it. */
    char *text = malloc(n + 1);
    if (!text) {
        dol_set_err(err, errlen, "%s: out of memory for a %zu-byte header", f->fname, n);
        return -1;
    }
    memcpy(text, hdr, n);
    text[n] = '\0';
    /* JSON allows no raw control bytes but whitespace; cJSON would take them
     * inside strings, and a NUL there would cut a tensor's name short. */
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)text[i];
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
            dol_set_err(err, errlen, "%s: header is not valid JSON (control byte 0x%02x at byte %zu of %zu)",
                        f->fname, c, i, n);
            free(text);
            return -1;
        }
    }

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, n, &end, false);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t pos = (at && at >= text && at <= text + n) ? (size_t)(at - text) : 0;
        dol_set_err(err, errlen, "%s: header is not valid JSON (near byte %zu of %zu)",
                    f->fname, pos, n);
        free(text);
        return -1;
    }
    /* Only padding (spaces) may follow the JSON value. */
    for (const char *p = end; p && p < text + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            dol_set_err(err, errlen, "%s: header is not valid JSON (trailing bytes at %zu of %zu)",
                        f->fname, (size_t)(p - text), n);
            cJSON_Delete(root);
            free(text);
            return -1;
        }
    free(text);

    if (!cJSON_IsObject(root)) {
        dol_set_err(err, errlen, "%s: header is not a JSON object", f->fname);
        cJSON_Delete(root);
        return -1;
    }

    size_t count = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) count++;
    f->tensors = calloc(count ? count : 1, sizeof *f->tensors);
    if (!f->tensors) {
        dol_set_err(err, errlen, "%s: out of memory", f->fname);
        cJSON_Delete(root);
        return -1;
    }

    int rc = 0;
    cJSON_ArrayForEach(item, root) {
        if (strcmp(item->string, "__metadata__") == 0) continue;
        dol_st_tensor *t = &f->tensors[f->n_tensors];
        t->name = strdup(item->string);
        if (!t->name) {
            dol_set_err(err, errlen, "%s: out of memory", f->fname);
            rc = -1;
            break;
        }
        f->n_tensors++;
        if (st_parse_entry(f, item, t, err, errlen) != 0) {
            rc = -1;
            break;
        }
    }
    cJSON_Delete(root);
    if (rc != 0) return -1;

    qsort(f->tensors, f->n_tensors, sizeof *f->tensors, st_cmp_name);
    return st_check_layout(f, err, errlen);
}

static int st_open(dol_st_file *f, const char *path, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (strlen(path) >= sizeof f->path) {
        dol_set_err(err, errlen, "%s: path too long", base);
        return -1;
    }
    strcpy(f->path, path);
    slash = strrchr(f->path, '/');
    f->fname = slash ? slash + 1 : f->path;

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        dol_set_err(err, errlen, "%s: cannot open: %s", f->fname, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        dol_set_err(err, errlen, "%s: cannot stat: %s", f->fname, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        dol_set_err(err, errlen, "%s: not a regular file", f->fname);
        close(fd);
        return -1;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8) {
        dol_set_err(err, errlen, "%s: file too short (%llu bytes) to hold a safetensors "
                    "header", f->fname, (unsigned long long)size);
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED) {
        dol_set_err(err, errlen, "%s: cannot mmap: %s", f->fname, strerror(map_errno));
        return -1;
    }
    f->map = map;
    f->map_len = (size_t)size;

    const uint8_t *p = map;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | p[i];   /* little-endian */
    if (n > size - 8) {
        dol_set_err(err, errlen, "%s: header length %llu larger than the file "
                    "(%llu bytes): truncated or not a safetensors file", f->fname,
                    (unsigned long long)n, (unsigned long long)size);
        goto fail;
    }
    if (n > ST_MAX_HEADER) {
        dol_set_err(err, errlen, "%s: header length %llu is absurd (limit %u)",
                    f->fname, (unsigned long long)n, ST_MAX_HEADER);
        goto fail;
    }
    f->data = p + 8 + n;
    f->data_len = size - 8 - n;
    if (st_parse_header(f, p + 8, (size_t)n, err, errlen) != 0) goto fail;
    return 0;

fail:
    dol_st_close(f);
    return -1;
}

/* The message is one line: control characters, which the path or a tensor
 * name from the header may hold (escaped in the JSON, as \u0001), become
 * '?'. Found by tests/fuzz/fuzz_safetensors. */
static void st_one_line(char *err, size_t errlen)
{
    if (!err || errlen == 0) return;
    for (char *p = err; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
}

int dol_st_open(dol_st_file *f, const char *path, char *err, size_t errlen)
{
    int rc = st_open(f, path, err, errlen);
    if (rc != 0) st_one_line(err, errlen);
    return rc;
}

const dol_st_tensor *dol_st_find(const dol_st_file *f, const char *name)
{
    if (!f->tensors || f->n_tensors == 0) return NULL;
    dol_st_tensor key = {.name = (char *)name};
    return bsearch(&key, f->tensors, f->n_tensors, sizeof *f->tensors, st_cmp_name);
}

void dol_st_close(dol_st_file *f)
{
    if (!f) return;
    if (f->tensors) {
        for (size_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
        free(f->tensors);
    }
    if (f->map) munmap(f->map, f->map_len);
    f->tensors = NULL;
    f->n_tensors = 0;
    f->map = NULL;
    f->map_len = 0;
    f->data = NULL;
    f->data_len = 0;
}
