/* src/http/http.h — private to src/http/: the server object, the per-request
 * context, the registry that lets scheduler-thread callbacks find a live
 * request context (or learn that it is gone), and the response helpers
 * shared by the route handlers. */
#ifndef DOLPHIN_HTTP_H
#define DOLPHIN_HTTP_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "api/api.h"
#include "dolphin/config.h"
#include "dolphin/model.h"
#include "dolphin/models.h"
#include "dolphin/scheduler.h"
#include "dolphin/server.h"
#include "dolphin/tokenizer.h"

struct dol_server {
    const dol_config *cfg;
    struct MHD_Daemon *daemon;
    int port;
    int listen_fd;               /* taken back from MHD on drain; -1 until then */
    atomic_int state;            /* dol_server_state */
    atomic_int inflight;         /* submitted requests not yet completed */
    pthread_mutex_t idle_mu;     /* with idle_cv: dol_server_wait_idle */
    pthread_cond_t idle_cv;      /* broadcast when inflight drops to 0 */
    bool stopping;               /* guarded by the registry lock */
    int watch_pipe[2];           /* wakes the disconnect watcher (registry.c) */
    pthread_t watcher;
    int64_t started;             /* unix seconds, for /v1/models "created" */

    pthread_mutex_t mu;          /* guards the attached registry pointer */
    dol_models *models;          /* the models it serves (include/dolphin/models.h) */

    /* readiness memory watch (src/http/routes_info.c), under watch_mu */
    pthread_mutex_t watch_mu;
    bool mem_above;              /* above vram_unready_ratio at the last sample */
    double mem_above_since_ms;   /* since when, continuously */
    bool mem_unready;            /* above for vram_unready_after_s: /healthz 503 */
};

/* One submitted request fewer in flight; wakes dol_server_wait_idle at 0. */
void dol_http_inflight_done(dol_server *s);

/* What the handlers use of the model a request picked (its lease, taken
 * by dol_http_model_acquire and held until the request completes). */
typedef struct {
    const dol_model *model;
    const dol_tokenizer *tok;
    bool has_sched;
    char name[256];              /* the model's configured name */
    int context_len;
    int model_idx;               /* its entry in the registry */
} dol_http_attached;
/* The registry attached to s (NULL before dol_server_attach). */
dol_models *dol_http_models_of(dol_server *s);
/* A scheduler is only ever called through these, under the registry's
 * lock (src/models/models.c), so that it can be unloaded or stopped
 * safely. idx: the model; for stats -1 sums over every loaded model
 * (false when none is). submit: DRAINING when the model is gone. */
bool dol_http_sched_stats(dol_server *s, int idx, dol_scheduler_stats *st);
dol_submit_result dol_http_sched_submit(dol_server *s, int idx, dol_request *r, char *err,
                                        size_t errlen);

typedef enum {
    PH_BODY = 0,     /* receiving the body */
    PH_WAIT,         /* submitted, connection suspended until output */
    PH_STREAM,       /* SSE response queued; the content reader runs */
    PH_RESPONDED,    /* a complete response was queued */
} dol_http_phase;

#define DOL_HTTP_ROUTE_LEN 32

/* What /v1/completions and /v1/chat/completions keep per HTTP request:
 * the scheduler requests, their output as last read, and the SSE stream's
 * progress. Allocated by dol_http_gen_begin, freed by dol_http_gen_cleanup. */
typedef struct dol_http_gen {
    bool chat;                   /* chat.completion objects, no echo */
    bool return_token_ids;
    bool preamble_sent;          /* echo / role / prompt ids chunks (stream) */
    const dol_tokenizer *tok;
    char model_name[256];
    char cmpl_id[48];
    int64_t created;
    dol_request **reqs;          /* one per prompt */
    dol_output *outs;            /* their output as last read, n_reqs * n */
    dol_request_state *st;       /* their state as last read, n_reqs */
    int n_reqs;
    int n;                       /* choices per prompt */
    bool stream, include_usage, echo;
    int logprobs;
    char **echo_text;            /* per prompt, when echo */
    int n_submitted;             /* reqs[0..n_submitted) are queued */
    /* streaming progress, per choice (n_reqs * n entries) */
    size_t *sent_text;
    int *sent_lps;
    bool *sent_finish;
    bool stream_over;
    char *out;                   /* SSE bytes not yet handed to MHD */
    size_t out_len, out_off, out_cap;
} dol_http_gen;

