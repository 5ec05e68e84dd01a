/* tools/cuda_launches.c — dol-cuda-launches: every kernel launch of the CUDA
 * backend for one model shape, from the launch configuration functions of
 * kernels/launch.h that the launchers in kernels/NAME.cu call themselves (so
 * this list cannot drift from what is launched; scripts/cuda-resources
 * also fails when a compiled kernel has no entry here, or an entry no
 * compiled kernel).
 *
 * Usage: dol-cuda-launches HIDDEN INTER HEADS KV_HEADS HEAD_DIM
 * Prints one line per kernel instance, tab-separated:
 *   kernel  threads  dynamic_smem  smem_optin
 * with `kernel` spelt as c++filt prints the compiled entry's name, less its
 * parameter list (dol_attn_prefill_kernel<9>, dol_rope_kernel). */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/launch.h"

/* The decode products' template argument T runs over 1 .. this
 * (DOL_CUDA_NF4_GEMV_MAX_T, DOL_CUDA_Q8_GEMV_MAX_T in kernels/kernels.h,
 * which needs the CUDA headers: checked against the compiled instances by
 * scripts/cuda-resources). */
#define GEMV_MAX_T 8

static void put(const char *kernel, int targ, dol_cuda_launch_cfg c)
{
    if (targ > 0)
        printf("%s<%d>\t%u\t%zu\t%zu\n", kernel, targ, c.threads, c.smem, c.smem_optin);
    else
        printf("%s\t%u\t%zu\t%zu\n", kernel, c.threads, c.smem, c.smem_optin);
}

static int arg(const char *s, const char *what)
{
    char *end = NULL;
    const long v = strtol(s, &end, 10);
    if (!end || *end || v <= 0 || v > 1000000) {
        fprintf(stderr, "dol-cuda-launches: %s must be a positive integer (got '%s')\n", what, s);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: dol-cuda-launches HIDDEN INTER HEADS KV_HEADS HEAD_DIM\n");
        return 2;
    }
    const int d = arg(argv[1], "HIDDEN");
    (void)arg(argv[2], "INTER");
    (void)arg(argv[3], "HEADS");
    (void)arg(argv[4], "KV_HEADS");
    const int hd = arg(argv[5], "HEAD_DIM");
    if (hd % 8 != 0 || hd > DOL_CUDA_MAX_HEAD_DIM) {
        fprintf(stderr, "dol-cuda-launches: HEAD_DIM %d: the kernels take multiples of 8 up to %d\n", hd,
                DOL_CUDA_MAX_HEAD_DIM);
        return 2;
    }
    const int np = dol_cuda_attn_pairs(hd);

    put("dol_embedding_kernel", 0, dol_cuda_cfg_embedding(d));
    put("dol_rmsnorm_residual_kernel", 0, dol_cuda_cfg_rmsnorm(d));
    put("dol_rope_kernel", 0, dol_cuda_cfg_rope());
    put("dol_kv_write_kernel", 0, dol_cuda_cfg_kv_write());
    /* the attention kernels: one instance per type of each KV half (FP16, Q8_0) */
    for (int kq = 0; kq < 2; kq++)
        for (int vq = 0; vq < 2; vq++) {
            put("dol_attn_decode_kernel", DOL_CUDA_ATTN_VARIANT(np, kq, vq), dol_cuda_cfg_attn_decode(hd));
            put("dol_attn_prefill_kernel", DOL_CUDA_ATTN_VARIANT(np, kq, vq), dol_cuda_cfg_attn_prefill(hd, kq, vq));
        }
    put("dol_attn_decode_combine_kernel", 0, dol_cuda_cfg_attn_combine(hd));
    put("dol_silu_mul_kernel", 0, dol_cuda_cfg_silu_mul());
    put("dol_argmax_kernel", 0, dol_cuda_cfg_sampling());
    put("dol_logsumexp_kernel", 0, dol_cuda_cfg_sampling());
    for (int t = 1; t <= GEMV_MAX_T; t++) {
        put("dol_nf4_gemv_kernel", t, dol_cuda_cfg_quant_gemv());
        put("dol_nf4_gemv_any_kernel", t, dol_cuda_cfg_quant_gemv());
        put("dol_q8_gemv_kernel", t, dol_cuda_cfg_quant_gemv());
        put("dol_q8_gemv_any_kernel", t, dol_cuda_cfg_quant_gemv());
    }
    /* the block-type decode kernel, one instance per GGUF type (its template
     * argument: the dol_dtype, Q8_0 = 3 .. Q6_K = 12, include/dolphin/model.h) */
    for (int ty = 3; ty <= 12; ty++) put("dol_blk_gemv_kernel", ty, dol_cuda_cfg_quant_gemv());
    put("dol_blk_dequant_kernel", 0, dol_cuda_cfg_dequant());
    put("dol_blk_embedding_kernel", 0, dol_cuda_cfg_embedding(d));
    put("dol_nf4_dequant_kernel", 0, dol_cuda_cfg_dequant());
    put("dol_q8_dequant_kernel", 0, dol_cuda_cfg_dequant());
    return 0;
}
