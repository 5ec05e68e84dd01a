/* kernels/ggml_blocks.cu — matrix products and embedding lookups over the
 * block-quantized types of GGUF files (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K ..
 * Q6_K), held on the device as the file stores them: rows of K / B blocks of
 * B = 32 or 256 weights, blocks never crossing rows. The weights are decoded
 * by dol_blk_weight (include/dolphin/ggml_blocks.h), the same exact float32
 * expressions as the CPU backend's, so a decoded weight is the CPU's bit for
 * bit.
 *
 *   out[t][ldo-strided n] = x[T][K] . dequant(W)[N][K]^T   x FP16, out FP32
 *
 * Decode (dol_cuda_blk_gemv, T <= DOL_CUDA_BLK_GEMV_MAX_T): one pass over the
 * blocks. A warp owns BLK_WARP_ROWS rows of W, taken one after the other;
 * its lanes take the 32-weight groups of the row in turn (a K-quant block is 8 groups), read the
 * group's bytes from global memory, decode its 32 weights into registers (the
 * kernel is instantiated per type, so the decode is straight-line code) and,
 * per token row, sum x * w over the group in order and add the sum to the
 * row's accumulator. The lanes' sums go through shared memory and are added
 * in lane order, one lane per (row, token): an output row does not depend on
 * T or on the other rows of x.
 *
 * Prefill (more rows, in dol_cuda_blk_matmul): tiles of W dequantized to FP16
 * (dol_cuda_blk_dequant, fp16 of the exact weight, round to nearest even) and
 * cublasGemmEx (FP16 inputs, FP32 accumulation and output), as nf4.cu and
 * q8.cu do. The embedding (dol_cuda_blk_embedding) decodes a token's row to
 * FP32 exactly. */
#include <cublas_v2.h>

#include "dolphin/ggml_blocks.h"
#include "kernels/quant_common.cuh"

#define BLK_GROUP 32 /* weights decoded at once: the smallest block */
#define BLK_PIECE 8     /* weights of a group decoded at once */
#define BLK_WARP_ROWS 4 /* rows of W per warp of the decode kernel */
#define BLK_BLOCK_ROWS (BLK_WARP_ROWS * DOL_QUANT_WARPS) /* ... per thread block */

/* Decode kernel for type TY: see above. T <= DOL_CUDA_BLK_GEMV_MAX_T token
 * rows; out row t at out + t * ldo. Each warp owns BLK_WARP_ROWS rows, its
 * lanes take a row's 32-weight groups in turn; one warp barrier, then a lane
 * per (row, token) adds the lanes' sums: no block barrier. */
/* (a floor of one block per SM lets ptxas keep it in registers: by default
 * it aims at 64 and spills a few bytes on sm_90) */
