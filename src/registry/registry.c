/* src/registry/registry.c — owns the models of include/dolphin/models.h: the
 * entries and their states, the load threads (checkpoint, tokenizer, engine,
 * scheduler, warm-up), the waiters of a loading model, least-recently-used
 * unloading under max_loaded_models and memory_budget_bytes, the load
 * timeout and the back-off after a failure. docs/architecture.md describes
 * the life of a model. */
#include "dolphin/models.h"

#include <ctype.h>
#include <dirent.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "dolphin/engine.h"
#include "dolphin/log.h"

#define MAX_BACKOFF_S 600.0
#define NO_ROOM_RETRY_S 1.0
/* a request woken by its model's load that has not come back for its lease
 * within this long is forgotten (it keeps the model from being unloaded) */
#define WOKEN_GRACE_MS 10000.0

typedef struct {
    void (*wake)(void *user);
    void *user;
    double deadline_ms;
    double woken_ms;             /* > 0: woken by a finished load, not yet back */
} waiter;

typedef struct {
    dol_model *model;
    dol_tokenizer *tok;
    dol_engine *engine;
    dol_scheduler *sched;
    /* speculative mode draft: the draft entry's checkpoint, loaded beside
     * this model and held as long as it is */
    dol_model *draft_model;
    dol_tokenizer *draft_tok;
    dol_engine *draft_engine;
} objects;

typedef struct {
    const dol_model_entry *cfg;
    bool startup;
    dol_model_state state;
    objects o;
    int context_len;
    size_t bytes;                /* measured at the last load; 0 = never loaded */
    const char *backend;
    const char *activations;     /* dol_engine_activations once loaded */
    char format[16];             /* the linear weights as held: f32, f16, bf16, nf4 */
    const char *file_format;     /* the checkpoint's: "safetensors", "gguf" (once loaded) */
    char file_types[192];        /* the checkpoint's tensor types (dol_model.type_mix) */
    int leases;
    double last_used_ms;
    /* the load in progress (or the last one) */
    bool thread_live;            /* a load thread runs for this entry */
    bool abandoned;              /* past load_timeout_s: it discards what it loads */
    bool reserved;               /* loading, past make_room: counts as loaded */
    bool making_room;            /* in make_room, which ends itself at the deadline */
    double load_started_ms, load_deadline_ms;
    int failures;                /* in a row */
    double retry_at_ms;
    char error[DOL_ERR_LEN];
    bool error_config;
    waiter *w;
    int n_w, cap_w;
    uint64_t loads, load_failures, unloads;
    double load_seconds_total, last_load_s;
    /* the scheduler counters of the loads already gone (counters_add), so
     * that the model's _total figures carry on across unload and reload */
    dol_scheduler_stats gone;
} entry;

struct dol_models {
    const dol_config *cfg;
    int threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* room may have been made; a load thread ended */
    entry *e;
    int n;
    int n_threads;               /* load threads still running */
    bool draining;
    atomic_bool stopping;
    atomic_int warming;          /* start-up models in their warm-up */
    char draft_err[DOL_ERR_LEN]; /* a draft model of another vocabulary, found at start */
};

const char *dol_model_state_name(dol_model_state s)
{
    switch (s) {
    case DOL_MODEL_LOADING: return "loading";
    case DOL_MODEL_LOADED: return "loaded";
    case DOL_MODEL_FAILED: return "failed";
    default: return "unloaded";
    }
}

/* ---- waking waiters (outside the lock) ----------------------------------- */

typedef struct {
    waiter *w;
    int n;
} wake_list;

/* Take every waiter of e (lock held); wake them later with wake_all. */
static wake_list take_waiters(entry *e)
{
    wake_list l = {e->w, e->n_w};
    e->w = NULL;
    e->n_w = e->cap_w = 0;
    return l;
}

/* Wake every waiter of e but keep them listed, marked woken (lock held): a
 * model just loaded for them is not unloaded before they take their leases. */
static wake_list wake_keep(entry *e, double now)
{
    wake_list l = {NULL, 0};
    if (e->n_w == 0) return l;
    l.w = malloc((size_t)e->n_w * sizeof *l.w);
    if (!l.w) return take_waiters(e);   /* no copy: hand them over as before */
    for (int k = 0; k < e->n_w; k++) {
        e->w[k].woken_ms = now;
        l.w[l.n++] = e->w[k];
    }
    return l;
}

/* Drop the waiter `user` of e, if listed (lock held). */
static void drop_waiter(entry *e, void *user)
{
    for (int k = 0; k < e->n_w; k++)
        if (e->w[k].user == user) e->w[k--] = e->w[--e->n_w];
}

/* Whether `user` waits for e (lock held). */
static bool has_waiter(const entry *e, void *user)
{
    for (int k = 0; k < e->n_w; k++)
        if (e->w[k].user == user) return true;
    return false;
}

static void wake_all(wake_list *l)
{
    for (int i = 0; i < l->n; i++) l->w[i].wake(l->w[i].user);
    free(l->w);
    l->w = NULL;
    l->n = 0;
}

/* ---- objects ------------------------------------------------------------- */

static void objects_free(objects *o)
{
    dol_scheduler_free(o->sched);   /* ends whatever is left with 503 */
    dol_engine_free(o->draft_engine);
    dol_tokenizer_free(o->draft_tok);
    dol_model_free(o->draft_model);
    dol_engine_free(o->engine);
    dol_tokenizer_free(o->tok);
    dol_model_free(o->model);
    memset(o, 0, sizeof *o);
}

/* Weights plus the KV pool: what a loaded model holds. */
static size_t engine_bytes(const dol_engine *g)
{
    if (!g) return 0;
    return dol_engine_weight_bytes(g) +
           (size_t)dol_engine_kv_blocks_total(g) * (size_t)dol_engine_kv_block_size(g) * dol_engine_kv_bytes_per_token(g);
}

/* ... and a draft model's. */
static size_t objects_bytes(const objects *o)
{
    return o->engine ? engine_bytes(o->engine) + engine_bytes(o->draft_engine) : 0;
}

/* Before the first load: the checkpoint's size on disk (its .safetensors
 * files, or the GGUF file); after it, what the model held last time. */
static size_t estimate_bytes(const entry *e)
{
    if (e->bytes) return e->bytes;
    struct stat fst;
    if (stat(e->cfg->path, &fst) == 0 && S_ISREG(fst.st_mode)) return (size_t)fst.st_size;
    size_t sum = 0;
    DIR *d = opendir(e->cfg->path);
    if (!d) return 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len < 12 || strcmp(de->d_name + len - 12, ".safetensors") != 0) continue;
        char p[1400];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", e->cfg->path, de->d_name);
        if (stat(p, &st) == 0) sum += (size_t)st.st_size;
    }
    closedir(d);
    return sum;
}

