/* kernels/nf4.cu — matrix products over NF4 weights (the format of
 * src/engine/nf4.h: blocks of 64 weights along the input dimension, a shorter
 * last block when K % 64 != 0, one F16 absmax scale per block, byte j of a
 * block of n weights = weight j in the low nibble | weight j + n/2 in the high
 * nibble, weight = dol_nf4_levels[code] * scale):
 *
 *   out[T][N] = x[T][K] . dequant(W)[N][K]^T     x FP16, out FP32
 *
 * Decode (dol_cuda_nf4_gemv: T <= DOL_CUDA_NF4_GEMV_MAX_T rows per launch;
 * dol_cuda_nf4_matmul uses it up to DOL_CUDA_NF4_GEMV_UPTO rows): one pass over the
 * packed weights, each byte read once from global memory and decoded in
 * registers through a 16-entry table of the levels in shared memory (16
 * floats in 16 distinct banks, so any pattern of codes is conflict-free).
 * A thread block owns DOL_QUANT_ROWS rows of W and splits K among its threads in
 * 16-byte chunks (32 weights: 16 low nibbles and the 16 high nibbles 32
 * further). Per chunk and token row it sums x * level in FP32 and multiplies
 * the block's scale in once: acc += scale * sum(x * level). The partial sums
 * of the threads are reduced in a fixed order (warp butterfly, then the warps
 * in index order), so an output row does not depend on T or on the other rows
 * of x: batch-invariant bit for bit within this path.
 *
 * Prefill (more rows, inside dol_cuda_nf4_matmul): tiles of W are dequantized
 * to FP16 into a workspace (dol_cuda_nf4_dequant, weight = fp16(level * scale),
 * round to nearest even) and multiplied with cublasGemmEx (FP16 inputs, FP32
 * accumulation and output), tile after tile on the same stream. */
#include <cublas_v2.h>

#include "kernels/quant_common.cuh"

/* The 16 NF4 levels: the one table of src/engine/nf4.c, passed to the kernels
 * by value (64 bytes of kernel parameters). */
extern "C" const float dol_nf4_levels[16];

#define NF4_BLOCK DOL_CUDA_NF4_BLOCK

struct nf4_levels {
    float v[16];
};

/* The level table into shared memory (constant indices: a dynamically
 * indexed kernel parameter would be copied to local memory first). */
__device__ __forceinline__ void load_lut(float *lut, const nf4_levels &levels)
{
    if (threadIdx.x == 0) {
#pragma unroll
        for (int i = 0; i < 16; i++) lut[i] = levels.v[i];
    }
    __syncthreads();
}

static nf4_levels host_levels(void)
{
    nf4_levels l;
    for (int i = 0; i < 16; i++) l.v[i] = dol_nf4_levels[i];
    return l;
}

/* The level of the code whose byte offset into the table (code * 4) sits in
 * byte j of `offs` (four offsets, one per byte). */
__device__ __forceinline__ float nf4_level(const float *lut, uint32_t offs, int j)
{
    const uint32_t off = __byte_perm(offs, 0u, 0x4440u + (uint32_t)j); /* byte j, zero-extended */
    return *reinterpret_cast<const float *>(reinterpret_cast<const char *>(lut) + off);
}

/* Decode kernel, vectorized: K % 64 == 0 (every block full, rows of K/2
 * bytes, a multiple of 32), codes and x 16-byte aligned. Thread i takes the
 * 16-byte chunks c = i, i + DOL_QUANT_THREADS, ... of each of its DOL_QUANT_ROWS rows;
 * chunk c is half (c & 1) of block c / 2: its low nibbles are the weights
 * k_lo .. k_lo + 15 with k_lo = 64 * (c / 2) + 16 * (c & 1), its high nibbles
 * the weights k_lo + 32 .. k_lo + 47. */
/* T = 3: a floor of 4 blocks per SM lets ptxas keep all of it in registers
 * (without it sm_86/87/89 spill 12 bytes at 96 registers); 0 leaves the
 * other instances as ptxas chooses (docs/cuda.md, "Compile-time checks"). */
