/* src/main.c — dolphind: read the config, start the HTTP server (answering
 * /healthz 503 while loading), load the checkpoint and tokenizer, build the
 * engine and the scheduler, warm up, report ready, and on SIGTERM/SIGINT
 * drain in-flight requests before exiting 0. A signal while the model,
 * tokenizer or engine loads ends the process at once (exit 0). While serving,
 * the main thread waits for a signal and samples the readiness memory watch
 * every 100 ms. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dolphin/config.h"
#include "dolphin/engine.h"
#include "dolphin/log.h"
#include "dolphin/model.h"
#include "dolphin/scheduler.h"
#include "dolphin/server.h"
#include "dolphin/tokenizer.h"

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

/* While the model, tokenizer and engine load, the main thread sits in calls
 * that can block for long (a slow disk, a FIFO): this thread takes
 * SIGTERM/SIGINT meanwhile and ends the process at once. */
typedef struct {
    pthread_t thread;
    const sigset_t *sigs;
    atomic_bool stop;
} load_watch;

static void *load_watch_main(void *arg)
{
    load_watch *w = arg;
    while (!atomic_load(&w->stop)) {
        int sig = wait_signal(w->sigs, 20);
        if (sig) {
            /* nothing to drain yet; the mappings and sockets go with the process */
            dol_log(DOL_LOG_INFO, "stopping", "signal=%s during=start-up", signal_name(sig));
            _exit(0);
        }
    }
    return NULL;
}

/* 0 when the watch runs; otherwise signals wait for the main thread as before. */
static int load_watch_start(load_watch *w, const sigset_t *sigs)
{
    w->sigs = sigs;
    atomic_init(&w->stop, false);
    return pthread_create(&w->thread, NULL, load_watch_main, w);
}

/* Back to synchronous handling: a signal the watch has not taken stays
 * pending for the main thread's sigtimedwait. */
static void load_watch_stop(load_watch *w)
{
    atomic_store(&w->stop, true);
    pthread_join(w->thread, NULL);
}

/* One warm-up generation: a prompt of n_prompt tokens (BOS, then arbitrary
 * ids), n choices, max_tokens each, greedy. 0 done, 1 skipped (the shape
 * does not fit this configuration), 2 interrupted by a signal (*sig set),
 * -1 failed (err). */
static int warm_one(dol_scheduler *sched, const dol_model *m, int n_prompt, int n,
                    int max_tokens, const sigset_t *sigs, int *sig, char *err, size_t errlen)
{
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_prompt);
    dol_output *out = calloc((size_t)n, sizeof *out);
    if (!ids || !out) {
        free(ids);
        free(out);
        dol_set_err(err, errlen, "warm-up: out of memory");
        return -1;
    }
    ids[0] = m->cfg.bos_token_id;
    for (int i = 1; i < n_prompt; i++) ids[i] = (int32_t)((13 + 17 * i) % m->cfg.vocab_size);
    char id[64];
    snprintf(id, sizeof id, "warmup-%dx%d", n_prompt, n);
    dol_request_params p = {.prompt_ids = ids, .n_prompt = n_prompt, .n = n,
                            .max_tokens = max_tokens, .ignore_eos = true, .logprobs = -1,
                            .id = id};
    dol_sampling_params_default(&p.sampling);
    p.sampling.temperature = 0.0f;
    dol_request *r = dol_request_create(&p);
    free(ids);
    if (!r) {
        free(out);
        dol_set_err(err, errlen, "warm-up: out of memory");
        return -1;
    }
    int rc = 0;
    dol_request_state st = {0};
    dol_submit_result sr = dol_scheduler_submit(sched, r, err, errlen);
    if (sr != DOL_SUBMIT_OK) {
        rc = sr == DOL_SUBMIT_TOO_LONG || sr == DOL_SUBMIT_INVALID ? 1 : -1;
        goto out;
    }
    for (;;) {
        if (dol_request_read(r, out, &st) != 0) {
            dol_set_err(err, errlen, "warm-up: out of memory");
            dol_request_cancel(r);
            rc = -1;
            break;
        }
        if (st.done) break;
        if ((*sig = wait_signal(sigs, 2)) != 0) {
            dol_request_cancel(r);
            rc = 2;
            break;
        }
    }
    if (rc == 0 && st.error_status) {
        dol_set_err(err, errlen, "warm-up failed: %s", st.error_msg);
        rc = -1;
    }
