/* kernels/launch.h — the launch configuration of every kernel of kernels/NAME.cu:
 * threads per block, dynamic shared memory and the dynamic-shared-memory
 * limit a launcher sets with cudaFuncSetAttribute, as functions of the
 * model's dimensions. It is the one source of these numbers: the launchers
 * in kernels/NAME.cu call these functions, and tools/cuda_launches.c
 * (dol-cuda-launches) evaluates the same functions over the model shapes for
 * scripts/cuda-resources, which checks them against each architecture's
 * per-block limits and each kernel's compiled resources (registers, static
 * shared memory, __launch_bounds__). Plain C, no CUDA header, so that the
 * checker builds with any C compiler.
 *
 * Blocks are one-dimensional (y = z = 1) everywhere. */
#ifndef DOLPHIN_KERNELS_LAUNCH_H
#define DOLPHIN_KERNELS_LAUNCH_H

#include <stddef.h>

/* Head dimensions the attention kernels accept: even, a multiple of 8, at
 * most 256 (Llama-2 uses 128). */
#define DOL_CUDA_MAX_HEAD_DIM 256
/* Queries per prefill attention tile (one warp each). */
#define DOL_CUDA_PREFILL_BQ 8
/* Keys per shared-memory tile of the prefill attention kernel. */
#define DOL_CUDA_PREFILL_BK 32
/* Threads per block of the NF4 and Q8_0 decode products (4 warps); their
 * __launch_bounds__ and their reduction assume exactly this many. */
#define DOL_CUDA_QUANT_GEMV_THREADS 128
/* Threads per block of the argmax and log-sum-exp kernels. */
#define DOL_CUDA_SAMPLING_THREADS 256
/* Threads per block of the grid-stride dequantization kernels. */
#define DOL_CUDA_DEQUANT_THREADS 256

typedef struct {
    unsigned threads;  /* threads per block */
    size_t smem;       /* dynamic shared memory of one block, bytes */
    /* the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize as its
     * launcher sets it before the launch; 0: not set, so the CUDA default
     * applies (48 KiB minus the kernel's static shared memory) */
    size_t smem_optin;
} dol_cuda_launch_cfg;

static inline dol_cuda_launch_cfg dol_cuda_cfg_plain(unsigned threads)
{
    dol_cuda_launch_cfg c = { threads, 0, 0 };
    return c;
}

/* Pairs of dimensions per lane of the attention kernels (their template
 * argument NP): head_dim <= 64 * NP. */
static inline int dol_cuda_attn_pairs(int head_dim)
{
    return head_dim <= 64 ? 1 : head_dim <= 128 ? 2 : 4;
}

/* The template argument of the attention kernels: NP pairs of dimensions
 * per lane (1, 2 or 4), KQ and VQ 1 when the K, V half of the cache is Q8_0
 * and 0 when FP16. */
#define DOL_CUDA_ATTN_VARIANT(np, kq, vq) ((np) * 4 + (kq) * 2 + (vq))

/* dol_embedding_kernel, dol_blk_embedding_kernel: one block per token row. */
static inline dol_cuda_launch_cfg dol_cuda_cfg_embedding(int d)
{
    (void)d;
    return dol_cuda_cfg_plain(256);
}

/* dol_rmsnorm_residual_kernel: one block per row of d values. */
static inline dol_cuda_launch_cfg dol_cuda_cfg_rmsnorm(int d)
{
    return dol_cuda_cfg_plain(d >= 2048 ? 512 : 256);
}

/* dol_rope_kernel: one block per token row. */
static inline dol_cuda_launch_cfg dol_cuda_cfg_rope(void) { return dol_cuda_cfg_plain(128); }

/* dol_kv_write_kernel: one block per token row. */
static inline dol_cuda_launch_cfg dol_cuda_cfg_kv_write(void) { return dol_cuda_cfg_plain(128); }

/* dol_attn_decode_kernel<DOL_CUDA_ATTN_VARIANT(..)>: one warp per (head, token, split). */
static inline dol_cuda_launch_cfg dol_cuda_cfg_attn_decode(int head_dim)
{
    (void)head_dim;
    return dol_cuda_cfg_plain(32);
}

/* dol_attn_decode_combine_kernel: one block per (head, token). */
static inline dol_cuda_launch_cfg dol_cuda_cfg_attn_combine(int head_dim)
{
    (void)head_dim;
    return dol_cuda_cfg_plain(128);
}

/* Bytes of one key tile of one half in the prefill kernel's shared memory:
 * FP16 rows padded by one 32-bit word ([BK][hd + 2] halves); Q8_0 rows of
 * int8 quants padded by one word ([BK][hd + 4] bytes) and their scales as
 * FP32, (hd / qb) | 1 a row (odd, so the lanes' scale reads fall in
 * distinct banks). */
#if defined(__CUDACC__)
#define DOL_LAUNCH_HD __host__ __device__ /* also laid out by the kernel itself */
#else
#define DOL_LAUNCH_HD
#endif
static inline DOL_LAUNCH_HD size_t dol_cuda_prefill_half_smem(int head_dim, int q8)
{
    const size_t bk = DOL_CUDA_PREFILL_BK, hd = (size_t)head_dim;
    if (!q8) return bk * (hd + 2) * 2;
    const size_t qb = head_dim < 32 ? hd : 32;
    return bk * (hd + 4) + bk * ((hd / qb) | 1) * 4;
}

/* dol_attn_prefill_kernel<DOL_CUDA_ATTN_VARIANT(..)>: one warp per query of a
 * tile; shared memory holds the tile's queries in FP32 ([BQ][hd]) and one key
 * tile of K and of V (dol_cuda_prefill_half_smem): 41,216 bytes for head_dim
 * 256 with FP16 halves (the most), under the 48 KiB that needs no opt-in. */
static inline dol_cuda_launch_cfg dol_cuda_cfg_attn_prefill(int head_dim, int k_q8, int v_q8)
{
    dol_cuda_launch_cfg c = dol_cuda_cfg_plain(DOL_CUDA_PREFILL_BQ * 32);
    c.smem = (size_t)DOL_CUDA_PREFILL_BQ * (size_t)head_dim * 4 + dol_cuda_prefill_half_smem(head_dim, k_q8) +
             dol_cuda_prefill_half_smem(head_dim, v_q8);
    return c;
}

/* dol_silu_mul_kernel: grid-stride over T x f. */
static inline dol_cuda_launch_cfg dol_cuda_cfg_silu_mul(void) { return dol_cuda_cfg_plain(256); }

/* dol_argmax_kernel, dol_logsumexp_kernel: one block per logits row. */
static inline dol_cuda_launch_cfg dol_cuda_cfg_sampling(void)
{
    return dol_cuda_cfg_plain(DOL_CUDA_SAMPLING_THREADS);
}

/* dol_nf4_gemv_kernel<T>, dol_nf4_gemv_any_kernel<T>, dol_q8_gemv_kernel<T>,
 * dol_q8_gemv_any_kernel<T>: DOL_QUANT_ROWS rows of W per block;
 * dol_blk_gemv_kernel<TYPE>: 4 rows per warp. */
static inline dol_cuda_launch_cfg dol_cuda_cfg_quant_gemv(void)
{
    return dol_cuda_cfg_plain(DOL_CUDA_QUANT_GEMV_THREADS);
}

/* dol_nf4_dequant_kernel, dol_q8_dequant_kernel, dol_blk_dequant_kernel:
 * grid-stride. */
static inline dol_cuda_launch_cfg dol_cuda_cfg_dequant(void)
{
    return dol_cuda_cfg_plain(DOL_CUDA_DEQUANT_THREADS);
}

#endif
