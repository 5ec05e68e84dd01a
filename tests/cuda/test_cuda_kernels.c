/* tests/cuda/test_cuda_kernels.c — every CUDA kernel family (kernels/) against
 * its CPU reference (engine/cpu_ops.h, or a plain host loop in double) on
 * random inputs of several shapes. Each test states its error bound next to
 * the comparison. Exits 77 (skipped) when no usable CUDA device is present. */
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

#include "dolphin/model.h"
#include "engine/backend.h"
#include "engine/cpu_ops.h"
#include "kernels/kernels.h"

#define CUDA_TEST_SEED 0x9E3779B97F4A7C15ull
#include "cuda_test_util.h"

/* ---- helpers ------------------------------------------------------------- */

static float h2f(dol_f16 h) { return dol_f16_to_f32(h); }
static dol_f16 f2h(float f) { return dol_f32_to_f16(f); }

/* |got - want| <= rel * |want| + abs, else fail naming the element */
static void check_close(const char *what, size_t i, double got, double want, double rel, double abs_)
{
    double bound = rel * fabs(want) + abs_;
    if (!(fabs(got - want) <= bound))
        fail_msg("%s[%zu]: got %.8g, want %.8g (|diff| %.3g > bound %.3g)", what, i, got, want,
                 fabs(got - want), bound);
}

/* one FP16 rounding is at most 2^-11 relative; allow one more FP16 ulp
 * (2^-10) for an FP32 input that differs in its last bits, plus the smallest
 * FP16 subnormal (2^-24) as absolute floor */
#define FP16_REL 9.765625e-4
#define FP16_ABS 5.9604645e-8

/* ---- embedding ------------------------------------------------------------ */

/* FP16 -> FP32 is exact: bit-identical to dol_cpu_embed_row. */
static void test_embedding(void **state)
{
    (void)state;
    const int shapes[][3] = { { 512, 64, 7 }, { 32000, 128, 33 }, { 1000, 4096, 5 } }; /* V, d, T */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int V = shapes[s][0], d = shapes[s][1], T = shapes[s][2];
        dol_f16 *tab = malloc(sizeof(dol_f16) * (size_t)V * d);
        for (size_t i = 0; i < (size_t)V * d; i++) tab[i] = f2h(urand(1.0f));
        int32_t ids[64];
        for (int t = 0; t < T; t++) ids[t] = t == 0 ? V - 1 : irand(V);
        dol_f16 *d_tab = dup_to_dev(tab, sizeof(dol_f16) * (size_t)V * d);
        int32_t *d_ids = dup_to_dev(ids, sizeof(int32_t) * T);
        float *d_x = dmalloc(sizeof(float) * (size_t)T * d);
        CK(dol_cuda_embedding(d_x, d_tab, d_ids, T, d, 0));
        float *x = malloc(sizeof(float) * (size_t)T * d), *ref = malloc(sizeof(float) * d);
        to_host(x, d_x, sizeof(float) * (size_t)T * d);
        dol_tensor tt = { DOL_DTYPE_F16, V, d, tab };
        for (int t = 0; t < T; t++) {
            dol_cpu_embed_row(ref, &tt, ids[t]);
            assert_memory_equal(x + (size_t)t * d, ref, sizeof(float) * d);
        }
        cudaFree(d_tab); cudaFree(d_ids); cudaFree(d_x);
        free(tab); free(x); free(ref);
    }
}

/* ---- RMSNorm + residual ------------------------------------------------------- */

/* x after the add: bit-identical (one FP32 addition). y: dol_cpu_rmsnorm of
 * that x, then FP16: within FP16_REL relative (+ FP16_ABS). */
