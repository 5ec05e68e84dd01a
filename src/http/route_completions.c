/* src/http/route_completions.c — POST /v1/completions over MHD, and the
 * machinery it shares with POST /v1/chat/completions (route_chat.c):
 * validate, tokenize, build one dol_request per prompt, submit, then wait
 * with the connection suspended. Non-streaming: answer the whole JSON once
 * every request is done. Streaming: once the first output (or an early
 * failure) arrives, queue a text/event-stream response whose content reader
 * emits the new text of each choice as SSE chunks, suspending when nothing
 * is ready; the scheduler's on_event resumes it (src/http/registry.c).
 *
 * Choices are numbered across prompts: choice i of prompt p is p * n + i.
 * Text only ever comes from the scheduler's emit-safe text (whole UTF-8
 * characters, never part of a stop string), so the streamed pieces add up
 * to the whole response's text. */
#include "http/http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SSE_BLOCK 16384

/* ---- small helpers ------------------------------------------------------ */

static int out_append(dol_http_req *c, const char *s, size_t n)
{
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 1024;
        while (cap < c->out_len + n) cap *= 2;
        char *nb = realloc(c->out, cap);
        if (!nb) return -1;
        c->out = nb;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, s, n);
    c->out_len += n;
    return 0;
}

/* Frame j (taken over; NULL = [DONE]) as one SSE event into c->out. */
static int emit(dol_http_req *c, cJSON *j)
{
    size_t n = 0;
    char *ev = dol_api_sse_event(j, &n);
    if (!ev) return -1;
    int rc = out_append(c, ev, n);
    free(ev);
    return rc;
}

/* Take what every request produced since the last read into c->outs and
 * c->st (dol_request_read). 0, or -1 on OOM. */
static int sync_output(dol_http_req *c)
{
    for (int p = 0; p < c->n_submitted; p++)
        if (dol_request_read(c->reqs[p], &c->outs[p * c->n], &c->st[p]) != 0) return -1;
    return 0;
}

static void error_from_request(dol_api_error *e, const dol_request_state *st)
{
    dol_api_error_set(e, st->error_status ? st->error_status : 500,
                      st->error_type[0] ? st->error_type : "internal_error", NULL,
                      st->error_code, "%s",
                      st->error_msg[0] ? st->error_msg : "The request failed.");
}

static bool request_failed(const dol_http_req *c, int p)
{
    if (c->st[p].error_status) return true;
    for (int i = 0; i < c->n; i++)
        if (c->outs[p * c->n + i].finish == DOL_FINISH_ERROR) return true;
    return false;
}

static const char *finish_str(dol_finish_reason f)
{
    const char *s = dol_finish_reason_str(f);
    return s ? s : "stop";
}

static dol_api_meta meta_of(const dol_http_req *c)
{
    dol_api_meta m = {c->cmpl_id, c->model_name, c->created, NULL, 0};
    return m;
}

/* Echo with logprobs needs the prompt's logprobs, which the scheduler hands
 * over once the prompt is in (or the request ended). */
static bool prompt_lps_ready(const dol_http_req *c, int p)
{
    return !c->echo || c->logprobs < 0 || c->st[p].prompt_lps || c->st[p].done ||
           request_failed(c, p);
}

/* ---- logprobs ----------------------------------------------------------- */

/* Logprobs of a choice's tokens [from, to): the legacy completions object
 * (with text offsets, shifted by base) or the chat one. */
static cJSON *choice_logprobs(const dol_http_req *c, const dol_output *ch,
                              int from, int to, size_t base)
{
    if (c->chat) return dol_api_chat_logprobs_json(c->tok, ch->lps ? ch->lps + from : NULL,
                                                   ch->lps && to > from ? to - from : 0);
    if (!ch->lps || to <= from) return dol_api_logprobs_json(c->tok, NULL, NULL, 0);
    int *off = malloc((size_t)(to - from) * sizeof *off);
    if (!off) return NULL;
    for (int j = from; j < to; j++)
        off[j - from] = (int)base + (j > 0 && ch->lps_text_len ? ch->lps_text_len[j - 1] : 0);
    cJSON *lp = dol_api_logprobs_json(c->tok, ch->lps + from, off, to - from);
    free(off);
    return lp;
}

/* Logprobs of an echoed prompt (entry 0 carries none). The offset of each
 * prompt token is where its text starts in decode(prompt), found with the
 * incremental detokenizer; capped at the echoed text's length. */