/* Everything about one HTTP request; freed in the completed callback. */
typedef struct dol_http_req {
    dol_server *srv;
    struct MHD_Connection *conn;
    uint64_t handle;             /* registry handle, given to the scheduler */
    char id[64];                 /* X-Request-Id */
    char method[16];
    char route[DOL_HTTP_ROUTE_LEN];
    double t0_ms;
    dol_http_phase phase;
    int status;                  /* status of the queued response (0 = none) */

    /* body */
    char *body;
    size_t body_len, body_cap;
    bool too_large;
    size_t discarded;
    int head_status;             /* 414 or 431 when the request line or headers
                                    are over Dolphin's limits, else 0 */

    /* guarded by the registry lock */
    bool suspended;              /* MHD has the connection suspended */
    bool pending;                /* an event came while not suspended */
    bool unwatched;              /* the watcher is done with this suspension
                                    (hang-up acted on, or data still unread) */

    struct dol_http_gen *gen;    /* the generation routes' state (generation.c);
                                    NULL for every other route */

    /* the model the body picked (model_select.c) */
    int model_idx;               /* -1 until picked */
    char model[256];             /* its name, for the log line and the metrics */
    bool leased;                 /* holds a lease on it (released at completion) */
    bool model_wait;             /* registered as waiting for its load */
    int retry_after_s;           /* a 503's Retry-After (0: the default, 1) */
} dol_http_req;

/* ---- registry (src/http/registry.c) ------------------------------------ */

/* One process-wide lock guards the registry, every context's suspended /
 * pending flags and each server's `stopping`. MHD_suspend_connection and
 * MHD_resume_connection are only called with it held, so a resume is
 * never lost and never hits a connection that is not suspended. */
void dol_http_lock(void);
void dol_http_unlock(void);
/* Register a context: sets c->handle. -1 on OOM. */
int dol_http_register(dol_http_req *c);
/* Forget a context (takes the lock); handles to it resolve to NULL after. */
void dol_http_unregister(dol_http_req *c);
/* Look up a handle; call with the lock held. */
dol_http_req *dol_http_lookup(uint64_t handle);
/* Resume every suspended connection of server s, mark it stopping, and end
 * its disconnect watcher. */
void dol_http_stop_all(dol_server *s);
/* Start server s's disconnect watcher: a thread that polls the sockets of
 * suspended connections (libmicrohttpd does not watch them) and cancels the
 * requests of a client that hung up. -1 with err on failure. */
int dol_http_watch_start(dol_server *s, char *err, size_t errlen);

typedef enum { DOL_WAIT_SUSPENDED, DOL_WAIT_PENDING, DOL_WAIT_STOPPING } dol_wait_result;
/* From an MHD callback: clear c->pending (call before looking at output). */
void dol_http_clear_pending(dol_http_req *c);
/* From an MHD callback, after finding nothing to do: suspend the connection
 * unless an event arrived meanwhile (PENDING: look again) or the server is
 * stopping. */
dol_wait_result dol_http_suspend(dol_http_req *c);

/* The scheduler's callback (user = the handle): new output or the end. */
void dol_http_on_event(dol_request *r, void *user);

/* ---- responses (src/http/server.c) ------------------------------------ */

/* Every response goes out through this: adds X-Request-Id, queues it with
 * libmicrohttpd, takes `resp` over, and on success records the status and
 * moves the request to `phase` (PH_RESPONDED, or PH_STREAM for SSE). */
enum MHD_Result dol_http_queue(dol_http_req *c, int status, struct MHD_Response *resp,
                               dol_http_phase phase);
/* Queue a response with `body` (malloc'd, taken over; NULL = OOM -> 500),
 * Content-Type application/json and X-Request-Id. */
enum MHD_Result dol_http_send_json(dol_http_req *c, int status, char *body);
enum MHD_Result dol_http_send_cjson(dol_http_req *c, int status, cJSON *j);
enum MHD_Result dol_http_send_error(dol_http_req *c, const dol_api_error *e);
/* The key of an "Authorization: Bearer <key>" header, or NULL. */
const char *dol_http_bearer_key(struct MHD_Connection *conn);
/* Random lowercase hex into buf (2*nbytes chars + NUL). */
void dol_http_random_hex(char *buf, size_t nbytes);
uint64_t dol_http_random_u64(void);

/* ---- model selection (src/http/model_select.c) -------------------------- */

/* For a route that needs a model: the not-ready 503s, the body's "model"
 * (a name or an alias; absent: the first configured model; unknown: 404
 * listing the names), then a lease on it. 0 with *a filled; 1 when the model
 * is loading and the connection is suspended until it is loaded (the route
 * is dispatched again then: return MHD_YES); -1 with e (503 with the reason
 * and Retry-After for a failed load or no room, 504 when request_timeout_s
 * passes while waiting). */
int dol_http_model_acquire(dol_http_req *c, dol_http_attached *a, dol_api_error *e);
/* At completion: the lease back, or the wait forgotten. */
void dol_http_model_done(dol_http_req *c);

