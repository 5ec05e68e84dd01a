/* kernels/attention_prefill.cu — causal attention for prefill chunks over
 * the paged FP16 KV cache, tiled with an online softmax (FlashAttention, Dao
 * et al. 2022), grouped-query heads.
 *
 * Block (tile, h): DOL_CUDA_PREFILL_BQ consecutive queries of one sequence
 * (warp w owns query w), query head h. The block walks the sequence's keys
 * from position 0 to its last query's position in tiles of 32: all threads
 * copy the tile's K and V rows (through the block table) into shared memory
 * once for the BQ queries, then each warp scores the tile (lane j: key j),
 * masks keys past its own position (causal), and updates its running max,
 * running sum and unnormalised output. K/V rows in shared memory are padded
 * by one 32-bit word so the lanes' row reads fall in distinct banks.
 * FP32 arithmetic (expf), output rounded to FP16. */
#include "kernels/cuda_common.cuh"

#define BQ DOL_CUDA_PREFILL_BQ
#define BK DOL_CUDA_PREFILL_BK

template <int NP>
__global__ void __launch_bounds__(BQ * 32)
dol_attn_prefill_kernel(__half *out, int out_ld, const float *q, int q_ld, const int4 *tiles,
                        int group, int hd, float scale, dol_cuda_kv kv)
{
    extern __shared__ float4 dol_smem[]; /* float4: 16-byte alignment */
    float *qs = reinterpret_cast<float *>(dol_smem);         /* [BQ][hd] */
    __half *ks = reinterpret_cast<__half *>(qs + BQ * hd);   /* [BK][hd + 2] */
    __half *vs = ks + (size_t)BK * (hd + 2);                 /* [BK][hd + 2] */
    const int kst = hd + 2;                                   /* halves per shared row */
    const int n_pairs = hd / 2;

    const int4 tile = tiles[blockIdx.x]; /* item, first row, queries, first position */
    const int h = blockIdx.y, kvh = h / group;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int32_t *table = kv.tables + (size_t)tile.x * kv.max_blocks;
    const int n_q = tile.z;
    const int last = tile.w + n_q - 1; /* the last position any query of the tile sees */

    for (int i = threadIdx.x; i < BQ * hd; i += blockDim.x) {
        const int r = i / hd, c = i % hd;
        qs[i] = r < n_q ? q[(size_t)(tile.y + r) * q_ld + (size_t)h * hd + c] : 0.0f;
    }
    const bool active = warp < n_q;
    const int qpos = tile.w + warp;
    const float *qw = qs + warp * hd;

    float m = -INFINITY, l = 0.0f;
    float acc[2 * NP];
#pragma unroll
    for (int c = 0; c < 2 * NP; c++) acc[c] = 0.0f;

    for (int kv0 = 0; kv0 <= last; kv0 += BK) { /* same trip count for every warp */
        __syncthreads(); /* Q is in place; every warp is done with the previous tile */
        for (int i = threadIdx.x; i < BK * n_pairs; i += blockDim.x) {
            const int j = i / n_pairs, c = i % n_pairs;
            const int p = kv0 + j;
            __half2 kk = __float2half2_rn(0.0f), vv = kk;
            if (p <= last) {
                kk = reinterpret_cast<const __half2 *>(dol_kv_pos(kv, table, p, 0) + (size_t)kvh * hd)[c];
                vv = reinterpret_cast<const __half2 *>(dol_kv_pos(kv, table, p, 1) + (size_t)kvh * hd)[c];
            }
            reinterpret_cast<__half2 *>(ks + (size_t)j * kst)[c] = kk;
            reinterpret_cast<__half2 *>(vs + (size_t)j * kst)[c] = vv;
        }
        __syncthreads();
        /* keys kv0 .. kv0+n_valid-1 are at or before this warp's query */
        const int n_valid = active ? min(BK, qpos - kv0 + 1) : 0;
        if (n_valid > 0) { /* uniform within the warp */
            float s = -INFINITY;
            if (lane < n_valid) {
                const __half2 *kr = reinterpret_cast<const __half2 *>(ks + (size_t)lane * kst);
                float d = 0.0f;
                for (int c = 0; c < n_pairs; c++) {
                    const float2 f = __half22float2(kr[c]);
                    d += qw[2 * c] * f.x;
                    d += qw[2 * c + 1] * f.y;
                }
                s = d * scale;
            }
            const float m_new = fmaxf(m, dol_warp_max(s));
            const float corr = expf(m - m_new);
            const float p = lane < n_valid ? expf(s - m_new) : 0.0f;
            l = l * corr + dol_warp_sum(p);
#pragma unroll
            for (int c = 0; c < 2 * NP; c++) acc[c] *= corr;
            for (int j = 0; j < n_valid; j++) {
                const float pj = __shfl_sync(DOL_FULL_MASK, p, j);
                const __half2 *vr = reinterpret_cast<const __half2 *>(vs + (size_t)j * kst);
#pragma unroll
                for (int c = 0; c < NP; c++) {
                    const int pi = lane + 32 * c;
                    if (pi < n_pairs) {
                        const float2 v = __half22float2(vr[pi]);
                        acc[2 * c] += pj * v.x;
                        acc[2 * c + 1] += pj * v.y;
                    }
                }
            }
            m = m_new;
        }
    }
    if (active) { /* l > 0: the key at the query's own position is always valid */
        __half2 *orow = reinterpret_cast<__half2 *>(out + (size_t)(tile.y + warp) * out_ld + (size_t)h * hd);
        const float inv = 1.0f / l;
#pragma unroll
        for (int c = 0; c < NP; c++) {
            const int pi = lane + 32 * c;
            if (pi < n_pairs) orow[pi] = __floats2half2_rn(acc[2 * c] * inv, acc[2 * c + 1] * inv);
        }
    }
}

