/* tests/cuda/test_cuda_kvq8.c — the 8-bit KV cache (kv_cache_dtype q8_0) on
 * CUDA: the layout of kernels/kv_layout.h; the write kernel byte for byte
 * against dol_kv_q8_quantize (include/dolphin/kv_q8.h) with every other byte
 * of the pool untouched; block copies for forks; decode and prefill
 * attention over Q8_0, F16 and mixed halves against a double reference over
 * the dequantized values (tight) and against the F16 cache (loose). Exits 77
 * (skipped) when no usable CUDA device is present. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "dolphin/engine.h"
#include "dolphin/kv_q8.h"
#include "dolphin/model.h"
#include "engine/backend.h"
#include "kernels/kernels.h"

#define CUDA_TEST_SEED 0x51ED270B27A7F5C3ull
#include "cuda_test_util.h"

/* one FP16 rounding of the output (2^-11 relative, one more ulp allowed) */
#define FP16_REL 9.765625e-4
/* attention against the double reference over the same dequantized values:
 * FP32 softmax and sums, far below the output's FP16 rounding */
#define TIGHT_ABS 3e-5
/* Q8_0 against FP16 for values in [-1, 1]: d / 2 = amax / 254 per value */
#define LOOSE_ABS 0.03

/* ---- host view of the layout ------------------------------------------------ */

typedef struct {
    int n_layers, bs, kv_dim, hd, n_blocks, max_blocks;
    dol_cuda_kv_geom g;
    size_t pool_bytes;
} pool_geom;

static pool_geom pgeom(int n_layers, int bs, int kv_dim, int hd, int kq, int vq, int n_blocks, int max_blocks)
{
    pool_geom p = { n_layers, bs, kv_dim, hd, n_blocks, max_blocks, dol_cuda_kv_geom_of(n_layers, bs, kv_dim, hd, kq, vq),
                    0 };
    p.pool_bytes = (size_t)p.g.block_bytes * (size_t)n_blocks;
    return p;
}

static uint8_t *half_at(const pool_geom *p, uint8_t *pool, int32_t block, int layer, int w)
{
    return pool + (size_t)block * p->g.block_bytes + (size_t)layer * p->g.layer_bytes + (size_t)p->g.half_off[w];
}

/* Store the FP32 values x[0..kv_dim) as row r of half w, as the kernels
 * must: dol_kv_q8_quantize per block of qb, or FP16. */
static void host_store(const pool_geom *p, uint8_t *pool, int32_t block, int layer, int w, int r, const float *x)
{
    uint8_t *h = half_at(p, pool, block, layer, w);
    if (p->g.q8[w]) {
        const int qb = p->g.qb, nb = p->kv_dim / qb;
        int8_t *q = (int8_t *)(h + (size_t)r * p->kv_dim);
        uint16_t *sc = (uint16_t *)(h + p->g.scale_off[w]) + (size_t)r * nb;
        for (int b = 0; b < nb; b++) sc[b] = dol_kv_q8_quantize(x + b * qb, 1, qb, q + b * qb, 1);
    } else {
        dol_f16 *o = (dol_f16 *)(h + (size_t)r * p->kv_dim * 2);
        for (int i = 0; i < p->kv_dim; i++) o[i] = dol_f32_to_f16(x[i]);
    }
}

/* Value i of row r of half w as attention must read it: q * d, or FP16. */
static double host_value(const pool_geom *p, uint8_t *pool, int32_t block, int layer, int w, int r, int i)
{
    uint8_t *h = half_at(p, pool, block, layer, w);
    if (p->g.q8[w]) {
        const int8_t *q = (const int8_t *)(h + (size_t)r * p->kv_dim);
        const uint16_t *sc = (const uint16_t *)(h + p->g.scale_off[w]) + (size_t)r * (p->kv_dim / p->g.qb);
        return (double)q[i] * (double)dol_f16_value(sc[i / p->g.qb]);
    }
    return dol_f16_to_f32(((const dol_f16 *)(h + (size_t)r * p->kv_dim * 2))[i]);
}

