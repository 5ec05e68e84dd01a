/* kernels/q8.cu — matrix products over Q8_0 (int8) weights (the format of
 * src/engine/q8.h: blocks of 32 weights along the input dimension, a shorter
 * last block when K % 32 != 0, one F16 scale d per block, one int8 q per
 * weight, weight = q * d):
 *
 *   out[T][N] = x[T][K] . dequant(W)[N][K]^T     x FP16, out FP32
 *
 * Decode (dol_cuda_q8_gemv: T <= DOL_CUDA_Q8_GEMV_MAX_T rows per launch;
 * dol_cuda_q8_matmul uses it up to DOL_CUDA_Q8_GEMV_UPTO rows): one pass over
 * the quants, each byte read once from global memory and converted in
 * registers. A thread block owns Q8_ROWS rows of W and splits K among its
 * threads in 16-byte chunks (half a block: 16 weights). Per chunk and token
 * row it sums x * q in FP32 and multiplies the block's scale in once:
 * acc += d * sum(x * q). The partial sums of the threads are reduced in a
 * fixed order (warp butterfly, then the warps in index order), so an output
 * row does not depend on T or on the other rows of x: batch-invariant bit for
 * bit within this path.
 *
 * Prefill (more rows, inside dol_cuda_q8_matmul): tiles of W are dequantized
 * to FP16 into a workspace (dol_cuda_q8_dequant, weight = fp16(q * d): q * d
 * is exact in float, then rounded to nearest even) and multiplied with
 * cublasGemmEx (FP16 inputs, FP32 accumulation and output). The CPU
 * reference is dol_q8_dequantize_row (src/engine/q8.c); tests/cuda/
 * test_cuda_q8.c compares them. */
#include <cublas_v2.h>

#include "kernels/cuda_common.cuh"

#define Q8_THREADS 128 /* threads per block of the decode kernels (4 warps) */
#define Q8_WARPS (Q8_THREADS / 32)
#define Q8_ROWS 4      /* rows of W per block of the decode kernels */
#define Q8_BLOCK DOL_CUDA_Q8_BLOCK

/* Byte j of w as a signed value, in float. */
__device__ __forceinline__ float q8_byte(uint32_t w, int j)
{
    return (float)((int32_t)(w << (24 - 8 * j)) >> 24);
}

/* Reduce acc (per thread, Q8_ROWS x T) over the block and write out rows
 * n0 .. n0 + Q8_ROWS - 1 (those < N). Every thread must call it. */
template <int T>
__device__ __forceinline__ void q8_store(const float (&acc)[Q8_ROWS][T],
                                         float (*part)[Q8_ROWS * T], float *out, int n0, int N)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < Q8_ROWS; r++)
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float v = dol_warp_sum(acc[r][t]);
            if (lane == 0) part[warp][r * T + t] = v;
        }
    __syncthreads();
    for (int i = threadIdx.x; i < Q8_ROWS * T; i += Q8_THREADS) {
        const int r = i / T, t = i % T;
        float s = part[0][i];
        for (int w = 1; w < Q8_WARPS; w++) s += part[w][i];
        if (n0 + r < N) out[(size_t)t * N + n0 + r] = s;
    }
}

/* Decode kernel, vectorized: K % 32 == 0 (every block full), quants and x
 * 16-byte aligned. Thread i takes the 16-byte chunks c = i, i + Q8_THREADS,
 * ... of each of its rows: chunk c holds weights 16c .. 16c + 15, in block
 * c / 2. */
