/* src/http/generation.c — what POST /v1/completions and POST
 * /v1/chat/completions share once their route has parsed the body: the
 * per-request generation state, building one dol_request per prompt,
 * submitting them, then waiting with the connection suspended. Non-streaming:
 * answer the whole JSON once every request is done. Streaming: once the
 * first output (or an early failure) arrives, queue a text/event-stream
 * response whose content reader emits the new text of each choice as SSE
 * chunks, suspending when nothing is ready; the scheduler's on_event resumes
 * it (src/http/registry.c). Output is taken with dol_request_read into
 * gen->outs / gen->st and rendered from there.
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
    if (c->gen->out_len + n > c->gen->out_cap) {
        size_t cap = c->gen->out_cap ? c->gen->out_cap : 1024;
        while (cap < c->gen->out_len + n) cap *= 2;
        char *nb = realloc(c->gen->out, cap);
        if (!nb) return -1;
        c->gen->out = nb;
        c->gen->out_cap = cap;
    }
    memcpy(c->gen->out + c->gen->out_len, s, n);
    c->gen->out_len += n;
    return 0;
}

/* Frame j (taken over; NULL = [DONE]) as one SSE event into c->gen->out. */
static int emit(dol_http_req *c, cJSON *j)
{
    size_t n = 0;
    char *ev = dol_api_sse_event(j, &n);
    if (!ev) return -1;
    int rc = out_append(c, ev, n);
    free(ev);
    return rc;
}

/* Take what every request produced since the last read into c->gen->outs and
 * c->gen->st (dol_request_read). 0, or -1 on OOM. */
static int sync_output(dol_http_req *c)
{
    for (int p = 0; p < c->gen->n_submitted; p++)
        if (dol_request_read(c->gen->reqs[p], &c->gen->outs[p * c->gen->n], &c->gen->st[p]) != 0) return -1;
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
    if (c->gen->st[p].error_status) return true;
    for (int i = 0; i < c->gen->n; i++)
        if (c->gen->outs[p * c->gen->n + i].finish == DOL_FINISH_ERROR) return true;
    return false;
}

static const char *finish_str(dol_finish_reason f)
{
    const char *s = dol_finish_reason_str(f);
    return s ? s : "stop";
}

static dol_api_meta meta_of(const dol_http_req *c)
{
    dol_api_meta m = {c->gen->cmpl_id, c->gen->model_name, c->gen->created, NULL, 0};
    return m;
}

/* Echo with logprobs needs the prompt's logprobs, which the scheduler hands
 * over once the prompt is in (or the request ended). */
static bool prompt_lps_ready(const dol_http_req *c, int p)
{
    return !c->gen->echo || c->gen->logprobs < 0 || c->gen->st[p].prompt_lps || c->gen->st[p].done ||
           request_failed(c, p);
}

/* ---- logprobs ----------------------------------------------------------- */

/* Logprobs of a choice's tokens [from, to): the legacy completions object
 * (with text offsets, shifted by base) or the chat one. */
static cJSON *choice_logprobs(const dol_http_req *c, const dol_output *ch,
                              int from, int to, size_t base)
{
    if (c->gen->chat) return dol_api_chat_logprobs_json(c->gen->tok, ch->lps ? ch->lps + from : NULL,
                                                   ch->lps && to > from ? to - from : 0);
    if (!ch->lps || to <= from) return dol_api_logprobs_json(c->gen->tok, NULL, NULL, 0);
    int *off = malloc((size_t)(to - from) * sizeof *off);
    if (!off) return NULL;
    for (int j = from; j < to; j++)
        off[j - from] = (int)base + (j > 0 && ch->lps_text_len ? ch->lps_text_len[j - 1] : 0);
    cJSON *lp = dol_api_logprobs_json(c->gen->tok, ch->lps + from, off, to - from);
    free(off);
    return lp;
}

/* Logprobs of an echoed prompt (entry 0 carries none). The offset of each
 * prompt token is where its text starts in decode(prompt), found with the
 * incremental detokenizer; capped at the echoed text's length. */
