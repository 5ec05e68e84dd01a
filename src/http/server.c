/* src/http/server.c — the top floor of src/http: the libmicrohttpd daemon
 * behind include/dolphin/server.h. Binding, life cycle and state, the access
 * handler (head limits, body accumulation, X-Request-Id, routing with
 * 404/405/401/413, dispatch to the route_*.c handlers), and the completed
 * callback that releases a request and logs one line for it. Routes never
 * call back into this file (docs/architecture.md, "src/http by floor"). */
#include "http/http.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dolphin/log.h"

/* MHD's per-connection memory pool holds the headers and the read buffer;
 * bodies are accumulated in our own buffer, up to cfg->max_body_bytes. */
#define CONN_MEMORY_LIMIT (256 * 1024)
/* Dolphin's own limits on the request target and on the headers, those of
 * nginx's default large_client_header_buffers (4 x 8 KiB): over them the
 * answer is a JSON 414 or 431. Only past CONN_MEMORY_LIMIT does
 * libmicrohttpd answer itself, with HTML (docs/openapi.yaml). */
#define MAX_TARGET_BYTES 8192
#define MAX_HEADER_BYTES 32768
/* A too-large body is read and discarded (so the client sees the 413
 * instead of a reset) up to this much; beyond, the connection is dropped. */
#define DISCARD_LIMIT ((size_t)64 << 20)

/* ---- routing ------------------------------------------------------------ */

typedef enum { R_COMPLETIONS, R_MODELS, R_MODEL, R_HEALTHZ, R_LIVEZ, R_METRICS, R_CHAT,
               R_TOKENIZE, R_DETOKENIZE, R_NONE } route_id;

static const struct {
    const char *path;     /* exact path, or prefix when `prefix` */
    bool prefix;
    const char *method;   /* GET routes also answer HEAD */
    bool auth;            /* needs the API key when keys are configured */
    route_id id;
    const char *label;    /* for logs */
} ROUTES[] = {
    {"/v1/completions", false, "POST", true, R_COMPLETIONS, "/v1/completions"},
    {"/v1/chat/completions", false, "POST", true, R_CHAT, "/v1/chat/completions"},
    {"/tokenize", false, "POST", true, R_TOKENIZE, "/tokenize"},
    {"/detokenize", false, "POST", true, R_DETOKENIZE, "/detokenize"},
    {"/v1/models", false, "GET", true, R_MODELS, "/v1/models"},
    {"/v1/models/", true, "GET", true, R_MODEL, "/v1/models/{id}"},
    {"/healthz", false, "GET", false, R_HEALTHZ, "/healthz"},
    {"/livez", false, "GET", false, R_LIVEZ, "/livez"},
    {"/metrics", false, "GET", false, R_METRICS, "/metrics"},
};
#define N_ROUTES (sizeof ROUTES / sizeof ROUTES[0])

static int find_route(const char *url)
{
    for (size_t i = 0; i < N_ROUTES; i++) {
        size_t n = strlen(ROUTES[i].path);
        if (ROUTES[i].prefix ? strncmp(url, ROUTES[i].path, n) == 0 && url[n]
                             : strcmp(url, ROUTES[i].path) == 0)
            return (int)i;
    }
    return -1;
}

static bool method_ok(const char *want, const char *got)
{
    if (strcmp(want, got) == 0) return true;
    return strcmp(want, "GET") == 0 && strcmp(got, "HEAD") == 0;
}

/* A client-supplied request id is echoed when it is 1..63 characters of
 * [A-Za-z0-9._:-]; anything else gets a fresh random id. */
static bool sane_request_id(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 63) return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' ||
                  ch == '.' || ch == ':';
        if (!ok) return false;
    }
    return true;
}

static void copy_method(char *dst, size_t n, const char *m)
{
    size_t o = 0;
    for (; m && *m && o + 1 < n; m++)
        dst[o++] = ((*m >= 'A' && *m <= 'Z') || (*m >= 'a' && *m <= 'z')) ? *m : '?';
    dst[o] = '\0';
}

static bool authorized(dol_http_req *c)
{
    const dol_config *cfg = c->srv->cfg;
    if (cfg->n_api_keys <= 0) return true;
    char buf[sizeof cfg->api_keys[0].key];
    const char *key = dol_http_bearer_key(c->conn, buf, sizeof buf);
    return key && dol_config_key_priority(cfg, key) >= 0;
}

/* The path for an error message: printable ASCII only, at most n-1 bytes. */
static const char *printable(const char *s, char *buf, size_t n)
{
    size_t o = 0;
    for (; *s && o + 1 < n; s++)
        buf[o++] = (*s >= 0x20 && *s < 0x7f) ? *s : '?';
    buf[o] = '\0';
    return buf;
}

