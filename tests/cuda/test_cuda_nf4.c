/* tests/cuda/test_cuda_nf4.c — NF4 weights on CUDA (kernels/nf4.cu and the
 * CUDA backend with weights nf4) against the CPU NF4 reference
 * (src/engine/nf4.c, dol_cpu_matmul_nf4, the CPU backend). Exits 77 (skipped)
 * without a usable CUDA device; the model test skips without the fixtures
 * (../shared, env DOLPHIN_SHARED).
 *
 * The products, on random matrices quantized by dol_nf4_quantize (blocks of
 * very different scales, all-zero blocks), K a multiple of 64 and not (short
 * last blocks, K = 2), T = 1, 2, 3, 8, 16 (decode kernel) and 17, 33
 * (dequantized tiles + cuBLAS), element-wise against the exact product in
 * double of the same FP16 x and the exact dequantized weights, with
 * mag = sum_k |x_k w_k|:
 *   - decode kernel: |got - exact| <= GEMV_REL * mag. The kernel's FP32
 *     result is a chain of at most 64 + K/4096 + 10 roundings per term
 *     (a block's or chunk's partial sum, the per-thread accumulation, the
 *     warp and block reductions), each <= 2^-24 relative: < 6e-6 for
 *     K < 16384, so GEMV_REL = 1e-5 is a worst-case bound;
 *   - tiles: weights rounded to FP16 (<= 2^-11 relative, 2^-25 absolute
 *     below the FP16 normal range) and cuBLAS's FP32 accumulation in an
 *     unknown order (<= K * 2^-23 relative, truncating tensor-core adds
 *     included): |got - exact| <= (2^-11 + K * 2^-23) * mag + 2^-25 sum|x|.
 *     The dequantization itself is checked bit for bit (dol_cuda_nf4_dequant
 *     == dol_f32_to_f16 of dol_nf4_dequantize_row).
 * and, end to end, against dol_cpu_matmul_nf4 on the unrounded FP32 x: the
 * FP16 rounding of x (<= 2^-11 relative per element, about 1.5e-4 of the
 * norm for random data) and the path's own error stay within NORM_REL = 2e-3
 * of the Frobenius norm of the [T][N] output (checked when T * N >= 32: one
 * dot product alone can cancel to near zero, so its relative error has no
 * bound). The decode kernel's rows are bit-identical whatever T (each row is
 * computed the same way), and the generic kernel (misaligned x) meets the
 * same bound as the vectorized one.
 *
 * The model: stories260K (K = 172 in the down projection: short blocks) with
 * weights nf4 on the CPU and on CUDA, lm_head quantized and not. A host
 * emulation of the CUDA rounding points with NF4 weights (FP16 embedding,
 * product inputs and KV cache; exact NF4 weights in the decode kernel, FP16
 * in the tiles) against the CPU nf4 engine gave, over the four golden
 * prompts: largest logit difference after the prompt 0.0142, over every
 * position of a teacher-forced 36..96-token pass 0.0298, and identical
 * greedy ids at every step. Hence LOGIT_BOUND 0.03 for the logits after the
 * prompt, ECHO_BOUND 0.06 for the teacher-forced pass (96 rows: every
 * product through the tiles), and equal greedy ids up to the first step
 * where the CPU's margin between its best two logits is below
 * 2 * LOGIT_BOUND (both may move by the bound).
 *
 * The tests themselves are tests/cuda/quant_products.h's, shared with
 * test_cuda_q8.c; this file gives the scheme (quantizer, kernels, shapes)
 * and derives the bounds both use.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/nf4.h"
#include "quant_products.h"

static void nf4_quantize(quant_mat *m, const float *src)
{
    const int N = m->N, K = m->K;
    dol_nf4_matrix *h = calloc(1, sizeof *h);
    dol_cuda_nf4 *d = calloc(1, sizeof *d);
    dol_tensor t = { DOL_DTYPE_F32, N, K, (void *)src };
    h->codes = malloc(dol_nf4_codes_bytes(N, K));
    h->scales = malloc(dol_nf4_scales_bytes(N, K));
    char err[DOL_ERR_LEN];
    if (dol_nf4_quantize(NULL, &t, h, "test matrix", err, sizeof err) != 0) fail_msg("%s", err);
    m->w = malloc(sizeof(float) * (size_t)N * K);
    for (int r = 0; r < N; r++) dol_nf4_dequantize_row(h, r, m->w + (size_t)r * K);
    d->codes = dup_to_dev(h->codes, dol_nf4_codes_bytes(N, K));
    d->scales = dup_to_dev(h->scales, dol_nf4_scales_bytes(N, K));
    d->rows = N;
    d->cols = K;
    m->h = h;
    m->d = d;
}

static void nf4_free(quant_mat *m)
{
    dol_nf4_matrix *h = m->h;
    dol_cuda_nf4 *d = m->d;
    cudaFree((void *)d->codes);
    cudaFree((void *)d->scales);
    free(h->codes);
    free(h->scales);
    free(h);
    free(d);
    free(m->w);
}

static void nf4_cpu_matmul(float *out, const float *x, int T, const void *h)
{
    dol_cpu_matmul_nf4(NULL, out, x, T, h);
}
static int nf4_matmul(cublasHandle_t blas, float *out, const dol_f16 *x, int T, const void *d,
                      dol_f16 *ws, size_t ws_elems, cudaStream_t stream, char *err, size_t errlen)
{
    return dol_cuda_nf4_matmul(blas, out, x, T, d, ws, ws_elems, stream, err, errlen);
}
static cudaError_t nf4_gemv(float *out, const dol_f16 *x, int T, const void *d, cudaStream_t stream)
{
    return dol_cuda_nf4_gemv(out, x, T, d, stream);
}
static cudaError_t nf4_dequant(dol_f16 *w, const void *d, int row0, int rows, cudaStream_t stream)
{
    return dol_cuda_nf4_dequant(w, d, row0, rows, stream);
}

int main(void)
{
    static const quant_shape shapes[] = {
        { 1, 64 },  { 130, 64 }, { 67, 4096 }, { 24, 11008 }, { 64, 172 },
        { 33, 96 }, { 5, 2 },    { 9, 4098 },  { 300, 200 },
    };
    static const quant_shape dequant_shapes[] = { { 37, 64 }, { 16, 4096 }, { 64, 172 }, { 7, 98 }, { 3, 2 } };
    static const quant_scheme nf4 = {
        .name = "nf4", .test = "test_cuda_nf4", .block = DOL_NF4_BLOCK,
        .gemv_upto = DOL_CUDA_NF4_GEMV_UPTO, .gemv_max_t = DOL_CUDA_NF4_GEMV_MAX_T,
        .quantize = nf4_quantize, .free_mat = nf4_free, .cpu_matmul = nf4_cpu_matmul,
        .matmul = nf4_matmul, .gemv = nf4_gemv, .dequant = nf4_dequant,
        .shapes = shapes, .n_shapes = (int)(sizeof shapes / sizeof shapes[0]),
        .dequant_shapes = dequant_shapes,
        .n_dequant_shapes = (int)(sizeof dequant_shapes / sizeof dequant_shapes[0]),
        .weights = DOL_WEIGHTS_NF4, .max_ratio = 0.30, .max_new = 1024,
        .echo_tokens = 96,  /* 96 rows: every product through the tiles */
        .f16_lm_head = true,
    };
    return quant_test_main(&nf4);
}
