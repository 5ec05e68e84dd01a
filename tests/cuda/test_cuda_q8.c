/* tests/cuda/test_cuda_q8.c — Q8_0 (int8) weights on CUDA (kernels/q8.cu and
 * the CUDA backend with weights int8) against the CPU Q8_0 reference
 * (src/engine/q8.c, dol_cpu_matmul_q8, the CPU backend), as
 * test_cuda_nf4.c does for NF4 and with its bounds (derived there; the same
 * FP32 chains and FP16 rounding points apply with 32-weight blocks). Exits
 * 77 (skipped) without a usable CUDA device; the model test skips without
 * the fixtures (../shared, env DOLPHIN_SHARED).
 *
 * The products, on random matrices quantized by dol_q8_quantize (blocks of
 * very different scales, all-zero blocks), on odd shapes (K a multiple of
 * 32 and not: short last blocks, K = 1, 3, 33, 97, 172), T = 1, 2, 3, 8, 16
 * (decode kernel) and 17, 33 (dequantized tiles + cuBLAS), element-wise
 * against the exact product in double of the same FP16 x and the exact
 * dequantized weights, and against dol_cpu_matmul_q8 on the FP32 x within
 * NORM_REL of the output's norm; the decode kernel's rows bit-identical
 * whatever T; the dequantization bit for bit (dol_cuda_q8_dequant ==
 * dol_f32_to_f16 of dol_q8_dequantize_row). The model: stories260K with
 * weights int8 on the CPU and on CUDA (lm_head int8 too: the default, kept,
 * runs in test_cuda_quant_golden; up to 64 greedy ids per case, as the
 * emulation is slow): logits
 * after the prompt within LOGIT_BOUND, greedy ids equal up to the first
 * step where the CPU's margin is below 2 * LOGIT_BOUND, every position of a
 * teacher-forced pass within ECHO_BOUND.
 *
 * The tests themselves are tests/cuda/quant_products.h's, shared with
 * test_cuda_nf4.c; this file gives the scheme (quantizer, kernels, shapes,
 * bounds).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/q8.h"
#include "quant_products.h"

static void q8_quantize(quant_mat *m, const float *src)
{
    const int N = m->N, K = m->K;
    dol_q8_matrix *h = calloc(1, sizeof *h);
    dol_cuda_q8 *d = calloc(1, sizeof *d);
    dol_tensor t = { DOL_DTYPE_F32, N, K, (void *)src };
    h->quants = malloc(dol_q8_quants_bytes(N, K));
    h->scales = malloc(dol_q8_scales_bytes(N, K));
    char err[DOL_ERR_LEN];
    if (dol_q8_quantize(NULL, &t, h, "test matrix", err, sizeof err) != 0) fail_msg("%s", err);
    m->w = malloc(sizeof(float) * (size_t)N * K);
    for (int r = 0; r < N; r++) dol_q8_dequantize_row(h, r, m->w + (size_t)r * K);
    d->quants = dup_to_dev(h->quants, dol_q8_quants_bytes(N, K));
    d->scales = dup_to_dev(h->scales, dol_q8_scales_bytes(N, K));
    d->rows = N;
    d->cols = K;
    m->h = h;
    m->d = d;
}

static void q8_free(quant_mat *m)
{
    dol_q8_matrix *h = m->h;
    dol_cuda_q8 *d = m->d;
    cudaFree((void *)d->quants);
    cudaFree((void *)d->scales);
    free(h->quants);
    free(h->scales);
    free(h);
    free(d);
    free(m->w);
}

static void q8_cpu_matmul(float *out, const float *x, int T, const void *h)
{
    dol_cpu_matmul_q8(NULL, out, x, T, h);
}
static int q8_matmul(cublasHandle_t blas, float *out, const dol_f16 *x, int T, const void *d,
                     dol_f16 *ws, size_t ws_elems, cudaStream_t stream, char *err, size_t errlen)
{
    return dol_cuda_q8_matmul(blas, out, x, T, d, ws, ws_elems, stream, err, errlen);
}
static cudaError_t q8_gemv(float *out, const dol_f16 *x, int T, const void *d, cudaStream_t stream)
{
    return dol_cuda_q8_gemv(out, x, T, d, stream);
}
static cudaError_t q8_dequant(dol_f16 *w, const void *d, int row0, int rows, cudaStream_t stream)
{
    return dol_cuda_q8_dequant(w, d, row0, rows, stream);
}

int main(void)
{
    static const quant_shape shapes[] = {
        { 1, 32 },  { 130, 64 }, { 9, 4096 }, { 64, 172 }, { 33, 96 }, { 5, 3 },
        { 9, 4097 }, { 7, 1 },   { 13, 33 }, { 11, 97 },
    };
    static const quant_shape dequant_shapes[] = { { 37, 64 }, { 16, 4096 }, { 64, 172 }, { 7, 97 }, { 3, 1 } };
    static const quant_scheme q8 = {
        .name = "int8", .test = "test_cuda_q8", .block = DOL_Q8_BLOCK,
        .gemv_upto = DOL_CUDA_Q8_GEMV_UPTO, .gemv_max_t = DOL_CUDA_Q8_GEMV_MAX_T,
        .quantize = q8_quantize, .free_mat = q8_free, .cpu_matmul = q8_cpu_matmul,
        .matmul = q8_matmul, .gemv = q8_gemv, .dequant = q8_dequant,
        .shapes = shapes, .n_shapes = (int)(sizeof shapes / sizeof shapes[0]),
        .dequant_shapes = dequant_shapes,
        .n_dequant_shapes = (int)(sizeof dequant_shapes / sizeof dequant_shapes[0]),
        .weights = DOL_WEIGHTS_INT8, .max_ratio = 0.54,
        .max_new = 64,      /* the EMU run's budget; test_cuda_quant_golden goes further */
        .echo_tokens = 64,
        .f16_lm_head = false, /* lm_head int8 only (kept, the default, in test_cuda_quant_golden) */
    };
    return quant_test_main(&q8);
}