typedef struct {
    size_t bytes;                /* key + value + separators, added up */
    int n_length;                /* Content-Length headers */
    bool lengths_differ, chunked;
    bool other_coding;           /* a Transfer-Encoding other than "chunked" */
    const char *length;          /* the first Content-Length */
} head_info;

static enum MHD_Result add_size(void *cls, enum MHD_ValueKind kind, const char *key,
                                const char *value)
{
    head_info *h = cls;
    h->bytes += strlen(key) + (value ? strlen(value) : 0) + 4;   /* "k: v\r\n", "k=v&" */
    if (kind != MHD_HEADER_KIND || !value) return MHD_YES;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        if (h->n_length++ && strcmp(h->length, value) != 0) h->lengths_differ = true;
        if (h->n_length == 1) h->length = value;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        h->chunked = true;
        if (strcasecmp(value, "chunked") != 0) h->other_coding = true;
    }
    return MHD_YES;
}

/* 414 when the request target (path and query) is longer than
 * MAX_TARGET_BYTES, 431 when the headers add up to more than
 * MAX_HEADER_BYTES, 400 when the body's length is ambiguous (Content-Length
 * headers that differ, or one beside Transfer-Encoding: a request
 * smuggling pattern, refused as RFC 9112 says), 501 for a transfer coding
 * other than chunked (the body's end could not be found), else 0. */
static int head_status(struct MHD_Connection *conn, const char *url)
{
    head_info target = {.bytes = strlen(url)}, headers = {0};
    MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, add_size, &target);
    if (target.bytes > MAX_TARGET_BYTES) return 414;
    MHD_get_connection_values(conn, MHD_HEADER_KIND, add_size, &headers);
    if (headers.bytes > MAX_HEADER_BYTES) return 431;
    if (headers.lengths_differ || (headers.n_length && headers.chunked)) return 400;
    if (headers.other_coding) return 501;
    return 0;
}

/* libmicrohttpd's percent-decoding, except that %00 stays as it is: a NUL
 * in the path would cut it short ("/v1/models/x%00y" read as model x). */