out:
    dol_output_free(out, n);
    free(out);
    dol_request_state_free(&st);
    dol_request_release(r);
    return rc;
}

/* Warm up before reporting ready: every path through the engine that
 * serving takes, once — a one-token prompt decoding alone, then a prompt of
 * several tokens (a prefill chunk) forked into a full decode batch of
 * max_batch_size sequences (skipped when it cannot fit the KV pool).
 * 0 ok, 2 interrupted by a signal (*sig), -1 failed. */
static int warm_up(dol_scheduler *sched, const dol_model *m, const dol_config *cfg,
                   int ctx, const sigset_t *sigs, int *sig, char *err, size_t errlen)
{
    double t0 = dol_now_ms();
    int rc = warm_one(sched, m, 1, 1, 4, sigs, sig, err, errlen);
    if (rc == 1) return -1;   /* the smallest shape must fit */
    if (rc != 0) return rc;
    int prompt = cfg->prefill_chunk < 32 ? cfg->prefill_chunk : 32;
    if (prompt > ctx / 2) prompt = ctx / 2;
    int batch = cfg->max_batch_size;
    int full = prompt >= 2 ? warm_one(sched, m, prompt, batch, 2, sigs, sig, err, errlen) : 1;
    if (full == 2 || full < 0) return full;
    dol_log(DOL_LOG_INFO, "warmed_up", "shapes=%s prompt_tokens=%d batch=%d ms=%.0f",
            full == 0 ? "single,batch" : "single", prompt, full == 0 ? batch : 1,
            dol_now_ms() - t0);
    return 0;
}

/* Settings that only the model's context length can judge: context_len
 * above max_position_embeddings is clamped (with a warning), and a default
 * max_tokens that leaves no room for a prompt would make every completion
 * without max_tokens fail, so it is refused. */
static int check_context(const dol_config *cfg, const dol_model_config *mc, char *err,
                         size_t errlen)
{
    int ctx = mc->max_position_embeddings;
    const char *from = "max_position_embeddings";
    if (cfg->context_len > ctx) {
        dol_log(DOL_LOG_WARN, "context_len_clamped",
                "context_len=%d max_position_embeddings=%d using=%d", cfg->context_len, ctx, ctx);
    } else if (cfg->context_len > 0) {
        ctx = cfg->context_len;
        from = "context_len";
    }
    int mt = cfg->max_tokens;
    if (cfg->max_tokens_cap > 0 && cfg->max_tokens_cap < mt) mt = cfg->max_tokens_cap;
    if (mt < ctx) return 0;
    if (mt != cfg->max_tokens)
        dol_set_err(err, errlen, "max_tokens_cap %d (capping the default max_tokens %d) leaves no "
                    "room for a prompt in the context of %d tokens (%s): it must be below %d",
                    mt, cfg->max_tokens, ctx, from, ctx);
    else
        dol_set_err(err, errlen, "max_tokens %d (the default for completions) leaves no room for "
                    "a prompt in the context of %d tokens (%s): it must be below %d", mt, ctx,
                    from, ctx);
    return -1;
}

/* The tokenizer must not make ids the model has no embedding row for;
 * config.json may pad vocab_size above the tokenizer's count. */
static int check_vocab(const char *dir, const dol_model *m, const dol_tokenizer *tok, char *err,
                       size_t errlen)
{
    int n = dol_tokenizer_vocab_size(tok);
    if (n <= m->cfg.vocab_size) return 0;
    dol_set_err(err, errlen, "%s/tokenizer.model: %d pieces, more than %s/config.json field "
                "vocab_size %d: the tokenizer does not belong to this model", dir, n, dir,
                m->cfg.vocab_size);
    return -1;
}