/* The layout's sizes: F16 as before (whole rows, 2 bytes a value); Q8_0 at
 * block size 16 exactly dol_kv_head_row_bytes per head and position (no
 * padding), and parts 16-byte aligned whatever the shape. */
static void test_layout(void **state)
{
    (void)state;
    const int hds[] = { 8, 16, 24, 32, 64, 128, 256 };
    for (size_t i = 0; i < sizeof hds / sizeof *hds; i++) {
        const int hd = hds[i], nkv = 4, kv_dim = nkv * hd, L = 3;
        for (int kq = 0; kq < 2; kq++)
            for (int vq = 0; vq < 2; vq++) {
                dol_cuda_kv_geom g = dol_cuda_kv_geom_of(L, 16, kv_dim, hd, kq, vq);
                const size_t want = (size_t)L * nkv * 16 *
                                    (dol_kv_head_row_bytes(kq ? DOL_KV_Q8_0 : DOL_KV_F16, hd) +
                                     dol_kv_head_row_bytes(vq ? DOL_KV_Q8_0 : DOL_KV_F16, hd));
                assert_int_equal((size_t)g.block_bytes, want);
                assert_int_equal(g.qb, dol_kv_q8_block(hd));
                for (int bs = 1; bs <= 33; bs += 4) {
                    dol_cuda_kv_geom o = dol_cuda_kv_geom_of(L, bs, kv_dim, hd, kq, vq);
                    assert_int_equal(o.block_bytes % 16, 0);
                    assert_int_equal(o.block_bytes % bs, 0);
                    assert_int_equal(o.half_off[1] % 16, 0);
                    assert_int_equal(o.layer_bytes % 16, 0);
                    assert_int_equal(o.scale_off[0] % 16, 0);
                    assert_int_equal(o.scale_off[1] % 16, 0);
                    assert_true(o.block_bytes >= (int64_t)L * o.layer_bytes);
                }
            }
    }
}

/* ---- write and copy ------------------------------------------------------------------ */

/* Rows of every kind a block meets: ordinary, all zero, values past the
 * F16 range (scale infinite), tiny ones (subnormal scale), NaN (with nan:
 * FP16 NaN bits are not the test's concern), exact halves. */
static void fill_row(float *x, int n, int kind, int nan)
{
    for (int i = 0; i < n; i++) {
        switch (kind % 6) {
        case 0: x[i] = urand(3.0f); break;
        case 1: x[i] = (i % 5 == 0) ? 0.0f : urand(1.0f) * 1e-6f; break;
        case 2: x[i] = urand(1.0f) * (i % 7 == 0 ? 1e7f : 1.0f); break;
        case 3: x[i] = nan && i % 11 == 3 ? NAN : urand(50.0f); break;
        case 4: x[i] = (float)(irand(255) - 127) * 0.5f; break; /* halves of the scale: ties */
        default: x[i] = i % 3 ? 0.0f : urand(2.0f); break;
        }
    }
    if (kind % 6 == 5 && n > 0) x[0] = 0.0f;
}

/* One layout: T rows written through the block tables of two sequences;
 * the pool (preset to a pattern) must equal the host's, byte for byte; then
 * two block copies (a partial and a whole block). */
