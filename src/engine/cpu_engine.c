/* src/engine/cpu_engine.c — the CPU backend (backend.h): the Llama forward
 * pass over a batch of sequences with a paged KV cache, in
 * float32 arithmetic. It is the reference the other backends are tested
 * against, so it is written to be read top to bottom: embedding, then per
 * layer RMSNorm -> Q/K/V -> RoPE -> KV-cache write -> attention -> output
 * projection + residual -> RMSNorm -> SwiGLU MLP + residual, then the final
 * norm and the logits of the rows that asked for them. */
#include "engine/backend.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "engine/cpu_amx.h"
#include "engine/cpu_r16.h"
#include "engine/cpu_i8.h"
#include "engine/cpu_kernels.h"
#include "engine/cpu_ops.h"
#include "engine/kv_blocks.h"
#include "dolphin/kv_q8.h"
#include "engine/nf4.h"
#include "engine/q8.h"
#include "engine/threadpool.h"
#include "engine/weights_cache.h"
#include "dolphin/log.h"

#define LOGIT_ROWS_CHUNK 64
#define HUGE_PAGE ((size_t)2 << 20)

/* A linear layer as the matmul reads it: an F32/F16 matrix (w), or, with
 * weights nf4, 4-bit codes and F16 block scales (q; w keeps the shape), or
 * with weights int8, Q8_0 quants and scales (q8m), or a GGUF block type
 * as the file holds it (blk: w is the model's tensor, whatever `weights`
 * says; docs/configuration.md). */
typedef struct {
    dol_tensor w;
    bool nf4, q8;
    bool blk;    /* w a GGUF block type, read in place (the model's data) */
    bool packed; /* w.data in the packed layout (cpu_kernels.h) */
    dol_nf4_matrix q;
    dol_q8_matrix q8m;
    dol_i8_r16 r16; /* r16.qs non-NULL: also in the interleaved layout (cpu_r16.h) */
} linear_w;

typedef struct {
    float *attn_norm, *ffn_norm;            /* f32 copies, [d] */
    linear_w q, k, v, o, gate, up, down;
} layer_w;

#define LAYER_LINEARS 7
/* The linear layers of a block, in a fixed order. */
static void layer_linears(layer_w *L, linear_w *ws[LAYER_LINEARS])
{
    ws[0] = &L->q, ws[1] = &L->k, ws[2] = &L->v, ws[3] = &L->o;
    ws[4] = &L->gate, ws[5] = &L->up, ws[6] = &L->down;
}

typedef struct {
    const dol_model *model;
    dol_model_config c;       /* c.n_layers: the blocks this instance holds */
    int l0;                   /* model index of block 0 here (layer placement) */
    bool has_embed, has_head; /* the embedding; the final norm + lm_head */
    int q_dim, kv_dim, ctx;
    dol_pool *pool;

    /* weights */
    layer_w *L;
    float *final_norm;
    linear_w lm_head;
    dol_tensor embed;
    void **owned;             /* buffers converted at load */
    int n_owned, cap_owned;
    size_t weight_bytes;
    size_t released_bytes;    /* checkpoint pages dropped after conversion */
    dol_wcache *wcache;       /* the prepared-weights cache file mapped, on a hit */
    dol_cpu_fast fast;        /* BF16x3 scratch (fast_prefill on an AMX CPU) */
    bool use_fast;
    dol_i8_act xa;            /* x quantized for the 8-bit-activation products */
    bool use_i8;              /* activations int8 (cpu_i8.h) */
    bool r16_amx;             /* the interleaved layout's prefill on the tile unit */
    dol_quant_stats qs;       /* linear layers: formats, sizes, quantization time */

    /* paged KV cache: block b holds, for every layer l and KV head h, the
     * head's K run then its V run, at kv_pool + b*block_bytes
     * + (l*n_kv_heads + h) * (run_k + run_v) (+ run_k for V) (kv_head). A
     * run holds block_size positions of one half in its element type (F32,
     * F16 or Q8_0: values then scales, kv_q8.h), rounded up to 16 bytes. K
     * is dims-major (element c of row r at c*block_size + r: the scores of
     * a block are then broadcast FMAs, see attn_head in cpu_kernels.h); V
     * is row-major (element i of row r at r*head_dim + i). So what one
     * head's attention reads of a block is one contiguous run (8 KiB for
     * head_dim 64 in F32): one stream for the prefetcher instead of two
     * runs 48 KiB apart. */
    int block_size, n_blocks;
    const dol_kv_blocks *kv;  /* the engine's block tables, during forward */
    void *kv_pool;
    dol_kv_dtype kv_k, kv_v;  /* element types of the halves (resolved) */
    size_t run_k, run_v;      /* bytes of one head's K / V run in a block */
    size_t block_bytes;       /* bytes of one block (every layer and head) */

    /* RoPE tables [ctx][head_dim/2] */
    float *rope_cos, *rope_sin;

    /* workspaces for max_T tokens */
    int max_T;
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2, *logits_ws;
    float *scores;            /* [n_threads][scores_stride] */
    size_t scores_stride;     /* ctx rounded up to whole blocks */
    const int32_t *tok_id, *tok_seq, *tok_pos;
    /* tokens tok_run[r] .. tok_run[r+1]-1 (r < n_runs) are consecutive
     * positions of one sequence within one KV block ([max_T + 1]) */
    int *tok_run;
    int n_runs;
    bool decode_batch;        /* every token of the batch is its own sequence */
} cpu_engine;

/* ---- weights ------------------------------------------------------------- */

static void *own(cpu_engine *e, size_t bytes)
{
    if (e->n_owned == e->cap_owned) {
        int cap = e->cap_owned ? e->cap_owned * 2 : 64;
        void **o = realloc(e->owned, sizeof(void *) * (size_t)cap);
        if (!o) return NULL;
        e->owned = o;
        e->cap_owned = cap;
    }
    void *p = NULL;
    /* Weight buffers of 2 MiB and more: 2 MiB-aligned, but not offered for
     * transparent huge pages: with the checkpoint filling the page cache,
     * faulting them in as huge pages compacts memory synchronously and made
     * the load 2-4 x slower and erratic, for 3-6 % of decode speed
     * (docs/performance.md, "Memory: alignment and huge pages") */
    size_t align = bytes >= HUGE_PAGE ? HUGE_PAGE : 64;
    if (posix_memalign(&p, align, bytes ? bytes : 64) != 0) return NULL;
    e->owned[e->n_owned++] = p;
    return p;
}

static float *norm_f32(cpu_engine *e, const dol_tensor *t)
{
    float *p = own(e, sizeof(float) * (size_t)t->cols);
    if (p) dol_cpu_to_f32(p, t->data, t->dtype, t->cols);
    return p;
}

/* The dtype a linear layer is packed in under format fmt (F32/F16/BF16
 * formats; AUTO keeps the checkpoint's). */
static dol_dtype packed_dtype(dol_weight_format fmt, const dol_tensor *src)
{
    if (fmt == DOL_WEIGHTS_F32) return DOL_DTYPE_F32;
    if (fmt == DOL_WEIGHTS_F16) return DOL_DTYPE_F16;
    return src->dtype; /* AUTO: F32, F16 and BF16 all have SIMD kernels */
}

/* The arrays prep_linear makes for src under fmt, in order (sizes in
 * bytes): NF4 codes + scales, Q8_0 quants + scales, or one packed matrix.
 * Returns their count. The prepared-weights cache holds these. */
static int linear_arrays(dol_weight_format fmt, const dol_tensor *src, size_t size[2])
{
    if (dol_dtype_is_block(src->dtype)) return 0;   /* read in place: nothing to cache */
    if (fmt == DOL_WEIGHTS_NF4) {
        size[0] = dol_nf4_codes_bytes(src->rows, src->cols);
        size[1] = dol_nf4_scales_bytes(src->rows, src->cols);
        return 2;
    }
    if (fmt == DOL_WEIGHTS_INT8) {
        size[0] = dol_q8_quants_bytes(src->rows, src->cols);
        size[1] = dol_q8_scales_bytes(src->rows, src->cols);
        return 2;
    }
    size[0] = dol_cpu_packed_elems((int)src->rows, (int)src->cols) *
              dol_dtype_size(packed_dtype(fmt, src));
    return 1;
}

/* The arrays of a prepared layer, in linear_arrays' order. */
static int linear_ptrs(const linear_w *w, void *ptr[2])
{
    if (w->blk) return 0;
    if (w->nf4) {
        ptr[0] = w->q.codes;
        ptr[1] = w->q.scales;
        return 2;
    }
    if (w->q8) {
        ptr[0] = w->q8m.quants;
        ptr[1] = w->q8m.scales;
        return 2;
    }
    ptr[0] = (void *)w->w.data;
    return 1;
}

