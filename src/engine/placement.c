/* src/engine/placement.c — layer placement: which device holds which
 * transformer blocks (contiguous ranges over the CUDA devices, then the
 * CPU), and the backend that chains those ranges into one forward pass
 * (dol_placed_backend). Each range is its own backend instance (cpu_engine.c,
 * cuda_engine.c through create_range) holding its blocks' weights and their
 * KV cache; every instance has the same number of KV blocks, so the engine's
 * one block allocator (kv_blocks.c) serves them all. The residual stream
 * crosses each boundary once per step, by peer copy between CUDA devices
 * that allow it, otherwise through pinned host memory. docs/architecture.md,
 * "Layer placement", says why the ranges are cut as they are. */
#include "engine/placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dolphin/log.h"

#define MIB(b) ((double)(b) / 1048576.0)
#define CPU_KV_CAP ((size_t)1 << 30) /* the CPU's own default pool cap */

#ifdef DOLPHIN_HAVE_CUDA

#include "kernels/kv_layout.h"

/* KV-cache bytes of one block of `layers` layers, each half of the type
 * p resolved: a CUDA stage as kernels/kv_layout.h lays it out; a CPU stage
 * per KV head, each half's run of bs positions rounded up to 16 bytes. */
static size_t kv_block_bytes(const dol_model_config *c, const dol_engine_params *p, int bs, int layers,
                             bool cuda)
{
    if (cuda)
        return (size_t)dol_cuda_kv_geom_of(layers, bs, c->n_kv_heads * c->head_dim, c->head_dim,
                                           p->kv_dtype_k == DOL_KV_Q8_0, p->kv_dtype_v == DOL_KV_Q8_0)
            .block_bytes;
    size_t run = 0;
    for (int w = 0; w < 2; w++)
        run += (size_t)dol_cuda_kv_align((int64_t)bs * (int64_t)dol_kv_head_row_bytes(
                                             w ? p->kv_dtype_v : p->kv_dtype_k, c->head_dim), 16);
    return (size_t)layers * (size_t)c->n_kv_heads * run;
}

/* Device bytes of range r on device dev with n_kv KV blocks. */
static double range_need(const dol_model *m, const dol_engine_params *p, int ctx, int bs,
                         const dol_layer_range *r, int64_t n_kv)
{
    size_t fixed = dol_cuda_backend.range_bytes(m, p, ctx, bs, r, NULL, 0);
    return (double)fixed + (double)n_kv * (double)kv_block_bytes(&m->cfg, p, bs, r->l1 - r->l0, true);
}

/* Cut n blocks into counts proportional to weights w (largest remainder). */
static void proportional(int n, int k, const double *w, int *out)
{
    double sum = 0;
    for (int i = 0; i < k; i++) sum += w[i] > 0 ? w[i] : 0;
    int given = 0;
    double rem[DOL_MAX_DEVICES];
    for (int i = 0; i < k; i++) {
        double share = sum > 0 ? n * (w[i] > 0 ? w[i] : 0) / sum : (double)n / k;
        out[i] = (int)share;
        rem[i] = share - out[i];
        given += out[i];
    }
    while (given < n) {
        int best = 0;
        for (int i = 1; i < k; i++) if (rem[i] > rem[best]) best = i;
        out[best]++;
        rem[best] = -1;
        given++;
    }
}

/* The ranges of counts[i] blocks on devs[i] (zeros dropped), the first
 * holding the embedding, the last the head. */
static void make_ranges(dol_placement *pl, const int *devs, const int *counts, int k, int G, int L)
{
    pl->n = 0;
    int l = 0;
    for (int i = 0; i < k; i++) {
        if (counts[i] <= 0) continue;
        dol_placement_stage *s = &pl->st[pl->n++];
        memset(s, 0, sizeof *s);
        s->cuda = true;
        s->r = (dol_layer_range){ l, l + counts[i], l == 0, false, devs[i] };
        s->avail = pl->avail[i];
        s->total = pl->total[i];
        l += counts[i];
    }
    if (pl->n > 0) pl->st[pl->n - 1].r.head = true;
    pl->head_stage = pl->n - 1;
    if (G < L) {
        dol_placement_stage *s = &pl->st[pl->n++];
        memset(s, 0, sizeof *s);
        s->r = (dol_layer_range){ G, L, G == 0, G == 0, -1 };
        if (G == 0) pl->head_stage = pl->n - 1;
    }
}

