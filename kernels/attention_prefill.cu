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
 * FP32 arithmetic (expf), output rounded to FP16. A Q8_0 half is staged as
 * stored (int8 quants, scales as FP32) and each value dequantized as q * d
 * where it is used: no dequantized copy of the cache. */
#include "kernels/cuda_common.cuh"

#define BQ DOL_CUDA_PREFILL_BQ
#define BK DOL_CUDA_PREFILL_BK

/* One key tile of one half in shared memory (dol_cuda_prefill_half_smem):
 * FP16 rows, or Q8_0 quants and FP32 scales. */
struct dol_tile_half {
    __half *h;     /* FP16: [BK][hd + 2] */
    int8_t *q;     /* Q8_0: [BK][hd + 4] quants */
    float *d;      /* Q8_0: [BK][sp] scales */
    int sp;        /* scales per shared row: (hd / qb) | 1 */
};

template <int Q8>
__device__ __forceinline__ dol_tile_half dol_tile_at(uint8_t *base, int hd, int qb)
{
    dol_tile_half t = { nullptr, nullptr, nullptr, (hd / qb) | 1 };
    if (Q8) {
        t.q = reinterpret_cast<int8_t *>(base);
        t.d = reinterpret_cast<float *>(base + (size_t)BK * (hd + 4));
    } else {
        t.h = reinterpret_cast<__half *>(base);
    }
    return t;
}

/* Stage positions kv0 .. kv0 + BK - 1 (zeros past `last`) of half w, head
 * kvh, into t; all threads of the block take part. */
template <int Q8>
__device__ __forceinline__ void dol_tile_load(const dol_tile_half &t, const dol_cuda_kv &kv, const int32_t *table,
                                              int w, int kvh, int hd, int kv0, int last)
{
    if (Q8) {
        const int n_words = hd / 4, nbh = hd / kv.g.qb;
        for (int i = threadIdx.x; i < BK * n_words; i += blockDim.x) {
            const int j = i / n_words, c = i % n_words;
            const int p = kv0 + j;
            uint32_t word = 0;
            if (p <= last) {
                const __half *sc;
                word = reinterpret_cast<const uint32_t *>(dol_kv_q8_pos(kv, table, p, w, &sc) + (size_t)kvh * hd)[c];
            }
            reinterpret_cast<uint32_t *>(t.q + (size_t)j * (hd + 4))[c] = word;
        }
        for (int i = threadIdx.x; i < BK * nbh; i += blockDim.x) {
            const int j = i / nbh, c = i % nbh;
            const int p = kv0 + j;
            float d = 0.0f;
            if (p <= last) {
                const __half *sc;
                (void)dol_kv_q8_pos(kv, table, p, w, &sc);
                d = __half2float(sc[(size_t)kvh * nbh + c]);
            }
            t.d[(size_t)j * t.sp + c] = d;
        }
    } else {
        const int n_pairs = hd / 2, kst = hd + 2;
        for (int i = threadIdx.x; i < BK * n_pairs; i += blockDim.x) {
            const int j = i / n_pairs, c = i % n_pairs;
            const int p = kv0 + j;
            __half2 v = __float2half2_rn(0.0f);
            if (p <= last) v = reinterpret_cast<const __half2 *>(dol_kv_pos(kv, table, p, w) + (size_t)kvh * hd)[c];
            reinterpret_cast<__half2 *>(t.h + (size_t)j * kst)[c] = v;
        }
    }
}

/* Values 2c and 2c + 1 of staged row j, as FP32 (q * d for Q8_0). */
template <int Q8>
__device__ __forceinline__ float2 dol_tile_pair(const dol_tile_half &t, int j, int c, int hd, int qb)
{
    if (Q8) {
        const int8_t *r = t.q + (size_t)j * (hd + 4);
        const float d = t.d[(size_t)j * t.sp + 2 * c / qb];
        return make_float2((float)r[2 * c] * d, (float)r[2 * c + 1] * d);
    }
    return __half22float2(reinterpret_cast<const __half2 *>(t.h + (size_t)j * (hd + 2))[c]);
}

/* CFG = DOL_CUDA_ATTN_VARIANT(NP, KQ, VQ) (kernels/launch.h): NP pairs of
 * dimensions per lane (head_dim <= 64 * NP); KQ, VQ 1 when the K, V half is
 * Q8_0. */