/* ---- loading -------------------------------------------------------------- */

/* One warm-up generation: n_prompt tokens (BOS, then arbitrary ids), n
 * choices, max_tokens each, greedy. 0 done, 1 skipped (the shape does not
 * fit), 2 interrupted (stopping), -1 failed (err). */
static int warm_one(dol_models *m, dol_scheduler *sched, const dol_model *mdl, int n_prompt,
                    int n, int max_tokens, char *err, size_t errlen)
{
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_prompt);
    dol_output *out = calloc((size_t)n, sizeof *out);
    if (!ids || !out) {
        free(ids);
        free(out);
        dol_set_err(err, errlen, "warm-up: out of memory");
        return -1;
    }
    ids[0] = mdl->cfg.bos_token_id;
    for (int i = 1; i < n_prompt; i++) ids[i] = (int32_t)((13 + 17 * i) % mdl->cfg.vocab_size);
    char id[64];
    snprintf(id, sizeof id, "warmup-%dx%d", n_prompt, n);
    dol_request_params p = {.prompt_ids = ids, .n_prompt = n_prompt, .n = n,
                            .max_tokens = max_tokens, .ignore_eos = true, .logprobs = -1,
                            .id = id};
    dol_sampling_params_default(&p.sampling);
    p.sampling.temperature = 0.0f;
    dol_request *r = dol_request_create(&p);
    free(ids);
    if (!r) {
        free(out);
        dol_set_err(err, errlen, "warm-up: out of memory");
        return -1;
    }
    int rc = 0;
    dol_request_state st = {0};
    dol_reason sr = dol_scheduler_submit(sched, r, NULL);
    if (sr != DOL_REASON_NONE) {
        bool no_fit = sr == DOL_REASON_CONTEXT_OVERFLOW || sr == DOL_REASON_KV_OVERFLOW ||
                      sr == DOL_REASON_TOO_MANY_CHOICES;
        if (!no_fit) dol_set_err(err, errlen, "warm-up refused: %s", dol_reason_name(sr));
        rc = no_fit ? 1 : -1;
        goto out;
    }
    for (;;) {
        if (dol_request_read(r, out, &st) != 0) {
            dol_set_err(err, errlen, "warm-up: out of memory");
            dol_request_cancel(r);
            rc = -1;
            break;
        }
        if (st.done) break;
        if (atomic_load(&m->stopping)) {
            dol_request_cancel(r);
            rc = 2;
            break;
        }
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    if (rc == 0 && st.error.reason != DOL_REASON_NONE) {
        dol_set_err(err, errlen, "warm-up failed: %s", dol_reason_name(st.error.reason));
        rc = -1;
    }
out:
    dol_output_free(out, n);
    free(out);
    dol_request_state_free(&st);
    dol_request_release(r);
    return rc;
}

/* What the warm-up must prove before ready, in one request: a one-token
 * prompt (the single-sequence forward pass, which touches every weight and
 * the sampler) forked into a full decode batch of max_batch_size sequences
 * that decodes one step (the batched pass, the fork and the KV blocks of a
 * full batch). Two forward passes in all; prefill chunks of other lengths
 * run the same layers and kernels that the unit tests check, so they are
 * not repeated here (docs/deployment.md, "dolphind's life cycle"). When the batch cannot
 * fit the KV pool, the prompt decodes alone. 0 ok, 2 interrupted, -1
 * failed. */
static int warm_up(dol_models *m, const char *name, dol_scheduler *sched, const dol_model *mdl,
                   char *err, size_t errlen)
{
    const dol_config *cfg = m->cfg;
    double t0 = dol_now_ms();
    const int batch = cfg->max_batch_size;
    int full = batch > 1 ? warm_one(m, sched, mdl, 1, batch, 2, err, errlen) : 1;
    if (full == 2 || full < 0) return full;
    if (full == 1) {
        int rc = warm_one(m, sched, mdl, 1, 1, 2, err, errlen);
        if (rc == 1) return -1;   /* the smallest shape must fit */
        if (rc != 0) return rc;
    }
    dol_log(DOL_LOG_INFO, "warmed_up", "model=%s shapes=%s prompt_tokens=1 batch=%d ms=%.0f", DOL_LOG_Q(name),
            full == 0 ? "single,batch" : "single", full == 0 ? batch : 1, dol_now_ms() - t0);
    return 0;
}

/* Settings only the model's context length can judge: context_len above
 * max_position_embeddings is clamped (with a warning); a default
 * max_tokens that leaves no room for a prompt is refused. */
static int check_context(const dol_config *cfg, const dol_model_entry *me,
                         const dol_model_config *mc, char *err, size_t errlen)
{
    int ctx = mc->max_position_embeddings;
    const char *from = "max_position_embeddings";
    if (me->context_len > ctx) {
        dol_log(DOL_LOG_WARN, "context_len_clamped",
                "model=%s context_len=%d max_position_embeddings=%d using=%d", DOL_LOG_Q(me->name),
                me->context_len, ctx, ctx);
    } else if (me->context_len > 0) {
        ctx = me->context_len;
        from = "context_len";
    }
    int mt = cfg->max_tokens;
    if (cfg->max_tokens_cap > 0 && cfg->max_tokens_cap < mt) mt = cfg->max_tokens_cap;
    if (mt < ctx) return 0;
    if (mt != cfg->max_tokens)
        dol_set_err(err, errlen, "max_tokens_cap %d (capping the default max_tokens %d) leaves no "
                    "room for a prompt in the context of %d tokens (%s): it must be below %d",
                    mt, cfg->max_tokens, ctx, from, ctx);
    else
        dol_set_err(err, errlen, "max_tokens %d (the default for completions) leaves no room for "
                    "a prompt in the context of %d tokens (%s): it must be below %d", mt, ctx,
                    from, ctx);
    return -1;
}

/* The tokenizer must not make ids the model has no embedding row for. */
static int check_vocab(const char *dir, const dol_model *mdl, const dol_tokenizer *tok,
                       char *err, size_t errlen)
{
    int n = dol_tokenizer_vocab_size(tok);
    if (n <= mdl->cfg.vocab_size) return 0;
    dol_set_err(err, errlen, "%s/tokenizer.model: %d pieces, more than %s/config.json field "
                "vocab_size %d: the tokenizer does not belong to this model", dir, n, dir,
                mdl->cfg.vocab_size);
    return -1;
}

/* A draft model must share the model's vocabulary: the same number of
 * embedding rows and the same piece for every id. */
