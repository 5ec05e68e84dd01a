/* kernels/quant_common.cuh — what the products over block-quantized weights
 * (kernels/nf4.cu, kernels/q8.cu) share; each scheme keeps its own decode of
 * the weights:
 *  - the shape of the decode kernels (DOL_QUANT_ROWS rows of W per thread
 *    block of DOL_QUANT_THREADS threads) and their fixed-order reduction
 *    (warp butterfly, then the warps in index order), which makes an output
 *    row independent of T;
 *  - the loads of one 16-byte chunk per row and of 4 FP16 inputs;
 *  - the host side: the dispatch on the token count, the grid of the
 *    dequantization kernels and the matmul driver (the decode kernel up to a
 *    row count, dequantized FP16 tiles and cuBLAS above).
 * No kernel launches here: the emulation rewrites launches in .cu files only. */
#ifndef DOLPHIN_QUANT_COMMON_CUH
#define DOLPHIN_QUANT_COMMON_CUH

#include <cublas_v2.h>

#include <type_traits>

#include "kernels/cuda_common.cuh"

#define DOL_QUANT_THREADS DOL_CUDA_QUANT_GEMV_THREADS /* threads per block of the decode kernels (4 warps) */
#define DOL_QUANT_WARPS (DOL_QUANT_THREADS / 32)
#define DOL_QUANT_ROWS 4      /* rows of W per block of the decode kernels */

/* a[r][t] = 0 for the DOL_QUANT_ROWS x T partial sums of a thread. */
template <int T>
__device__ __forceinline__ void dol_quant_zero(float (&a)[DOL_QUANT_ROWS][T])
{
#pragma unroll
    for (int r = 0; r < DOL_QUANT_ROWS; r++)
#pragma unroll
        for (int t = 0; t < T; t++) a[r][t] = 0.0f;
}

/* acc[r][t] = fmaf(s[r], sum[r][t], acc[r][t]): a block's scale multiplied in
 * once per row and token. */
template <int T>
__device__ __forceinline__ void dol_quant_scale_add(float (&acc)[DOL_QUANT_ROWS][T],
                                                    const float (&s)[DOL_QUANT_ROWS],
                                                    const float (&sum)[DOL_QUANT_ROWS][T])
{
#pragma unroll
    for (int r = 0; r < DOL_QUANT_ROWS; r++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[r][t] = fmaf(s[r], sum[r][t], acc[r][t]);
}

/* 16-byte chunk c of rows n0 .. n0 + DOL_QUANT_ROWS - 1 of the weights
 * (row_bytes bytes a row from w) into q, and the scale of block b of each
 * row (bpr blocks a row) into s; rows past N as zero chunks and zero scales:
 * computed, never stored. All loads are issued before any use. */
__device__ __forceinline__ void dol_quant_load_chunk(uint4 (&q)[DOL_QUANT_ROWS],
                                                     float (&s)[DOL_QUANT_ROWS], const void *w,
                                                     size_t row_bytes,
                                                     const __half *__restrict__ scales, int bpr,
                                                     int n0, int N, int c, int b)
{
#pragma unroll
    for (int r = 0; r < DOL_QUANT_ROWS; r++) {
        if (n0 + r < N) {
            const size_t row = (size_t)(n0 + r);
            q[r] = __ldg(reinterpret_cast<const uint4 *>(static_cast<const char *>(w) +
                                                         row * row_bytes) + c);
            s[r] = __half2float(scales[row * (size_t)bpr + (size_t)b]);
        } else {
            q[r] = make_uint4(0u, 0u, 0u, 0u);
            s[r] = 0.0f;
        }
    }
}

/* 32-bit word i (0..3) of a 16-byte chunk. */
__device__ __forceinline__ uint32_t dol_quant_word(const uint4 &q, int i)
{
    return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w;
}

/* xv[j] = float(p[j]), j = 0..3; p 8-byte aligned. */
__device__ __forceinline__ void dol_quant_load_x4(float (&xv)[4], const __half *p)
{
    union {
        uint2 u;
        __half2 h[2];
    } ux;
    ux.u = __ldg(reinterpret_cast<const uint2 *>(p));
    const float2 a = __half22float2(ux.h[0]), b = __half22float2(ux.h[1]);
    xv[0] = a.x;
    xv[1] = a.y;
    xv[2] = b.x;
    xv[3] = b.y;
}

/* xa[j] = float(p[j]) and xb[j] = float(p[off + j]), j = 0..3; both
 * 8-byte aligned, both loads issued before the conversions. */
__device__ __forceinline__ void dol_quant_load_x4x2(float (&xa)[4], float (&xb)[4],
                                                    const __half *p, int off)
{
    union {
        uint2 u;
        __half2 h[2];
    } ua, ub;
    ua.u = __ldg(reinterpret_cast<const uint2 *>(p));
    ub.u = __ldg(reinterpret_cast<const uint2 *>(p + off));
    const float2 a01 = __half22float2(ua.h[0]), a23 = __half22float2(ua.h[1]);
    const float2 b01 = __half22float2(ub.h[0]), b23 = __half22float2(ub.h[1]);
    xa[0] = a01.x;
    xa[1] = a01.y;
    xa[2] = a23.x;
    xa[3] = a23.y;
    xb[0] = b01.x;
    xb[1] = b01.y;
    xb[2] = b23.x;
    xb[3] = b23.y;
}

/* Reduce acc (per thread, DOL_QUANT_ROWS x T) over the block and write out
 * rows n0 .. n0 + DOL_QUANT_ROWS - 1 (those < N). Every thread must call it. */
template <int T>
__device__ __forceinline__ void dol_quant_store(const float (&acc)[DOL_QUANT_ROWS][T],
                                                float (*part)[DOL_QUANT_ROWS * T], float *out,
                                                int n0, int N)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < DOL_QUANT_ROWS; r++)
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float v = dol_warp_sum(acc[r][t]);
            if (lane == 0) part[warp][r * T + t] = v;
        }
    __syncthreads();
    for (int i = threadIdx.x; i < DOL_QUANT_ROWS * T; i += DOL_QUANT_THREADS) {
        const int r = i / T, t = i % T;
        float s = part[0][i];
        for (int w = 1; w < DOL_QUANT_WARPS; w++) s += part[w][i];
        if (n0 + r < N) out[(size_t)t * N + n0 + r] = s;
    }
}

