/* kernels/kernels.h — the C interface of Dolphin's CUDA kernels: one launcher
 * per kernel family, callable from C (src/engine/cuda_engine.c) and from the
 * tests. Every launcher enqueues work on `stream` and returns the launch
 * status (cudaGetLastError), never aborts; errors during execution surface
 * at the next synchronisation. (dol_cuda_nf4_matmul, dol_cuda_q8_matmul and
 * dol_cuda_blk_matmul, which also call cuBLAS, return 0 or -1 with a message instead.)
 *
 * Conventions: FP16 values are passed as dol_f16 (IEEE binary16 bits in a
 * uint16_t; the kernels reinterpret them as __half). All matrices are
 * row-major. "Token rows" index the T tokens of one forward call in item
 * order, as the engine flattens them (backend.h).
 *
 * The paged KV cache (dol_cuda_kv) is one device array of blocks; block b
 * holds, for every layer l and for K (w = 0) and V (w = 1), block_size rows
 * of kv_dim values, each half as FP16 or as Q8_0 (int8 quants plus one F16
 * scale per dol_kv_q8_block(head_dim) values, include/dolphin/kv_q8.h); the
 * byte layout is kernels/kv_layout.h. An FP16 part is
 *   row(b, l, w, r) = pool + b*block_bytes + l*layer_bytes + half_off[w] + r*kv_dim*2
 * and a Q8_0 part the same rows of kv_dim int8 quants (r*kv_dim) followed,
 * at scale_off[w], by [block_size][kv_dim / qb] F16 scales: whole token rows,
 * unlike the CPU backend, which keeps each KV head's run of positions
 * together. Position p of the sequence of item i lives in
 * block tables[i*max_blocks + p / block_size], row p % block_size. */
#ifndef DOLPHIN_KERNELS_H
#define DOLPHIN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t dol_f16;

/* DOL_CUDA_MAX_HEAD_DIM, DOL_CUDA_PREFILL_BQ and every kernel's launch
 * configuration */
#include "kernels/launch.h"
#include "kernels/kv_layout.h"

typedef struct {
    uint8_t *pool;          /* device base of the block pool */
    dol_cuda_kv_geom g;     /* the byte layout of a block (kernels/kv_layout.h) */
    int layer;              /* layer addressed by this call */
    int block_size;         /* tokens per block */
    int kv_dim;             /* n_kv_heads * head_dim */
    const int32_t *tables;  /* device [n_items][max_blocks] block ids */
    int max_blocks;         /* row stride of tables */
} dol_cuda_kv;

/* x[t][:] = table[ids[t]][:] as FP32, t < T. table: [vocab][d] FP16. */
cudaError_t dol_cuda_embedding(float *x, const dol_f16 *table, const int32_t *ids, int T, int d,
                               cudaStream_t stream);

/* RMSNorm fused with the residual add, for r < R with row i = rows ? rows[r] : r:
 *   if delta: x[i] += delta[i]   (FP32, written back)
 *   y[r] = fp16( x[i] / sqrt(mean(x[i]^2) + eps) * w )
 * x, delta: [*][d] FP32; w: [d] FP32; y: [R][d] FP16. The sum of squares is
 * accumulated in double, as the CPU reference does. */
cudaError_t dol_cuda_rmsnorm_residual(dol_f16 *y, float *x, const float *delta, const float *w,
                                      const int32_t *rows, int R, int d, float eps,
                                      cudaStream_t stream);

/* RoPE in the Hugging Face rotate_half layout, in place on the first
 * (n_heads + n_kv_heads) * head_dim values of each row t < T of x (the q
 * heads followed by the k heads; row stride ld floats), at position pos[t].
 * cos/sin: [ctx][head_dim/2] FP32 tables (angles computed in double on the
 * host). Same arithmetic as dol_cpu_rope (no fused multiply-add). */
cudaError_t dol_cuda_rope(float *x, int ld, const int32_t *pos, int T, int n_heads, int n_kv_heads,
                          int head_dim, const float *cos_tab, const float *sin_tab,
                          cudaStream_t stream);

/* Write the K and V rows of tokens t < T into the paged cache at layer
 * kv.layer: k = src + t*ld + k_off, v = src + t*ld + v_off (kv_dim FP32 each),
 * stored at the position pos[t] of the sequence of item[t]: as FP16, or
 * quantized to Q8_0 by dol_kv_q8_quantize (the same bytes as on the host). */
cudaError_t dol_cuda_kv_write(dol_cuda_kv kv, const float *src, int ld, int k_off, int v_off,
                              const int32_t *pos, const int32_t *item, int T,
                              cudaStream_t stream);