static int check_same_vocab(const dol_model_entry *me, const objects *o, const dol_model_entry *de, char *err,
                            size_t errlen)
{
    const int nv = o->model->cfg.vocab_size, dv = o->draft_model->cfg.vocab_size;
    const int nt = dol_tokenizer_vocab_size(o->tok), dt = dol_tokenizer_vocab_size(o->draft_tok);
    int diff = -1;
    for (int id = 0; nt == dt && id < nt && diff < 0; id++)
        if (strcmp(dol_tokenizer_id_to_piece(o->tok, id), dol_tokenizer_id_to_piece(o->draft_tok, id)) != 0)
            diff = id;
    if (nv == dv && nt == dt && diff < 0) return 0;
    if (nv != dv || nt != dt)
        dol_set_err(err, errlen, "model '%s' (%s): speculative draft_model '%s' (%s) has another vocabulary: "
                    "%d tokens (%d pieces) against %d (%d pieces); a draft model must share the tokenizer",
                    me->name, me->path, de->name, de->path, dv, dt, nv, nt);
    else
        dol_set_err(err, errlen, "model '%s' (%s): speculative draft_model '%s' (%s) has another vocabulary: "
                    "token %d is '%s' there, '%s' here; a draft model must share the tokenizer",
                    me->name, me->path, de->name, de->path, diff, dol_tokenizer_id_to_piece(o->draft_tok, diff),
                    dol_tokenizer_id_to_piece(o->tok, diff));
    return -1;
}

/* What can be checked before room is made, cheaply: the checkpoint opened
 * and validated (config.json, the safetensors headers; memory-mapped only),
 * the context settings, the tokenizer. A broken entry thus never unloads
 * another model. Fills o->model and o->tok (nothing held on failure). 0, or
 * -1 with err (*config_error: a setting is at fault). No lock held. */
static int open_checkpoint(dol_models *m, const dol_model_entry *me, bool with_draft, objects *o, char *err,
                           size_t errlen, bool *config_error)
{
    const dol_config *cfg = m->cfg;
    memset(o, 0, sizeof *o);
    /* a GGUF file that cannot be served is the setting at fault (exit 2):
     * every refusal names the file and the key or tensor */
    bool gguf = dol_model_path_is_gguf(me->path);
    if (dol_model_load(me->path, &o->model, err, errlen) != 0) {
        *config_error = gguf;
        goto fail;
    }
    snprintf(o->model->name, sizeof o->model->name, "%s", me->name);
    if (check_context(cfg, me, &o->model->cfg, err, errlen) != 0) {
        *config_error = true;
        goto fail;
    }
    if (o->model->format == DOL_MODEL_GGUF) {
        if (dol_model_tokenizer(o->model, &o->tok, err, errlen) != 0) {
            *config_error = true;
            goto fail;
        }
    } else {
        char tok_path[1200];
        snprintf(tok_path, sizeof tok_path, "%s/tokenizer.model", me->path);
        if (dol_tokenizer_load(tok_path, &o->tok, err, errlen) != 0) goto fail;
    }
    if (check_vocab(me->path, o->model, o->tok, err, errlen) != 0) goto fail;
    if (with_draft && me->speculative_mode == DOL_SPEC_DRAFT && me->draft_index >= 0) {
        const dol_model_entry *de = &cfg->models[me->draft_index];
        objects d;
        if (open_checkpoint(m, de, false, &d, err, errlen, config_error) != 0) {
            char why[DOL_ERR_LEN];
            snprintf(why, sizeof why, "%s", err);
            dol_set_err(err, errlen, "model '%s': its speculative draft_model '%s': %s", me->name, de->name, why);
            goto fail;
        }
        o->draft_model = d.model;
        o->draft_tok = d.tok;
        if (check_same_vocab(me, o, de, err, errlen) != 0) {
            *config_error = true;
            goto fail;
        }
    }
    return 0;
fail:
    objects_free(o);
    return -1;
}

/* The engine settings of entry me. */
static void engine_params(const dol_models *m, const dol_model_entry *me, dol_engine_params *ep)
{
    const dol_config *cfg = m->cfg;
    memset(ep, 0, sizeof *ep);
    ep->n_threads = m->threads;
    ep->kv_block_size = cfg->kv_block_size;
    ep->kv_cache_tokens = cfg->kv_cache_tokens;
    ep->prefix_caching = cfg->prefix_caching;
    ep->fast_prefill = !cfg->batch_invariant;
    ep->kv_cache_bytes = cfg->kv_cache_bytes;
    ep->kv_dtype = me->kv_cache_dtype;
    ep->kv_dtype_k = me->kv_cache_dtype_k;
    ep->kv_dtype_v = me->kv_cache_dtype_v;
    ep->kv_memory_fraction = cfg->kv_cache_memory_fraction;
    ep->max_seqs = cfg->max_batch_size + 1;
    ep->max_batch_tokens = cfg->prefill_chunk + cfg->max_batch_size;
    ep->context_len = me->context_len;
    ep->weights = me->weights;
    ep->quantize_lm_head = me->quantize_lm_head;
    ep->activations = me->activations;
    ep->backend = me->backend;
    ep->gpu_memory_utilization = me->gpu_memory_utilization;
    ep->n_devices = me->devices.n;
    memcpy(ep->devices, me->devices.v, sizeof ep->devices);
    ep->n_layer_split = me->layer_split.n;
    memcpy(ep->layer_split, me->layer_split.v, sizeof ep->layer_split);
    ep->gpu_layers_set = me->gpu_layers >= 0;
    ep->gpu_layers = me->gpu_layers;
    ep->no_host_spill = !me->allow_host_spill;
    ep->weights_cache_dir = me->weights_cache_dir;
}

/* The draft model of entry me beside it (o->draft_model, opened by
 * open_checkpoint): its own engine on the backend the model's entry asks
 * for, with a KV pool for max_seqs contexts of the model's length (or
 * kv_cache_tokens, when smaller), no prefix cache. Made before the model's
 * engine, so that the model's share of the memory counts it. 0, or -1 with
 * err. */