/* First GPU stage whose range does not fit its budget with n_kv blocks, or -1. */
static int first_misfit(const dol_placement *pl, const dol_model *m, const dol_engine_params *p, int ctx,
                        int bs, int64_t n_kv, double *need)
{
    for (int i = 0; i < pl->n; i++) {
        if (!pl->st[i].cuda) continue;
        *need = range_need(m, p, ctx, bs, &pl->st[i].r, n_kv);
        if (*need > (double)pl->st[i].avail) return i;
    }
    return -1;
}

int dol_placement_plan(const dol_model *m, const dol_engine_params *p, int ctx, int bs, int64_t want,
                       dol_placement *pl, char *err, size_t errlen)
{
    const dol_model_config *c = &m->cfg;
    const int L = c->n_layers;
    const int max_blocks = (ctx + bs - 1) / bs;
    const int max_seqs = p->max_seqs > 0 ? p->max_seqs : 16;
    const double frac = p->gpu_memory_utilization > 0 ? p->gpu_memory_utilization : 0.90;
    memset(pl, 0, sizeof *pl);

    /* the devices, checked */
    int devs[DOL_MAX_DEVICES], k = p->n_devices > 0 ? p->n_devices : 1;
    const int count = dol_cuda_device_count();
    for (int i = 0; i < k; i++) {
        devs[i] = p->n_devices > 0 ? p->devices[i] : 0;
        if (devs[i] < 0 || devs[i] >= count) {
            dol_set_err(err, errlen, "devices: cuda:%d does not exist (%d CUDA device%s visible)", devs[i],
                        count, count == 1 ? "" : "s");
            return -2;
        }
        for (int j = 0; j < i; j++)
            if (devs[j] == devs[i]) {
                dol_set_err(err, errlen, "devices: cuda:%d is listed twice", devs[i]);
                return -2;
            }
        if (dol_cuda_backend.device_budget(devs[i], frac, &pl->avail[i], &pl->total[i], err, errlen) != 0)
            return -1;
    }
    const int64_t n_kv = want > 0 ? want : max_blocks; /* the KV a range must leave room for */
    const dol_layer_range whole = { 0, L, true, true, devs[0] };
    if (dol_cuda_backend.range_bytes(m, p, ctx, bs, &whole, err, errlen) == SIZE_MAX) return -1;

    /* how many blocks go to the GPUs (G), and to which device */
    int counts[DOL_MAX_DEVICES] = { 0 };
    int G = L;
    const bool explicit_split = p->n_layer_split > 0, explicit_g = p->gpu_layers_set;
    if (explicit_split) {
        if (p->n_layer_split != k) {
            dol_set_err(err, errlen, "layer_split: %d entries for %d device%s (one count per device)",
                        p->n_layer_split, k, k == 1 ? "" : "s");
            return -2;
        }
        G = 0;
        for (int i = 0; i < k; i++) {
            if (p->layer_split[i] < 1) {
                dol_set_err(err, errlen, "layer_split: cuda:%d gets %d blocks (each device needs at least 1)",
                            devs[i], p->layer_split[i]);
                return -2;
            }
            counts[i] = p->layer_split[i];
            G += counts[i];
        }
        if (G > L || (!explicit_g && G != L) || (explicit_g && G != p->gpu_layers)) {
            dol_set_err(err, errlen, "layer_split: the counts add up to %d blocks, but the model has %d "
                        "(with gpu_layers: N they add up to N and the rest runs on the CPU)", G, L);
            if (explicit_g && G <= L)
                dol_set_err(err, errlen, "layer_split: the counts add up to %d blocks, but gpu_layers is %d",
                            G, p->gpu_layers);
            return -2;
        }
    } else if (explicit_g) {
        if (p->gpu_layers < 0 || p->gpu_layers > L) {
            dol_set_err(err, errlen, "gpu_layers: %d is not between 0 and the model's %d blocks", p->gpu_layers, L);
            return -2;
        }
        G = p->gpu_layers;
        double w[DOL_MAX_DEVICES];
        for (int i = 0; i < k; i++) w[i] = (double)pl->avail[i];
        proportional(G, k, w, counts);
    } else {
        double w[DOL_MAX_DEVICES];
        for (int i = 0; i < k; i++) w[i] = (double)pl->avail[i];
        proportional(L, k, w, counts);
    }
    make_ranges(pl, devs, counts, k, G, L);

    double need = 0;
    int bad = first_misfit(pl, m, p, ctx, bs, n_kv, &need);
    if (bad >= 0 && (explicit_split || explicit_g)) {
        const dol_placement_stage *s = &pl->st[bad];
        dol_set_err(err, errlen,
                    "%s: cuda:%d cannot hold blocks %d..%d%s: it needs %.1f MiB (weights and workspaces "
                    "%.1f MiB + KV cache of %lld blocks %.1f MiB), but gpu_memory_utilization %.4g of %.0f "
                    "MiB leaves %.1f MiB: short by %.0f bytes",
                    explicit_split ? "layer_split" : "gpu_layers", s->r.device, s->r.l0, s->r.l1 - 1,
                    s->r.head ? " and the head" : "", MIB(need),
                    MIB(dol_cuda_backend.range_bytes(m, p, ctx, bs, &s->r, NULL, 0)), (long long)n_kv,
                    MIB(need - (double)dol_cuda_backend.range_bytes(m, p, ctx, bs, &s->r, NULL, 0)), frac,
                    MIB(s->total), MIB(s->avail), need - (double)s->avail);
        return -2;
    }
    if (bad >= 0) {
        /* automatic and too big: fill the devices in order with as many
         * blocks as fit (the head reserved on the last one), the rest on
         * the CPU; a device left with none drops out */
        int left = L;
        for (int i = 0; i < k; i++) {
            counts[i] = 0;
            for (int n = 1; n <= left; n++) {
                int start = L - left;
                dol_layer_range r = { start, start + n, start == 0, i == k - 1, devs[i] };
                if (range_need(m, p, ctx, bs, &r, n_kv) > (double)pl->avail[i]) break;
                counts[i] = n;
            }
            left -= counts[i];
        }
        G = L - left;
        /* the last device holding blocks carries the head: shrink it until it fits */
        for (;;) {
            make_ranges(pl, devs, counts, k, G, L);
            bad = first_misfit(pl, m, p, ctx, bs, n_kv, &need);
            if (bad < 0) break;
            int last = -1;
            for (int i = 0; i < k; i++) if (counts[i] > 0) last = i;
            if (last < 0) break;
            counts[last]--;
            G--;
        }
        if (G == 0) {
            double one = range_need(m, p, ctx, bs, &(dol_layer_range){ 0, 1, true, true, devs[0] }, n_kv);
            dol_set_err(err, errlen,
                        "cuda: model %s does not fit: one block with the embedding and the head needs "
                        "%.1f MiB on cuda:%d (KV cache of %lld blocks included), but "
                        "gpu_memory_utilization %.4g of %.0f MiB leaves %.1f MiB: short by %.1f MiB",
                        m->name, MIB(one), devs[0], (long long)n_kv, frac, MIB(pl->total[0]),
                        MIB(pl->avail[0]), MIB(one - (double)pl->avail[0]));
            return -1;
        }
        pl->spilled = true;
        if (p->no_host_spill) {
            double whole = 0, have = 0;
            for (int i = 0; i < k; i++) have += (double)pl->avail[i];
            int prop[DOL_MAX_DEVICES];
            double w[DOL_MAX_DEVICES];
            for (int i = 0; i < k; i++) w[i] = (double)pl->avail[i];
            proportional(L, k, w, prop);
            dol_placement all;
            memcpy(&all, pl, sizeof all);
            make_ranges(&all, devs, prop, k, L, L);
            for (int i = 0; i < all.n; i++) whole += range_need(m, p, ctx, bs, &all.st[i].r, n_kv);
            dol_set_err(err, errlen,
                        "allow_host_spill: false: model %s needs %.1f MiB on %d GPU%s (%d blocks, KV cache "
                        "of %lld blocks), gpu_memory_utilization %.4g leaves %.1f MiB: only %d of %d blocks "
                        "fit, short by %.0f bytes; refusing to run the other %d on the CPU",
                        m->name, MIB(whole), k, k == 1 ? "" : "s", L, (long long)n_kv, frac, MIB(have), G, L,
                        whole - have, L - G);
            return -2;
        }
    }

    /* the KV pool: as asked, else all that fits on every GPU stage, at most
     * max_seqs full contexts, and no more than the CPU's own cap */
    int64_t blocks = want;
    if (blocks <= 0) {
        blocks = (int64_t)max_seqs * max_blocks;
        for (int i = 0; i < pl->n; i++) {
            const dol_placement_stage *s = &pl->st[i];
            const int nl = s->r.l1 - s->r.l0;
            if (nl == 0) continue;
            if (s->cuda) {
                double room = (double)s->avail - (double)dol_cuda_backend.range_bytes(m, p, ctx, bs, &s->r, NULL, 0);
                int64_t fit = (int64_t)(room / (double)kv_block_bytes(c, p, bs, nl, true));
                if (fit < blocks) blocks = fit;
            } else {
                int64_t cap = (int64_t)(CPU_KV_CAP / kv_block_bytes(c, p, bs, nl, false));
                if (cap < max_blocks) cap = max_blocks;
                if (cap < blocks) blocks = cap;
            }
        }
    }
    pl->n_blocks = (int)blocks;
    for (int i = 0; i < pl->n; i++) {
        dol_placement_stage *s = &pl->st[i];
        if (s->cuda) snprintf(s->name, sizeof s->name, "cuda:%d", s->r.device);
        else snprintf(s->name, sizeof s->name, "cpu");
        s->kv_block_bytes = kv_block_bytes(c, p, bs, s->r.l1 - s->r.l0, s->cuda);
    }
    return 0;
}