template <int T>
__global__ void __launch_bounds__(DOL_QUANT_THREADS, T == 3 ? 4 : 0)
dol_nf4_gemv_kernel(float *__restrict__ out, const __half *__restrict__ x,
                    const uint8_t *__restrict__ codes, const __half *__restrict__ scales, int N,
                    int K, nf4_levels levels)
{
    __shared__ float lut[16];
    __shared__ float part[DOL_QUANT_WARPS][DOL_QUANT_ROWS * T];
    load_lut(lut, levels);

    const int n0 = blockIdx.x * DOL_QUANT_ROWS;
    const int chunks = K / 32, bpr = K / NF4_BLOCK;
    const size_t row_bytes = (size_t)K / 2;
    float acc[DOL_QUANT_ROWS][T];
    dol_quant_zero<T>(acc);

    for (int c = threadIdx.x; c < chunks; c += DOL_QUANT_THREADS) {
        const int b = c >> 1;
        const int k_lo = b * NF4_BLOCK + (c & 1) * 16;
        uint4 q[DOL_QUANT_ROWS];
        float s[DOL_QUANT_ROWS];
        dol_quant_load_chunk(q, s, codes, row_bytes, scales, bpr, n0, N, c, b);
        float sum[DOL_QUANT_ROWS][T];
        dol_quant_zero<T>(sum);
        /* word i of the chunk: bytes 4i .. 4i+3 = weights k_lo+4i+j (low
         * nibbles) and k_lo+32+4i+j (high nibbles), j = 0..3 */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float wl[DOL_QUANT_ROWS][4], wh[DOL_QUANT_ROWS][4];
#pragma unroll
            for (int r = 0; r < DOL_QUANT_ROWS; r++) {
                const uint32_t w = dol_quant_word(q[r], i);
                const uint32_t lo = (w << 2) & 0x3C3C3C3Cu; /* code * 4 of each low nibble */
                const uint32_t hi = (w >> 2) & 0x3C3C3C3Cu; /* ... of each high nibble */
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    wl[r][j] = nf4_level(lut, lo, j);
                    wh[r][j] = nf4_level(lut, hi, j);
                }
            }
#pragma unroll
            for (int t = 0; t < T; t++) {
                const __half *xt = x + (size_t)t * (size_t)K + k_lo + 4 * i;
                float xl[4], xh[4];
                dol_quant_load_x4x2(xl, xh, xt, 32);
#pragma unroll
                for (int r = 0; r < DOL_QUANT_ROWS; r++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        sum[r][t] = fmaf(xl[j], wl[r][j], sum[r][t]);
                        sum[r][t] = fmaf(xh[j], wh[r][j], sum[r][t]);
                    }
            }
        }
        dol_quant_scale_add<T>(acc, s, sum);
    }
    dol_quant_store<T>(acc, part, out, n0, N);
}

/* Decode kernel, any shape (K even; a short last block; no alignment
 * assumed): thread i takes the blocks b = i, i + DOL_QUANT_THREADS, ... of each row,
 * byte by byte. Used when K % 64 != 0 (e.g. stories260K's 172). */
template <int T>
__global__ void __launch_bounds__(DOL_QUANT_THREADS)
dol_nf4_gemv_any_kernel(float *__restrict__ out, const __half *__restrict__ x,
                        const uint8_t *__restrict__ codes, const __half *__restrict__ scales,
                        int N, int K, nf4_levels levels)
{
    __shared__ float lut[16];
    __shared__ float part[DOL_QUANT_WARPS][DOL_QUANT_ROWS * T];
    load_lut(lut, levels);

    const int n0 = blockIdx.x * DOL_QUANT_ROWS;
    const int bpr = (K + NF4_BLOCK - 1) / NF4_BLOCK;
    const size_t row_bytes = (size_t)K / 2;
    float acc[DOL_QUANT_ROWS][T];
    dol_quant_zero<T>(acc);

    for (int b = threadIdx.x; b < bpr; b += DOL_QUANT_THREADS) {
        const int k0 = b * NF4_BLOCK;
        const int half = (K - k0 < NF4_BLOCK ? K - k0 : NF4_BLOCK) / 2;
#pragma unroll
        for (int r = 0; r < DOL_QUANT_ROWS; r++) {
            if (n0 + r >= N) continue;
            const size_t row = (size_t)(n0 + r);
            const uint8_t *q = codes + row * row_bytes + (size_t)k0 / 2;
            const float s = __half2float(scales[row * (size_t)bpr + (size_t)b]);
            float sum[T];
#pragma unroll
            for (int t = 0; t < T; t++) sum[t] = 0.0f;
            for (int j = 0; j < half; j++) {
                const uint32_t byte = q[j];
                const float wl = lut[byte & 15u], wh = lut[byte >> 4];
#pragma unroll
                for (int t = 0; t < T; t++) {
                    const __half *xt = x + (size_t)t * (size_t)K + k0;
                    sum[t] = fmaf(__half2float(xt[j]), wl, sum[t]);
                    sum[t] = fmaf(__half2float(xt[half + j]), wh, sum[t]);
                }
            }
#pragma unroll
            for (int t = 0; t < T; t++) acc[r][t] = fmaf(s, sum[t], acc[r][t]);
        }
    }
    dol_quant_store<T>(acc, part, out, n0, N);
}