extern "C" cudaError_t dol_cuda_attention_prefill(dol_f16 *out, int out_ld, const float *q, int q_ld,
                                                  const int32_t *tiles, int n_tiles, int n_heads,
                                                  int n_kv_heads, int head_dim, float scale,
                                                  dol_cuda_kv kv, cudaStream_t stream)
{
    if (n_tiles <= 0) return cudaSuccess;
    if (head_dim % 8 != 0 || head_dim > DOL_CUDA_MAX_HEAD_DIM || n_kv_heads <= 0 ||
        n_heads % n_kv_heads != 0 || n_heads > 65535)
        return cudaErrorInvalidValue;
    const dim3 grid((unsigned)n_tiles, (unsigned)n_heads);
    /* threads, the [BQ][hd] FP32 queries and the K and V tiles in shared memory */
    const dol_cuda_launch_cfg c = dol_cuda_cfg_attn_prefill(head_dim);
    const int group = n_heads / n_kv_heads;
    const int4 *t4 = reinterpret_cast<const int4 *>(tiles);
    __half *o = reinterpret_cast<__half *>(out);
    cudaError_t rc = cudaSuccess;
    switch (dol_cuda_attn_pairs(head_dim)) {
    case 1:
        rc = dol_cuda_apply_optin(dol_attn_prefill_kernel<1>, c);
        if (rc != cudaSuccess) return rc;
        dol_attn_prefill_kernel<1><<<grid, c.threads, c.smem, stream>>>(o, out_ld, q, q_ld, t4, group,
                                                                        head_dim, scale, kv);
        break;
    case 2:
        rc = dol_cuda_apply_optin(dol_attn_prefill_kernel<2>, c);
        if (rc != cudaSuccess) return rc;
        dol_attn_prefill_kernel<2><<<grid, c.threads, c.smem, stream>>>(o, out_ld, q, q_ld, t4, group,
                                                                        head_dim, scale, kv);
        break;
    default:
        rc = dol_cuda_apply_optin(dol_attn_prefill_kernel<4>, c);
        if (rc != cudaSuccess) return rc;
        dol_attn_prefill_kernel<4><<<grid, c.threads, c.smem, stream>>>(o, out_ld, q, q_ld, t4, group,
                                                                        head_dim, scale, kv);
        break;
    }
    return cudaGetLastError();
}
