/* src/http/completion.c — what POST /v1/completions and POST
 * /v1/chat/completions share once their route has parsed the body: the
 * per-request completion state (dol_http_cmpl), one dol_request per prompt
 * (after the scheduler said it fits), queueing them, and the cleanup at
 * completion. The answer, whole or streamed, is completion_reply.c's.
 *
 * Choices are numbered across prompts: choice i of prompt p is p * n + i. */
#include "http/http.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dol_http_cmpl_begin(dol_http_req *c, bool chat, dol_http_attached *a, dol_api_error *e)
{
    c->cmpl = calloc(1, sizeof *c->cmpl);
    if (!c->cmpl) return dol_api_error_oom(e);
    c->cmpl->chat = chat;
    c->cmpl->logprobs = -1;
    if (!a->model || !a->tok || !a->has_sched) {
        dol_api_error_not_loaded(e);
        return -1;
    }
    c->cmpl->tok = a->tok;
    snprintf(c->cmpl->model_name, sizeof c->cmpl->model_name, "%s", a->name);
    char hex[25];
    dol_http_random_hex(hex, 12);
    snprintf(c->cmpl->cmpl_id, sizeof c->cmpl->cmpl_id, "%s-%s", c->cmpl->chat ? "chatcmpl" : "cmpl", hex);
    c->cmpl->created = (int64_t)time(NULL);
    return 0;
}

void dol_http_api_limits(const dol_http_req *c, const dol_http_attached *a,
                         dol_api_limits *lim)
{
    const dol_config *cfg = c->srv->cfg;
    int vocab = a->model->cfg.vocab_size;
    int tv = dol_tokenizer_vocab_size(a->tok);
    if (tv > 0 && tv < vocab) vocab = tv;
    lim->vocab_size = vocab;
    lim->context_len = a->context_len;
    lim->default_max_tokens = cfg->max_tokens;
    lim->default_temperature = cfg->temperature;
    lim->default_top_p = cfg->top_p;
    lim->default_top_k = cfg->top_k;
    lim->max_prompt_tokens = cfg->max_prompt_tokens;
    lim->max_tokens_cap = cfg->max_tokens_cap;
    lim->max_n = cfg->max_n;
    lim->max_stop = cfg->max_stop;
    lim->max_stop_len = cfg->max_stop_len;
    lim->max_logit_bias = cfg->max_logit_bias;
    lim->max_grammar_states = cfg->max_grammar_states;
}

int dol_http_check_model(dol_http_req *c, const char *model, const dol_http_attached *a,
                         dol_api_error *e)
{
    dol_models *m = dol_http_models_of(c->srv);
    if (!model || strcmp(model, a->name) == 0 || (m && dol_models_find(m, model) == a->model_idx))
        return 0;
    dol_api_error_set(e, 404, "invalid_request_error", "model", "model_not_found",
                      "The model '%.200s' does not exist; this request was given '%s'.",
                      model, a->name);
    return -1;
}

static int request_priority(dol_http_req *c)
{
    char buf[sizeof c->srv->cfg->api_keys[0].key];
    int pr = dol_config_key_priority(c->srv->cfg, dol_http_bearer_key(c->conn, buf, sizeof buf));
    return pr < 0 ? c->srv->cfg->default_priority : pr;
}

int dol_http_cmpl_prepare(dol_http_req *c, const dol_http_attached *a,
                         const dol_completion_params *p, int n_reqs, dol_api_error *e)
{
    const dol_config *cfg = c->srv->cfg;
    if (dol_http_check_model(c, p->model, a, e)) return -1;
    if (p->n > cfg->max_batch_size) {
        dol_reason_info in = {.reason = DOL_REASON_TOO_MANY_CHOICES, .n = p->n,
                              .limit = cfg->max_batch_size};
        dol_api_error_from_reason(e, &in, NULL);
        return -1;
    }
    c->cmpl->reqs = calloc((size_t)n_reqs, sizeof *c->cmpl->reqs);
    c->cmpl->echo_text = calloc((size_t)n_reqs, sizeof *c->cmpl->echo_text);
    c->cmpl->outs = calloc((size_t)n_reqs * (size_t)p->n, sizeof *c->cmpl->outs);
    c->cmpl->st = calloc((size_t)n_reqs, sizeof *c->cmpl->st);
    if (!c->cmpl->reqs || !c->cmpl->echo_text || !c->cmpl->outs || !c->cmpl->st) return dol_api_error_oom(e);
    c->cmpl->n_reqs = n_reqs;
    c->cmpl->n = p->n;
    c->cmpl->stream = p->stream;
    c->cmpl->include_usage = p->include_usage;
    c->cmpl->echo = p->echo && !p->chat;
    c->cmpl->logprobs = p->logprobs;
    c->cmpl->return_token_ids = p->return_token_ids;
    return 0;
}