/* w[r][k] = fp16(level(code) * scale) for rows row0 .. row0 + rows - 1 of W
 * (w row r holds W row row0 + r). One thread per code byte: byte j of a row
 * is byte jj = j % 32 of block b = j / 32, i.e. weights 64b + jj and
 * 64b + n/2 + jj, n the block's length. */
__global__ void dol_nf4_dequant_kernel(__half *__restrict__ w, const uint8_t *__restrict__ codes,
                                       const __half *__restrict__ scales, int64_t row0, int rows,
                                       int K, nf4_levels levels)
{
    __shared__ float lut[16];
    load_lut(lut, levels);

    const int64_t row_bytes = K / 2, n = (int64_t)rows * row_bytes;
    const int64_t bpr = (K + NF4_BLOCK - 1) / NF4_BLOCK;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / row_bytes;
        const int j = (int)(i % row_bytes);
        const int b = j / 32, jj = j % 32;
        const int len = K - b * NF4_BLOCK < NF4_BLOCK ? K - b * NF4_BLOCK : NF4_BLOCK;
        const uint32_t byte = codes[(row0 + r) * row_bytes + j];
        const float s = __half2float(scales[(row0 + r) * bpr + b]);
        __half *o = w + r * (int64_t)K + (int64_t)b * NF4_BLOCK;
        o[jj] = __float2half_rn(lut[byte & 15u] * s);
        o[len / 2 + jj] = __float2half_rn(lut[byte >> 4] * s);
    }
}

/* ---- launchers ------------------------------------------------------------ */

template <int T>
static cudaError_t launch_gemv(float *out, const __half *x, const dol_cuda_nf4 *W, bool vec,
                               cudaStream_t stream)
{
    const unsigned blocks = dol_div_up((size_t)W->rows, DOL_QUANT_ROWS);
    const dol_cuda_launch_cfg c = dol_cuda_cfg_quant_gemv();
    const __half *sc = reinterpret_cast<const __half *>(W->scales);
    if (vec)
        dol_nf4_gemv_kernel<T><<<blocks, c.threads, 0, stream>>>(out, x, W->codes, sc, W->rows,
                                                                    W->cols, host_levels());
    else
        dol_nf4_gemv_any_kernel<T><<<blocks, c.threads, 0, stream>>>(
            out, x, W->codes, sc, W->rows, W->cols, host_levels());
    return cudaGetLastError();
}

extern "C" cudaError_t dol_cuda_nf4_gemv(float *out, const dol_f16 *x, int T,
                                         const dol_cuda_nf4 *W, cudaStream_t stream)
{
    if (T <= 0 || W->rows <= 0) return cudaSuccess;
    if (T > DOL_CUDA_NF4_GEMV_MAX_T || W->cols <= 0 || W->cols % 2 != 0)
        return cudaErrorInvalidValue;
    const __half *xh = reinterpret_cast<const __half *>(x);
    const bool vec = W->cols % NF4_BLOCK == 0 && ((uintptr_t)W->codes & 15u) == 0 &&
                     ((uintptr_t)x & 15u) == 0;
    return dol_quant_by_rows(T, [&](auto rows) {
        return launch_gemv<decltype(rows)::value>(out, xh, W, vec, stream);
    });
}

extern "C" cudaError_t dol_cuda_nf4_dequant(dol_f16 *w, const dol_cuda_nf4 *W, int row0, int rows,
                                            cudaStream_t stream)
{
    if (rows <= 0) return cudaSuccess;
    if (row0 < 0 || row0 + rows > W->rows || W->cols <= 0 || W->cols % 2 != 0)
        return cudaErrorInvalidValue;
    const size_t n = (size_t)rows * (size_t)(W->cols / 2);
    dol_nf4_dequant_kernel<<<dol_quant_dequant_blocks(n), dol_cuda_cfg_dequant().threads, 0, stream>>>(
        reinterpret_cast<__half *>(w), W->codes, reinterpret_cast<const __half *>(W->scales),
        row0, rows, W->cols, host_levels());
    return cudaGetLastError();
}

extern "C" int dol_cuda_nf4_matmul(cublasHandle_t blas, float *out, const dol_f16 *x, int T,
                                   const dol_cuda_nf4 *W, dol_f16 *ws, size_t ws_elems,
                                   cudaStream_t stream, char *err, size_t errlen)
{
    return dol_quant_matmul(blas, out, x, T, W, dol_cuda_nf4_gemv, dol_cuda_nf4_dequant,
                            DOL_CUDA_NF4_GEMV_UPTO, DOL_CUDA_NF4_GEMV_MAX_T, "nf4", ws, ws_elems,
                            stream, err, errlen);
}