static void test_rmsnorm_residual(void **state)
{
    (void)state;
    const int shapes[][2] = { { 1, 64 }, { 7, 4096 }, { 33, 5120 }, { 3, 100 }, { 5, 8192 } }; /* rows, d */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        for (int variant = 0; variant < 3; variant++) { /* 0: no delta, 1: delta, 2: delta + row map */
            int N = shapes[s][0], d = shapes[s][1];
            size_t n = (size_t)N * d;
            float *x = malloc(sizeof(float) * n), *dl = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * d);
            for (size_t i = 0; i < n; i++) { x[i] = urand(3.0f); dl[i] = urand(1.0f); }
            for (int i = 0; i < d; i++) w[i] = 0.5f + urand(0.5f);
            int32_t rows[64];
            int R = N;
            if (variant == 2) { /* the last rows first, every other row */
                R = 0;
                for (int r = N - 1; r >= 0; r -= 2) rows[R++] = r;
            }
            float *d_x = dup_to_dev(x, sizeof(float) * n), *d_dl = dup_to_dev(dl, sizeof(float) * n);
            float *d_w = dup_to_dev(w, sizeof(float) * d);
            int32_t *d_rows = variant == 2 ? dup_to_dev(rows, sizeof(int32_t) * R) : NULL;
            dol_f16 *d_y = dmalloc(sizeof(dol_f16) * (size_t)R * d);
            CK(dol_cuda_rmsnorm_residual(d_y, d_x, variant ? d_dl : NULL, d_w, d_rows, R, d, 1e-5f, 0));
            float *xg = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * d);
            dol_f16 *y = malloc(sizeof(dol_f16) * (size_t)R * d);
            to_host(xg, d_x, sizeof(float) * n);
            to_host(y, d_y, sizeof(dol_f16) * (size_t)R * d);
            for (int r = 0; r < R; r++) {
                int i = variant == 2 ? rows[r] : r;
                float *xr = x + (size_t)i * d;
                if (variant) for (int k = 0; k < d; k++) xr[k] += dl[(size_t)i * d + k];
                assert_memory_equal(xg + (size_t)i * d, xr, sizeof(float) * d);
                dol_cpu_rmsnorm(ref, xr, w, d, 1e-5f);
                for (int k = 0; k < d; k++)
                    check_close("rmsnorm y", (size_t)r * d + k, h2f(y[(size_t)r * d + k]), ref[k], FP16_REL, FP16_ABS);
            }
            if (variant == 2) /* rows outside the map keep x as it was */
                for (int i = N - 2; i >= 0; i -= 2)
                    assert_memory_equal(xg + (size_t)i * d, x + (size_t)i * d, sizeof(float) * d);
            cudaFree(d_x); cudaFree(d_dl); cudaFree(d_w); cudaFree(d_y);
            if (d_rows) cudaFree(d_rows);
            free(x); free(dl); free(w); free(xg); free(ref); free(y);
        }
    }
}

/* ---- RoPE --------------------------------------------------------------------- */

static void rope_tables(int ctx, int hd, double theta, float **cs, float **sn)
{
    int half = hd / 2;
    *cs = malloc(sizeof(float) * (size_t)ctx * half);
    *sn = malloc(sizeof(float) * (size_t)ctx * half);
    for (int p = 0; p < ctx; p++)
        for (int i = 0; i < half; i++) {
            double a = p * pow(theta, -2.0 * i / hd);
            (*cs)[(size_t)p * half + i] = (float)cos(a);
            (*sn)[(size_t)p * half + i] = (float)sin(a);
        }
}

/* q and k heads rotated in place; v untouched. The kernel avoids FMA
 * contraction, so it matches dol_cpu_rope to rounding: bound 1e-6 of the
 * pair's magnitude (|a| + |b|), i.e. a few FP32 ulps. */
static void test_rope(void **state)
{
    (void)state;
    const int shapes[][4] = { { 5, 8, 4, 8 }, { 9, 32, 32, 128 }, { 3, 32, 8, 128 }, { 4, 8, 4, 16 } }; /* T, nh, nkv, hd */
    const int ctx = 4096;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s][0], nh = shapes[s][1], nkv = shapes[s][2], hd = shapes[s][3];
        int ld = (nh + 2 * nkv) * hd;
        float *cs, *sn;
        rope_tables(ctx, hd, 10000.0, &cs, &sn);
        float *x = malloc(sizeof(float) * (size_t)T * ld);
        for (size_t i = 0; i < (size_t)T * ld; i++) x[i] = urand(2.0f);
        int32_t pos[16];
        for (int t = 0; t < T; t++) pos[t] = t == 0 ? ctx - 1 : irand(ctx);
        float *d_x = dup_to_dev(x, sizeof(float) * (size_t)T * ld);
        float *d_cs = dup_to_dev(cs, sizeof(float) * (size_t)ctx * hd / 2);
        float *d_sn = dup_to_dev(sn, sizeof(float) * (size_t)ctx * hd / 2);
        int32_t *d_pos = dup_to_dev(pos, sizeof(int32_t) * T);
        CK(dol_cuda_rope(d_x, ld, d_pos, T, nh, nkv, hd, d_cs, d_sn, 0));
        float *got = malloc(sizeof(float) * (size_t)T * ld), *ref = malloc(sizeof(float) * (size_t)T * ld);
        to_host(got, d_x, sizeof(float) * (size_t)T * ld);
        memcpy(ref, x, sizeof(float) * (size_t)T * ld);
        int half = hd / 2;
        for (int t = 0; t < T; t++) {
            float *row = ref + (size_t)t * ld;
            dol_cpu_rope(row, nh, hd, cs + (size_t)pos[t] * half, sn + (size_t)pos[t] * half);
            dol_cpu_rope(row + (size_t)nh * hd, nkv, hd, cs + (size_t)pos[t] * half, sn + (size_t)pos[t] * half);
            const float *in = x + (size_t)t * ld;
            for (int i = 0; i < ld; i++) {
                double mag;
                if (i < (nh + nkv) * hd) {
                    int j = i % hd, base = i - j;
                    int pj = j < half ? j + half : j - half;
                    mag = fabs(in[i]) + fabs(in[base + pj]);
                } else {
                    mag = 0; /* v: untouched, exactly */
                }
                check_close("rope", (size_t)t * ld + i, got[(size_t)t * ld + i], row[i], 0, 1e-6 * mag);
            }
        }
        cudaFree(d_x); cudaFree(d_cs); cudaFree(d_sn); cudaFree(d_pos);
        free(cs); free(sn); free(x); free(got); free(ref);
    }
}