/* A linear layer in the format the matmul reads: F32, F16 or BF16 in the
 * packed layout of cpu_kernels.h (converted from the checkpoint's dtype when
 * the format asks for another), or NF4, quantized; both on the engine's
 * thread pool. With `cached` (the arrays of linear_arrays, from the
 * prepared-weights cache) nothing is converted: the layer points at them.
 * `what` names the tensor in errors. Keeps the byte counts of
 * dol_quant_stats. */
static int prep_linear(cpu_engine *e, dol_weight_format fmt, const dol_tensor *src,
                       linear_w *dst, void *const *cached, const char *what, char *err,
                       size_t errlen)
{
    int64_t n = src->rows * src->cols;
    dst->w = *src;
    e->qs.linear_f16_bytes += (size_t)n * 2;
    if (dol_dtype_is_block(src->dtype)) {
        dst->blk = true;
        e->qs.linear_bytes += dol_tensor_bytes(src);
        e->weight_bytes += dol_tensor_bytes(src);
        return 0;
    }
    if (fmt == DOL_WEIGHTS_NF4) {
        size_t codes = dol_nf4_codes_bytes(src->rows, src->cols);
        size_t scales = dol_nf4_scales_bytes(src->rows, src->cols);
        if (dol_nf4_check_cols(src->cols, what, err, errlen) != 0) return -1;
        dst->nf4 = true;
        dst->q.codes = cached ? cached[0] : own(e, codes);
        dst->q.scales = cached ? cached[1] : own(e, scales);
        if (!dst->q.codes || !dst->q.scales) goto oom;
        double t0 = dol_now_ms();
        if (cached) {
            dst->q.rows = src->rows;
            dst->q.cols = src->cols;
            dst->q.blocks_per_row = (src->cols + DOL_NF4_BLOCK - 1) / DOL_NF4_BLOCK;
        } else if (dol_nf4_quantize(e->pool, src, &dst->q, what, err, errlen) != 0) {
            return -1;
        }
        e->qs.quant_seconds += (dol_now_ms() - t0) / 1000.0;
        e->qs.n_quantized++;
        e->qs.quant_bytes_before += (size_t)n * dol_dtype_size(src->dtype);
        e->qs.quant_bytes_after += codes + scales;
        e->qs.linear_bytes += codes + scales;
        e->weight_bytes += codes + scales;
        return 0;
    }
    if (fmt == DOL_WEIGHTS_INT8) {
        size_t quants = dol_q8_quants_bytes(src->rows, src->cols);
        size_t scales = dol_q8_scales_bytes(src->rows, src->cols);
        dst->q8 = true;
        dst->q8m.quants = cached ? cached[0] : own(e, quants);
        dst->q8m.scales = cached ? cached[1] : own(e, scales);
        if (!dst->q8m.quants || !dst->q8m.scales) goto oom;
        double t0 = dol_now_ms();
        if (cached) {
            dst->q8m.rows = src->rows;
            dst->q8m.cols = src->cols;
            dst->q8m.blocks_per_row = (src->cols + DOL_Q8_BLOCK - 1) / DOL_Q8_BLOCK;
        } else if (dol_q8_quantize(e->pool, src, &dst->q8m, what, err, errlen) != 0) {
            return -1;
        }
        e->qs.quant_seconds += (dol_now_ms() - t0) / 1000.0;
        e->qs.n_quantized++;
        e->qs.quant_bytes_before += (size_t)n * dol_dtype_size(src->dtype);
        e->qs.quant_bytes_after += quants + scales;
        e->qs.linear_bytes += quants + scales;
        e->weight_bytes += quants + scales;
        return 0;
    }
    dol_dtype want = packed_dtype(fmt, src);
    dst->w.dtype = want;
    e->qs.linear_bytes += (size_t)n * dol_dtype_size(want);
    e->weight_bytes += (size_t)n * dol_dtype_size(want);
    /* Always a packed copy (cpu_kernels.h): one sequential stream per
     * register tile, whatever the checkpoint's dtype. */
    size_t elems = dol_cpu_packed_elems((int)src->rows, (int)src->cols);
    void *buf = cached ? cached[0] : own(e, elems * dol_dtype_size(want));
    if (!buf) goto oom;
    if (!cached &&
        dol_cpu_pack(e->pool, buf, want, src->data, src->dtype, (int)src->rows, (int)src->cols) != 0) {
        dol_set_err(err, errlen, "engine: %s: cannot hold %s weights as %s", what,
                    dol_dtype_name(src->dtype), dol_dtype_name(want));
        return -1;
    }
    dst->w.data = buf;
    dst->packed = true;
    return 0;
oom:
    dol_set_err(err, errlen, "engine: out of memory while preparing %s", what);
    return -1;
}

/* NF4, Q8_0 or a GGUF block type: the layers the 8-bit-activation products serve. */
static bool is_quantized(const linear_w *w) { return w->nf4 || w->q8 || w->blk; }

/* A linear layer as the fused products of cpu_ops.h read it (with the
 * BF16x3 scratch when fast_prefill is on). */
static dol_cpu_weight weight_of(cpu_engine *e, const linear_w *w)
{
    return (dol_cpu_weight){ w->w.data, w->w.dtype, w->nf4 ? &w->q : NULL, (int)w->w.rows,
                             (int)w->w.cols, w->packed, w->q8 ? &w->q8m : NULL,
                             e->use_fast ? &e->fast : NULL,
                             w->blk ? dol_dtype_row_bytes(w->w.dtype, w->w.cols) : 0,
                             e->use_i8 && is_quantized(w) ? &e->xa : NULL,
                             w->r16.qs ? &w->r16 : NULL, e->r16_amx };
}

/* One tensor of the load plan: a norm (to f32) or a linear layer. */
typedef struct {
    const dol_tensor *src;
    float **norm;       /* a norm: where its f32 copy goes */
    linear_w *lin;      /* a linear layer: prep_linear's destination */
    dol_weight_format fmt;
    char what[96];
} load_item;

static size_t tensor_bytes(const dol_tensor *t)
{
    return dol_tensor_bytes(t);
}

/* ---- the prepared-weights cache (weights_cache.h) ------------------------ */

/* A fingerprint of the conversion code: the XXH3 of what prep_linear makes
 * of a fixed 9 x 128 probe matrix of dtype dt under fmt, so that a build
 * whose packing or quantizers write other bytes never reads an older
 * build's cache. 0 when the probe cannot be converted. */
static uint64_t conversion_probe(cpu_engine *e, dol_weight_format fmt, dol_dtype dt)
{
    enum { R = 9, C = 128 };
    static float f[R * C];
    static uint16_t h[R * C];
    uint32_t s = 0x9e3779b9u;
    for (int i = 0; i < R * C; i++) {
        s = s * 1664525u + 1013904223u;
        f[i] = (float)((int32_t)(s >> 8) - (1 << 23)) / (float)(1 << 23);
        h[i] = dt == DOL_DTYPE_BF16 ? dol_f32_to_bf16(f[i]) : dol_f32_to_f16(f[i]);
    }
    dol_tensor t = { .rows = R, .cols = C, .dtype = dt,
                     .data = dt == DOL_DTYPE_F32 ? (const void *)f : (const void *)h };
    cpu_engine scratch = { .pool = e->pool };
    linear_w w = {0};
    char err[DOL_ERR_LEN];
    uint64_t fp = 0;
    if (prep_linear(&scratch, fmt, &t, &w, NULL, "probe", err, sizeof err) == 0) {
        size_t sz[2];
        void *ptr[2];
        int k = linear_arrays(fmt, &t, sz);
        if (linear_ptrs(&w, ptr) == k)
            for (int j = 0; j < k; j++) fp ^= XXH3_64bits_withSeed(ptr[j], sz[j], (uint64_t)j);
    }
    for (int i = 0; i < scratch.n_owned; i++) free(scratch.owned[i]);
    free(scratch.owned);
    return fp;
}

/* What decides the bytes of the cached arrays besides the checkpoint: the
 * layouts (one packed layout serves every kernel set, cpu_kernels.h), the
 * formats, the layer range, and the conversion code itself (its output for
 * a probe matrix in the checkpoint's dtype). */
