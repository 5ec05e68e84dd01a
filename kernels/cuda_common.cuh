/* kernels/cuda_common.cuh — what every CUDA file of Dolphin shares:
 *  - host-side error checks (CUDA_CHECK, CUBLAS_CHECK) that turn a failed
 *    call into one line in the caller's error buffer and `return -1` — never
 *    an abort. Usable from C (src/engine/cuda_engine.c) and CUDA C++;
 *  - device helpers (CUDA C++ only): warp and block reductions, FP16
 *    conversions, and the address of a row of the paged KV cache.
 *
 * CUDA_CHECK and CUBLAS_CHECK expect `char *err` and `size_t errlen` in scope
 * (the error-buffer convention of dolphin/common.h) and a function returning
 * int. */
#ifndef DOLPHIN_CUDA_COMMON_CUH
#define DOLPHIN_CUDA_COMMON_CUH

#include <cuda_runtime_api.h>
#include <stdio.h>

#include "dolphin/common.h"

/* "device N (compute capability X.Y)": the current device, for error
 * messages, so a failure names the hardware it happened on. */
static inline const char *dol_cuda_where(char *buf, size_t n)
{
    int dev = -1, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(buf, n, "device %d (compute capability unknown)", dev);
    } else {
        snprintf(buf, n, "device %d (compute capability %d.%d)", dev, major, minor);
    }
    return buf;
}

#define CUDA_CHECK(call)                                                                    \
    do {                                                                                    \
        cudaError_t cc_rc_ = (call);                                                        \
        if (cc_rc_ != cudaSuccess) {                                                        \
            char cc_where_[80];                                                             \
            dol_set_err(err, errlen, "cuda: %s failed: %s (%s) on %s (%s:%d)", #call,       \
                        cudaGetErrorString(cc_rc_), cudaGetErrorName(cc_rc_),               \
                        dol_cuda_where(cc_where_, sizeof cc_where_), __FILE__, __LINE__);   \
            return -1;                                                                      \
        }                                                                                   \
    } while (0)

/* cublasGetStatusString exists since cuBLAS 11.4. */
#define CUBLAS_CHECK(call)                                                                  \
    do {                                                                                    \
        cublasStatus_t cb_rc_ = (call);                                                     \
        if (cb_rc_ != CUBLAS_STATUS_SUCCESS) {                                              \
            char cb_where_[80];                                                             \
            dol_set_err(err, errlen, "cublas: %s failed: %s on %s (%s:%d)", #call,          \
                        cublasGetStatusString(cb_rc_),                                      \
                        dol_cuda_where(cb_where_, sizeof cb_where_), __FILE__, __LINE__);   \
            return -1;                                                                      \
        }                                                                                   \
    } while (0)

/* DOL_CUDA_EMU: the same device code, compiled as host C++ by the emulation (emu/) */
#if defined(__CUDACC__) || defined(DOL_CUDA_EMU)
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "kernels/kernels.h"

#define DOL_FULL_MASK 0xffffffffu

__device__ __forceinline__ float dol_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(DOL_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ double dol_warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(DOL_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float dol_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(DOL_FULL_MASK, v, o));
    return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024);
 * every thread gets the result. Call at most once per kernel: it uses a
 * static shared buffer. */
__device__ __forceinline__ double dol_block_sum_d(double v)
{
    __shared__ double partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_warps = blockDim.x >> 5;
    v = dol_warp_sum_d(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double s = lane < n_warps ? partial[lane] : 0.0;
        s = dol_warp_sum_d(s);
        if (lane == 0) partial[0] = s;
    }
    __syncthreads();
    return partial[0];
}

__device__ __forceinline__ __half dol_h(dol_f16 bits) { return __ushort_as_half(bits); }

/* The part of block `block` that holds half w (0 K, 1 V) of layer kv.layer
 * (kernels/kv_layout.h). 64-bit offsets: pools exceed 2^32 bytes. */