/* ---- paged KV cache: write and copy ---------------------------------------------- */

typedef struct {
    int n_layers, bs, kv_dim, n_blocks, max_blocks;
    size_t block_elems, pool_elems;
} kv_geom;

static kv_geom geom(int n_layers, int bs, int kv_dim, int n_blocks, int max_blocks)
{
    kv_geom g = { n_layers, bs, kv_dim, n_blocks, max_blocks, 0, 0 };
    g.block_elems = (size_t)n_layers * 2 * bs * kv_dim;
    g.pool_elems = g.block_elems * n_blocks;
    return g;
}
static size_t kv_off(const kv_geom *g, int32_t block, int layer, int w, int row)
{
    return (size_t)block * g->block_elems + ((size_t)(layer * 2 + w) * g->bs + row) * g->kv_dim;
}

/* K/V rows: fp16 of the FP32 input, bit-identical to dol_f32_to_f16 (both
 * round to nearest even); every other value of the pool untouched. Block
 * copy: the first `rows` rows of all layers equal, the rest untouched. */
static void test_kv_write_and_copy(void **state)
{
    (void)state;
    kv_geom g = geom(3, 16, 64, 12, 6);
    const int layer = 1, T = 9, ld = 256, k_off = 64, v_off = 128;
    /* two sequences over shuffled blocks */
    int32_t tables[2 * 6] = { 7, 2, 11, 0, 5, 9, /**/ 3, 8, 1, 10, 4, 6 };
    int32_t pos[9] = { 0, 15, 16, 17, 95, 3, 31, 32, 80 }, item[9] = { 0, 0, 0, 0, 0, 1, 1, 1, 1 };
    float *src = malloc(sizeof(float) * T * ld);
    for (int i = 0; i < T * ld; i++) src[i] = urand(70000.0f) * (i % 3 == 0 ? 1e-4f : 1.0f); /* incl. > 65504: inf */
    dol_f16 *pool = malloc(sizeof(dol_f16) * g.pool_elems);
    for (size_t i = 0; i < g.pool_elems; i++) pool[i] = (dol_f16)(0x3c00 + (i % 977)); /* a pattern */
    dol_f16 *d_pool = dup_to_dev(pool, sizeof(dol_f16) * g.pool_elems);
    int32_t *d_tab = dup_to_dev(tables, sizeof tables), *d_pos = dup_to_dev(pos, sizeof pos);
    int32_t *d_item = dup_to_dev(item, sizeof item);
    float *d_src = dup_to_dev(src, sizeof(float) * T * ld);
    dol_cuda_kv kv = { (uint8_t *)d_pool, dol_cuda_kv_geom_of(g.n_layers, g.bs, g.kv_dim, 16, 0, 0), layer, g.bs,
                       g.kv_dim, d_tab, g.max_blocks };
    CK(dol_cuda_kv_write(kv, d_src, ld, k_off, v_off, d_pos, d_item, T, 0));
    dol_f16 *got = malloc(sizeof(dol_f16) * g.pool_elems);
    to_host(got, d_pool, sizeof(dol_f16) * g.pool_elems);
    for (int t = 0; t < T; t++) { /* expected pool: the pattern with the rows written */
        int32_t b = tables[item[t] * g.max_blocks + pos[t] / g.bs];
        for (int i = 0; i < g.kv_dim; i++) {
            pool[kv_off(&g, b, layer, 0, pos[t] % g.bs) + i] = f2h(src[t * ld + k_off + i]);
            pool[kv_off(&g, b, layer, 1, pos[t] % g.bs) + i] = f2h(src[t * ld + v_off + i]);
        }
    }
    assert_memory_equal(got, pool, sizeof(dol_f16) * g.pool_elems);

    /* copy the first 5 rows of block 7 to block 4, then 16 rows (a whole block) of 2 to 6 */
    CK(dol_cuda_kv_copy_block(&kv, g.n_layers, 7, 4, 5, 0));
    CK(dol_cuda_kv_copy_block(&kv, g.n_layers, 2, 6, 16, 0));
    to_host(got, d_pool, sizeof(dol_f16) * g.pool_elems);
    for (int l = 0; l < g.n_layers; l++)
        for (int w = 0; w < 2; w++) {
            memcpy(pool + kv_off(&g, 4, l, w, 0), pool + kv_off(&g, 7, l, w, 0), sizeof(dol_f16) * 5 * g.kv_dim);
            memcpy(pool + kv_off(&g, 6, l, w, 0), pool + kv_off(&g, 2, l, w, 0), sizeof(dol_f16) * 16 * g.kv_dim);
        }
    assert_memory_equal(got, pool, sizeof(dol_f16) * g.pool_elems);
    cudaFree(d_pool); cudaFree(d_tab); cudaFree(d_pos); cudaFree(d_item); cudaFree(d_src);
    free(src); free(pool); free(got);
}

