/* src/engine/cuda_engine.c — the CUDA backend (backend.h): the Llama forward
 * pass of cpu_engine.c on one GPU, over the same batches (prefill chunks and
 * decode tokens of many sequences in one call) and the same paged KV cache
 * bookkeeping, which the generic engine owns; this file owns the device
 * memory the block ids index into.
 *
 * Precision (docs/cuda.md): linear-layer weights and the embedding in FP16
 * (F32/BF16 checkpoints converted once at load, on the host); every matrix
 * product through cuBLAS with FP16 inputs, FP32 accumulation
 * (CUBLAS_COMPUTE_32F) and FP32 output. With weights nf4 the linear layers
 * (lm_head unless quantize_lm_head is false) are quantized at load on the
 * host by src/engine/nf4.c and held as 4-bit codes + F16 block scales; their
 * products go through kernels/nf4.cu (dol_cuda_nf4_matmul: a decode kernel
 * that dequantizes in registers for a few rows, dequantized FP16 tiles and
 * cuBLAS for more). With weights int8 the same matrices are Q8_0 (int8
 * quants + F16 block scales, src/engine/q8.c) and go through kernels/q8.cu
 * the same two ways. The tensors of a GGUF file in a block type (Q8_0 ..
 * Q6_K) are held as the file stores them and go through kernels/
 * ggml_blocks.cu the same two ways; a fused matrix (QKV, gate|up) whose
 * tensors have different types is held part by part (docs/cuda.md). The
 * residual stream, Q, RoPE,
 * softmax and norms in FP32; the inputs of the products (normed activations,
 * attention output, SiLU·up) rounded to FP16; the KV cache in FP16
 * or Q8_0 per half (kv_cache_dtype_k / _v; kernels/kv_layout.h).
 *
 * One step (T token rows): embedding -> per layer [RMSNorm(+residual) ->
 * fused QKV product -> RoPE -> K/V into the blocks -> attention (decode
 * kernel row by row for items of up to DECODE_ITEM_MAX tokens, tiled prefill
 * kernel for longer ones) -> output
 * product -> RMSNorm(+residual) -> fused gate|up product -> SiLU·up -> down
 * product] -> final RMSNorm of the rows that want logits -> lm_head.
 * Per-call metadata (token ids, positions, block tables, attention work
 * lists) goes up in one copy from pinned memory; steps made only of decode
 * tokens are captured once per batch size as CUDA graphs and replayed.
 *
 * Without DOLPHIN_HAVE_CUDA this file only provides dol_cuda_utilization. */
#include "engine/backend.h"
#include "engine/cuda_probe.h"

#ifndef DOLPHIN_HAVE_CUDA

int dol_cuda_utilization(int *percent)
{
    (void)percent;
    return -1;
}

#else

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dolphin/kv_q8.h"
#include "dolphin/log.h"
#include "engine/cpu_ops.h"
#include "engine/nf4.h"
#include "engine/q8.h"
#include "engine/threadpool.h"
#include "kernels/cuda_common.cuh"
#include "kernels/kernels.h"

#define LOGIT_CHUNK 128                    /* lm_head rows per product */
#define STAGE_BYTES ((size_t)64 << 20)     /* each of the two pinned upload buffers */
#define BLAS_WS_BYTES ((size_t)32 << 20)   /* cuBLAS workspace (graph capture needs one) */
#define RESERVE_BYTES ((size_t)384 << 20)  /* left free inside the budget: cuBLAS kernels
                                              loaded lazily, graphs, allocator slack */
#define SPLIT_LEN_MIN 64                   /* decode attention: positions per split */
#define DECODE_ITEM_MAX 9                  /* items this short (a decode token and up to 8
                                              speculative drafts) take the decode kernel per
                                              row: each row's attention sums as in a plain
                                              decode step */
#define SPLITS_MAX 64
#define NF4_WS_ELEMS ((size_t)16 << 20)    /* FP16 values of the NF4 dequantization workspace
                                              (32 MiB): the tile of W per prefill product */
#define MIB(b) ((double)(b) / 1048576.0)

_Static_assert(DOL_CUDA_NF4_BLOCK == DOL_NF4_BLOCK, "kernels and nf4.c disagree on the NF4 block");
_Static_assert(DOL_CUDA_Q8_BLOCK == DOL_Q8_BLOCK, "kernels and q8.c disagree on the Q8_0 block");
_Static_assert(DOL_CUDA_Q8_GEMV_UPTO == DOL_CUDA_NF4_GEMV_UPTO, "one dequantization workspace rule");
_Static_assert(DOL_CUDA_BLK_GEMV_UPTO == DOL_CUDA_NF4_GEMV_UPTO, "one dequantization workspace rule");

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static int g_cuda_dev; /* the device in use, for the utilisation probe */

/* Rows row0 .. row0 + rows - 1 of a linear matrix held part by part: FP16,
 * or (f16 == NULL) a GGUF block type as the file stores it. */
typedef struct {
    int row0, rows;
    dol_f16 *f16;
    dol_cuda_blk blk;
} cu_part;

/* A linear layer on the device, W [N][K]: FP16, or (f16 == NULL) NF4 codes
 * and scales, or (f16 == NULL and is_q8) Q8_0 quants and scales, or
 * (n_parts > 0: a source tensor of a GGUF block type) one part per source
 * tensor (q | k | v, gate | up), each in its own type. */
typedef struct {
    int N, K;
    dol_f16 *f16;
    dol_cuda_nf4 nf4;
    bool is_q8;
    dol_cuda_q8 q8;
    int n_parts;
    cu_part part[3];
} cu_linear;

typedef struct {
    float *attn_norm, *ffn_norm; /* [d] FP32 */
    cu_linear qkv;               /* [q_dim + 2*kv_dim][d]: q rows, k rows, v rows */
    cu_linear o;                 /* [d][q_dim] */
    cu_linear gu;                /* [2f][d]: gate rows, then up rows */
    cu_linear down;              /* [d][f] */
} cu_layer;

typedef struct {
    dol_model_config c;          /* c.n_layers: the blocks this instance holds */
    int l0;                      /* model index of block 0 here (layer placement) */
    bool has_embed, has_head;    /* the embedding; the final norm + lm_head */
    bool head_at_end;            /* the head follows this instance's last block */
    int dev;
    int d, f, q_dim, kv_dim, qkv_dim, hd, V, ctx;
    int max_T, max_items, logit_chunk;
    int max_dec;                 /* decode-kernel rows per step */
    int bs, n_blocks, max_blocks;
    int n_splits, split_len, max_tiles;
    float scale;
    cudaStream_t stream;
    cublasHandle_t blas;

    void **allocs;               /* every cudaMalloc, freed in destroy */
    int n_allocs, cap_allocs;
    size_t weight_bytes;
    bool nf4, nf4_head;          /* weights nf4: the layers' linear matrices, lm_head */
    bool q8, q8_head;            /* weights int8: the same */
    bool blk;                    /* a weight of this range is in a GGUF block type */
    int n_threads;               /* host threads for load-time quantization */
    dol_quant_stats qs;

    cu_layer *L;
    dol_f16 *embed;
    dol_cuda_blk embed_blk;      /* the embedding in a GGUF block type (embed NULL) */
    cu_linear lm_head;           /* FP16 and sharing embed when tied and not NF4 */
    float *final_norm;
    float *rope_cos, *rope_sin;  /* [ctx][hd/2] */
    uint8_t *kv_pool;
    dol_cuda_kv_geom kvg;        /* the byte layout of a KV block (kernels/kv_layout.h) */
    dol_kv_dtype kv_dt[2];       /* the K and V halves: F16 or Q8_0 */

    /* workspaces for max_T rows */
    float *x, *dx, *qkv, *gu, *logits, *part;
    dol_f16 *xn, *att, *hbuf;
    void *blas_ws;
    dol_f16 *nf4_ws;             /* NF4 / int8 products of many rows: a dequantized tile of W */
    size_t nf4_ws_elems;         /* 0 when no NF4 product ever takes that path */

    /* per-call metadata, int32: pinned host copy and device copy */
    int32_t *meta_h, *meta_d;
    size_t meta_n, off_id, off_pos, off_item, off_lrow, off_dec, off_tiles, off_tables;
    float *logits_h;             /* pinned [logit_chunk][V] */

    /* CUDA graphs of decode-only steps, by batch size */
    bool graphs_on;
    cudaGraphExec_t *graph;      /* [max_items + 1] */
    unsigned char *seen;         /* [max_items + 1]: eager runs before capture */

    char deferred[DOL_ERR_LEN];  /* failure of copy_block, reported by forward */
} cuda_engine;

/* ---- device memory ------------------------------------------------------ */

static int dalloc(cuda_engine *e, void *out, size_t bytes, const char *what, char *err,
                  size_t errlen)
{
    if (e->n_allocs == e->cap_allocs) {
        int cap = e->cap_allocs ? e->cap_allocs * 2 : 64;
        void **a = realloc(e->allocs, sizeof(void *) * (size_t)cap);
        if (!a) { dol_set_err(err, errlen, "engine: out of memory"); return -1; }
        e->allocs = a;
        e->cap_allocs = cap;
    }
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, bytes ? bytes : 256);
    if (rc != cudaSuccess) {
        char where[80];
        dol_set_err(err, errlen, "cuda: cannot allocate %.1f MiB for %s: %s (%s) on %s", MIB(bytes), what,
                    cudaGetErrorString(rc), cudaGetErrorName(rc), dol_cuda_where(where, sizeof where));
        return -1;
    }
    e->allocs[e->n_allocs++] = p;
    *(void **)out = p;
    return 0;
}

/* ---- weight upload: host conversion to FP16, double-buffered pinned copies */

typedef struct {
    void *stage[2];
    cudaEvent_t done[2];
    int cur;
    cudaStream_t s;
} uploader;