static int load_draft(dol_models *m, const dol_model_entry *me, objects *o, char *err, size_t errlen,
                      bool *config_error)
{
    const dol_model_entry *de = &m->cfg->models[me->draft_index];
    dol_engine_params ep;
    engine_params(m, de, &ep);
    ep.backend = me->backend;
    ep.prefix_caching = false;
    ep.kv_cache_bytes = 0;
    int ctx = o->model->cfg.max_position_embeddings;   /* the model's context, as its engine takes it */
    if (me->context_len > 0 && me->context_len < ctx) ctx = me->context_len;
    if (ctx > o->draft_model->cfg.max_position_embeddings)
        ctx = o->draft_model->cfg.max_position_embeddings;  /* longer sequences do not propose */
    if (de->context_len > 0 && de->context_len < ctx) ctx = de->context_len;
    ep.context_len = ctx;
    ep.kv_cache_tokens = (int64_t)ep.max_seqs * ctx;
    if (m->cfg->kv_cache_tokens > 0 && m->cfg->kv_cache_tokens < ep.kv_cache_tokens)
        ep.kv_cache_tokens = m->cfg->kv_cache_tokens;
    char why[DOL_ERR_LEN];
    int erc = dol_engine_create(o->draft_model, &ep, &o->draft_engine, why, sizeof why);
    if (erc != 0) {
        *config_error = erc == -2;
        dol_set_err(err, errlen, "model '%s': its speculative draft_model '%s': %s", me->name, de->name, why);
        return -1;
    }
    dol_model_drop_copies(o->draft_model);
    dol_log(DOL_LOG_INFO, "draft_model_loaded",
            "model=%s draft_model=%s path=%s backend=%s activations=%s weight_bytes=%zu kv_tokens=%lld ctx=%d",
            DOL_LOG_Q(me->name), DOL_LOG_Q(de->name), DOL_LOG_Q(de->path), dol_engine_backend_name(o->draft_engine),
            dol_engine_activations(o->draft_engine), dol_engine_weight_bytes(o->draft_engine),
            (long long)dol_engine_kv_blocks_total(o->draft_engine) * dol_engine_kv_block_size(o->draft_engine),
            dol_engine_context_len(o->draft_engine));
    return 0;
}

/* Finish loading entry me into o, opened by open_checkpoint: engine,
 * scheduler, warm-up (nothing held on failure). 0, or -1 with err
 * (*config_error: a setting is at fault). No lock held. */
static int load_objects(dol_models *m, const dol_model_entry *me, bool startup, objects *o,
                        char *err, size_t errlen, bool *config_error)
{
    const dol_config *cfg = m->cfg;
    double t0 = dol_now_ms();
    if (o->draft_model && load_draft(m, me, o, err, errlen, config_error) != 0) goto fail;
    dol_engine_params ep;
    engine_params(m, me, &ep);
    int erc = dol_engine_create(o->model, &ep, &o->engine, err, errlen);
    if (erc != 0) {
        if (erc == -2) *config_error = true;   /* a placement setting at fault: exit 2 */
        goto fail;
    }
    /* the engine holds the linear layers in its own format now: the model's
     * copies of them (a GGUF file's un-permuted attn_q / attn_k) can go */
    size_t dropped = dol_model_drop_copies(o->model);
    if (dropped > 0)
        dol_log(DOL_LOG_INFO, "model_copies_freed", "model=%s bytes=%zu", DOL_LOG_Q(me->name), dropped);

    dol_scheduler_params sp = {0};
    sp.max_batch_size = cfg->max_batch_size;
    sp.batch_window_ms = cfg->batch_window_ms;
    sp.mode = cfg->batch_mode;
    sp.max_queue = cfg->max_queue;
    sp.memory_high_watermark = cfg->memory_high_watermark;
    sp.prefill_chunk = cfg->prefill_chunk;
    sp.end_ids = o->model->cfg.eos_token_ids;
    sp.n_end_ids = o->model->cfg.n_eos_token_ids;
    sp.spec_mode = me->speculative_mode;
    sp.spec_max_draft = me->speculative_max_draft;
    sp.spec_ngram = me->speculative_ngram;
    sp.spec_min_acceptance = me->speculative_min_acceptance;
    sp.spec_draft = o->draft_engine;
    if (dol_scheduler_create(o->engine, o->tok, &sp, &o->sched, err, errlen) != 0) goto fail;
    /* the halves' names ("k=q8_0,v=f16") are quoted when they differ */
    const char *kvq = strchr(dol_engine_kv_dtype_name(o->engine), '=') ? "\"" : "";
    dol_log(DOL_LOG_INFO, "model_loaded",
            "backend=%s cpu_kernels=%s activations=%s model=%s path=%s file_format=%s file_types=\"%s\" "
            "layers=%d hidden=%d heads=%d kv_heads=%d "
            "vocab=%d ctx=%d weight_bytes=%zu kv_blocks=%d kv_block_size=%d kv_cache_dtype=%s%s%s "
            "kv_cache_dtype_k=%s kv_cache_dtype_v=%s kv_tokens=%lld kv_contexts=%.2f kv_bytes=%zu threads=%d load_ms=%.0f",
            dol_engine_backend_name(o->engine), dol_engine_cpu_kernels(),
            dol_engine_activations(o->engine), DOL_LOG_Q(me->name), DOL_LOG_Q(me->path),
            dol_model_format_name(o->model->format), o->model->type_mix, o->model->cfg.n_layers, o->model->cfg.hidden_size, o->model->cfg.n_heads,
            o->model->cfg.n_kv_heads, o->model->cfg.vocab_size, dol_engine_context_len(o->engine),
            dol_engine_weight_bytes(o->engine), dol_engine_kv_blocks_total(o->engine),
            dol_engine_kv_block_size(o->engine), kvq, dol_engine_kv_dtype_name(o->engine), kvq,
            dol_kv_dtype_str(dol_engine_kv_dtype(o->engine, 0)),
            dol_kv_dtype_str(dol_engine_kv_dtype(o->engine, 1)), (long long)dol_engine_kv_blocks_total(o->engine) * dol_engine_kv_block_size(o->engine),
            (double)dol_engine_kv_blocks_total(o->engine) * dol_engine_kv_block_size(o->engine) /
                dol_engine_context_len(o->engine),
            (size_t)dol_engine_kv_blocks_total(o->engine) * dol_engine_kv_block_size(o->engine) *
                dol_engine_kv_bytes_per_token(o->engine),
            m->threads, dol_now_ms() - t0);
    if (strcmp(dol_engine_backend_name(o->engine), "cuda") == 0)
        dol_log(DOL_LOG_WARN, "cuda_unverified",
                "model=%s msg=\"this CUDA backend has been verified under the CUDA emulation "
                "only, not on a GPU; see docs/cuda.md\"", DOL_LOG_Q(me->name));
    dol_quant_stats qs;
    dol_engine_quant_stats(o->engine, &qs);
    if (qs.n_quantized > 0)
        dol_log(DOL_LOG_INFO, "weights_quantized",
                "model=%s format=%s matrices=%d seconds=%.3f bytes_before=%zu bytes_after=%zu "
                "linear_bytes=%zu linear_f16_bytes=%zu ratio_vs_f16=%.3f lm_head=%s",
                DOL_LOG_Q(me->name), dol_config_choice_name("weights", me->weights), qs.n_quantized,
                qs.quant_seconds, qs.quant_bytes_before, qs.quant_bytes_after, qs.linear_bytes,
                qs.linear_f16_bytes,
                qs.linear_f16_bytes ? (double)qs.linear_bytes / (double)qs.linear_f16_bytes : 0.0,
                me->quantize_lm_head ? dol_config_choice_name("weights", me->weights) : "kept");
    if (cfg->warmup) {
        if (startup) atomic_fetch_add(&m->warming, 1);
        int wrc = warm_up(m, me->name, o->sched, o->model, err, errlen);
        if (startup) atomic_fetch_sub(&m->warming, 1);
        if (wrc == 2) dol_set_err(err, errlen, "the server is stopping");
        if (wrc != 0) goto fail;
    }
    return 0;
fail:
    objects_free(o);
    return -1;
}

