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
 * registers. A thread block owns DOL_QUANT_ROWS rows of W and splits K among its
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

#include "kernels/quant_common.cuh"

#define Q8_BLOCK DOL_CUDA_Q8_BLOCK

/* Byte j of w as a signed value, in float. */
__device__ __forceinline__ float q8_byte(uint32_t w, int j)
{
    return (float)((int32_t)(w << (24 - 8 * j)) >> 24);
}

/* Decode kernel, vectorized: K % 32 == 0 (every block full), quants and x
 * 16-byte aligned. Thread i takes the 16-byte chunks c = i, i + DOL_QUANT_THREADS,
 * ... of each of its rows: chunk c holds weights 16c .. 16c + 15, in block
 * c / 2. */
template <int T>
__global__ void __launch_bounds__(DOL_QUANT_THREADS)
dol_q8_gemv_kernel(float *__restrict__ out, const __half *__restrict__ x,
                   const int8_t *__restrict__ quants, const __half *__restrict__ scales, int N, int K)
{
    __shared__ float part[DOL_QUANT_WARPS][DOL_QUANT_ROWS * T];
    const int n0 = blockIdx.x * DOL_QUANT_ROWS;
    const int chunks = K / 16, bpr = K / Q8_BLOCK;
    float acc[DOL_QUANT_ROWS][T];
    dol_quant_zero<T>(acc);

    for (int c = threadIdx.x; c < chunks; c += DOL_QUANT_THREADS) {
        const int b = c >> 1, k0 = c * 16;
        uint4 q[DOL_QUANT_ROWS];
        float s[DOL_QUANT_ROWS];
        dol_quant_load_chunk(q, s, quants, (size_t)K, scales, bpr, n0, N, c, b);
        float sum[DOL_QUANT_ROWS][T];
        dol_quant_zero<T>(sum);
        /* word i of the chunk: weights k0 + 4i .. k0 + 4i + 3 */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float w[DOL_QUANT_ROWS][4];
#pragma unroll
            for (int r = 0; r < DOL_QUANT_ROWS; r++) {
                const uint32_t u = dol_quant_word(q[r], i);
#pragma unroll
                for (int j = 0; j < 4; j++) w[r][j] = q8_byte(u, j);
            }
#pragma unroll
            for (int t = 0; t < T; t++) {
                float xv[4];
                dol_quant_load_x4(xv, x + (size_t)t * (size_t)K + k0 + 4 * i);
#pragma unroll
                for (int r = 0; r < DOL_QUANT_ROWS; r++)
#pragma unroll
                    for (int j = 0; j < 4; j++) sum[r][t] = fmaf(xv[j], w[r][j], sum[r][t]);
            }
        }
        dol_quant_scale_add<T>(acc, s, sum);
    }
    dol_quant_store<T>(acc, part, out, n0, N);
}

/* Decode kernel, any shape (a short last block, no alignment assumed):
 * thread i takes the blocks b = i, i + DOL_QUANT_THREADS, ... of each row, byte by
 * byte. Used when K % 32 != 0 (e.g. stories260K's 172). */
template <int T>
__global__ void __launch_bounds__(DOL_QUANT_THREADS)
dol_q8_gemv_any_kernel(float *__restrict__ out, const __half *__restrict__ x,
                       const int8_t *__restrict__ quants, const __half *__restrict__ scales, int N,
                       int K)
{
    __shared__ float part[DOL_QUANT_WARPS][DOL_QUANT_ROWS * T];
    const int n0 = blockIdx.x * DOL_QUANT_ROWS;
    const int bpr = (K + Q8_BLOCK - 1) / Q8_BLOCK;
    float acc[DOL_QUANT_ROWS][T];
    dol_quant_zero<T>(acc);

    for (int b = threadIdx.x; b < bpr; b += DOL_QUANT_THREADS) {
        const int k0 = b * Q8_BLOCK;
        const int len = K - k0 < Q8_BLOCK ? K - k0 : Q8_BLOCK;
#pragma unroll
        for (int r = 0; r < DOL_QUANT_ROWS; r++) {
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
    dol_quant_store<T>(acc, part, out, n0, N);
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
    const unsigned blocks = dol_div_up((size_t)W->rows, DOL_QUANT_ROWS);
    const dol_cuda_launch_cfg c = dol_cuda_cfg_quant_gemv();
    const __half *sc = reinterpret_cast<const __half *>(W->scales);
    if (vec)
        dol_q8_gemv_kernel<T><<<blocks, c.threads, 0, stream>>>(out, x, W->quants, sc, W->rows,
                                                                  W->cols);
    else
        dol_q8_gemv_any_kernel<T><<<blocks, c.threads, 0, stream>>>(out, x, W->quants, sc,
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
    return dol_quant_by_rows(T, [&](auto rows) {
        return launch_gemv<decltype(rows)::value>(out, xh, W, vec, stream);
    });
}

extern "C" cudaError_t dol_cuda_q8_dequant(dol_f16 *w, const dol_cuda_q8 *W, int row0, int rows,
                                           cudaStream_t stream)
{
    if (rows <= 0) return cudaSuccess;
    if (row0 < 0 || row0 + rows > W->rows || W->cols <= 0) return cudaErrorInvalidValue;
    const size_t n = (size_t)rows * (size_t)W->cols;
    dol_q8_dequant_kernel<<<dol_quant_dequant_blocks(n), dol_cuda_cfg_dequant().threads, 0, stream>>>(
        reinterpret_cast<__half *>(w), W->quants, reinterpret_cast<const __half *>(W->scales),
        row0, rows, W->cols);
    return cudaGetLastError();
}

extern "C" int dol_cuda_q8_matmul(cublasHandle_t blas, float *out, const dol_f16 *x, int T,
                                  const dol_cuda_q8 *W, dol_f16 *ws, size_t ws_elems,
                                  cudaStream_t stream, char *err, size_t errlen)
{
    return dol_quant_matmul(blas, out, x, T, W, dol_cuda_q8_gemv, dol_cuda_q8_dequant,
                            DOL_CUDA_Q8_GEMV_UPTO, DOL_CUDA_Q8_GEMV_MAX_T, "int8", ws, ws_elems,
                            stream, err, errlen);
}