static int up_init(uploader *u, cudaStream_t s, char *err, size_t errlen)
{
    memset(u, 0, sizeof *u);
    u->s = s;
    for (int i = 0; i < 2; i++) {
        CUDA_CHECK(cudaMallocHost(&u->stage[i], STAGE_BYTES));
        CUDA_CHECK(cudaEventCreateWithFlags(&u->done[i], cudaEventDisableTiming));
    }
    return 0;
}

static void up_free(uploader *u)
{
    (void)cudaStreamSynchronize(u->s);
    for (int i = 0; i < 2; i++) {
        if (u->stage[i]) cudaFreeHost(u->stage[i]);
        if (u->done[i]) cudaEventDestroy(u->done[i]);
    }
}

/* The next pinned buffer, once the copy that last used it has finished. */
static void *up_next(uploader *u, char *err, size_t errlen)
{
    cudaError_t rc = cudaEventSynchronize(u->done[u->cur]);
    if (rc != cudaSuccess) {
        char where[80];
        dol_set_err(err, errlen, "cuda: weight upload failed: %s (%s) on %s", cudaGetErrorString(rc),
                    cudaGetErrorName(rc), dol_cuda_where(where, sizeof where));
        return NULL;
    }
    return u->stage[u->cur];
}

/* Copy bytes at offset `off` of the current pinned buffer to dst. */
static int up_copy(uploader *u, void *dst, size_t off, size_t bytes, char *err, size_t errlen)
{
    CUDA_CHECK(cudaMemcpyAsync(dst, (const char *)u->stage[u->cur] + off, bytes,
                               cudaMemcpyHostToDevice, u->s));
    return 0;
}

/* The current buffer's copies are all enqueued: mark them, use the other. */
static int up_flip(uploader *u, char *err, size_t errlen)
{
    CUDA_CHECK(cudaEventRecord(u->done[u->cur], u->s));
    u->cur ^= 1;
    return 0;
}

static int up_send(uploader *u, void *dst, size_t bytes, char *err, size_t errlen)
{
    if (up_copy(u, dst, 0, bytes, err, errlen)) return -1;
    return up_flip(u, err, errlen);
}

/* All rows x cols elements of t, as FP16, to dst. */
static int up_f16(uploader *u, dol_f16 *dst, const dol_tensor *t, char *err, size_t errlen)
{
    const int64_t n = t->rows * t->cols, chunk = (int64_t)(STAGE_BYTES / sizeof(uint16_t));
    for (int64_t off = 0; off < n; off += chunk) {
        const int64_t m = n - off < chunk ? n - off : chunk;
        uint16_t *h = up_next(u, err, errlen);
        if (!h) return -1;
        if (t->dtype == DOL_DTYPE_F16) {
            memcpy(h, (const uint16_t *)t->data + off, (size_t)m * sizeof(uint16_t));
        } else if (t->dtype == DOL_DTYPE_F32) {
            const float *s = (const float *)t->data + off;
            for (int64_t i = 0; i < m; i++) h[i] = dol_f32_to_f16(s[i]);
        } else {
            const uint16_t *s = (const uint16_t *)t->data + off;
            for (int64_t i = 0; i < m; i++) h[i] = dol_f32_to_f16(dol_bf16_to_f32(s[i]));
        }
        if (up_send(u, dst + off, (size_t)m * sizeof(uint16_t), err, errlen)) return -1;
    }
    return 0;
}

/* bytes at src (a GGUF block tensor, as stored) to dst. */
static int up_raw(uploader *u, void *dst, const void *src, size_t bytes, char *err, size_t errlen)
{
    for (size_t off = 0; off < bytes; off += STAGE_BYTES) {
        const size_t n = bytes - off < STAGE_BYTES ? bytes - off : STAGE_BYTES;
        void *h = up_next(u, err, errlen);
        if (!h) return -1;
        memcpy(h, (const char *)src + off, n);
        if (up_send(u, (char *)dst + off, n, err, errlen)) return -1;
    }
    return 0;
}

/* A weight quantization scheme as the upload sees it: the host quantizer
 * (nf4.c, q8.c) into a weight array and an F16 scale array, and their sizes. */
typedef struct {
    int block; /* weights per scale */
    size_t (*data_bytes)(int64_t rows, int64_t cols);
    size_t (*scales_bytes)(int64_t rows, int64_t cols);
    size_t (*bytes)(int64_t rows, int64_t cols);
    int (*quantize)(dol_pool *pool, const dol_tensor *src, void *data, uint16_t *scales,
                    const char *what, char *err, size_t errlen);
} up_scheme;

/* t ([rows][K], any dtype) quantized on the host (on the pool) a slab of
 * rows at a time, straight into a pinned buffer (the weight array, then the
 * F16 scales at a 16-byte aligned offset), and copied to rows row0.. of the
 * device arrays dst_data and dst_scales while the next slab is quantized. */
static int up_quant(cuda_engine *e, uploader *u, dol_pool *pool, const up_scheme *sc,
                    void *dst_data, dol_f16 *dst_scales, int64_t row0, const dol_tensor *t,
                    const char *what, char *err, size_t errlen)
{
    const int64_t K = t->cols, bpr = (K + sc->block - 1) / sc->block;
    const size_t esz = dol_dtype_size(t->dtype), row_data = sc->data_bytes(1, K);
    const int64_t slab = (int64_t)((STAGE_BYTES - 16) / (row_data + (size_t)bpr * sizeof(uint16_t)));
    if (slab < 1) {
        dol_set_err(err, errlen, "cuda: %s: rows of %lld weights are too long", what, (long long)K);
        return -1;
    }
    for (int64_t r0 = 0; r0 < t->rows; r0 += slab) {
        const int64_t nr = t->rows - r0 < slab ? t->rows - r0 : slab;
        uint8_t *h = up_next(u, err, errlen);
        if (!h) return -1;
        const size_t data = sc->data_bytes(nr, K), scales = sc->scales_bytes(nr, K);
        const size_t scales_off = align_up(data, 16);
        dol_tensor part = *t;
        part.rows = nr;
        part.data = (const char *)t->data + (size_t)r0 * (size_t)K * esz;
        const double t0 = dol_now_ms();
        if (sc->quantize(pool, &part, h, (uint16_t *)(void *)(h + scales_off), what, err, errlen) != 0)
            return -1;
        e->qs.quant_seconds += (dol_now_ms() - t0) / 1000.0;
        if (up_copy(u, (uint8_t *)dst_data + (size_t)(row0 + r0) * row_data, 0, data, err, errlen) ||
            up_copy(u, dst_scales + (size_t)(row0 + r0) * (size_t)bpr, scales_off, scales, err,
                    errlen) ||
            up_flip(u, err, errlen))
            return -1;
    }
    e->qs.n_quantized++;
    e->qs.quant_bytes_before += (size_t)(t->rows * K) * esz;
    e->qs.quant_bytes_after += sc->bytes(t->rows, K);
    return 0;
}

static int quantize_nf4(dol_pool *pool, const dol_tensor *src, void *data, uint16_t *scales,
                        const char *what, char *err, size_t errlen)
{
    dol_nf4_matrix m = { .codes = data, .scales = scales };
    return dol_nf4_quantize(pool, src, &m, what, err, errlen);
}

static int quantize_q8(dol_pool *pool, const dol_tensor *src, void *data, uint16_t *scales,
                       const char *what, char *err, size_t errlen)
{
    dol_q8_matrix m = { .quants = data, .scales = scales };
    return dol_q8_quantize(pool, src, &m, what, err, errlen);
}

static const up_scheme UP_NF4 = { DOL_NF4_BLOCK, dol_nf4_codes_bytes, dol_nf4_scales_bytes,
                                  dol_nf4_bytes, quantize_nf4 };
static const up_scheme UP_Q8 = { DOL_Q8_BLOCK, dol_q8_quants_bytes, dol_q8_scales_bytes,
                                 dol_q8_bytes, quantize_q8 };

/* t quantized to NF4 (nf4.c) into rows row0.. of dst. */
static int up_nf4(cuda_engine *e, uploader *u, dol_pool *pool, const dol_cuda_nf4 *dst,
                  int64_t row0, const dol_tensor *t, const char *what, char *err, size_t errlen)
{
    if (dol_nf4_check_cols(t->cols, what, err, errlen) != 0) return -1;
    return up_quant(e, u, pool, &UP_NF4, (void *)dst->codes, (dol_f16 *)dst->scales, row0, t, what,
                    err, errlen);
}

/* t quantized to Q8_0 (q8.c) into rows row0.. of dst. */
static int up_q8(cuda_engine *e, uploader *u, dol_pool *pool, const dol_cuda_q8 *dst,
                 int64_t row0, const dol_tensor *t, const char *what, char *err, size_t errlen)
{
    return up_quant(e, u, pool, &UP_Q8, (void *)dst->quants, (dol_f16 *)dst->scales, row0, t, what,
                    err, errlen);
}

/* Rows row0.. of the linear matrix dst from the checkpoint tensor t, in the
 * format dst holds. */
static int up_linear(cuda_engine *e, uploader *u, dol_pool *pool, const cu_linear *dst, int64_t row0,
                     const dol_tensor *t, const char *what, char *err, size_t errlen)
{
    for (int i = 0; i < dst->n_parts; i++) {
        const cu_part *p = &dst->part[i];
        if (p->row0 != row0) continue;
        if (p->f16) return up_f16(u, p->f16, t, err, errlen);
        return up_raw(u, (void *)p->blk.data, t->data, dol_tensor_bytes(t), err, errlen);
    }
    if (dst->n_parts) {
        dol_set_err(err, errlen, "cuda: %s: no part of its matrix starts at row %lld", what,
                    (long long)row0);
        return -1;
    }
    if (dst->f16) return up_f16(u, dst->f16 + (size_t)row0 * (size_t)dst->K, t, err, errlen);
    if (dst->is_q8) return up_q8(e, u, pool, &dst->q8, row0, t, what, err, errlen);
    return up_nf4(e, u, pool, &dst->nf4, row0, t, what, err, errlen);
}

