/* src/http/registry.c — the bridge between the scheduler thread and MHD's
 * polling thread, and the disconnect watcher.
 *
 * The scheduler calls on_event with a numeric handle, not a pointer: a
 * request can outlive its HTTP context (the client went away, or the server
 * stopped first), so each call looks the handle up in a process-wide table
 * under one lock and does nothing when the context is gone. The same lock
 * guards each context's `suspended` / `pending` flags and is held across
 * MHD_suspend_connection / MHD_resume_connection, which closes the race
 * between "nothing to send, suspend" and "new output, resume".
 *
 * libmicrohttpd does not watch the socket of a suspended connection, so a
 * client that hangs up while its request waits for the model would go
 * unnoticed until the next output. Each server's watcher thread polls those
 * sockets for a hang-up and cancels the requests; the scheduler frees them
 * at its next step. Lock order: this lock, then MHD's internal ones (MHD
 * does not call us back while holding those); docs/architecture.md. */
#include "http/http.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SLOT_BITS 24   /* handle = generation << SLOT_BITS | slot index */

typedef struct {
    uintptr_t gen;
    int32_t next_free;
    dol_http_req *c;
} slot;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static slot *g_slots;
static int32_t g_n, g_cap, g_free = -1;

void dol_http_lock(void) { pthread_mutex_lock(&g_mu); }
void dol_http_unlock(void) { pthread_mutex_unlock(&g_mu); }

static uintptr_t make_handle(int32_t idx, uintptr_t gen)
{
    return (gen << SLOT_BITS) | (uintptr_t)idx;
}

int dol_http_register(dol_http_req *c)
{
    pthread_mutex_lock(&g_mu);
    int32_t idx = g_free;
    if (idx >= 0) {
        g_free = g_slots[idx].next_free;
    } else {
        if (g_n == g_cap) {
            int32_t cap = g_cap ? g_cap * 2 : 64;
            slot *ns = cap < (1 << SLOT_BITS) ? realloc(g_slots, (size_t)cap * sizeof *ns) : NULL;
            if (!ns) {
                pthread_mutex_unlock(&g_mu);
                return -1;
            }
            g_slots = ns;
            g_cap = cap;
        }
        idx = g_n++;
        g_slots[idx].gen = 0;
    }
    slot *s = &g_slots[idx];
    s->gen = (s->gen + 1) & (UINTPTR_MAX >> SLOT_BITS);
    if (s->gen == 0) s->gen = 1;   /* handles are never 0 */
    s->c = c;
    s->next_free = -1;
    c->handle = make_handle(idx, s->gen);
    pthread_mutex_unlock(&g_mu);
    return 0;
}

dol_http_req *dol_http_lookup(uint64_t handle)
{
    uintptr_t h = (uintptr_t)handle;
    int32_t idx = (int32_t)(h & ((1u << SLOT_BITS) - 1));
    if (idx >= g_n) return NULL;
    slot *s = &g_slots[idx];
    if (!s->c || make_handle(idx, s->gen) != h) return NULL;
    return s->c;
}

void dol_http_unregister(dol_http_req *c)
{
    pthread_mutex_lock(&g_mu);
    if (dol_http_lookup(c->handle) == c) {
        int32_t idx = (int32_t)(c->handle & ((1u << SLOT_BITS) - 1));
        g_slots[idx].c = NULL;
        g_slots[idx].next_free = g_free;
        g_free = idx;
    }
    c->suspended = false;
    pthread_mutex_unlock(&g_mu);
}

static void wake_watcher(dol_server *s)
{
    char b = 1;
    if (write(s->watch_pipe[1], &b, 1) < 0) { /* full: a wake-up is pending anyway */ }
}

void dol_http_stop_all(dol_server *s)
{
    pthread_mutex_lock(&g_mu);
    s->stopping = true;
    for (int32_t i = 0; i < g_n; i++) {
        dol_http_req *c = g_slots[i].c;
        if (c && c->srv == s && c->suspended) {
            c->suspended = false;
            MHD_resume_connection(c->conn);
        }
    }
    wake_watcher(s);
    pthread_mutex_unlock(&g_mu);
    pthread_join(s->watcher, NULL);
    close(s->watch_pipe[0]);
    close(s->watch_pipe[1]);
}

void dol_http_clear_pending(dol_http_req *c)
{
    pthread_mutex_lock(&g_mu);
    c->pending = false;
    pthread_mutex_unlock(&g_mu);
}

