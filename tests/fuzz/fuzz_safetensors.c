/* tests/fuzz/fuzz_safetensors.c — libFuzzer target for the safetensors
 * reader (src/model/safetensors.c): the input is a whole .safetensors file
 * (8-byte little-endian header length, JSON header, data). It is opened with
 * dol_st_open from an in-memory file; a refused file must come with one
 * message naming the file, an accepted one must satisfy every invariant the
 * loader relies on (ranges inside the data, sizes matching shapes and
 * dtypes, no overlaps, no duplicates, lookups that work). */
#include <string.h>

#include "fuzz_util.h"
#include "model/safetensors.h"

static fuzz_memfile g_file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    fuzz_memfile_init(&g_file, "fuzz.safetensors");
    return 0;
}

static size_t elem_size(const char *dtype)
{
    static const struct { const char *name; size_t size; } t[] = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"U64", 8},
        {"I32", 4}, {"U32", 4}, {"I16", 2}, {"U16", 2}, {"I8", 1}, {"U8", 1},
        {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strcmp(dtype, t[i].name) == 0) return t[i].size;
    return 0;
}

static void check_file(const dol_st_file *f, const uint8_t *data, size_t size)
{
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
    FUZZ_CHECK(size >= 8 && hlen <= size - 8);
    FUZZ_CHECK(f->map_len == size);
    FUZZ_CHECK(f->data == (const uint8_t *)f->map + 8 + hlen);
    FUZZ_CHECK(f->data_len == size - 8 - hlen);
    FUZZ_CHECK(f->n_tensors == 0 || f->tensors != NULL);

    for (size_t i = 0; i < f->n_tensors; i++) {
        const dol_st_tensor *t = &f->tensors[i];
        FUZZ_CHECK(t->name != NULL);
        FUZZ_CHECK(strcmp(t->name, "__metadata__") != 0);
        if (i > 0) FUZZ_CHECK(strcmp(f->tensors[i - 1].name, t->name) < 0);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= DOL_ST_MAX_DIMS);
        FUZZ_CHECK(memchr(t->dtype, '\0', sizeof t->dtype) != NULL);
        FUZZ_CHECK(t->begin <= t->end && t->end <= f->data_len);

        size_t es = elem_size(t->dtype);
        if (t->supported) FUZZ_CHECK(es == 4 || es == 2);
        if (es) {
            /* product(shape) * element size, in 128 bits: no overflow here */
            unsigned __int128 bytes = es;
            bool zero = false;
            for (int d = 0; d < t->ndim; d++) {
                FUZZ_CHECK(t->shape[d] >= 0);
                zero |= t->shape[d] == 0;
                if (!zero && bytes <= ((unsigned __int128)1 << 64))
                    bytes *= (uint64_t)t->shape[d];
            }
            if (zero) bytes = 0;
            FUZZ_CHECK(bytes == t->end - t->begin);
        }
        /* The bytes of the tensor are readable (ASan/SEGV would tell). */
        if (t->end > t->begin) {
            volatile uint8_t first = f->data[t->begin], last = f->data[t->end - 1];
            (void)first; (void)last;
        }
        FUZZ_CHECK(dol_st_find(f, t->name) == t);
        char shape[256];
        dol_st_shape_str(t->shape, t->ndim, shape, sizeof shape);
        FUZZ_CHECK(shape[0] == '[');
    }
    /* No two non-empty ranges overlap (quadratic, on small headers only). */
    if (f->n_tensors <= 256)
        for (size_t i = 0; i < f->n_tensors; i++)
            for (size_t j = i + 1; j < f->n_tensors; j++) {
                const dol_st_tensor *a = &f->tensors[i], *b = &f->tensors[j];
                if (a->begin == a->end || b->begin == b->end) continue;
                FUZZ_CHECK(a->end <= b->begin || b->end <= a->begin);
            }
    /* A name is found only as itself (the fuzzer can put this one in a header). */
    const dol_st_tensor *probe = dol_st_find(f, "model.no.such.tensor\x01");
    FUZZ_CHECK(probe == NULL || strcmp(probe->name, "model.no.such.tensor\x01") == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_memfile_set(&g_file, data, size);
    dol_st_file f;
    char err[512] = "";
    if (dol_st_open(&f, g_file.path, err, sizeof err) == 0) {
        check_file(&f, data, size);
        dol_st_close(&f);
        FUZZ_CHECK(f.map == NULL && f.tensors == NULL);
        dol_st_close(&f); /* closing twice is allowed */
    } else {
        /* One line that starts with the file's name. */
        const char *base = strrchr(g_file.path, '/') + 1;
        size_t n = strlen(base);
        FUZZ_CHECK(strncmp(err, base, n) == 0 && err[n] == ':');
        FUZZ_CHECK(strchr(err, '\n') == NULL);
        FUZZ_CHECK(f.map == NULL && f.tensors == NULL);
    }
    return 0;
}