/* A norm vector ([1, n]) as FP32. */
static int up_f32(uploader *u, float *dst, const dol_tensor *t, char *err, size_t errlen)
{
    const int64_t n = t->rows * t->cols;
    if ((size_t)n * sizeof(float) > STAGE_BYTES) {
        dol_set_err(err, errlen, "cuda: norm vector of %lld values is too large", (long long)n);
        return -1;
    }
    float *h = up_next(u, err, errlen);
    if (!h) return -1;
    dol_cpu_to_f32(h, t->data, t->dtype, n);
    return up_send(u, dst, (size_t)n * sizeof(float), err, errlen);
}

/* ---- sizing ------------------------------------------------------------- */

/* A [rows][cols] linear matrix as held: NF4 codes + scales, Q8_0 quants +
 * scales, or FP16. */
static size_t held_bytes(size_t rows, size_t cols, bool nf4, bool q8)
{
    if (q8) return dol_q8_bytes((int64_t)rows, (int64_t)cols);
    return nf4 ? dol_nf4_bytes((int64_t)rows, (int64_t)cols) : rows * cols * sizeof(dol_f16);
}

static bool any_block(const dol_tensor *const *src, int n)
{
    for (int i = 0; i < n; i++)
        if (dol_dtype_is_block(src[i]->dtype)) return true;
    return false;
}

/* A linear matrix made of the n source tensors (rows stacked) as held:
 * with a block-type source, each part as stored (block types) or FP16;
 * otherwise in the engine's format (held_bytes). */
static size_t matrix_bytes(const dol_tensor *const *src, int n, bool nf4, bool q8)
{
    const bool blk = any_block(src, n);
    size_t b = 0;
    for (int i = 0; i < n; i++) {
        const size_t rows = (size_t)src[i]->rows, cols = (size_t)src[i]->cols;
        if (!blk) b += held_bytes(rows, cols, nf4, q8);
        else if (dol_dtype_is_block(src[i]->dtype)) b += dol_tensor_bytes(src[i]);
        else b += rows * cols * sizeof(dol_f16);
    }
    return b;
}

/* The four linear matrices of layer s as lists of source tensors. */
typedef struct {
    const dol_tensor *src[4][3];
    int n[4];
} layer_srcs;

static layer_srcs srcs_of(const dol_layer_weights *s)
{
    layer_srcs r = { { { &s->q, &s->k, &s->v }, { &s->o }, { &s->gate, &s->up }, { &s->down } },
                     { 3, 1, 2, 1 } };
    return r;
}

/* Every weight as held on the device; fills the size fields of e->qs. */
static size_t linear_weight_bytes(cuda_engine *e, const dol_model *m)
{
    const dol_model_config *c = &e->c;
    const size_t d = (size_t)c->hidden_size, V = (size_t)c->vocab_size;
    size_t lin = 0, lin_f16 = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const layer_srcs ls = srcs_of(&m->layers[e->l0 + l]);
        for (int i = 0; i < 4; i++) {
            lin += matrix_bytes(ls.src[i], ls.n[i], e->nf4, e->q8);
            for (int k = 0; k < ls.n[i]; k++)
                lin_f16 += (size_t)(ls.src[i][k]->rows * ls.src[i][k]->cols) * sizeof(dol_f16);
        }
    }
    const bool tied = m->lm_head.data == m->embed.data;
    const dol_tensor *head_src = &m->lm_head;
    const size_t head = e->has_head ? matrix_bytes(&head_src, 1, e->nf4_head, e->q8_head) : 0;
    e->qs.linear_bytes = lin + head;
    e->qs.linear_f16_bytes = lin_f16 + (e->has_head ? V * d * sizeof(dol_f16) : 0);
    size_t b = lin + 2 * d * sizeof(float) * (size_t)c->n_layers; /* + the norms */
    if (e->has_embed) /* embedding: FP16, or a block type as stored */
        b += dol_dtype_is_block(m->embed.dtype) ? dol_tensor_bytes(&m->embed) : V * d * sizeof(dol_f16);
    if (!(tied && e->has_embed) || e->nf4_head || e->q8_head) b += head;
    if (e->has_head) b += d * sizeof(float);       /* final norm */
    return b;
}

/* Offsets of the metadata arrays (int32 units, each 16-byte aligned). */
static void plan_meta(cuda_engine *e)
{
    size_t o = 0;
    e->off_id = o;     o += align_up((size_t)e->max_T, 4);
    e->off_pos = o;    o += align_up((size_t)e->max_T, 4);
    e->off_item = o;   o += align_up((size_t)e->max_T, 4);
    e->off_lrow = o;   o += align_up((size_t)e->max_T, 4);
    e->off_dec = o;    o += align_up((size_t)e->max_dec, 4);
    e->off_tiles = o;  o += 4 * (size_t)e->max_tiles;
    e->off_tables = o; o += (size_t)e->max_items * e->max_blocks;
    e->meta_n = o;
}

static size_t workspace_bytes(const cuda_engine *e)
{
    const size_t T = (size_t)e->max_T;
    size_t b = 0;
    b += 2 * T * e->d * sizeof(float);                  /* x, dx */
    b += T * e->qkv_dim * sizeof(float);                /* qkv */
    b += T * 2 * (size_t)e->f * sizeof(float);          /* gu */
    b += (size_t)e->logit_chunk * e->V * sizeof(float); /* logits */
    b += dol_cuda_attention_decode_part_floats(e->max_dec, e->c.n_heads, e->hd, e->n_splits) *
         sizeof(float);
    b += T * ((size_t)e->d + e->q_dim + e->f) * sizeof(dol_f16); /* xn, att, hbuf */
    b += BLAS_WS_BYTES;
    b += e->nf4_ws_elems * sizeof(dol_f16);
    b += e->meta_n * sizeof(int32_t);
    b += 2 * (size_t)e->ctx * (e->hd / 2) * sizeof(float); /* RoPE tables */
    b += (size_t)16 * 256;                                 /* allocation rounding */
    return b;
}

/* ---- create / destroy ------------------------------------------------------ */

static void cuda_destroy(void *impl);

/* Device memory for a linear matrix [N][K]: FP16, NF4 codes + scales, or
 * Q8_0 quants + scales. */
static int alloc_linear(cuda_engine *e, cu_linear *w, int N, int K, bool nf4, bool q8, char *err,
                        size_t errlen)
{
    memset(w, 0, sizeof *w);
    w->N = N;
    w->K = K;
    if (q8) {
        int8_t *quants = NULL;
        dol_f16 *scales = NULL;
        if (dalloc(e, &quants, dol_q8_quants_bytes(N, K), "weights", err, errlen) ||
            dalloc(e, &scales, dol_q8_scales_bytes(N, K), "weights", err, errlen))
            return -1;
        w->is_q8 = true;
        w->q8 = (dol_cuda_q8){ quants, scales, N, K };
        return 0;
    }
    if (!nf4) return dalloc(e, &w->f16, (size_t)N * (size_t)K * sizeof(dol_f16), "weights", err, errlen);
    uint8_t *codes = NULL;
    dol_f16 *scales = NULL;
    if (dalloc(e, &codes, dol_nf4_codes_bytes(N, K), "weights", err, errlen) ||
        dalloc(e, &scales, dol_nf4_scales_bytes(N, K), "weights", err, errlen))
        return -1;
    w->nf4 = (dol_cuda_nf4){ codes, scales, N, K };
    return 0;
}

/* The device view of a block-type tensor t whose bytes are (or will be) at
 * data. */
static dol_cuda_blk blk_of(const void *data, const dol_tensor *t)
{
    return (dol_cuda_blk){ .data = data, .type = (int)t->dtype, .rows = (int)t->rows,
                           .cols = (int)t->cols, .block = dol_dtype_block(t->dtype),
                           .block_bytes = (int)dol_dtype_block_bytes(t->dtype),
                           .row_bytes = dol_dtype_row_bytes(t->dtype, t->cols) };
}

/* Device memory for the linear matrix made of the n source tensors (rows
 * stacked): with a block-type source, one part per tensor (block types as
 * stored, the others FP16); otherwise alloc_linear in the engine's format. */
static int alloc_matrix(cuda_engine *e, cu_linear *w, const dol_tensor *const *src, int n,
                        bool nf4, bool q8, char *err, size_t errlen)
{
    int N = 0;
    for (int i = 0; i < n; i++) N += (int)src[i]->rows;
    if (!any_block(src, n)) return alloc_linear(e, w, N, (int)src[0]->cols, nf4, q8, err, errlen);
    memset(w, 0, sizeof *w);
    w->K = (int)src[0]->cols;
    for (int i = 0; i < n; i++) {
        cu_part *p = &w->part[i];
        p->row0 = w->N;
        p->rows = (int)src[i]->rows;
        w->N += p->rows;
        if (dol_dtype_is_block(src[i]->dtype)) {
            void *d = NULL;
            if (dalloc(e, &d, dol_tensor_bytes(src[i]), "weights", err, errlen)) return -1;
            p->blk = blk_of(d, src[i]);
        } else if (dalloc(e, &p->f16, (size_t)p->rows * (size_t)w->K * sizeof(dol_f16), "weights",
                          err, errlen)) {
            return -1;
        }
    }
    w->n_parts = n;
    return 0;
}

/* Load progress of one instance: a tensor's checkpoint pages are dropped
 * (dol_model_release) once up_* returns, since by then its bytes are in a
 * pinned buffer, so the host holds the weights once (the device copy) and
 * not the checkpoint besides. A load over a second logs its progress. */
typedef struct {
    size_t total, done, released;
    double t0, last_log;
} up_progress;

static size_t layer_bytes(const dol_layer_weights *s)
{
    const dol_tensor *t[9] = { &s->attn_norm, &s->ffn_norm, &s->q,  &s->k,   &s->v,
                               &s->o,         &s->gate,     &s->up, &s->down };
    size_t n = 0;
    for (int i = 0; i < 9; i++) n += dol_tensor_bytes(t[i]);
    return n;
}

