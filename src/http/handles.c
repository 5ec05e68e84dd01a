/* src/http/handles.c — the bridge between the scheduler thread and MHD's
 * polling thread (ground floor of src/http).
 *
 * The scheduler calls on_event with a numeric handle, not a pointer: a
 * request can outlive its HTTP context (the client went away, or the server
 * stopped first), so each call looks the handle up in a process-wide table
 * under one lock and does nothing when the context is gone. The same lock
 * guards each context's `suspended` / `pending` flags and is held across
 * MHD_suspend_connection / MHD_resume_connection, which closes the race
 * between "nothing to send, suspend" and "new output, resume".
 * Lock order: this lock, then MHD's internal ones (MHD does not call us
 * back while holding those); docs/architecture.md. The disconnect watcher
 * (watcher.c) walks the same table under the same lock. */
#include "http/http.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

void dol_http_each_locked(void (*fn)(dol_http_req *c, void *arg), void *arg)
{
    for (int32_t i = 0; i < g_n; i++)
        if (g_slots[i].c) fn(g_slots[i].c, arg);
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
    pthread_mutex_unlock(&g_mu);
    dol_http_watch_stop(s);
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
        dol_http_watch_wake(c->srv);   /* one more socket to watch */
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
