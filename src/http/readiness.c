/* src/http/readiness.c — what /healthz, /metrics and the main thread's
 * watch judge readiness from: the server's state, the scheduler's heartbeat
 * (work pending and no progress for too long), and the device-memory
 * hysteresis (use above vram_unready_ratio for vram_unready_after_s), kept
 * per server under its watch_mu. */
#include "http/http.h"

#include <string.h>

#include "dolphin/log.h"

double dol_http_age_ms(double since, double now)
{
    if (since <= 0) return 0;
    return now > since ? now - since : 0;
}

/* Feed one memory sample to the hysteresis: memory use must stay above
 * vram_unready_ratio for vram_unready_after_s (every sample above it) before
 * readiness drops; the first sample at or below it restores it. Transitions
 * are logged. Returns how long use has been above, in ms (0 = not above). */
static double watch_memory(dol_server *s, const dol_scheduler_stats *st, double now,
                           bool *unready)
{
    const dol_config *cfg = s->cfg;
    double ratio = st->mem_total_bytes ? (double)st->mem_used_bytes / (double)st->mem_total_bytes : 0;
    bool above = ratio > cfg->vram_unready_ratio;
    int changed = 0;   /* +1 became unready, -1 became ready again */
    double above_ms = 0;
    pthread_mutex_lock(&s->watch_mu);
    if (above) {
        if (!s->mem_above) {
            s->mem_above = true;
            s->mem_above_since_ms = now;
        }
        above_ms = dol_http_age_ms(s->mem_above_since_ms, now);
        if (!s->mem_unready && above_ms >= cfg->vram_unready_after_s * 1000.0) {
            s->mem_unready = true;
            changed = 1;
        }
    } else {
        if (s->mem_unready) changed = -1;
        s->mem_above = false;
        s->mem_unready = false;
    }
    *unready = s->mem_unready;
    pthread_mutex_unlock(&s->watch_mu);
    if (changed)
        dol_log(changed > 0 ? DOL_LOG_WARN : DOL_LOG_INFO,
                changed > 0 ? "memory_unready" : "memory_ready",
                "used_bytes=%zu total_bytes=%zu ratio=%.3f unready_ratio=%.3f above_s=%.1f",
                st->mem_used_bytes, st->mem_total_bytes, ratio, cfg->vram_unready_ratio,
                above_ms / 1000.0);
    return above_ms;
}

void dol_http_readiness_get(dol_server *s, dol_http_readiness *r)
{
    memset(r, 0, sizeof *r);
    r->state = dol_http_state(s);
    r->have_sched = dol_http_sched_stats(s, -1, &r->st);
    dol_models *m = dol_http_models_of(s);
    r->models_ready = m && dol_models_ready(m);
    double now = dol_now_ms();
    if (r->have_sched) {
        r->mem_ratio = r->st.mem_total_bytes
                           ? (double)r->st.mem_used_bytes / (double)r->st.mem_total_bytes : 0;
        r->mem_above_s = watch_memory(s, &r->st, now, &r->mem_unready) / 1000.0;
        r->loop_age_ms = dol_http_age_ms(r->st.last_step_ms, now);
        r->progress_age_ms = r->st.idle ? 0 : dol_http_age_ms(r->st.last_progress_ms, now);
        r->stalled = r->progress_age_ms > DOL_HTTP_STALL_READY_MS || r->loop_age_ms > DOL_HTTP_STALL_READY_MS;
    } else {
        pthread_mutex_lock(&s->watch_mu);
        r->mem_unready = s->mem_unready;
        pthread_mutex_unlock(&s->watch_mu);
    }
    r->ready = r->state == DOL_STATE_READY && r->have_sched && r->models_ready &&
               !r->mem_unready && !r->stalled;
}

void dol_server_watch(dol_server *s)
{
    dol_http_readiness r;
    dol_http_readiness_get(s, &r);
}