static void prefetch_layer(const dol_model *m, const dol_layer_weights *s)
{
    const dol_tensor *t[7] = { &s->q, &s->k, &s->v, &s->o, &s->gate, &s->up, &s->down };
    for (int i = 0; i < 7; i++) dol_model_prefetch(m, t[i]);
}

static void up_done(up_progress *pr, const dol_model *m, const dol_tensor *t)
{
    pr->released += dol_model_release(m, t);
    pr->done += dol_tensor_bytes(t);
    const double now = dol_now_ms();
    if (now - pr->last_log >= 1000.0 && pr->done < pr->total) {
        dol_log(DOL_LOG_INFO, "weights_loading", "bytes_done=%zu bytes_total=%zu mb_s=%.0f",
                pr->done, pr->total, pr->done / 1e6 / ((now - pr->t0) / 1000.0));
        pr->last_log = now;
    }
}

static int alloc_and_upload(cuda_engine *e, const dol_model *m, char *err, size_t errlen)
{
    const dol_model_config *c = &e->c;
    const size_t d = (size_t)e->d, f = (size_t)e->f;
    e->L = calloc((size_t)c->n_layers, sizeof *e->L);
    if (!e->L) { dol_set_err(err, errlen, "engine: out of memory"); return -1; }
    for (int l = 0; l < c->n_layers; l++) {
        cu_layer *w = &e->L[l];
        const layer_srcs ls = srcs_of(&m->layers[e->l0 + l]);
        cu_linear *mat[4] = { &w->qkv, &w->o, &w->gu, &w->down };
        if (dalloc(e, &w->attn_norm, d * sizeof(float), "weights", err, errlen) ||
            dalloc(e, &w->ffn_norm, d * sizeof(float), "weights", err, errlen))
            return -1;
        for (int i = 0; i < 4; i++)
            if (alloc_matrix(e, mat[i], ls.src[i], ls.n[i], e->nf4, e->q8, err, errlen)) return -1;
    }
    const bool embed_blk = dol_dtype_is_block(m->embed.dtype);
    if (e->has_embed && embed_blk) {
        void *p = NULL;
        if (dalloc(e, &p, dol_tensor_bytes(&m->embed), "weights", err, errlen)) return -1;
        e->embed_blk = blk_of(p, &m->embed);
    } else if (e->has_embed &&
               dalloc(e, &e->embed, (size_t)e->V * d * sizeof(dol_f16), "weights", err, errlen)) {
        return -1;
    }
    if (e->has_head && dalloc(e, &e->final_norm, d * sizeof(float), "weights", err, errlen))
        return -1;
    /* a tied lm_head shares the embedding when both are here */
    bool tied = m->lm_head.data == m->embed.data && e->has_embed;
    const dol_tensor *head_src = &m->lm_head;
    if (!e->has_head) e->lm_head = (cu_linear){ 0 };
    else if (tied && embed_blk)
        e->lm_head = (cu_linear){ .N = e->V, .K = e->d, .n_parts = 1,
                                  .part = { { .row0 = 0, .rows = e->V, .blk = e->embed_blk } } };
    else if (tied && !e->nf4_head && !e->q8_head)
        e->lm_head = (cu_linear){ .N = e->V, .K = e->d, .f16 = e->embed };
    else if (alloc_matrix(e, &e->lm_head, &head_src, 1, e->nf4_head, e->q8_head, err, errlen))
        return -1;

    const size_t T = (size_t)e->max_T;
    if (dalloc(e, &e->x, T * d * sizeof(float), "workspaces", err, errlen) ||
        dalloc(e, &e->dx, T * d * sizeof(float), "workspaces", err, errlen) ||
        dalloc(e, &e->qkv, T * e->qkv_dim * sizeof(float), "workspaces", err, errlen) ||
        dalloc(e, &e->gu, T * 2 * f * sizeof(float), "workspaces", err, errlen) ||
        dalloc(e, &e->logits, (size_t)e->logit_chunk * e->V * sizeof(float), "workspaces", err, errlen) ||
        dalloc(e, &e->part,
               dol_cuda_attention_decode_part_floats(e->max_dec, c->n_heads, e->hd, e->n_splits) *
                   sizeof(float), "workspaces", err, errlen) ||
        dalloc(e, &e->xn, T * d * sizeof(dol_f16), "workspaces", err, errlen) ||
        dalloc(e, &e->att, T * e->q_dim * sizeof(dol_f16), "workspaces", err, errlen) ||
        dalloc(e, &e->hbuf, T * f * sizeof(dol_f16), "workspaces", err, errlen) ||
        dalloc(e, &e->blas_ws, BLAS_WS_BYTES, "workspaces", err, errlen) ||
        dalloc(e, &e->meta_d, e->meta_n * sizeof(int32_t), "workspaces", err, errlen) ||
        dalloc(e, &e->rope_cos, (size_t)e->ctx * (e->hd / 2) * sizeof(float), "workspaces", err, errlen) ||
        dalloc(e, &e->rope_sin, (size_t)e->ctx * (e->hd / 2) * sizeof(float), "workspaces", err, errlen))
        return -1;
    if (e->nf4_ws_elems &&
        dalloc(e, &e->nf4_ws, e->nf4_ws_elems * sizeof(dol_f16), "workspaces", err, errlen))
        return -1;
    CUBLAS_CHECK(cublasSetWorkspace(e->blas, e->blas_ws, BLAS_WS_BYTES));
    CUDA_CHECK(cudaMallocHost((void **)&e->meta_h, e->meta_n * sizeof(int32_t)));
    CUDA_CHECK(cudaMallocHost((void **)&e->logits_h, (size_t)e->logit_chunk * e->V * sizeof(float)));
    memset(e->meta_h, 0, e->meta_n * sizeof(int32_t));

    size_t kv_bytes = (size_t)e->n_blocks * (size_t)e->kvg.block_bytes;
    if (dalloc(e, &e->kv_pool, kv_bytes, "the KV cache", err, errlen)) return -1;
    CUDA_CHECK(cudaMemsetAsync(e->kv_pool, 0, kv_bytes, e->stream));

    /* RoPE tables, angles in double: theta^(-2i/head_dim) * pos / scale (as cpu_engine.c)
     * (linear RoPE scaling: scale 1 leaves the angles as they were, bit for bit) */
    const double rope_scale = c->rope_scale > 0 ? (double)c->rope_scale : 1.0;
    const int half = e->hd / 2;
    float *cs = malloc(sizeof(float) * (size_t)e->ctx * half);
    float *sn = malloc(sizeof(float) * (size_t)e->ctx * half);
    if (!cs || !sn) {
        free(cs);
        free(sn);
        dol_set_err(err, errlen, "engine: out of memory");
        return -1;
    }
    for (int pos = 0; pos < e->ctx; pos++)
        for (int i = 0; i < half; i++) {
            double inv = pow((double)c->rope_theta, -2.0 * i / e->hd);
            double a = pos / rope_scale * inv;
            cs[(size_t)pos * half + i] = (float)cos(a);
            sn[(size_t)pos * half + i] = (float)sin(a);
        }
    cudaError_t rc1 = cudaMemcpy(e->rope_cos, cs, sizeof(float) * (size_t)e->ctx * half, cudaMemcpyHostToDevice);
    cudaError_t rc2 = cudaMemcpy(e->rope_sin, sn, sizeof(float) * (size_t)e->ctx * half, cudaMemcpyHostToDevice);
    free(cs);
    free(sn);
    CUDA_CHECK(rc1);
    CUDA_CHECK(rc2);

    /* weights: q/k/v rows into one matrix, gate/up rows into another (NF4:
     * quantized on the host on a pool of n_threads, slab by slab) */
    dol_pool *pool = NULL;
    if (e->nf4 || e->nf4_head || e->q8 || e->q8_head) {
        pool = dol_pool_new(e->n_threads);
        if (!pool) {
            dol_set_err(err, errlen, "engine: cannot start %d threads", e->n_threads);
            return -1;
        }
    }
    uploader u;
    up_progress pr = { .t0 = dol_now_ms() };
    pr.last_log = pr.t0;
    for (int l = 0; l < c->n_layers; l++) pr.total += layer_bytes(&m->layers[e->l0 + l]);
    if (e->has_embed) pr.total += dol_tensor_bytes(&m->embed);
    const bool head_upload = e->has_head && (!tied || (!embed_blk && (e->nf4_head || e->q8_head)));
    if (head_upload) pr.total += dol_tensor_bytes(&m->lm_head);
    if (e->has_head) pr.total += dol_tensor_bytes(&m->final_norm);
    if (c->n_layers > 0) prefetch_layer(m, &m->layers[e->l0]);
    int rc = up_init(&u, e->stream, err, errlen);
    for (int l = 0; rc == 0 && l < c->n_layers; l++) {
        const dol_layer_weights *s = &m->layers[e->l0 + l];
        cu_layer *w = &e->L[l];
        if (l + 1 < c->n_layers) prefetch_layer(m, &m->layers[e->l0 + l + 1]);
        const struct { const cu_linear *dst; int64_t row0; const dol_tensor *src; const char *name; } lin[] = {
            { &w->qkv, 0, &s->q, "self_attn.q_proj" },
            { &w->qkv, e->q_dim, &s->k, "self_attn.k_proj" },
            { &w->qkv, (int64_t)e->q_dim + e->kv_dim, &s->v, "self_attn.v_proj" },
            { &w->o, 0, &s->o, "self_attn.o_proj" },
            { &w->gu, 0, &s->gate, "mlp.gate_proj" },
            { &w->gu, e->f, &s->up, "mlp.up_proj" },
            { &w->down, 0, &s->down, "mlp.down_proj" },
        };
        rc = up_f32(&u, w->attn_norm, &s->attn_norm, err, errlen) ||
             up_f32(&u, w->ffn_norm, &s->ffn_norm, err, errlen) ? -1 : 0;
        if (rc == 0) {
            up_done(&pr, m, &s->attn_norm);
            up_done(&pr, m, &s->ffn_norm);
        }
        for (size_t i = 0; rc == 0 && i < sizeof lin / sizeof lin[0]; i++) {
            char what[96];
            snprintf(what, sizeof what, "model.layers.%d.%s.weight", e->l0 + l, lin[i].name);
            rc = up_linear(e, &u, pool, lin[i].dst, lin[i].row0, lin[i].src, what, err, errlen);
            if (rc == 0) up_done(&pr, m, lin[i].src);
        }
    }
    if (rc == 0 && e->has_embed) {
        if (head_upload) dol_model_prefetch(m, &m->lm_head);
        rc = embed_blk ? up_raw(&u, (void *)e->embed_blk.data, m->embed.data,
                                dol_tensor_bytes(&m->embed), err, errlen)
                       : up_f16(&u, e->embed, &m->embed, err, errlen);
        if (rc == 0) up_done(&pr, m, &m->embed);
    }
    if (rc == 0 && head_upload) {
        rc = up_linear(e, &u, pool, &e->lm_head, 0, &m->lm_head, "lm_head.weight", err, errlen);
        if (rc == 0) up_done(&pr, m, &m->lm_head);
    }
    if (rc == 0 && e->has_head) {
        rc = up_f32(&u, e->final_norm, &m->final_norm, err, errlen);
        if (rc == 0) up_done(&pr, m, &m->final_norm);
    }
    up_free(&u);
    dol_pool_free(pool);
    if (rc) return -1;
    CUDA_CHECK(cudaDeviceSynchronize()); /* every upload and memset done */
    const double sec = (dol_now_ms() - pr.t0) / 1000.0;
    dol_log(DOL_LOG_INFO, "weights_prepared",
            "device=%d bytes=%zu held_bytes=%zu released_bytes=%zu seconds=%.3f mb_s=%.0f", e->dev,
            pr.total, e->weight_bytes, pr.released, sec, sec > 0 ? pr.total / 1e6 / sec : 0.0);
    return 0;
}

