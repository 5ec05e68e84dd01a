/* src/engine/cpu_kernels.c — the kernel table of one variant of the CPU
 * backend. The kernels are written once and compiled by CMake once per
 * variant with -DDOL_CPU_VARIANT=<name> and that variant's flags
 * (cpu_kernels.h, CMakeLists.txt); each compilation of this file exports
 * the table dol_cpu_kernels_<name>, made of the functions the kernel files
 * of the same variant export (cpu_k.h):
 *
 *   cpu_simd.h           the SIMD shim (vecf, v_*, DOL_SIMD, variant checks)
 *   cpu_k_matmul.c       dot product, matrix products over F32/F16/BF16,
 *                        row-major and packed
 *   cpu_k_qmatmul.c      matrix products over NF4 and Q8_0 weights, and
 *                        their dequantized panels
 *   cpu_k_blocks.c       GGUF's block types (ggml_blocks.h) dequantized
 *                        into F32 panels
 *   cpu_k_elementwise.c  RMSNorm, RoPE, SiLU-gated product
 *   cpu_k_attn.c         attention over the paged KV cache
 *   cpu_k_exp.h          the exp shared by the softmax and SiLU
 *   cpu_k_quantize.c     load-time NF4 / Q8_0 quantization
 *   cpu_k_hash.c         XXH3 checksums
 *
 * Why the kernels are built this way, with the measurements:
 * docs/performance.md, "Design reasons". */
#include "engine/cpu_k.h"

/* ---- the table ------------------------------------------------------------ */

const dol_cpu_kernels DOL_CAT(dol_cpu_kernels_, DOL_CPU_VARIANT) = {
    .name = DOL_STR(DOL_CPU_VARIANT),
#ifdef DOL_SIMD
    .lanes = DOL_SIMD,
#else
    .lanes = 1,
#endif
    .dot = DOL_K(dot),
    .matmul_rows = DOL_K(matmul_rows),
    .matmul_packed_rows = DOL_K(matmul_packed_rows),
    .nf4_rows = DOL_K(nf4_rows),
    .q8_rows = DOL_K(q8_rows),
    .nf4_panel = DOL_K(nf4_panel),
    .q8_panel = DOL_K(q8_panel),
    .blk_panel = DOL_K(blk_panel),
    .rmsnorm = DOL_K(rmsnorm),
    .rope = DOL_K(rope),
    .silu_mul = DOL_K(silu_mul),
    .attn_head = DOL_K(attn_head),
    .nf4_quantize_rows = DOL_K(nf4_quantize_rows),
    .q8_quantize_rows = DOL_K(q8_quantize_rows),
    .xxh3 = DOL_K(xxh3),
};