static int hexval(char ch)
{
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
         : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

static size_t unescape(void *cls, struct MHD_Connection *conn, char *s)
{
    (void)cls; (void)conn;
    char *w = s;
    for (const char *r = s; *r;) {
        int h1 = r[0] == '%' ? hexval(r[1]) : -1;
        int h2 = h1 >= 0 ? hexval(r[2]) : -1;
        int v = h2 >= 0 ? h1 * 16 + h2 : 0;
        if (v > 0) {
            *w++ = (char)v;
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

static enum MHD_Result dispatch(dol_http_req *c, const char *url)
{
    dol_api_error e;
    if (c->head_status == 414) {
        dol_api_error_set(&e, 414, "invalid_request_error", NULL, "uri_too_long",
                          "The request URI is longer than the limit of %d bytes.",
                          MAX_TARGET_BYTES);
        return dol_http_send_error(c, &e);
    }
    if (c->head_status == 400) {
        dol_api_error_set(&e, 400, "invalid_request_error", NULL, "ambiguous_body_length",
                          "The request has Content-Length headers that differ, or one "
                          "beside Transfer-Encoding.");
        return dol_http_send_error(c, &e);
    }
    if (c->head_status == 501) {
        dol_api_error_set(&e, 501, "invalid_request_error", NULL, "unsupported_transfer_encoding",
                          "The request's Transfer-Encoding is not supported; send the body "
                          "with Content-Length or as chunked alone.");
        return dol_http_send_error(c, &e);
    }
    if (c->head_status == 431) {
        dol_api_error_set(&e, 431, "invalid_request_error", NULL,
                          "request_header_fields_too_large",
                          "The request headers add up to more than the limit of %d bytes.",
                          MAX_HEADER_BYTES);
        return dol_http_send_error(c, &e);
    }
    int ri = find_route(url);
    if (ri < 0) {
        char buf[200];
        snprintf(c->route, sizeof c->route, "unknown");
        dol_api_error_set(&e, 404, "invalid_request_error", NULL, "not_found",
                          "Invalid URL (%s %s)", c->method, printable(url, buf, sizeof buf));
        return dol_http_send_error(c, &e);
    }
    snprintf(c->route, sizeof c->route, "%s", ROUTES[ri].label);
    if (!method_ok(ROUTES[ri].method, c->method)) {
        dol_api_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                          "Method %s is not allowed on %s (use %s).", c->method,
                          ROUTES[ri].label, ROUTES[ri].method);
        return dol_http_send_error(c, &e);
    }
    if (ROUTES[ri].auth && !authorized(c)) {
        dol_api_error_set(&e, 401, "invalid_request_error", NULL, "invalid_api_key",
                          "Incorrect or missing API key. Send it as 'Authorization: Bearer <key>'.");
        return dol_http_send_error(c, &e);
    }
    if (c->too_large) {
        dol_api_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                          "The request body is larger than the limit of %zu bytes.",
                          c->srv->cfg->max_body_bytes);
        return dol_http_send_error(c, &e);
    }
    switch (ROUTES[ri].id) {
    case R_COMPLETIONS: return dol_http_completions(c);
    case R_MODELS: return dol_http_models(c, NULL);
    case R_MODEL: return dol_http_models(c, url + strlen(ROUTES[ri].path));
    case R_HEALTHZ: return dol_http_healthz(c);
    case R_LIVEZ: return dol_http_livez(c);
    case R_METRICS: return dol_http_metrics(c);
    case R_CHAT: return dol_http_chat(c);
    case R_TOKENIZE: return dol_http_tokenize(c);
    case R_DETOKENIZE: return dol_http_detokenize(c);
    default: break;
    }
    return MHD_NO;
}

/* ---- body accumulation -------------------------------------------------- */

static enum MHD_Result accumulate(dol_http_req *c, const char *data, size_t n)
{
    size_t max = c->srv->cfg->max_body_bytes;
    if (!c->too_large && c->body_len + n > max) {
        c->too_large = true;
        free(c->body);
        c->body = NULL;
        c->body_len = c->body_cap = 0;
    }
    if (c->too_large) {
        c->discarded += n;
        return c->discarded > DISCARD_LIMIT ? MHD_NO : MHD_YES;
    }
    if (c->body_len + n + 1 > c->body_cap) {
        size_t cap = c->body_cap ? c->body_cap : 4096;
        while (cap < c->body_len + n + 1) cap *= 2;
        if (cap > max + 1) cap = max + 1;
        char *nb = realloc(c->body, cap);
        if (!nb) return MHD_NO;
        c->body = nb;
        c->body_cap = cap;
    }
    memcpy(c->body + c->body_len, data, n);
    c->body_len += n;
    c->body[c->body_len] = '\0';
    return MHD_YES;
}

/* ---- MHD callbacks ------------------------------------------------------ */

static dol_http_req *req_new(dol_server *s, struct MHD_Connection *conn,
                             const char *method)
{
    dol_http_req *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->srv = s;
    c->conn = conn;
    c->t0_ms = dol_now_ms();
    copy_method(c->method, sizeof c->method, method);
    snprintf(c->route, sizeof c->route, "unknown");
    const char *rid = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
    if (sane_request_id(rid)) snprintf(c->id, sizeof c->id, "%s", rid);
    else dol_http_random_hex(c->id, 16);
    if (dol_http_register(c)) {
        free(c);
        return NULL;
    }
    return c;
}

/* A request that arrives on a kept-alive connection once the drain has
 * begun is answered 503 (Retry-After, Connection: close) from its head
 * alone, before any of its body is read or any work is done: the one case
 * in which a proxy may send a POST to another replica (docs/deployment.md).
 * Probes, scrapes and unknown paths are answered as usual. */
static bool refuse_while_draining(dol_http_req *c, const char *url, enum MHD_Result *r)
{
    int ri = find_route(url);
    if (ri < 0 || dol_http_route_is_probe(ROUTES[ri].label)) return false;
    snprintf(c->route, sizeof c->route, "%s", ROUTES[ri].label);
    dol_api_error e;
    dol_api_error_draining(&e);
    *r = dol_http_send_error(c, &e);
    return true;
}

static bool expects_continue(struct MHD_Connection *conn)
{
    const char *x = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    return x && strcasecmp(x, "100-continue") == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    (void)version;
    dol_server *s = cls;
    dol_http_req *c = *con_cls;
    if (!c) {
        c = req_new(s, conn, method);
        if (!c) return MHD_NO;
        *con_cls = c;
        c->head_status = head_status(conn, url);
        /* refused from the head alone, before any of the body is read
         * (whose end an unknown transfer coding would hide): then closed */
        if (c->head_status) return dispatch(c, url);
        if (atomic_load(&s->state) == DOL_STATE_DRAINING) {
            enum MHD_Result r;
            if (refuse_while_draining(c, url, &r)) return r;
        }
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno == ERANGE || v > s->cfg->max_body_bytes) {
                c->too_large = true;
                /* The client waits for "100 Continue", or the body is past
                 * what would be read and discarded anyway: answer now,
                 * before any of the body (and close). */
                if (expects_continue(conn) || errno == ERANGE || v > DISCARD_LIMIT) {
                    if (find_route(url) >= 0)
                        snprintf(c->route, sizeof c->route, "%s", ROUTES[find_route(url)].label);
                    dol_api_error e;
                    dol_api_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                                      "The request body is larger than the limit of %zu bytes.",
                                      s->cfg->max_body_bytes);
                    return dol_http_send_error(c, &e);
                }
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        enum MHD_Result r = c->phase == PH_BODY ? accumulate(c, upload_data, *upload_size)
                                                : MHD_YES;
        *upload_size = 0;
        return r;
    }
    switch (c->phase) {
    case PH_BODY: return dispatch(c, url);
    case PH_WAIT: return dol_http_cmpl_resume(c);
    default: return MHD_NO;  /* a response is already queued */
    }
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls; (void)conn;
    dol_http_req *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    dol_http_unregister(c);   /* from here on no scheduler callback finds c */

    int prompt_tokens = 0, completion_tokens = 0;
    double queue_ms = 0, ttft_ms = 0;
    /* sequences that reached the scheduler (0: none did) */
    int n_seqs = c->cmpl && c->cmpl->n_submitted > 0 ? c->cmpl->n_reqs * c->cmpl->n : 0;
    int64_t spec_p = 0, spec_a = 0;
    dol_http_cmpl_cleanup(c, &prompt_tokens, &completion_tokens, &queue_ms, &ttft_ms, &spec_p, &spec_a);
    dol_http_model_done(c);   /* after the cleanup: its requests are cancelled */

    bool ok = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK;
    int status = c->status ? c->status : 499;   /* 499: client closed first */
    double total_ms = dol_now_ms() - c->t0_ms;
    dol_http_metrics_record(c, status, prompt_tokens, completion_tokens, queue_ms, ttft_ms,
                            total_ms, n_seqs);
    /* 503 is a state (loading, warming, draining, full), not a fault */
    dol_log_level lvl = status >= 500 && status != 503 ? DOL_LOG_ERROR
                        : (ok && status != 503 ? DOL_LOG_INFO : DOL_LOG_WARN);
    /* probes and scrapes (every few seconds): successes at debug level,
     * failures at info */
    if (dol_http_route_is_probe(c->route) && ok) lvl = status == 200 ? DOL_LOG_DEBUG : DOL_LOG_INFO;
    char mq[300], spec[96] = "";
    if (spec_p > 0) /* speculative decoding proposed something */
        snprintf(spec, sizeof spec, " spec_proposed=%lld spec_accepted=%lld spec_acceptance=%.3f",
                 (long long)spec_p, (long long)spec_a, (double)spec_a / (double)spec_p);
    dol_log(lvl, "request",
            "request_id=%s method=%s route=%s model=%s status=%d prompt_tokens=%d "
            "completion_tokens=%d queue_ms=%.1f ttft_ms=%.1f total_ms=%.1f%s%s",
            c->id, c->method[0] ? c->method : "-", c->route,
            c->model[0] ? dol_log_quote(c->model, mq, sizeof mq) : "-", status, prompt_tokens,
            completion_tokens, queue_ms, ttft_ms, total_ms, spec,
            ok ? "" : " aborted=true");
    dol_http_body_free(c);
    free(c);
}

static void mhd_logger(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512], q[600];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = '\0';
    dol_log(DOL_LOG_DEBUG, "http_internal", "msg=%s", dol_log_quote(msg, q, sizeof q));
}