static void cache_layout(cpu_engine *e, const dol_engine_params *p, dol_dtype dt,
                         dol_weight_format head_fmt, char *buf, size_t n)
{
    snprintf(buf, n,
             "cpu pack_rows=%d pack_k=%d nf4_block=%d q8_block=%d weights=%d "
             "quantize_lm_head=%d layers=%d+%d embed=%d head=%d probe=%016llx.%016llx",
             DOL_PACK_ROWS, DOL_PACK_K, DOL_NF4_BLOCK, DOL_Q8_BLOCK, (int)p->weights,
             p->quantize_lm_head ? 1 : 0, e->l0, e->c.n_layers, e->has_embed ? 1 : 0,
             e->has_head ? 1 : 0, (unsigned long long)conversion_probe(e, p->weights, dt),
             (unsigned long long)conversion_probe(e, head_fmt, dt));
}

typedef struct {
    bool on;
    char path[4352];
    uint8_t key[32];
    dol_wcache_array *arr;  /* the arrays of every linear layer, in plan order */
    int n_arr;
    bool found_bad;         /* a file was there but unusable: "rebuilt" */
} cache_ctx;

/* Look the cache up: true on a hit (cc->arr point into the mapping, kept
 * in e->wcache). A file that is there but unusable is named in one warning
 * and removed, to be written again after the conversion. */
static bool cache_lookup(cpu_engine *e, const dol_model *model, const dol_engine_params *p,
                         dol_dtype dt, dol_weight_format head_fmt, cache_ctx *cc)
{
    char layout[320], err[DOL_ERR_LEN];
    cache_layout(e, p, dt, head_fmt, layout, sizeof layout);
    if (dol_wcache_key(model, layout, cc->key, err, sizeof err) != 0) {
        char q[DOL_ERR_LEN + 16];
        dol_log(DOL_LOG_WARN, "weights_cache_off", "dir=%s reason=%s", p->weights_cache_dir,
                dol_log_quote(err, q, sizeof q));
        cc->on = false;
        return false;
    }
    dol_wcache_path(p->weights_cache_dir, model->name, cc->key, cc->path, sizeof cc->path);
    const double t0 = dol_now_ms();
    int rc = dol_wcache_open(cc->path, cc->key, cc->arr, cc->n_arr, e->pool, &e->wcache, err,
                             sizeof err);
    if (rc == 0) {
        dol_log(DOL_LOG_INFO, "weights_cache", "result=hit path=%s bytes=%zu seconds=%.3f",
                cc->path, dol_wcache_bytes(e->wcache), (dol_now_ms() - t0) / 1000.0);
        return true;
    }
    if (rc < 0) {
        char q[DOL_ERR_LEN + 16];
        dol_log(DOL_LOG_WARN, "weights_cache_invalid", "path=%s reason=%s action=rebuild",
                cc->path, dol_log_quote(err, q, sizeof q));
        (void)unlink(cc->path);
        cc->found_bad = true;
    }
    return false;
}

/* After a conversion: write the arrays to the cache file (a failure is a
 * warning; the engine runs from its own copies either way). */
static void cache_store(cpu_engine *e, cache_ctx *cc)
{
    char err[DOL_ERR_LEN];
    size_t bytes = 0;
    const double t0 = dol_now_ms();
    if (dol_wcache_write(cc->path, cc->key, cc->arr, cc->n_arr, e->pool, &bytes, err,
                         sizeof err) != 0) {
        char q[DOL_ERR_LEN + 16];
        dol_log(DOL_LOG_WARN, "weights_cache_write_failed", "path=%s reason=%s", cc->path,
                dol_log_quote(err, q, sizeof q));
        return;
    }
    dol_log(DOL_LOG_INFO, "weights_cache", "result=%s path=%s bytes=%zu seconds=%.3f",
            cc->found_bad ? "rebuilt" : "miss", cc->path, bytes, (dol_now_ms() - t0) / 1000.0);
}

/* Convert every weight in checkpoint order (layer by layer), each tensor's
 * conversion spread over the pool (dol_cpu_pack, dol_nf4_quantize), the
 * next tensor's pages asked for before this one starts (dol_model_prefetch)
 * and this one's released after (dol_model_release). The embedding stays
 * in the mapping (read row by row). A load over a second logs its progress
 * about once a second. */
static int load_weights(cpu_engine *e, const dol_model *model, const dol_engine_params *p,
                        char *err, size_t errlen)
{
    static const char *const lin_names[7] = { "self_attn.q_proj", "self_attn.k_proj",
                                              "self_attn.v_proj", "self_attn.o_proj",
                                              "mlp.gate_proj",    "mlp.up_proj",
                                              "mlp.down_proj" };
    const int n_items = e->c.n_layers * 9 + 2;
    load_item *it = calloc((size_t)n_items, sizeof *it);
    if (!it) {
        dol_set_err(err, errlen, "engine: out of memory while preparing weights");
        return -1;
    }
    int n = 0;
    for (int l = 0; l < e->c.n_layers; l++) {
        const dol_layer_weights *w = &model->layers[e->l0 + l];
        layer_w *lw = &e->L[l];
        const dol_tensor *src[7] = { &w->q, &w->k, &w->v, &w->o, &w->gate, &w->up, &w->down };
        linear_w *dst[7] = { &lw->q, &lw->k, &lw->v, &lw->o, &lw->gate, &lw->up, &lw->down };
        it[n++] = (load_item){ .src = &w->attn_norm, .norm = &lw->attn_norm };
        for (int i = 0; i < 7; i++) {
            if (i == 4) it[n++] = (load_item){ .src = &w->ffn_norm, .norm = &lw->ffn_norm };
            it[n] = (load_item){ .src = src[i], .lin = dst[i], .fmt = p->weights };
            snprintf(it[n].what, sizeof it[n].what, "model.layers.%d.%s.weight", e->l0 + l,
                     lin_names[i]);
            n++;
        }
    }
    if (e->has_head) {   /* the range holding the final norm and lm_head */
        it[n++] = (load_item){ .src = &model->final_norm, .norm = &e->final_norm };
        dol_weight_format head_fmt = p->weights;
        if ((head_fmt == DOL_WEIGHTS_NF4 || head_fmt == DOL_WEIGHTS_INT8) && !p->quantize_lm_head)
            head_fmt = DOL_WEIGHTS_AUTO;
        it[n] = (load_item){ .src = &model->lm_head, .lin = &e->lm_head, .fmt = head_fmt };
        snprintf(it[n].what, sizeof it[n].what, "lm_head.weight");
        n++;
    }

    size_t total = 0, done = 0;
    for (int i = 0; i < n; i++) total += tensor_bytes(it[i].src);
    const double t0 = dol_now_ms();
    double last_log = t0;
    int rc = 0;

    /* the prepared-weights cache: on a hit the linear layers point into
     * its mapping and only the norms are read from the checkpoint */
    cache_ctx cc = { .on = p->weights_cache_dir && p->weights_cache_dir[0] };
    bool hit = false;
    if (cc.on) {
        cc.arr = calloc((size_t)n * 2, sizeof *cc.arr);
        if (!cc.arr) {
            free(it);
            dol_set_err(err, errlen, "engine: out of memory while preparing weights");
            return -1;
        }
        for (int i = 0; i < n; i++) {
            if (!it[i].lin) continue;
            size_t sz[2];
            int k = linear_arrays(it[i].fmt, it[i].src, sz);
            for (int j = 0; j < k; j++) cc.arr[cc.n_arr++].size = sz[j];
        }
        dol_dtype dt = DOL_DTYPE_F32;
        dol_weight_format head_fmt = p->weights;
        for (int i = n - 1; i >= 0; i--)
            if (it[i].lin) {
                if (!dol_dtype_is_block(it[i].src->dtype)) dt = it[i].src->dtype;
                if (e->has_head && it[i].lin == &e->lm_head) head_fmt = it[i].fmt;
            }
        if (cc.n_arr == 0) {   /* every linear layer read in place: nothing to prepare */
            dol_log(DOL_LOG_INFO, "weights_cache", "result=not_needed reason=block_types_in_place");
            cc.on = false;
        } else {
            hit = cache_lookup(e, model, p, dt, head_fmt, &cc);
        }
    }

    int ai = 0;   /* next array of cc.arr */
    if (n > 0 && !(hit && it[0].lin)) dol_model_prefetch(model, it[0].src);
    for (int i = 0; i < n && rc == 0; i++) {
        if (i + 1 < n && !(hit && it[i + 1].lin)) dol_model_prefetch(model, it[i + 1].src);
        if (it[i].norm) {
            if (!(*it[i].norm = norm_f32(e, it[i].src))) {
                dol_set_err(err, errlen, "engine: out of memory while preparing weights");
                rc = -1;
            }
        } else if (hit) {
            void *from[2] = { cc.arr[ai].ptr, ai + 1 < cc.n_arr ? cc.arr[ai + 1].ptr : NULL };
            size_t sz[2];
            ai += linear_arrays(it[i].fmt, it[i].src, sz);
            rc = prep_linear(e, it[i].fmt, it[i].src, it[i].lin, from, it[i].what, err, errlen);
            done += tensor_bytes(it[i].src);
            continue;   /* the checkpoint's pages of this one were never read */
        } else {
            rc = prep_linear(e, it[i].fmt, it[i].src, it[i].lin, NULL, it[i].what, err, errlen);
            if (rc == 0 && cc.on) {
                void *ptr[2];
                int k = linear_ptrs(it[i].lin, ptr);
                for (int j = 0; j < k; j++) cc.arr[ai++].ptr = ptr[j];
            }
        }
        /* the embedding is read in place: a tied lm_head leaves its pages
         * to fault back in row by row; so are the block types */
        if (!(it[i].lin && it[i].lin->blk)) e->released_bytes += dol_model_release(model, it[i].src);
        done += tensor_bytes(it[i].src);
        const double now = dol_now_ms();
        if (now - last_log >= 1000.0 && i + 1 < n) {
            dol_log(DOL_LOG_INFO, "weights_loading", "bytes_done=%zu bytes_total=%zu mb_s=%.0f",
                    done, total, done / 1e6 / ((now - t0) / 1000.0));
            last_log = now;
        }
    }
    if (rc == 0 && cc.on && !hit) cache_store(e, &cc);
    free(cc.arr);
    if (rc == 0) {
        const double s = (dol_now_ms() - t0) / 1000.0;
        dol_log(DOL_LOG_INFO, "weights_prepared",
                "bytes=%zu held_bytes=%zu released_bytes=%zu seconds=%.3f mb_s=%.0f", total,
                e->weight_bytes, e->released_bytes, s, s > 0 ? total / 1e6 / s : 0.0);
    }
    free(it);
    return rc;
}

