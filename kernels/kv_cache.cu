/* kernels/kv_cache.cu — the paged KV cache on the device (layout in
 * kernels.h): writing the new tokens' K and V rows into their blocks as FP16,
 * and copying the first rows of a block for sequence forks. */
#include "kernels/cuda_common.cuh"

__global__ void dol_kv_write_kernel(dol_cuda_kv kv, const float *src, int ld, int k_off, int v_off,
                                    const int32_t *pos, const int32_t *item)
{
    const int t = blockIdx.x;
    const int p = pos[t];
    const int32_t block = kv.tables[(size_t)item[t] * kv.max_blocks + p / kv.block_size];
    const int r = p % kv.block_size;
    /* dol_kv_row returns const for the readers; this kernel owns the write */
    __half *kd = const_cast<__half *>(dol_kv_row(kv, block, 0, r));
    __half *vd = const_cast<__half *>(dol_kv_row(kv, block, 1, r));
    const float *ks = src + (size_t)t * (size_t)ld + k_off;
    const float *vs = src + (size_t)t * (size_t)ld + v_off;
    for (int i = threadIdx.x; i < kv.kv_dim; i += blockDim.x) {
        kd[i] = __float2half_rn(ks[i]);
        vd[i] = __float2half_rn(vs[i]);
    }
}

extern "C" cudaError_t dol_cuda_kv_write(dol_cuda_kv kv, const float *src, int ld, int k_off,
                                         int v_off, const int32_t *pos, const int32_t *item, int T,
                                         cudaStream_t stream)
{
    if (T <= 0) return cudaSuccess;
    dol_kv_write_kernel<<<T, dol_cuda_cfg_kv_write().threads, 0, stream>>>(kv, src, ld, k_off, v_off, pos, item);
    return cudaGetLastError();
}

/* Layer l's K rows, then its V rows, sit at a fixed pitch of block_size rows
 * inside a block: one 2-D copy moves `rows` rows of all 2*n_layers slabs. */
extern "C" cudaError_t dol_cuda_kv_copy_block(const dol_cuda_kv *kv, int n_layers, int32_t src,
                                              int32_t dst, int rows, cudaStream_t stream)
{
    if (rows <= 0 || src == dst) return cudaSuccess;
    const size_t row_bytes = (size_t)kv->kv_dim * sizeof(dol_f16);
    const size_t pitch = (size_t)kv->block_size * row_bytes;
    const dol_f16 *s = kv->pool + (size_t)src * (size_t)kv->block_elems;
    dol_f16 *d = kv->pool + (size_t)dst * (size_t)kv->block_elems;
    return cudaMemcpy2DAsync(d, pitch, s, pitch, (size_t)rows * row_bytes, (size_t)n_layers * 2,
                             cudaMemcpyDeviceToDevice, stream);
}