/* ---- SiLU · up ------------------------------------------------------------------ */

/* dol_cpu_silu_mul then FP16: within FP16_REL relative (+ FP16_ABS); the GPU
 * expf may differ from the host's by an FP32 ulp or two. */
static void test_silu_mul(void **state)
{
    (void)state;
    const int shapes[][2] = { { 1, 172 }, { 7, 344 }, { 4, 11008 }, { 3, 1 } }; /* T, f */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s][0], f = shapes[s][1];
        float *gu = malloc(sizeof(float) * (size_t)T * 2 * f);
        for (size_t i = 0; i < (size_t)T * 2 * f; i++) gu[i] = urand(8.0f);
        float *d_gu = dup_to_dev(gu, sizeof(float) * (size_t)T * 2 * f);
        dol_f16 *d_out = dmalloc(sizeof(dol_f16) * (size_t)T * f);
        CK(dol_cuda_silu_mul(d_out, d_gu, T, f, 0));
        dol_f16 *out = malloc(sizeof(dol_f16) * (size_t)T * f);
        float *ref = malloc(sizeof(float) * f);
        to_host(out, d_out, sizeof(dol_f16) * (size_t)T * f);
        for (int t = 0; t < T; t++) {
            dol_cpu_silu_mul(ref, gu + (size_t)t * 2 * f, gu + (size_t)t * 2 * f + f, f);
            for (int i = 0; i < f; i++)
                check_close("silu_mul", (size_t)t * f + i, h2f(out[(size_t)t * f + i]), ref[i], FP16_REL, FP16_ABS);
        }
        cudaFree(d_gu); cudaFree(d_out);
        free(gu); free(out); free(ref);
    }
}

/* ---- attention -------------------------------------------------------------------- */



/* Reference: for query row t (item it, position p, head h), the softmax over
 * positions 0..p of scale * q.k, times V, in double over the FP16 cache. */