/* Copy the first `rows` rows of every layer's K and V from block src to
 * block dst, values and scales (strided device-to-device copies: one per
 * FP16 half, two per Q8_0 half). */
cudaError_t dol_cuda_kv_copy_block(const dol_cuda_kv *kv, int n_layers, int32_t src, int32_t dst,
                                   int rows, cudaStream_t stream);

/* Attention of single query tokens over the paged cache (decode). For each
 * of the n_dec token rows t = dec_rows[i] and each query head h: softmax of
 * scale * q.k over the positions 0..pos[t] of the sequence of item[t], times
 * V, with kv head h / (n_heads / n_kv_heads) (GQA). q: row t at q + t*q_ld,
 * head h at + h*head_dim (FP32); out: FP16, row t at out + t*out_ld.
 * The positions are split into n_splits ranges of split_len (fixed per
 * engine, so the launch shape does not depend on the context length: CUDA
 * graphs can replay it); partial results go to `part`
 * (dol_cuda_attention_decode_part_floats) and a second kernel combines them.
 * A Q8_0 half is read as stored and each value dequantized in registers
 * (q * d, exact in FP32); FP32 accumulation whatever the halves' types. */
size_t dol_cuda_attention_decode_part_floats(int n_dec, int n_heads, int head_dim, int n_splits);
cudaError_t dol_cuda_attention_decode(dol_f16 *out, int out_ld, const float *q, int q_ld,
                                      const int32_t *dec_rows, int n_dec, const int32_t *pos,
                                      const int32_t *item, int n_heads, int n_kv_heads,
                                      int head_dim, float scale, dol_cuda_kv kv, float *part,
                                      int n_splits, int split_len, cudaStream_t stream);

/* Causal attention of prefill chunks over the paged cache, tiled with an
 * online softmax (FlashAttention, Dao et al. 2022). tiles: device
 * [n_tiles][4] int32 = { item, first token row, queries in the tile
 * (1..DOL_CUDA_PREFILL_BQ), position of the first query }; the queries of a
 * tile are consecutive rows and positions of one item, and query j attends to
 * positions 0..first_pos+j (earlier chunks included). `tiles` must be
 * 16-byte aligned (read as int4). Layouts as for decode. */
cudaError_t dol_cuda_attention_prefill(dol_f16 *out, int out_ld, const float *q, int q_ld,
                                       const int32_t *tiles, int n_tiles, int n_heads,
                                       int n_kv_heads, int head_dim, float scale, dol_cuda_kv kv,
                                       cudaStream_t stream);

/* out[t][i] = fp16( silu(gu[t][i]) * gu[t][f + i] ), t < T, i < f; gu is the
 * output of the fused gate|up product ([T][2f] FP32). */
cudaError_t dol_cuda_silu_mul(dol_f16 *out, const float *gu, int T, int f, cudaStream_t stream);

/* Per row r < R of logits [R][V] FP32: the index of the largest value and
 * the value (the lowest index among equals; NaN values are skipped; a row of
 * NaN only gives index 0). */
cudaError_t dol_cuda_argmax_rows(int32_t *idx, float *val, const float *logits, int R, int V,
                                 cudaStream_t stream);
/* Per row: log(sum(exp(logits))) computed stably (max + log sum exp(x - max)),
 * so logprob(i) = logits[i] - lse without copying the row to the host. */
cudaError_t dol_cuda_logsumexp_rows(float *lse, const float *logits, int R, int V,
                                    cudaStream_t stream);

/* ---- NF4 weights (kernels/nf4.cu) --------------------------------------------
 * The layout of src/engine/nf4.h, on the device: codes [rows][cols/2] bytes
 * and scales [rows][ceil(cols/64)] F16, both row-major; blocks of
 * DOL_CUDA_NF4_BLOCK weights along cols (the last one shorter when cols % 64
 * != 0); byte j of a block of n weights holds weight j in its low nibble and
 * weight j + n/2 in its high nibble; weight = dol_nf4_levels[code] * scale.
 * Rows of several matrices with the same cols may be concatenated (fused
 * QKV, gate|up): blocks never cross rows. */
#define DOL_CUDA_NF4_BLOCK 64
/* Most token rows of one decode-kernel launch. */
#define DOL_CUDA_NF4_GEMV_MAX_T 8
/* dol_cuda_nf4_matmul uses the decode kernel (in launches of up to
 * DOL_CUDA_NF4_GEMV_MAX_T rows) up to this many rows, dequantized tiles and
 * cuBLAS above. */
#define DOL_CUDA_NF4_GEMV_UPTO 16

