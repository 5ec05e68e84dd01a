/* tests/unit/test_ggml_random.h — random matrices in GGUF's block types for
 * the tests of their kernels (tests/unit/test_ggml_blocks.c, tests/cuda/
 * test_cuda_blocks.c): random bytes with finite random F16 scales, so that
 * every quant bit pattern occurs. Include after <cmocka.h> and a random
 * source giving uniform() in [0, 1) and gaussian(). */
#ifndef DOLPHIN_TEST_GGML_RANDOM_H
#define DOLPHIN_TEST_GGML_RANDOM_H

#include <stdint.h>
#include <stdlib.h>

#include "dolphin/model.h"

/* Byte offsets of the F16 scales in a block of t (ggml_blocks.h); -1 ends. */
static inline void scale_offsets(dol_dtype t, int off[3])
{
    off[0] = off[1] = off[2] = -1;
    switch (t) {
    case DOL_DTYPE_Q4_1: case DOL_DTYPE_Q5_1: case DOL_DTYPE_Q4_K: case DOL_DTYPE_Q5_K:
        off[0] = 0, off[1] = 2; break;
    case DOL_DTYPE_Q2_K: off[0] = 80, off[1] = 82; break;
    case DOL_DTYPE_Q3_K: off[0] = 108; break;
    case DOL_DTYPE_Q6_K: off[0] = 208; break;
    default: off[0] = 0; break;
    }
}

/* rows x K weights of type t: random bytes, finite random scales. */
static inline uint8_t *random_matrix(dol_dtype t, int rows, int K)
{
    const size_t rb = dol_dtype_row_bytes(t, K), bb = dol_dtype_block_bytes(t);
    uint8_t *m = malloc(rb * (size_t)rows);
    assert_non_null(m);
    for (size_t i = 0; i < rb * (size_t)rows; i++) m[i] = (uint8_t)(uniform() * 256.0);
    int off[3];
    scale_offsets(t, off);
    for (size_t b = 0; b < rb * (size_t)rows / bb; b++)
        for (int i = 0; i < 3 && off[i] >= 0; i++) {
            uint16_t h = dol_f32_to_f16(gaussian() * 0.02f);
            m[b * bb + (size_t)off[i]] = (uint8_t)(h & 0xFF);
            m[b * bb + (size_t)off[i] + 1] = (uint8_t)(h >> 8);
        }
    return m;
}

#endif