static void attn_ref(double *out, const float *q, const dol_f16 *pool, const kv_geom *g, int layer,
                     const int32_t *table, int p, int kvh, int hd, double scale)
{
    double *sc = malloc(sizeof(double) * (size_t)(p + 1));
    double mx = -INFINITY;
    for (int j = 0; j <= p; j++) {
        const dol_f16 *k = pool + kv_off(g, table[j / g->bs], layer, 0, j % g->bs) + (size_t)kvh * hd;
        double s = 0;
        for (int i = 0; i < hd; i++) s += (double)q[i] * h2f(k[i]);
        sc[j] = s * scale;
        if (sc[j] > mx) mx = sc[j];
    }
    double sum = 0;
    for (int j = 0; j <= p; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
    for (int i = 0; i < hd; i++) out[i] = 0;
    for (int j = 0; j <= p; j++) {
        const dol_f16 *v = pool + kv_off(g, table[j / g->bs], layer, 1, j % g->bs) + (size_t)kvh * hd;
        for (int i = 0; i < hd; i++) out[i] += sc[j] / sum * h2f(v[i]);
    }
    free(sc);
}

/* One attention case: items laid out as consecutive token rows; decode
 * items (n == 1) through dol_cuda_attention_decode with the engine's split
 * scheme, longer ones through dol_cuda_attention_prefill with the engine's
 * tiles. Bound: FP16 rounding of the output (FP16_REL relative) plus 1e-4
 * absolute (V is in [-1, 1]; the FP32 softmax and sums are far closer). Rows
 * of the output the kernels do not own keep their pattern. */
static void attn_case(const attn_shape *sh, const attn_item *items, int n_items, int ctx)
{
    const int layer = 1, n_layers = 2;
    const int q_dim = sh->nh * sh->hd, kv_dim = sh->nkv * sh->hd;
    const int q_ld = q_dim + 2 * kv_dim; /* the engine's fused QKV rows */
    int max_blocks = (ctx + sh->bs - 1) / sh->bs;
    kv_geom g = geom(n_layers, sh->bs, kv_dim, n_items * max_blocks + 3, max_blocks);
    /* block tables: a random permutation of the pool */
    int32_t *tables = random_tables(g.n_blocks, n_items * max_blocks);
    dol_f16 *pool = malloc(sizeof(dol_f16) * g.pool_elems);
    for (size_t i = 0; i < g.pool_elems; i++) pool[i] = f2h(urand(1.0f));

    const int T = attn_tokens(items, n_items);
    float *q = malloc(sizeof(float) * (size_t)T * q_ld);
    for (size_t i = 0; i < (size_t)T * q_ld; i++) q[i] = urand(2.0f); /* peaky and flat heads alike */
    dol_f16 *d_pool = dup_to_dev(pool, sizeof(dol_f16) * g.pool_elems);
    int32_t *d_tab = dup_to_dev(tables, sizeof(int32_t) * (size_t)n_items * max_blocks);
    dol_cuda_kv kv = { (uint8_t *)d_pool, dol_cuda_kv_geom_of(n_layers, g.bs, kv_dim, sh->hd, 0, 0), layer, g.bs,
                       kv_dim, d_tab, max_blocks };
    float scale = 1.0f / sqrtf((float)sh->hd);
    int32_t *pos, *item;
    dol_f16 *out = attn_launch(sh, items, n_items, ctx, q, q_ld, kv, &pos, &item);

    double *ref = malloc(sizeof(double) * sh->hd);
    int group = sh->nh / sh->nkv;
    char what[128];
    for (int t = 0; t < T; t++)
        for (int h = 0; h < sh->nh; h++) {
            attn_ref(ref, q + (size_t)t * q_ld + (size_t)h * sh->hd, pool, &g, layer,
                     tables + (size_t)item[t] * max_blocks, pos[t], h / group, sh->hd, scale);
            snprintf(what, sizeof what, "attention nh=%d nkv=%d hd=%d bs=%d t=%d pos=%d h=%d", sh->nh, sh->nkv,
                     sh->hd, sh->bs, t, pos[t], h);
            for (int i = 0; i < sh->hd; i++)
                check_close(what, (size_t)i, h2f(out[(size_t)t * q_dim + (size_t)h * sh->hd + i]), ref[i], FP16_REL, 1e-4);
        }
    cudaFree(d_pool); cudaFree(d_tab);
    free(tables); free(pool); free(q); free(pos); free(item); free(out); free(ref);
}

/* Decode tokens at positions on both sides of block (16, 32) and split (64)
 * boundaries, the first position, and long contexts spanning many splits. */
static void test_attention_decode(void **state)
{
    (void)state;
    const attn_shape shapes[] = { { 8, 4, 8, 16 }, { 8, 4, 16, 16 }, { 4, 4, 64, 16 },
                                  { 32, 8, 128, 16 }, { 32, 32, 128, 32 }, { 4, 2, 256, 16 } };
    const attn_item items[] = { { 0, 1 }, { 15, 1 }, { 16, 1 }, { 63, 1 }, { 64, 1 }, { 65, 1 },
                                { 200, 1 }, { 1000, 1 }, { 1023, 1 } };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        attn_case(&shapes[s], items, (int)(sizeof items / sizeof *items), 1024);
    /* a context long enough for the split length to grow past 64 (5000 / 64 > 64) */
    const attn_shape big = { 8, 8, 128, 16 };
    const attn_item far[] = { { 4999, 1 }, { 4096, 1 }, { 127, 1 } };
    attn_case(&big, far, 3, 5000);
}

/* Prefill chunks: from position 0 and continuing earlier chunks, lengths
 * below, at and above the tile size, mixed with decode tokens in one call. */
static void test_attention_prefill(void **state)
{
    (void)state;
    const attn_shape shapes[] = { { 8, 4, 8, 16 }, { 8, 4, 16, 16 }, { 4, 4, 64, 32 },
                                  { 32, 8, 128, 16 }, { 32, 32, 128, 16 }, { 4, 2, 256, 16 } };
    const attn_item items[] = { { 0, 5 }, { 0, 37 }, { 16, 20 }, { 3, 2 }, { 100, 9 }, { 7, 1 },
                                { 250, 64 }, { 0, 8 } };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        attn_case(&shapes[s], items, (int)(sizeof items / sizeof *items), 512);
}

/* ---- sampling ------------------------------------------------------------------------ */

/* argmax: exactly the host loop's answer (ties to the lowest index, NaN
 * skipped); log-sum-exp: within 1e-5 relative of the double computation. */
static void test_sampling(void **state)
{
    (void)state;
    const int shapes[][2] = { { 1, 512 }, { 9, 32000 }, { 3, 7 }, { 2, 128256 } }; /* R, V */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int R = shapes[s][0], V = shapes[s][1];
        float *lg = malloc(sizeof(float) * (size_t)R * V);
        for (size_t i = 0; i < (size_t)R * V; i++) lg[i] = urand(10.0f);
        for (int r = 0; r < R; r++) {
            float *row = lg + (size_t)r * V;
            if (r % 3 == 1) { /* a tie for the maximum: the lower index wins */
                int a = irand(V), b = irand(V);
                row[a] = row[b] = 11.0f;
            }
            if (r % 3 == 2) row[irand(V)] = NAN;
        }
        float *d_lg = dup_to_dev(lg, sizeof(float) * (size_t)R * V);
        int32_t *d_idx = dmalloc(sizeof(int32_t) * R);
        float *d_val = dmalloc(sizeof(float) * R), *d_lse = dmalloc(sizeof(float) * R);
        CK(dol_cuda_argmax_rows(d_idx, d_val, d_lg, R, V, 0));
        CK(dol_cuda_logsumexp_rows(d_lse, d_lg, R, V, 0));
        int32_t idx[16];
        float val[16], lse[16];
        to_host(idx, d_idx, sizeof(int32_t) * R);
        to_host(val, d_val, sizeof(float) * R);
        to_host(lse, d_lse, sizeof(float) * R);
        for (int r = 0; r < R; r++) {
            const float *row = lg + (size_t)r * V;
            int b = -1;
            bool has_nan = false;
            for (int i = 0; i < V; i++) {
                if (isnan(row[i])) { has_nan = true; continue; }
                if (b < 0 || row[i] > row[b]) b = i;
            }
            assert_int_equal(idx[r], b);
            assert_true(val[r] == row[b]);
            if (!has_nan) {
                double m = -INFINITY, sum = 0;
                for (int i = 0; i < V; i++) if (row[i] > m) m = row[i];
                for (int i = 0; i < V; i++) sum += exp((double)row[i] - m);
                check_close("logsumexp", (size_t)r, lse[r], m + log(sum), 1e-5, 0);
            }
        }
        cudaFree(d_lg); cudaFree(d_idx); cudaFree(d_val); cudaFree(d_lse);
        free(lg);
    }
}

int main(void)
{
    char why[256];
    if (!dol_cuda_device_check(why, sizeof why)) {
        printf("test_cuda_kernels: no usable CUDA device (%s); skipping\n", why);
#ifdef DOLPHIN_CUDA_EMU
        return 1; /* the emulated device is always there: not finding it is a failure */
#else
        return 77;
#endif
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rmsnorm_residual),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_kv_write_and_copy),
        cmocka_unit_test(test_silu_mul),
        cmocka_unit_test(test_attention_decode),
        cmocka_unit_test(test_attention_prefill),
        cmocka_unit_test(test_sampling),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