/* Bytes the kernel reports as available (MemAvailable, /proc/meminfo), or
 * 0 when unknown. */
static size_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (size_t)kb * 1024;
}

/* Bytes of one head's run of one half in a block: block_size rows of type
 * t, rounded up to 16 bytes (so the next run's F32 or F16 elements stay
 * aligned); 0 when t cannot hold heads of head_dim values. */
static size_t kv_run_bytes(dol_kv_dtype t, int head_dim, int bs)
{
    const size_t b = dol_kv_head_row_bytes(t, head_dim) * (size_t)bs;
    return (b + 15) & ~(size_t)15;
}

/* The default pool, once the weights are held: kv_memory_fraction of the
 * memory still available, at most what max_seqs full contexts use, never
 * less than one full context (docs/configuration.md, kv_cache_memory_fraction).
 * Weights mapped from the prepared-weights cache are page cache, which
 * MemAvailable counts as free: they are taken off, or a full pool would
 * push the weights out of memory. Without /proc/meminfo: max_seqs contexts
 * capped at 1 GiB. */
static int64_t default_kv_blocks(const cpu_engine *e, const dol_engine_params *p, int ctx, int bs)
{
    const size_t per_token = e->block_bytes / (size_t)bs;
    int64_t tokens = (int64_t)p->max_seqs * ctx;
    size_t avail = mem_available();
    const size_t mapped = dol_wcache_bytes(e->wcache);
    if (avail) avail = avail > mapped ? avail - mapped : 1;
    const double frac = p->kv_memory_fraction > 0 ? p->kv_memory_fraction : 0.9;
    int64_t cap = avail ? (int64_t)(frac * (double)avail / (double)per_token)
                        : ((int64_t)1 << 30) / (int64_t)per_token;
    if (tokens > cap) tokens = cap;
    if (tokens < ctx) tokens = ctx;
    int64_t blocks = (tokens + bs - 1) / bs;
    if (blocks > INT32_MAX / 2) blocks = INT32_MAX / 2;
    return blocks < 1 ? 1 : blocks;
}

/* ---- create / free ------------------------------------------------------- */

/* Zeroed n * sz bytes on a 64-byte boundary (calloc gives 16 for large
 * blocks): the activations are cut between threads in runs of 16 floats,
 * and a run that straddled a cache line would share it with the neighbour
 * thread's run. */
static void *xcalloc(size_t n, size_t sz, int *fail)
{
    void *p = NULL;
    if (n == 0) n = 1;
    if (sz == 0 || n > SIZE_MAX / sz) {
        *fail = 1;
        return NULL;
    }
    const size_t bytes = n * sz;
    if (posix_memalign(&p, 64, bytes) != 0) {
        *fail = 1;
        return NULL;
    }
    memset(p, 0, bytes);
    return p;
}

static void cpu_destroy(void *impl);

/* Whether any linear layer of this instance is quantized (NF4, Q8_0 or a
 * GGUF block type): the layers the 8-bit-activation products serve. */
static bool any_quantized(const cpu_engine *e)
{
    for (int l = 0; l < e->c.n_layers; l++) {
        linear_w *ws[LAYER_LINEARS];
        layer_linears(&e->L[l], ws);
        for (int i = 0; i < LAYER_LINEARS; i++)
            if (is_quantized(ws[i])) return true;
    }
    return e->has_head && is_quantized(&e->lm_head);
}

/* The activations setting resolved (dol_activations): int8 when asked,
 * the weights are quantized and the CPU has an int8 kernel set; one log
 * line says which path runs and why. -1 when out of memory. */
static int choose_activations(cpu_engine *e, const dol_engine_params *p)
{
    const bool quantized = any_quantized(e);
    const dol_cpu_i8 *s = dol_cpu_i8_get();
    if (p->activations == DOL_ACT_F32 || !quantized || !s) {
        const char *why = p->activations == DOL_ACT_F32 ? "asked"
                          : !quantized                  ? "weights_not_quantized"
                                                        : "no_int8_kernels";
        const bool warn = p->activations == DOL_ACT_INT8 && quantized;
        dol_log(warn ? DOL_LOG_WARN : DOL_LOG_INFO, "cpu_activations", "activations=f32 reason=%s%s", why,
                warn ? " asked=int8" : "");
        return 0;
    }
    int kmax = e->c.hidden_size > e->q_dim ? e->c.hidden_size : e->q_dim;
    if (e->c.intermediate_size > kmax) kmax = e->c.intermediate_size;
    if (dol_cpu_i8_act_reserve(&e->xa, e->max_T, kmax) != 0) return -1;
    e->use_i8 = true;
    dol_log(DOL_LOG_INFO, "cpu_activations", "activations=int8 kernels=%s block=%d reason=%s", s->name,
            DOL_I8_BLOCK, p->activations == DOL_ACT_AUTO ? "auto" : "asked");
    return 0;
}

/* ---- the interleaved layout (cpu_r16.h) ---------------------------------- */

/* Whether the quantized layers are repacked into the interleaved layout:
 * by default wherever 8-bit activations run (every int8 set; with AMX-INT8
 * and the avx512vnni set its prefill runs on the tile unit, with decode's
 * bits); DOLPHIN_CPU_R16=0 turns it off, `vnni` keeps it off the tile
 * unit. */
static bool r16_wanted(const cpu_engine *e)
{
    if (!e->use_i8 || !dol_i8_r16_available()) return false;
    const char *env = getenv("DOLPHIN_CPU_R16");
    return !(env && strcmp(env, "0") == 0);
}

static dol_i8_weight i8_weight_of(const linear_w *w)
{
    const dol_dtype t = w->nf4 ? DOL_I8_NF4 : w->q8 ? DOL_I8_Q8 : w->w.dtype;
    return (dol_i8_weight){ t, w->w.data, w->blk ? dol_dtype_row_bytes(w->w.dtype, w->w.cols) : 0,
                            w->nf4 ? &w->q : NULL, w->q8 ? &w->q8m : NULL, (int)w->w.rows, (int)w->w.cols };
}

typedef struct {
    dol_i8_r16 *R;
    const dol_i8_weight *W;
    int per;
} r16_job;

static void r16_task(void *ctx, int task, int worker)
{
    (void)worker;
    const r16_job *j = ctx;
    const int g0 = task * j->per, g1 = g0 + j->per < j->R->groups ? g0 + j->per : j->R->groups;
    dol_i8_r16_fill(j->R, j->W, g0, g1);
}

/* Free an owned buffer of `bytes` before the engine ends (its slot left
 * NULL); the bytes freed. */