template <int TY>
__global__ void __launch_bounds__(DOL_QUANT_THREADS, 1)
dol_blk_gemv_kernel(float *__restrict__ out, int ldo, const __half *__restrict__ x, int T,
                    const uint8_t *__restrict__ w, size_t row_bytes, int block, int block_bytes,
                    int N, int K)
{
    /* the lanes' sums, [warp][row][t][lane] (+1: the final sums read a
     * column each without bank conflicts) */
    __shared__ float part[DOL_QUANT_WARPS][BLK_WARP_ROWS * DOL_CUDA_BLK_GEMV_MAX_T][33];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n0 = blockIdx.x * BLK_BLOCK_ROWS + warp * BLK_WARP_ROWS, groups = K / BLK_GROUP;
#pragma unroll 1
    for (int r = 0; r < BLK_WARP_ROWS && n0 + r < N; r++) {
        const int n = n0 + r;
        float acc[DOL_CUDA_BLK_GEMV_MAX_T];
#pragma unroll
        for (int t = 0; t < DOL_CUDA_BLK_GEMV_MAX_T; t++) acc[t] = 0.0f;
        for (int g = lane; g < groups; g += 32) {
            const int k0 = g * BLK_GROUP, j0 = k0 % block;
            const uint8_t *b = w + (size_t)n * row_bytes + (size_t)(k0 / block) * block_bytes;
            /* the group's sum per token row, x * w in order of j; the weights
             * decoded BLK_PIECE at a time (fewer live registers, same order) */
            float s[DOL_CUDA_BLK_GEMV_MAX_T];
#pragma unroll
            for (int t = 0; t < DOL_CUDA_BLK_GEMV_MAX_T; t++) s[t] = 0.0f;
#pragma unroll
            for (int jp = 0; jp < BLK_GROUP; jp += BLK_PIECE) {
                float wv[BLK_PIECE];
#pragma unroll
                for (int j = 0; j < BLK_PIECE; j++)
                    wv[j] = dol_blk_weight((dol_dtype)TY, b, j0 + jp + j);
#pragma unroll
                for (int t = 0; t < DOL_CUDA_BLK_GEMV_MAX_T; t++) {
                    if (t >= T) break;
                    const __half *xt = x + (size_t)t * (size_t)K + k0 + jp;
#pragma unroll
                    for (int j = 0; j < BLK_PIECE; j++) s[t] = fmaf(__half2float(xt[j]), wv[j], s[t]);
                }
            }
#pragma unroll
            for (int t = 0; t < DOL_CUDA_BLK_GEMV_MAX_T; t++) acc[t] += s[t];
        }
#pragma unroll
        for (int t = 0; t < DOL_CUDA_BLK_GEMV_MAX_T; t++) {
            if (t >= T) break;
            part[warp][r * DOL_CUDA_BLK_GEMV_MAX_T + t][lane] = acc[t];
        }
    }
    __syncwarp();
    /* lane r * T + t sums the 32 lanes' parts of (row r, token t) in lane order */
    const int r = lane / T, t = lane % T;
    if (r < BLK_WARP_ROWS && n0 + r < N) {
        const float *p = part[warp][r * DOL_CUDA_BLK_GEMV_MAX_T + t];
        float v = p[0];
        for (int l = 1; l < 32; l++) v += p[l];
        out[(size_t)t * (size_t)ldo + n0 + r] = v;
    }
}

/* w[r][k] = fp16(weight k of W row row0 + r), r < rows; grid-stride, one
 * weight per step. */
__global__ void dol_blk_dequant_kernel(__half *__restrict__ out, const uint8_t *__restrict__ w,
                                       int type, size_t row_bytes, int block, int block_bytes,
                                       int64_t row0, int rows, int K)
{
    const int64_t n = (int64_t)rows * K;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / K;
        const int k = (int)(i % K);
        const uint8_t *b = w + (size_t)(row0 + r) * row_bytes + (size_t)(k / block) * block_bytes;
        out[i] = __float2half_rn(dol_blk_weight((dol_dtype)type, b, k % block));
    }
}

/* x[t][k] = weight k of table row ids[t], FP32, exact; one block per token. */
__global__ void dol_blk_embedding_kernel(float *x, const uint8_t *table, int type, size_t row_bytes,
                                         int block, int block_bytes, const int32_t *ids, int d)
{
    const int t = blockIdx.x;
    const uint8_t *row = table + (size_t)ids[t] * row_bytes;
    float *o = x + (size_t)t * (size_t)d;
    for (int k = threadIdx.x; k < d; k += blockDim.x)
        o[k] = dol_blk_weight((dol_dtype)type, row + (size_t)(k / block) * block_bytes, k % block);
}

/* ---- launchers ------------------------------------------------------------ */

static bool blk_valid(const dol_cuda_blk *W)
{
    return W->data && W->rows > 0 && W->cols > 0 && W->block > 0 && W->block % BLK_GROUP == 0 &&
           W->cols % W->block == 0 && W->block_bytes > 0 &&
           W->row_bytes == (size_t)(W->cols / W->block) * (size_t)W->block_bytes &&
           W->type >= DOL_DTYPE_Q8_0 && W->type <= DOL_DTYPE_Q6_K;
}

template <int TY>
static cudaError_t launch_gemv(float *out, int ldo, const __half *x, int T, const dol_cuda_blk *W,
                               cudaStream_t stream)
{
    const unsigned blocks = dol_div_up((size_t)W->rows, BLK_BLOCK_ROWS);
    dol_blk_gemv_kernel<TY><<<blocks, dol_cuda_cfg_quant_gemv().threads, 0, stream>>>(
        out, ldo, x, T, W->data, W->row_bytes, W->block, W->block_bytes, W->rows, W->cols);
    return cudaGetLastError();
}