dol_wait_result dol_http_suspend(dol_http_req *c)
{
    dol_wait_result res;
    pthread_mutex_lock(&g_mu);
    if (c->pending) {
        c->pending = false;
        res = DOL_WAIT_PENDING;
    } else if (c->srv->stopping) {
        res = DOL_WAIT_STOPPING;
    } else {
        c->suspended = true;
        c->unwatched = false;
        MHD_suspend_connection(c->conn);
        wake_watcher(c->srv);   /* one more socket to watch */
        res = DOL_WAIT_SUSPENDED;
    }
    pthread_mutex_unlock(&g_mu);
    return res;
}

void dol_http_on_event(dol_request *r, void *user)
{
    (void)r;
    pthread_mutex_lock(&g_mu);
    dol_http_req *c = dol_http_lookup((uint64_t)(uintptr_t)user);
    if (c) {
        if (c->suspended) {
            c->suspended = false;
            MHD_resume_connection(c->conn);
        } else {
            c->pending = true;
        }
    }
    pthread_mutex_unlock(&g_mu);
}

/* ---- the disconnect watcher ---------------------------------------------- */

static int conn_fd(const dol_http_req *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* The poll set: the wake-up pipe, then every suspended connection of s.
 * Returns the count, or -1 when s is stopping. Takes the lock. */
static int watch_set(dol_server *s, struct pollfd **fds, uint64_t **handles, int *cap)
{
    pthread_mutex_lock(&g_mu);
    if (s->stopping) {
        pthread_mutex_unlock(&g_mu);
        return -1;
    }
    int n = 1;
    for (int32_t i = 0; i < g_n; i++) {
        dol_http_req *c = g_slots[i].c;
        if (!c || c->srv != s || !c->suspended || c->unwatched) continue;
        int fd = conn_fd(c);
        if (fd < 0) continue;
        if (n == *cap) {
            int nc = *cap * 2;
            struct pollfd *nf = realloc(*fds, (size_t)nc * sizeof *nf);
            if (nf) *fds = nf;
            uint64_t *nh = realloc(*handles, (size_t)nc * sizeof *nh);
            if (nh) *handles = nh;
            if (!nf || !nh) break;   /* watch what fits; the rest next round */
            *cap = nc;
        }
        (*fds)[n] = (struct pollfd){.fd = fd, .events = POLLRDHUP};
        (*handles)[n] = c->handle;
        n++;
    }
    pthread_mutex_unlock(&g_mu);
    (*fds)[0] = (struct pollfd){.fd = s->watch_pipe[0], .events = POLLIN};
    return n;
}

/* A socket that reported a hang-up: is the peer really gone (EOF or an
 * error, not data still unread)? The connection is suspended, so its fd
 * cannot be closed under us: call with the lock held. */
static bool peer_closed(int fd)
{
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void *watcher_main(void *arg)
{
    dol_server *s = arg;
    int cap = 64, n;
    struct pollfd *fds = malloc((size_t)cap * sizeof *fds);
    uint64_t *handles = malloc((size_t)cap * sizeof *handles);
    while (fds && handles && (n = watch_set(s, &fds, &handles, &cap)) > 0) {
        if (poll(fds, (nfds_t)n, -1) < 0) continue;
        if (fds[0].revents) {
            char buf[64];
            while (read(s->watch_pipe[0], buf, sizeof buf) > 0) {}
        }
        pthread_mutex_lock(&g_mu);
        for (int i = 1; i < n; i++) {
            if (!fds[i].revents) continue;
            dol_http_req *c = dol_http_lookup(handles[i]);
            /* only a connection still suspended on that very socket */
            if (!c || !c->suspended || conn_fd(c) != fds[i].fd) continue;
            /* either way, not polled again until it is next suspended: a
             * half-close behind unread data, or a hang-up already acted on */
            c->unwatched = true;
            if (peer_closed(fds[i].fd) && c->gen)
                for (int k = 0; k < c->gen->n_submitted; k++) dol_request_cancel(c->gen->reqs[k]);
        }
        pthread_mutex_unlock(&g_mu);
    }
    free(fds);
    free(handles);
    return NULL;
}

int dol_http_watch_start(dol_server *s, char *err, size_t errlen)
{
    if (pipe2(s->watch_pipe, O_NONBLOCK | O_CLOEXEC) != 0) {
        dol_set_err(err, errlen, "cannot create the disconnect watcher's pipe: %s",
                    strerror(errno));
        return -1;
    }
    int rc = pthread_create(&s->watcher, NULL, watcher_main, s);
    if (rc != 0) {
        close(s->watch_pipe[0]);
        close(s->watch_pipe[1]);
        dol_set_err(err, errlen, "cannot start the disconnect watcher: %s", strerror(rc));
        return -1;
    }
    return 0;
}
