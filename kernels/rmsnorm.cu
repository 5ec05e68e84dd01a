/* kernels/rmsnorm.cu — RMSNorm (Zhang & Sennrich 2019) fused with the
 * residual add that precedes it: x += delta; y = fp16(x / rms(x) * w).
 * One block per row. The sum of squares is accumulated in double and the
 * scale computed as 1/sqrt(ss/d + eps) in double, then applied in float as
 * (x * scale) * w, the same expression as dol_cpu_rmsnorm; the only
 * difference from the CPU is the order of the double sum and the final FP16
 * rounding. */
#include "kernels/cuda_common.cuh"

__global__ void dol_rmsnorm_residual_kernel(__half *y, float *x, const float *delta, const float *w,
                                            const int32_t *rows, int d, float eps)
{
    const int r = blockIdx.x;
    const size_t i = rows ? (size_t)rows[r] : (size_t)r;
    float *xr = x + i * (size_t)d;
    double ss = 0.0;
    if (delta) {
        const float *dr = delta + i * (size_t)d;
        for (int k = threadIdx.x; k < d; k += blockDim.x) {
            float v = xr[k] + dr[k];
            xr[k] = v;
            ss += (double)v * v;
        }
    } else {
        for (int k = threadIdx.x; k < d; k += blockDim.x) ss += (double)xr[k] * xr[k];
    }
    ss = dol_block_sum_d(ss);
    const float scale = (float)(1.0 / sqrt(ss / d + (double)eps));
    __half *yr = y + (size_t)r * (size_t)d;
    /* each thread reads back only the elements it wrote above */
    for (int k = threadIdx.x; k < d; k += blockDim.x) yr[k] = __float2half_rn(xr[k] * scale * w[k]);
}

extern "C" cudaError_t dol_cuda_rmsnorm_residual(dol_f16 *y, float *x, const float *delta,
                                                 const float *w, const int32_t *rows, int R, int d,
                                                 float eps, cudaStream_t stream)
{
    if (R <= 0) return cudaSuccess;
    const unsigned threads = dol_cuda_cfg_rmsnorm(d).threads;
    dol_rmsnorm_residual_kernel<<<R, threads, 0, stream>>>(reinterpret_cast<__half *>(y), x, delta, w,
                                                           rows, d, eps);
    return cudaGetLastError();
}