extern "C" cudaError_t dol_cuda_blk_gemv(float *out, int ldo, const dol_f16 *x, int T,
                                         const dol_cuda_blk *W, cudaStream_t stream)
{
    if (T <= 0) return cudaSuccess;
    if (T > DOL_CUDA_BLK_GEMV_MAX_T || !blk_valid(W) || ldo < W->rows) return cudaErrorInvalidValue;
    const __half *xh = reinterpret_cast<const __half *>(x);
    switch (W->type) {
    case DOL_DTYPE_Q8_0: return launch_gemv<DOL_DTYPE_Q8_0>(out, ldo, xh, T, W, stream);
    case DOL_DTYPE_Q4_0: return launch_gemv<DOL_DTYPE_Q4_0>(out, ldo, xh, T, W, stream);
    case DOL_DTYPE_Q4_1: return launch_gemv<DOL_DTYPE_Q4_1>(out, ldo, xh, T, W, stream);
    case DOL_DTYPE_Q5_0: return launch_gemv<DOL_DTYPE_Q5_0>(out, ldo, xh, T, W, stream);
    case DOL_DTYPE_Q5_1: return launch_gemv<DOL_DTYPE_Q5_1>(out, ldo, xh, T, W, stream);
    case DOL_DTYPE_Q2_K: return launch_gemv<DOL_DTYPE_Q2_K>(out, ldo, xh, T, W, stream);
    case DOL_DTYPE_Q3_K: return launch_gemv<DOL_DTYPE_Q3_K>(out, ldo, xh, T, W, stream);
    case DOL_DTYPE_Q4_K: return launch_gemv<DOL_DTYPE_Q4_K>(out, ldo, xh, T, W, stream);
    case DOL_DTYPE_Q5_K: return launch_gemv<DOL_DTYPE_Q5_K>(out, ldo, xh, T, W, stream);
    case DOL_DTYPE_Q6_K: return launch_gemv<DOL_DTYPE_Q6_K>(out, ldo, xh, T, W, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t dol_cuda_blk_dequant(dol_f16 *w, const dol_cuda_blk *W, int row0, int rows,
                                            cudaStream_t stream)
{
    if (rows <= 0) return cudaSuccess;
    if (!blk_valid(W) || row0 < 0 || row0 + rows > W->rows) return cudaErrorInvalidValue;
    const size_t n = (size_t)rows * (size_t)W->cols;
    dol_blk_dequant_kernel<<<dol_quant_dequant_blocks(n), dol_cuda_cfg_dequant().threads, 0, stream>>>(
        reinterpret_cast<__half *>(w), W->data, W->type, W->row_bytes, W->block, W->block_bytes,
        row0, rows, W->cols);
    return cudaGetLastError();
}

extern "C" cudaError_t dol_cuda_blk_embedding(float *x, const dol_cuda_blk *table,
                                              const int32_t *ids, int T, cudaStream_t stream)
{
    if (T <= 0) return cudaSuccess;
    if (!blk_valid(table)) return cudaErrorInvalidValue;
    const unsigned threads = dol_cuda_cfg_embedding(table->cols).threads;
    dol_blk_embedding_kernel<<<T, threads, 0, stream>>>(
        x, table->data, table->type, table->row_bytes, table->block, table->block_bytes, ids,
        table->cols);
    return cudaGetLastError();
}

extern "C" int dol_cuda_blk_matmul(cublasHandle_t blas, float *out, int ldo, const dol_f16 *x,
                                   int T, const dol_cuda_blk *W, dol_f16 *ws, size_t ws_elems,
                                   cudaStream_t stream, char *err, size_t errlen)
{
    if (!blk_valid(W) || ldo < W->rows) {
        dol_set_err(err, errlen, "cuda: block-quantized product: invalid matrix (type %d, %d x %d)",
                    W->type, W->rows, W->cols);
        return -1;
    }
    return dol_quant_matmul_ld(
        blas, out, ldo, x, T, W->rows, W->cols,
        [&](float *o, const dol_f16 *xt, int nt) { return dol_cuda_blk_gemv(o, ldo, xt, nt, W, stream); },
        [&](dol_f16 *wt, int n0, int nr) { return dol_cuda_blk_dequant(wt, W, n0, nr, stream); },
        DOL_CUDA_BLK_GEMV_UPTO, DOL_CUDA_BLK_GEMV_MAX_T, "GGUF block", ws, ws_elems, err, errlen);
}