static cJSON *prompt_logprobs(const dol_http_req *c, int p, size_t echo_len)
{
    const dol_request_state *st = &c->st[p];
    if (!st->prompt_lps) return dol_api_logprobs_json(c->tok, NULL, NULL, 0);
    int n_prompt;
    const int32_t *prompt = dol_request_prompt(c->reqs[p], &n_prompt);
    int *off = malloc((size_t)n_prompt * sizeof *off);
    dol_detok *d = dol_detok_new(c->tok, prompt, 0);
    char *text = NULL;
    size_t len = 0, cap = 0;
    cJSON *lp = NULL;
    if (off && d) {
        for (int j = 0; j < n_prompt; j++) {
            off[j] = (int)(len < echo_len ? len : echo_len);
            if (dol_detok_push(d, prompt[j], &text, &len, &cap) < 0) break;
        }
        lp = dol_api_logprobs_json(c->tok, st->prompt_lps, off, n_prompt);
    }
    dol_detok_free(d);
    free(text);
    free(off);
    return lp;
}

/* Move the entries of src's arrays to the end of dst's (echo: the prompt's
 * entries come first, then the generated ones). Frees src. */
static void logprobs_concat(cJSON *dst, cJSON *src)
{
    static const char *keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    for (int q = 0; q < 4; q++) {
        cJSON *to = cJSON_GetObjectItemCaseSensitive(dst, keys[q]);
        cJSON *from = cJSON_GetObjectItemCaseSensitive(src, keys[q]);
        cJSON *x;
        while (to && from && (x = cJSON_DetachItemViaPointer(from, from->child)))
            cJSON_AddItemToArray(to, x);
    }
    cJSON_Delete(src);
}

/* ---- non-streaming response --------------------------------------------- */

static enum MHD_Result respond_whole(dol_http_req *c)
{
    int total = c->n_reqs * c->n;
    dol_api_choice *ch = calloc((size_t)total, sizeof *ch);
    char **texts = calloc((size_t)total, sizeof *texts);
    dol_api_usage usage = {0, 0, 0};
    dol_api_error e = {0};
    bool failed = false, oom = !ch || !texts;
    for (int p = 0; p < c->n_reqs && !failed && !oom; p++) {
        int n_prompt;
        const int32_t *prompt = dol_request_prompt(c->reqs[p], &n_prompt);
        const char *echo = c->echo ? c->echo_text[p] : "";
        size_t elen = strlen(echo);
        if (request_failed(c, p)) {
            error_from_request(&e, &c->st[p]);
            failed = true;
        }
        usage.prompt_tokens += n_prompt;
        usage.cached_tokens += c->st[p].n_cached_prompt;
        for (int i = 0; i < c->n && !failed && !oom; i++) {
            const dol_output *rc = &c->outs[p * c->n + i];
            int k = p * c->n + i;
            texts[k] = malloc(elen + rc->text_len + 1);
            if (!texts[k]) {
                oom = true;
                break;
            }
            memcpy(texts[k], echo, elen);
            memcpy(texts[k] + elen, rc->text ? rc->text : "", rc->text_len);
            texts[k][elen + rc->text_len] = '\0';
            ch[k].index = k;
            ch[k].text = texts[k];
            ch[k].text_len = elen + rc->text_len;
            ch[k].finish = finish_str(rc->finish);
            usage.completion_tokens += rc->n_ids;
            if (c->return_token_ids) {
                ch[k].token_ids = rc->ids;
                ch[k].n_token_ids = rc->n_ids;
                if (!c->chat) {
                    ch[k].prompt_ids = prompt;
                    ch[k].n_prompt_ids = n_prompt;
                }
            }
            if (c->logprobs >= 0) {
                cJSON *lp = choice_logprobs(c, rc, 0, rc->n_ids, elen);
                if (lp && c->echo) {
                    cJSON *pl = prompt_logprobs(c, p, elen);
                    if (pl) {
                        logprobs_concat(pl, lp);
                        lp = pl;
                    }
                }
                ch[k].logprobs = lp;
            }
        }
    }
    enum MHD_Result ret;
    if (oom) {
        ret = dol_http_send_json(c, 500, NULL);
    } else if (failed) {
        ret = dol_http_send_error(c, &e);
    } else {
        dol_api_meta m = meta_of(c);
        if (c->chat && c->return_token_ids) m.prompt_ids = dol_request_prompt(c->reqs[0], &m.n_prompt_ids);
        cJSON *j = c->chat ? dol_api_chat_json(&m, ch, total, &usage)
                           : dol_api_completion_json(&m, ch, total, &usage);
        ret = dol_http_send_cjson(c, 200, j);
    }
    for (int k = 0; ch && k < total; k++) cJSON_Delete(ch[k].logprobs);
    for (int k = 0; texts && k < total; k++) free(texts[k]);
    free(ch);
    free(texts);
    return ret;
}

