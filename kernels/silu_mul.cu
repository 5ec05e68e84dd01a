/* kernels/silu_mul.cu — the SwiGLU gate (Shazeer 2020): silu(gate) * up over
 * the FP32 output of the fused gate|up product, rounded to FP16 for the down
 * projection. silu(g) = g / (1 + exp(-g)) as in dol_cpu_silu_mul (expf, not
 * the fast __expf). */
#include "kernels/cuda_common.cuh"

__global__ void dol_silu_mul_kernel(__half *out, const float *gu, int T, int f)
{
    const size_t n = (size_t)T * (size_t)f;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t t = idx / (size_t)f, i = idx % (size_t)f;
        const float g = gu[t * 2 * (size_t)f + i];
        const float u = gu[t * 2 * (size_t)f + (size_t)f + i];
        out[idx] = __float2half_rn(g / (1.0f + expf(-g)) * u);
    }
}

extern "C" cudaError_t dol_cuda_silu_mul(dol_f16 *out, const float *gu, int T, int f,
                                         cudaStream_t stream)
{
    if (T <= 0 || f <= 0) return cudaSuccess;
    const size_t n = (size_t)T * (size_t)f;
    const unsigned threads = dol_cuda_cfg_silu_mul().threads;
    unsigned blocks = dol_div_up(n, threads);
    if (blocks > 65535u * 8u) blocks = 65535u * 8u; /* grid-stride loop covers the rest */
    dol_silu_mul_kernel<<<blocks, threads, 0, stream>>>(reinterpret_cast<__half *>(out), gu, T, f);
    return cudaGetLastError();
}
