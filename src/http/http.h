/* src/http/http.h — private to src/http/: the server object, the per-request
 * context, and the functions of each floor of src/http, ground first. A
 * file calls only its own floor and those below it (docs/architecture.md,
 * "src/http by floor"):
 *
 *   top      server.c: the daemon, the access handler, dispatch, completion
 *   routes   route_completions.c, route_chat.c, route_tokenize.c,
 *            route_models.c, route_health.c, route_metrics.c
 *   shared   completion.c + completion_reply.c (the two generation routes),
 *            model_select.c (model, lease, scheduler calls), readiness.c
 *   ground   respond.c (responses, the body, not-ready), handles.c (the
 *            handle table, suspend / resume), watcher.c (hang-ups) */
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
    int watch_pipe[2];           /* wakes the disconnect watcher (watcher.c) */
    pthread_t watcher;
    int64_t started;             /* unix seconds, for /v1/models "created" */

    pthread_mutex_t mu;          /* guards the attached registry pointer */
    dol_models *models;          /* the models it serves (include/dolphin/models.h) */

    /* readiness memory watch (readiness.c), under watch_mu */
    pthread_mutex_t watch_mu;
    bool mem_above;              /* above vram_unready_ratio at the last sample */
    double mem_above_since_ms;   /* since when, continuously */
    bool mem_unready;            /* above for vram_unready_after_s: /healthz 503 */
};

/* The server's state (dol_server_state), from any thread. */
static inline dol_server_state dol_http_state(const dol_server *s)
{
    return (dol_server_state)atomic_load(&((dol_server *)s)->state);
}

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

typedef enum {
    PH_BODY = 0,     /* receiving the body */
    PH_WAIT,         /* submitted, connection suspended until output */
    PH_STREAM,       /* SSE response queued; the content reader runs */
    PH_RESPONDED,    /* a complete response was queued */
} dol_http_phase;

#define DOL_HTTP_ROUTE_LEN 32

/* What /v1/completions and /v1/chat/completions keep per HTTP request:
 * the scheduler requests, their output as last read, and the SSE stream's
 * progress. Allocated by dol_http_cmpl_begin, freed by dol_http_cmpl_cleanup
 * (completion.c); the answer is rendered from it by completion_reply.c. */
typedef struct dol_http_cmpl {
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
} dol_http_cmpl;

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
    cJSON *body_json;            /* the body parsed, once (dol_http_body_json) */
    bool too_large;
    size_t discarded;
    int head_status;             /* 414 or 431 when the request line or headers
                                    are over Dolphin's limits, else 0 */

    /* guarded by the registry lock */
    bool suspended;              /* MHD has the connection suspended */
    bool pending;                /* an event came while not suspended */
    bool unwatched;              /* the watcher is done with this suspension
                                    (hang-up acted on, or data still unread) */

    struct dol_http_cmpl *cmpl;  /* the generation routes' state (completion.c);
                                    NULL for every other route */

    /* the model the body picked (model_select.c) */
    int model_idx;               /* -1 until picked */
    char model[256];             /* its name, for the log line and the metrics */
    bool leased;                 /* holds a lease on it (released at completion) */
    bool model_wait;             /* registered as waiting for its load */
    int retry_after_s;           /* a 503's Retry-After (0: the default, 1) */
} dol_http_req;

/* ==== ground floor ====================================================== */

/* ---- responses, the body, not-ready (respond.c) ------------------------- */

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
/* The body as one JSON object: the Content-Type check (415), then
 * dol_api_parse_object (400). Parsed on the first call and kept in c (the
 * pointer is c's: do not free it); NULL with e. */
cJSON *dol_http_body_json(dol_http_req *c, dol_api_error *e);
/* Free the body and its parse (once the requests are built, and at
 * completion). */
void dol_http_body_free(dol_http_req *c);
/* 0 when READY, else -1 with the 503 for the current state in e. */
int dol_http_not_ready(dol_http_req *c, dol_api_error *e);
/* Routes a prober or a scraper calls (by label), served during a drain. */
bool dol_http_route_is_probe(const char *route);
/* The key of an "Authorization: Bearer <key>" header (whitespace around it
 * dropped), copied into buf (n bytes) and returned; NULL when there is none
 * or it does not fit. */
const char *dol_http_bearer_key(struct MHD_Connection *conn, char *buf, size_t n);
/* Random lowercase hex into buf (2*nbytes chars + NUL). */
void dol_http_random_hex(char *buf, size_t nbytes);
uint64_t dol_http_random_u64(void);
/* One submitted request fewer in flight; wakes dol_server_wait_idle at 0. */
void dol_http_inflight_done(dol_server *s);

/* ---- the handle table (handles.c) --------------------------------------- */

/* One process-wide lock guards the table, every context's suspended /
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
/* fn on every registered context; call with the lock held. */
void dol_http_each_locked(void (*fn)(dol_http_req *c, void *arg), void *arg);
/* Resume every suspended connection of server s, mark it stopping, and end
 * its disconnect watcher. */
void dol_http_stop_all(dol_server *s);

typedef enum { DOL_WAIT_SUSPENDED, DOL_WAIT_PENDING, DOL_WAIT_STOPPING } dol_wait_result;
/* From an MHD callback: clear c->pending (call before looking at output). */
void dol_http_clear_pending(dol_http_req *c);
/* From an MHD callback, after finding nothing to do: suspend the connection
 * unless an event arrived meanwhile (PENDING: look again) or the server is
 * stopping. */