template <int T>
__global__ void __launch_bounds__(Q8_THREADS)
dol_q8_gemv_kernel(float *__restrict__ out, const __half *__restrict__ x,
                   const int8_t *__restrict__ quants, const __half *__restrict__ scales, int N, int K)
{
    __shared__ float part[Q8_WARPS][Q8_ROWS * T];
    const int n0 = blockIdx.x * Q8_ROWS;
    const int chunks = K / 16, bpr = K / Q8_BLOCK;
    float acc[Q8_ROWS][T];
#pragma unroll
    for (int r = 0; r < Q8_ROWS; r++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[r][t] = 0.0f;

    for (int c = threadIdx.x; c < chunks; c += Q8_THREADS) {
        const int b = c >> 1, k0 = c * 16;
        /* the chunk of every row first (all loads in flight); rows past N
         * as zero scales: computed, never stored */
        uint4 q[Q8_ROWS];
        float s[Q8_ROWS];
#pragma unroll
        for (int r = 0; r < Q8_ROWS; r++) {
            if (n0 + r < N) {
                const size_t row = (size_t)(n0 + r);
                q[r] = __ldg(reinterpret_cast<const uint4 *>(quants + row * (size_t)K) + c);
                s[r] = __half2float(scales[row * (size_t)bpr + (size_t)b]);
            } else {
                q[r] = make_uint4(0u, 0u, 0u, 0u);
                s[r] = 0.0f;
            }
        }
        float sum[Q8_ROWS][T];
#pragma unroll
        for (int r = 0; r < Q8_ROWS; r++)
#pragma unroll
            for (int t = 0; t < T; t++) sum[r][t] = 0.0f;
        /* word i of the chunk: weights k0 + 4i .. k0 + 4i + 3 */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float w[Q8_ROWS][4];
#pragma unroll
            for (int r = 0; r < Q8_ROWS; r++) {
                const uint32_t u = i == 0 ? q[r].x : i == 1 ? q[r].y : i == 2 ? q[r].z : q[r].w;
#pragma unroll
                for (int j = 0; j < 4; j++) w[r][j] = q8_byte(u, j);
            }
#pragma unroll
            for (int t = 0; t < T; t++) {
                union {
                    uint2 u;
                    __half2 h[2];
                } ux;
                ux.u = __ldg(reinterpret_cast<const uint2 *>(x + (size_t)t * (size_t)K + k0 + 4 * i));
                const float2 a = __half22float2(ux.h[0]), bb = __half22float2(ux.h[1]);
                const float xv[4] = { a.x, a.y, bb.x, bb.y };
#pragma unroll
                for (int r = 0; r < Q8_ROWS; r++)
#pragma unroll
                    for (int j = 0; j < 4; j++) sum[r][t] = fmaf(xv[j], w[r][j], sum[r][t]);
            }
        }
#pragma unroll
        for (int r = 0; r < Q8_ROWS; r++)
#pragma unroll
            for (int t = 0; t < T; t++) acc[r][t] = fmaf(s[r], sum[r][t], acc[r][t]);
    }
    q8_store<T>(acc, part, out, n0, N);
}

/* Decode kernel, any shape (a short last block, no alignment assumed):
 * thread i takes the blocks b = i, i + Q8_THREADS, ... of each row, byte by
 * byte. Used when K % 32 != 0 (e.g. stories260K's 172). */
template <int T>
__global__ void __launch_bounds__(Q8_THREADS)
dol_q8_gemv_any_kernel(float *__restrict__ out, const __half *__restrict__ x,
                       const int8_t *__restrict__ quants, const __half *__restrict__ scales, int N,
                       int K)
{
    __shared__ float part[Q8_WARPS][Q8_ROWS * T];
    const int n0 = blockIdx.x * Q8_ROWS;
    const int bpr = (K + Q8_BLOCK - 1) / Q8_BLOCK;
    float acc[Q8_ROWS][T];
#pragma unroll
    for (int r = 0; r < Q8_ROWS; r++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[r][t] = 0.0f;

    for (int b = threadIdx.x; b < bpr; b += Q8_THREADS) {
        const int k0 = b * Q8_BLOCK;
        const int len = K - k0 < Q8_BLOCK ? K - k0 : Q8_BLOCK;
#pragma unroll
        for (int r = 0; r < Q8_ROWS; r++) {
            if (n0 + r >= N) continue;
            const size_t row = (size_t)(n0 + r);
            const int8_t *q = quants + row * (size_t)K + k0;
            const float s = __half2float(scales[row * (size_t)bpr + (size_t)b]);
            float sum[T];
#pragma unroll
            for (int t = 0; t < T; t++) sum[t] = 0.0f;
            for (int j = 0; j < len; j++) {
                const float w = (float)q[j];
#pragma unroll
                for (int t = 0; t < T; t++)
                    sum[t] = fmaf(__half2float(x[(size_t)t * (size_t)K + k0 + j]), w, sum[t]);
            }
#pragma unroll
            for (int t = 0; t < T; t++) acc[r][t] = fmaf(s, sum[t], acc[r][t]);
        }
    }
    q8_store<T>(acc, part, out, n0, N);
}

/* w[r][k] = fp16(q * d) for rows row0 .. row0 + rows - 1 of W (w row r holds
 * W row row0 + r); one thread per weight. */
__global__ void dol_q8_dequant_kernel(__half *__restrict__ w, const int8_t *__restrict__ quants,
                                      const __half *__restrict__ scales, int64_t row0, int rows,
                                      int K)
{
    const int64_t n = (int64_t)rows * K, bpr = (K + Q8_BLOCK - 1) / Q8_BLOCK;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / K;
        const int k = (int)(i % K);
        const float s = __half2float(scales[(row0 + r) * bpr + k / Q8_BLOCK]);
        w[i] = __float2half_rn((float)quants[(row0 + r) * K + k] * s);
    }
}

/* ---- launchers ------------------------------------------------------------ */

