/* kernels/attention_decode.cu — attention of one query token per sequence
 * over its paged FP16 KV cache (the decode step), with grouped-query heads.
 *
 * Work split (FlashDecoding-style): block (h, i, s) is one warp that handles
 * query head h of decode token i over the positions [s*split_len,
 * (s+1)*split_len) that are <= the token's position, 32 keys at a time (lane
 * j scores key j), with an online softmax (running max m, running sum l,
 * unnormalised accumulator acc). It writes (acc, m, l) to `part`; a second
 * kernel merges the splits: out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
 * n_splits is fixed per engine, so the grid does not depend on sequence
 * lengths (CUDA graphs replay it); splits past a token's position exit at
 * once. All arithmetic in FP32 (expf), the output rounded to FP16.
 * A Q8_0 half (template flags KQ, VQ) is read as stored and each value
 * dequantized in registers as q * d; a token's result does not depend on
 * what else is in the batch, whatever the halves' types. */
#include "kernels/cuda_common.cuh"

/* CFG = DOL_CUDA_ATTN_VARIANT(NP, KQ, VQ) (kernels/launch.h): NP pairs of
 * dimensions per lane (head_dim <= 64 * NP); KQ, VQ 1 when the K, V half is
 * Q8_0, 0 when FP16. One template argument, so that the emulation's launch
 * rewrite and the resource check see one name per instance. */
template <int CFG>
__global__ void __launch_bounds__(32)
dol_attn_decode_kernel(float *part, const float *q, int q_ld, const int32_t *dec_rows,
                       const int32_t *pos, const int32_t *item, int n_heads, int group, int hd,
                       float scale, dol_cuda_kv kv, int n_splits, int split_len)
{
    constexpr int NP = CFG >> 2, KQ = (CFG >> 1) & 1, VQ = CFG & 1;
    __shared__ float qs[DOL_CUDA_MAX_HEAD_DIM];
    const int h = blockIdx.x, di = blockIdx.y, split = blockIdx.z, lane = threadIdx.x;
    const int t = dec_rows[di];
    const int p0 = split * split_len;
    const int p1 = min(p0 + split_len, pos[t] + 1); /* exclusive */
    float *out = part + (((size_t)di * n_heads + h) * n_splits + split) * (size_t)(hd + 2);
    if (p0 >= p1) { /* nothing to attend to in this split */
        if (lane == 0) {
            out[hd] = -INFINITY;
            out[hd + 1] = 0.0f;
        }
        return;
    }
    const int kvh = h / group;
    const int n_pairs = hd / 2;
    const int32_t *table = kv.tables + (size_t)item[t] * kv.max_blocks;
    const float *qr = q + (size_t)t * q_ld + (size_t)h * hd;
    for (int i = lane; i < hd; i += 32) qs[i] = qr[i];
    __syncwarp();

    float m = -INFINITY, l = 0.0f;
    float acc[2 * NP];
#pragma unroll
    for (int c = 0; c < 2 * NP; c++) acc[c] = 0.0f;

    for (int base = p0; base < p1; base += 32) {
        const int n_valid = min(32, p1 - base); /* keys base .. base+n_valid-1, >= 1 */
        float s = -INFINITY;
        if (lane < n_valid) {
            if (KQ) {
                const __half *sc;
                const int8_t *k = dol_kv_q8_pos(kv, table, base + lane, 0, &sc);
                s = dol_dot_q_k8(qs, k + (size_t)kvh * hd, sc + (size_t)kvh * (hd / kv.g.qb), hd, kv.g.qb) * scale;
            } else {
                s = dol_dot_q_k(qs, dol_kv_pos(kv, table, base + lane, 0) + (size_t)kvh * hd, hd) * scale;
            }
        }
        const float m_new = fmaxf(m, dol_warp_max(s)); /* finite: one key at least */
        const float corr = expf(m - m_new);            /* 0 on the first step (m = -inf) */
        const float p = lane < n_valid ? expf(s - m_new) : 0.0f;
        l = l * corr + dol_warp_sum(p);
#pragma unroll
        for (int c = 0; c < 2 * NP; c++) acc[c] *= corr;
        for (int j = 0; j < n_valid; j++) {
            const float pj = __shfl_sync(DOL_FULL_MASK, p, j);
            if (VQ) {
                const __half *sc;
                const char2 *vr = reinterpret_cast<const char2 *>(dol_kv_q8_pos(kv, table, base + j, 1, &sc) +
                                                                  (size_t)kvh * hd);
                sc += (size_t)kvh * (hd / kv.g.qb);
#pragma unroll
                for (int c = 0; c < NP; c++) {
                    const int pi = lane + 32 * c;
                    if (pi < n_pairs) {
                        const char2 v = vr[pi];
                        const float d = __half2float(sc[2 * pi / kv.g.qb]);
                        acc[2 * c] += pj * ((float)v.x * d);
                        acc[2 * c + 1] += pj * ((float)v.y * d);
                    }
                }
            } else {
                const __half2 *vr =
                    reinterpret_cast<const __half2 *>(dol_kv_pos(kv, table, base + j, 1) + (size_t)kvh * hd);
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
        }
        m = m_new;
    }
#pragma unroll
    for (int c = 0; c < NP; c++) {
        const int pi = lane + 32 * c;
        if (pi < n_pairs) {
            out[2 * pi] = acc[2 * c];
            out[2 * pi + 1] = acc[2 * c + 1];
        }
    }
    if (lane == 0) {
        out[hd] = m;
        out[hd + 1] = l;
    }
}

__global__ void dol_attn_decode_combine_kernel(__half *o, int out_ld, const float *part,
                                               const int32_t *dec_rows, int n_heads, int hd,
                                               int n_splits)
{
    const int h = blockIdx.x, di = blockIdx.y;
    const int t = dec_rows[di];
    const size_t stride = (size_t)hd + 2;
    const float *ps = part + ((size_t)di * n_heads + h) * n_splits * stride;
    float M = -INFINITY;
    for (int s = 0; s < n_splits; s++)
        if (ps[s * stride + hd + 1] > 0.0f) M = fmaxf(M, ps[s * stride + hd]);
    float L = 0.0f;
    for (int s = 0; s < n_splits; s++) {
        const float ls = ps[s * stride + hd + 1];
        if (ls > 0.0f) L += ls * expf(ps[s * stride + hd] - M);
    }
    /* split 0 always holds position 0, so L > 0 */
    __half *orow = o + (size_t)t * out_ld + (size_t)h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            const float ls = ps[s * stride + hd + 1];
            if (ls > 0.0f) a += ps[s * stride + d] * expf(ps[s * stride + hd] - M);
        }
        orow[d] = __float2half_rn(a / L);
    }
}

