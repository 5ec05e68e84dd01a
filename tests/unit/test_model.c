/* tests/unit/test_model.c — unit tests of src/model: the two fixture
 * checkpoints load with the right config, shapes, dtypes and values; F16 and
 * BF16 conversions round-trip; and damaged copies of the fixtures (built in a
 * temporary folder by the helpers below) are refused with one line naming
 * the file and the tensor or field at fault. Skips (77) without fixtures. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dolphin/model.h"

static const char *shared;   /* $DOLPHIN_SHARED */
static char tmproot[256];    /* mkdtemp folder for damaged copies */

/* ----------------------------------------------------------------------------
 * file helpers */

static char *fixture(char *buf, size_t len, const char *model, const char *file)
{
    snprintf(buf, len, "%s/models/%s%s%s", shared, model, file ? "/" : "", file ? file : "");
    return buf;
}

static uint8_t *read_all(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) fail_msg("cannot open %s: %s", path, strerror(errno));
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

static void write_all(const char *path, const void *buf, size_t len)
{
    FILE *fp = fopen(path, "wb");
    if (!fp) fail_msg("cannot create %s: %s", path, strerror(errno));
    assert_int_equal(fwrite(buf, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
}

/* A fresh case folder tmproot/name; its path goes into dir. */
static char *case_dir(char *dir, size_t len, const char *name)
{
    snprintf(dir, len, "%s/%s", tmproot, name);
    if (mkdir(dir, 0700) != 0) fail_msg("mkdir %s: %s", dir, strerror(errno));
    return dir;
}

/* dir/file -> the fixture's file, as a symlink (no copy of big shards). */
static void link_fixture(const char *dir, const char *model, const char *file)
{
    char src[1024], dst[1024];
    fixture(src, sizeof src, model, file);
    snprintf(dst, sizeof dst, "%s/%s", dir, file);
    if (symlink(src, dst) != 0) fail_msg("symlink %s: %s", dst, strerror(errno));
}

/* Apply `patch` (JSON object text) to obj: each key replaces or adds that
 * member, the string "<delete>" removes it, and with merge an object value
 * is merged one level down instead of replacing. */
static void patch_object(cJSON *obj, const char *patch, bool merge)
{
    cJSON *p = cJSON_Parse(patch);
    if (!p) fail_msg("bad patch in test: %s", patch);
    cJSON *item;
    cJSON_ArrayForEach(item, p) {
        cJSON *old = cJSON_GetObjectItemCaseSensitive(obj, item->string);
        if (cJSON_IsString(item) && strcmp(item->valuestring, "<delete>") == 0) {
            assert_non_null(old);
            cJSON_DeleteItemFromObjectCaseSensitive(obj, item->string);
        } else if (merge && old && cJSON_IsObject(old) && cJSON_IsObject(item)) {
            cJSON *f;
            cJSON_ArrayForEach(f, item) {
                cJSON *copy = cJSON_Duplicate(f, true);
                if (cJSON_GetObjectItemCaseSensitive(old, f->string))
                    cJSON_ReplaceItemInObjectCaseSensitive(old, f->string, copy);
                else
                    cJSON_AddItemToObject(old, f->string, copy);
            }
        } else if (old) {
            cJSON_ReplaceItemInObjectCaseSensitive(obj, item->string, cJSON_Duplicate(item, true));
        } else {
            cJSON_AddItemToObject(obj, item->string, cJSON_Duplicate(item, true));
        }
    }
    cJSON_Delete(p);
}

/* config.json of `model` with `patch` applied, written into dir. */
static void write_config(const char *dir, const char *model, const char *patch)
{
    char path[1024];
    size_t len;
    char *text = (char *)read_all(fixture(path, sizeof path, model, "config.json"), &len);
    cJSON *cfg = cJSON_Parse(text);
    assert_non_null(cfg);
    if (patch) patch_object(cfg, patch, false);
    char *out = cJSON_Print(cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_all(path, out, strlen(out));
    free(out);
    cJSON_Delete(cfg);
    free(text);
}

/* A safetensors file taken apart: header JSON and data section. */
typedef struct {
    uint8_t *bytes;
    size_t len;
    cJSON *hdr;
    const uint8_t *data;
    size_t data_len;
} st_file;

static void st_read(st_file *f, const char *path)
{
    f->bytes = read_all(path, &f->len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f->bytes[i];
    f->hdr = cJSON_ParseWithLength((const char *)f->bytes + 8, (size_t)n);
    assert_non_null(f->hdr);
    f->data = f->bytes + 8 + n;
    f->data_len = f->len - 8 - (size_t)n;
}

static void st_free(st_file *f)
{
    cJSON_Delete(f->hdr);
    free(f->bytes);
}

/* data_offsets[i] of tensor `name`. */
static uint64_t st_offset(const st_file *f, const char *name, int i)
{
    cJSON *t = cJSON_GetObjectItemCaseSensitive(f->hdr, name);
    assert_non_null(t);
    return (uint64_t)cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(t, "data_offsets"),
                                        i)->valuedouble;
}

/* Byte at of the file at path set to v. */
static void set_byte(const char *path, size_t at, uint8_t v)
{
    size_t len;
    uint8_t *b = read_all(path, &len);
    assert_true(at < len);
    b[at] = v;
    write_all(path, b, len);
    free(b);
}

/* Write f with a new 8-byte length: `hdr_text` (or f's header when NULL),
 * padded with spaces so that 8 + N == misalign (mod 8); the first `data_len`
 * bytes of f's data follow. */
static void st_write(const st_file *f, const char *path, const char *hdr_text,
                     int misalign, size_t data_len)
{
    char *own = hdr_text ? NULL : cJSON_PrintUnformatted(f->hdr);
    const char *h = hdr_text ? hdr_text : own;
    size_t n = strlen(h);
    while ((8 + n) % 8 != (size_t)misalign) n++;
    uint8_t *buf = malloc(8 + n + data_len);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memset(buf + 8, ' ', n);
    memcpy(buf + 8, h, strlen(h));
    memcpy(buf + 8 + n, f->data, data_len);
    write_all(path, buf, 8 + n + data_len);
    free(buf);
    free(own);
}

/* Case folder `name` with stories260K's config (patched by cfg_patch) and a
 * model.safetensors whose header is patched by hdr_patch (merge per tensor). */
static char *stories_case(char *dir, size_t len, const char *name, const char *cfg_patch,
                          const char *hdr_patch)
{
    char path[1024];
    case_dir(dir, len, name);
    write_config(dir, "stories260K", cfg_patch);
    if (!hdr_patch) {
        link_fixture(dir, "stories260K", "model.safetensors");
        return dir;
    }
    st_file f;
    st_read(&f, fixture(path, sizeof path, "stories260K", "model.safetensors"));
    patch_object(f.hdr, hdr_patch, true);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_write(&f, path, NULL, 0, f.data_len);
    st_free(&f);
    return dir;
}

/* Loading dir must fail with one line that starts with "dir/" (the file at
 * fault, by the path given) and contains every string in subs. */
static void expect_fail_(const char *dir, const char *const *subs)
{
    char err[DOL_ERR_LEN] = "";
    dol_model sentinel;
    dol_model *m = &sentinel;
    int rc = dol_model_load(dir, &m, err, sizeof err);
    printf("    %s -> %s\n", strrchr(dir, '/') + 1, err);
    assert_int_equal(rc, -1);
    assert_ptr_equal(m, &sentinel);   /* *out untouched */
    assert_null(strchr(err, '\n'));
    size_t n = strlen(dir);
    if (strncmp(err, dir, n) != 0 || (dir[n - 1] != '/' && err[n] != '/'))
        fail_msg("error \"%s\" does not start with the directory \"%s\"", err, dir);
    for (; *subs; subs++)
        if (!strstr(err, *subs)) fail_msg("error \"%s\" lacks \"%s\"", err, *subs);
}
#define expect_fail(dir, ...) expect_fail_(dir, (const char *const[]){__VA_ARGS__, NULL})

static dol_model *load_ok(const char *dir)
{
    char err[DOL_ERR_LEN] = "";
    dol_model *m = NULL;
    if (dol_model_load(dir, &m, err, sizeof err) != 0) fail_msg("load %s: %s", dir, err);
    assert_non_null(m);
    return m;
}

static float f32_at(const dol_tensor *t, int64_t r, int64_t c)
{
    float v;
    memcpy(&v, (const uint8_t *)t->data + (r * t->cols + c) * 4, 4);
    return v;
}

static uint16_t u16_at(const dol_tensor *t, int64_t r, int64_t c)
{
    uint16_t v;
    memcpy(&v, (const uint8_t *)t->data + (r * t->cols + c) * 2, 2);
    return v;
}

/* ----------------------------------------------------------------------------
 * the fixtures load */

static void test_stories260k(void **state)
{
    (void)state;
    char dir[512];
    fixture(dir, sizeof dir, "stories260K", NULL);
    char err[DOL_ERR_LEN];
    dol_model_config c;
    assert_int_equal(dol_model_config_load(dir, &c, err, sizeof err), 0);
    assert_int_equal(c.hidden_size, 64);
    assert_int_equal(c.intermediate_size, 172);
    assert_int_equal(c.n_layers, 5);
    assert_int_equal(c.n_heads, 8);
    assert_int_equal(c.n_kv_heads, 4);
    assert_int_equal(c.head_dim, 8);
    assert_int_equal(c.vocab_size, 512);
    assert_int_equal(c.max_position_embeddings, 512);
    assert_float_equal(c.rms_norm_eps, 1e-5f, 0);
    assert_float_equal(c.rope_theta, 10000.0f, 0);
    assert_true(c.tie_word_embeddings);
    assert_int_equal(c.bos_token_id, 1);
    assert_int_equal(c.eos_token_id, 2);

    strcat(dir, "//");   /* the name ignores trailing slashes */
    dol_model *m = load_ok(dir);
    assert_string_equal(m->name, "stories260K");
    assert_int_equal(m->cfg.n_layers, 5);
    assert_int_equal(m->embed.dtype, DOL_DTYPE_F32);
    assert_int_equal(m->embed.rows, 512);
    assert_int_equal(m->embed.cols, 64);
    assert_ptr_equal(m->lm_head.data, m->embed.data);   /* tied */
    assert_int_equal(m->lm_head.rows, 512);
    assert_int_equal(m->final_norm.rows, 1);
    assert_int_equal(m->final_norm.cols, 64);
    assert_int_equal(m->layers[0].k.rows, 32);
    assert_int_equal(m->layers[0].k.cols, 64);
    assert_int_equal(m->layers[2].q.rows, 64);
    assert_int_equal(m->layers[3].o.cols, 64);
    assert_int_equal(m->layers[4].down.rows, 64);
    assert_int_equal(m->layers[4].down.cols, 172);
    assert_int_equal(m->layers[1].gate.rows, 172);
    assert_int_equal(m->layers[1].attn_norm.rows, 1);
    assert_int_equal(m->weight_bytes, 1040128);
    assert_int_equal((uintptr_t)m->embed.data % 4, 0);
    /* values as stored (read independently with Python's struct) */
    assert_float_equal(f32_at(&m->embed, 0, 0), -0.29474878311157227f, 0);
    assert_float_equal(f32_at(&m->embed, 0, 3), 0.34057360887527466f, 0);
    assert_float_equal(f32_at(&m->final_norm, 0, 0), 2.4583089351654053f, 0);
    assert_float_equal(f32_at(&m->layers[4].down, 0, 3), 0.20311811566352844f, 0);
    dol_model_free(m);
}

static void test_tiny_llama2(void **state)
{
    (void)state;
    char dir[512];
    dol_model *m = load_ok(fixture(dir, sizeof dir, "tiny-llama2", NULL));
    assert_string_equal(m->name, "tiny-llama2");
    assert_int_equal(m->cfg.hidden_size, 128);
    assert_int_equal(m->cfg.intermediate_size, 344);
    assert_int_equal(m->cfg.n_layers, 3);
    assert_int_equal(m->cfg.n_heads, 8);
    assert_int_equal(m->cfg.n_kv_heads, 4);
    assert_int_equal(m->cfg.head_dim, 16);
    assert_int_equal(m->cfg.vocab_size, 32000);
    assert_int_equal(m->cfg.max_position_embeddings, 1024);
    assert_false(m->cfg.tie_word_embeddings);
    assert_int_equal(m->embed.dtype, DOL_DTYPE_F16);
    assert_int_equal(m->lm_head.dtype, DOL_DTYPE_F16);
    assert_ptr_not_equal(m->lm_head.data, m->embed.data);   /* untied */
    assert_int_equal(m->lm_head.rows, 32000);
    assert_int_equal(m->lm_head.cols, 128);
    assert_int_equal(m->layers[2].k.rows, 64);   /* 4 kv heads * 16 */
    assert_int_equal(m->layers[2].v.cols, 128);
    assert_int_equal(m->layers[1].down.cols, 344);
    assert_int_equal(m->weight_bytes, 17473280);  /* index metadata.total_size */
    assert_int_equal(u16_at(&m->embed, 0, 0), 46421);
    assert_float_equal(dol_f16_to_f32(u16_at(&m->embed, 0, 1)), -1.052734375f, 0);
    assert_int_equal(u16_at(&m->lm_head, 0, 0), 5992);
    assert_float_equal(dol_f16_to_f32(u16_at(&m->lm_head, 0, 3)), -0.06646728515625f, 0);
    assert_float_equal(dol_f16_to_f32(u16_at(&m->final_norm, 0, 0)), 1.05859375f, 0);
    assert_float_equal(dol_f16_to_f32(u16_at(&m->final_norm, 0, 2)), 1.150390625f, 0);
    dol_model_free(m);
}

static void test_dtype_helpers(void **state)
{
    (void)state;
    assert_int_equal(dol_dtype_size(DOL_DTYPE_F32), 4);
    assert_int_equal(dol_dtype_size(DOL_DTYPE_F16), 2);
    assert_int_equal(dol_dtype_size(DOL_DTYPE_BF16), 2);
    assert_string_equal(dol_dtype_name(DOL_DTYPE_F32), "F32");
    assert_string_equal(dol_dtype_name(DOL_DTYPE_F16), "F16");
    assert_string_equal(dol_dtype_name(DOL_DTYPE_BF16), "BF16");
}

static void test_f16_conversions(void **state)
{
    (void)state;
    /* every F16 value survives F16 -> F32 -> F16; nans stay nans */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dol_f16_to_f32((uint16_t)h);
        uint16_t back = dol_f32_to_f16(f);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
            assert_true(isnan(f));
            assert_int_equal(back & 0x7c00, 0x7c00);
            assert_int_not_equal(back & 0x3ff, 0);
            assert_int_equal(back & 0x8000, h & 0x8000);
        } else if (back != h) {
            fail_msg("f16 0x%04x -> %g -> 0x%04x", h, f, back);
        }
    }
    assert_float_equal(dol_f16_to_f32(0x3c00), 1.0f, 0);
    assert_float_equal(dol_f16_to_f32(0xc000), -2.0f, 0);
    assert_float_equal(dol_f16_to_f32(0x7bff), 65504.0f, 0);
    assert_float_equal(dol_f16_to_f32(0x0001), ldexpf(1, -24), 0);
    assert_float_equal(dol_f16_to_f32(0x03ff), 1023 * ldexpf(1, -24), 0);
    assert_true(isinf(dol_f16_to_f32(0x7c00)) && dol_f16_to_f32(0xfc00) < 0);
    assert_true(signbit(dol_f16_to_f32(0x8000)));

    /* rounding: to nearest, ties to even, overflow to inf, subnormals */
    assert_int_equal(dol_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(dol_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00);     /* tie -> even */
    assert_int_equal(dol_f32_to_f16(1.0f + 3 * ldexpf(1, -11)), 0x3c02); /* tie -> even */
    assert_int_equal(dol_f32_to_f16(1.0f + ldexpf(1, -11) + ldexpf(1, -20)), 0x3c01);
    assert_int_equal(dol_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(dol_f32_to_f16(65519.99f), 0x7bff);
    assert_int_equal(dol_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(dol_f32_to_f16(-1e10f), 0xfc00);
    assert_int_equal(dol_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(dol_f32_to_f16(ldexpf(1, -24)), 0x0001);
    assert_int_equal(dol_f32_to_f16(ldexpf(1, -25)), 0x0000);            /* tie -> even */
    assert_int_equal(dol_f32_to_f16(ldexpf(1.0001f, -25)), 0x0001);
    assert_int_equal(dol_f32_to_f16(ldexpf(3, -25)), 0x0002);            /* tie -> even */
    assert_int_equal(dol_f32_to_f16(ldexpf(1, -30)), 0x0000);
    assert_int_equal(dol_f32_to_f16(-ldexpf(1, -30)), 0x8000);
    assert_int_equal(dol_f32_to_f16(ldexpf(1, -14) - ldexpf(1, -26)), 0x0400); /* up to normal */
    assert_int_equal(dol_f32_to_f16(1e-45f), 0x0000);                    /* F32 subnormal */
    assert_true((dol_f32_to_f16(NAN) & 0x7fff) > 0x7c00);

    /* BF16: exact widening; narrowing rounds to nearest even */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dol_bf16_to_f32((uint16_t)h);
        uint32_t bits;
        memcpy(&bits, &f, 4);
        assert_int_equal(bits, h << 16);
        if ((h & 0x7f80) != 0x7f80 || !(h & 0x7f)) assert_int_equal(dol_f32_to_bf16(f), h);
        else assert_true(isnan(dol_bf16_to_f32(dol_f32_to_bf16(f))));
    }
    assert_int_equal(dol_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(dol_f32_to_bf16(1.0f + ldexpf(1, -8)), 0x3f80);     /* tie -> even */
    assert_int_equal(dol_f32_to_bf16(1.0f + 3 * ldexpf(1, -8)), 0x3f82); /* tie -> even */
    assert_int_equal(dol_f32_to_bf16(1.0f + ldexpf(1, -8) + ldexpf(1, -12)), 0x3f81);
}

/* ----------------------------------------------------------------------------
 * damaged safetensors files (stories260K, one file) */

static void test_truncated(void **state)
{
    (void)state;
    char dir[512], path[1024], want[256];
    st_file f;
    st_read(&f, fixture(path, sizeof path, "stories260K", "model.safetensors"));
    size_t hlen = f.len - f.data_len - 8;

    /* cut in the middle of the data: the first tensor (in header order)
     * reaching past the cut is named */
    case_dir(dir, sizeof dir, "trunc-data");
    write_config(dir, "stories260K", NULL);
    size_t keep = f.data_len / 2;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_all(path, f.bytes, 8 + hlen + keep);
    const cJSON *t;
    const char *victim = NULL;
    cJSON_ArrayForEach(t, f.hdr)
        if (!victim && strcmp(t->string, "__metadata__") != 0 &&
            st_offset(&f, t->string, 1) > keep)
            victim = t->string;
    assert_non_null(victim);
    snprintf(want, sizeof want, "model.safetensors: tensor %s: data_offsets [%llu,%llu] "
             "past the end of the data (size %zu)", victim,
             (unsigned long long)st_offset(&f, victim, 0),
             (unsigned long long)st_offset(&f, victim, 1), keep);
    expect_fail(dir, want);

    /* cut inside the header */
    case_dir(dir, sizeof dir, "trunc-header");
    write_config(dir, "stories260K", NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_all(path, f.bytes, 8 + hlen / 2);
    snprintf(want, sizeof want, "model.safetensors: header length %zu larger than the file "
             "(%zu bytes)", hlen, 8 + hlen / 2);
    expect_fail(dir, want);

    /* shorter than the 8-byte length */
    case_dir(dir, sizeof dir, "trunc-5");
    write_config(dir, "stories260K", NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_all(path, f.bytes, 5);
    expect_fail(dir, "model.safetensors: file too short (5 bytes)");

    /* empty */
    case_dir(dir, sizeof dir, "trunc-0");
    write_config(dir, "stories260K", NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_all(path, f.bytes, 0);
    expect_fail(dir, "model.safetensors: file too short (0 bytes)");

    /* header length far larger than the file */
    case_dir(dir, sizeof dir, "huge-length");
    write_config(dir, "stories260K", NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f.bytes[7] = 0x80;
    write_all(path, f.bytes, f.len);
    snprintf(want, sizeof want, "model.safetensors: header length %llu larger than the file "
             "(%zu bytes)", (1ull << 63) + (unsigned long long)hlen, f.len);
    expect_fail(dir, want);
    st_free(&f);
}

static void test_bad_header_json(void **state)
{
    (void)state;
    char dir[512], path[1024];
    st_file f;
    st_read(&f, fixture(path, sizeof path, "stories260K", "model.safetensors"));

    /* the first half of the JSON text only */
    char *text = cJSON_PrintUnformatted(f.hdr);
    text[strlen(text) / 2] = '\0';
    case_dir(dir, sizeof dir, "json-cut");
    write_config(dir, "stories260K", NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_write(&f, path, text, 0, f.data_len);
    expect_fail(dir, "model.safetensors: header is not valid JSON");
    free(text);

    /* garbage after the object */
    case_dir(dir, sizeof dir, "json-trailing");
    write_config(dir, "stories260K", NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_write(&f, path, "{} xyz", 0, f.data_len);
    expect_fail(dir, "model.safetensors: header is not valid JSON");

    /* a NUL byte inside the header */
    case_dir(dir, sizeof dir, "json-nul");
    write_config(dir, "stories260K", NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_write(&f, path, "{}", 0, f.data_len);
    set_byte(path, 9, 0); /* "{" NUL "}" */
    expect_fail(dir, "model.safetensors: header is not valid JSON");

    /* a raw NUL inside a tensor's name (JSON wants it escaped; it would cut
     * the name short) */
    case_dir(dir, sizeof dir, "json-nul-in-name");
    write_config(dir, "stories260K", NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_write(&f, path, "{\"ab\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [0, 0]}}", 0, f.data_len);
    set_byte(path, 11, 0); /* the 'b' of "ab" */
    expect_fail(dir, "model.safetensors: header is not valid JSON (control byte 0x00 at byte 3");

    /* valid JSON, but not an object */
    case_dir(dir, sizeof dir, "json-array");
    write_config(dir, "stories260K", NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_write(&f, path, "[1, 2, 3]", 0, f.data_len);
    expect_fail(dir, "model.safetensors: header is not a JSON object");

    /* an empty object: the first needed tensor is missing */
    case_dir(dir, sizeof dir, "json-empty");
    write_config(dir, "stories260K", NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_write(&f, path, "{}", 0, f.data_len);
    expect_fail(dir, "model.safetensors: missing tensor model.embed_tokens.weight");
    st_free(&f);
}

static void test_bad_entries(void **state)
{
    (void)state;
    char dir[512], path[1024], patch[512], want[256];
    st_file f;
    st_read(&f, fixture(path, sizeof path, "stories260K", "model.safetensors"));
    const uint64_t n = f.data_len;
    const uint64_t b0 = st_offset(&f, "model.layers.0.input_layernorm.weight", 0);
    const uint64_t nb = st_offset(&f, "model.norm.weight", 0);
    st_free(&f);

    /* data_offsets past the end */
    snprintf(patch, sizeof patch,
             "{\"model.norm.weight\": {\"data_offsets\": [%llu, %llu]}}",
             (unsigned long long)n + 4, (unsigned long long)n + 260);
    stories_case(dir, sizeof dir, "offsets-past-end", NULL, patch);
    snprintf(want, sizeof want, "model.safetensors: tensor model.norm.weight: data_offsets "
             "[%llu,%llu] past the end of the data (size %llu)", (unsigned long long)n + 4,
             (unsigned long long)n + 260, (unsigned long long)n);
    expect_fail(dir, want);

    /* begin after end */
    stories_case(dir, sizeof dir, "offsets-reversed", NULL,
                 "{\"model.norm.weight\": {\"data_offsets\": [300, 44]}}");
    expect_fail(dir, "model.safetensors: tensor model.norm.weight: data_offsets [300,44] "
                "begin after end");

    /* not integers */
    stories_case(dir, sizeof dir, "offsets-fraction", NULL,
                 "{\"model.norm.weight\": {\"data_offsets\": [0.5, 256.5]}}");
    expect_fail(dir, "model.safetensors: tensor model.norm.weight: data_offsets must be");
    stories_case(dir, sizeof dir, "offsets-three", NULL,
                 "{\"model.norm.weight\": {\"data_offsets\": [0, 128, 256]}}");
    expect_fail(dir, "model.safetensors: tensor model.norm.weight: data_offsets must be");
    stories_case(dir, sizeof dir, "offsets-missing", NULL,
                 "{\"model.layers.2.mlp.up_proj.weight\": {\"data_offsets\": \"<delete>\"}}");
    expect_fail(dir, "model.safetensors: tensor model.layers.2.mlp.up_proj.weight: "
                "data_offsets must be");

    /* overlapping ranges: norm moved half-way into layer 0's first norm */
    snprintf(patch, sizeof patch,
             "{\"model.norm.weight\": {\"data_offsets\": [%llu, %llu]}}",
             (unsigned long long)b0 + 128, (unsigned long long)b0 + 384);
    stories_case(dir, sizeof dir, "overlap", NULL, patch);
    expect_fail(dir, "model.safetensors: tensors model.layers.0.input_layernorm.weight and "
                "model.norm.weight overlap");

    /* byte size disagrees with dtype x shape */
    stories_case(dir, sizeof dir, "size-mismatch", NULL,
                 "{\"model.norm.weight\": {\"shape\": [32]}}");
    snprintf(want, sizeof want, "model.safetensors: tensor model.norm.weight: dtype F32 shape "
             "[32] needs 128 bytes but data_offsets [%llu,%llu] hold 256",
             (unsigned long long)nb, (unsigned long long)nb + 256);
    expect_fail(dir, want);

    /* shape entries */
    stories_case(dir, sizeof dir, "shape-negative", NULL,
                 "{\"model.norm.weight\": {\"shape\": [-64]}}");
    expect_fail(dir, "model.safetensors: tensor model.norm.weight: shape entries must be "
                "non-negative integers");
    stories_case(dir, sizeof dir, "shape-not-array", NULL,
                 "{\"model.norm.weight\": {\"shape\": 64}}");
    expect_fail(dir, "model.safetensors: tensor model.norm.weight: shape missing or not an array");
    stories_case(dir, sizeof dir, "shape-overflow", NULL,
                 "{\"model.norm.weight\": {\"shape\": [4294967296, 4294967296, 4294967296]}}");
    expect_fail(dir, "model.safetensors: tensor model.norm.weight: dtype F32 shape "
                "[4294967296, 4294967296, 4294967296] is too large");

    /* entry / dtype malformed */
    stories_case(dir, sizeof dir, "entry-not-object", NULL, "{\"model.norm.weight\": 7}");
    expect_fail(dir, "model.safetensors: tensor model.norm.weight: header entry is not an object");
    stories_case(dir, sizeof dir, "name-newline", NULL, "{\"evil\\nname\": 7}");
    expect_fail(dir, "model.safetensors: tensor evil?name: header entry is not an object");
    stories_case(dir, sizeof dir, "dtype-number", NULL,
                 "{\"model.norm.weight\": {\"dtype\": 32}}");
    expect_fail(dir, "model.safetensors: tensor model.norm.weight: dtype missing or not a string");

    /* listed twice */
    case_dir(dir, sizeof dir, "duplicate");
    write_config(dir, "stories260K", NULL);
    st_read(&f, fixture(path, sizeof path, "stories260K", "model.safetensors"));
    cJSON_AddItemToObject(f.hdr, "model.norm.weight",
        cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(f.hdr, "model.norm.weight"), true));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_write(&f, path, NULL, 0, f.data_len);
    st_free(&f);
    expect_fail(dir, "model.safetensors: tensor model.norm.weight: listed twice");
}

static void test_missing_and_wrong(void **state)
{
    (void)state;
    char dir[512], path[1024], patch[512];
    st_file f;
    st_read(&f, fixture(path, sizeof path, "stories260K", "model.safetensors"));
    const uint64_t nb = st_offset(&f, "model.norm.weight", 0);
    st_free(&f);

    /* a tensor the model needs is not in the header */
    stories_case(dir, sizeof dir, "missing-tensor", NULL,
                 "{\"model.layers.3.mlp.up_proj.weight\": \"<delete>\"}");
    expect_fail(dir, "model.safetensors: missing tensor model.layers.3.mlp.up_proj.weight");

    /* untied config but no lm_head.weight */
    stories_case(dir, sizeof dir, "missing-lm-head", "{\"tie_word_embeddings\": false}", NULL);
    expect_fail(dir, "model.safetensors: missing tensor lm_head.weight");

    /* shape disagrees with the config, byte size consistent */
    snprintf(patch, sizeof patch, "{\"model.norm.weight\": {\"shape\": [32], "
             "\"data_offsets\": [%llu, %llu]}}", (unsigned long long)nb,
             (unsigned long long)nb + 128);
    stories_case(dir, sizeof dir, "wrong-shape-1d", NULL, patch);
    expect_fail(dir, "model.safetensors: tensor model.norm.weight: shape [32] but config "
                "says [64]");
    stories_case(dir, sizeof dir, "wrong-shape-2d", NULL,
                 "{\"model.layers.1.self_attn.k_proj.weight\": {\"shape\": [64, 32]}}");
    expect_fail(dir, "model.safetensors: tensor model.layers.1.self_attn.k_proj.weight: "
                "shape [64, 32] but config says [32, 64]");
    stories_case(dir, sizeof dir, "wrong-shape-rank", NULL,
                 "{\"model.layers.0.mlp.gate_proj.weight\": {\"shape\": [172, 64, 1]}}");
    expect_fail(dir, "model.safetensors: tensor model.layers.0.mlp.gate_proj.weight: "
                "shape [172, 64, 1] but config says [172, 64]");
    stories_case(dir, sizeof dir, "config-disagrees", "{\"hidden_size\": 128}", NULL);
    expect_fail(dir, "model.safetensors: tensor model.embed_tokens.weight: shape [512, 64] "
                "but config says [512, 128]");

    /* unsupported dtypes of needed tensors, sizes consistent */
    stories_case(dir, sizeof dir, "dtype-i32", NULL,
                 "{\"model.embed_tokens.weight\": {\"dtype\": \"I32\"}}");
    expect_fail(dir, "model.safetensors: tensor model.embed_tokens.weight: unsupported dtype I32");
    stories_case(dir, sizeof dir, "dtype-i8", NULL,
                 "{\"model.layers.0.self_attn.q_proj.weight\": {\"dtype\": \"I8\", "
                 "\"shape\": [64, 256]}}");
    expect_fail(dir, "model.safetensors: tensor model.layers.0.self_attn.q_proj.weight: "
                "unsupported dtype I8");
    stories_case(dir, sizeof dir, "dtype-f64", NULL,
                 "{\"model.norm.weight\": {\"dtype\": \"F64\", \"shape\": [32]}}");
    expect_fail(dir, "model.safetensors: tensor model.norm.weight: unsupported dtype F64");
    stories_case(dir, sizeof dir, "dtype-unknown", NULL,
                 "{\"model.norm.weight\": {\"dtype\": \"Q4_K\"}}");
    expect_fail(dir, "model.safetensors: tensor model.norm.weight: unsupported dtype Q4_K");

    /* no weights at all */
    case_dir(dir, sizeof dir, "no-weights");
    write_config(dir, "stories260K", NULL);
    expect_fail(dir, "model.safetensors: cannot open: No such file or directory");

    /* weights, no config */
    case_dir(dir, sizeof dir, "no-config");
    link_fixture(dir, "stories260K", "model.safetensors");
    expect_fail(dir, "config.json: cannot open: No such file or directory");

    /* not a directory at all */
    snprintf(dir, sizeof dir, "%s/does-not-exist", tmproot);
    expect_fail(dir, "config.json: cannot open: No such file or directory");

    /* a missing *.gguf path is named as the file it was meant to be */
    {
        char gerr[DOL_ERR_LEN] = "", gwant[600];
        dol_model *gm = NULL;
        snprintf(dir, sizeof dir, "%s/does-not-exist.gguf", tmproot);
        assert_int_equal(dol_model_load(dir, &gm, gerr, sizeof gerr), -1);
        assert_null(gm);
        snprintf(gwant, sizeof gwant, "%s: cannot open: No such file or directory", dir);
        assert_string_equal(gerr, gwant);
    }

    /* a trailing slash is not doubled */
    snprintf(dir, sizeof dir, "%s/does-not-exist/", tmproot);
    expect_fail(dir, "does-not-exist/config.json: cannot open: No such file or directory");

    /* config.json's own checks name the path too (dol_model_config_load) */
    char err[DOL_ERR_LEN] = "", want[600];
    dol_model_config c;
    snprintf(dir, sizeof dir, "%s/does-not-exist", tmproot);
    assert_int_equal(dol_model_config_load(dir, &c, err, sizeof err), -1);
    snprintf(want, sizeof want, "%s/config.json: cannot open: No such file or directory", dir);
    assert_string_equal(err, want);
}

/* Unused tensors of other dtypes are fine; a misaligned data section is
 * copied into aligned buffers with the same values. */
static void test_tolerated(void **state)
{
    (void)state;
    char dir[512], path[1024];
    stories_case(dir, sizeof dir, "extra-tensors", NULL,
                 "{\"extra.int8\": {\"dtype\": \"I8\", \"shape\": [0], \"data_offsets\": [0, 0]},"
                 " \"extra.q4\": {\"dtype\": \"Q4_K\", \"shape\": [7], \"data_offsets\": [5, 5]},"
                 " \"lm_head.weight\": {\"dtype\": \"F32\", \"shape\": [0, 64], "
                 "\"data_offsets\": [0, 0]}}");
    dol_model *m = load_ok(dir);
    assert_ptr_equal(m->lm_head.data, m->embed.data);   /* tied: lm_head.weight ignored */
    assert_int_equal(m->weight_bytes, 1040128);
    dol_model_free(m);

    case_dir(dir, sizeof dir, "misaligned");
    write_config(dir, "stories260K", NULL);
    st_file f;
    st_read(&f, fixture(path, sizeof path, "stories260K", "model.safetensors"));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_write(&f, path, NULL, 2, f.data_len);   /* data starts at 2 (mod 8) */
    m = load_ok(dir);
    fixture(path, sizeof path, "stories260K", NULL);
    dol_model *ref = load_ok(path);
    assert_int_equal((uintptr_t)m->embed.data % 4, 0);
    assert_int_equal((uintptr_t)m->layers[4].down.data % 4, 0);
    assert_memory_equal(m->embed.data, ref->embed.data, 512 * 64 * 4);
    assert_memory_equal(m->layers[4].down.data, ref->layers[4].down.data, 64 * 172 * 4);
    assert_memory_equal(m->final_norm.data, ref->final_norm.data, 64 * 4);
    assert_int_equal(m->weight_bytes, ref->weight_bytes);
    dol_model_free(ref);
    dol_model_free(m);
    st_free(&f);
}

/* ----------------------------------------------------------------------------
 * sharded checkpoint (tiny-llama2) */

static const char *SHARD1 = "model-00001-of-00002.safetensors";
static const char *SHARD2 = "model-00002-of-00002.safetensors";
static const char *INDEX = "model.safetensors.index.json";

/* Case folder with tiny-llama2's config, shard 1 linked, and an index
 * patched by weight_map_patch (applied to "weight_map"). */
static char *tiny_case(char *dir, size_t len, const char *name, const char *weight_map_patch,
                       bool link_shard2)
{
    char path[1024];
    case_dir(dir, len, name);
    write_config(dir, "tiny-llama2", NULL);
    link_fixture(dir, "tiny-llama2", SHARD1);
    if (link_shard2) link_fixture(dir, "tiny-llama2", SHARD2);
    size_t n;
    char *text = (char *)read_all(fixture(path, sizeof path, "tiny-llama2", INDEX), &n);
    cJSON *idx = cJSON_Parse(text);
    assert_non_null(idx);
    if (weight_map_patch)
        patch_object(cJSON_GetObjectItemCaseSensitive(idx, "weight_map"), weight_map_patch, false);
    char *out = cJSON_Print(idx);
    snprintf(path, sizeof path, "%s/%s", dir, INDEX);
    write_all(path, out, strlen(out));
    free(out);
    cJSON_Delete(idx);
    free(text);
    return dir;
}

static void test_shards(void **state)
{
    (void)state;
    char dir[512], path[1024], want[512];

    /* the case helper itself produces a loadable copy */
    dol_model *m = load_ok(tiny_case(dir, sizeof dir, "tiny-ok", NULL, true));
    assert_int_equal(m->weight_bytes, 17473280);
    dol_model_free(m);

    /* a shard named by the index is missing */
    tiny_case(dir, sizeof dir, "missing-shard", NULL, false);
    expect_fail(dir, "model-00002-of-00002.safetensors: cannot open: No such file or directory");

    /* a needed tensor is not in the weight map */
    tiny_case(dir, sizeof dir, "index-missing-tensor",
              "{\"model.norm.weight\": \"<delete>\"}", true);
    expect_fail(dir, "model.safetensors.index.json: missing tensor model.norm.weight");

    /* the index sends a tensor to the wrong shard */
    tiny_case(dir, sizeof dir, "index-wrong-shard",
              "{\"lm_head.weight\": \"model-00001-of-00002.safetensors\"}", true);
    expect_fail(dir, "model-00001-of-00002.safetensors: missing tensor lm_head.weight");

    /* shard names must stay inside the directory */
    tiny_case(dir, sizeof dir, "index-escape",
              "{\"model.norm.weight\": \"../tiny-ok/model-00002-of-00002.safetensors\"}", true);
    expect_fail(dir, "model.safetensors.index.json: tensor model.norm.weight: shard "
                "\"../tiny-ok/model-00002-of-00002.safetensors\" is not a plain file name");
    tiny_case(dir, sizeof dir, "index-dotdot", "{\"model.norm.weight\": \"..\"}", true);
    expect_fail(dir, "model.safetensors.index.json: tensor model.norm.weight: shard");
    tiny_case(dir, sizeof dir, "index-not-string", "{\"model.norm.weight\": 2}", true);
    expect_fail(dir, "model.safetensors.index.json: tensor model.norm.weight: shard 2 is not");

    /* index without weight_map, index not JSON */
    case_dir(dir, sizeof dir, "index-no-map");
    write_config(dir, "tiny-llama2", NULL);
    snprintf(path, sizeof path, "%s/%s", dir, INDEX);
    write_all(path, "{\"metadata\": {}}", 16);
    expect_fail(dir, "model.safetensors.index.json: field weight_map: missing");
    case_dir(dir, sizeof dir, "index-bad-json");
    write_config(dir, "tiny-llama2", NULL);
    snprintf(path, sizeof path, "%s/%s", dir, INDEX);
    write_all(path, "{\"weight_map\": {", 16);
    expect_fail(dir, "model.safetensors.index.json: not valid JSON");

    /* data_offsets past the end inside the second shard */
    tiny_case(dir, sizeof dir, "shard-offsets", NULL, false);
    st_file f;
    st_read(&f, fixture(path, sizeof path, "tiny-llama2", SHARD2));
    const char *victim = "model.layers.1.mlp.up_proj.weight";
    uint64_t b = st_offset(&f, victim, 0) + f.data_len, e = st_offset(&f, victim, 1) + f.data_len;
    char patch[256];
    snprintf(patch, sizeof patch, "{\"%s\": {\"data_offsets\": [%llu, %llu]}}", victim,
             (unsigned long long)b, (unsigned long long)e);
    patch_object(f.hdr, patch, true);
    snprintf(path, sizeof path, "%s/%s", dir, SHARD2);
    st_write(&f, path, NULL, 0, f.data_len);
    snprintf(want, sizeof want, "model-00002-of-00002.safetensors: tensor %s: data_offsets "
             "[%llu,%llu] past the end of the data (size %zu)", victim,
             (unsigned long long)b, (unsigned long long)e, f.data_len);
    st_free(&f);
    expect_fail(dir, want);
}

/* ----------------------------------------------------------------------------
 * config.json */

static void test_config(void **state)
{
    (void)state;
    char dir[512];
    static const struct { const char *name, *patch, *want; } cases[] = {
        {"cfg-rope-scaling", "{\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}",
         "config.json: field rope_scaling: unsupported value (only null)"},
        {"cfg-gelu", "{\"hidden_act\": \"gelu\"}",
         "config.json: field hidden_act: unsupported value \"gelu\" (only silu)"},
        {"cfg-mistral", "{\"architectures\": [\"MistralForCausalLM\"]}",
         "config.json: field architectures: unsupported value \"MistralForCausalLM\" "
         "(only LlamaForCausalLM)"},
        {"cfg-arch-empty", "{\"architectures\": []}",
         "config.json: field architectures: unsupported value []"},
        {"cfg-no-layers", "{\"num_hidden_layers\": \"<delete>\"}",
         "config.json: field num_hidden_layers: missing"},
        {"cfg-no-vocab", "{\"vocab_size\": null}", "config.json: field vocab_size: missing"},
        {"cfg-attn-bias", "{\"attention_bias\": true}",
         "config.json: field attention_bias: unsupported value true (only false)"},
        {"cfg-mlp-bias", "{\"mlp_bias\": true}",
         "config.json: field mlp_bias: unsupported value true (only false)"},
        {"cfg-kv-heads", "{\"num_key_value_heads\": 3}",
         "config.json: field num_key_value_heads: 3 does not divide num_attention_heads 8"},
        {"cfg-hidden", "{\"hidden_size\": 60}",
         "config.json: field hidden_size: 60 is not divisible by num_attention_heads 8"},
        {"cfg-odd-head", "{\"hidden_size\": 56}",
         "config.json: field hidden_size: head dimension 7"},
        {"cfg-head-dim", "{\"head_dim\": 16}", "config.json: field head_dim: unsupported value 16"},
        {"cfg-neg", "{\"vocab_size\": -5}",
         "config.json: field vocab_size: must be a positive integer (got -5)"},
        {"cfg-frac", "{\"intermediate_size\": 171.5}",
         "config.json: field intermediate_size: must be a positive integer (got 171.5)"},
        {"cfg-string", "{\"num_attention_heads\": \"8\"}",
         "config.json: field num_attention_heads: must be a positive integer (got \"8\")"},
        {"cfg-huge", "{\"hidden_size\": 1e300}",
         "config.json: field hidden_size: must be a positive integer up to 2147483647"},
        {"cfg-eps-huge", "{\"rms_norm_eps\": 1e300}",
         "config.json: field rms_norm_eps: must be a positive number within float range"},
        {"cfg-zero-heads", "{\"num_attention_heads\": 0}",
         "config.json: field num_attention_heads: must be a positive integer (got 0)"},
        {"cfg-eps", "{\"rms_norm_eps\": 0}",
         "config.json: field rms_norm_eps: must be a positive number (got 0)"},
        {"cfg-theta", "{\"rope_theta\": \"big\"}",
         "config.json: field rope_theta: must be a positive number"},
        {"cfg-tie", "{\"tie_word_embeddings\": 1}",
         "config.json: field tie_word_embeddings: must be true or false"},
        {"cfg-eos", "{\"eos_token_id\": 512}",
         "config.json: field eos_token_id: 512 is not below vocab_size 512"},
        {"cfg-eos-list", "{\"eos_token_id\": [2, 99999]}",
         "config.json: field eos_token_id: 99999 is not below vocab_size 512"},
        {"cfg-eos-empty", "{\"eos_token_id\": []}",
         "config.json: field eos_token_id: must be a token id or a list of 1 to 8 of them "
         "(got a list of 0)"},
        {"cfg-eos-long", "{\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}",
         "config.json: field eos_token_id: must be a token id or a list of 1 to 8 of them "
         "(got a list of 9)"},
        {"cfg-eos-item", "{\"eos_token_id\": [2, \"3\"]}",
         "config.json: field eos_token_id: must be a non-negative integer (got \"3\")"},
        {"cfg-bos", "{\"bos_token_id\": -1}",
         "config.json: field bos_token_id: must be a non-negative integer (got -1)"},
        {"cfg-layers", "{\"num_hidden_layers\": 2000000000}",
         "config.json: field num_hidden_layers: 2000000000 is implausibly large"},
        {"cfg-model-type", "{\"model_type\": \"mistral\"}",
         "config.json: field model_type: unsupported value \"mistral\" (only llama)"},
        {"cfg-model-type-num", "{\"model_type\": 7}",
         "config.json: field model_type: unsupported value 7 (only llama)"},
        /* the file holds 5 layers: a config saying fewer would drop some */
        {"cfg-fewer-layers", "{\"num_hidden_layers\": 4}",
         "config.json: field num_hidden_layers: 4 (layers 0..3), but model.safetensors holds "
         "tensor model.layers.4."},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        stories_case(dir, sizeof dir, cases[i].name, cases[i].patch, NULL);
        expect_fail(dir, cases[i].want);
    }

    /* not JSON, not an object */
    char path[1024];
    case_dir(dir, sizeof dir, "cfg-not-json");
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_all(path, "{\"hidden_size\": 64,", 19);
    expect_fail(dir, "config.json: not valid JSON");
    case_dir(dir, sizeof dir, "cfg-not-object");
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_all(path, "[64]", 4);
    expect_fail(dir, "config.json: not a JSON object");
    case_dir(dir, sizeof dir, "cfg-dir");
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    expect_fail(dir, "config.json: not a regular file");

    /* fewer layers than the shards hold */
    tiny_case(dir, sizeof dir, "cfg-fewer-layers-sharded", NULL, true);
    write_config(dir, "tiny-llama2", "{\"num_hidden_layers\": 2}");
    expect_fail(dir, "config.json: field num_hidden_layers: 2 (layers 0..1), but model-0000",
                "-of-00002.safetensors holds tensor model.layers.2.");

    /* model_type absent is fine (older configs) */
    stories_case(dir, sizeof dir, "cfg-no-model-type", "{\"model_type\": \"<delete>\"}", NULL);
    dol_model_free(load_ok(dir));

    /* defaults of the optional fields; eos as a list */
    stories_case(dir, sizeof dir, "cfg-defaults",
                 "{\"num_key_value_heads\": \"<delete>\", \"rope_theta\": \"<delete>\","
                 " \"rms_norm_eps\": \"<delete>\", \"tie_word_embeddings\": \"<delete>\","
                 " \"bos_token_id\": \"<delete>\", \"eos_token_id\": [7, 2],"
                 " \"max_position_embeddings\": \"<delete>\", \"architectures\": \"<delete>\","
                 " \"hidden_act\": \"<delete>\", \"rope_scaling\": \"<delete>\","
                 " \"attention_bias\": \"<delete>\", \"head_dim\": 8}", NULL);
    dol_model_config c;
    char err[DOL_ERR_LEN] = "";
    if (dol_model_config_load(dir, &c, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(c.n_kv_heads, 8);
    assert_float_equal(c.rope_theta, 10000.0f, 0);
    assert_float_equal(c.rms_norm_eps, 1e-6f, 0);
    assert_false(c.tie_word_embeddings);
    assert_int_equal(c.bos_token_id, 1);
    assert_int_equal(c.eos_token_id, 7);
    assert_int_equal(c.n_eos_token_ids, 2);
    assert_int_equal(c.eos_token_ids[0], 7);
    assert_int_equal(c.eos_token_ids[1], 2);
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_int_equal(c.head_dim, 8);
}

/* ----------------------------------------------------------------------------
 * setup / teardown */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static int group_setup(void **state)
{
    (void)state;
    snprintf(tmproot, sizeof tmproot, "/tmp/dolphin-test-model-XXXXXX");
    return mkdtemp(tmproot) ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    return nftw(tmproot, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int main(void)
{
    shared = getenv("DOLPHIN_SHARED");
    if (!shared || !*shared) shared = "../shared";
    char path[1024];
    if (access(fixture(path, sizeof path, "stories260K", "model.safetensors"), R_OK) != 0 ||
        access(fixture(path, sizeof path, "tiny-llama2", INDEX), R_OK) != 0) {
        printf("test_model: fixtures not found under %s/models (set DOLPHIN_SHARED); "
               "skipping\n", shared);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_helpers),
        cmocka_unit_test(test_f16_conversions),
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_tiny_llama2),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_bad_header_json),
        cmocka_unit_test(test_bad_entries),
        cmocka_unit_test(test_missing_and_wrong),
        cmocka_unit_test(test_tolerated),
        cmocka_unit_test(test_shards),
        cmocka_unit_test(test_config),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
