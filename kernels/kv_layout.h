/* kernels/kv_layout.h — the byte layout of one block of the CUDA backend's
 * paged KV cache, each half (K, V) held as F16 or Q8_0 (include/dolphin/kv_q8.h).
 * Plain C, no CUDA header: cuda_engine.c sizes the pool with it, placement.c
 * sizes each GPU stage, and the kernels address rows through the struct.
 *
 * A block holds, for every layer l, the K part then the V part:
 *   layer l at            l * layer_bytes
 *   half w (0 K, 1 V) at  + half_off[w]
 * F16 part:  [block_size][kv_dim] FP16 values (whole token rows).
 * Q8_0 part: [block_size][kv_dim] int8 quants, then at scale_off[w] (16-byte
 *            aligned) [block_size][kv_dim / qb] F16 scales, qb =
 *            dol_kv_q8_block(head_dim) values a scale (blocks never cross
 *            heads: head_dim < 32 or a multiple of 32).
 * Every part starts 16-byte aligned; the block is rounded up to a multiple of
 * 16 and of block_size bytes so that bytes per token is exact (no padding at
 * all for Llama shapes: block_size 16, kv_dim a multiple of 32). */
#ifndef DOLPHIN_KERNELS_KV_LAYOUT_H
#define DOLPHIN_KERNELS_KV_LAYOUT_H

#include <stdint.h>

typedef struct {
    int64_t block_bytes;   /* one block, all layers, K and V */
    int64_t layer_bytes;   /* one layer's K part and V part */
    int64_t half_off[2];   /* the K (0) and V (1) part within a layer */
    int64_t scale_off[2];  /* Q8_0: the scales within the part; 0 for F16 */
    int q8[2];             /* 1 when that half is Q8_0 */
    int qb;                /* values per Q8_0 scale */
} dol_cuda_kv_geom;

static inline int64_t dol_cuda_kv_align(int64_t b, int64_t a) { return (b + a - 1) / a * a; }

/* The layout of n_layers layers of block_size positions of kv_dim values
 * (head_dim each), K held as Q8_0 when k_q8, V when v_q8, else F16. */
static inline dol_cuda_kv_geom dol_cuda_kv_geom_of(int n_layers, int block_size, int kv_dim, int head_dim,
                                                   int k_q8, int v_q8)
{
    dol_cuda_kv_geom g;
    const int64_t rows = (int64_t)block_size * kv_dim;
    g.qb = head_dim < 32 ? head_dim : 32; /* dol_kv_q8_block */
    g.q8[0] = k_q8 != 0;
    g.q8[1] = v_q8 != 0;
    int64_t off = 0;
    for (int w = 0; w < 2; w++) {
        g.half_off[w] = off;
        if (g.q8[w]) {
            g.scale_off[w] = dol_cuda_kv_align(rows, 16);
            off += g.scale_off[w] + dol_cuda_kv_align(rows / g.qb * 2, 16);
        } else {
            g.scale_off[w] = 0;
            off += dol_cuda_kv_align(rows * 2, 16);
        }
    }
    g.layer_bytes = off;
    /* a multiple of lcm(16, block_size): 16-byte aligned blocks, exact bytes per token */
    int64_t a = 16, b = block_size > 0 ? block_size : 1;
    while (b) { const int64_t t = a % b; a = b; b = t; }
    const int64_t lcm = 16 / a * (block_size > 0 ? block_size : 1);
    g.block_bytes = dol_cuda_kv_align((int64_t)n_layers * off, lcm);
    return g;
}

#endif