int dol_http_cmpl_add(dol_http_req *c, const dol_http_attached *a,
                     const dol_completion_params *p, int index, int32_t *ids, int n_ids,
                     dol_api_error *e)
{
    dol_api_limits lim;
    dol_http_api_limits(c, a, &lim);
    /* request_timeout_s counts from arrival: a wait for the model's load
     * has used part of it */
    double timeout_ms = 0;
    if (c->srv->cfg->request_timeout_s > 0) {
        timeout_ms = c->srv->cfg->request_timeout_s * 1000.0 - (dol_now_ms() - c->t0_ms);
        if (timeout_ms < 1) timeout_ms = 1;
    }
    const char *param = c->cmpl->chat ? "messages" : "prompt";
    int fit = 0;
    dol_reason_info why;
    if (dol_api_check_prompt_tokens(n_ids, &lim, param, e)) {
        free(ids);
        return -1;
    }
    int max_new = p->max_tokens > INT_MAX ? INT_MAX : (int)p->max_tokens;
    if (dol_http_sched_fit(c->srv, c->model_idx, n_ids, p->n, max_new, &fit, &why)) {
        dol_api_error_from_reason(e, &why, param);
        free(ids);
        return -1;
    }
    dol_request_params rp = {
        .prompt_ids = ids, .n_prompt = n_ids, .max_tokens = (int)p->max_tokens, .n = p->n,
        .sampling = p->sampling,
        .seed = (p->has_seed ? p->seed : dol_http_random_u64()) + (uint64_t)index * (uint64_t)p->n,
        .n_stop = p->n_stop, .logprobs = p->logprobs,
        .echo_logprobs = c->cmpl->echo && p->logprobs >= 0, .ignore_eos = p->ignore_eos,
        .grammar = p->grammar, .no_speculation = p->no_speculation,
        .priority = request_priority(c),
        .timeout_ms = timeout_ms,
        .id = c->id, .on_event = dol_http_on_event, .user = (void *)(uintptr_t)c->handle,
    };
    for (int i = 0; i < p->n_stop; i++) rp.stop[i] = p->stop[i];
    c->cmpl->reqs[index] = dol_request_create(&rp);
    free(ids);
    return c->cmpl->reqs[index] ? 0 : dol_api_error_oom(e);
}

enum MHD_Result dol_http_cmpl_submit(dol_http_req *c)
{
    /* The body is no longer needed. */
    dol_http_body_free(c);
    for (int i = 0; i < c->cmpl->n_reqs; i++) {
        dol_reason_info why;
        if (dol_http_sched_submit(c->srv, c->model_idx, c->cmpl->reqs[i], &why) !=
            DOL_REASON_NONE) {
            for (int j = 0; j < c->cmpl->n_submitted; j++) dol_request_cancel(c->cmpl->reqs[j]);
            dol_api_error e;
            dol_api_error_from_reason(&e, &why, c->cmpl->chat ? "messages" : "prompt");
            return dol_http_send_error(c, &e);
        }
        if (c->cmpl->n_submitted++ == 0) atomic_fetch_add(&c->srv->inflight, 1);
    }
    c->phase = PH_WAIT;
    return dol_http_cmpl_resume(c);
}

void dol_http_cmpl_cleanup(dol_http_req *c, int *prompt_tokens, int *completion_tokens,
                                  double *queue_ms, double *ttft_ms, int64_t *spec_proposed,
                                  int64_t *spec_accepted)
{
    if (!c->cmpl) return;
    dol_http_cmpl_sync(c);   /* the final figures; on OOM, those of the last read */
    for (int p = 0; p < c->cmpl->n_reqs; p++) {
        dol_request *r = c->cmpl->reqs[p];
        if (!r) continue;
        bool done = true;
        if (p < c->cmpl->n_submitted) {
            const dol_request_state *st = &c->cmpl->st[p];
            done = st->done;
            int n_prompt;
            dol_request_prompt(r, &n_prompt);
            *prompt_tokens += n_prompt;
            for (int i = 0; i < c->cmpl->n; i++) *completion_tokens += c->cmpl->outs[p * c->cmpl->n + i].n_ids;
            *spec_proposed += st->spec_proposed;
            *spec_accepted += st->spec_accepted;
            if (p == 0) {
                if (st->t_start_ms > 0 && st->t_arrival_ms > 0)
                    *queue_ms = st->t_start_ms - st->t_arrival_ms;
                if (st->t_first_token_ms > 0 && st->t_arrival_ms > 0)
                    *ttft_ms = st->t_first_token_ms - st->t_arrival_ms;
            }
        }
        if (!done) dol_request_cancel(r);   /* the client went away */
        dol_request_release(r);
    }
    if (c->cmpl->n_submitted > 0) dol_http_inflight_done(c->srv);
    for (int p = 0; c->cmpl->echo_text && p < c->cmpl->n_reqs; p++) free(c->cmpl->echo_text[p]);
    for (int p = 0; c->cmpl->st && p < c->cmpl->n_reqs; p++) dol_request_state_free(&c->cmpl->st[p]);
    dol_output_free(c->cmpl->outs, c->cmpl->outs ? c->cmpl->n_reqs * c->cmpl->n : 0);
    free(c->cmpl->outs);
    free(c->cmpl->st);
    free(c->cmpl->echo_text);
    free(c->cmpl->reqs);
    free(c->cmpl->sent_text);
    free(c->cmpl->sent_lps);
    free(c->cmpl->sent_finish);
    free(c->cmpl->out);
    free(c->cmpl);
    c->cmpl = NULL;
}