/* ---- listening socket --------------------------------------------------- */

static int bind_listen(const dol_config *cfg, bool *ipv6, char *err, size_t errlen)
{
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    const char *host = cfg->host[0] ? cfg->host : NULL;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc) {
        dol_set_err(err, errlen, "cannot resolve host %s: %s", cfg->host, gai_strerror(rc));
        return -1;
    }
    int fd = -1, saved = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
            *ipv6 = a->ai_family == AF_INET6;
            break;
        }
        saved = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        dol_set_err(err, errlen, "cannot bind %s:%d: %s", cfg->host, cfg->port, strerror(saved));
    return fd;
}

static int bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len)) return -1;
    if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return -1;
}

/* ---- public API --------------------------------------------------------- */

int dol_server_start(const dol_config *cfg, dol_server **out, char *err, size_t errlen)
{
    bool ipv6 = false;
    int fd = bind_listen(cfg, &ipv6, err, errlen);
    if (fd < 0) return -1;
    dol_server *s = calloc(1, sizeof *s);
    if (!s) {
        close(fd);
        dol_set_err(err, errlen, "out of memory");
        return -1;
    }
    s->cfg = cfg;
    s->port = bound_port(fd);
    s->listen_fd = -1;
    s->started = (int64_t)time(NULL);
    atomic_init(&s->state, DOL_STATE_LOADING);
    atomic_init(&s->inflight, 0);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->idle_mu, NULL);
    pthread_mutex_init(&s->watch_mu, NULL);
    dol_cond_init(&s->idle_cv);

    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG | (ipv6 ? MHD_USE_IPv6 : 0);
    static const unsigned pollers[] = {MHD_USE_EPOLL, MHD_USE_POLL};
    for (size_t i = 0; i < 2 && !s->daemon; i++) {
        s->daemon = MHD_start_daemon(
            flags | pollers[i], 0, NULL, NULL, on_request, s,
            MHD_OPTION_EXTERNAL_LOGGER, mhd_logger, s,
            MHD_OPTION_LISTEN_SOCKET, fd,
            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONN_MEMORY_LIMIT,
            MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL,
            /* Idle and slow clients cannot hold the server: a connection
             * without traffic for connection_timeout_s is closed (suspended
             * ones, waiting for the model, are exempt), and at most
             * max_connections (per address: max_connections_per_ip, 0 = no
             * limit) are open at once: beyond, MHD stops accepting and new
             * connections wait in the listen queue. */
            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->connection_timeout_s,
            MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->max_connections_per_ip,
            MHD_OPTION_END);
    }
    if (!s->daemon) {
        close(fd);
        dol_set_err(err, errlen, "cannot start the HTTP server on %s:%d", cfg->host, cfg->port);
        goto fail;
    }
    if (dol_http_watch_start(s, err, errlen) != 0) {
        MHD_stop_daemon(s->daemon);   /* closes the listening socket too */
        goto fail;
    }
    *out = s;
    return 0;