/* Add b's counters (not its gauges) to a's. */
static void counters_add(dol_scheduler_stats *a, const dol_scheduler_stats *b)
{
    a->steps += b->steps;
    a->prefix_cache_query_tokens += b->prefix_cache_query_tokens;
    a->prefix_cache_hit_tokens += b->prefix_cache_hit_tokens;
    a->spec_proposed += b->spec_proposed;
    a->spec_accepted += b->spec_accepted;
}

/* Unload loaded entry v (lock held; dropped while freeing). */
static void unload_locked(dol_models *m, int v, const char *why)
{
    entry *e = &m->e[v];
    objects o = e->o;
    if (o.sched) {
        dol_scheduler_stats st;
        dol_scheduler_get_stats(o.sched, &st);
        counters_add(&e->gone, &st);
    }
    memset(&e->o, 0, sizeof e->o);
    e->state = DOL_MODEL_UNLOADED;
    e->unloads++;
    double idle_s = (dol_now_ms() - e->last_used_ms) / 1000.0;
    size_t bytes = e->bytes;
    pthread_mutex_unlock(&m->mu);
    double t0 = dol_now_ms();
    objects_free(&o);
    malloc_trim(0);   /* hand the freed heap back to the system */
    dol_log(DOL_LOG_INFO, "model_unloaded", "model=%s reason=%s idle_s=%.1f bytes=%zu ms=%.0f",
            DOL_LOG_Q(e->cfg->name), why, idle_s, bytes, dol_now_ms() - t0);
    pthread_mutex_lock(&m->mu);
    pthread_cond_broadcast(&m->cv);
}

/* The least recently used loaded entry that may go (no lease, no request
 * waiting for it, not pinned, not `except`), or -1. Lock held. */
static int lru_victim(dol_models *m, int except)
{
    int v = -1;
    for (int j = 0; j < m->n; j++) {
        entry *x = &m->e[j];
        /* n_w: requests woken by its load that have not taken their leases yet */
        if (j == except || x->state != DOL_MODEL_LOADED || x->leases > 0 || x->cfg->pinned ||
            x->n_w > 0)
            continue;
        if (v < 0 || x->last_used_ms < m->e[v].last_used_ms) v = j;
    }
    return v;
}

/* Make room for entry i before it loads: unload the least recently used
 * idle models while over max_loaded_models or the budget; wait (up to the
 * load deadline) while nothing can go. 0, or -1 with err. Lock held. */
static int make_room(dol_models *m, int i, char *err, size_t errlen)
{
    entry *e = &m->e[i];
    size_t need = estimate_bytes(e);
    for (;;) {
        /* a drain lets the load go on: its requests were accepted before */
        if (atomic_load(&m->stopping)) {
            dol_set_err(err, errlen, "the server is stopping");
            return -1;
        }
        if (e->abandoned) {
            dol_set_err(err, errlen, "%s", e->error);
            return -1;
        }
        int busy = 0;
        size_t used = 0;
        for (int j = 0; j < m->n; j++) {
            if (j == i) continue;
            /* a load still waiting for room holds none: two such loads must
             * not each wait for the other */
            if (m->e[j].state == DOL_MODEL_LOADED) used += m->e[j].bytes;
            else if (m->e[j].state == DOL_MODEL_LOADING && m->e[j].reserved)
                used += estimate_bytes(&m->e[j]);
            else continue;
            busy++;
        }
        int64_t budget = m->cfg->memory_budget_bytes;
        bool over_count = busy >= m->cfg->max_loaded_models;
        bool over_budget = budget > 0 && busy > 0 && used + need > (size_t)budget;
        if (!over_count && !over_budget) {
            e->reserved = true;
            return 0;
        }
        int v = lru_victim(m, i);
        if (v >= 0) {
            unload_locked(m, v, over_count ? "max_loaded_models" : "memory_budget");
            continue;
        }
        double now = dol_now_ms();
        if (now >= e->load_deadline_ms) {
            if (over_count)
                dol_set_err(err, errlen, "no room to load model '%s': %d models are loaded "
                            "(max_loaded_models %d) and each is in use or pinned",
                            e->cfg->name, busy, m->cfg->max_loaded_models);
            else
                dol_set_err(err, errlen, "no room to load model '%s': it needs about %zu bytes, "
                            "%zu of memory_budget_bytes %lld are held by models in use or pinned",
                            e->cfg->name, need, used, (long long)budget);
            return 1;
        }
        double until = now + 100.0 < e->load_deadline_ms ? now + 100.0 : e->load_deadline_ms;
        struct timespec ts = dol_deadline_ms(until - now);
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
    }
}

/* Over the budget after a load (the estimate was short): unload idle models
 * until under it, or none can go. Lock held. */
static void enforce_budget(dol_models *m, int keep)
{
    int64_t budget = m->cfg->memory_budget_bytes;
    if (budget <= 0) return;
    for (;;) {
        size_t used = 0;
        for (int j = 0; j < m->n; j++)
            if (m->e[j].state == DOL_MODEL_LOADED) used += m->e[j].bytes;
        if (used <= (size_t)budget) return;
        int v = lru_victim(m, keep);
        if (v < 0) {
            dol_log(DOL_LOG_WARN, "memory_budget_exceeded",
                    "used_bytes=%zu budget_bytes=%lld msg=\"every loaded model is in use or pinned\"",
                    used, (long long)budget);
            return;
        }
        unload_locked(m, v, "memory_budget");
    }
}

typedef struct {
    dol_models *m;
    int i;
} load_arg;

static double backoff_s(const dol_config *cfg, int failures)
{
    double s = cfg->load_retry_s;
    for (int k = 1; k < failures && s < MAX_BACKOFF_S; k++) s *= 2;
    return s < MAX_BACKOFF_S ? s : MAX_BACKOFF_S;
}

