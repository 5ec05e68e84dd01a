/* src/main.c — dolphind: read the config, start the HTTP server (answering
 * /healthz 503 while loading), load the checkpoint and tokenizer, build the
 * engine and the scheduler, warm up, report ready, and on SIGTERM/SIGINT
 * drain in-flight requests before exiting 0. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* One short greedy generation through the whole path before reporting ready. */
static int warm_up(dol_scheduler *sched, const dol_model *m, char *err, size_t errlen)
{
    dol_request *r = dol_request_new();
    if (!r) { dol_set_err(err, errlen, "warm-up: out of memory"); return -1; }
    r->prompt_ids = malloc(sizeof(int32_t));
    if (!r->prompt_ids) { dol_request_release(r); return -1; }
    r->prompt_ids[0] = m->cfg.bos_token_id;
    r->n_prompt = 1;
    r->max_tokens = 4;
    r->sampling.temperature = 0.0f;
    r->ignore_eos = true;
    snprintf(r->id, sizeof r->id, "warmup");
    if (dol_request_alloc_choices(r) != 0) { dol_request_release(r); return -1; }
    if (dol_scheduler_submit(sched, r, err, errlen) != DOL_SUBMIT_OK) {
        dol_request_release(r);
        return -1;
    }
    for (;;) {
        pthread_mutex_lock(&r->mu);
        bool done = r->done;
        pthread_mutex_unlock(&r->mu);
        if (done) break;
        usleep(2000);
    }
    int rc = r->error_status ? -1 : 0;
    if (rc) dol_set_err(err, errlen, "warm-up failed: %s", r->error_msg);
    dol_request_release(r);
    return rc;
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
    int lvl = dol_log_parse_level(cfg.log_level);
    dol_log_set_level(lvl < 0 ? DOL_LOG_INFO : (dol_log_level)lvl);

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

    dol_server *srv = NULL;
    if (dol_server_start(&cfg, &srv, err, sizeof err) != 0) return fail(1, err);
    dol_log(DOL_LOG_INFO, "listening", "host=%s port=%d", cfg.host, dol_server_port(srv));

    double t0 = dol_now_ms();
    dol_model *model = NULL;
    if (dol_model_load(cfg.model, &model, err, sizeof err) != 0) {
        dol_server_stop(srv);
        return fail(1, err);
    }
    if (cfg.served_model_name[0])
        snprintf(model->name, sizeof model->name, "%s", cfg.served_model_name);

    char tok_path[1200];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.model", cfg.model);
    dol_tokenizer *tok = NULL;
    if (dol_tokenizer_load(tok_path, &tok, err, sizeof err) != 0) {
        dol_model_free(model);
        dol_server_stop(srv);
        return fail(1, err);
    }

    dol_engine_params ep = {0};
    ep.n_threads = threads;
    ep.kv_block_size = cfg.kv_block_size;
    ep.kv_cache_tokens = cfg.kv_cache_tokens;
    ep.kv_cache_bytes = cfg.kv_cache_bytes;
    ep.max_seqs = cfg.max_batch_size + 1;
    ep.max_batch_tokens = cfg.prefill_chunk + cfg.max_batch_size;
    ep.context_len = cfg.context_len;
    if (strcmp(cfg.weights, "f32") == 0) ep.weights = DOL_WEIGHTS_F32;
    else if (strcmp(cfg.weights, "f16") == 0) ep.weights = DOL_WEIGHTS_F16;
    else if (strcmp(cfg.weights, "nf4") == 0) ep.weights = DOL_WEIGHTS_NF4;
    else ep.weights = DOL_WEIGHTS_AUTO;
    ep.quantize_lm_head = cfg.quantize_lm_head;
    ep.backend = strcmp(cfg.backend, "cuda") == 0  ? DOL_BACKEND_CUDA
                 : strcmp(cfg.backend, "cpu") == 0 ? DOL_BACKEND_CPU
                                                   : DOL_BACKEND_AUTO;
    ep.gpu_memory_fraction = 0.90;

    dol_engine *engine = NULL;
    if (dol_engine_create(model, &ep, &engine, err, sizeof err) != 0) {
        dol_tokenizer_free(tok);
        dol_model_free(model);
        dol_server_stop(srv);
        return fail(1, err);
    }

    dol_scheduler_params sp = {0};
    sp.max_batch_size = cfg.max_batch_size;
    sp.batch_window_ms = cfg.batch_window_ms;
    sp.mode = strcmp(cfg.batch_mode, "static") == 0 ? DOL_BATCH_STATIC : DOL_BATCH_CONTINUOUS;
    sp.max_queue = cfg.max_queue;
    sp.memory_high_watermark = cfg.memory_high_watermark;
    sp.prefill_chunk = cfg.prefill_chunk;
    dol_scheduler *sched = NULL;
    if (dol_scheduler_create(engine, tok, &sp, &sched, err, sizeof err) != 0) {
        dol_engine_free(engine);
        dol_tokenizer_free(tok);
        dol_model_free(model);
        dol_server_stop(srv);
        return fail(1, err);
    }
    dol_server_attach(srv, model, tok, sched);
    dol_log(DOL_LOG_INFO, "model_loaded",
            "backend=%s model=%s layers=%d hidden=%d heads=%d kv_heads=%d vocab=%d ctx=%d weight_bytes=%zu "
            "kv_blocks=%d kv_block_size=%d threads=%d load_ms=%.0f",
            dol_engine_backend_name(engine), model->name, model->cfg.n_layers, model->cfg.hidden_size, model->cfg.n_heads,
            model->cfg.n_kv_heads, model->cfg.vocab_size, dol_engine_context_len(engine),
            dol_engine_weight_bytes(engine), dol_engine_kv_blocks_total(engine),
            dol_engine_kv_block_size(engine), threads, dol_now_ms() - t0);
    dol_quant_stats qs;
    dol_engine_quant_stats(engine, &qs);
    if (qs.n_quantized > 0)
        dol_log(DOL_LOG_INFO, "weights_quantized",
                "format=%s matrices=%d seconds=%.3f bytes_before=%zu bytes_after=%zu "
                "linear_bytes=%zu linear_f16_bytes=%zu ratio_vs_f16=%.3f lm_head=%s",
                cfg.weights, qs.n_quantized, qs.quant_seconds, qs.quant_bytes_before,
                qs.quant_bytes_after, qs.linear_bytes, qs.linear_f16_bytes,
                qs.linear_f16_bytes ? (double)qs.linear_bytes / (double)qs.linear_f16_bytes : 0.0,
                cfg.quantize_lm_head ? "nf4" : "kept");

    dol_server_set_state(srv, DOL_STATE_WARMING);
    if (cfg.warmup && warm_up(sched, model, err, sizeof err) != 0) {
        dol_scheduler_free(sched);
        dol_server_stop(srv);
        dol_engine_free(engine);
        dol_tokenizer_free(tok);
        dol_model_free(model);
        return fail(1, err);
    }
    dol_server_set_state(srv, DOL_STATE_READY);
    dol_log(DOL_LOG_INFO, "ready", "port=%d startup_ms=%.0f", dol_server_port(srv), dol_now_ms() - t0);

    int sig = 0;
    sigwait(&sigs, &sig);
    dol_log(DOL_LOG_INFO, "draining", "signal=%s timeout_s=%.1f", sig == SIGINT ? "SIGINT" : "SIGTERM",
            cfg.drain_timeout_s);
    dol_server_set_state(srv, DOL_STATE_DRAINING);
    dol_scheduler_drain(sched);
    double deadline = dol_now_ms() + cfg.drain_timeout_s * 1000.0;
    while (dol_server_inflight(srv) > 0 && dol_now_ms() < deadline) usleep(10000);
    int left = dol_server_inflight(srv);
    dol_server_attach(srv, model, tok, NULL); /* /healthz must not see a freed scheduler */
    dol_scheduler_free(sched);   /* ends whatever is left with 503 */
    usleep(50000);               /* let the HTTP thread flush those answers */
    dol_server_stop(srv);
    dol_engine_free(engine);
    dol_tokenizer_free(tok);
    dol_model_free(model);
    dol_log(DOL_LOG_INFO, "stopped", "unfinished_requests=%d", left);
    return 0;
}