static void write_case(int n_layers, int bs, int nkv, int hd, int kq, int vq)
{
    const int kv_dim = nkv * hd, max_blocks = 6, n_blocks = 12, layer = n_layers - 1;
    pool_geom p = pgeom(n_layers, bs, kv_dim, hd, kq, vq, n_blocks, max_blocks);
    const int T = 9, ld = 3 * kv_dim + 5, k_off = kv_dim + 3, v_off = 2 * kv_dim + 5;
    int32_t tables[2 * 6] = { 7, 2, 11, 0, 5, 9, /**/ 3, 8, 1, 10, 4, 6 };
    int32_t pos[9], item[9] = { 0, 0, 0, 0, 0, 1, 1, 1, 1 };
    const int cap = bs * max_blocks;
    /* distinct positions per sequence (bs >= 2), on both sides of block boundaries */
    const int pw[9] = { 0, bs - 1, bs, bs + 1, cap - 1, 1, 2 * bs - 1, 2 * bs, cap - 2 };
    for (int t = 0; t < T; t++) pos[t] = pw[t];
    float *src = malloc(sizeof(float) * (size_t)T * ld);
    for (int t = 0; t < T; t++) fill_row(src + (size_t)t * ld, ld, t, kq && vq);
    uint8_t *pool = malloc(p.pool_bytes), *got = malloc(p.pool_bytes);
    for (size_t i = 0; i < p.pool_bytes; i++) pool[i] = (uint8_t)(0x3c + i % 251);
    uint8_t *d_pool = dup_to_dev(pool, p.pool_bytes);
    int32_t *d_tab = dup_to_dev(tables, sizeof tables), *d_pos = dup_to_dev(pos, sizeof pos);
    int32_t *d_item = dup_to_dev(item, sizeof item);
    float *d_src = dup_to_dev(src, sizeof(float) * (size_t)T * ld);
    dol_cuda_kv kv = { d_pool, p.g, layer, bs, kv_dim, d_tab, max_blocks };
    CK(dol_cuda_kv_write(kv, d_src, ld, k_off, v_off, d_pos, d_item, T, 0));
    to_host(got, d_pool, p.pool_bytes);
    for (int t = 0; t < T; t++) {
        int32_t b = tables[item[t] * max_blocks + pos[t] / bs];
        host_store(&p, pool, b, layer, 0, pos[t] % bs, src + (size_t)t * ld + k_off);
        host_store(&p, pool, b, layer, 1, pos[t] % bs, src + (size_t)t * ld + v_off);
    }
    if (memcmp(got, pool, p.pool_bytes) != 0) {
        size_t i = 0;
        while (got[i] == pool[i]) i++;
        fail_msg("kv write (layers %d bs %d nkv %d hd %d k%s v%s): byte %zu of %zu is %u, want %u", n_layers, bs,
                 nkv, hd, kq ? "q8" : "f16", vq ? "q8" : "f16", i, p.pool_bytes, got[i], pool[i]);
    }

    /* forks: the first 5 rows of block 7 to block 4, all rows of 2 to 6 */
    const int part = bs < 5 ? bs : 5;
    CK(dol_cuda_kv_copy_block(&kv, n_layers, 7, 4, part, 0));
    CK(dol_cuda_kv_copy_block(&kv, n_layers, 2, 6, bs, 0));
    to_host(got, d_pool, p.pool_bytes);
    const int moves[2][3] = { { 7, 4, part }, { 2, 6, bs } };
    for (int mv = 0; mv < 2; mv++)
        for (int l = 0; l < n_layers; l++)
            for (int w = 0; w < 2; w++) {
                const int s = moves[mv][0], d = moves[mv][1], rows = moves[mv][2];
                uint8_t *hs = half_at(&p, pool, s, l, w), *hdst = half_at(&p, pool, d, l, w);
                if (p.g.q8[w]) {
                    memcpy(hdst, hs, (size_t)rows * kv_dim);
                    memcpy(hdst + p.g.scale_off[w], hs + p.g.scale_off[w], (size_t)rows * (kv_dim / p.g.qb) * 2);
                } else {
                    memcpy(hdst, hs, (size_t)rows * kv_dim * 2);
                }
            }
    assert_memory_equal(got, pool, p.pool_bytes);
    cudaFree(d_pool); cudaFree(d_tab); cudaFree(d_pos); cudaFree(d_item); cudaFree(d_src);
    free(src); free(pool); free(got);
}

static void test_write_and_copy(void **state)
{
    (void)state;
    const int shapes[][4] = { { 2, 16, 4, 8 }, { 3, 7, 2, 16 }, { 2, 16, 4, 32 }, { 2, 5, 2, 64 },
                              { 1, 16, 2, 128 }, { 1, 3, 1, 256 }, { 2, 2, 3, 24 } }; /* layers, bs (>= 2), nkv, hd */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int kq = 0; kq < 2; kq++)
            for (int vq = 0; vq < 2; vq++)
                write_case(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], kq, vq);
}

/* ---- attention ----------------------------------------------------------------------- */


/* Softmax over positions 0..p of scale * q.k, times V, in double over the
 * values the cache holds (host_value). */
