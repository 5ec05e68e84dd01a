/* src/http/respond.c — the ground floor of src/http: what every route
 * calls and nothing above it. Queueing a response (X-Request-Id, the
 * drain's Connection: close, the headers an error status needs), JSON and
 * error bodies, the request body parsed once, the not-ready 503s, the
 * bearer key, request ids, and the in-flight count the drain waits on.
 * Calls no route and nothing of server.c. */
#include "http/http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

/* ---- randomness --------------------------------------------------------- */

static void random_bytes(void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got <= 0) {
            /* Practically unreachable; fall back to the clock. */
            uint64_t t = dol_now_ns() ^ (uint64_t)(uintptr_t)p;
            for (size_t i = 0; i < n; i++, t = t * 6364136223846793005ull + 1442695040888963407ull)
                p[i] = (unsigned char)(t >> 56);
            return;
        }
        p += got;
        n -= (size_t)got;
    }
}

void dol_http_random_hex(char *buf, size_t nbytes)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[64];
    if (nbytes > sizeof raw) nbytes = sizeof raw;
    random_bytes(raw, nbytes);
    for (size_t i = 0; i < nbytes; i++) {
        buf[2 * i] = hex[raw[i] >> 4];
        buf[2 * i + 1] = hex[raw[i] & 15];
    }
    buf[2 * nbytes] = '\0';
}

uint64_t dol_http_random_u64(void)
{
    uint64_t x;
    random_bytes(&x, sizeof x);
    return x;
}

/* ---- responses ---------------------------------------------------------- */

bool dol_http_route_is_probe(const char *route)
{
    return strcmp(route, "/healthz") == 0 || strcmp(route, "/livez") == 0 ||
           strcmp(route, "/metrics") == 0;
}

enum MHD_Result dol_http_queue(dol_http_req *c, int status, struct MHD_Response *resp,
                               dol_http_phase phase)
{
    MHD_add_response_header(resp, "X-Request-Id", c->id);
    /* Draining: a proxy must not keep this connection for its next request
     * (probes excepted: a monitor on a kept connection keeps seeing 503). */
    if (atomic_load(&c->srv->state) == DOL_STATE_DRAINING && !dol_http_route_is_probe(c->route))
        MHD_add_response_header(resp, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(c->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    if (ret == MHD_YES) {
        c->status = status;
        c->phase = phase;
    }
    return ret;
}

/* Extra headers for an error, chosen by status. */
static void error_headers(dol_http_req *c, struct MHD_Response *resp, int status)
{
    if (status == 429 || status == 503) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", c->retry_after_s > 0 ? c->retry_after_s : 1);
        MHD_add_response_header(resp, "Retry-After", ra);
    }
    if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    if (status == 405) {
        bool post = strcmp(c->route, "/v1/completions") == 0 ||
                    strcmp(c->route, "/v1/chat/completions") == 0 ||
                    strcmp(c->route, "/tokenize") == 0 || strcmp(c->route, "/detokenize") == 0;
        const char *allow = post ? "POST" : "GET, HEAD";
        MHD_add_response_header(resp, "Allow", allow);
    }
    /* the connection's byte stream cannot be trusted after these */
    if (status == 413 || status == 414 || status == 431 || status == 501 ||
        (status == 400 && c->head_status == 400))
        MHD_add_response_header(resp, "Connection", "close");
}

enum MHD_Result dol_http_send_json(dol_http_req *c, int status, char *body)
{
    static const char oom[] =
        "{\"error\":{\"message\":\"Out of memory.\",\"type\":\"internal_error\","
        "\"param\":null,\"code\":null}}";
    struct MHD_Response *resp;
    if (body) {
        resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
        if (!resp) free(body);
    } else {
        status = 500;
        resp = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom,
                                               MHD_RESPMEM_PERSISTENT);
    }
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "application/json");
    if (status >= 400) error_headers(c, resp, status);
    return dol_http_queue(c, status, resp, PH_RESPONDED);
}

enum MHD_Result dol_http_send_cjson(dol_http_req *c, int status, cJSON *j)
{
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return dol_http_send_json(c, status, s);
}

enum MHD_Result dol_http_send_error(dol_http_req *c, const dol_api_error *e)
{
    return dol_http_send_json(c, e->status, dol_api_error_json(e));
}

cJSON *dol_http_body_json(dol_http_req *c, dol_api_error *e)
{
    if (c->body_json) return c->body_json;
    const char *ct = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!dol_api_content_type_is_json(ct)) {
        dol_api_error_set(e, 415, "invalid_request_error", NULL, "unsupported_media_type",
                          "Content-Type must be application/json.");
        return NULL;
    }
    c->body_json = dol_api_parse_object(c->body, c->body_len, c->srv->cfg->max_json_depth, e);
    return c->body_json;
}

void dol_http_body_free(dol_http_req *c)
{
    cJSON_Delete(c->body_json);
    c->body_json = NULL;
    free(c->body);
    c->body = NULL;
    c->body_len = c->body_cap = 0;
}

int dol_http_not_ready(dol_http_req *c, dol_api_error *e)
{
    switch (dol_http_state(c->srv)) {
    case DOL_STATE_READY:
        return 0;
    case DOL_STATE_LOADING:
        dol_api_error_set(e, 503, "service_unavailable", NULL, "model_loading",
                          "The model is still loading; retry shortly.");
        return -1;
    case DOL_STATE_WARMING:
        dol_api_error_set(e, 503, "service_unavailable", NULL, "model_warming",
                          "The model is warming up; retry shortly.");
        return -1;
    default:
        dol_api_error_draining(e);
        return -1;
    }
}

const char *dol_http_bearer_key(struct MHD_Connection *conn, char *buf, size_t n)
{
    const char *h = NULL;
    size_t len = 0;
    if (MHD_lookup_connection_value_n(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION,
                                      strlen(MHD_HTTP_HEADER_AUTHORIZATION), &h, &len) != MHD_YES)
        return NULL;
    /* a NUL inside the value would make a prefix of it pass as the key */
    if (!h || strlen(h) != len || strncasecmp(h, "Bearer ", 7) != 0) return NULL;
    h += 7;
    while (*h == ' ' || *h == '\t') h++;
    len = strlen(h);
    while (len > 0 && (h[len - 1] == ' ' || h[len - 1] == '\t')) len--;   /* trailing OWS */
    if (len == 0 || len >= n) return NULL;
    memcpy(buf, h, len);
    buf[len] = '\0';
    return buf;
}


void dol_http_inflight_done(dol_server *s)
{
    if (atomic_fetch_sub(&s->inflight, 1) != 1) return;
    pthread_mutex_lock(&s->idle_mu);
    pthread_cond_broadcast(&s->idle_cv);
    pthread_mutex_unlock(&s->idle_mu);
}

int dol_server_inflight(const dol_server *s)
{
    return atomic_load(&((dol_server *)s)->inflight);
}