template <int CFG>
__global__ void __launch_bounds__(BQ * 32)
dol_attn_prefill_kernel(__half *out, int out_ld, const float *q, int q_ld, const int4 *tiles,
                        int group, int hd, float scale, dol_cuda_kv kv)
{
    constexpr int NP = CFG >> 2, KQ = (CFG >> 1) & 1, VQ = CFG & 1;
    extern __shared__ float4 dol_smem[]; /* float4: 16-byte alignment */
    float *qs = reinterpret_cast<float *>(dol_smem);                  /* [BQ][hd] */
    uint8_t *kbase = reinterpret_cast<uint8_t *>(qs + BQ * hd);
    uint8_t *vbase = kbase + dol_cuda_prefill_half_smem(hd, KQ);
    const int qb = kv.g.qb;
    const dol_tile_half kt = dol_tile_at<KQ>(kbase, hd, qb), vt = dol_tile_at<VQ>(vbase, hd, qb);
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
        dol_tile_load<KQ>(kt, kv, table, 0, kvh, hd, kv0, last);
        dol_tile_load<VQ>(vt, kv, table, 1, kvh, hd, kv0, last);
        __syncthreads();
        /* keys kv0 .. kv0+n_valid-1 are at or before this warp's query */
        const int n_valid = active ? min(BK, qpos - kv0 + 1) : 0;
        if (n_valid > 0) { /* uniform within the warp */
            float s = -INFINITY;
            if (lane < n_valid) {
                float d = 0.0f;
                for (int c = 0; c < n_pairs; c++) {
                    const float2 f = dol_tile_pair<KQ>(kt, lane, c, hd, qb);
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
#pragma unroll
                for (int c = 0; c < NP; c++) {
                    const int pi = lane + 32 * c;
                    if (pi < n_pairs) {
                        const float2 v = dol_tile_pair<VQ>(vt, j, pi, hd, qb);
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

/* The prefill kernel's arguments and launch shape, for launch_prefill. */
struct dol_prefill_args {
    __half *out;
    int out_ld;
    const float *q;
    int q_ld;
    const int4 *tiles;
    int group, hd;
    float scale;
    dol_cuda_kv kv;
    dim3 grid;
    dol_cuda_launch_cfg c;
    cudaStream_t stream;
};

template <int CFG>
static cudaError_t launch_prefill(const dol_prefill_args &a)
{
    cudaError_t rc = dol_cuda_apply_optin(dol_attn_prefill_kernel<CFG>, a.c);
    if (rc != cudaSuccess) return rc;
    dol_attn_prefill_kernel<CFG><<<a.grid, a.c.threads, a.c.smem, a.stream>>>(a.out, a.out_ld, a.q, a.q_ld, a.tiles,
                                                                              a.group, a.hd, a.scale, a.kv);
    return cudaGetLastError();
}

extern "C" cudaError_t dol_cuda_attention_prefill(dol_f16 *out, int out_ld, const float *q, int q_ld,
                                                  const int32_t *tiles, int n_tiles, int n_heads,
                                                  int n_kv_heads, int head_dim, float scale,
                                                  dol_cuda_kv kv, cudaStream_t stream)
{
    if (n_tiles <= 0) return cudaSuccess;
    if (head_dim % 8 != 0 || head_dim > DOL_CUDA_MAX_HEAD_DIM || n_kv_heads <= 0 ||
        n_heads % n_kv_heads != 0 || n_heads > 65535 ||
        ((kv.g.q8[0] || kv.g.q8[1]) && (kv.g.qb <= 0 || head_dim % kv.g.qb != 0)))
        return cudaErrorInvalidValue;
    const dim3 grid((unsigned)n_tiles, (unsigned)n_heads);
    /* threads, the [BQ][hd] FP32 queries and the K and V tiles in shared memory */
    const dol_cuda_launch_cfg c = dol_cuda_cfg_attn_prefill(head_dim, kv.g.q8[0], kv.g.q8[1]);
    const dol_prefill_args a = { reinterpret_cast<__half *>(out), out_ld, q, q_ld,
                                 reinterpret_cast<const int4 *>(tiles), n_heads / n_kv_heads, head_dim, scale,
                                 kv, grid, c, stream };
    switch (DOL_CUDA_ATTN_VARIANT(dol_cuda_attn_pairs(head_dim), kv.g.q8[0], kv.g.q8[1])) {
#define DOL_PREFILL_CASE(NP)                                                                              \
    case DOL_CUDA_ATTN_VARIANT(NP, 0, 0): return launch_prefill<DOL_CUDA_ATTN_VARIANT(NP, 0, 0)>(a);     \
    case DOL_CUDA_ATTN_VARIANT(NP, 0, 1): return launch_prefill<DOL_CUDA_ATTN_VARIANT(NP, 0, 1)>(a);     \
    case DOL_CUDA_ATTN_VARIANT(NP, 1, 0): return launch_prefill<DOL_CUDA_ATTN_VARIANT(NP, 1, 0)>(a);     \
    case DOL_CUDA_ATTN_VARIANT(NP, 1, 1): return launch_prefill<DOL_CUDA_ATTN_VARIANT(NP, 1, 1)>(a);
        DOL_PREFILL_CASE(1)
        DOL_PREFILL_CASE(2)
        DOL_PREFILL_CASE(4)
#undef DOL_PREFILL_CASE
    default:
        return cudaErrorInvalidValue;
    }
}