int main(int argc, char **argv)
{
    char err[DOL_ERR_LEN];
    dol_config cfg;
    int rc = dol_config_from_args(&cfg, argc, argv, err, sizeof err);
    if (rc == 1) return 0;
    if (rc != 0) return fail(2, err);
    if (cfg.model[0] == '\0')
        return fail(2, "no model: pass --model DIR (a Hugging Face Llama directory) or set model: in the config");
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
    dol_model *model = NULL;
    dol_tokenizer *tok = NULL;
    dol_engine *engine = NULL;
    dol_scheduler *sched = NULL;
    int exit_code = 1, sig = 0, left = 0;
    double t_drain = 0;

    if (dol_server_start(&cfg, &srv, err, sizeof err) != 0) return fail(1, err);
    dol_log(DOL_LOG_INFO, "listening", "host=%s port=%d", cfg.host, dol_server_port(srv));

    double t0 = dol_now_ms();
    load_watch watch;
    bool watching = load_watch_start(&watch, &sigs) == 0;
    if (dol_model_load(cfg.model, &model, err, sizeof err) != 0) goto out;
    if (cfg.served_model_name[0])
        snprintf(model->name, sizeof model->name, "%s", cfg.served_model_name);
    if (check_context(&cfg, &model->cfg, err, sizeof err) != 0) {
        exit_code = 2;   /* a setting at fault, as for any other config error */
        goto out;
    }

    char tok_path[1200];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.model", cfg.model);
    if (dol_tokenizer_load(tok_path, &tok, err, sizeof err) != 0) goto out;
    if (check_vocab(cfg.model, model, tok, err, sizeof err) != 0) goto out;

    dol_engine_params ep = {0};
    ep.n_threads = threads;
    ep.kv_block_size = cfg.kv_block_size;
    ep.kv_cache_tokens = cfg.kv_cache_tokens;
    ep.prefix_caching = cfg.prefix_caching;
    ep.kv_cache_bytes = cfg.kv_cache_bytes;
    ep.max_seqs = cfg.max_batch_size + 1;
    ep.max_batch_tokens = cfg.prefill_chunk + cfg.max_batch_size;
    ep.context_len = cfg.context_len;
    ep.weights = cfg.weights;
    ep.quantize_lm_head = cfg.quantize_lm_head;
    ep.backend = cfg.backend;
    ep.gpu_memory_utilization = cfg.gpu_memory_utilization;
    if (dol_engine_create(model, &ep, &engine, err, sizeof err) != 0) goto out;
    load_watch_stop(&watch);
    watching = false;

    dol_scheduler_params sp = {0};
    sp.max_batch_size = cfg.max_batch_size;
    sp.batch_window_ms = cfg.batch_window_ms;
    sp.mode = cfg.batch_mode;
    sp.max_queue = cfg.max_queue;
    sp.memory_high_watermark = cfg.memory_high_watermark;
    sp.prefill_chunk = cfg.prefill_chunk;
    if (dol_scheduler_create(engine, tok, &sp, &sched, err, sizeof err) != 0) goto out;
    dol_server_attach(srv, model, tok, sched);
    dol_log(DOL_LOG_INFO, "model_loaded",
            "backend=%s cpu_kernels=%s model=%s layers=%d hidden=%d heads=%d kv_heads=%d vocab=%d ctx=%d "
            "weight_bytes=%zu kv_blocks=%d kv_block_size=%d threads=%d load_ms=%.0f",
            dol_engine_backend_name(engine), dol_engine_cpu_kernels(), model->name, model->cfg.n_layers, model->cfg.hidden_size, model->cfg.n_heads,
            model->cfg.n_kv_heads, model->cfg.vocab_size, dol_engine_context_len(engine),
            dol_engine_weight_bytes(engine), dol_engine_kv_blocks_total(engine),
            dol_engine_kv_block_size(engine), threads, dol_now_ms() - t0);
    if (strcmp(dol_engine_backend_name(engine), "cuda") == 0)
        dol_log(DOL_LOG_WARN, "cuda_unverified",
                "msg=\"this CUDA backend has been verified under the CUDA emulation only, "
                "not on a GPU; see docs/cuda.md\"");
    dol_quant_stats qs;
    dol_engine_quant_stats(engine, &qs);
    if (qs.n_quantized > 0)
        dol_log(DOL_LOG_INFO, "weights_quantized",
                "format=%s matrices=%d seconds=%.3f bytes_before=%zu bytes_after=%zu "
                "linear_bytes=%zu linear_f16_bytes=%zu ratio_vs_f16=%.3f lm_head=%s",
                dol_config_choice_name("weights", cfg.weights), qs.n_quantized, qs.quant_seconds,
                qs.quant_bytes_before, qs.quant_bytes_after, qs.linear_bytes, qs.linear_f16_bytes,
                qs.linear_f16_bytes ? (double)qs.linear_bytes / (double)qs.linear_f16_bytes : 0.0,
                cfg.quantize_lm_head ? dol_config_choice_name("weights", cfg.weights) : "kept");

    if ((sig = wait_signal(&sigs, 0)) != 0) goto stop_early;
    dol_server_set_state(srv, DOL_STATE_WARMING);
    if (cfg.warmup) {
        int wrc = warm_up(sched, model, &cfg, dol_engine_context_len(engine), &sigs, &sig, err,
                          sizeof err);
        if (wrc == 2) goto stop_early;
        if (wrc != 0) goto out;
    }
    dol_server_set_state(srv, DOL_STATE_READY);
    dol_log(DOL_LOG_INFO, "ready", "port=%d startup_ms=%.0f", dol_server_port(srv), dol_now_ms() - t0);

    /* Serve: wait for SIGTERM/SIGINT, sampling the readiness watch. */
    while ((sig = wait_signal(&sigs, 100)) == 0) dol_server_watch(srv);

    /* Drain: /healthz and new work 503 at once; in-flight requests (streams
     * too) get up to drain_timeout_s to finish; a second signal cuts it short. */
    t_drain = dol_now_ms();
    dol_server_set_state(srv, DOL_STATE_DRAINING);
    dol_scheduler_drain(sched);
    dol_log(DOL_LOG_INFO, "draining", "signal=%s timeout_s=%.1f inflight=%d", signal_name(sig),
            cfg.drain_timeout_s, dol_server_inflight(srv));
    double deadline = t_drain + cfg.drain_timeout_s * 1000.0;
    int again = 0;
    while (dol_server_inflight(srv) > 0 && dol_now_ms() < deadline)
        if ((again = wait_signal(&sigs, 10)) != 0) break;
    left = dol_server_inflight(srv);
    if (again)
        dol_log(DOL_LOG_WARN, "drain_cut_short", "signal=%s unfinished_requests=%d",
                signal_name(again), left);
    else if (left > 0)
        dol_log(DOL_LOG_WARN, "drain_timeout", "timeout_s=%.1f unfinished_requests=%d",
                cfg.drain_timeout_s, left);
    exit_code = 0;
    goto out;

stop_early:   /* SIGTERM/SIGINT before ready: free what exists, exit 0 */
    dol_log(DOL_LOG_INFO, "stopping", "signal=%s during=start-up", signal_name(sig));
    dol_server_set_state(srv, DOL_STATE_DRAINING);
    exit_code = 0;
out:   /* the cleanup ladder: whatever exists, in reverse order of making */
    if (watching) load_watch_stop(&watch);
    if (sched) {
        dol_server_attach(srv, model, tok, NULL); /* /healthz must not see a freed scheduler */
        dol_scheduler_free(sched);                /* ends whatever is left with 503 */
        dol_server_wait_idle(srv, 1000);          /* the HTTP thread sends those answers */
    }
    dol_server_stop(srv);   /* before the model and tokenizer its handlers read */
    dol_engine_free(engine);
    dol_tokenizer_free(tok);
    dol_model_free(model);
    if (exit_code != 0) return fail(exit_code, err);
    if (t_drain > 0)
        dol_log(DOL_LOG_INFO, "stopped", "unfinished_requests=%d drain_ms=%.0f", left,
                dol_now_ms() - t_drain);
    else
        dol_log(DOL_LOG_INFO, "stopped", "unfinished_requests=0");
    return 0;
}