/* The checks and the sizes of an instance for range r, before any device
 * call (create_range, range_bytes). */
static int cuda_setup(cuda_engine *e, const dol_model *m, const dol_engine_params *p, int ctx, int bs,
                      const dol_layer_range *r, char *err, size_t errlen)
{
    const dol_model_config *c = &m->cfg;
    if (p->weights != DOL_WEIGHTS_AUTO && p->weights != DOL_WEIGHTS_F16 &&
        p->weights != DOL_WEIGHTS_NF4 && p->weights != DOL_WEIGHTS_INT8) {
        dol_set_err(err, errlen, "weights: the CUDA backend holds weights in f16, nf4 or int8 (use "
                                 "weights: f16, nf4, int8 or auto, or backend: cpu)");
        return -1;
    }
    if (p->weights == DOL_WEIGHTS_NF4 &&
        (dol_nf4_check_cols(c->hidden_size, "hidden_size", err, errlen) != 0 ||
         dol_nf4_check_cols((int64_t)c->n_heads * c->head_dim, "n_heads * head_dim", err, errlen) != 0 ||
         dol_nf4_check_cols(c->intermediate_size, "intermediate_size", err, errlen) != 0))
        return -1;
    if (c->head_dim % 8 != 0 || c->head_dim > DOL_CUDA_MAX_HEAD_DIM) {
        dol_set_err(err, errlen, "cuda: head_dim %d is not supported (a multiple of 8, at most %d)",
                    c->head_dim, DOL_CUDA_MAX_HEAD_DIM);
        return -1;
    }
    e->c = *c;
    e->c.n_layers = r->l1 - r->l0;
    e->l0 = r->l0;
    e->has_embed = r->embed;
    e->has_head = r->head;
    e->head_at_end = r->head && r->l1 == c->n_layers;
    e->dev = r->device;
    e->d = c->hidden_size;
    e->f = c->intermediate_size;
    e->hd = c->head_dim;
    e->q_dim = c->n_heads * c->head_dim;
    e->kv_dim = c->n_kv_heads * c->head_dim;
    e->qkv_dim = e->q_dim + 2 * e->kv_dim;
    e->V = c->vocab_size;
    e->ctx = ctx;
    e->bs = bs;
    e->scale = 1.0f / sqrtf((float)c->head_dim);
    e->nf4 = p->weights == DOL_WEIGHTS_NF4;
    e->nf4_head = e->nf4 && p->quantize_lm_head;
    e->q8 = p->weights == DOL_WEIGHTS_INT8;
    e->q8_head = e->q8 && p->quantize_lm_head;
    /* GGUF block types are held as stored; weights: applies to the others */
    size_t blk_most = 0; /* the largest block-type part, in weights */
    for (int l = r->l0; l < r->l1; l++) {
        const layer_srcs ls = srcs_of(&m->layers[l]);
        for (int i = 0; i < 4; i++)
            for (int k = 0; k < ls.n[i]; k++)
                if (dol_dtype_is_block(ls.src[i][k]->dtype)) {
                    const size_t n = (size_t)(ls.src[i][k]->rows * ls.src[i][k]->cols);
                    blk_most = n > blk_most ? n : blk_most;
                }
    }
    if (r->head && dol_dtype_is_block(m->lm_head.dtype)) {
        e->nf4_head = e->q8_head = false;
        const size_t n = (size_t)(m->lm_head.rows * m->lm_head.cols);
        blk_most = n > blk_most ? n : blk_most;
    }
    e->blk = blk_most > 0 || (r->embed && dol_dtype_is_block(m->embed.dtype));
    e->n_threads = p->n_threads > 0 ? p->n_threads : 1;
    e->max_T = p->max_batch_tokens > 0 ? p->max_batch_tokens : 2048;
    const int max_seqs = p->max_seqs > 0 ? p->max_seqs : 16;
    e->max_items = max_seqs < e->max_T ? max_seqs : e->max_T;
    e->max_dec = e->max_items * DECODE_ITEM_MAX < e->max_T ? e->max_items * DECODE_ITEM_MAX : e->max_T;
    e->logit_chunk = e->max_T < LOGIT_CHUNK ? e->max_T : LOGIT_CHUNK;
    e->max_blocks = (ctx + bs - 1) / bs;
    e->max_tiles = e->max_T / DOL_CUDA_PREFILL_BQ + e->max_items;
    e->split_len = SPLIT_LEN_MIN;
    if ((ctx + e->split_len - 1) / e->split_len > SPLITS_MAX)
        e->split_len = (int)align_up((size_t)((ctx + SPLITS_MAX - 1) / SPLITS_MAX), 32);
    e->n_splits = (ctx + e->split_len - 1) / e->split_len;
    for (int w = 0; w < 2; w++) {
        /* engine.c resolved both halves; F32 is not held here (kv_no_f32) */
        e->kv_dt[w] = (w ? p->kv_dtype_v : p->kv_dtype_k) == DOL_KV_Q8_0 ? DOL_KV_Q8_0 : DOL_KV_F16;
        if (e->kv_dt[w] == DOL_KV_Q8_0 && !dol_kv_q8_head_ok(c->head_dim)) {
            dol_set_err(err, errlen, "%s: q8_0 holds heads of fewer than %d values or a multiple of %d; "
                        "this model's head_dim is %d", w ? "kv_cache_dtype_v" : "kv_cache_dtype_k",
                        DOL_KV_Q8_BLOCK, DOL_KV_Q8_BLOCK, c->head_dim);
            return -1;
        }
    }
    e->kvg = dol_cuda_kv_geom_of(e->c.n_layers, bs, e->kv_dim, e->hd, e->kv_dt[0] == DOL_KV_Q8_0,
                                 e->kv_dt[1] == DOL_KV_Q8_0);
    if ((e->nf4 || e->nf4_head || e->q8 || e->q8_head || blk_most > 0) &&
        e->max_T > DOL_CUDA_NF4_GEMV_UPTO) {
        /* the dequantized tile: the largest quantized matrix, at most NF4_WS_ELEMS */
        size_t most = 0;
        if (e->nf4 || e->q8) {
            const size_t d = (size_t)e->d, f = (size_t)e->f;
            const size_t sizes[4] = { (size_t)e->qkv_dim * d, d * e->q_dim, 2 * f * d, d * f };
            for (int i = 0; i < 4; i++) most = sizes[i] > most ? sizes[i] : most;
        }
        if ((e->nf4_head || e->q8_head) && (size_t)e->V * e->d > most) most = (size_t)e->V * e->d;
        if (blk_most > most) most = blk_most;
        e->nf4_ws_elems = most < NF4_WS_ELEMS ? most : NF4_WS_ELEMS;
    }
    plan_meta(e);
    return 0;
}

static size_t cuda_range_bytes(const dol_model *m, const dol_engine_params *p, int ctx, int bs,
                               const dol_layer_range *r, char *err, size_t errlen)
{
    cuda_engine *e = calloc(1, sizeof *e);
    size_t b = SIZE_MAX;
    if (!e) dol_set_err(err, errlen, "engine: out of memory");
    else if (cuda_setup(e, m, p, ctx, bs, r, err, errlen) == 0)
        b = linear_weight_bytes(e, m) + workspace_bytes(e);
    free(e);
    return b;
}

/* The KV cache's types for the start-up line: "f16", "q8_0", or "k=..,v=..". */
static const char *kv_dtype_label(const cuda_engine *e)
{
    const bool k8 = e->kv_dt[0] == DOL_KV_Q8_0, v8 = e->kv_dt[1] == DOL_KV_Q8_0;
    return k8 && v8 ? "q8_0" : k8 ? "k=q8_0,v=f16" : v8 ? "k=f16,v=q8_0" : "f16";
}