/* ---- the placed backend ------------------------------------------------------ */

typedef struct {
    dol_placement pl;
    void *impl[DOL_PLACEMENT_MAX_STAGES];
    bool peer[DOL_PLACEMENT_MAX_STAGES]; /* stage i reads stage i-1's device buffer */
    float *h[2];                         /* the residual stream between stages (pinned) */
    int d, block_size;
} placed;

static const dol_backend_ops *ops_of(const dol_placement_stage *s)
{
    return s->cuda ? &dol_cuda_backend : &dol_cpu_backend;
}

static void placed_destroy(void *impl)
{
    placed *e = impl;
    if (!e) return;
    for (int i = 0; i < e->pl.n; i++)
        if (e->impl[i]) ops_of(&e->pl.st[i])->destroy(e->impl[i]);
    for (int b = 0; b < 2; b++) dol_cuda_host_free(e->h[b]);
    free(e);
}

static int placed_create(const dol_model *m, const dol_engine_params *p, int ctx, int bs, int *n_blocks,
                         void **out, char *err, size_t errlen)
{
    placed *e = calloc(1, sizeof *e);
    if (!e) { dol_set_err(err, errlen, "engine: out of memory"); return -1; }
    int rc = dol_placement_plan(m, p, ctx, bs, *n_blocks, &e->pl, err, errlen);
    if (rc != 0) {
        free(e);
        return rc;
    }
    e->d = m->cfg.hidden_size;
    e->block_size = bs;
    const size_t hbytes = sizeof(float) * (size_t)m->cfg.hidden_size *
                          (size_t)(p->max_batch_tokens > 0 ? p->max_batch_tokens : 2048);
    for (int b = 0; b < 2; b++) {
        e->h[b] = dol_cuda_host_alloc(hbytes);
        if (!e->h[b]) {
            dol_set_err(err, errlen, "engine: cannot allocate %zu bytes of pinned host memory", hbytes);
            placed_destroy(e);
            return -1;
        }
    }
    for (int i = 0; i < e->pl.n; i++) {
        dol_placement_stage *s = &e->pl.st[i];
        int nb = e->pl.n_blocks;
        if (ops_of(s)->create_range(m, p, ctx, bs, &s->r, &nb, &e->impl[i], err, errlen) != 0) {
            placed_destroy(e);
            return -1;
        }
        if (nb != e->pl.n_blocks) {
            dol_set_err(err, errlen, "engine: %s holds %d KV blocks, not %d", s->name, nb, e->pl.n_blocks);
            placed_destroy(e);
            return -1;
        }
        s->weight_bytes = ops_of(s)->weight_bytes(e->impl[i]);
        /* a step reads the embedding row by row, every other weight whole */
        s->step_read_bytes = s->weight_bytes;
        if (s->r.embed && !(s->r.head && m->lm_head.data == m->embed.data))
            s->step_read_bytes -= s->cuda && !dol_dtype_is_block(m->embed.dtype)
                                      ? (size_t)(m->embed.rows * m->embed.cols) * 2
                                      : dol_tensor_bytes(&m->embed);
        if (i > 0 && s->cuda && e->pl.st[i - 1].cuda)
            e->peer[i] = dol_cuda_peer_enable(s->r.device, e->pl.st[i - 1].r.device);
    }
    /* the log: one line per device, then the whole */
    const dol_model_config *c = &m->cfg;
    for (int i = 0; i < e->pl.n; i++) {
        const dol_placement_stage *s = &e->pl.st[i];
        const bool head = s->r.head || (i == e->pl.head_stage);
        dol_log(DOL_LOG_INFO, "placement",
                "device=%s blocks=%d..%d n_blocks=%d embed=%d head=%d weight_bytes=%zu kv_bytes=%zu "
                "budget_bytes=%zu step_read_bytes=%zu kv_read_bytes_per_context_token=%zu input=%s",
                s->name, s->r.l0, s->r.l1 - 1, s->r.l1 - s->r.l0, s->r.embed ? 1 : 0, head ? 1 : 0,
                s->weight_bytes, s->kv_block_bytes * (size_t)e->pl.n_blocks, s->cuda ? s->avail : 0,
                s->step_read_bytes, s->kv_block_bytes / (size_t)bs,
                i == 0 ? "tokens" : e->peer[i] ? "peer" : "pinned_host");
    }
    dol_log(DOL_LOG_INFO, "placement_done",
            "stages=%d gpu_blocks=%d cpu_blocks=%d layers=%d kv_blocks=%d head=%s spilled=%d", e->pl.n,
            e->pl.st[e->pl.n - 1].cuda ? c->n_layers : e->pl.st[e->pl.n - 1].r.l0,
            e->pl.st[e->pl.n - 1].cuda ? 0 : c->n_layers - e->pl.st[e->pl.n - 1].r.l0, c->n_layers,
            e->pl.n_blocks, e->pl.st[e->pl.head_stage].name, e->pl.spilled ? 1 : 0);
    *n_blocks = e->pl.n_blocks;
    *out = e;
    return 0;
}

