/* kernels/sampling.cu — logits post-processing on the device, one block per
 * row: argmax (greedy decoding without copying the row to the host) and the
 * log-sum-exp of a row (log-probabilities as logits[i] - lse). The engine
 * interface (engine.h) returns FP32 logits rows to the host, where the
 * scheduler samples; these kernels serve callers that need only the token or
 * a few log-probabilities. */
#include "kernels/cuda_common.cuh"

#define DOL_SAMPLING_THREADS DOL_CUDA_SAMPLING_THREADS

/* (v, i) beats (bv, bi) when larger, or equal with a lower index; NaN never
 * beats anything (comparisons with NaN are false), matching a host loop
 * `if (x[i] > x[best]) best = i` over increasing i. */
__device__ __forceinline__ bool dol_better(float v, int i, float bv, int bi)
{
    return v > bv || (v == bv && i < bi);
}

__global__ void dol_argmax_kernel(int32_t *idx, float *val, const float *logits, int V)
{
    const float *row = logits + (size_t)blockIdx.x * (size_t)V;
    float bv = -INFINITY;
    int bi = -1;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float v = row[i];
        if (bi < 0 ? !(v != v) : dol_better(v, i, bv, bi)) { bv = v; bi = i; }
    }
    /* warp then block reduction of (value, index); empty slots have bi < 0 */
    __shared__ float sv[32];
    __shared__ int si[32];
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(DOL_FULL_MASK, bv, o);
        const int oi = __shfl_xor_sync(DOL_FULL_MASK, bi, o);
        if (oi >= 0 && (bi < 0 || dol_better(ov, oi, bv, bi))) { bv = ov; bi = oi; }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        const int n_warps = blockDim.x >> 5;
        bv = lane < n_warps ? sv[lane] : -INFINITY;
        bi = lane < n_warps ? si[lane] : -1;
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(DOL_FULL_MASK, bv, o);
            const int oi = __shfl_xor_sync(DOL_FULL_MASK, bi, o);
            if (oi >= 0 && (bi < 0 || dol_better(ov, oi, bv, bi))) { bv = ov; bi = oi; }
        }
        if (lane == 0) {
            /* a row of NaNs only: index 0, like the host loop */
            idx[blockIdx.x] = bi < 0 ? 0 : bi;
            val[blockIdx.x] = bi < 0 ? row[0] : bv;
        }
    }
}

__global__ void dol_logsumexp_kernel(float *lse, const float *logits, int V)
{
    const float *row = logits + (size_t)blockIdx.x * (size_t)V;
    __shared__ float sm[32];
    __shared__ float s_max;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, row[i]);
    m = dol_warp_max(m);
    if (lane == 0) sm[warp] = m;
    __syncthreads();
    if (warp == 0) {
        float v = lane < n_warps ? sm[lane] : -INFINITY;
        v = dol_warp_max(v);
        if (lane == 0) s_max = v;
    }
    __syncthreads();
    m = s_max;
    double s = 0.0;
    if (m != -INFINITY)
        for (int i = threadIdx.x; i < V; i += blockDim.x) s += (double)expf(row[i] - m);
    s = dol_block_sum_d(s);
    if (threadIdx.x == 0) lse[blockIdx.x] = m == -INFINITY ? -INFINITY : m + (float)log(s);
}

extern "C" cudaError_t dol_cuda_argmax_rows(int32_t *idx, float *val, const float *logits, int R,
                                            int V, cudaStream_t stream)
{
    if (R <= 0) return cudaSuccess;
    dol_argmax_kernel<<<R, dol_cuda_cfg_sampling().threads, 0, stream>>>(idx, val, logits, V);
    return cudaGetLastError();
}

extern "C" cudaError_t dol_cuda_logsumexp_rows(float *lse, const float *logits, int R, int V,
                                               cudaStream_t stream)
{
    if (R <= 0) return cudaSuccess;
    dol_logsumexp_kernel<<<R, dol_cuda_cfg_sampling().threads, 0, stream>>>(lse, logits, V);
    return cudaGetLastError();
}
