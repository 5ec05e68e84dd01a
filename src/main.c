/* src/main.c — dolphind: read the config, start the HTTP server (answering
 * /healthz 503 while loading), hand it the registry of the models it serves
 * (src/registry/registry.c: each loaded model has its own checkpoint,
 * tokenizer, engine and scheduler, loads on demand and is unloaded least
 * recently used first), wait for the start-up models (the pinned ones, or
 * the first) to load and warm up, report ready, and on SIGTERM/SIGINT drain
 * in-flight requests of every model before exiting 0. A signal while the
 * start-up models load ends the process at once (exit 0). While serving,
 * the main thread waits for a signal and, every 100 ms, samples the
 * readiness memory watch and lets the registry time out loads and waits. */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dolphin/config.h"
#include "dolphin/log.h"
#include "dolphin/models.h"
#include "dolphin/server.h"

static int fail(int code, const char *msg)
{
    fprintf(stderr, "dolphind: %s\n", msg);
    return code;
}

/* The SIGTERM/SIGINT waiting (blocked) in `sigs`, within timeout_ms
 * (0 = only look); 0 when none came. */
static int wait_signal(const sigset_t *sigs, long timeout_ms)
{
    struct timespec ts = {timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
    int sig = sigtimedwait(sigs, NULL, &ts);
    return sig > 0 ? sig : 0;
}

static const char *signal_name(int sig) { return sig == SIGINT ? "SIGINT" : "SIGTERM"; }

int main(int argc, char **argv)
{
    /* Blocks of 128 KiB and more (request bodies, libmicrohttpd's 256 KiB
     * connection pools, converted weights, KV caches) always get their own
     * mapping, returned on free: setting it stops glibc raising the
     * threshold after such a free and then keeping them in a heap that
     * fragments, so resident memory stays flat over a long run and an
     * unloaded model's memory goes back (docs/deployment.md, the soak test). */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    char err[DOL_ERR_LEN];
    dol_config cfg;
    int rc = dol_config_from_args(&cfg, argc, argv, err, sizeof err);
    if (rc == 1) return 0;
    if (rc != 0) return fail(2, err);
    if (cfg.n_models == 0)
        return fail(2, "no model: pass --model DIR (a Hugging Face Llama directory) or --model FILE.gguf, or set "
                    "model: or models: in the config");
    dol_log_set_level(cfg.log_level);

    /* Signals are handled synchronously by this thread (sigwait); every
     * thread started from here on inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int threads = cfg.threads > 0 ? cfg.threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;

    /* What exists so far (NULL = not made); the ladder at `out` frees it.
     * exit_code: 1 for a failure (err), 2 for a setting the model rules out,
     * 0 for a stop by signal. */
    dol_server *srv = NULL;
    dol_models *models = NULL;
    int exit_code = 1, sig = 0, left = 0;
    double t_drain = 0;

    if (dol_models_create(&cfg, threads, &models, err, sizeof err) != 0) return fail(1, err);
    if (dol_server_start(&cfg, &srv, err, sizeof err) != 0) {
        dol_models_free(models);
        return fail(1, err);
    }
    dol_server_attach(srv, models);
    dol_log(DOL_LOG_INFO, "listening", "host=%s port=%d models=%d max_loaded_models=%d",
            cfg.host, dol_server_port(srv), cfg.n_models, cfg.max_loaded_models);

    /* Load (and warm up) the start-up models. A signal meanwhile ends the
     * process at once: nothing to drain yet, and a load may sit in a call
     * that blocks for long (a slow disk, a FIFO). */
    double t0 = dol_now_ms();
    dol_models_start(models);
    for (;;) {
        bool config_error = false;
        int st = dol_models_startup(models, err, sizeof err, &config_error);
        if (st > 0) break;
        if (st < 0) {
            exit_code = config_error ? 2 : 1;
            goto out;
        }
        dol_server_set_state(srv, dol_models_warming(models) ? DOL_STATE_WARMING : DOL_STATE_LOADING);
        if ((sig = wait_signal(&sigs, 20)) != 0) {
            dol_log(DOL_LOG_INFO, "stopping", "signal=%s during=start-up", signal_name(sig));
            _exit(0);
        }
    }
    dol_server_set_state(srv, DOL_STATE_READY);
    dol_log(DOL_LOG_INFO, "ready", "port=%d startup_ms=%.0f", dol_server_port(srv), dol_now_ms() - t0);

    /* Serve: wait for SIGTERM/SIGINT, sampling the readiness watch and
     * timing out loads and waits. */
    while ((sig = wait_signal(&sigs, 100)) == 0) {
        dol_server_watch(srv);
        dol_models_tick(models);
    }

    /* Drain: /healthz and new work 503 at once; in-flight requests (streams
     * too) of every model get up to drain_timeout_s to finish; a second
     * signal cuts it short. */
    t_drain = dol_now_ms();
    dol_server_set_state(srv, DOL_STATE_DRAINING);
    dol_models_drain(models);
    dol_log(DOL_LOG_INFO, "draining", "signal=%s timeout_s=%.1f inflight=%d", signal_name(sig),
            cfg.drain_timeout_s, dol_server_inflight(srv));
    double deadline = t_drain + cfg.drain_timeout_s * 1000.0;
    int again = 0;
    /* requests waiting for a model's load, or holding one before they
     * submit, count as in flight */
    while ((dol_server_inflight(srv) > 0 || dol_models_waiting(models) > 0 ||
            dol_models_leased(models) > 0) &&
           dol_now_ms() < deadline)
        if ((again = wait_signal(&sigs, 10)) != 0) break;
    left = dol_server_inflight(srv) + dol_models_waiting(models);
    if (again)
        dol_log(DOL_LOG_WARN, "drain_cut_short", "signal=%s unfinished_requests=%d",
                signal_name(again), left);
    else if (left > 0)
        dol_log(DOL_LOG_WARN, "drain_timeout", "timeout_s=%.1f unfinished_requests=%d",
                cfg.drain_timeout_s, left);
    exit_code = 0;

out:   /* the cleanup ladder: whatever exists, in reverse order of making */
    dol_server_set_state(srv, DOL_STATE_DRAINING);
    dol_models_stop(models);          /* every scheduler: what is left ends with 503 */
    dol_server_wait_idle(srv, 1000);  /* the HTTP thread sends those answers */
    dol_server_stop(srv);             /* before the models its handlers read */
    dol_models_free(models);
    if (exit_code != 0) return fail(exit_code, err);
    if (t_drain > 0)
        dol_log(DOL_LOG_INFO, "stopped", "unfinished_requests=%d drain_ms=%.0f", left,
                dol_now_ms() - t_drain);
    else
        dol_log(DOL_LOG_INFO, "stopped", "unfinished_requests=0");
    return 0;
}