/* ---- host side ------------------------------------------------------------ */

/* launch(std::integral_constant<int, T>()) for T = 1 .. 8 (the decode
 * kernels' instantiations; callers bound T by their GEMV_MAX_T of 8). */
template <typename Launch>
static cudaError_t dol_quant_by_rows(int T, Launch &&launch)
{
    switch (T) {
    case 1: return launch(std::integral_constant<int, 1>());
    case 2: return launch(std::integral_constant<int, 2>());
    case 3: return launch(std::integral_constant<int, 3>());
    case 4: return launch(std::integral_constant<int, 4>());
    case 5: return launch(std::integral_constant<int, 5>());
    case 6: return launch(std::integral_constant<int, 6>());
    case 7: return launch(std::integral_constant<int, 7>());
    default: return launch(std::integral_constant<int, 8>());
    }
}

/* Blocks of dol_cuda_cfg_dequant() threads for a grid-stride dequantization
 * kernel over n items. */
static inline unsigned dol_quant_dequant_blocks(size_t n)
{
    unsigned blocks = dol_div_up(n, dol_cuda_cfg_dequant().threads);
    if (blocks > 65535u * 8u) blocks = 65535u * 8u; /* grid-stride loop covers the rest */
    return blocks;
}

/* The matmul of a scheme with the output's row stride ldo (>= N):
 * out[t * ldo + n] = x[T][K] . dequant(W)^T, N rows and K columns of W.
 * T <= gemv_upto through gemv(out, x, nt) in launches of up to gemv_max_t
 * rows; more rows through tiles of ws_elems / K rows of W dequantized to FP16
 * in ws by dequant(ws, n0, nr) and cublasGemmEx (FP16 inputs, FP32
 * accumulation and output), tile after tile on the stream the launchers and
 * blas are bound to. 0, or -1 with one
 * line in err naming `scheme`. */
template <typename Gemv, typename Dequant>
static int dol_quant_matmul_ld(cublasHandle_t blas, float *out, int ldo, const dol_f16 *x, int T,
                               int N, int K, Gemv &&gemv, Dequant &&dequant, int gemv_upto,
                               int gemv_max_t, const char *scheme, dol_f16 *ws, size_t ws_elems,
                               char *err, size_t errlen)
{
    if (T <= 0 || N <= 0) return 0;
    if (T <= gemv_upto) {
        for (int t0 = 0; t0 < T; t0 += gemv_max_t) {
            const int nt = T - t0 < gemv_max_t ? T - t0 : gemv_max_t;
            CUDA_CHECK(gemv(out + (size_t)t0 * (size_t)ldo, x + (size_t)t0 * K, nt));
        }
        return 0;
    }
    const size_t tile = ws_elems / (size_t)K; /* rows of W per tile */
    if (!ws || tile == 0) {
        dol_set_err(err, errlen, "cuda: %s product of %d x %d needs a dequantization workspace "
                                 "of at least one row", scheme, N, K);
        return -1;
    }
    const int step = tile < (size_t)N ? (int)tile : N;
    const float alpha = 1.0f, beta = 0.0f;
    for (int n0 = 0; n0 < N; n0 += step) {
        const int nr = N - n0 < step ? N - n0 : step;
        CUDA_CHECK(dequant(ws, n0, nr));
        /* row-major out[:, n0 .. n0+nr) = x . tile^T, as the column-major
         * out^T rows n0.. = tile^T(nr x K) . x^T(K x T), ldc = ldo */
        CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, nr, T, K, &alpha, ws, CUDA_R_16F,
                                  K, x, CUDA_R_16F, K, &beta, out + n0, CUDA_R_32F, ldo,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return 0;
}

/* dol_quant_matmul_ld for a scheme's matrix type W (rows, cols) and its
 * launchers, with out [T][N] packed (ldo = N). */
template <typename W>
static int dol_quant_matmul(cublasHandle_t blas, float *out, const dol_f16 *x, int T, const W *w,
                            cudaError_t (*gemv)(float *, const dol_f16 *, int, const W *,
                                                cudaStream_t),
                            cudaError_t (*dequant)(dol_f16 *, const W *, int, int, cudaStream_t),
                            int gemv_upto, int gemv_max_t, const char *scheme, dol_f16 *ws,
                            size_t ws_elems, cudaStream_t stream, char *err, size_t errlen)
{
    return dol_quant_matmul_ld(
        blas, out, w->rows, x, T, w->rows, w->cols,
        [&](float *o, const dol_f16 *xt, int nt) { return gemv(o, xt, nt, w, stream); },
        [&](dol_f16 *t, int n0, int nr) { return dequant(t, w, n0, nr, stream); }, gemv_upto,
        gemv_max_t, scheme, ws, ws_elems, err, errlen);
}

#endif