static int cuda_create_range(const dol_model *m, const dol_engine_params *p, int ctx, int bs,
                             const dol_layer_range *r, int *n_blocks, void **out, char *err,
                             size_t errlen)
{
    double frac = p->gpu_memory_utilization > 0 ? p->gpu_memory_utilization : 0.90;
    if (frac > 1.0) {
        dol_set_err(err, errlen, "gpu_memory_utilization: %.3f is not in (0, 1]", frac);
        return -1;
    }
    cuda_engine *e = calloc(1, sizeof *e);
    if (!e) { dol_set_err(err, errlen, "engine: out of memory"); return -1; }
    if (cuda_setup(e, m, p, ctx, bs, r, err, errlen) != 0) {
        free(e);
        return -1;
    }
    const int max_seqs = p->max_seqs > 0 ? p->max_seqs : 16;
    const char *g = getenv("DOLPHIN_CUDA_GRAPHS");
    e->graphs_on = !(g && strcmp(g, "0") == 0);
    e->graph = calloc((size_t)e->max_items + 1, sizeof *e->graph);
    e->seen = calloc((size_t)e->max_items + 1, 1);
    if (!e->graph || !e->seen) {
        dol_set_err(err, errlen, "engine: out of memory");
        goto fail;
    }

    /* context, stream and cuBLAS first: what they take counts as in use */
    {
        cudaError_t rc = cudaSetDevice(e->dev);
        if (rc == cudaSuccess) rc = cudaFree(NULL);
        if (rc == cudaSuccess) rc = cudaStreamCreateWithFlags(&e->stream, cudaStreamNonBlocking);
        if (rc != cudaSuccess) {
            char where[80];
            dol_set_err(err, errlen, "cuda: cannot initialise device %d: %s (%s) on %s", e->dev,
                        cudaGetErrorString(rc), cudaGetErrorName(rc), dol_cuda_where(where, sizeof where));
            goto fail;
        }
        if (e->has_embed) g_cuda_dev = e->dev;
        cublasStatus_t bs_rc = cublasCreate(&e->blas);
        if (bs_rc != CUBLAS_STATUS_SUCCESS) {
            e->blas = NULL;
            char where[80];
            dol_set_err(err, errlen, "cublas: cannot create a handle: %s on %s", cublasGetStatusString(bs_rc),
                        dol_cuda_where(where, sizeof where));
            goto fail;
        }
        bs_rc = cublasSetStream(e->blas, e->stream);
        if (bs_rc != CUBLAS_STATUS_SUCCESS) {
            char where[80];
            dol_set_err(err, errlen, "cublas: cannot set the stream: %s on %s", cublasGetStatusString(bs_rc),
                        dol_cuda_where(where, sizeof where));
            goto fail;
        }
    }

    /* Memory budget: Dolphin may bring the device's use up to
     * gpu_memory_utilization of its total, what is already in use (this
     * context, other processes) included, less RESERVE_BYTES kept for the
     * runtime. Weights and workspaces first, the KV pool from the rest. */
    size_t free0 = 0, total = 0;
    {
        cudaError_t rc = cudaMemGetInfo(&free0, &total);
        if (rc != cudaSuccess) {
            char where[80];
            dol_set_err(err, errlen, "cuda: cudaMemGetInfo failed: %s (%s) on %s", cudaGetErrorString(rc),
                        cudaGetErrorName(rc), dol_cuda_where(where, sizeof where));
            goto fail;
        }
    }
    const double in_use = (double)(total - free0);
    const double avail = frac * (double)total - in_use - (double)RESERVE_BYTES;
    e->weight_bytes = linear_weight_bytes(e, m);
    const double fixed = (double)e->weight_bytes + (double)workspace_bytes(e);
    const size_t block_bytes = (size_t)e->kvg.block_bytes;
    if (fixed > avail) {
        dol_set_err(err, errlen,
                    "cuda: model %s does not fit: weights %.0f MiB + workspaces %.0f MiB need "
                    "%.0f MiB, but gpu_memory_utilization %.2f of %.0f MiB leaves %.0f MiB (%.0f MiB "
                    "already in use, %.0f MiB kept for the runtime): short by %.0f MiB",
                    m->name, MIB(e->weight_bytes), MIB(fixed - (double)e->weight_bytes), MIB(fixed),
                    frac, MIB(total), MIB(avail > 0 ? avail : 0), MIB(in_use), MIB(RESERVE_BYTES),
                    MIB(fixed - avail));
        goto fail;
    }
    int64_t blocks = *n_blocks;
    const double room = avail - fixed;
    if (blocks > 0) {
        if ((double)blocks * (double)block_bytes > room) {
            dol_set_err(err, errlen,
                        "kv_cache: %lld blocks of %d tokens (%.0f MiB) do not fit: after weights "
                        "and workspaces, gpu_memory_utilization %.2f leaves %.0f MiB: short by %.0f MiB",
                        (long long)blocks, bs, MIB((double)blocks * block_bytes), frac, MIB(room),
                        MIB((double)blocks * block_bytes - room));
            goto fail;
        }
    } else {
        /* all that fits, up to max_seqs full contexts (more is never used) */
        blocks = (int64_t)(room / (double)block_bytes);
        int64_t useful = (int64_t)max_seqs * e->max_blocks;
        if (blocks > useful) blocks = useful;
        if (blocks < e->max_blocks) {
            dol_set_err(err, errlen,
                        "kv_cache: one full context of %d tokens needs %.0f MiB of KV cache, but "
                        "gpu_memory_utilization %.2f leaves %.0f MiB after weights and workspaces: "
                        "short by %.0f MiB",
                        ctx, MIB((double)e->max_blocks * block_bytes), frac, MIB(room),
                        MIB((double)e->max_blocks * block_bytes - room));
            goto fail;
        }
        if (blocks > INT32_MAX / 2) blocks = INT32_MAX / 2;
    }
    e->n_blocks = (int)blocks;
    if (alloc_and_upload(e, m, err, errlen) != 0) goto fail;
    dol_log(DOL_LOG_INFO, "cuda_ready",
            "device=%d blocks=%d..%d weights=%s%s lm_head=%s weights_mib=%.0f workspace_mib=%.0f kv_blocks=%d "
            "kv_dtype=%s kv_bytes_per_token=%zu kv_mib=%.0f budget_mib=%.0f graphs=%d",
            e->dev, e->l0, e->l0 + e->c.n_layers - 1, e->nf4 ? "nf4" : e->q8 ? "int8" : "f16",
            e->blk ? "+gguf_blocks" : "",
            e->nf4_head ? "nf4" : e->q8_head ? "int8"
                        : e->lm_head.n_parts ? dol_dtype_name((dol_dtype)e->lm_head.part[0].blk.type) : "f16",
            MIB(e->weight_bytes),
            MIB(workspace_bytes(e)), e->n_blocks, kv_dtype_label(e), block_bytes / (size_t)e->bs,
            MIB((double)e->n_blocks * block_bytes), MIB(frac * (double)total), e->graphs_on ? 1 : 0);
    *n_blocks = e->n_blocks;
    *out = e;
    return 0;
fail:
    cuda_destroy(e);
    return -1;
}

static int cuda_create(const dol_model *m, const dol_engine_params *p, int ctx, int bs,
                       int *n_blocks, void **out, char *err, size_t errlen)
{
    const dol_layer_range whole = { 0, m->cfg.n_layers, true, true, 0 };
    return cuda_create_range(m, p, ctx, bs, &whole, n_blocks, out, err, errlen);
}

static void cuda_destroy(void *impl)
{
    cuda_engine *e = impl;
    if (!e) return;
    (void)cudaSetDevice(e->dev);
    if (e->stream) (void)cudaStreamSynchronize(e->stream);
    if (e->graph)
        for (int b = 0; b <= e->max_items; b++)
            if (e->graph[b]) cudaGraphExecDestroy(e->graph[b]);
    if (e->blas) cublasDestroy(e->blas);
    for (int i = 0; i < e->n_allocs; i++) cudaFree(e->allocs[i]);
    if (e->meta_h) cudaFreeHost(e->meta_h);
    if (e->logits_h) cudaFreeHost(e->logits_h);
    if (e->stream) cudaStreamDestroy(e->stream);
    (void)cudaGetLastError();
    free(e->allocs);
    free(e->L);
    free(e->graph);
    free(e->seen);
    free(e);
}

static size_t cuda_weight_bytes(void *impl) { return ((cuda_engine *)impl)->weight_bytes; }

static void cuda_quant_stats(void *impl, dol_quant_stats *out) { *out = ((cuda_engine *)impl)->qs; }

/* Exact: kernels/kv_layout.h rounds a block to a multiple of block_size bytes. */
static size_t cuda_kv_bytes_per_token(void *impl)
{
    cuda_engine *e = impl;
    return (size_t)e->kvg.block_bytes / (size_t)e->bs;
}

/* The whole device as cudaMemGetInfo sees it (other processes included). */
static int cuda_memory_info(void *impl, size_t *used, size_t *total)
{
    cuda_engine *e = impl;
    size_t fr = 0, tot = 0;
    if (cudaSetDevice(e->dev) != cudaSuccess || cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    *used = tot - fr;
    *total = tot;
    return 0;
}

/* Device memory Dolphin may use on `dev` (the budget of cuda_create_range,
 * before anything of ours is there): utilization of the total, less what is
 * in use (a context of ours included) and RESERVE_BYTES. */
static int cuda_device_budget(int dev, double frac, size_t *avail, size_t *total, char *err, size_t errlen)
{
    if (frac <= 0) frac = 0.90;
    size_t fr = 0, tot = 0;
    cudaError_t rc = cudaSetDevice(dev);
    if (rc == cudaSuccess) rc = cudaFree(NULL);
    if (rc == cudaSuccess) rc = cudaMemGetInfo(&fr, &tot);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        dol_set_err(err, errlen, "cuda: device %d: cannot read its memory: %s (%s)", dev,
                    cudaGetErrorString(rc), cudaGetErrorName(rc));
        return -1;
    }
    const double a = frac * (double)tot - (double)(tot - fr) - (double)RESERVE_BYTES;
    *avail = a > 0 ? (size_t)a : 0;
    *total = tot;
    return 0;
}

static const void *cuda_hidden_dev(void *impl) { return ((cuda_engine *)impl)->x; }

