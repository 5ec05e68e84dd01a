/* include/dolphin/models.h — the models a server serves (docs/architecture.md,
 * "Several models"): every entry of the config's models list, its state
 * (unloaded, loading, loaded, failed), and for a loaded one its checkpoint,
 * tokenizer, engine and scheduler. Models load on demand on a thread of
 * their own (one load per model at a time, however many requests wait);
 * at most max_loaded_models (and memory_budget_bytes) stay loaded, the
 * least recently used one with no request holding it and not pinned being
 * unloaded to make room. A failed load is retried after a back-off.
 *
 * Requests hold a model through a lease (dol_models_acquire ..
 * dol_models_release): a model with a lease is never unloaded, so the
 * objects a lease hands out stay valid until it is released, except after
 * dol_models_stop (shutdown), which frees the schedulers while the caller
 * still holds leases; everything else stays until dol_models_free.
 *
 * Thread-safe: one mutex guards every entry; it is a leaf with respect to
 * the HTTP registry lock (wake callbacks run with it released) and is held
 * across dol_scheduler_submit / dol_scheduler_get_stats, above the
 * scheduler's own lock. */
#ifndef DOLPHIN_MODELS_H
#define DOLPHIN_MODELS_H

#include "dolphin/common.h"
#include "dolphin/config.h"
#include "dolphin/model.h"
#include "dolphin/scheduler.h"
#include "dolphin/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DOL_MODEL_UNLOADED = 0,
    DOL_MODEL_LOADING,
    DOL_MODEL_LOADED,
    DOL_MODEL_FAILED,
} dol_model_state;

/* "unloaded", "loading", "loaded", "failed" (static strings). */
const char *dol_model_state_name(dol_model_state s);

typedef struct dol_models dol_models;

/* One entry per cfg->models (cfg must outlive the registry); nothing loads
 * yet. threads: CPU compute threads of each engine. -1 with err. */
int dol_models_create(const dol_config *cfg, int threads, dol_models **out, char *err,
                      size_t errlen);
/* Start loading the start-up models: the pinned ones, or the first entry
 * when none is pinned. First, every other model with a speculative draft
 * model has both checkpoints opened (memory-mapped) and their vocabularies
 * compared; a mismatch starts nothing and dol_models_startup reports it as
 * a setting at fault. Blocks for those checks. */
void dol_models_start(dol_models *m);
/* The start-up models: 1 all loaded, 0 still loading, -1 one failed (err
 * says why; *config_error when a setting is at fault rather than the
 * checkpoint, so that the caller exits 2). */
int dol_models_startup(dol_models *m, char *err, size_t errlen, bool *config_error);
/* Readiness: every pinned model loaded; with none pinned, the first has
 * loaded (it may be unloaded later like any other). */
bool dol_models_ready(dol_models *m);
/* Whether a start-up model is in its warm-up now (any thread; the main
 * thread shows it as the server's "warming" state). */
bool dol_models_warming(dol_models *m);

int dol_models_count(const dol_models *m);
/* The entry answering to `id` (a name or an alias); NULL or "" picks the
 * first entry. -1 when none does. */
int dol_models_find(const dol_models *m, const char *id);
/* Entry idx's name (lives as long as m). */
const char *dol_models_name(const dol_models *m, int idx);
/* The names, comma-separated, into buf (for a 404's message). */
void dol_models_names(const dol_models *m, char *buf, size_t n);

/* What a lease hands out; valid until dol_models_release. */
typedef struct {
    int index;
    const char *name;            /* the entry's name (lives as long as m) */
    const dol_model *model;
    const dol_tokenizer *tok;
    int context_len;
} dol_model_lease;

typedef enum {
    DOL_ACQUIRE_OK = 0,    /* *lease filled: release it when done */
    DOL_ACQUIRE_WAIT,      /* loading: wake(user) is called once when that changes
                              (loaded, failed, or deadline_ms passed); then ask again */
    DOL_ACQUIRE_FAILED,    /* 503: reason says why, *retry_after_s when to try again */
    DOL_ACQUIRE_STOPPING,  /* 503: the server is draining or stopping */
} dol_acquire_result;

