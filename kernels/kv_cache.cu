/* kernels/kv_cache.cu — the paged KV cache on the device (layout in
 * kernels.h and kernels/kv_layout.h): writing the new tokens' K and V rows
 * into their blocks, as FP16 or quantized to Q8_0 once here, and copying the
 * first rows of a block for sequence forks. */
#include "kernels/cuda_common.cuh"

#include "dolphin/kv_q8.h"

/* One half's row r of `block` from the FP32 values x[0..kv_dim): FP16 values,
 * or one thread per Q8_0 block of qb values through dol_kv_q8_quantize, the
 * host's own function, so that both backends store the same bytes. */
__device__ __forceinline__ void dol_kv_write_half(const dol_cuda_kv &kv, int32_t block, int w, int r,
                                                  const float *x)
{
    /* dol_kv_half returns const for the readers; this kernel owns the write */
    uint8_t *base = const_cast<uint8_t *>(dol_kv_half(kv, block, w));
    if (kv.g.q8[w]) {
        const int qb = kv.g.qb, nb = kv.kv_dim / qb;
        int8_t *q = reinterpret_cast<int8_t *>(base + (size_t)r * (size_t)kv.kv_dim);
        uint16_t *sc = reinterpret_cast<uint16_t *>(base + (size_t)kv.g.scale_off[w]) + (size_t)r * (size_t)nb;
        for (int b = threadIdx.x; b < nb; b += blockDim.x)
            sc[b] = dol_kv_q8_quantize(x + (size_t)b * qb, 1, qb, q + (size_t)b * qb, 1);
    } else {
        __half *h = reinterpret_cast<__half *>(base + (size_t)r * (size_t)kv.kv_dim * 2);
        for (int i = threadIdx.x; i < kv.kv_dim; i += blockDim.x) h[i] = __float2half_rn(x[i]);
    }
}

__global__ void dol_kv_write_kernel(dol_cuda_kv kv, const float *src, int ld, int k_off, int v_off,
                                    const int32_t *pos, const int32_t *item)
{
    const int t = blockIdx.x;
    const int p = pos[t];
    const int32_t block = kv.tables[(size_t)item[t] * kv.max_blocks + p / kv.block_size];
    const int r = p % kv.block_size;
    dol_kv_write_half(kv, block, 0, r, src + (size_t)t * (size_t)ld + k_off);
    dol_kv_write_half(kv, block, 1, r, src + (size_t)t * (size_t)ld + v_off);
}

extern "C" cudaError_t dol_cuda_kv_write(dol_cuda_kv kv, const float *src, int ld, int k_off,
                                         int v_off, const int32_t *pos, const int32_t *item, int T,
                                         cudaStream_t stream)
{
    if (T <= 0) return cudaSuccess;
    if ((kv.g.q8[0] || kv.g.q8[1]) && (kv.g.qb <= 0 || kv.kv_dim % kv.g.qb != 0)) return cudaErrorInvalidValue;
    dol_kv_write_kernel<<<T, dol_cuda_cfg_kv_write().threads, 0, stream>>>(kv, src, ld, k_off, v_off, pos, item);
    return cudaGetLastError();
}

/* Each region of a layer (an FP16 half's values; a Q8_0 half's quants, then
 * its scales) sits at a fixed pitch of layer_bytes from one layer to the
 * next: one 2-D copy per region moves its first `rows` rows of all layers. */
extern "C" cudaError_t dol_cuda_kv_copy_block(const dol_cuda_kv *kv, int n_layers, int32_t src,
                                              int32_t dst, int rows, cudaStream_t stream)
{
    if (rows <= 0 || src == dst || n_layers <= 0) return cudaSuccess;
    const dol_cuda_kv_geom *g = &kv->g;
    const uint8_t *s0 = kv->pool + (size_t)src * (size_t)g->block_bytes;
    uint8_t *d0 = kv->pool + (size_t)dst * (size_t)g->block_bytes;
    const size_t pitch = (size_t)g->layer_bytes;
    for (int w = 0; w < 2; w++) {
        size_t off[2], width[2];
        int n = 0;
        if (g->q8[w]) {
            off[n] = (size_t)g->half_off[w];
            width[n++] = (size_t)rows * (size_t)kv->kv_dim;
            off[n] = (size_t)(g->half_off[w] + g->scale_off[w]);
            width[n++] = (size_t)rows * (size_t)(kv->kv_dim / g->qb) * 2;
        } else {
            off[n] = (size_t)g->half_off[w];
            width[n++] = (size_t)rows * (size_t)kv->kv_dim * 2;
        }
        for (int i = 0; i < n; i++) {
            cudaError_t rc = cudaMemcpy2DAsync(d0 + off[i], pitch, s0 + off[i], pitch, width[i], (size_t)n_layers,
                                               cudaMemcpyDeviceToDevice, stream);
            if (rc != cudaSuccess) return rc;
        }
    }
    return cudaSuccess;
}
