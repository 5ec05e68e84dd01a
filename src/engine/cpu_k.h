/* src/engine/cpu_k.h — the internal interface between the CPU kernel files
 * (cpu_k_*.c) and the table they make up (cpu_kernels.c). Every one of
 * these files is compiled once per variant (CMakeLists.txt,
 * dolphin_add_cpu_kernels); DOL_K(name) gives each entry point a name of
 * its own in each variant (dol_cpu_k_<name>_<variant>), so the three
 * compilations link side by side. Nothing outside the kernel files calls
 * these: the rest of the engine goes through the table (cpu_kernels.h),
 * whose entries document what each function computes. */
#ifndef DOLPHIN_ENGINE_CPU_K_H
#define DOLPHIN_ENGINE_CPU_K_H

#include "engine/cpu_simd.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DOL_K(name) DOL_CAT(dol_cpu_k_##name##_, DOL_CPU_VARIANT)

/* cpu_k_matmul.c: the float / packed matrix products */
float DOL_K(dot)(const float *x, const void *w, dol_dtype t, int n);
void DOL_K(matmul_rows)(float *out, const float *x, int T, int K, const void *W, dol_dtype wt,
                        int N, int n0, int n1);
void DOL_K(matmul_packed_rows)(float *out, const float *x, int T, int K, const void *Wp,
                               dol_dtype wt, int N, int n0, int n1);

/* cpu_k_qmatmul.c: the products over NF4 and Q8_0 weights, and their
 * dequantized panels */
void DOL_K(nf4_rows)(float *out, const float *x, int T, const dol_nf4_matrix *W, int n0, int n1);
void DOL_K(q8_rows)(float *out, const float *x, int T, const dol_q8_matrix *W, int n0, int n1);
void DOL_K(nf4_panel)(const dol_nf4_matrix *W, int n, int m, bool packed, float *tile);
void DOL_K(q8_panel)(const dol_q8_matrix *W, int n, int m, bool packed, float *tile);

/* cpu_k_blocks.c: GGUF block types dequantized into F32 tiles */
void DOL_K(blk_panel)(dol_dtype t, const void *W, size_t row_bytes, int n, int m, int K,
                      bool packed, float *tile);

/* cpu_k_elementwise.c */
void DOL_K(rmsnorm)(float *out, const float *x, const float *w, int rows, int n, float eps);
void DOL_K(rope)(float *x, int n_heads, int head_dim, const float *cos_row, const float *sin_row);
void DOL_K(silu_mul)(float *out, const float *gate, const float *up, int n);

/* cpu_k_attn.c */
void DOL_K(attn_head)(const float *q, int hd, int n, const void *k_base, const void *v_base,
                      dol_kv_dtype kt, dol_kv_dtype vt, const int32_t *table, int bs,
                      size_t block_bytes, float scale, float *sc, float *out);

/* cpu_k_quantize.c: the load-time quantizers */
int DOL_K(nf4_quantize_rows)(const void *src, dol_dtype t, const dol_nf4_matrix *m, int64_t r0,
                             int64_t r1);
int DOL_K(q8_quantize_rows)(const void *src, dol_dtype t, const dol_q8_matrix *m, int64_t r0,
                            int64_t r1);

/* cpu_k_hash.c */
uint64_t DOL_K(xxh3)(const void *p, size_t n);

#endif