typedef struct {
    const uint8_t *codes;   /* device [rows][cols/2] */
    const dol_f16 *scales;  /* device [rows][ceil(cols/64)] */
    int rows, cols;         /* N (out_features), K (in_features, even) */
} dol_cuda_nf4;

/* Decode: out[t][n] = sum_k x[t][k] * level(W[n][k]) * scale, t < T <=
 * DOL_CUDA_NF4_GEMV_MAX_T, n < W->rows. x: [T][cols] FP16; out: [T][rows]
 * FP32. The packed weights are read once and decoded in registers; FP32
 * accumulation, per (output, block of 64): sum(x * level) then * scale.
 * Fastest when cols % 64 == 0 and codes and x are 16-byte aligned (another
 * kernel handles the rest). Each output row is computed the same way whatever
 * T is. cudaErrorInvalidValue for T > DOL_CUDA_NF4_GEMV_MAX_T or odd cols. */
cudaError_t dol_cuda_nf4_gemv(float *out, const dol_f16 *x, int T, const dol_cuda_nf4 *W,
                              cudaStream_t stream);

/* Rows row0 .. row0 + rows - 1 of W as FP16 into w ([rows][cols]):
 * fp16(dol_nf4_levels[code] * scale), rounded to nearest even, so exactly
 * dol_f32_to_f16 of dol_nf4_dequantize_row's floats. */
cudaError_t dol_cuda_nf4_dequant(dol_f16 *w, const dol_cuda_nf4 *W, int row0, int rows,
                                 cudaStream_t stream);

/* out[T][rows] = x[T][cols] . dequant(W)^T for any T, on `stream` (blas must
 * already be bound to it): T <= DOL_CUDA_NF4_GEMV_UPTO through
 * dol_cuda_nf4_gemv; more rows through tiles of ws_elems / cols rows of W
 * dequantized to FP16 in ws and cublasGemmEx (FP16 inputs, FP32 accumulation
 * and output), one tile after the other. Unlike the launchers above it
 * returns 0, or -1 with one line in err (a CUDA or cuBLAS failure, or a
 * workspace smaller than one row when T > DOL_CUDA_NF4_GEMV_UPTO). */
int dol_cuda_nf4_matmul(cublasHandle_t blas, float *out, const dol_f16 *x, int T,
                        const dol_cuda_nf4 *W, dol_f16 *ws, size_t ws_elems, cudaStream_t stream,
                        char *err, size_t errlen);

/* ---- Q8_0 (int8) weights (kernels/q8.cu) --------------------------------------
 * The layout of src/engine/q8.h, on the device: quants [rows][cols] int8 and
 * scales [rows][ceil(cols/32)] F16, both row-major; blocks of
 * DOL_CUDA_Q8_BLOCK weights along cols (the last one shorter when cols % 32
 * != 0); weight = q * d. Rows of several matrices with the same cols may be
 * concatenated (fused QKV, gate|up): blocks never cross rows. */
#define DOL_CUDA_Q8_BLOCK 32
/* Most token rows of one decode-kernel launch. */
#define DOL_CUDA_Q8_GEMV_MAX_T 8
/* dol_cuda_q8_matmul uses the decode kernel up to this many rows,
 * dequantized tiles and cuBLAS above. */
#define DOL_CUDA_Q8_GEMV_UPTO 16

typedef struct {
    const int8_t *quants;   /* device [rows][cols] */
    const dol_f16 *scales;  /* device [rows][ceil(cols/32)] */
    int rows, cols;         /* N (out_features), K (in_features, >= 1) */
} dol_cuda_q8;

/* Decode: out[t][n] = sum_k x[t][k] * q(W[n][k]) * d, t < T <=
 * DOL_CUDA_Q8_GEMV_MAX_T, n < W->rows. x: [T][cols] FP16; out: [T][rows]
 * FP32. The quants are read once and converted in registers; FP32
 * accumulation, per (output, 16 weights of a block): sum(x * q) then * d.
 * Fastest when cols % 32 == 0 and quants and x are 16-byte aligned (another
 * kernel handles the rest). Each output row is computed the same way whatever
 * T is. cudaErrorInvalidValue for T > DOL_CUDA_Q8_GEMV_MAX_T or cols < 1. */
cudaError_t dol_cuda_q8_gemv(float *out, const dol_f16 *x, int T, const dol_cuda_q8 *W,
                             cudaStream_t stream);

/* Rows row0 .. row0 + rows - 1 of W as FP16 into w ([rows][cols]):
 * fp16(q * d), rounded to nearest even, so exactly dol_f32_to_f16 of
 * dol_q8_dequantize_row's floats. */