static cJSON *prompt_logprobs(const dol_http_req *c, int p, size_t echo_len)
{
    const dol_request_state *st = &c->gen->st[p];
    if (!st->prompt_lps) return dol_api_logprobs_json(c->gen->tok, NULL, NULL, 0);
    int n_prompt;
    const int32_t *prompt = dol_request_prompt(c->gen->reqs[p], &n_prompt);
    int *off = malloc((size_t)n_prompt * sizeof *off);
    dol_detok *d = dol_detok_new(c->gen->tok, prompt, 0);
    char *text = NULL;
    size_t len = 0, cap = 0;
    cJSON *lp = NULL;
    if (off && d) {
        for (int j = 0; j < n_prompt; j++) {
            off[j] = (int)(len < echo_len ? len : echo_len);
            if (dol_detok_push(d, prompt[j], &text, &len, &cap) < 0) break;
        }
        lp = dol_api_logprobs_json(c->gen->tok, st->prompt_lps, off, n_prompt);
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
    int total = c->gen->n_reqs * c->gen->n;
    dol_api_choice *ch = calloc((size_t)total, sizeof *ch);
    char **texts = calloc((size_t)total, sizeof *texts);
    dol_api_usage usage = {0, 0, 0};
    dol_api_error e = {0};
    bool failed = false, oom = !ch || !texts;
    for (int p = 0; p < c->gen->n_reqs && !failed && !oom; p++) {
        int n_prompt;
        const int32_t *prompt = dol_request_prompt(c->gen->reqs[p], &n_prompt);
        const char *echo = c->gen->echo ? c->gen->echo_text[p] : "";
        size_t elen = strlen(echo);
        if (request_failed(c, p)) {
            error_from_request(&e, &c->gen->st[p]);
            failed = true;
        }
        usage.prompt_tokens += n_prompt;
        usage.cached_tokens += c->gen->st[p].n_cached_prompt;
        for (int i = 0; i < c->gen->n && !failed && !oom; i++) {
            const dol_output *rc = &c->gen->outs[p * c->gen->n + i];
            int k = p * c->gen->n + i;
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
            if (c->gen->return_token_ids) {
                ch[k].token_ids = rc->ids;
                ch[k].n_token_ids = rc->n_ids;
                if (!c->gen->chat) {
                    ch[k].prompt_ids = prompt;
                    ch[k].n_prompt_ids = n_prompt;
                }
            }
            if (c->gen->logprobs >= 0) {
                cJSON *lp = choice_logprobs(c, rc, 0, rc->n_ids, elen);
                if (lp && c->gen->echo) {
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
        if (c->gen->chat && c->gen->return_token_ids) m.prompt_ids = dol_request_prompt(c->gen->reqs[0], &m.n_prompt_ids);
        cJSON *j = c->gen->chat ? dol_api_chat_json(&m, ch, total, &usage)
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
    cJSON *j = c->gen->chat ? dol_api_chat_chunk_json(m, ch, 1, NULL)
                       : dol_api_completion_json(m, ch, 1, NULL);
    return j ? emit(c, j) : -1;
}

static int emit_error_event(dol_http_req *c, const dol_api_error *e)
{
    char *s = dol_api_error_json(e);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    free(s);
    if (!j || emit(c, j) || emit(c, NULL)) return -1;
    c->gen->stream_over = true;
    return 0;
}

/* The chunks before any generated text, one per choice: chat's role chunk
 * ({"role":"assistant","content":""}); for completions the echoed prompt
 * (with its logprobs) and, with return_token_ids, the prompt's ids. */
static int emit_preamble(dol_http_req *c)
{
    for (int p = 0; p < c->gen->n_reqs; p++) {
        int rc = 0, n_prompt;
        const int32_t *prompt = dol_request_prompt(c->gen->reqs[p], &n_prompt);
        for (int i = 0; i < c->gen->n && rc == 0; i++) {
            dol_api_meta m = meta_of(c);
            dol_api_choice ch = {.index = p * c->gen->n + i};
            if (c->gen->chat) {
                ch.role = true;
                ch.text = "";
                if (c->gen->return_token_ids && i == 0) {
                    m.prompt_ids = prompt;
                    m.n_prompt_ids = n_prompt;
                }
            } else {
                if (!c->gen->echo && !c->gen->return_token_ids) break;
                ch.text = c->gen->echo ? c->gen->echo_text[p] : "";
                ch.text_len = strlen(ch.text);
                if (c->gen->logprobs >= 0)
                    ch.logprobs = c->gen->echo ? prompt_logprobs(c, p, ch.text_len)
                                          : dol_api_logprobs_json(c->gen->tok, NULL, NULL, 0);
                if (c->gen->return_token_ids) {
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
    c->gen->preamble_sent = true;
    return 0;
}

/* New output of one choice (text, and the ids / logprobs of new tokens),
 * then its finish chunk once it has ended. */
static int emit_progress(dol_http_req *c, int p, int i)
{
    int k = p * c->gen->n + i;
    const dol_output *ch = &c->gen->outs[k];
    dol_api_meta m = meta_of(c);
    size_t base = c->gen->echo ? strlen(c->gen->echo_text[p]) : 0;
    bool per_token = (c->gen->logprobs >= 0 && ch->lps) || c->gen->return_token_ids;
    bool new_ids = per_token && ch->n_ids > c->gen->sent_lps[k];
    if (ch->text_len > c->gen->sent_text[k] || new_ids) {
        dol_api_choice out = {.index = k};
        out.text = ch->text + c->gen->sent_text[k];
        out.text_len = ch->text_len - c->gen->sent_text[k];
        if (c->gen->logprobs >= 0) out.logprobs = choice_logprobs(c, ch, c->gen->sent_lps[k], ch->n_ids, base);
        if (c->gen->return_token_ids) {
            out.token_ids = ch->ids + c->gen->sent_lps[k];
            out.n_token_ids = ch->n_ids - c->gen->sent_lps[k];
        }
        if (emit_choice(c, &out, &m)) return -1;
        c->gen->sent_text[k] = ch->text_len;
        c->gen->sent_lps[k] = ch->n_ids;
    }
    if (!c->gen->sent_finish[k] && (ch->finish != DOL_FINISH_NONE || c->gen->st[p].done)) {
        dol_api_choice out = {.index = k, .finish = finish_str(ch->finish)};
        if (!c->gen->chat) {
            out.text = "";
            if (c->gen->logprobs >= 0) out.logprobs = dol_api_logprobs_json(c->gen->tok, NULL, NULL, 0);
        }
        if (emit_choice(c, &out, &m)) return -1;
        c->gen->sent_finish[k] = true;
    }
    return 0;
}

/* Move whatever is new in the requests into SSE events in c->gen->out. */
static int produce(dol_http_req *c)
{
    /* A failure (before or after the first token) ends the stream with an
     * error event. Echo with logprobs waits for the prompt's logprobs. */
    if (sync_output(c)) return -1;
    bool ready = true;
    for (int p = 0; p < c->gen->n_reqs; p++) {
        if (request_failed(c, p)) {
            dol_api_error e;
            error_from_request(&e, &c->gen->st[p]);
            return emit_error_event(c, &e);
        }
        if (!prompt_lps_ready(c, p)) ready = false;
    }
    if (!c->gen->preamble_sent) {
        if (!ready) return 0;
        if (emit_preamble(c)) return -1;
    }
    bool all_over = true;
    int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    for (int p = 0; p < c->gen->n_reqs; p++) {
        int rc = 0, n_prompt;
        dol_request_prompt(c->gen->reqs[p], &n_prompt);
        prompt_tokens += n_prompt;
        cached_tokens += c->gen->st[p].n_cached_prompt;
        for (int i = 0; i < c->gen->n && rc == 0; i++) {
            completion_tokens += c->gen->outs[p * c->gen->n + i].n_ids;
            rc = emit_progress(c, p, i);
            if (!c->gen->sent_finish[p * c->gen->n + i]) all_over = false;
        }
        if (!c->gen->st[p].done) all_over = false;
        if (rc) return -1;
    }
    if (!all_over) return 0;
    if (c->gen->include_usage) {
        dol_api_meta m = meta_of(c);
        dol_api_usage u = {prompt_tokens, completion_tokens, cached_tokens};
        cJSON *j = c->gen->chat ? dol_api_chat_chunk_json(&m, NULL, 0, &u)
                           : dol_api_completion_json(&m, NULL, 0, &u);
        if (!j || emit(c, j)) return -1;
    }
    if (emit(c, NULL)) return -1;
    c->gen->stream_over = true;
    return 0;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    dol_http_req *c = cls;
    for (;;) {
        if (c->gen->out_off < c->gen->out_len) {
            size_t n = c->gen->out_len - c->gen->out_off;
            if (n > max) n = max;
            memcpy(buf, c->gen->out + c->gen->out_off, n);
            c->gen->out_off += n;
            return (ssize_t)n;
        }
        c->gen->out_len = c->gen->out_off = 0;
        if (c->gen->stream_over) return MHD_CONTENT_READER_END_OF_STREAM;
        dol_http_clear_pending(c);
        if (produce(c)) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (c->gen->out_len > 0 || c->gen->stream_over) continue;
        switch (dol_http_suspend(c)) {
        case DOL_WAIT_SUSPENDED: return 0;
        case DOL_WAIT_PENDING: continue;
        default: return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static enum MHD_Result start_stream(dol_http_req *c)
{
    int total = c->gen->n_reqs * c->gen->n;
    c->gen->sent_text = calloc((size_t)total, sizeof *c->gen->sent_text);
    c->gen->sent_lps = calloc((size_t)total, sizeof *c->gen->sent_lps);
    c->gen->sent_finish = calloc((size_t)total, sizeof *c->gen->sent_finish);
    if (!c->gen->sent_text || !c->gen->sent_lps || !c->gen->sent_finish) return dol_http_send_json(c, 500, NULL);
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
    bool all_done = true, any_output = false, failed = false, echo_ready = c->gen->echo;
    for (int p = 0; p < c->gen->n_reqs; p++) {
        if (!c->gen->st[p].done) all_done = false;
        if (request_failed(c, p)) failed = true;
        if (!prompt_lps_ready(c, p)) echo_ready = false;
        for (int i = 0; i < c->gen->n; i++) {
            const dol_output *o = &c->gen->outs[p * c->gen->n + i];
            if (o->n_ids > 0 || o->text_len > 0 || o->finish != DOL_FINISH_NONE)
                any_output = true;
        }
    }
    *failed_early = failed && !any_output;
    if (!c->gen->stream) return all_done || failed;
    return all_done || failed || any_output || echo_ready;
}

static enum MHD_Result wait_or_answer(dol_http_req *c)
{
    for (;;) {
        dol_http_clear_pending(c);
        if (sync_output(c)) return dol_http_send_json(c, 500, NULL);
        bool failed_early = false;
        if (ready_to_answer(c, &failed_early)) {
            if (!c->gen->stream || failed_early) return respond_whole(c);
            return start_stream(c);
        }
        switch (dol_http_suspend(c)) {
        case DOL_WAIT_SUSPENDED: return MHD_YES;
        case DOL_WAIT_PENDING: continue;
        default: return MHD_NO;   /* server stopping: close */
        }
    }
}

enum MHD_Result dol_http_gen_resume(dol_http_req *c)
{
    return wait_or_answer(c);
}

/* ---- building requests (shared with route_chat.c) ------------------------ */

int dol_http_gen_begin(dol_http_req *c, bool chat, dol_http_attached *a, dol_api_error *e)
{
    c->gen = calloc(1, sizeof *c->gen);
    if (!c->gen) {
        dol_api_error_set(e, 500, "internal_error", NULL, NULL, "Out of memory.");
        return -1;
    }
    c->gen->chat = chat;
    c->gen->logprobs = -1;
    if (!a->model || !a->tok || !a->has_sched) {
        dol_api_error_set(e, 503, "service_unavailable", NULL, "model_loading",
                          "The model is not loaded yet.");
        return -1;
    }
    c->gen->tok = a->tok;
    snprintf(c->gen->model_name, sizeof c->gen->model_name, "%s", a->name);
    char hex[25];
    dol_http_random_hex(hex, 12);
    snprintf(c->gen->cmpl_id, sizeof c->gen->cmpl_id, "%s-%s", c->gen->chat ? "chatcmpl" : "cmpl", hex);
    c->gen->created = (int64_t)time(NULL);
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
    if (dol_http_check_model(c, p->model, a, e)) return -1;
    if (cfg->max_batch_size > 0 && p->n > cfg->max_batch_size) {
        dol_api_error_invalid(e, "n", "'n' is %d but this server runs at most %d sequences "
                              "at once (max_batch_size).", p->n, cfg->max_batch_size);
        return -1;
    }
    c->gen->reqs = calloc((size_t)n_reqs, sizeof *c->gen->reqs);
    c->gen->echo_text = calloc((size_t)n_reqs, sizeof *c->gen->echo_text);
    c->gen->outs = calloc((size_t)n_reqs * (size_t)p->n, sizeof *c->gen->outs);
    c->gen->st = calloc((size_t)n_reqs, sizeof *c->gen->st);
    if (!c->gen->reqs || !c->gen->echo_text || !c->gen->outs || !c->gen->st) return oom(e);
    c->gen->n_reqs = n_reqs;
    c->gen->n = p->n;
    c->gen->stream = p->stream;
    c->gen->include_usage = p->include_usage;
    c->gen->echo = p->echo && !p->chat;
    c->gen->logprobs = p->logprobs;
    c->gen->return_token_ids = p->return_token_ids;
    return 0;
}

int dol_http_gen_add(dol_http_req *c, const dol_http_attached *a,
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
    if (dol_api_check_prompt_tokens(n_ids, &lim, c->gen->chat ? "messages" : "prompt", e) ||
        dol_api_check_context(n_ids, p->max_tokens, a->context_len, e)) {
        free(ids);
        return -1;
    }
    dol_request_params rp = {
        .prompt_ids = ids, .n_prompt = n_ids, .max_tokens = (int)p->max_tokens, .n = p->n,
        .sampling = p->sampling,
        .seed = (p->has_seed ? p->seed : dol_http_random_u64()) + (uint64_t)index * (uint64_t)p->n,
        .n_stop = p->n_stop, .logprobs = p->logprobs,
        .echo_logprobs = c->gen->echo && p->logprobs >= 0, .ignore_eos = p->ignore_eos,
        .grammar = p->grammar,
        .priority = request_priority(c),
        .timeout_ms = timeout_ms,
        .id = c->id, .on_event = dol_http_on_event, .user = (void *)(uintptr_t)c->handle,
    };
    for (int i = 0; i < p->n_stop; i++) rp.stop[i] = p->stop[i];
    c->gen->reqs[index] = dol_request_create(&rp);
    free(ids);
    return c->gen->reqs[index] ? 0 : oom(e);
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
    for (int i = 0; i < c->gen->n_reqs; i++) {
        char err[DOL_ERR_LEN] = "";
        dol_submit_result res = dol_http_sched_submit(c->srv, c->model_idx, c->gen->reqs[i], err,
                                                      sizeof err);
        if (res != DOL_SUBMIT_OK) {
            for (int j = 0; j < c->gen->n_submitted; j++) dol_request_cancel(c->gen->reqs[j]);
            dol_api_error e;
            submit_error(&e, res, err);
            return dol_http_send_error(c, &e);
        }
        if (c->gen->n_submitted++ == 0) atomic_fetch_add(&c->srv->inflight, 1);
    }
    c->phase = PH_WAIT;
    return wait_or_answer(c);
}

void dol_http_gen_cleanup(dol_http_req *c, int *prompt_tokens, int *completion_tokens,
                                  double *queue_ms, double *ttft_ms)
{
    if (!c->gen) return;
    sync_output(c);   /* the final figures; on OOM, those of the last read */
    for (int p = 0; p < c->gen->n_reqs; p++) {
        dol_request *r = c->gen->reqs[p];
        if (!r) continue;
        bool done = true;
        if (p < c->gen->n_submitted) {
            const dol_request_state *st = &c->gen->st[p];
            done = st->done;
            int n_prompt;
            dol_request_prompt(r, &n_prompt);
            *prompt_tokens += n_prompt;
            for (int i = 0; i < c->gen->n; i++) *completion_tokens += c->gen->outs[p * c->gen->n + i].n_ids;
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
    if (c->gen->n_submitted > 0) dol_http_inflight_done(c->srv);
    for (int p = 0; c->gen->echo_text && p < c->gen->n_reqs; p++) free(c->gen->echo_text[p]);
    for (int p = 0; c->gen->st && p < c->gen->n_reqs; p++) dol_request_state_free(&c->gen->st[p]);
    dol_output_free(c->gen->outs, c->gen->outs ? c->gen->n_reqs * c->gen->n : 0);
    free(c->gen->outs);
    free(c->gen->st);
    free(c->gen->echo_text);
    free(c->gen->reqs);
    free(c->gen->sent_text);
    free(c->gen->sent_lps);
    free(c->gen->sent_finish);
    free(c->gen->out);
    free(c->gen);
    c->gen = NULL;
}