/* ---- streaming ---------------------------------------------------------- */

/* One chunk with one choice (takes over ch->logprobs). */
static int emit_choice(dol_http_req *c, dol_api_choice *ch, const dol_api_meta *m)
{
    cJSON *j = c->chat ? dol_api_chat_chunk_json(m, ch, 1, NULL)
                       : dol_api_completion_json(m, ch, 1, NULL);
    return j ? emit(c, j) : -1;
}

static int emit_error_event(dol_http_req *c, const dol_api_error *e)
{
    char *s = dol_api_error_json(e);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    free(s);
    if (!j || emit(c, j) || emit(c, NULL)) return -1;
    c->stream_over = true;
    return 0;
}

/* The chunks before any generated text, one per choice: chat's role chunk
 * ({"role":"assistant","content":""}); for completions the echoed prompt
 * (with its logprobs) and, with return_token_ids, the prompt's ids. */
static int emit_preamble(dol_http_req *c)
{
    for (int p = 0; p < c->n_reqs; p++) {
        int rc = 0, n_prompt;
        const int32_t *prompt = dol_request_prompt(c->reqs[p], &n_prompt);
        for (int i = 0; i < c->n && rc == 0; i++) {
            dol_api_meta m = meta_of(c);
            dol_api_choice ch = {.index = p * c->n + i};
            if (c->chat) {
                ch.role = true;
                ch.text = "";
                if (c->return_token_ids && i == 0) {
                    m.prompt_ids = prompt;
                    m.n_prompt_ids = n_prompt;
                }
            } else {
                if (!c->echo && !c->return_token_ids) break;
                ch.text = c->echo ? c->echo_text[p] : "";
                ch.text_len = strlen(ch.text);
                if (c->logprobs >= 0)
                    ch.logprobs = c->echo ? prompt_logprobs(c, p, ch.text_len)
                                          : dol_api_logprobs_json(c->tok, NULL, NULL, 0);
                if (c->return_token_ids) {
                    ch.prompt_ids = prompt;
                    ch.n_prompt_ids = n_prompt;
                    ch.token_ids = prompt;   /* none generated yet */
                    ch.n_token_ids = 0;
                }
            }
            rc = emit_choice(c, &ch, &m);
        }
        if (rc) return -1;
    }
    c->preamble_sent = true;
    return 0;
}

/* New output of one choice (text, and the ids / logprobs of new tokens),
 * then its finish chunk once it has ended. */
static int emit_progress(dol_http_req *c, int p, int i)
{
    int k = p * c->n + i;
    const dol_output *ch = &c->outs[k];
    dol_api_meta m = meta_of(c);
    size_t base = c->echo ? strlen(c->echo_text[p]) : 0;
    bool per_token = (c->logprobs >= 0 && ch->lps) || c->return_token_ids;
    bool new_ids = per_token && ch->n_ids > c->sent_lps[k];
    if (ch->text_len > c->sent_text[k] || new_ids) {
        dol_api_choice out = {.index = k};
        out.text = ch->text + c->sent_text[k];
        out.text_len = ch->text_len - c->sent_text[k];
        if (c->logprobs >= 0) out.logprobs = choice_logprobs(c, ch, c->sent_lps[k], ch->n_ids, base);
        if (c->return_token_ids) {
            out.token_ids = ch->ids + c->sent_lps[k];
            out.n_token_ids = ch->n_ids - c->sent_lps[k];
        }
        if (emit_choice(c, &out, &m)) return -1;
        c->sent_text[k] = ch->text_len;
        c->sent_lps[k] = ch->n_ids;
    }
    if (!c->sent_finish[k] && (ch->finish != DOL_FINISH_NONE || c->st[p].done)) {
        dol_api_choice out = {.index = k, .finish = finish_str(ch->finish)};
        if (!c->chat) {
            out.text = "";
            if (c->logprobs >= 0) out.logprobs = dol_api_logprobs_json(c->tok, NULL, NULL, 0);
        }
        if (emit_choice(c, &out, &m)) return -1;
        c->sent_finish[k] = true;
    }
    return 0;
}