dol_wait_result dol_http_suspend(dol_http_req *c);
/* The scheduler's callback (user = the handle): new output or the end. */
void dol_http_on_event(dol_request *r, void *user);

/* ---- the disconnect watcher (watcher.c) --------------------------------- */

/* Start server s's disconnect watcher: a thread that polls the sockets of
 * suspended connections (libmicrohttpd does not watch them) and cancels the
 * requests of a client that hung up. -1 with err on failure. */
int dol_http_watch_start(dol_server *s, char *err, size_t errlen);
/* Wake it to rebuild its poll set (one more suspended connection). */
void dol_http_watch_wake(dol_server *s);
/* Wake it once s->stopping is set, join it, close its pipe. */
void dol_http_watch_stop(dol_server *s);

/* ==== shared by the routes ============================================== */

/* ---- model selection and the scheduler calls (model_select.c) ----------- */

/* The registry attached to s (NULL before dol_server_attach). */
dol_models *dol_http_models_of(dol_server *s);
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
/* A scheduler is only ever called through these, under the registry's
 * lock (src/registry), so that it can be unloaded or stopped safely. idx:
 * the model; for stats -1 sums over every loaded model (false when none
 * is). submit and fit: dol_scheduler_submit and dol_scheduler_fit, DRAINING
 * when the model is gone. */
bool dol_http_sched_stats(dol_server *s, int idx, dol_scheduler_stats *st);
dol_reason dol_http_sched_submit(dol_server *s, int idx, dol_request *r, dol_reason_info *why);
dol_reason dol_http_sched_fit(dol_server *s, int idx, int n_prompt, int n, int max_new,
                              int *fit, dol_reason_info *why);

/* ---- the generation routes' machinery (completion.c, completion_reply.c) */

/* A route parses its body into dol_completion_params, calls
 * dol_http_cmpl_prepare, then dol_http_cmpl_add once per prompt (ids taken
 * over), then dol_http_cmpl_submit, which queues the requests and answers
 * (whole or streamed) when they are done. */
/* With a from dol_http_model_acquire: c's identity (id with "cmpl-" or
 * "chatcmpl-" per chat, created, model name). */
int dol_http_cmpl_begin(dol_http_req *c, bool chat, dol_http_attached *a, dol_api_error *e);
void dol_http_api_limits(const dol_http_req *c, const dol_http_attached *a,
                         dol_api_limits *lim);
/* 404 model_not_found unless model is NULL or a name or alias of the model
 * picked (it always is after dol_http_model_acquire). */
int dol_http_check_model(dol_http_req *c, const char *model, const dol_http_attached *a,
                         dol_api_error *e);
int dol_http_cmpl_prepare(dol_http_req *c, const dol_http_attached *a,
                          const dol_completion_params *p, int n_reqs, dol_api_error *e);
/* One prompt's request: max_prompt_tokens, then the scheduler's fit (400
 * context_length_exceeded naming the prompt or max_tokens), then the
 * dol_request. */
int dol_http_cmpl_add(dol_http_req *c, const dol_http_attached *a,
                      const dol_completion_params *p, int index, int32_t *ids, int n_ids,
                      dol_api_error *e);
enum MHD_Result dol_http_cmpl_submit(dol_http_req *c);
/* Called again by MHD after a resume while c->phase == PH_WAIT. */
enum MHD_Result dol_http_cmpl_resume(dol_http_req *c);
/* Take what every submitted request produced since the last read into
 * c->cmpl->outs and ->st. 0, or -1 on OOM. */
int dol_http_cmpl_sync(dol_http_req *c);
/* Release c->cmpl (cancels unfinished work) and report its figures; a no-op
 * for a request of another route. */
void dol_http_cmpl_cleanup(dol_http_req *c, int *prompt_tokens, int *completion_tokens,
                           double *queue_ms, double *ttft_ms, int64_t *spec_proposed,
                           int64_t *spec_accepted);

/* ---- readiness (readiness.c) -------------------------------------------- */

/* Readiness as /healthz judges it. */
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

/* ==== routes: body complete, phase PH_BODY =============================== */

/* POST /v1/completions (route_completions.c). */
enum MHD_Result dol_http_completions(dol_http_req *c);
/* POST /v1/chat/completions (route_chat.c). */
enum MHD_Result dol_http_chat(dol_http_req *c);
/* POST /tokenize and POST /detokenize (route_tokenize.c). */
enum MHD_Result dol_http_tokenize(dol_http_req *c);
enum MHD_Result dol_http_detokenize(dol_http_req *c);
/* GET /v1/models, GET /v1/models/{id} (id != NULL; route_models.c). */
enum MHD_Result dol_http_models(dol_http_req *c, const char *id);
/* GET /healthz, GET /livez (route_health.c). */
enum MHD_Result dol_http_healthz(dol_http_req *c);
enum MHD_Result dol_http_livez(dol_http_req *c);
/* GET /metrics (route_metrics.c), and the per-request hook the completed
 * callback calls with the figures it logs (n_seqs: sequences the request
 * generated, for the time per output token). */
enum MHD_Result dol_http_metrics(dol_http_req *c);
void dol_http_metrics_record(const dol_http_req *c, int status, int prompt_tokens,
                             int completion_tokens, double queue_ms, double ttft_ms,
                             double total_ms, int n_seqs);

#endif