static size_t disown(cpu_engine *e, void *p, size_t bytes)
{
    for (int i = 0; i < e->n_owned; i++)
        if (e->owned[i] == p) {
            free(p);
            e->owned[i] = NULL;
            return bytes;
        }
    return 0;
}

/* Drop the whole pages of [p, p + bytes) of the prepared-weights cache's
 * read-only mapping (refetched from the file if ever read again);
 * the bytes dropped. */
static size_t drop_pages(void *p, size_t bytes)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1), b = ((uintptr_t)p + bytes) & ~(pg - 1);
    return b > a && madvise((void *)a, b - a, MADV_DONTNEED) == 0 ? (size_t)(b - a) : 0;
}

/* Repack w if the layout takes it, over the pool, then drop its own arrays
 * (the checkpoint's pages of a GGUF tensor, the converted NF4 / int8
 * buffers): the products read only the layout from then on. Adds to *bytes
 * and *released; 1 when repacked, 0 when the layout does not take w, -1
 * when out of memory. */
static int repack_linear(cpu_engine *e, linear_w *w, size_t *bytes, size_t *released)
{
    const dol_i8_weight W = i8_weight_of(w);
    if (!is_quantized(w) || !dol_i8_r16_takes(W.t, W.K)) return 0;
    if (dol_i8_r16_alloc(&w->r16, &W) != 0) return -1;
    const int threads = dol_pool_threads(e->pool);
    r16_job j = { &w->r16, &W, (w->r16.groups + 4 * threads - 1) / (4 * threads) };
    dol_pool_run(e->pool, r16_task, &j, (w->r16.groups + j.per - 1) / j.per);
    *bytes += dol_i8_r16_bytes(&w->r16);
    if (w->blk) { /* (a tied lm_head is the embedding, still read in place) */
        if (w->w.data != e->model->embed.data) *released += dol_model_release(e->model, &w->w);
        return 1;
    }
    void *arr[2] = { w->nf4 ? (void *)w->q.codes : (void *)w->q8m.quants,
                     w->nf4 ? (void *)w->q.scales : (void *)w->q8m.scales };
    const size_t len[2] = {
        w->nf4 ? dol_nf4_codes_bytes(w->w.rows, w->w.cols) : dol_q8_quants_bytes(w->w.rows, w->w.cols),
        w->nf4 ? dol_nf4_scales_bytes(w->w.rows, w->w.cols) : dol_q8_scales_bytes(w->w.rows, w->w.cols) };
    for (int a = 0; a < 2; a++) *released += e->wcache ? drop_pages(arr[a], len[a]) : disown(e, arr[a], len[a]);
    return 1;
}

/* Every quantized layer the layout takes, repacked; one log line. -1 when
 * out of memory. */
static int prepare_r16(cpu_engine *e)
{
    if (!r16_wanted(e)) return 0;
    const char *env = getenv("DOLPHIN_CPU_R16");
    const dol_cpu_i8 *set = dol_cpu_i8_get();
    e->r16_amx = strcmp(set->name, "avx512vnni") == 0 && dol_amx_i8_available() && !(env && strcmp(env, "vnni") == 0);
    const double t0 = dol_now_ms();
    size_t bytes = 0, released = 0;
    int n = 0, r = 0;
    for (int l = 0; l < e->c.n_layers && r >= 0; l++) {
        linear_w *ws[LAYER_LINEARS];
        layer_linears(&e->L[l], ws);
        for (int i = 0; i < LAYER_LINEARS && r >= 0; i++) n += r = repack_linear(e, ws[i], &bytes, &released);
    }
    if (r >= 0 && e->has_head) n += r = repack_linear(e, &e->lm_head, &bytes, &released);
    if (r < 0) return -1;
    e->released_bytes += released;
    dol_log(DOL_LOG_INFO, "cpu_int8_layout",
            "layout=interleaved16 matrices=%d bytes=%zu released_bytes=%zu prefill=%s seconds=%.3f", n, bytes,
            released, e->r16_amx ? "amx_int8" : set->name, (dol_now_ms() - t0) / 1000.0);
    return 0;
}

static const char *cpu_activations(void *impl) { return ((cpu_engine *)impl)->use_i8 ? "int8" : "f32"; }