/* Move whatever is new in the requests into SSE events in c->out. */
static int produce(dol_http_req *c)
{
    /* A failure (before or after the first token) ends the stream with an
     * error event. Echo with logprobs waits for the prompt's logprobs. */
    if (sync_output(c)) return -1;
    bool ready = true;
    for (int p = 0; p < c->n_reqs; p++) {
        if (request_failed(c, p)) {
            dol_api_error e;
            error_from_request(&e, &c->st[p]);
            return emit_error_event(c, &e);
        }
        if (!prompt_lps_ready(c, p)) ready = false;
    }
    if (!c->preamble_sent) {
        if (!ready) return 0;
        if (emit_preamble(c)) return -1;
    }
    bool all_over = true;
    int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    for (int p = 0; p < c->n_reqs; p++) {
        int rc = 0, n_prompt;
        dol_request_prompt(c->reqs[p], &n_prompt);
        prompt_tokens += n_prompt;
        cached_tokens += c->st[p].n_cached_prompt;
        for (int i = 0; i < c->n && rc == 0; i++) {
            completion_tokens += c->outs[p * c->n + i].n_ids;
            rc = emit_progress(c, p, i);
            if (!c->sent_finish[p * c->n + i]) all_over = false;
        }
        if (!c->st[p].done) all_over = false;
        if (rc) return -1;
    }
    if (!all_over) return 0;
    if (c->include_usage) {
        dol_api_meta m = meta_of(c);
        dol_api_usage u = {prompt_tokens, completion_tokens, cached_tokens};
        cJSON *j = c->chat ? dol_api_chat_chunk_json(&m, NULL, 0, &u)
                           : dol_api_completion_json(&m, NULL, 0, &u);
        if (!j || emit(c, j)) return -1;
    }
    if (emit(c, NULL)) return -1;
    c->stream_over = true;
    return 0;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    dol_http_req *c = cls;
    for (;;) {
        if (c->out_off < c->out_len) {
            size_t n = c->out_len - c->out_off;
            if (n > max) n = max;
            memcpy(buf, c->out + c->out_off, n);
            c->out_off += n;
            return (ssize_t)n;
        }
        c->out_len = c->out_off = 0;
        if (c->stream_over) return MHD_CONTENT_READER_END_OF_STREAM;
        dol_http_clear_pending(c);
        if (produce(c)) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (c->out_len > 0 || c->stream_over) continue;
        switch (dol_http_suspend(c)) {
        case DOL_WAIT_SUSPENDED: return 0;
        case DOL_WAIT_PENDING: continue;
        default: return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static enum MHD_Result start_stream(dol_http_req *c)
{
    int total = c->n_reqs * c->n;
    c->sent_text = calloc((size_t)total, sizeof *c->sent_text);
    c->sent_lps = calloc((size_t)total, sizeof *c->sent_lps);
    c->sent_finish = calloc((size_t)total, sizeof *c->sent_finish);
    if (!c->sent_text || !c->sent_lps || !c->sent_finish) return dol_http_send_json(c, 500, NULL);
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, stream_reader, c, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    return dol_http_queue(c, 200, resp, PH_STREAM);
}

/* ---- waiting ------------------------------------------------------------ */

/* Non-streaming: every request done. Streaming: anything to show (so an
 * early failure still gets a proper status instead of an error event);
 * echo counts as something to show once its logprobs (if asked) are in. */
static bool ready_to_answer(dol_http_req *c, bool *failed_early)
{
    bool all_done = true, any_output = false, failed = false, echo_ready = c->echo;
    for (int p = 0; p < c->n_reqs; p++) {
        if (!c->st[p].done) all_done = false;
        if (request_failed(c, p)) failed = true;
        if (!prompt_lps_ready(c, p)) echo_ready = false;
        for (int i = 0; i < c->n; i++) {
            const dol_output *o = &c->outs[p * c->n + i];
            if (o->n_ids > 0 || o->text_len > 0 || o->finish != DOL_FINISH_NONE)
                any_output = true;
        }
    }
    *failed_early = failed && !any_output;
    if (!c->stream) return all_done || failed;
    return all_done || failed || any_output || echo_ready;
}

static enum MHD_Result wait_or_answer(dol_http_req *c)
{
    for (;;) {
        dol_http_clear_pending(c);
        if (sync_output(c)) return dol_http_send_json(c, 500, NULL);
        bool failed_early = false;
        if (ready_to_answer(c, &failed_early)) {
            if (!c->stream || failed_early) return respond_whole(c);
            return start_stream(c);
        }
        switch (dol_http_suspend(c)) {
        case DOL_WAIT_SUSPENDED: return MHD_YES;
        case DOL_WAIT_PENDING: continue;
        default: return MHD_NO;   /* server stopping: close */
        }
    }
}

enum MHD_Result dol_http_completions_resume(dol_http_req *c)
{
    return wait_or_answer(c);
}

/* ---- building requests (shared with route_chat.c) ------------------------ */

int dol_http_gen_begin(dol_http_req *c, dol_http_attached *a, dol_api_error *e)
{
    if (dol_http_not_ready(c, e)) return -1;
    dol_http_attached_get(c->srv, a);
    if (!a->model || !a->tok || !a->has_sched) {
        dol_api_error_set(e, 503, "service_unavailable", NULL, "model_loading",
                          "The model is not loaded yet.");
        return -1;
    }
    c->tok = a->tok;
    snprintf(c->model_name, sizeof c->model_name, "%s", a->name);
    char hex[25];
    dol_http_random_hex(hex, 12);
    snprintf(c->cmpl_id, sizeof c->cmpl_id, "%s-%s", c->chat ? "chatcmpl" : "cmpl", hex);
    c->created = (int64_t)time(NULL);
    return 0;
}

cJSON *dol_http_body_json(dol_http_req *c, dol_api_error *e)
{
    const char *ct = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!dol_api_content_type_is_json(ct)) {
        dol_api_error_set(e, 415, "invalid_request_error", NULL, "unsupported_media_type",
                          "Content-Type must be application/json.");
        return NULL;
    }
    return dol_api_parse_object(c->body, c->body_len, c->srv->cfg->max_json_depth, e);
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
    lim->default_max_tokens = cfg->max_tokens > 0 ? cfg->max_tokens : 16;
    lim->default_temperature = cfg->temperature;
    lim->default_top_p = cfg->top_p > 0 ? cfg->top_p : 1.0f;
    lim->default_top_k = cfg->top_k;
    lim->max_prompt_tokens = cfg->max_prompt_tokens;
    lim->max_tokens_cap = cfg->max_tokens_cap;
    lim->max_n = cfg->max_n;
    lim->max_stop = cfg->max_stop;
    lim->max_stop_len = cfg->max_stop_len;
    lim->max_logit_bias = cfg->max_logit_bias;
}

int dol_http_check_model(const char *model, const dol_http_attached *a, dol_api_error *e)
{
    if (!model || strcmp(model, a->name) == 0) return 0;
    dol_api_error_set(e, 404, "invalid_request_error", "model", "model_not_found",
                      "The model '%.200s' does not exist; this server serves '%s'.",
                      model, a->name);
    return -1;
}

static int oom(dol_api_error *e)
{
    dol_api_error_set(e, 500, "internal_error", NULL, NULL, "Out of memory.");
    return -1;
}

static int request_priority(dol_http_req *c)
{
    int pr = dol_config_key_priority(c->srv->cfg, dol_http_bearer_key(c->conn));
    return pr < 0 ? c->srv->cfg->default_priority : pr;
}

int dol_http_gen_prepare(dol_http_req *c, const dol_http_attached *a,
                         const dol_completion_params *p, int n_reqs, dol_api_error *e)
{
    const dol_config *cfg = c->srv->cfg;
    if (dol_http_check_model(p->model, a, e)) return -1;
    if (cfg->max_batch_size > 0 && p->n > cfg->max_batch_size) {
        dol_api_error_invalid(e, "n", "'n' is %d but this server runs at most %d sequences "
                              "at once (max_batch_size).", p->n, cfg->max_batch_size);
        return -1;
    }
    c->reqs = calloc((size_t)n_reqs, sizeof *c->reqs);
    c->echo_text = calloc((size_t)n_reqs, sizeof *c->echo_text);
    c->outs = calloc((size_t)n_reqs * (size_t)p->n, sizeof *c->outs);
    c->st = calloc((size_t)n_reqs, sizeof *c->st);
    if (!c->reqs || !c->echo_text || !c->outs || !c->st) return oom(e);
    c->n_reqs = n_reqs;
    c->n = p->n;
    c->stream = p->stream;
    c->include_usage = p->include_usage;
    c->echo = p->echo && !p->chat;
    c->logprobs = p->logprobs;
    c->return_token_ids = p->return_token_ids;
    return 0;
}

int dol_http_gen_add(dol_http_req *c, const dol_http_attached *a,
                     const dol_completion_params *p, int index, int32_t *ids, int n_ids,
                     dol_api_error *e)
{
    dol_api_limits lim;
    dol_http_api_limits(c, a, &lim);
    if (dol_api_check_prompt_tokens(n_ids, &lim, c->chat ? "messages" : "prompt", e) ||
        dol_api_check_context(n_ids, p->max_tokens, a->context_len, e)) {
        free(ids);
        return -1;
    }
    dol_request_params rp = {
        .prompt_ids = ids, .n_prompt = n_ids, .max_tokens = (int)p->max_tokens, .n = p->n,
        .sampling = p->sampling,
        .seed = (p->has_seed ? p->seed : dol_http_random_u64()) + (uint64_t)index * (uint64_t)p->n,
        .n_stop = p->n_stop, .logprobs = p->logprobs,
        .echo_logprobs = c->echo && p->logprobs >= 0, .ignore_eos = p->ignore_eos,
        .priority = request_priority(c),
        .timeout_ms = c->srv->cfg->request_timeout_s > 0 ? c->srv->cfg->request_timeout_s * 1000.0
                                                         : 0,
        .id = c->id, .on_event = dol_http_on_event, .user = (void *)(uintptr_t)c->handle,
    };
    for (int i = 0; i < p->n_stop; i++) rp.stop[i] = p->stop[i];
    c->reqs[index] = dol_request_create(&rp);
    free(ids);
    return c->reqs[index] ? 0 : oom(e);
}

static void submit_error(dol_api_error *e, dol_submit_result res, const char *msg)
{
    switch (res) {
    case DOL_SUBMIT_QUEUE_FULL:
        dol_api_error_set(e, 429, "rate_limit_exceeded", NULL, "queue_full",
                          "The server is busy (request queue full); retry shortly. %s", msg);
        break;
    case DOL_SUBMIT_TOO_LONG:
        dol_api_error_set(e, 400, "invalid_request_error", "max_tokens",
                          "context_length_exceeded", "%s", msg);
        break;
    case DOL_SUBMIT_DRAINING:
        dol_api_error_set(e, 503, "service_unavailable", NULL, "server_draining",
                          "The server is shutting down and accepts no new requests.");
        break;
    default:
        dol_api_error_invalid(e, NULL, "%s", msg[0] ? msg : "Invalid request.");
        break;
    }
}

enum MHD_Result dol_http_gen_submit(dol_http_req *c)
{
    /* The body is no longer needed. */
    free(c->body);
    c->body = NULL;
    c->body_len = c->body_cap = 0;
    for (int i = 0; i < c->n_reqs; i++) {
        char err[DOL_ERR_LEN] = "";
        dol_submit_result res = dol_http_sched_submit(c->srv, c->reqs[i], err, sizeof err);
        if (res != DOL_SUBMIT_OK) {
            for (int j = 0; j < c->n_submitted; j++) dol_request_cancel(c->reqs[j]);
            dol_api_error e;
            submit_error(&e, res, err);
            return dol_http_send_error(c, &e);
        }
        if (c->n_submitted++ == 0) atomic_fetch_add(&c->srv->inflight, 1);
    }
    c->phase = PH_WAIT;
    return wait_or_answer(c);
}

/* ---- POST /v1/completions ------------------------------------------------- */

/* The prompt's ids: token prompts as given, text prompts encoded (with BOS).
 * Encoding runs on libmicrohttpd's thread and takes seconds for a
 * megabyte, so a text that can never fit (judged from a lower bound on its
 * tokens, dol_tokenizer_min_tokens) is refused before it is encoded. */
static int prompt_ids(const dol_http_attached *a, const dol_api_limits *lim,
                      const dol_completion_params *p, dol_api_prompt *pr, int32_t **ids,
                      int *n, dol_api_error *e)
{
    if (!pr->text) {
        *ids = pr->ids;   /* taken over */
        *n = pr->n_ids;
        pr->ids = NULL;
        return 0;
    }
    int64_t min = (int64_t)dol_tokenizer_min_tokens(a->tok, pr->text, pr->text_len) +
                  (dol_tokenizer_bos_id(a->tok) >= 0);
    if (dol_api_check_prompt_bound(min, p->max_tokens, lim, "prompt", e)) return -1;
    char err[DOL_ERR_LEN];
    size_t cnt = 0;
    if (dol_tokenizer_encode(a->tok, pr->text, pr->text_len, true, ids, &cnt, err, sizeof err)) {
        dol_api_error_set(e, 500, "internal_error", "prompt", NULL,
                          "Tokenizing the prompt failed: %s", err);
        return -1;
    }
    *n = (int)cnt;
    return 0;
}

static char *echo_of(const dol_http_attached *a, const dol_api_prompt *pr, const int32_t *ids,
                     int n)
{
    if (pr->text) return strdup(pr->text);
    char *text = NULL;
    size_t len = 0;
    char err[DOL_ERR_LEN];
    if (dol_tokenizer_decode(a->tok, ids, (size_t)n, &text, &len, err, sizeof err))
        return strdup("");
    return text;
}

/* Validate, tokenize and build the requests; 0 or -1 with e. */
static int build(dol_http_req *c, const dol_http_attached *a, dol_api_error *e)
{
    cJSON *body = dol_http_body_json(c, e);
    if (!body) return -1;
    dol_api_limits lim;
    dol_http_api_limits(c, a, &lim);
    dol_completion_params p;
    int rc = dol_api_parse_completion(body, &lim, &p, e);
    cJSON_Delete(body);
    if (rc) goto out;
    rc = -1;
    if (dol_http_gen_prepare(c, a, &p, p.n_prompts, e)) goto out;
    for (int i = 0; i < p.n_prompts; i++) {
        int32_t *ids = NULL;
        int n = 0;
        if (prompt_ids(a, &lim, &p, &p.prompts[i], &ids, &n, e)) goto out;
        if (dol_http_gen_add(c, a, &p, i, ids, n, e)) goto out;
        if (p.echo) {
            c->echo_text[i] = echo_of(a, &p.prompts[i], dol_request_prompt(c->reqs[i], &n), n);
            if (!c->echo_text[i]) {
                oom(e);
                goto out;
            }
        }
    }
    rc = 0;
out:
    dol_api_completion_params_free(&p);
    return rc;
}

enum MHD_Result dol_http_completions(dol_http_req *c)
{
    dol_api_error e;
    dol_http_attached a;
    c->chat = false;
    if (dol_http_gen_begin(c, &a, &e) || build(c, &a, &e)) return dol_http_send_error(c, &e);
    return dol_http_gen_submit(c);
}

void dol_http_completions_cleanup(dol_http_req *c, int *prompt_tokens, int *completion_tokens,
                                  double *queue_ms, double *ttft_ms)
{
    sync_output(c);   /* the final figures; on OOM, those of the last read */
    for (int p = 0; p < c->n_reqs; p++) {
        dol_request *r = c->reqs[p];
        if (!r) continue;
        bool done = true;
        if (p < c->n_submitted) {
            const dol_request_state *st = &c->st[p];
            done = st->done;
            int n_prompt;
            dol_request_prompt(r, &n_prompt);
            *prompt_tokens += n_prompt;
            for (int i = 0; i < c->n; i++) *completion_tokens += c->outs[p * c->n + i].n_ids;
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
    if (c->n_submitted > 0) dol_http_inflight_done(c->srv);
    for (int p = 0; c->echo_text && p < c->n_reqs; p++) free(c->echo_text[p]);
    for (int p = 0; c->st && p < c->n_reqs; p++) dol_request_state_free(&c->st[p]);
    dol_output_free(c->outs, c->outs ? c->n_reqs * c->n : 0);
    free(c->outs);
    free(c->st);
    free(c->echo_text);
    free(c->reqs);
    free(c->sent_text);
    free(c->sent_lps);
    free(c->sent_finish);
    free(c->out);
    c->reqs = NULL;
    c->outs = NULL;
    c->st = NULL;
    c->n_reqs = 0;
}