cudaError_t dol_cuda_q8_dequant(dol_f16 *w, const dol_cuda_q8 *W, int row0, int rows,
                                cudaStream_t stream);

/* out[T][rows] = x[T][cols] . dequant(W)^T for any T, as dol_cuda_nf4_matmul:
 * T <= DOL_CUDA_Q8_GEMV_UPTO through dol_cuda_q8_gemv, more rows through
 * tiles of ws_elems / cols rows dequantized to FP16 in ws and cublasGemmEx.
 * 0, or -1 with one line in err. */
int dol_cuda_q8_matmul(cublasHandle_t blas, float *out, const dol_f16 *x, int T,
                       const dol_cuda_q8 *W, dol_f16 *ws, size_t ws_elems, cudaStream_t stream,
                       char *err, size_t errlen);

/* ---- GGUF block types (kernels/ggml_blocks.cu) --------------------------------
 * A matrix of one of GGUF's block-quantized types, on the device exactly as
 * the file holds it (include/dolphin/ggml_blocks.h gives the layouts): rows
 * of cols / block blocks of block_bytes bytes each, row r at
 * data + r * row_bytes; blocks never cross rows. Weights are decoded with
 * dol_blk_weight, the CPU backend's exact float32 expressions. */
/* Most token rows of one decode-kernel launch. */
#define DOL_CUDA_BLK_GEMV_MAX_T 8
/* dol_cuda_blk_matmul uses the decode kernel up to this many rows,
 * dequantized tiles and cuBLAS above. */
#define DOL_CUDA_BLK_GEMV_UPTO 16

typedef struct {
    const uint8_t *data;  /* device [rows][row_bytes] */
    int type;             /* a dol_dtype from DOL_DTYPE_Q8_0 to DOL_DTYPE_Q6_K */
    int rows, cols;       /* N (out_features), K (in_features, a multiple of block) */
    int block;            /* weights per block: 32 or 256 (dol_dtype_block) */
    int block_bytes;      /* dol_dtype_block_bytes */
    size_t row_bytes;     /* cols / block * block_bytes */
} dol_cuda_blk;

/* Decode: out[t * ldo + n] = sum_k x[t][k] * weight(W, n, k), t < T <=
 * DOL_CUDA_BLK_GEMV_MAX_T, n < W->rows, ldo >= W->rows (a slice of a wider
 * output: fused matrices of several types). x: [T][cols] FP16, out FP32.
 * FP32 accumulation: per (output, group of 32 weights) sum(x * w) in order,
 * added to the output's sum; each output row computed the same way whatever
 * T is. cudaErrorInvalidValue for T > DOL_CUDA_BLK_GEMV_MAX_T, ldo < rows or
 * a malformed W (sizes that disagree, another type). */
cudaError_t dol_cuda_blk_gemv(float *out, int ldo, const dol_f16 *x, int T, const dol_cuda_blk *W,
                              cudaStream_t stream);

/* Rows row0 .. row0 + rows - 1 of W as FP16 into w ([rows][cols]): fp16 of
 * the exact weight, rounded to nearest even, so exactly dol_f32_to_f16 of
 * dol_dequantize's floats. */
cudaError_t dol_cuda_blk_dequant(dol_f16 *w, const dol_cuda_blk *W, int row0, int rows,
                                 cudaStream_t stream);

/* out[t * ldo + n] = x[T][cols] . dequant(W)^T for any T, as
 * dol_cuda_nf4_matmul: T <= DOL_CUDA_BLK_GEMV_UPTO through dol_cuda_blk_gemv,
 * more rows through tiles of ws_elems / cols rows dequantized to FP16 in ws
 * and cublasGemmEx (ldc = ldo). 0, or -1 with one line in err. */
int dol_cuda_blk_matmul(cublasHandle_t blas, float *out, int ldo, const dol_f16 *x, int T,
                        const dol_cuda_blk *W, dol_f16 *ws, size_t ws_elems, cudaStream_t stream,
                        char *err, size_t errlen);

/* x[t][:] = row ids[t] of table as FP32, exactly dol_dequantize's floats;
 * x: [T][table->cols]. The ids must be below table->rows. */
cudaError_t dol_cuda_blk_embedding(float *x, const dol_cuda_blk *table, const int32_t *ids, int T,
                                   cudaStream_t stream);

/* cudaSuccess when this binary holds kernel code the current device can run
 * (cudaErrorNoKernelImageForDevice otherwise). */
cudaError_t dol_cuda_kernels_loadable(void);

#ifdef __cplusplus
}
#endif
#endif