/* ---- routes ------------------------------------------------------------ */

/* POST /v1/completions (route_completions.c): body complete, PH_BODY. */
enum MHD_Result dol_http_completions(dol_http_req *c);

/* ---- generation (src/http/generation.c) --------------------------------- */

/* Called again by MHD after a resume while c->phase == PH_WAIT. */
enum MHD_Result dol_http_gen_resume(dol_http_req *c);
/* Release c->gen (cancels unfinished work) and report its figures; a no-op
 * for a request of another route. */
void dol_http_gen_cleanup(dol_http_req *c, int *prompt_tokens, int *completion_tokens,
                          double *queue_ms, double *ttft_ms);

/* The generation routes share generation.c's machinery: a route
 * parses its body into dol_completion_params, calls dol_http_gen_prepare,
 * then dol_http_gen_add once per prompt (ids taken over), then
 * dol_http_gen_submit, which queues the requests and answers (whole or
 * streamed) when they are done. */
/* With a from dol_http_model_acquire: c's identity (id with "cmpl-" or
 * "chatcmpl-" per c->chat, created, model name). */
int dol_http_gen_begin(dol_http_req *c, bool chat, dol_http_attached *a, dol_api_error *e);
/* Content-Type check (415) and the body as one JSON object (400). */
cJSON *dol_http_body_json(dol_http_req *c, dol_api_error *e);
void dol_http_api_limits(const dol_http_req *c, const dol_http_attached *a,
                         dol_api_limits *lim);
/* 404 model_not_found unless model is NULL or a name or alias of the model
 * picked (it always is after dol_http_model_acquire). */
int dol_http_check_model(dol_http_req *c, const char *model, const dol_http_attached *a,
                         dol_api_error *e);
int dol_http_gen_prepare(dol_http_req *c, const dol_http_attached *a,
                         const dol_completion_params *p, int n_reqs, dol_api_error *e);
int dol_http_gen_add(dol_http_req *c, const dol_http_attached *a,
                     const dol_completion_params *p, int index, int32_t *ids, int n_ids,
                     dol_api_error *e);
enum MHD_Result dol_http_gen_submit(dol_http_req *c);

/* POST /v1/chat/completions (route_chat.c). */
enum MHD_Result dol_http_chat(dol_http_req *c);
/* POST /tokenize and POST /detokenize (route_tokenize.c). */
enum MHD_Result dol_http_tokenize(dol_http_req *c);
enum MHD_Result dol_http_detokenize(dol_http_req *c);

/* 0 when READY, else -1 with the 503 for the current state in e. */
int dol_http_not_ready(dol_http_req *c, dol_api_error *e);
enum MHD_Result dol_http_models(dol_http_req *c, const char *id);
enum MHD_Result dol_http_healthz(dol_http_req *c);
enum MHD_Result dol_http_livez(dol_http_req *c);

/* Readiness as /healthz judges it (src/http/readiness.c). */
typedef struct {
    dol_server_state state;
    bool have_sched;
    dol_scheduler_stats st;      /* zero without a scheduler */
    double mem_ratio;            /* st.mem_used_bytes / st.mem_total_bytes */
    double mem_above_s;          /* how long it has been above vram_unready_ratio */
    bool mem_unready;            /* ... for vram_unready_after_s */
    double loop_age_ms;          /* since the scheduler loop last ticked */
    double progress_age_ms;      /* since it last made progress, 0 when idle */
    bool stalled;                /* work pending and no progress for too long */
    bool models_ready;           /* the start-up models (pinned, or the first) loaded */
    bool ready;                  /* every condition met: 200 */
} dol_http_readiness;
void dol_http_readiness_get(dol_server *s, dol_http_readiness *r);
/* The scheduler loop ticks at least every 200 ms, idle or not, and makes
 * progress (a forward step) every few ms to seconds while it has work.
 * Readiness: work pending and no progress for DOL_HTTP_STALL_READY_MS.
 * Liveness: the loop itself has not ticked for DOL_HTTP_STALL_LIVE_MS (a
 * restart is due). */
#define DOL_HTTP_STALL_READY_MS 30000.0
#define DOL_HTTP_STALL_LIVE_MS 60000.0
/* now - since in ms, 0 when since is unset or in the future. */
double dol_http_age_ms(double since, double now);

/* GET /metrics (src/http/route_metrics.c), and the per-request hook the
 * completed callback calls with the figures it logs (n_seqs: sequences the
 * request generated, for the time per output token). */
enum MHD_Result dol_http_metrics(dol_http_req *c);
void dol_http_metrics_record(const dol_http_req *c, int status, int prompt_tokens,
                             int completion_tokens, double queue_ms, double ttft_ms,
                             double total_ms, int n_seqs);

#endif
