/* tests/fuzz/fuzz_gguf.c — libFuzzer target for the GGUF reader
 * (src/model/gguf.c) and the Llama loader on top of it
 * (src/model/gguf_llama.c, then the tokenizer it builds through
 * sentencepiece): the input is a whole .gguf file. The reader gets it from
 * memory (exactly `size` bytes, so ASan sees any read past the end); an
 * accepted file must satisfy what the loader relies on (every string,
 * array and tensor inside the bytes, offsets aligned, names unique and
 * found again). The loader gets it as an in-memory file; a refused file
 * must come with one line starting with its path. Seeds: the headers of
 * the shared GGUF fixtures and their truncations, written at run time by
 * tests/fuzz/gguf_seeds.py (scripts/fuzz.sh), never copied into the repo. */
#include <string.h>

#include "dolphin/gguf.h"
#include "dolphin/model.h"
#include "dolphin/tokenizer.h"
#include "fuzz_util.h"

static fuzz_memfile g_file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    fuzz_memfile_init(&g_file, "fuzz.gguf");
    return 0;
}

static bool inside(const uint8_t *base, size_t size, const void *p, uint64_t n)
{
    const uint8_t *q = p;
    return q >= base && (uint64_t)(q - base) <= size && n <= size - (uint64_t)(q - base);
}

static void check_reader(const dol_gguf *g, const uint8_t *data, size_t size)
{
    FUZZ_CHECK(dol_gguf_base(g) == data || size == 0);
    FUZZ_CHECK(dol_gguf_file_size(g) == size);
    FUZZ_CHECK(dol_gguf_version(g) == 2 || dol_gguf_version(g) == 3);
    uint64_t al = dol_gguf_alignment(g);
    FUZZ_CHECK(al > 0 && (al & (al - 1)) == 0);
    FUZZ_CHECK(dol_gguf_data_offset(g) <= size);
    for (size_t i = 0; i < dol_gguf_n_kv(g); i++) {
        const dol_gguf_kv *kv = dol_gguf_kv_at(g, i);
        FUZZ_CHECK(kv->key.len > 0 && inside(data, size, kv->key.s, kv->key.len));
        char key[128];
        if (kv->key.len < sizeof key && !memchr(kv->key.s, 0, (size_t)kv->key.len)) {
            memcpy(key, kv->key.s, (size_t)kv->key.len);
            key[kv->key.len] = '\0';
            FUZZ_CHECK(dol_gguf_find_kv(g, key) == kv);
        }
        if (kv->type == DOL_GGUF_STRING) FUZZ_CHECK(inside(data, size, kv->v.s.s, kv->v.s.len));
        if (kv->type == DOL_GGUF_ARRAY && kv->arr_type == DOL_GGUF_STRING)
            for (uint64_t j = 0; j < kv->arr_n; j++)
                FUZZ_CHECK(inside(data, size, kv->arr_str[j].s, kv->arr_str[j].len));
        if (kv->type == DOL_GGUF_ARRAY && kv->arr_n > 0) {
            int64_t v;
            float f;
            (void)dol_gguf_arr_int(kv, kv->arr_n - 1, &v);   /* reads the last element */
            (void)dol_gguf_arr_f32(kv, kv->arr_n - 1, &f);
        }
    }
    for (size_t i = 0; i < dol_gguf_n_tensors(g); i++) {
        const dol_gguf_tensor *t = dol_gguf_tensor_at(g, i);
        FUZZ_CHECK(t->name && t->name[0]);
        FUZZ_CHECK(dol_gguf_find_tensor(g, t->name) == t);
        FUZZ_CHECK(t->n_dims >= 1 && t->n_dims <= DOL_GGUF_MAX_DIMS);
        const dol_ggml_type_info *ti = dol_ggml_type(t->type);
        FUZZ_CHECK(ti != NULL && t->ne[0] % ti->block == 0);
        FUZZ_CHECK(t->offset % al == 0);
        FUZZ_CHECK(inside(data, size, t->data, t->nbytes));
        if (t->nbytes) {
            volatile uint8_t first = ((const uint8_t *)t->data)[0];
            volatile uint8_t last = ((const uint8_t *)t->data)[t->nbytes - 1];
            (void)first; (void)last;
        }
        char shape[128];
        dol_gguf_shape_str(t, shape, sizeof shape);
        FUZZ_CHECK(shape[0] == '[');
    }
    FUZZ_CHECK(dol_gguf_find_tensor(g, "no.such.tensor\x01") == NULL);
}

static void check_err(const char *err, const char *name)
{
    size_t n = strlen(name);
    FUZZ_CHECK(strncmp(err, name, n) == 0 && err[n] == ':');
    FUZZ_CHECK(strchr(err, '\n') == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512] = "";
    dol_gguf *g = NULL;
    if (dol_gguf_open_mem(data, size, "fuzz.gguf", &g, err, sizeof err) == 0) {
        check_reader(g, data, size);
        dol_gguf_close(g);
    } else {
        FUZZ_CHECK(g == NULL);
        check_err(err, "fuzz.gguf");
    }

    /* the Llama loader and its tokenizer, from the same bytes as a file */
    fuzz_memfile_set(&g_file, data, size);
    dol_model *m = NULL;
    err[0] = '\0';
    if (dol_model_load(g_file.path, &m, err, sizeof err) == 0) {
        FUZZ_CHECK(m->format == DOL_MODEL_GGUF);
        FUZZ_CHECK(m->cfg.n_layers >= 1 && m->layers != NULL);
        /* the last embedding row and the last row of the last layer's down
         * projection, dequantized: reads stay inside the tensors */
        const dol_tensor *ts[2] = {&m->embed, &m->layers[m->cfg.n_layers - 1].down};
        for (int i = 0; i < 2; i++) {
            float *row = malloc(sizeof(float) * (size_t)ts[i]->cols);
            FUZZ_CHECK(row != NULL);
            const uint8_t *last = (const uint8_t *)ts[i]->data +
                                  (size_t)(ts[i]->rows - 1) * dol_dtype_row_bytes(ts[i]->dtype, ts[i]->cols);
            dol_dequantize(ts[i]->dtype, last, row, ts[i]->cols);
            free(row);
        }
        dol_tokenizer *tok = NULL;
        if (dol_model_tokenizer(m, &tok, err, sizeof err) == 0) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (dol_tokenizer_encode(tok, "Once upon a time", 16, true, &ids, &n, err,
                                     sizeof err) == 0) {
                for (size_t i = 0; i < n; i++)
                    FUZZ_CHECK(ids[i] >= 0 && ids[i] < dol_tokenizer_vocab_size(tok));
                free(ids);
            }
            dol_tokenizer_free(tok);
        } else {
            check_err(err, g_file.path);
        }
        dol_model_free(m);
    } else {
        FUZZ_CHECK(m == NULL);
        check_err(err, g_file.path);
    }
    return 0;
}
