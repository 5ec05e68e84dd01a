/* tests/cuda/cuda_test_util.h — what the CUDA tests share: CK (a failed CUDA
 * call fails the cmocka test with its message), a seeded random stream
 * (splitmix64; a test file may define CUDA_TEST_SEED before including this)
 * and device buffers (allocate, upload, download after a device sync); the
 * engine's attention launches over a batch of items (attn_launch).
 * Include after <cmocka.h>. */
#ifndef DOLPHIN_CUDA_TEST_UTIL_H
#define DOLPHIN_CUDA_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <math.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "kernels/kernels.h"

#ifndef CUDA_TEST_SEED
#define CUDA_TEST_SEED 0x2545F4914F6CDD1Dull
#endif

#define CK(call)                                                                            \
    do {                                                                                    \
        cudaError_t rc_ = (call);                                                           \
        if (rc_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(rc_));         \
    } while (0)

static uint64_t g_rng = CUDA_TEST_SEED;
static inline uint64_t next_u64(void)
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* uniform in [-a, a] */
static inline float urand(float a)
{
    return (float)((double)(next_u64() >> 11) / 9007199254740992.0 * 2.0 - 1.0) * a;
}
/* uniform in [0, n) */
static inline int irand(int n) { return (int)(next_u64() % (uint64_t)n); }

/* A device buffer of `bytes` (at least 16); fails the test when it cannot. */
static inline void *dmalloc(size_t bytes)
{
    void *p = NULL;
    CK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}
/* A device copy of h[0..bytes). */
static inline void *dup_to_dev(const void *h, size_t bytes)
{
    void *d = dmalloc(bytes);
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
/* h[0..bytes) = d[0..bytes), after all work on the device is done. */
static inline void to_host(void *h, const void *d, size_t bytes)
{
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* ---- attention over a batch, as the engine launches it --------------------- */

typedef struct {
    int nh, nkv, hd, bs;
} attn_shape;

typedef struct {
    int start, n; /* positions start .. start+n-1 of one sequence */
} attn_item;

/* Token rows of the items. */
static inline int attn_tokens(const attn_item *items, int n_items)
{
    int T = 0;
    for (int i = 0; i < n_items; i++) T += items[i].n;
    return T;
}

/* n block ids drawn without repeats from a pool of n_blocks (>= n): the
 * block tables, scattered over the pool. malloc'd. */
static inline int32_t *random_tables(int n_blocks, int n)
{
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        const int j = irand(i + 1);
        const int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    return perm; /* the first n entries */
}

/* Attention of the items as the engine runs it: items of one token through
 * the decode kernel with the engine's split scheme for a context of ctx,
 * the rest through the prefill kernel in tiles of DOL_CUDA_PREFILL_BQ
 * queries; q: host [T][q_ld] (query heads first), kv: the pool and tables
 * already on the device. Returns the FP16 output [T][nh * hd] (malloc'd;
 * NaN wherever a kernel wrote nothing) and, in *pos / *item (malloc'd),
 * each row's position and item for the reference. */
static inline dol_f16 *attn_launch(const attn_shape *sh, const attn_item *items, int n_items, int ctx,
                                   const float *q, int q_ld, dol_cuda_kv kv, int32_t **pos, int32_t **item)
{
    const int T = attn_tokens(items, n_items), q_dim = sh->nh * sh->hd;
    *pos = malloc(sizeof(int32_t) * T), *item = malloc(sizeof(int32_t) * T);
    int32_t *dec = malloc(sizeof(int32_t) * T), *tiles = malloc(sizeof(int32_t) * 4 * (T + n_items));
    int n_dec = 0, n_tiles = 0, t0 = 0;
    for (int i = 0; i < n_items; i++) {
        for (int k = 0; k < items[i].n; k++) (*pos)[t0 + k] = items[i].start + k, (*item)[t0 + k] = i;
        if (items[i].n == 1) dec[n_dec++] = t0;
        else
            for (int q0 = 0; q0 < items[i].n; q0 += DOL_CUDA_PREFILL_BQ) {
                int32_t *tl = tiles + 4 * n_tiles++;
                tl[0] = i, tl[1] = t0 + q0, tl[3] = items[i].start + q0;
                tl[2] = items[i].n - q0 < DOL_CUDA_PREFILL_BQ ? items[i].n - q0 : DOL_CUDA_PREFILL_BQ;
            }
        t0 += items[i].n;
    }
    /* the engine's decode split scheme */
    int split_len = 64;
    if ((ctx + split_len - 1) / split_len > 64) split_len = ((ctx + 63) / 64 + 31) / 32 * 32;
    const int n_splits = (ctx + split_len - 1) / split_len;

    float *d_q = dup_to_dev(q, sizeof(float) * (size_t)T * q_ld);
    int32_t *d_pos = dup_to_dev(*pos, sizeof(int32_t) * T), *d_item = dup_to_dev(*item, sizeof(int32_t) * T);
    int32_t *d_dec = dup_to_dev(dec, sizeof(int32_t) * (n_dec ? n_dec : 1));
    int32_t *d_tiles = dup_to_dev(tiles, sizeof(int32_t) * 4 * (n_tiles ? n_tiles : 1));
    float *d_part = dmalloc(sizeof(float) * dol_cuda_attention_decode_part_floats(n_dec, sh->nh, sh->hd, n_splits));
    dol_f16 *out = malloc(sizeof(dol_f16) * (size_t)T * q_dim);
    for (size_t i = 0; i < (size_t)T * q_dim; i++) out[i] = 0x7e00; /* NaN: must be overwritten */
    dol_f16 *d_out = dup_to_dev(out, sizeof(dol_f16) * (size_t)T * q_dim);
    const float scale = 1.0f / sqrtf((float)sh->hd);
    CK(dol_cuda_attention_decode(d_out, q_dim, d_q, q_ld, d_dec, n_dec, d_pos, d_item, sh->nh, sh->nkv, sh->hd,
                                 scale, kv, d_part, n_splits, split_len, 0));
    CK(dol_cuda_attention_prefill(d_out, q_dim, d_q, q_ld, d_tiles, n_tiles, sh->nh, sh->nkv, sh->hd, scale, kv, 0));
    to_host(out, d_out, sizeof(dol_f16) * (size_t)T * q_dim);
    cudaFree(d_q), cudaFree(d_pos), cudaFree(d_item), cudaFree(d_dec), cudaFree(d_tiles), cudaFree(d_part),
        cudaFree(d_out);
    free(dec), free(tiles);
    return out;
}

#endif