/* The decode kernel's arguments and launch shape, for launch_decode. */
struct dol_decode_args {
    float *part;
    const float *q;
    int q_ld;
    const int32_t *dec_rows, *pos, *item;
    int n_heads, group, hd;
    float scale;
    dol_cuda_kv kv;
    int n_splits, split_len;
    dim3 grid;
    unsigned threads;
    cudaStream_t stream;
};

template <int CFG>
static void launch_decode(const dol_decode_args &a)
{
    dol_attn_decode_kernel<CFG><<<a.grid, a.threads, 0, a.stream>>>(a.part, a.q, a.q_ld, a.dec_rows, a.pos, a.item,
                                                                   a.n_heads, a.group, a.hd, a.scale, a.kv,
                                                                   a.n_splits, a.split_len);
}

extern "C" size_t dol_cuda_attention_decode_part_floats(int n_dec, int n_heads, int head_dim,
                                                        int n_splits)
{
    return (size_t)n_dec * (size_t)n_heads * (size_t)n_splits * ((size_t)head_dim + 2);
}

extern "C" cudaError_t dol_cuda_attention_decode(dol_f16 *out, int out_ld, const float *q, int q_ld,
                                                 const int32_t *dec_rows, int n_dec,
                                                 const int32_t *pos, const int32_t *item,
                                                 int n_heads, int n_kv_heads, int head_dim,
                                                 float scale, dol_cuda_kv kv, float *part,
                                                 int n_splits, int split_len, cudaStream_t stream)
{
    if (n_dec <= 0) return cudaSuccess;
    if (head_dim % 8 != 0 || head_dim > DOL_CUDA_MAX_HEAD_DIM || n_kv_heads <= 0 ||
        n_heads % n_kv_heads != 0 || n_dec > 65535 || n_splits < 1 || n_splits > 65535 ||
        split_len < 1 || ((kv.g.q8[0] || kv.g.q8[1]) && (kv.g.qb <= 0 || head_dim % kv.g.qb != 0)))
        return cudaErrorInvalidValue;
    const dim3 grid((unsigned)n_heads, (unsigned)n_dec, (unsigned)n_splits);
    const int group = n_heads / n_kv_heads;
    const dol_decode_args a = { part, q, q_ld, dec_rows, pos, item, n_heads, group, head_dim, scale, kv,
                                n_splits, split_len, grid, dol_cuda_cfg_attn_decode(head_dim).threads, stream };
    const int v = DOL_CUDA_ATTN_VARIANT(dol_cuda_attn_pairs(head_dim), kv.g.q8[0], kv.g.q8[1]);
    switch (v) { /* one instance per pair count and per type of each half */
#define DOL_DECODE_CASE(NP)                                                                             \
    case DOL_CUDA_ATTN_VARIANT(NP, 0, 0): launch_decode<DOL_CUDA_ATTN_VARIANT(NP, 0, 0)>(a); break;   \
    case DOL_CUDA_ATTN_VARIANT(NP, 0, 1): launch_decode<DOL_CUDA_ATTN_VARIANT(NP, 0, 1)>(a); break;   \
    case DOL_CUDA_ATTN_VARIANT(NP, 1, 0): launch_decode<DOL_CUDA_ATTN_VARIANT(NP, 1, 0)>(a); break;   \
    case DOL_CUDA_ATTN_VARIANT(NP, 1, 1): launch_decode<DOL_CUDA_ATTN_VARIANT(NP, 1, 1)>(a); break;
        DOL_DECODE_CASE(1)
        DOL_DECODE_CASE(2)
        DOL_DECODE_CASE(4)
#undef DOL_DECODE_CASE
    default:
        return cudaErrorInvalidValue;
    }
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess) return rc;
    const unsigned combine_threads = dol_cuda_cfg_attn_combine(head_dim).threads;
    dol_attn_decode_combine_kernel<<<dim3((unsigned)n_heads, (unsigned)n_dec), combine_threads, 0, stream>>>(
        reinterpret_cast<__half *>(out), out_ld, part, dec_rows, n_heads, head_dim, n_splits);
    return cudaGetLastError();
}

extern "C" cudaError_t dol_cuda_kernels_loadable(void)
{
    cudaFuncAttributes a;
    return cudaFuncGetAttributes(&a, dol_attn_decode_combine_kernel);
}