static int placed_forward(void *impl, const dol_forward_args *a, char *err, size_t errlen)
{
    placed *e = impl;
    const int n = e->pl.n;
    for (int i = 0; i < n; i++) {
        const dol_placement_stage *s = &e->pl.st[i];
        dol_forward_args b = *a;
        b.h_in = i > 0 ? e->h[(i - 1) & 1] : NULL;
        if (i > 0 && e->peer[i]) {
            b.peer_in = dol_cuda_backend.hidden_dev(e->impl[i - 1]);
            b.peer_dev = e->pl.st[i - 1].r.device;
        }
        /* a range without the head hands on: in host memory unless the next reads it by peer copy */
        const bool logits_here = i == n - 1 && s->r.head;
        b.h_out = logits_here || (i + 1 < n && e->peer[i + 1]) ? NULL : e->h[i & 1];
        if (ops_of(s)->forward(e->impl[i], &b, err, errlen) != 0) return -1;
    }
    if (!e->pl.st[n - 1].r.head) { /* the head on the last GPU, after the CPU's blocks */
        const int hs = e->pl.head_stage;
        dol_forward_args b = *a;
        b.h_in = e->h[(n - 1) & 1];
        b.head_only = true;
        if (dol_cuda_backend.forward(e->impl[hs], &b, err, errlen) != 0) return -1;
    }
    return 0;
}

