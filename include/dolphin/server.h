/* include/dolphin/server.h — the HTTP front end (libmicrohttpd): routing,
 * OpenAI-compatible endpoints, SSE streaming over suspended connections,
 * readiness state. One internal polling thread; no thread per connection.
 *
 * Life cycle: dol_server_start binds and serves at once (so /healthz answers
 * 503 "loading" while the model loads); dol_server_attach hands it the
 * registry of the models it serves; dol_server_set_state moves it through
 * LOADING -> WARMING -> READY -> DRAINING; dol_server_stop closes it.
 */
#ifndef DOLPHIN_SERVER_H
#define DOLPHIN_SERVER_H

#include "dolphin/common.h"
#include "dolphin/config.h"
#include "dolphin/model.h"
#include "dolphin/models.h"
#include "dolphin/scheduler.h"
#include "dolphin/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DOL_STATE_LOADING = 0,
    DOL_STATE_WARMING,
    DOL_STATE_READY,
    DOL_STATE_DRAINING,
} dol_server_state;

typedef struct dol_server dol_server;

/* Bind cfg->host:cfg->port and start serving. The config must outlive the
 * server. -1 with err (e.g. "cannot bind 127.0.0.1:8080: Address already in
 * use"). */
int dol_server_start(const dol_config *cfg, dol_server **out,
                     char *err, size_t errlen);
/* Give the server the models it serves (requests pick one by name or
 * alias). Call once, before moving to WARMING/READY; the registry must
 * outlive the server (dol_models_stop may come first: its requests then
 * end with 503). */
void dol_server_attach(dol_server *s, dol_models *models);
/* Move to state st (main thread). DRAINING also stops listening at once
 * (new connections are refused) and from then on answers each new API
 * request on a kept-alive connection with 503 + "Connection: close" before
 * reading its body, so a proxy can send it to another replica; probes and
 * /metrics still answer on kept-alive connections (docs/deployment.md). */
void dol_server_set_state(dol_server *s, dol_server_state st);
dol_server_state dol_server_get_state(const dol_server *s);
/* The port actually bound (useful with port 0). */
int dol_server_port(const dol_server *s);
/* Requests accepted and not yet answered completely (for draining). */
int dol_server_inflight(const dol_server *s);
/* Block the calling thread until no request is in flight or timeout_ms
 * (monotonic clock) has passed; returns the requests still in flight
 * (0 = idle). Any thread. */
int dol_server_wait_idle(dol_server *s, long timeout_ms);
/* Sample what readiness watches over time (device memory against
 * vram_unready_ratio, for vram_unready_after_s). /healthz samples too;
 * calling this every ~100 ms (dolphind's main thread does) makes "has
 * stayed above for N seconds" hold between probes as well. Thread-safe. */
void dol_server_watch(dol_server *s);
/* Stop listening, close connections, free. */
void dol_server_stop(dol_server *s);

#ifdef __cplusplus
}
#endif
#endif