/* Take a lease on entry idx, starting its load when it is not loaded (and
 * not in back-off after a failure). Any thread. */
dol_acquire_result dol_models_acquire(dol_models *m, int idx, void (*wake)(void *user),
                                      void *user, double deadline_ms, dol_model_lease *lease,
                                      char *reason, size_t reason_len, double *retry_after_s);
/* Forget a waiter registered by acquire (its client went away). */
void dol_models_cancel_wait(dol_models *m, int idx, void *user);
/* Drop a lease; the model becomes the most recently used. */
void dol_models_release(dol_models *m, int idx);

/* The scheduler of a leased model, called under the registry's lock so that
 * it cannot be freed meanwhile: dol_scheduler_submit and dol_scheduler_fit
 * (both DRAINING when it is gone), and its figures (false when it is not
 * loaded). Any thread. */
dol_reason dol_models_submit(dol_models *m, int idx, dol_request *r, dol_reason_info *why);
dol_reason dol_models_fit(dol_models *m, int idx, int n_prompt, int n, int max_new, int *fit,
                          dol_reason_info *why);
bool dol_models_sched_stats(dol_models *m, int idx, dol_scheduler_stats *st);

/* One entry as /v1/models, /metrics and /healthz show it. */
typedef struct {
    const char *name;
    const dol_model_entry *entry;    /* its configuration */
    dol_model_state state;
    bool startup;                    /* pinned, or the first when none is */
    int leases;                      /* requests holding it */
    int waiting;                     /* requests waiting for its load */
    const char *backend;             /* "cpu" | "cuda" once loaded, else NULL */
    const char *activations;         /* dol_engine_activations once loaded, else the
                                        configured choice ("auto", "f32", "int8") */
    const char *weights;             /* the weight format as held ("f32", "nf4", ...) */
    const char *file_format;         /* the checkpoint's: "safetensors" | "gguf"; NULL
                                      * until first loaded */
    char file_types[192];            /* its tensor types, "F16 30, F32 9" ("" until loaded) */
    int context_len;                 /* 0 until first loaded */
    size_t bytes;                    /* weights + KV cache as last loaded (0: never) */
    double idle_s;                   /* since the last request let it go */
    char error[DOL_ERR_LEN];         /* why the last load failed ("" = it did not) */
    double retry_after_s;            /* failed: seconds until a new load may start */
    uint64_t loads, load_failures, unloads;
    double load_seconds_total;       /* all successful loads together */
    double last_load_s;
    bool has_stats;                  /* loaded: the scheduler's figures */
    /* the scheduler's figures when loaded (zero when not), except that its
     * counters (steps, prefix cache, speculative tokens) add up every load
     * of the model so far */
    dol_scheduler_stats stats;
} dol_model_info;
void dol_models_info(dol_models *m, int idx, dol_model_info *out);

/* Called every ~100 ms by the main thread: loads past load_timeout_s fail,
 * waiters past their deadline are woken. */
void dol_models_tick(dol_models *m);
/* SIGTERM: no new load starts and new acquires get STOPPING; in-flight work
 * goes on. Requests already waiting for a model's load keep waiting: the
 * load goes on and they are served (their model's scheduler keeps
 * admitting them); every other scheduler stops admitting. At
 * dol_models_stop the waiters left are woken (then STOPPING), and a load
 * it ends is not counted as a failure. */
void dol_models_drain(dol_models *m);
/* Requests waiting for a model's load (the drain waits for them as for
 * in-flight work). Any thread. */
int dol_models_waiting(dol_models *m);
/* Leases held on loaded models: requests that hold a model, from the moment
 * they have it (a woken waiter among them) until they end, submitted to its
 * scheduler or not yet. The drain waits for these too, so a request woken
 * by a load is not cut off before it submits. Any thread. */
int dol_models_leased(dol_models *m);
/* Shutdown, step 1: wait for load threads, then stop and free every
 * scheduler (what is left ends with 503). Leases may still be held. */
void dol_models_stop(dol_models *m);
/* Step 2, once no HTTP handler runs any more: free the rest. NULL is fine. */
void dol_models_free(dol_models *m);

#ifdef __cplusplus
}
#endif
#endif