static void *load_main(void *arg)
{
    load_arg la = *(load_arg *)arg;
    free(arg);
    dol_models *m = la.m;
    entry *e = &m->e[la.i];
    char err[DOL_ERR_LEN] = "";
    bool config_error = false;
    objects o = {0};

    /* a broken entry fails here, before anything is unloaded for it */
    int room = 0;
    int rc = open_checkpoint(m, e->cfg, true, &o, err, sizeof err, &config_error);
    if (rc == 0) {
        pthread_mutex_lock(&m->mu);
        e->making_room = true;
        room = make_room(m, la.i, err, sizeof err);
        e->making_room = false;
        pthread_mutex_unlock(&m->mu);
        if (room != 0) objects_free(&o);
        rc = room == 0 ? load_objects(m, e->cfg, e->startup, &o, err, sizeof err, &config_error) : -1;
    }

    pthread_mutex_lock(&m->mu);
    double now = dol_now_ms();
    objects discard = {0};
    bool loaded = false, stopped = false;
    if (rc == 0 && !e->abandoned && !atomic_load(&m->stopping)) {
        e->o = o;
        e->state = DOL_MODEL_LOADED;
        e->bytes = objects_bytes(&o);
        e->backend = dol_engine_backend_name(o.engine);
        e->activations = dol_engine_activations(o.engine);
        if (e->cfg->weights != DOL_WEIGHTS_AUTO || strcmp(e->backend, "cuda") == 0)
            snprintf(e->format, sizeof e->format, "%s",
                     e->cfg->weights == DOL_WEIGHTS_AUTO ? "f16"
                     : dol_config_choice_name("weights", e->cfg->weights));
        else {
            const char *dt = dol_dtype_name(o.model->lm_head.dtype);
            size_t k = 0;
            for (; dt[k] && k < sizeof e->format - 1; k++)
                e->format[k] = (char)tolower((unsigned char)dt[k]);
            e->format[k] = '\0';
        }
        e->context_len = dol_engine_context_len(o.engine);
        e->file_format = dol_model_format_name(o.model->format);
        snprintf(e->file_types, sizeof e->file_types, "%s", o.model->type_mix);
        e->last_used_ms = now;
        e->failures = 0;
        e->error[0] = '\0';
        e->loads++;
        e->last_load_s = (now - e->load_started_ms) / 1000.0;
        e->load_seconds_total += e->last_load_s;
        loaded = true;
    } else if (atomic_load(&m->stopping) && !e->abandoned) {
        /* ended by the stop (past the drain): not the model's failure */
        if (rc == 0) discard = o;
        e->state = DOL_MODEL_UNLOADED;
        stopped = true;
    } else {
        if (rc == 0) discard = o;
        if (!e->abandoned) {
            /* (an abandoned load was already marked failed by the tick) */
            e->state = DOL_MODEL_FAILED;
            snprintf(e->error, sizeof e->error, "%s", err[0] ? err : "the load failed");
            e->error_config = config_error;
            e->load_failures++;
            if (room > 0) {
                e->retry_at_ms = now + NO_ROOM_RETRY_S * 1000.0;
            } else {
                e->failures++;
                e->retry_at_ms = now + backoff_s(m->cfg, e->failures) * 1000.0;
            }
        }
    }
    bool abandoned = e->abandoned;
    e->reserved = false;
    wake_list wl = loaded ? wake_keep(e, now) : take_waiters(e);
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);

    wake_all(&wl);
    if (discard.model) objects_free(&discard);
    if (stopped)
        dol_log(DOL_LOG_INFO, "model_load_stopped", "model=%s msg=\"the server stopped before "
                "the load finished\"", DOL_LOG_Q(e->cfg->name));
    else if (!loaded && !abandoned)
        dol_log(DOL_LOG_ERROR, "model_load_failed", "model=%s retry_in_s=%.1f error=%s",
                DOL_LOG_Q(e->cfg->name), (e->retry_at_ms - now) / 1000.0, DOL_LOG_Q(err));

    pthread_mutex_lock(&m->mu);
    if (loaded) enforce_budget(m, la.i);
    e->thread_live = false;
    m->n_threads--;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

/* Start entry i's load (lock held). -1 with e->error when no thread starts. */
static int start_load(dol_models *m, int i)
{
    entry *e = &m->e[i];
    load_arg *la = malloc(sizeof *la);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    e->state = DOL_MODEL_LOADING;
    e->abandoned = false;
    e->thread_live = true;
    e->load_started_ms = dol_now_ms();
    e->load_deadline_ms = e->load_started_ms + m->cfg->load_timeout_s * 1000.0;
    m->n_threads++;
    int rc = -1;
    if (la) {
        la->m = m;
        la->i = i;
        rc = pthread_create(&t, &attr, load_main, la);
    }
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        free(la);
        e->state = DOL_MODEL_FAILED;
        e->thread_live = false;
        m->n_threads--;
        snprintf(e->error, sizeof e->error, "cannot start a load thread");
        e->retry_at_ms = dol_now_ms() + NO_ROOM_RETRY_S * 1000.0;
        return -1;
    }
    /* on demand: the request waits from here (start-up says "listening" first) */
    dol_log(e->startup && e->loads == 0 ? DOL_LOG_DEBUG : DOL_LOG_INFO, "model_loading",
            "model=%s path=%s", DOL_LOG_Q(e->cfg->name), DOL_LOG_Q(e->cfg->path));
    return 0;
}

/* ---- public ---------------------------------------------------------------- */

int dol_models_create(const dol_config *cfg, int threads, dol_models **out, char *err,
                      size_t errlen)
{
    if (cfg->n_models < 1) {
        dol_set_err(err, errlen, "no model: pass --model DIR (a Hugging Face Llama directory), "
                    "or set model: or models: in the config");
        return -1;
    }
    dol_models *m = calloc(1, sizeof *m);
    entry *e = m ? calloc((size_t)cfg->n_models, sizeof *e) : NULL;
    if (!e) {
        free(m);
        dol_set_err(err, errlen, "out of memory");
        return -1;
    }
    m->cfg = cfg;
    m->threads = threads;
    m->e = e;
    m->n = cfg->n_models;
    atomic_init(&m->stopping, false);
    pthread_mutex_init(&m->mu, NULL);
    dol_cond_init(&m->cv);
    bool any_pinned = false;
    for (int i = 0; i < m->n; i++) any_pinned = any_pinned || cfg->models[i].pinned;
    for (int i = 0; i < m->n; i++) {
        e[i].cfg = &cfg->models[i];
        e[i].startup = any_pinned ? cfg->models[i].pinned : i == 0;
    }
    *out = m;
    return 0;
}

/* Models that load later are checked against their draft models' vocabulary
 * now, so that the start fails (exit 2) rather than each load: both
 * checkpoints opened (memory-mapped, validated), the tokenizers compared.
 * One that cannot be opened is left to its load to report. */
