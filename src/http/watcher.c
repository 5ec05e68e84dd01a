/* src/http/watcher.c — the disconnect watcher (ground floor of src/http).
 * libmicrohttpd does not watch the socket of a suspended connection, so a
 * client that hangs up while its request waits for the model would go
 * unnoticed until the next output. Each server's watcher thread polls those
 * sockets for a hang-up and cancels the requests; the scheduler frees them
 * at its next step. It walks the handle table (handles.c) under its lock. */
#include "http/http.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int conn_fd(const dol_http_req *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

typedef struct {
    dol_server *s;
    struct pollfd *fds;
    uint64_t *handles;
    int n, cap;
    bool full;           /* out of memory: the rest waits for the next round */
} poll_set;

static void add_suspended(dol_http_req *c, void *arg)
{
    poll_set *ps = arg;
    if (ps->full || c->srv != ps->s || !c->suspended || c->unwatched) return;
    int fd = conn_fd(c);
    if (fd < 0) return;
    if (ps->n == ps->cap) {
        int nc = ps->cap * 2;
        struct pollfd *nf = realloc(ps->fds, (size_t)nc * sizeof *nf);
        if (nf) ps->fds = nf;
        uint64_t *nh = realloc(ps->handles, (size_t)nc * sizeof *nh);
        if (nh) ps->handles = nh;
        if (!nf || !nh) {
            ps->full = true;
            return;
        }
        ps->cap = nc;
    }
    ps->fds[ps->n] = (struct pollfd){.fd = fd, .events = POLLRDHUP};
    ps->handles[ps->n] = c->handle;
    ps->n++;
}

/* The poll set: the wake-up pipe, then every suspended connection of s.
 * Returns the count, or -1 when s is stopping. Takes the lock. */
static int watch_set(poll_set *ps)
{
    dol_http_lock();
    if (ps->s->stopping) {
        dol_http_unlock();
        return -1;
    }
    ps->n = 1;
    ps->full = false;
    dol_http_each_locked(add_suspended, ps);
    dol_http_unlock();
    ps->fds[0] = (struct pollfd){.fd = ps->s->watch_pipe[0], .events = POLLIN};
    return ps->n;
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
    poll_set ps = {.s = s, .cap = 64};
    ps.fds = malloc((size_t)ps.cap * sizeof *ps.fds);
    ps.handles = malloc((size_t)ps.cap * sizeof *ps.handles);
    int n;
    while (ps.fds && ps.handles && (n = watch_set(&ps)) > 0) {
        struct pollfd *fds = ps.fds;
        uint64_t *handles = ps.handles;
        if (poll(fds, (nfds_t)n, -1) < 0) continue;
        if (fds[0].revents) {
            char buf[64];
            while (read(s->watch_pipe[0], buf, sizeof buf) > 0) {}
        }
        dol_http_lock();
        for (int i = 1; i < n; i++) {
            if (!fds[i].revents) continue;
            dol_http_req *c = dol_http_lookup(handles[i]);
            /* only a connection still suspended on that very socket */
            if (!c || !c->suspended || conn_fd(c) != fds[i].fd) continue;
            /* either way, not polled again until it is next suspended: a
             * half-close behind unread data, or a hang-up already acted on */
            c->unwatched = true;
            if (peer_closed(fds[i].fd) && c->cmpl)
                for (int k = 0; k < c->cmpl->n_submitted; k++) dol_request_cancel(c->cmpl->reqs[k]);
        }
        dol_http_unlock();
    }
    free(ps.fds);
    free(ps.handles);
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

void dol_http_watch_wake(dol_server *s)
{
    char b = 1;
    if (write(s->watch_pipe[1], &b, 1) < 0) { /* full: a wake-up is pending anyway */ }
}

void dol_http_watch_stop(dol_server *s)
{
    dol_http_watch_wake(s);
    pthread_join(s->watcher, NULL);
    close(s->watch_pipe[0]);
    close(s->watch_pipe[1]);
}