fail:
    pthread_mutex_destroy(&s->watch_mu);
    pthread_cond_destroy(&s->idle_cv);
    pthread_mutex_destroy(&s->idle_mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return -1;
}

/* Draining: the listening socket stops taking connections at once, so a
 * proxy's next connect is refused and goes to another replica. Connections
 * the kernel already queued are accepted and handed to MHD first (resetting
 * them could hit a request a proxy has sent and must not send again), then
 * the socket stops listening; it is closed after MHD_stop_daemon, as MHD
 * requires. Requests on kept-alive connections get 503 (on_request). */
static void stop_listening(dol_server *s)
{
    if (s->listen_fd >= 0) return;
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if (fd == MHD_INVALID_SOCKET) return;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int cfd = accept4(fd, (struct sockaddr *)&ss, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (cfd < 0) break;   /* EAGAIN: the queue is empty */
        /* on failure MHD closes cfd itself */
        MHD_add_connection(s->daemon, cfd, (struct sockaddr *)&ss, len);
    }
    shutdown(fd, SHUT_RDWR);   /* Linux: no longer listening; connects are refused */
    s->listen_fd = fd;
    dol_log(DOL_LOG_INFO, "listen_closed", "port=%d", s->port);
}

void dol_server_set_state(dol_server *s, dol_server_state st)
{
    if (st == DOL_STATE_DRAINING) stop_listening(s);
    atomic_store(&s->state, (int)st);
}

dol_server_state dol_server_get_state(const dol_server *s)
{
    return dol_http_state(s);
}

void dol_server_attach(dol_server *s, dol_models *models)
{
    pthread_mutex_lock(&s->mu);
    s->models = models;
    pthread_mutex_unlock(&s->mu);
}

int dol_server_port(const dol_server *s) { return s->port; }

int dol_server_wait_idle(dol_server *s, long timeout_ms)
{
    struct timespec until = dol_deadline_ms((double)timeout_ms);
    pthread_mutex_lock(&s->idle_mu);
    int rc = 0;
    while (atomic_load(&s->inflight) > 0 && rc == 0)
        rc = pthread_cond_timedwait(&s->idle_cv, &s->idle_mu, &until);
    pthread_mutex_unlock(&s->idle_mu);
    return atomic_load(&s->inflight);
}

void dol_server_stop(dol_server *s)
{
    if (!s) return;
    /* MHD must not be stopped with suspended connections: resume them all
     * (their handlers then see `stopping` and close). */
    dol_http_stop_all(s);
    MHD_stop_daemon(s->daemon);
    if (s->listen_fd >= 0) close(s->listen_fd);   /* taken back on drain */
    pthread_mutex_destroy(&s->watch_mu);
    pthread_cond_destroy(&s->idle_cv);
    pthread_mutex_destroy(&s->idle_mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
