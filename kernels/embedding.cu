/* kernels/embedding.cu — token embedding lookup: one block per token copies
 * its row of the FP16 table into the FP32 residual stream. The conversion is
 * exact, so the result equals dol_cpu_embed_row on the same FP16 table. */
#include "kernels/cuda_common.cuh"

__global__ void dol_embedding_kernel(float *x, const __half *table, const int32_t *ids, int d)
{
    const int t = blockIdx.x;
    const __half *row = table + (size_t)ids[t] * (size_t)d;
    float *out = x + (size_t)t * (size_t)d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[i] = __half2float(row[i]);
}

extern "C" cudaError_t dol_cuda_embedding(float *x, const dol_f16 *table, const int32_t *ids, int T,
                                          int d, cudaStream_t stream)
{
    if (T <= 0) return cudaSuccess;
    dol_embedding_kernel<<<T, dol_cuda_cfg_embedding(d).threads, 0, stream>>>(x, reinterpret_cast<const __half *>(table), ids, d);
    return cudaGetLastError();
}