static void attn_ref(double *out, const float *q, const pool_geom *g, uint8_t *pool, int layer,
                     const int32_t *table, int p, int kvh, double scale)
{
    const int hd = g->hd;
    double *sc = malloc(sizeof(double) * (size_t)(p + 1));
    double mx = -INFINITY;
    for (int j = 0; j <= p; j++) {
        double s = 0;
        for (int i = 0; i < hd; i++)
            s += (double)q[i] * host_value(g, pool, table[j / g->bs], layer, 0, j % g->bs, kvh * hd + i);
        sc[j] = s * scale;
        if (sc[j] > mx) mx = sc[j];
    }
    double sum = 0;
    for (int j = 0; j <= p; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
    for (int i = 0; i < hd; i++) out[i] = 0;
    for (int j = 0; j <= p; j++)
        for (int i = 0; i < hd; i++)
            out[i] += sc[j] / sum * host_value(g, pool, table[j / g->bs], layer, 1, j % g->bs, kvh * hd + i);
    free(sc);
}

/* Attention of the items (decode items, n == 1, through the decode kernel
 * with the engine's split scheme; the rest through the prefill kernel) over
 * a cache of the given types made from the same FP32 rows; the output as
 * FP32 into res ([T][q_dim]). Checks it against the reference over the
 * cache's own values within FP16_REL + TIGHT_ABS. Returns T. */
static int attn_run(const attn_shape *sh, const attn_item *items, int n_items, int ctx, int kq, int vq,
                    uint64_t seed, float **res)
{
    g_rng = seed; /* the same rows, queries and tables whatever the types */
    const int layer = 1, n_layers = 2;
    const int q_dim = sh->nh * sh->hd, kv_dim = sh->nkv * sh->hd;
    const int q_ld = q_dim + 2 * kv_dim;
    const int max_blocks = (ctx + sh->bs - 1) / sh->bs, n_blocks = n_items * max_blocks + 3;
    pool_geom g = pgeom(n_layers, sh->bs, kv_dim, sh->hd, kq, vq, n_blocks, max_blocks);
    int32_t *tables = random_tables(n_blocks, n_items * max_blocks);
    uint8_t *pool = calloc(1, g.pool_bytes);
    float *row = malloc(sizeof(float) * kv_dim);
    for (int b = 0; b < n_blocks; b++)
        for (int l = 0; l < n_layers; l++)
            for (int w = 0; w < 2; w++)
                for (int r = 0; r < sh->bs; r++) {
                    for (int i = 0; i < kv_dim; i++) row[i] = urand(1.0f);
                    host_store(&g, pool, b, l, w, r, row);
                }
    const int T = attn_tokens(items, n_items);
    float *q = malloc(sizeof(float) * (size_t)T * q_ld);
    for (size_t i = 0; i < (size_t)T * q_ld; i++) q[i] = urand(2.0f);
    uint8_t *d_pool = dup_to_dev(pool, g.pool_bytes);
    int32_t *d_tab = dup_to_dev(tables, sizeof(int32_t) * (size_t)n_items * max_blocks);
    dol_cuda_kv kv = { d_pool, g.g, layer, sh->bs, kv_dim, d_tab, max_blocks };
    int32_t *pos, *item;
    dol_f16 *out = attn_launch(sh, items, n_items, ctx, q, q_ld, kv, &pos, &item);
    const float scale = 1.0f / sqrtf((float)sh->hd);

    double *ref = malloc(sizeof(double) * sh->hd), worst = 0;
    *res = malloc(sizeof(float) * (size_t)T * q_dim);
    const int group = sh->nh / sh->nkv;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < sh->nh; h++) {
            attn_ref(ref, q + (size_t)t * q_ld + (size_t)h * sh->hd, &g, pool, layer,
                     tables + (size_t)item[t] * max_blocks, pos[t], h / group, scale);
            for (int i = 0; i < sh->hd; i++) {
                const size_t at = (size_t)t * q_dim + (size_t)h * sh->hd + i;
                const double v = dol_f16_to_f32(out[at]), e = fabs(v - ref[i]);
                (*res)[at] = (float)v;
                if (e > worst) worst = e;
                if (!(e <= FP16_REL * fabs(ref[i]) + TIGHT_ABS))
                    fail_msg("attention k=%s v=%s nh=%d nkv=%d hd=%d bs=%d t=%d pos=%d h=%d [%d]: got %.8g, "
                             "reference %.8g", kq ? "q8_0" : "f16", vq ? "q8_0" : "f16", sh->nh, sh->nkv, sh->hd,
                             sh->bs, t, pos[t], h, i, v, ref[i]);
            }
        }
    printf("attention k=%-4s v=%-4s nh=%d nkv=%d hd=%3d: largest |out - reference| %.3g\n", kq ? "q8_0" : "f16",
           vq ? "q8_0" : "f16", sh->nh, sh->nkv, sh->hd, worst);
    cudaFree(d_pool); cudaFree(d_tab);
    free(tables); free(pool); free(row); free(q); free(pos); free(item); free(out); free(ref);
    return T;
}

