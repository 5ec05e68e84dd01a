/* kernels/rope.cu — rotary position embedding (Su et al. 2021) in the
 * Hugging Face rotate_half layout: within each head, element i pairs with
 * i + head_dim/2. Applied in place to the q heads and k heads at the start of
 * each row of the fused QKV output. The angle tables come from the host
 * (computed in double, as in the CPU backend); the products and sums use
 * __fmul_rn/__fadd_rn so nvcc does not fuse them into FMAs: the result is
 * bit-identical to dol_cpu_rope. */
#include "kernels/cuda_common.cuh"

__global__ void dol_rope_kernel(float *x, int ld, const int32_t *pos, int n_rot_heads, int head_dim,
                                const float *cos_tab, const float *sin_tab)
{
    const int t = blockIdx.x;
    const int half = head_dim / 2;
    const float *cr = cos_tab + (size_t)pos[t] * half;
    const float *sr = sin_tab + (size_t)pos[t] * half;
    float *row = x + (size_t)t * (size_t)ld;
    for (int idx = threadIdx.x; idx < n_rot_heads * half; idx += blockDim.x) {
        const int h = idx / half, i = idx % half;
        float *v = row + (size_t)h * head_dim;
        const float a = v[i], b = v[i + half], c = cr[i], s = sr[i];
        v[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        v[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
}

extern "C" cudaError_t dol_cuda_rope(float *x, int ld, const int32_t *pos, int T, int n_heads,
                                     int n_kv_heads, int head_dim, const float *cos_tab,
                                     const float *sin_tab, cudaStream_t stream)
{
    if (T <= 0) return cudaSuccess;
    dol_rope_kernel<<<T, dol_cuda_cfg_rope().threads, 0, stream>>>(x, ld, pos, n_heads + n_kv_heads, head_dim, cos_tab,
                                           sin_tab);
    return cudaGetLastError();
}