static dol_cuda_kv kv_view(const cuda_engine *e, int layer)
{
    dol_cuda_kv kv = { e->kv_pool, e->kvg, layer, e->bs, e->kv_dim,
                       e->meta_d + e->off_tables, e->max_blocks };
    return kv;
}

/* Asynchronous on the engine's stream, so ordered before the next forward;
 * a failure is kept and reported by that forward (the call returns void). */
static void cuda_copy_block(void *impl, int32_t src, int32_t dst, int rows)
{
    cuda_engine *e = impl;
    cudaError_t rc = cudaSetDevice(e->dev);
    if (rc == cudaSuccess) {
        dol_cuda_kv kv = kv_view(e, 0);
        rc = dol_cuda_kv_copy_block(&kv, e->c.n_layers, src, dst, rows, e->stream);
    }
    if (rc != cudaSuccess && !e->deferred[0]) {
        char where[80];
        snprintf(e->deferred, sizeof e->deferred, "cuda: KV block copy %d -> %d failed: %s (%s) on %s", src,
                 dst, cudaGetErrorString(rc), cudaGetErrorName(rc), dol_cuda_where(where, sizeof where));
    }
}

/* ---- the forward pass ------------------------------------------------------ */

/* out[T][N] = x[T][K] . W[N][K]^T: FP16 inputs, FP32 accumulation and output.
 * FP16 W: row-major out is column-major out^T = W^T(N x K) . x^T(K x T).
 * NF4 W: kernels/nf4.cu, Q8_0 W: kernels/q8.cu (decode kernel for a few
 * rows, dequantized tiles and cuBLAS for more). */
static int linear(cuda_engine *e, float *out, const dol_f16 *x, int T, const cu_linear *w,
                  char *err, size_t errlen)
{
    if (w->n_parts) { /* each part into its columns of out (row stride N) */
        const float alpha = 1.0f, beta = 0.0f;
        for (int i = 0; i < w->n_parts; i++) {
            const cu_part *p = &w->part[i];
            if (!p->f16) {
                if (dol_cuda_blk_matmul(e->blas, out + p->row0, w->N, x, T, &p->blk, e->nf4_ws,
                                        e->nf4_ws_elems, e->stream, err, errlen) != 0)
                    return -1;
                continue;
            }
            CUBLAS_CHECK(cublasGemmEx(e->blas, CUBLAS_OP_T, CUBLAS_OP_N, p->rows, T, w->K, &alpha,
                                      p->f16, CUDA_R_16F, w->K, x, CUDA_R_16F, w->K, &beta,
                                      out + p->row0, CUDA_R_32F, w->N, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
        }
        return 0;
    }
    if (w->is_q8)
        return dol_cuda_q8_matmul(e->blas, out, x, T, &w->q8, e->nf4_ws, e->nf4_ws_elems,
                                  e->stream, err, errlen);
    if (!w->f16)
        return dol_cuda_nf4_matmul(e->blas, out, x, T, &w->nf4, e->nf4_ws, e->nf4_ws_elems,
                                   e->stream, err, errlen);
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(e->blas, CUBLAS_OP_T, CUBLAS_OP_N, w->N, T, w->K, &alpha, w->f16,
                              CUDA_R_16F, w->K, x, CUDA_R_16F, w->K, &beta, out, CUDA_R_32F, w->N,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* Enqueue one step over the metadata already in meta_d: T token rows, n_dec
 * of them decode tokens, n_tiles prefill tiles, R rows of logits (the first
 * min(R, logit_chunk) through lm_head). Only device work on e->stream, so it
 * can be captured into a graph. */
static int enqueue_step(cuda_engine *e, int T, int n_dec, int n_tiles, int R, char *err,
                        size_t errlen)
{
    const dol_model_config *c = &e->c;
    cudaStream_t s = e->stream;
    const int32_t *md = e->meta_d;
    const int32_t *ids = md + e->off_id, *pos = md + e->off_pos, *item = md + e->off_item;
    const int d = e->d, f = e->f;
    if (e->has_embed && e->embed_blk.data)
        CUDA_CHECK(dol_cuda_blk_embedding(e->x, &e->embed_blk, ids, T, s));
    else if (e->has_embed)
        CUDA_CHECK(dol_cuda_embedding(e->x, e->embed, ids, T, d, s));
    for (int l = 0; l < c->n_layers; l++) {
        const cu_layer *w = &e->L[l];
        const dol_cuda_kv kv = kv_view(e, l);
        /* attention block (the previous layer's MLP output joins the residual here) */
        CUDA_CHECK(dol_cuda_rmsnorm_residual(e->xn, e->x, l > 0 ? e->dx : NULL, w->attn_norm, NULL, T, d,
                                             c->rms_norm_eps, s));
        if (linear(e, e->qkv, e->xn, T, &w->qkv, err, errlen)) return -1;
        CUDA_CHECK(dol_cuda_rope(e->qkv, e->qkv_dim, pos, T, c->n_heads, c->n_kv_heads, e->hd,
                                 e->rope_cos, e->rope_sin, s));
        CUDA_CHECK(dol_cuda_kv_write(kv, e->qkv, e->qkv_dim, e->q_dim, e->q_dim + e->kv_dim, pos, item, T, s));
        CUDA_CHECK(dol_cuda_attention_decode(e->att, e->q_dim, e->qkv, e->qkv_dim, md + e->off_dec, n_dec,
                                             pos, item, c->n_heads, c->n_kv_heads, e->hd, e->scale, kv,
                                             e->part, e->n_splits, e->split_len, s));
        CUDA_CHECK(dol_cuda_attention_prefill(e->att, e->q_dim, e->qkv, e->qkv_dim, md + e->off_tiles,
                                              n_tiles, c->n_heads, c->n_kv_heads, e->hd, e->scale, kv, s));
        if (linear(e, e->dx, e->att, T, &w->o, err, errlen)) return -1;
        /* MLP block */
        CUDA_CHECK(dol_cuda_rmsnorm_residual(e->xn, e->x, e->dx, w->ffn_norm, NULL, T, d,
                                             c->rms_norm_eps, s));
        if (linear(e, e->gu, e->xn, T, &w->gu, err, errlen)) return -1;
        CUDA_CHECK(dol_cuda_silu_mul(e->hbuf, e->gu, T, f, s));
        if (linear(e, e->dx, e->hbuf, T, &w->down, err, errlen)) return -1;
    }
    if (!e->head_at_end) { /* the stream leaves whole: the last MLP output joins x */
        if (c->n_layers > 0)
            CUDA_CHECK(dol_cuda_rmsnorm_residual(e->xn, e->x, e->dx, e->L[c->n_layers - 1].ffn_norm, NULL,
                                                 T, d, c->rms_norm_eps, s));
        return 0;
    }
    if (R > 0) { /* final norm of the rows that want logits, into xn rows 0..R-1 */
        CUDA_CHECK(dol_cuda_rmsnorm_residual(e->xn, e->x, e->dx, e->final_norm, md + e->off_lrow, R, d,
                                             c->rms_norm_eps, s));
        int nr = R < e->logit_chunk ? R : e->logit_chunk;
        if (linear(e, e->logits, e->xn, nr, &e->lm_head, err, errlen)) return -1;
    }
    return 0;
}

/* Capture a decode-only step of B sequences (T = R = B) as a graph. */
static int capture_decode(cuda_engine *e, int B, char *err, size_t errlen)
{
    cudaGraph_t g = NULL;
    CUDA_CHECK(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeThreadLocal));
    int rc = enqueue_step(e, B, B, 0, B, err, errlen);
    cudaError_t end = cudaStreamEndCapture(e->stream, &g);
    if (rc == 0 && end != cudaSuccess) {
        char where[80];
        dol_set_err(err, errlen, "cudaStreamEndCapture: %s (%s) on %s", cudaGetErrorString(end),
                    cudaGetErrorName(end), dol_cuda_where(where, sizeof where));
        rc = -1;
    }
    if (rc == 0) {
        cudaError_t ie = cudaGraphInstantiate(&e->graph[B], g, 0);
        if (ie != cudaSuccess) {
            e->graph[B] = NULL;
            char where[80];
            dol_set_err(err, errlen, "cudaGraphInstantiate: %s (%s) on %s", cudaGetErrorString(ie),
                        cudaGetErrorName(ie), dol_cuda_where(where, sizeof where));
            rc = -1;
        }
    }
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
    return rc;
}

static int forward_inner(cuda_engine *e, const dol_forward_args *a, char *err, size_t errlen)
{
    const int T = a->T, n_items = a->n_items;
    if (T > e->max_T || n_items > e->max_items) {
        dol_set_err(err, errlen, "forward: %d tokens of %d sequences exceed the workspaces (%d, %d)",
                    T, n_items, e->max_T, e->max_items);
        return -1;
    }
    /* metadata on the host (pinned): free, since the previous call synchronised */
    int32_t *mh = e->meta_h;
    int n_dec = 0, n_tiles = 0, R = 0, t0 = 0;
    bool decode_only = true;
    for (int i = 0; i < n_items; i++) {
        const dol_batch_item *it = &a->items[i];
        const dol_kv_seq *sq = &a->kv->seqs[it->seq];
        const int n = it->n_tokens;
        if (sq->n_blocks > e->max_blocks || t0 + n > T) {
            dol_set_err(err, errlen, "forward: sequence %d: inconsistent block table", it->seq);
            return -1;
        }
        memcpy(mh + e->off_tables + (size_t)i * e->max_blocks, sq->table, sizeof(int32_t) * (size_t)sq->n_blocks);
        for (int k = 0; k < n; k++) {
            mh[e->off_id + t0 + k] = a->tok_id[t0 + k];
            mh[e->off_pos + t0 + k] = a->tok_pos[t0 + k];
            mh[e->off_item + t0 + k] = i;
        }
        if (n <= DECODE_ITEM_MAX) {
            for (int k = 0; k < n; k++) mh[e->off_dec + n_dec++] = t0 + k;
            if (n > 1) decode_only = false;
        } else {
            decode_only = false;
            for (int q0 = 0; q0 < n; q0 += DOL_CUDA_PREFILL_BQ) {
                int32_t *tl = mh + e->off_tiles + 4 * (size_t)n_tiles++;
                tl[0] = i;
                tl[1] = t0 + q0;
                tl[2] = n - q0 < DOL_CUDA_PREFILL_BQ ? n - q0 : DOL_CUDA_PREFILL_BQ;
                tl[3] = it->start_pos + q0;
            }
        }
        for (int k = n - it->n_logits; k < n; k++) mh[e->off_lrow + R++] = t0 + k;
        if (it->n_logits != 1) decode_only = false;
        t0 += n;
    }
    size_t meta_used = e->off_tables + (size_t)n_items * e->max_blocks;
    CUDA_CHECK(cudaMemcpyAsync(e->meta_d, mh, meta_used * sizeof(int32_t), cudaMemcpyHostToDevice, e->stream));
    /* layer placement: the residual stream from the previous range */
    const bool head_only = a->head_only;
    const size_t x_bytes = sizeof(float) * (size_t)T * e->d;
    if (!e->has_embed || head_only) {
        if (a->peer_in)
            CUDA_CHECK(cudaMemcpyPeerAsync(e->x, e->dev, a->peer_in, a->peer_dev, x_bytes, e->stream));
        else
            CUDA_CHECK(cudaMemcpyAsync(e->x, a->h_in, x_bytes, cudaMemcpyHostToDevice, e->stream));
    }
    if (!head_only && !e->head_at_end) R = 0;

    /* decode-only steps: eager the first time a batch size is seen (cuBLAS
     * picks and loads its kernels), captured the second, replayed after */
    bool launched = false;
    if (head_only) {
        if (R > 0) { /* the final norm and the first lm_head chunk, on the stream as received */
            CUDA_CHECK(dol_cuda_rmsnorm_residual(e->xn, e->x, NULL, e->final_norm, e->meta_d + e->off_lrow, R,
                                                 e->d, e->c.rms_norm_eps, e->stream));
            if (linear(e, e->logits, e->xn, R < e->logit_chunk ? R : e->logit_chunk, &e->lm_head, err, errlen))
                return -1;
        }
        launched = true;
    } else if (e->graphs_on && decode_only && n_items <= e->logit_chunk) {
        const int B = n_items;
        if (!e->graph[B] && e->seen[B]) {
            char gerr[DOL_ERR_LEN], q[DOL_ERR_LEN];
            if (capture_decode(e, B, gerr, sizeof gerr) != 0) {
                e->graphs_on = false;
                dol_log(DOL_LOG_WARN, "cuda_graphs_disabled", "batch=%d reason=%s", B,
                        dol_log_quote(gerr, q, sizeof q));
            }
        }
        e->seen[B] = 1;
        if (e->graph[B]) {
            CUDA_CHECK(cudaGraphLaunch(e->graph[B], e->stream));
            launched = true;
        }
    }
    if (!launched && enqueue_step(e, T, n_dec, n_tiles, R, err, errlen) != 0) return -1;

    /* logits back to the callers' rows, logit_chunk rows at a time */
    const int V = e->V;
    int item = 0, item_row = 0;
    for (int r0 = 0; r0 < R; r0 += e->logit_chunk) {
        const int nr = R - r0 < e->logit_chunk ? R - r0 : e->logit_chunk;
        if (r0 > 0 && linear(e, e->logits, e->xn + (size_t)r0 * e->d, nr, &e->lm_head, err, errlen))
            return -1;
        CUDA_CHECK(cudaMemcpyAsync(e->logits_h, e->logits, sizeof(float) * (size_t)nr * V,
                                   cudaMemcpyDeviceToHost, e->stream));
        CUDA_CHECK(cudaStreamSynchronize(e->stream));
        for (int r = 0; r < nr; r++) {
            while (item_row >= a->items[item].n_logits) { item++; item_row = 0; }
            memcpy(a->items[item].logits + (size_t)item_row * V, e->logits_h + (size_t)r * V,
                   sizeof(float) * (size_t)V);
            item_row++;
        }
    }
    if (!head_only && !e->head_at_end && a->h_out)
        CUDA_CHECK(cudaMemcpyAsync(a->h_out, e->x, x_bytes, cudaMemcpyDeviceToHost, e->stream));
    if (R == 0) CUDA_CHECK(cudaStreamSynchronize(e->stream));
    return 0;
}

static int cuda_forward(void *impl, const dol_forward_args *a, char *err, size_t errlen)
{
    cuda_engine *e = impl;
    if (e->deferred[0]) {
        dol_set_err(err, errlen, "%s", e->deferred);
        return -1;
    }
    CUDA_CHECK(cudaSetDevice(e->dev)); /* the scheduler thread is not the one that created us */
    int rc = forward_inner(e, a, err, errlen);
    if (rc != 0) (void)cudaStreamSynchronize(e->stream); /* nothing left reading meta_h */
    return rc;
}

const dol_backend_ops dol_cuda_backend = {
    .name = "cuda",
    .kv_no_f32 = true, /* F16 or Q8_0 KV cache */
    .create = cuda_create,
    .destroy = cuda_destroy,
    .forward = cuda_forward,
    .copy_block = cuda_copy_block,
    .weight_bytes = cuda_weight_bytes,
    .quant_stats = cuda_quant_stats,
    .kv_bytes_per_token = cuda_kv_bytes_per_token,
    .memory_info = cuda_memory_info,
    .create_range = cuda_create_range,
    .range_bytes = cuda_range_bytes,
    .device_budget = cuda_device_budget,
    .hidden_dev = cuda_hidden_dev,
};

int dol_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

bool dol_cuda_peer_enable(int a, int b)
{
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can) {
        (void)cudaGetLastError();
        return false;
    }
    int cur = 0;
    (void)cudaGetDevice(&cur);
    cudaError_t rc = cudaSetDevice(a);
    if (rc == cudaSuccess) rc = cudaDeviceEnablePeerAccess(b, 0);
    if (rc == cudaErrorPeerAccessAlreadyEnabled) rc = cudaSuccess;
    (void)cudaGetLastError();
    (void)cudaSetDevice(cur);
    return rc == cudaSuccess;
}

void *dol_cuda_host_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 64) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

void dol_cuda_host_free(void *p)
{
    if (p) (void)cudaFreeHost(p);
}

bool dol_cuda_device_check(char *why, size_t n)
{
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count < 1) {
        (void)cudaGetLastError();
        snprintf(why, n, "no CUDA device: cudaGetDeviceCount: %s (%s), %d devices",
                 cudaGetErrorString(rc), cudaGetErrorName(rc), count);
        return false;
    }
    int major = 0, minor = 0;
    rc = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    if (rc == cudaSuccess) rc = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, n, "device 0: cannot read its compute capability: %s (%s)", cudaGetErrorString(rc),
                 cudaGetErrorName(rc));
        return false;
    }
    if (major * 10 + minor < 75) {
        snprintf(why, n, "device 0 (compute capability %d.%d): below 7.5, the oldest this build supports",
                 major, minor);
        return false;
    }
    rc = cudaSetDevice(0);
    if (rc == cudaSuccess) rc = dol_cuda_kernels_loadable();
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, n, "device 0 (compute capability %d.%d): %s (%s)", major, minor, cudaGetErrorString(rc),
                 cudaGetErrorName(rc));
        return false;
    }
    snprintf(why, n, "device 0 (compute capability %d.%d)", major, minor);
    return true;
}