/* Every combination of the halves' types on head dimensions of each Q8_0
 * block shape (8, 16: the whole head; 32, 128, 256: blocks of 32), decode
 * tokens across block and split boundaries and prefill chunks in one call:
 * each against its own reference (tight), the Q8_0 ones also against the
 * F16 cache of the same rows (loose). */
static void test_attention(void **state)
{
    (void)state;
    const attn_shape shapes[] = { { 8, 4, 8, 16 }, { 8, 4, 16, 16 }, { 4, 2, 32, 16 }, { 4, 2, 128, 32 },
                                  { 2, 1, 256, 16 } };
    const attn_item items[] = { { 0, 1 }, { 15, 1 }, { 64, 1 }, { 200, 1 }, { 0, 5 }, { 16, 20 }, { 3, 9 },
                                { 60, 12 } };
    const int n_items = (int)(sizeof items / sizeof *items);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const uint64_t seed = 0xA5A5A5A5ull + s;
        float *f16 = NULL;
        const int T = attn_run(&shapes[s], items, n_items, 256, 0, 0, seed, &f16);
        const size_t n = (size_t)T * shapes[s].nh * shapes[s].hd;
        for (int c = 1; c < 4; c++) {
            float *q8 = NULL;
            attn_run(&shapes[s], items, n_items, 256, c >> 1, c & 1, seed, &q8);
            double d = 0;
            for (size_t i = 0; i < n; i++) d = fabs(q8[i] - f16[i]) > d ? fabs(q8[i] - f16[i]) : d;
            printf("  against the F16 cache: largest difference %.3g (bound %.2g)\n", d, LOOSE_ABS);
            assert_true(d <= LOOSE_ABS);
            free(q8);
        }
        free(f16);
    }
}

/* A Q8_0 cache of a head dimension that is neither below 32 nor a multiple
 * of 32 cannot be addressed: the attention launchers refuse it. */
static void test_refused(void **state)
{
    (void)state;
    dol_cuda_kv kv = { 0 };
    kv.g = dol_cuda_kv_geom_of(1, 16, 2 * 40, 40, 1, 1); /* qb 32 does not divide 40 */
    kv.kv_dim = 80;
    kv.block_size = 16;
    assert_int_equal(dol_cuda_attention_decode(NULL, 0, NULL, 0, NULL, 1, NULL, NULL, 2, 2, 40, 1.0f, kv, NULL, 1, 64, 0),
                     cudaErrorInvalidValue);
    assert_int_equal(dol_cuda_attention_prefill(NULL, 0, NULL, 0, NULL, 1, 2, 2, 40, 1.0f, kv, 0),
                     cudaErrorInvalidValue);
    assert_int_equal(dol_cuda_kv_write(kv, NULL, 0, 0, 0, NULL, NULL, 1, 0), cudaErrorInvalidValue);
}

int main(void)
{
    char why[256];
    if (!dol_cuda_device_check(why, sizeof why)) {
        printf("test_cuda_kvq8: no usable CUDA device (%s); skipping\n", why);
#ifdef DOLPHIN_CUDA_EMU
        return 1;
#else
        return 77;
#endif
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_write_and_copy),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