__device__ __forceinline__ const uint8_t *dol_kv_half(const dol_cuda_kv &kv, int32_t block, int w)
{
    return kv.pool + (size_t)block * (size_t)kv.g.block_bytes + (size_t)kv.layer * (size_t)kv.g.layer_bytes +
           (size_t)kv.g.half_off[w];
}

/* Row r of an FP16 half: kv_dim FP16 values, 16-byte aligned. */
__device__ __forceinline__ const __half *dol_kv_row(const dol_cuda_kv &kv, int32_t block, int w, int r)
{
    return reinterpret_cast<const __half *>(dol_kv_half(kv, block, w) + (size_t)r * (size_t)kv.kv_dim * 2);
}

/* The row of position p of a sequence, through its block table (FP16 half). */
__device__ __forceinline__ const __half *dol_kv_pos(const dol_cuda_kv &kv, const int32_t *table,
                                                    int p, int w)
{
    return dol_kv_row(kv, table[p / kv.block_size], w, p % kv.block_size);
}

/* Row r of a Q8_0 half: kv_dim int8 quants (8-byte aligned) and their
 * kv_dim / qb F16 scales. */
__device__ __forceinline__ const int8_t *dol_kv_q8_row(const dol_cuda_kv &kv, int32_t block, int w, int r,
                                                       const __half **scales)
{
    const uint8_t *base = dol_kv_half(kv, block, w);
    *scales = reinterpret_cast<const __half *>(base + (size_t)kv.g.scale_off[w]) +
              (size_t)r * (size_t)(kv.kv_dim / kv.g.qb);
    return reinterpret_cast<const int8_t *>(base + (size_t)r * (size_t)kv.kv_dim);
}

/* The Q8_0 row of position p of a sequence, through its block table. */
__device__ __forceinline__ const int8_t *dol_kv_q8_pos(const dol_cuda_kv &kv, const int32_t *table, int p,
                                                       int w, const __half **scales)
{
    return dol_kv_q8_row(kv, table[p / kv.block_size], w, p % kv.block_size, scales);
}

/* q . k for a query in FP32 (shared memory) and a key row of head_dim FP16
 * values, summed in order of increasing index. The row must be 16-byte
 * aligned and head_dim a multiple of 8 (rows of the KV pool are). */
__device__ __forceinline__ float dol_dot_q_k(const float *q, const __half *k, int head_dim)
{
    float s = 0.0f;
    for (int i = 0; i < head_dim; i += 8) {
        union {
            uint4 u;
            __half2 h[4];
        } raw;
        raw.u = *reinterpret_cast<const uint4 *>(k + i);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 f = __half22float2(raw.h[j]);
            s += q[i + 2 * j] * f.x;
            s += q[i + 2 * j + 1] * f.y;
        }
    }
    return s;
}

/* q . k for a key row of head_dim Q8_0 quants k (8-byte aligned) with the
 * scales sc of its head, qb values a scale (a multiple of 8): each value
 * dequantized as q * d (exact in FP32), summed in order of increasing index
 * as dol_dot_q_k does. */
__device__ __forceinline__ float dol_dot_q_k8(const float *q, const int8_t *k, const __half *sc, int head_dim,
                                              int qb)
{
    float s = 0.0f;
    for (int i = 0; i < head_dim; i += 8) {
        const float d = __half2float(sc[i / qb]);
        union {
            uint2 u;
            int8_t c[8];
        } raw;
        raw.u = *reinterpret_cast<const uint2 *>(k + i);
#pragma unroll
        for (int j = 0; j < 8; j++) s += q[i + j] * ((float)raw.c[j] * d);
    }
    return s;
}

static inline unsigned dol_div_up(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

/* Raise the kernel's dynamic shared memory limit when its configuration asks
 * for more than the default (cfg.smem_optin, kernels/launch.h); nothing
 * otherwise. Call before the launch. */
template <typename K>
static inline cudaError_t dol_cuda_apply_optin(K *kernel, const dol_cuda_launch_cfg &cfg)
{
    if (!cfg.smem_optin) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cfg.smem_optin);
}
#endif /* __CUDACC__ || DOL_CUDA_EMU */

#endif