static int cpu_create_range(const dol_model *model, const dol_engine_params *p, int ctx, int bs,
                            const dol_layer_range *r, int *n_blocks, void **out, char *err,
                            size_t errlen)
{
    cpu_engine *e = calloc(1, sizeof *e);
    if (!e) { dol_set_err(err, errlen, "engine: out of memory"); return -1; }
    e->model = model;
    e->c = model->cfg;
    e->c.n_layers = r->l1 - r->l0;
    e->l0 = r->l0;
    e->has_embed = r->embed;
    e->has_head = r->head;
    const dol_model_config *c = &e->c;
    e->q_dim = c->n_heads * c->head_dim;
    e->kv_dim = c->n_kv_heads * c->head_dim;
    e->ctx = ctx;
    e->block_size = bs;
    int threads = p->n_threads > 0 ? p->n_threads : 1;
    e->max_T = p->max_batch_tokens;

    e->pool = dol_pool_new(threads);
    if (!e->pool) { dol_set_err(err, errlen, "engine: cannot start %d threads", threads); goto fail; }

    /* weights: norms as f32, linear layers as p->weights says (lm_head
     * keeps the checkpoint's precision under nf4 / int8 unless quantize_lm_head),
     * streamed: one tensor at a time, the next one's pages read ahead
     * meanwhile, each one's checkpoint pages dropped once it is converted,
     * so the weights are held once and the load peak is one copy plus a
     * tensor */
    e->L = calloc((size_t)c->n_layers, sizeof *e->L);
    if (!e->L) goto oom;
    if (load_weights(e, model, p, err, errlen) != 0) goto fail;
    if (e->has_embed) {
        e->embed = model->embed; /* read row by row in its own dtype */
        e->weight_bytes += dol_tensor_bytes(&model->embed);
    }
    /* the arithmetic, and the interleaved copies, before the pool is sized
     * from what memory they leave */
    if (choose_activations(e, p) != 0) goto oom;
    if (prepare_r16(e) != 0) goto oom;

    /* KV pool: as asked, else sized from the memory left after the weights */
    e->kv_k = p->kv_dtype_k;
    e->kv_v = p->kv_dtype_v;
    e->run_k = kv_run_bytes(e->kv_k, c->head_dim, bs);
    e->run_v = kv_run_bytes(e->kv_v, c->head_dim, bs);
    if (e->run_k == 0 || e->run_v == 0) {
        dol_set_err(err, errlen, "kv_cache_dtype: k=%s v=%s cannot hold heads of %d values",
                    dol_kv_dtype_str(e->kv_k), dol_kv_dtype_str(e->kv_v), c->head_dim);
        goto fail;
    }
    e->block_bytes = (size_t)c->n_layers * (size_t)c->n_kv_heads * (e->run_k + e->run_v);
    int64_t blocks = *n_blocks;
    if (blocks <= 0) blocks = default_kv_blocks(e, p, ctx, bs);
    size_t kv_bytes = (size_t)blocks * e->block_bytes;
    if (posix_memalign(&e->kv_pool, HUGE_PAGE, kv_bytes) != 0) {
        dol_set_err(err, errlen, "kv_cache: cannot allocate %zu bytes for %lld blocks of %d tokens",
                    kv_bytes, (long long)blocks, bs);
        e->kv_pool = NULL;
        goto fail;
    }
    e->n_blocks = (int)blocks;
#ifdef MADV_HUGEPAGE
    /* Attention reads each head's K and V of a block as one 8 KiB run
     * (head_dim 64), the runs of a sequence spread over the pool: on 2 MiB
     * pages (where the kernel has them) they stop costing a TLB miss each
     * (docs/performance.md). */
    (void)madvise(e->kv_pool, kv_bytes & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif

    /* RoPE tables, angles in double: theta^(-2i/head_dim) * pos / scale
     * (linear RoPE scaling: scale 1 leaves the angles as they were, bit for bit) */
    const double rope_scale = c->rope_scale > 0 ? (double)c->rope_scale : 1.0;
    int half = c->head_dim / 2;
    e->rope_cos = malloc(sizeof(float) * (size_t)ctx * half);
    e->rope_sin = malloc(sizeof(float) * (size_t)ctx * half);
    if (!e->rope_cos || !e->rope_sin) goto oom;
    for (int pos = 0; pos < ctx; pos++)
        for (int i = 0; i < half; i++) {
            double inv = pow((double)c->rope_theta, -2.0 * i / c->head_dim);
            double a = pos / rope_scale * inv;
            e->rope_cos[(size_t)pos * half + i] = (float)cos(a);
            e->rope_sin[(size_t)pos * half + i] = (float)sin(a);
        }

    /* workspaces */
    int fail = 0;
    size_t T = (size_t)e->max_T;
    size_t wide = (size_t)(c->intermediate_size > e->q_dim ? c->intermediate_size : e->q_dim);
    e->x = xcalloc(T * c->hidden_size, sizeof(float), &fail);
    e->xb = xcalloc(T * (size_t)(c->hidden_size > e->q_dim ? c->hidden_size : e->q_dim), sizeof(float), &fail);
    e->q = xcalloc(T * e->q_dim, sizeof(float), &fail);
    e->k = xcalloc(T * e->kv_dim, sizeof(float), &fail);
    e->v = xcalloc(T * e->kv_dim, sizeof(float), &fail);
    e->att = xcalloc(T * e->q_dim, sizeof(float), &fail);
    e->hb = xcalloc(T * wide, sizeof(float), &fail);
    e->hb2 = xcalloc(T * wide, sizeof(float), &fail);
    e->logits_ws = xcalloc((size_t)LOGIT_ROWS_CHUNK * c->vocab_size, sizeof(float), &fail);
    e->scores_stride = ((size_t)ctx + (size_t)bs - 1) / (size_t)bs * (size_t)bs;
    e->scores = xcalloc((size_t)threads * e->scores_stride, sizeof(float), &fail);
    e->tok_run = xcalloc(T + 1, sizeof(int), &fail);
    if (fail) goto oom;
    if (p->fast_prefill) {
        /* F32 weights keep the exact kernels (cpu_ops.h); so does a kernel
         * set below avx512 forced by DOLPHIN_CPU_KERNELS. Weights on 8-bit
         * activations take AMX-INT8, the other formats BF16x3. */
        const linear_w *q0 = c->n_layers > 0 ? &e->L[0].q : NULL;
        const bool i8 = e->use_i8 && q0 && is_quantized(q0);
        const bool bf16 = q0 && (q0->nf4 || q0->q8 ||
                                 (q0->packed && (q0->w.dtype == DOL_DTYPE_F16 ||
                                                 q0->w.dtype == DOL_DTYPE_BF16)));
        const bool wide = strcmp(dol_cpu_kernels_get()->name, "avx512") == 0;
        const bool unit = i8 ? dol_amx_i8_available() : dol_amx_available();
        if (!(i8 || bf16) || !wide) {
            dol_log(DOL_LOG_INFO, "cpu_fast_prefill_unavailable",
                    "batch_invariant=false reason=%s; products stay exact",
                    !(i8 || bf16) ? (q0 && is_quantized(q0) ? "block_weights_on_f32_activations" : "f32_weights")
                                  : "kernel_set_below_avx512");
        } else if (unit) {
            int kmax = c->hidden_size > e->q_dim ? c->hidden_size : e->q_dim;
            if (c->intermediate_size > kmax) kmax = c->intermediate_size;
            if (!i8 && dol_cpu_fast_reserve(&e->fast, e->max_T, kmax) != 0) goto oom;
            e->use_fast = true;
            /* (the interleaved layout's layers run on the tile unit either way) */
            dol_log(DOL_LOG_INFO, "cpu_fast_prefill", "arithmetic=%s unit=amx min_rows=%d layout=%s",
                    i8 ? "int8" : "bf16x3", DOL_CPU_FAST_MIN_T,
                    !i8 || !q0->r16.qs ? "row_major" : e->r16_amx ? "interleaved16" : "interleaved16_vnni");
        } else {
            dol_log(DOL_LOG_WARN, "cpu_fast_prefill_unavailable",
                    "batch_invariant=false reason=%s (cpu or os); products stay exact",
                    i8 ? "no_amx_int8" : "no_amx_bf16");
        }
    }
    *n_blocks = e->n_blocks;
    *out = e;
    return 0;
oom:
    dol_set_err(err, errlen, "engine: out of memory while preparing weights and workspaces");
fail:
    cpu_destroy(e);
    return -1;
}

static int cpu_create(const dol_model *model, const dol_engine_params *p, int ctx, int bs,
                      int *n_blocks, void **out, char *err, size_t errlen)
{
    const dol_layer_range whole = { 0, model->cfg.n_layers, true, true, 0 };
    return cpu_create_range(model, p, ctx, bs, &whole, n_blocks, out, err, errlen);
}

static void cpu_destroy(void *impl)
{
    cpu_engine *e = impl;
    if (!e) return;
    dol_pool_free(e->pool);
    for (int i = 0; i < e->n_owned; i++) free(e->owned[i]);
    dol_wcache_close(e->wcache);
    free(e->owned);
    for (int l = 0; e->L && l < e->c.n_layers; l++) {
        linear_w *ws[LAYER_LINEARS];
        layer_linears(&e->L[l], ws);
        for (int i = 0; i < LAYER_LINEARS; i++) dol_i8_r16_free(&ws[i]->r16);
    }
    dol_i8_r16_free(&e->lm_head.r16);
    free(e->L);
    free(e->kv_pool);
    free(e->rope_cos);
    free(e->rope_sin);
    free(e->x); free(e->xb); free(e->q); free(e->k); free(e->v); free(e->att);
    dol_cpu_fast_free(&e->fast);
    dol_cpu_i8_act_free(&e->xa);
    free(e->hb); free(e->hb2); free(e->logits_ws); free(e->scores);
    free(e->tok_run);
    free(e);
}

static size_t cpu_kv_bytes_per_token(void *impl)
{
    cpu_engine *e = impl;
    return e->block_bytes / (size_t)e->block_size;
}

static size_t cpu_weight_bytes(void *impl) { return ((cpu_engine *)impl)->weight_bytes; }

static void cpu_quant_stats(void *impl, dol_quant_stats *out) { *out = ((cpu_engine *)impl)->qs; }

/* The CPU has no device memory: the engine reports the KV pool instead. */
static int cpu_memory_info(void *impl, size_t *used, size_t *total)
{
    (void)impl; (void)used; (void)total;
    return -1;
}

/* Start of KV head h's K (which = 0) or V (1) run of layer `layer` in a
 * block (layout above). */
static void *kv_head(const cpu_engine *e, int32_t block, int layer, int h, int which)
{
    return (char *)e->kv_pool + (size_t)block * e->block_bytes +
           ((size_t)layer * (size_t)e->c.n_kv_heads + (size_t)h) * (e->run_k + e->run_v) +
           (which ? e->run_k : 0);
}

/* One head's row of hd values into row `row` of a run of type t: element
 * c at c * stride + row * pitch (K: stride block_size, pitch 1; V: stride
 * 1, pitch head_dim). Q8_0 quantizes each block of B values once
 * (dol_kv_q8_quantize) and puts its scale after the values: K's scale of
 * block j at [j * block_size + row], V's at [row * (hd / B) + j]. */
static void kv_put(void *run, dol_kv_dtype t, const float *x, int hd, int bs, int row, bool dims_major)
{
    const size_t stride = dims_major ? (size_t)bs : 1, pitch = dims_major ? 1 : (size_t)hd;
    if (t == DOL_KV_Q8_0) {
        const int B = dol_kv_q8_block(hd), nqb = hd / B;
        int8_t *q = (int8_t *)run + (size_t)row * pitch;
        uint16_t *d = (uint16_t *)((char *)run + (size_t)hd * bs);
        for (int j = 0; j < nqb; j++)
            d[dims_major ? (size_t)j * bs + row : (size_t)row * nqb + j] =
                dol_kv_q8_quantize(x + (size_t)j * B, 1, B, q + (size_t)j * B * stride, (int)stride);
    } else if (t == DOL_KV_F16) { /* round to nearest even (dol_f32_to_f16) */
        uint16_t *h = (uint16_t *)run + (size_t)row * pitch;
        for (int c = 0; c < hd; c++) h[(size_t)c * stride] = dol_f32_to_f16(x[c]);
    } else {
        float *f = (float *)run + (size_t)row * pitch;
        for (int c = 0; c < hd; c++) f[(size_t)c * stride] = x[c];
    }
}

/* Store KV heads h0 .. h1-1 of one token's K and V rows (kv_dim floats
 * each) at row `row` of a block: K scattered dims-major into each head's K
 * run, V one head_dim piece into each head's V run. */
static void kv_store(cpu_engine *e, int32_t block, int layer, int row, const float *k,
                     const float *v, int h0, int h1)
{
    const int hd = e->c.head_dim;
    for (int h = h0; h < h1; h++) {
        kv_put(kv_head(e, block, layer, h, 0), e->kv_k, k + (size_t)h * hd, hd, e->block_size, row, true);
        kv_put(kv_head(e, block, layer, h, 1), e->kv_v, v + (size_t)h * hd, hd, e->block_size, row, false);
    }
}

/* RoPE (Su et al. 2021) on token t's KV heads g0 .. g1-1 and on the query
 * heads of their groups, then those K/V heads into the sequence's block at
 * the token's position. Element-wise: any split over heads gives the same
 * bits. */
static void rope_and_store(cpu_engine *e, int t, int layer, int g0, int g1)
{
    const dol_model_config *c = &e->c;
    const int hd = c->head_dim, half = hd / 2, group = c->n_heads / c->n_kv_heads;
    const int pos = e->tok_pos[t];
    const float *cr = e->rope_cos + (size_t)pos * half, *sr = e->rope_sin + (size_t)pos * half;
    dol_cpu_rope(e->q + (size_t)t * e->q_dim + (size_t)g0 * group * hd, (g1 - g0) * group, hd, cr, sr);
    dol_cpu_rope(e->k + (size_t)t * e->kv_dim + (size_t)g0 * hd, g1 - g0, hd, cr, sr);
    const dol_kv_seq *s = &e->kv->seqs[e->tok_seq[t]];
    kv_store(e, s->table[pos / e->block_size], layer, pos % e->block_size,
             e->k + (size_t)t * e->kv_dim, e->v + (size_t)t * e->kv_dim, g0, g1);
}

/* Copy-on-write of a shared last block (n > 1 forks): the first `rows`
 * rows are what matters; K is dims-major, so its whole run is copied, V
 * the first rows of each head (and of its scales under Q8_0). */
static void cpu_copy_block(void *impl, int32_t src, int32_t dst, int rows)
{
    cpu_engine *e = impl;
    const int hd = e->c.head_dim, bs = e->block_size;
    const size_t row = dol_kv_head_row_bytes(e->kv_v, hd);
    for (int l = 0; l < e->c.n_layers; l++) {
        for (int h = 0; h < e->c.n_kv_heads; h++) {
            memcpy(kv_head(e, dst, l, h, 0), kv_head(e, src, l, h, 0), e->run_k);
            char *vd = kv_head(e, dst, l, h, 1);
            const char *vs = kv_head(e, src, l, h, 1);
            if (e->kv_v != DOL_KV_Q8_0) {
                memcpy(vd, vs, (size_t)rows * row);
                continue;
            }
            const size_t sb = (size_t)(hd / dol_kv_q8_block(hd)) * sizeof(uint16_t); /* a row's scales */
            memcpy(vd, vs, (size_t)rows * hd);
            memcpy(vd + (size_t)bs * hd, vs + (size_t)bs * hd, (size_t)rows * sb);
        }
    }
}

/* ---- attention ----------------------------------------------------------- */

typedef struct {
    cpu_engine *e;
    int layer;
    const dol_cpu_kernels *kern;
    int T, chunk;             /* tokens of the batch; tokens per task (KV heads per task when fused) */
    bool fused;               /* decode batch: tasks are (token, run of KV heads) and do RoPE + KV store too */
} attn_job;

/* One task: one query head over a chunk of tokens (consecutive tokens of a
 * prefill chunk share their sequence's K/V, which then stays in cache).
 * Each token: causal softmax attention over the sequence's cached positions
 * 0..pos (scaled dot product, Vaswani et al. 2017), with grouped query heads
 * sharing K/V head h / (n_heads / n_kv_heads) (GQA, Ainslie et al. 2023),
 * read in place from the paged cache (attn_head, cpu_kernels.h). */
static void attn_one(const attn_job *j, int t, int h, int worker)
{
    cpu_engine *e = j->e;
    const dol_model_config *c = &e->c;
    const int hd = c->head_dim;
    const int kvh = h / (c->n_heads / c->n_kv_heads);
    const void *k_base = kv_head(e, 0, j->layer, kvh, 0);
    const void *v_base = kv_head(e, 0, j->layer, kvh, 1);
    const dol_kv_seq *s = &e->kv->seqs[e->tok_seq[t]];
    const float *q = e->q + (size_t)t * e->q_dim + (size_t)h * hd;
    float *out = e->att + (size_t)t * e->q_dim + (size_t)h * hd;
    float *sc = e->scores + (size_t)worker * e->scores_stride;
    j->kern->attn_head(q, hd, e->tok_pos[t] + 1, k_base, v_base, e->kv_k, e->kv_v, s->table,
                       e->block_size, e->block_bytes, 1.0f / sqrtf((float)hd), sc, out);
}

/* Bytes of a head's K/V that kv_prefetch asks for into L1 (small beside a
 * 32-48 KiB L1D, so the head being computed keeps its lines) and in all
 * (the rest goes to L2, 1 MiB and more on the x86-64 parts we target). */
#define KV_PREFETCH_L1_BYTES (12u * 1024u)
#define KV_PREFETCH_MAX_BYTES (512u * 1024u)

/* Ask the caches for what KV head g of layer `layer` will read and write
 * for token t: the K and V runs of every block of the token's sequence up
 * to its position (one contiguous 2 * block_size * head_dim run of floats
 * per block, see kv_head). In a decode step these lines were evicted by the
 * weights streamed since the previous step, and each head's runs lie in
 * their own 4 KiB pages, so without this every run starts with a full
 * memory latency. A hint only: no value changes. */
static void kv_prefetch(const cpu_engine *e, int t, int layer, int g)
{
    const dol_kv_seq *s = &e->kv->seqs[e->tok_seq[t]];
    const int n = e->tok_pos[t] + 1, bs = e->block_size;
    const size_t run = e->run_k + e->run_v;
    size_t asked = 0;
    for (int b = 0; b < (n + bs - 1) / bs && asked < KV_PREFETCH_MAX_BYTES; b++, asked += run) {
        const char *p = (const char *)kv_head(e, s->table[b], layer, g, 0);
        for (size_t o = 0; o < run; o += 64) {
            if (asked + o < KV_PREFETCH_L1_BYTES) __builtin_prefetch(p + o, 0, 3);
            else __builtin_prefetch(p + o, 0, 2);
        }
    }
}

static void attn_task(void *ctx, int task, int worker)
{
    const attn_job *j = ctx;
    cpu_engine *e = j->e;
    const dol_model_config *c = &e->c;
    if (j->fused) {
        /* one token (its own sequence) and a run of KV heads, each in
         * turn: RoPE on the query heads of the group and on the key head,
         * the head's K/V into the cache, then the group's attention (the
         * same operations per element as the unfused path, so the same
         * bits), with the K/V of the head after next prefetched meanwhile */
        const int per_token = (c->n_kv_heads + j->chunk - 1) / j->chunk;
        const int t = task / per_token, g0 = task % per_token * j->chunk;
        const int g1 = g0 + j->chunk < c->n_kv_heads ? g0 + j->chunk : c->n_kv_heads;
        const int group = c->n_heads / c->n_kv_heads;
        kv_prefetch(e, t, j->layer, g0);
        if (g0 + 1 < g1) kv_prefetch(e, t, j->layer, g0 + 1);
        for (int g = g0; g < g1; g++) {
            if (g + 2 < g1) kv_prefetch(e, t, j->layer, g + 2);
            rope_and_store(e, t, j->layer, g, g + 1);
            for (int h = g * group; h < (g + 1) * group; h++) attn_one(j, t, h, worker);
        }
        return;
    }
    const int h = task % c->n_heads, chunk = task / c->n_heads;
    const int t0 = chunk * j->chunk, t1 = t0 + j->chunk < j->T ? t0 + j->chunk : j->T;
    for (int t = t0; t < t1; t++) attn_one(j, t, h, worker);
}

/* Attention of every token of the batch (after per_token's RoPE and KV
 * store): tasks of ATTN_CHUNK tokens of one head for prefill-sized batches
 * (fewer claims of the pool's task counter, K/V reused from cache), one
 * token of one head otherwise. */
#define ATTN_CHUNK 16
static void attention(cpu_engine *e, int T, int layer)
{
    attn_job j = { e, layer, dol_cpu_kernels_get(), T, T >= 4 * ATTN_CHUNK ? ATTN_CHUNK : 1, false };
    const int chunks = (T + j.chunk - 1) / j.chunk;
    dol_pool_run(e->pool, attn_task, &j, chunks * e->c.n_heads);
}

/* RoPE, KV store and attention as one job of (token, run of KV heads)
 * tasks, for a batch whose tokens all belong to different sequences
 * (decode): no token then reads another token's K/V of this step, so
 * nothing orders the tasks. The KV reads and writes miss the cache (the
 * weights streamed through it since the previous step; dims-major K puts
 * one head's row in head_dim lines), so each task prefetches the K/V of
 * the head after next while it computes one (kv_prefetch): the next head
 * alone left part of the memory latency showing. Each token's heads are
 * cut into one run per thread, and never into runs of fewer than two heads
 * (a run of one has nothing to prefetch ahead). Measurements:
 * docs/performance.md, "Attention and the KV layout". */
static void attention_decode(cpu_engine *e, int T, int layer)
{
    const int kvh = e->c.n_kv_heads, threads = dol_pool_threads(e->pool);
    int run = (kvh + threads - 1) / threads;
    if (run < 2) run = 2;
    if (run > kvh) run = kvh;
    attn_job j = { e, layer, dol_cpu_kernels_get(), T, run, true };
    dol_pool_run(e->pool, attn_task, &j, T * ((kvh + run - 1) / run));
}

/* ---- per-token steps ------------------------------------------------------ */

/* The per-token work between the matrix products (RMSNorm, RoPE + the KV
 * write), spread over the pool for prefill-sized batches: each token's
 * result depends on that token alone, so the split changes no bits. */
enum { TOK_NORM, TOK_ROPE_STORE };

typedef struct {
    cpu_engine *e;
    int what, layer;
    const float *norm_w;
    int T;
} tok_job;

/* Tokens per RMSNorm task (one claim of the pool's counter each). */
#define NORM_CHUNK 8

static void tok_task(void *ctx, int task, int worker)
{
    (void)worker;
    const tok_job *j = ctx;
    cpu_engine *e = j->e;
    const dol_model_config *c = &e->c;
    const int d = c->hidden_size;
    if (j->what == TOK_NORM) {
        const int t0 = task * NORM_CHUNK;
        const int t1 = t0 + NORM_CHUNK < j->T ? t0 + NORM_CHUNK : j->T;
        dol_cpu_rmsnorm_rows(e->xb + (size_t)t0 * d, e->x + (size_t)t0 * d, j->norm_w, t1 - t0,
                             d, c->rms_norm_eps);
        return;
    }
    /* RoPE on q and k, then K/V into the sequence's block, for the run of
     * tokens that share one block: K is dims-major, so the rows of a block
     * share cache lines, and one task writing them all keeps two threads
     * from fighting over those lines */
    for (int t = e->tok_run[task]; t < e->tok_run[task + 1]; t++)
        rope_and_store(e, t, j->layer, 0, c->n_kv_heads);
}

/* Cut the batch's tokens into runs of one sequence and one KV block
 * (tok_run), once per forward call. */
static void plan_runs(cpu_engine *e, int T)
{
    int n = 0;
    for (int t = 0; t < T; t++)
        if (t == 0 || e->tok_seq[t] != e->tok_seq[t - 1] ||
            e->tok_pos[t] / e->block_size != e->tok_pos[t - 1] / e->block_size ||
            e->tok_pos[t] != e->tok_pos[t - 1] + 1)
            e->tok_run[n++] = t;
    e->tok_run[n] = T;
    e->n_runs = n;
    /* the tokens of one sequence are contiguous (one batch item each) */
    e->decode_batch = true;
    for (int t = 1; t < T; t++)
        if (e->tok_seq[t] == e->tok_seq[t - 1]) e->decode_batch = false;
}

static void per_token(cpu_engine *e, int T, int what, int layer, const float *norm_w)
{
    tok_job j = { e, what, layer, norm_w, T };
    const int tasks = what == TOK_NORM ? (T + NORM_CHUNK - 1) / NORM_CHUNK : e->n_runs;
    if (T >= 16) {
        dol_pool_run(e->pool, tok_task, &j, tasks);
    } else {
        for (int t = 0; t < tasks; t++) tok_task(&j, t, 0);
    }
}

/* ---- the forward pass ---------------------------------------------------- */

static int cpu_forward(void *impl, const dol_forward_args *a, char *err, size_t errlen)
{
    cpu_engine *e = impl;
    const dol_model_config *c = &e->c;
    const int d = c->hidden_size, f = c->intermediate_size;
    const int T = a->T;
    const dol_batch_item *items = a->items;
    const int n_items = a->n_items;
    (void)err; (void)errlen;
    e->kv = a->kv;
    e->tok_id = a->tok_id;
    e->tok_seq = a->tok_seq;
    e->tok_pos = a->tok_pos;
    plan_runs(e, T);

    /* Embedding, or the residual stream the previous range left */
    if (e->has_embed)
        for (int t = 0; t < T; t++) dol_cpu_embed_row(e->x + (size_t)t * d, &e->embed, e->tok_id[t]);
    else
        memcpy(e->x, a->h_in, sizeof(float) * (size_t)T * d);

    for (int l = 0; l < c->n_layers; l++) {
        layer_w *w = &e->L[l];

        /* Attention block: RMSNorm, Q/K/V projections */
        per_token(e, T, TOK_NORM, l, w->attn_norm);
        const dol_cpu_weight qkv[3] = { weight_of(e, &w->q), weight_of(e, &w->k), weight_of(e, &w->v) };
        float *const qkv_out[3] = { e->q, e->k, e->v };
        dol_cpu_matmul_multi(e->pool, e->xb, T, d, qkv, qkv_out, 3);

        /* RoPE on q and k, K/V into the sequences' blocks, then causal
         * attention of every token over its own sequence (one job when
         * every token is its own sequence) */
        if (e->decode_batch) {
            attention_decode(e, T, l);
        } else {
            per_token(e, T, TOK_ROPE_STORE, l, NULL);
            attention(e, T, l);
        }

        /* Output projection and residual */
        const dol_cpu_weight wo = weight_of(e, &w->o);
        dol_cpu_matmul_add(e->pool, e->x, e->xb, e->att, T, e->q_dim, &wo);

        /* MLP block: RMSNorm, SwiGLU (Shazeer 2020), residual */
        per_token(e, T, TOK_NORM, l, w->ffn_norm);
        const dol_cpu_weight wg = weight_of(e, &w->gate), wu = weight_of(e, &w->up), wd = weight_of(e, &w->down);
        dol_cpu_swiglu(e->pool, e->hb, e->hb2, e->xb, T, d, &wg, &wu);
        dol_cpu_matmul_add(e->pool, e->x, e->xb, e->hb, T, f, &wd);
    }

    if (!e->has_head) { /* the next range continues from here */
        memcpy(a->h_out, e->x, sizeof(float) * (size_t)T * d);
        return 0;
    }

    /* Final norm and logits, only for the rows that want them. Rows of all
     * items go through lm_head together, LOGIT_ROWS_CHUNK at a time. */
    int rows = 0, t0 = 0;
    for (int i = 0; i < n_items; i++) {
        const dol_batch_item *it = &items[i];
        for (int k = it->n_tokens - it->n_logits; k < it->n_tokens; k++)
            dol_cpu_rmsnorm(e->xb + (size_t)rows++ * d, e->x + (size_t)(t0 + k) * d,
                            e->final_norm, d, c->rms_norm_eps);
        t0 += it->n_tokens;
    }
    int item = 0, item_row = 0;
    const dol_cpu_weight lm = weight_of(e, &e->lm_head);
    for (int r0 = 0; r0 < rows; r0 += LOGIT_ROWS_CHUNK) {
        int nr = rows - r0 < LOGIT_ROWS_CHUNK ? rows - r0 : LOGIT_ROWS_CHUNK;
        float *dst[LOGIT_ROWS_CHUNK];
        for (int r = 0; r < nr; r++) {
            while (item_row >= items[item].n_logits) { item++; item_row = 0; }
            dst[r] = items[item].logits + (size_t)item_row * c->vocab_size;
            item_row++;
        }
        dol_cpu_matmul_scatter(e->pool, dst, e->logits_ws, e->xb + (size_t)r0 * d, nr, d, &lm);
    }
    return 0;
}

const dol_backend_ops dol_cpu_backend = {
    .name = "cpu",
    .kv_no_f32 = false, /* kv_cache_dtype: F32, F16 or Q8_0 per half */
    .create = cpu_create,
    .destroy = cpu_destroy,
    .forward = cpu_forward,
    .copy_block = cpu_copy_block,
    .weight_bytes = cpu_weight_bytes,
    .quant_stats = cpu_quant_stats,
    .kv_bytes_per_token = cpu_kv_bytes_per_token,
    .memory_info = cpu_memory_info,
    .activations = cpu_activations,
    .create_range = cpu_create_range,
};