bool dol_cuda_device_usable(void)
{
    char why[256];
    if (dol_cuda_device_check(why, sizeof why)) return true;
    char q[300];
    dol_log(DOL_LOG_WARN, "cuda_unusable", "reason=%s", dol_log_quote(why, q, sizeof q));
    return false;
}

/* ---- NVML, loaded at run time ------------------------------------------------ */

typedef struct nvml_device_st *nvml_device;
typedef struct {
    unsigned int gpu, memory;
} nvml_utilization;

static struct {
    pthread_once_t once;
    pthread_mutex_t mu;
    bool ok, have_dev;
    int (*init)(void);
    int (*by_bus_id)(const char *, nvml_device *);
    int (*utilization)(nvml_device, nvml_utilization *);
    nvml_device dev;
} g_nvml = { PTHREAD_ONCE_INIT, PTHREAD_MUTEX_INITIALIZER, false, false, NULL, NULL, NULL, NULL };

static void nvml_load(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    /* POSIX: dlsym's result converts to a function pointer through its bytes */
    void *f1 = dlsym(lib, "nvmlInit_v2");
    void *f2 = dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    void *f3 = dlsym(lib, "nvmlDeviceGetUtilizationRates");
    memcpy(&g_nvml.init, &f1, sizeof f1);
    memcpy(&g_nvml.by_bus_id, &f2, sizeof f2);
    memcpy(&g_nvml.utilization, &f3, sizeof f3);
    if (!g_nvml.init || !g_nvml.by_bus_id || !g_nvml.utilization || g_nvml.init() != 0) {
        dlclose(lib);
        return;
    }
    g_nvml.ok = true; /* the library stays loaded for the life of the process */
}

int dol_cuda_utilization(int *percent)
{
    pthread_once(&g_nvml.once, nvml_load);
    if (!g_nvml.ok) return -1;
    int rc = -1;
    pthread_mutex_lock(&g_nvml.mu);
    if (!g_nvml.have_dev) {
        char bus[64];
        if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, g_cuda_dev) == cudaSuccess &&
            g_nvml.by_bus_id(bus, &g_nvml.dev) == 0)
            g_nvml.have_dev = true;
        else
            (void)cudaGetLastError();
    }
    nvml_utilization u;
    if (g_nvml.have_dev && g_nvml.utilization(g_nvml.dev, &u) == 0) {
        *percent = (int)u.gpu;
        rc = 0;
    }
    pthread_mutex_unlock(&g_nvml.mu);
    return rc;
}

#endif /* DOLPHIN_HAVE_CUDA */
