/* src/engine/engine.c — the backend-independent part of the engine
 * (include/dolphin/engine.h): picking the backend, sizing the KV pool,
 * sequences and block tables (kv_blocks.c), and the validation and
 * flattening of every forward call before the backend runs it. */
#include "dolphin/engine.h"

#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/cuda_probe.h"
#include "engine/cpu_kernels.h"
#include "engine/placement.h"
#include "dolphin/kv_q8.h"
#include "dolphin/log.h"
#include <stdio.h>

struct dol_engine {
    const dol_backend_ops *ops;
    void *impl;
    int ctx, vocab, max_T, n_layers;
    dol_kv_dtype kv_dtype_k, kv_dtype_v;
    dol_kv_blocks kv;
    int32_t *tok_id, *tok_seq, *tok_pos;
};

bool dol_engine_cuda_built(void)
{
#ifdef DOLPHIN_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

const char *dol_kv_dtype_str(dol_kv_dtype t)
{
    switch (t) {
    case DOL_KV_F32: return "f32";
    case DOL_KV_F16: return "f16";
    case DOL_KV_Q8_0: return "q8_0";
    default: return "auto";
    }
}

size_t dol_kv_head_row_bytes(dol_kv_dtype t, int head_dim)
{
    if (head_dim < 1) return 0;
    switch (t) {
    case DOL_KV_F32: return 4 * (size_t)head_dim;
    case DOL_KV_F16: return 2 * (size_t)head_dim;
    case DOL_KV_Q8_0:
        if (!dol_kv_q8_head_ok(head_dim)) return 0;
        return (size_t)head_dim + 2 * (size_t)(head_dim / dol_kv_q8_block(head_dim));
    default: return 0;
    }
}

/* One half's element type: its own setting, else kv_cache_dtype; AUTO is
 * F32 only with F32 weights on a backend that holds F32 (so F32 runs match
 * the float64 references as closely as before), else F16. A backend
 * without an F32 cache (CUDA) holds F16 where F32 was asked. */
static dol_kv_dtype kv_half_of(const dol_model *model, const dol_engine_params *p, bool no_f32,
                               dol_kv_dtype half)
{
    dol_kv_dtype t = half != DOL_KV_AUTO ? half : p->kv_dtype;
    if (t == DOL_KV_AUTO) {
        const bool f32 = p->weights == DOL_WEIGHTS_F32 ||
                         (p->weights == DOL_WEIGHTS_AUTO && model->cfg.n_layers > 0 &&
                          model->layers && model->layers[0].q.dtype == DOL_DTYPE_F32);
        t = f32 ? DOL_KV_F32 : DOL_KV_F16;
    }
    return no_f32 && t == DOL_KV_F32 ? DOL_KV_F16 : t;
}

/* Both halves resolved into out->kv_dtype_k / _v (out->kv_dtype: their
 * common type, or AUTO when they differ). -2 (a setting's fault) when Q8_0
 * cannot hold this model's heads, naming the key that asked for it. */
static int kv_resolve(const dol_model *model, const dol_engine_params *p, bool no_f32,
                      dol_engine_params *out, char *err, size_t errlen)
{
    const dol_kv_dtype half[2] = { p->kv_dtype_k, p->kv_dtype_v };
    dol_kv_dtype t[2];
    for (int w = 0; w < 2; w++) {
        t[w] = kv_half_of(model, p, no_f32, half[w]);
        if (t[w] == DOL_KV_Q8_0 && !dol_kv_q8_head_ok(model->cfg.head_dim)) {
            const char *key = half[w] != DOL_KV_AUTO ? (w ? "kv_cache_dtype_v" : "kv_cache_dtype_k")
                                                     : "kv_cache_dtype";
            dol_set_err(err, errlen, "%s: q8_0 holds heads of fewer than %d values or a multiple "
                        "of %d; this model's head_dim is %d", key, DOL_KV_Q8_BLOCK,
                        DOL_KV_Q8_BLOCK, model->cfg.head_dim);
            return -2;
        }
    }
    out->kv_dtype_k = t[0];
    out->kv_dtype_v = t[1];
    out->kv_dtype = t[0] == t[1] ? t[0] : DOL_KV_AUTO;
    return 0;
}

/* Bytes of one position of every layer's K and V. */
static size_t kv_token_bytes(const dol_model *model, const dol_engine_params *r)
{
    const dol_model_config *c = &model->cfg;
    return (size_t)c->n_layers * (size_t)c->n_kv_heads *
           (dol_kv_head_row_bytes(r->kv_dtype_k, c->head_dim) +
            dol_kv_head_row_bytes(r->kv_dtype_v, c->head_dim));
}

/* Context length, block size and the KV blocks asked for (0 = the backend
 * decides), as every backend sees them. */
static int engine_sizes(const dol_model *model, const dol_engine_params *p, int *ctx,
                        int *bs, int64_t *want, char *err, size_t errlen)
{
    const dol_model_config *c = &model->cfg;
    *ctx = p->context_len > 0 && p->context_len < c->max_position_embeddings
               ? p->context_len : c->max_position_embeddings;
    *bs = p->kv_block_size;
    size_t per_token = kv_token_bytes(model, p);
    if (per_token == 0) per_token = 1;
    int64_t tokens = p->kv_cache_tokens;
    if (tokens <= 0 && p->kv_cache_bytes > 0) {   /* at least one token: one block */
        tokens = p->kv_cache_bytes / (int64_t)per_token;
        if (tokens < 1) tokens = 1;
    }
    *want = tokens > 0 ? (tokens + *bs - 1) / *bs : 0;
    if (*want > INT32_MAX / 2) {
        dol_set_err(err, errlen, "kv_cache: %lld tokens is not a usable pool size", (long long)tokens);
        return -1;
    }
    return 0;
}

/* The placement settings ask for more than one device's whole model. */
static bool placement_asked(const dol_engine_params *p)
{
    return p->n_devices > 1 || (p->n_devices == 1 && p->devices[0] != 0) || p->n_layer_split > 0 ||
           p->gpu_layers_set || p->no_host_spill;
}

/* backend auto found no GPU: the placement settings have nothing to place
 * on, and the whole model runs on the CPU backend; said once, loudly. */
static void placement_ignored(const dol_engine_params *p, const char *why)
{
    if (!placement_asked(p)) return;
    dol_log(DOL_LOG_WARN, "placement_ignored",
            "devices=%d layer_split=%d gpu_layers=%d allow_host_spill=%d reason=\"%s\" "
            "msg=\"the layer placement settings apply to CUDA devices; every block runs on the CPU\"",
            p->n_devices, p->n_layer_split, p->gpu_layers_set ? p->gpu_layers : -1,
            p->no_host_spill ? 0 : 1, why);
}

/* The sizes every caller must give (their defaults are the configuration's,
 * docs/configuration.md). */
static int sizes_given(const dol_engine_params *p, char *err, size_t errlen)
{
    if (p->kv_block_size >= 1 && p->max_seqs >= 1 && p->max_batch_tokens >= 1) return 0;
    dol_set_err(err, errlen, "engine: kv_block_size (%d), max_seqs (%d) and max_batch_tokens "
                "(%d) must each be at least 1", p->kv_block_size, p->max_seqs,
                p->max_batch_tokens);
    return -1;
}

int dol_engine_create(const dol_model *model, const dol_engine_params *p,
                      dol_engine **out, char *err, size_t errlen)
{
    const dol_backend_ops *ops = &dol_cpu_backend;
    if (sizes_given(p, err, errlen)) return -1;
    if (p->backend == DOL_BACKEND_CPU && (p->n_layer_split > 0 || (p->gpu_layers_set && p->gpu_layers > 0))) {
        dol_set_err(err, errlen, "%s: blocks on a GPU asked for, but backend is cpu",
                    p->n_layer_split > 0 ? "layer_split" : "gpu_layers");
        return -2;
    }
    if (p->backend == DOL_BACKEND_CUDA || p->backend == DOL_BACKEND_AUTO) {
#ifdef DOLPHIN_HAVE_CUDA
        char why[256];
        if (dol_cuda_device_check(why, sizeof why)) {
            /* the whole model on device 0 when it fits and nothing else is
             * asked: the one-device path, with no placement layer in it */
            int ctx, bs;
            int64_t want;
            dol_engine_params rp = *p;
            int krc = kv_resolve(model, p, dol_cuda_backend.kv_no_f32, &rp, err, errlen);
            if (krc != 0) return krc;
            if (engine_sizes(model, &rp, &ctx, &bs, &want, err, errlen) != 0) return -1;
            dol_placement pl;
            int rc = dol_placement_plan(model, &rp, ctx, bs, want, &pl, err, errlen);
            if (rc != 0) return rc;
            const dol_layer_range *r0 = &pl.st[0].r;
            const bool whole = pl.n == 1 && r0->l0 == 0 && r0->l1 == model->cfg.n_layers;
            if (whole && !pl.st[0].cuda) ops = &dol_cpu_backend; /* gpu_layers: 0 */
            else if (whole && r0->device == 0) ops = &dol_cuda_backend;
            else ops = &dol_placed_backend;
            if (ops != &dol_placed_backend && placement_asked(p))
                dol_log(DOL_LOG_INFO, "placement", "device=%s blocks=0..%d embed=1 head=1 (one backend)",
                        ops == &dol_cpu_backend ? "cpu" : "cuda:0", model->cfg.n_layers - 1);
        } else if (p->backend == DOL_BACKEND_CUDA) {
            dol_set_err(err, errlen, "backend: cuda requested but no usable CUDA device was found: %s", why);
            return -1;
        } else {
            placement_ignored(p, why);
        }
#else
        if (p->backend == DOL_BACKEND_CUDA) {
            /* a setting this build can never honour: exit 2 */
            dol_set_err(err, errlen, "backend: cuda requested but this dolphind was built without CUDA");
            return -2;
        }
        placement_ignored(p, "this dolphind was built without CUDA");
#endif
    }
    return dol_engine_create_with(ops, model, p, out, err, errlen);
}

int dol_engine_create_with(const dol_backend_ops *ops, const dol_model *model,
                           const dol_engine_params *p, dol_engine **out, char *err,
                           size_t errlen)
{
    if (sizes_given(p, err, errlen)) return -1;
    dol_engine *e = calloc(1, sizeof *e);
    if (!e) { dol_set_err(err, errlen, "engine: out of memory"); return -1; }
    e->ops = ops;
    const dol_model_config *c = &model->cfg;
    e->vocab = c->vocab_size;
    e->n_layers = c->n_layers;
    e->max_T = p->max_batch_tokens;
    int bs, max_seqs = p->max_seqs;
    dol_engine_params bp = *p;
    int krc = kv_resolve(model, p, ops->kv_no_f32, &bp, err, errlen);
    if (krc != 0) {
        free(e);
        return krc;
    }
    e->kv_dtype_k = bp.kv_dtype_k;
    e->kv_dtype_v = bp.kv_dtype_v;
    int64_t want;
    if (engine_sizes(model, &bp, &e->ctx, &bs, &want, err, errlen) != 0) {
        free(e);
        return -1;
    }
    int n_blocks = (int)want;
    bp.max_seqs = max_seqs;
    bp.max_batch_tokens = e->max_T;
    int rc = ops->create(model, &bp, e->ctx, bs, &n_blocks, &e->impl, err, errlen);
    if (rc != 0) {
        free(e);
        return rc == -2 ? -2 : -1;
    }
    e->tok_id = malloc(sizeof(int32_t) * (size_t)e->max_T);
    e->tok_seq = malloc(sizeof(int32_t) * (size_t)e->max_T);
    e->tok_pos = malloc(sizeof(int32_t) * (size_t)e->max_T);
    if (!e->tok_id || !e->tok_seq || !e->tok_pos ||
        dol_kv_blocks_init(&e->kv, n_blocks, bs, max_seqs, p->prefix_caching) != 0) {
        dol_set_err(err, errlen, "engine: out of memory");
        dol_engine_free(e);
        return -1;
    }
    *out = e;
    return 0;
}

void dol_engine_free(dol_engine *e)
{
    if (!e) return;
    if (e->impl) e->ops->destroy(e->impl);
    dol_kv_blocks_destroy(&e->kv);
    free(e->tok_id);
    free(e->tok_seq);
    free(e->tok_pos);
    free(e);
}

const char *dol_engine_backend_name(const dol_engine *e) { return e->ops->name; }

int dol_engine_devices(const dol_engine *e, dol_device_memory *out, int max)
{
    if (max < 1) return 0;
    const int used_blocks = e->kv.n_blocks - dol_kv_blocks_available(&e->kv);
#ifdef DOLPHIN_HAVE_CUDA
    if (e->ops == &dol_placed_backend) return dol_placement_devices(e->impl, used_blocks, out, max);
#endif
    dol_device_memory *d = &out[0];
    memset(d, 0, sizeof *d);
    const bool cuda = strcmp(e->ops->name, "cuda") == 0;
    snprintf(d->name, sizeof d->name, cuda ? "cuda:0" : "cpu");
    d->n_blocks = e->n_layers;
    d->embed = d->head = true;
    d->weight_bytes = e->ops->weight_bytes(e->impl);
    d->step_read_bytes = d->weight_bytes;
    d->kv_bytes = e->ops->kv_bytes_per_token(e->impl) * (size_t)e->kv.block_size * (size_t)e->kv.n_blocks;
    (void)dol_engine_memory_info(e, &d->used, &d->total);
    (void)used_blocks;
    return 1;
}

double dol_engine_gpu_utilization(const dol_engine *e)
{
    int pct = 0;
    if (strcmp(e->ops->name, "cuda") != 0 || dol_cuda_utilization(&pct) != 0) return -1.0;
    return pct / 100.0;
}
const char *dol_engine_cpu_kernels(void) { return dol_cpu_kernels_get()->name; }
const char *dol_engine_activations(const dol_engine *e)
{
    if (e->ops->activations) return e->ops->activations(e->impl);
    return strcmp(e->ops->name, "cuda") == 0 ? "f16" : "f32";
}
int dol_engine_memory_info(const dol_engine *e, size_t *used, size_t *total)
{
#ifdef DOLPHIN_HAVE_CUDA
    if (e->ops == &dol_placed_backend) {
        /* the device nearest to full, so that whoever watches this figure
         * (the readiness hysteresis) watches every device */
        dol_device_memory d[DOL_PLACEMENT_MAX_STAGES];
        int n = dol_engine_devices(e, d, DOL_PLACEMENT_MAX_STAGES);
        double worst = -1;
        for (int i = 0; i < n; i++) {
            double r = d[i].total ? (double)d[i].used / (double)d[i].total : 0;
            if (r > worst) {
                worst = r;
                *used = d[i].used;
                *total = d[i].total;
            }
        }
        return n > 0 ? 0 : -1;
    }
#endif
    if (e->ops->memory_info(e->impl, used, total) == 0) return 0;
    /* no device memory (CPU): the KV pool stands in, so that the readiness
     * logic that watches memory is exercised on every machine */
    size_t per_block = e->ops->kv_bytes_per_token(e->impl) * (size_t)e->kv.block_size;
    *total = per_block * (size_t)e->kv.n_blocks;
    *used = per_block * (size_t)(e->kv.n_blocks - dol_kv_blocks_available(&e->kv));
    return 0;
}
int dol_engine_context_len(const dol_engine *e) { return e->ctx; }
const char *dol_engine_kv_dtype_name(const dol_engine *e)
{
    static const char *const mixed[3][3] = {
        { "f32", "k=f32,v=f16", "k=f32,v=q8_0" },
        { "k=f16,v=f32", "f16", "k=f16,v=q8_0" },
        { "k=q8_0,v=f32", "k=q8_0,v=f16", "q8_0" },
    };
    const int k = (int)e->kv_dtype_k - DOL_KV_F32, v = (int)e->kv_dtype_v - DOL_KV_F32;
    return k >= 0 && k < 3 && v >= 0 && v < 3 ? mixed[k][v] : "auto";
}
dol_kv_dtype dol_engine_kv_dtype(const dol_engine *e, int which)
{
    return which ? e->kv_dtype_v : e->kv_dtype_k;
}
int dol_engine_vocab_size(const dol_engine *e) { return e->vocab; }
int dol_engine_max_batch_tokens(const dol_engine *e) { return e->max_T; }
int dol_engine_seq_new(dol_engine *e) { return dol_kv_seq_new(&e->kv); }
void dol_engine_seq_free(dol_engine *e, int seq) { dol_kv_seq_free(&e->kv, seq); }
int dol_engine_seq_reserve(dol_engine *e, int seq, int n)
{
    if (n > e->ctx) return -1;
    return dol_kv_seq_reserve(&e->kv, seq, n);
}
int dol_engine_blocks_for(const dol_engine *e, int n)
{
    return (n + e->kv.block_size - 1) / e->kv.block_size;
}
int dol_engine_kv_blocks_total(const dol_engine *e) { return e->kv.n_blocks; }
int dol_engine_kv_blocks_free(const dol_engine *e) { return dol_kv_blocks_available(&e->kv); }
int dol_engine_kv_blocks_cached(const dol_engine *e) { return e->kv.n_evictable; }
bool dol_engine_kv_prefix_caching(const dol_engine *e) { return e->kv.prefix_caching; }
int dol_engine_seq_match_prefix(dol_engine *e, int seq, const int32_t *tokens, int n_tokens)
{
    return dol_kv_seq_match_prefix(&e->kv, seq, tokens, n_tokens);
}
void dol_engine_seq_commit(dol_engine *e, int seq, const int32_t *tokens, int n_tokens)
{
    dol_kv_seq_commit(&e->kv, seq, tokens, n_tokens);
}
int dol_engine_kv_block_size(const dol_engine *e) { return e->kv.block_size; }
size_t dol_engine_kv_bytes_per_token(const dol_engine *e) { return e->ops->kv_bytes_per_token(e->impl); }
size_t dol_engine_weight_bytes(const dol_engine *e) { return e->ops->weight_bytes(e->impl); }
void dol_engine_quant_stats(const dol_engine *e, dol_quant_stats *out)
{
    memset(out, 0, sizeof *out);
    if (e->ops->quant_stats) e->ops->quant_stats(e->impl, out);
}

int dol_engine_seq_fork(dol_engine *e, int src, int n_tokens)
{
    int32_t cs, cd;
    int id = dol_kv_seq_fork(&e->kv, src, n_tokens, &cs, &cd);
    if (id >= 0 && cs >= 0) e->ops->copy_block(e->impl, cs, cd, n_tokens % e->kv.block_size);
    return id;
}

int dol_engine_forward(dol_engine *e, dol_batch_item *items, int n_items,
                       char *err, size_t errlen)
{
    int T = 0;
    for (int i = 0; i < n_items; i++) {
        dol_batch_item *it = &items[i];
        if (!dol_kv_seq_live(&e->kv, it->seq)) {
            dol_set_err(err, errlen, "forward: sequence %d is not live", it->seq);
            return -1;
        }
        for (int j = 0; j < i; j++)
            if (items[j].seq == it->seq) {
                dol_set_err(err, errlen, "forward: sequence %d appears twice in one call", it->seq);
                return -1;
            }
        if (it->n_tokens < 1 || it->start_pos < 0 ||
            it->start_pos + it->n_tokens > e->kv.seqs[it->seq].n_tokens) {
            dol_set_err(err, errlen, "forward: sequence %d: positions %d..%d not reserved",
                        it->seq, it->start_pos, it->start_pos + it->n_tokens - 1);
            return -1;
        }
        if (it->n_logits < 0 || it->n_logits > it->n_tokens || (it->n_logits && !it->logits)) {
            dol_set_err(err, errlen, "forward: sequence %d: bad logits request", it->seq);
            return -1;
        }
        if (T + it->n_tokens > e->max_T) {
            dol_set_err(err, errlen, "forward: more than %d tokens in one call", e->max_T);
            return -1;
        }
        for (int k = 0; k < it->n_tokens; k++) {
            int32_t id = it->tokens[k];
            if (id < 0 || id >= e->vocab) {
                dol_set_err(err, errlen, "forward: token id %d out of range", id);
                return -1;
            }
            e->tok_id[T] = id;
            e->tok_seq[T] = it->seq;
            e->tok_pos[T] = it->start_pos + k;
            T++;
        }
    }
    if (T == 0) return 0;
    dol_forward_args a = { .items = items, .n_items = n_items, .T = T, .tok_id = e->tok_id,
                           .tok_seq = e->tok_seq, .tok_pos = e->tok_pos, .kv = &e->kv };
    return e->ops->forward(e->impl, &a, err, errlen);
}