template <int T>
static cudaError_t launch_gemv(float *out, const __half *x, const dol_cuda_q8 *W, bool vec,
                               cudaStream_t stream)
{
    const unsigned blocks = dol_div_up((size_t)W->rows, Q8_ROWS);
    const __half *sc = reinterpret_cast<const __half *>(W->scales);
    if (vec)
        dol_q8_gemv_kernel<T><<<blocks, Q8_THREADS, 0, stream>>>(out, x, W->quants, sc, W->rows,
                                                                  W->cols);
    else
        dol_q8_gemv_any_kernel<T><<<blocks, Q8_THREADS, 0, stream>>>(out, x, W->quants, sc,
                                                                      W->rows, W->cols);
    return cudaGetLastError();
}

extern "C" cudaError_t dol_cuda_q8_gemv(float *out, const dol_f16 *x, int T, const dol_cuda_q8 *W,
                                        cudaStream_t stream)
{
    if (T <= 0 || W->rows <= 0) return cudaSuccess;
    if (T > DOL_CUDA_Q8_GEMV_MAX_T || W->cols <= 0) return cudaErrorInvalidValue;
    const __half *xh = reinterpret_cast<const __half *>(x);
    const bool vec = W->cols % Q8_BLOCK == 0 && ((uintptr_t)W->quants & 15u) == 0 &&
                     ((uintptr_t)x & 15u) == 0;
    switch (T) {
    case 1: return launch_gemv<1>(out, xh, W, vec, stream);
    case 2: return launch_gemv<2>(out, xh, W, vec, stream);
    case 3: return launch_gemv<3>(out, xh, W, vec, stream);
    case 4: return launch_gemv<4>(out, xh, W, vec, stream);
    case 5: return launch_gemv<5>(out, xh, W, vec, stream);
    case 6: return launch_gemv<6>(out, xh, W, vec, stream);
    case 7: return launch_gemv<7>(out, xh, W, vec, stream);
    default: return launch_gemv<8>(out, xh, W, vec, stream);
    }
}

extern "C" cudaError_t dol_cuda_q8_dequant(dol_f16 *w, const dol_cuda_q8 *W, int row0, int rows,
                                           cudaStream_t stream)
{
    if (rows <= 0) return cudaSuccess;
    if (row0 < 0 || row0 + rows > W->rows || W->cols <= 0) return cudaErrorInvalidValue;
    const size_t n = (size_t)rows * (size_t)W->cols;
    unsigned blocks = dol_div_up(n, 256);
    if (blocks > 65535u * 8u) blocks = 65535u * 8u; /* grid-stride loop covers the rest */
    dol_q8_dequant_kernel<<<blocks, 256, 0, stream>>>(
        reinterpret_cast<__half *>(w), W->quants, reinterpret_cast<const __half *>(W->scales),
        row0, rows, W->cols);
    return cudaGetLastError();
}

extern "C" int dol_cuda_q8_matmul(cublasHandle_t blas, float *out, const dol_f16 *x, int T,
                                  const dol_cuda_q8 *W, dol_f16 *ws, size_t ws_elems,
                                  cudaStream_t stream, char *err, size_t errlen)
{
    const int N = W->rows, K = W->cols;
    if (T <= 0 || N <= 0) return 0;
    if (T <= DOL_CUDA_Q8_GEMV_UPTO) {
        for (int t0 = 0; t0 < T; t0 += DOL_CUDA_Q8_GEMV_MAX_T) {
            const int nt = T - t0 < DOL_CUDA_Q8_GEMV_MAX_T ? T - t0 : DOL_CUDA_Q8_GEMV_MAX_T;
            CUDA_CHECK(dol_cuda_q8_gemv(out + (size_t)t0 * N, x + (size_t)t0 * K, nt, W, stream));
        }
        return 0;
    }
    const size_t tile = ws_elems / (size_t)K; /* rows of W per tile */
    if (!ws || tile == 0) {
        dol_set_err(err, errlen, "cuda: int8 product of %d x %d needs a dequantization workspace "
                                 "of at least one row", N, K);
        return -1;
    }
    const int step = tile < (size_t)N ? (int)tile : N;
    const float alpha = 1.0f, beta = 0.0f;
    for (int n0 = 0; n0 < N; n0 += step) {
        const int nr = N - n0 < step ? N - n0 : step;
        CUDA_CHECK(dol_cuda_q8_dequant(ws, W, n0, nr, stream));
        /* row-major out[:, n0 .. n0+nr) = x . tile^T (as in kernels/nf4.cu) */
        CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, nr, T, K, &alpha, ws, CUDA_R_16F,
                                  K, x, CUDA_R_16F, K, &beta, out + n0, CUDA_R_32F, N,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return 0;
}