static void check_drafts_at_start(dol_models *m)
{
    for (int i = 0; i < m->n && !m->draft_err[0]; i++) {
        const dol_model_entry *me = m->e[i].cfg;
        if (m->e[i].startup || me->speculative_mode != DOL_SPEC_DRAFT || me->draft_index < 0) continue;
        const dol_model_entry *de = &m->cfg->models[me->draft_index];
        objects a, b;
        char err[DOL_ERR_LEN];
        bool cfg_err = false;
        if (open_checkpoint(m, me, false, &a, err, sizeof err, &cfg_err) != 0) continue;
        if (open_checkpoint(m, de, false, &b, err, sizeof err, &cfg_err) == 0) {
            a.draft_model = b.model;
            a.draft_tok = b.tok;
            if (check_same_vocab(me, &a, de, err, sizeof err) != 0)
                snprintf(m->draft_err, sizeof m->draft_err, "%s", err);
        }
        objects_free(&a);
    }
}

void dol_models_start(dol_models *m)
{
    check_drafts_at_start(m);
    if (m->draft_err[0]) return;   /* dol_models_startup reports it */
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->n; i++)
        if (m->e[i].startup && m->e[i].state == DOL_MODEL_UNLOADED) start_load(m, i);
    pthread_mutex_unlock(&m->mu);
}

int dol_models_startup(dol_models *m, char *err, size_t errlen, bool *config_error)
{
    int rc = 1;
    if (m->draft_err[0]) {
        dol_set_err(err, errlen, "%s", m->draft_err);
        *config_error = true;
        return -1;
    }
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->n && rc >= 0; i++) {
        entry *e = &m->e[i];
        if (!e->startup) continue;
        if (e->state == DOL_MODEL_FAILED) {
            dol_set_err(err, errlen, "%s", e->error);
            *config_error = e->error_config;
            rc = -1;
        } else if (e->state != DOL_MODEL_LOADED) {
            rc = 0;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

bool dol_models_warming(dol_models *m) { return atomic_load(&m->warming) > 0; }

bool dol_models_ready(dol_models *m)
{
    bool ready = true;
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->n; i++) {
        const entry *e = &m->e[i];
        /* a pinned model stays loaded; the first (none pinned) may be
         * unloaded like any other once it has loaded */
        if (e->startup && (e->cfg->pinned ? e->state != DOL_MODEL_LOADED : e->loads == 0))
            ready = false;
    }
    pthread_mutex_unlock(&m->mu);
    return ready;
}

int dol_models_count(const dol_models *m) { return m->n; }

int dol_models_find(const dol_models *m, const char *id)
{
    if (!id || !id[0]) return 0;
    for (int i = 0; i < m->n; i++) {
        const dol_model_entry *c = m->e[i].cfg;
        if (strcmp(c->name, id) == 0) return i;
        for (int a = 0; a < c->n_aliases; a++)
            if (strcmp(c->aliases[a], id) == 0) return i;
    }
    return -1;
}

const char *dol_models_name(const dol_models *m, int idx) { return m->e[idx].cfg->name; }

void dol_models_names(const dol_models *m, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < m->n && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s'%s'", i ? ", " : "", m->e[i].cfg->name);
}

dol_acquire_result dol_models_acquire(dol_models *m, int idx, void (*wake)(void *user),
                                      void *user, double deadline_ms, dol_model_lease *lease,
                                      char *reason, size_t reason_len, double *retry_after_s)
{
    dol_acquire_result res;
    *retry_after_s = 0;
    pthread_mutex_lock(&m->mu);
    entry *e = &m->e[idx];
    double now = dol_now_ms();
    if (atomic_load(&m->stopping) ||
        (m->draining && !(has_waiter(e, user) && (e->state == DOL_MODEL_LOADED ||
                                                  e->state == DOL_MODEL_LOADING)))) {
        /* a drain lets the requests that waited for a load have it */
        drop_waiter(e, user);
        res = DOL_ACQUIRE_STOPPING;
    } else if (e->state == DOL_MODEL_LOADED) {
        drop_waiter(e, user);   /* back after the load woke it */
        e->leases++;
        e->last_used_ms = now;
        lease->index = idx;
        lease->name = e->cfg->name;
        lease->model = e->o.model;
        lease->tok = e->o.tok;
        lease->context_len = e->context_len;
        res = DOL_ACQUIRE_OK;
    } else if (e->state == DOL_MODEL_FAILED && (now < e->retry_at_ms || e->thread_live)) {
        drop_waiter(e, user);
        /* the failure's reason while in back-off; after it, a load that
         * timed out may still be finishing */
        snprintf(reason, reason_len, "%s", now < e->retry_at_ms ? e->error
                                           : "a previous load is still running");
        double left = (e->retry_at_ms - now) / 1000.0;
        *retry_after_s = left > 1 ? left : 1;
        res = DOL_ACQUIRE_FAILED;
    } else {
        res = DOL_ACQUIRE_WAIT;
        if (e->state != DOL_MODEL_LOADING && start_load(m, idx) != 0) {
            snprintf(reason, reason_len, "%s", e->error);
            *retry_after_s = NO_ROOM_RETRY_S;
            res = DOL_ACQUIRE_FAILED;
        } else if (e->n_w == e->cap_w) {
            int cap = e->cap_w ? e->cap_w * 2 : 8;
            waiter *w = realloc(e->w, (size_t)cap * sizeof *w);
            if (w) {
                e->w = w;
                e->cap_w = cap;
            }
        }
        if (res == DOL_ACQUIRE_WAIT) {
            drop_waiter(e, user);   /* never listed twice */
            if (e->n_w < e->cap_w) {
                e->w[e->n_w++] = (waiter){wake, user, deadline_ms, 0};
            } else {
                snprintf(reason, reason_len, "out of memory");
                *retry_after_s = 1;
                res = DOL_ACQUIRE_FAILED;
            }
        }
    }
    pthread_mutex_unlock(&m->mu);
    return res;
}

void dol_models_cancel_wait(dol_models *m, int idx, void *user)
{
    pthread_mutex_lock(&m->mu);
    entry *e = &m->e[idx];
    int before = e->n_w;
    drop_waiter(e, user);
    if (e->n_w == 0 && before > 0) pthread_cond_broadcast(&m->cv);   /* it may go now */
    pthread_mutex_unlock(&m->mu);
}

void dol_models_release(dol_models *m, int idx)
{
    pthread_mutex_lock(&m->mu);
    entry *e = &m->e[idx];
    if (e->leases > 0) e->leases--;
    e->last_used_ms = dol_now_ms();
    if (e->leases == 0) pthread_cond_broadcast(&m->cv);   /* a load may wait for room */
    pthread_mutex_unlock(&m->mu);
}

dol_reason dol_models_submit(dol_models *m, int idx, dol_request *r, dol_reason_info *why)
{
    dol_reason res = DOL_REASON_DRAINING;
    if (why) *why = (dol_reason_info){.reason = res};
    pthread_mutex_lock(&m->mu);
    dol_scheduler *s = m->e[idx].o.sched;
    if (s) res = dol_scheduler_submit(s, r, why);
    pthread_mutex_unlock(&m->mu);
    return res;
}

dol_reason dol_models_fit(dol_models *m, int idx, int n_prompt, int n, int max_new, int *fit,
                          dol_reason_info *why)
{
    dol_reason res = DOL_REASON_DRAINING;
    *fit = 0;
    if (why) *why = (dol_reason_info){.reason = res};
    pthread_mutex_lock(&m->mu);
    dol_scheduler *s = m->e[idx].o.sched;
    if (s) res = dol_scheduler_fit(s, n_prompt, n, max_new, fit, why);
    pthread_mutex_unlock(&m->mu);
    return res;
}

bool dol_models_sched_stats(dol_models *m, int idx, dol_scheduler_stats *st)
{
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&m->mu);
    dol_scheduler *s = m->e[idx].o.sched;
    if (s) dol_scheduler_get_stats(s, st);
    pthread_mutex_unlock(&m->mu);
    return s != NULL;
}