static void placed_copy_block(void *impl, int32_t src, int32_t dst, int rows)
{
    placed *e = impl;
    for (int i = 0; i < e->pl.n; i++) ops_of(&e->pl.st[i])->copy_block(e->impl[i], src, dst, rows);
}

static size_t placed_weight_bytes(void *impl)
{
    placed *e = impl;
    size_t b = 0;
    for (int i = 0; i < e->pl.n; i++) b += e->pl.st[i].weight_bytes;
    return b;
}

static void placed_quant_stats(void *impl, dol_quant_stats *out)
{
    placed *e = impl;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < e->pl.n; i++) {
        dol_quant_stats q;
        memset(&q, 0, sizeof q);
        const dol_backend_ops *o = ops_of(&e->pl.st[i]);
        if (o->quant_stats) o->quant_stats(e->impl[i], &q);
        out->n_quantized += q.n_quantized;
        out->quant_seconds += q.quant_seconds;
        out->quant_bytes_before += q.quant_bytes_before;
        out->quant_bytes_after += q.quant_bytes_after;
        out->linear_bytes += q.linear_bytes;
        out->linear_f16_bytes += q.linear_f16_bytes;
    }
}

static size_t placed_kv_bytes_per_token(void *impl)
{
    placed *e = impl;
    size_t b = 0;
    for (int i = 0; i < e->pl.n; i++) b += e->pl.st[i].kv_block_bytes / (size_t)e->block_size;
    return b;
}

/* dol_engine_memory_info takes the devices' figures (dol_placement_devices) instead. */
static int placed_memory_info(void *impl, size_t *used, size_t *total)
{
    (void)impl; (void)used; (void)total;
    return -1;
}

/* "f16" (the CUDA stages), "f16+int8" when a host stage runs 8-bit
 * activations (quantized weights there, activations auto / int8). */
static const char *placed_activations(void *impl)
{
    placed *e = impl;
    for (int i = 0; i < e->pl.n; i++) {
        const dol_backend_ops *o = ops_of(&e->pl.st[i]);
        if (!e->pl.st[i].cuda && o->activations && strcmp(o->activations(e->impl[i]), "int8") == 0)
            return "f16+int8";
    }
    return "f16";
}

const dol_backend_ops dol_placed_backend = {
    .name = "cuda",
    .kv_no_f32 = true,
    .create = placed_create,
    .destroy = placed_destroy,
    .forward = placed_forward,
    .copy_block = placed_copy_block,
    .weight_bytes = placed_weight_bytes,
    .quant_stats = placed_quant_stats,
    .activations = placed_activations,
    .kv_bytes_per_token = placed_kv_bytes_per_token,
    .memory_info = placed_memory_info,
};

int dol_placement_devices(void *impl, int kv_used_blocks, dol_device_memory *out, int max)
{
    placed *e = impl;
    int n = 0;
    for (int i = 0; i < e->pl.n && n < max; i++, n++) {
        const dol_placement_stage *s = &e->pl.st[i];
        dol_device_memory *d = &out[n];
        memset(d, 0, sizeof *d);
        snprintf(d->name, sizeof d->name, "%s", s->name);
        d->first_block = s->r.l0;
        d->n_blocks = s->r.l1 - s->r.l0;
        d->embed = s->r.embed;
        d->head = i == e->pl.head_stage;
        d->weight_bytes = s->weight_bytes;
        d->kv_bytes = s->kv_block_bytes * (size_t)e->pl.n_blocks;
        d->step_read_bytes = s->step_read_bytes;
        if (!s->cuda || dol_cuda_backend.memory_info(e->impl[i], &d->used, &d->total) != 0) {
            d->total = d->kv_bytes;
            d->used = s->kv_block_bytes * (size_t)kv_used_blocks;
        }
    }
    return n;
}

#endif /* DOLPHIN_HAVE_CUDA */