void dol_models_info(dol_models *m, int idx, dol_model_info *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&m->mu);
    entry *e = &m->e[idx];
    double now = dol_now_ms();
    out->name = e->cfg->name;
    out->entry = e->cfg;
    out->state = e->state;
    out->startup = e->startup;
    out->leases = e->leases;
    out->waiting = e->n_w;
    out->backend = e->backend;
    out->activations = e->activations ? e->activations
                                      : dol_config_choice_name("activations", e->cfg->activations);
    out->weights = e->format[0] ? e->format : dol_config_choice_name("weights", e->cfg->weights);
    out->context_len = e->context_len;
    out->file_format = e->file_format;
    snprintf(out->file_types, sizeof out->file_types, "%s", e->file_types);
    out->bytes = e->bytes;
    out->idle_s = e->state == DOL_MODEL_LOADED && e->leases == 0
                      ? (now - e->last_used_ms) / 1000.0 : 0;
    if (e->state == DOL_MODEL_FAILED) {
        snprintf(out->error, sizeof out->error, "%s", e->error);
        out->retry_after_s = e->retry_at_ms > now ? (e->retry_at_ms - now) / 1000.0 : 0;
    }
    out->loads = e->loads;
    out->load_failures = e->load_failures;
    out->unloads = e->unloads;
    out->load_seconds_total = e->load_seconds_total;
    out->last_load_s = e->last_load_s;
    if (e->o.sched) {
        out->has_stats = true;
        dol_scheduler_get_stats(e->o.sched, &out->stats);
    }
    counters_add(&out->stats, &e->gone);
    pthread_mutex_unlock(&m->mu);
}

void dol_models_tick(dol_models *m)
{
    double now = dol_now_ms();
    wake_list due[DOL_MAX_MODELS];
    int n_due = 0;
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->n; i++) {
        entry *e = &m->e[i];
        /* (a load waiting for room fails itself at the deadline, saying why) */
        if (e->state == DOL_MODEL_LOADING && !e->abandoned && !e->making_room &&
            now >= e->load_deadline_ms) {
            e->abandoned = true;
            e->state = DOL_MODEL_FAILED;
            snprintf(e->error, sizeof e->error, "model '%.200s' did not load within load_timeout_s "
                     "(%g s)", e->cfg->name, m->cfg->load_timeout_s);
            e->failures++;
            e->load_failures++;
            e->retry_at_ms = now + backoff_s(m->cfg, e->failures) * 1000.0;
            dol_log(DOL_LOG_ERROR, "model_load_failed", "model=%s error=%s", DOL_LOG_Q(e->cfg->name),
                    DOL_LOG_Q(e->error));
            due[n_due++] = take_waiters(e);
            pthread_cond_broadcast(&m->cv);
            continue;
        }
        /* waiters past their own deadline (request_timeout_s) */
        wake_list l = {NULL, 0};
        for (int k = 0; k < e->n_w; k++) {
            if (e->w[k].woken_ms > 0) {
                if (now - e->w[k].woken_ms >= WOKEN_GRACE_MS) {
                    e->w[k--] = e->w[--e->n_w];
                    if (e->n_w == 0) pthread_cond_broadcast(&m->cv);
                }
                continue;
            }
            if (e->w[k].deadline_ms <= 0 || now < e->w[k].deadline_ms) continue;
            waiter *nw = realloc(l.w, (size_t)(l.n + 1) * sizeof *nw);
            if (!nw) break;
            l.w = nw;
            l.w[l.n++] = e->w[k];
            e->w[k--] = e->w[--e->n_w];
        }
        if (l.n) due[n_due++] = l;
    }
    pthread_mutex_unlock(&m->mu);
    for (int i = 0; i < n_due; i++) wake_all(&due[i]);
}

void dol_models_drain(dol_models *m)
{
    wake_list due[DOL_MAX_MODELS];
    pthread_mutex_lock(&m->mu);
    m->draining = true;
    bool stopping = atomic_load(&m->stopping);
    for (int i = 0; i < m->n; i++) {
        entry *e = &m->e[i];
        /* requests waiting for a load were accepted: they keep waiting (and
         * their model takes them) until the stop */
        bool keep = !stopping && e->n_w > 0 &&
                    (e->state == DOL_MODEL_LOADING || e->state == DOL_MODEL_LOADED);
        if (e->o.sched && !keep) dol_scheduler_drain(e->o.sched);
        due[i] = keep ? (wake_list){NULL, 0} : take_waiters(e);
    }
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    for (int i = 0; i < m->n; i++) wake_all(&due[i]);
}

int dol_models_waiting(dol_models *m)
{
    int n = 0;
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->n; i++) n += m->e[i].n_w;
    pthread_mutex_unlock(&m->mu);
    return n;
}

int dol_models_leased(dol_models *m)
{
    int n = 0;
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->n; i++) n += m->e[i].leases;
    pthread_mutex_unlock(&m->mu);
    return n;
}

void dol_models_stop(dol_models *m)
{
    if (!m) return;
    atomic_store(&m->stopping, true);
    dol_models_drain(m);
    pthread_mutex_lock(&m->mu);
    while (m->n_threads > 0) pthread_cond_wait(&m->cv, &m->mu);
    dol_scheduler *s[DOL_MAX_MODELS];
    for (int i = 0; i < m->n; i++) {
        s[i] = m->e[i].o.sched;   /* detached first: submit and stats see it gone */
        m->e[i].o.sched = NULL;
    }
    pthread_mutex_unlock(&m->mu);
    for (int i = 0; i < m->n; i++) dol_scheduler_free(s[i]);
}

void dol_models_free(dol_models *m)
{
    if (!m) return;
    dol_models_stop(m);
    for (int i = 0; i < m->n; i++) {
        objects_free(&m->e[i].o);
        free(m->e[i].w);
    }
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m->e);
    free(m);
}
