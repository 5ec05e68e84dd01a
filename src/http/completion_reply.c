/* src/http/completion_reply.c — the answer of POST /v1/completions and POST
 * /v1/chat/completions once their requests are queued (completion.c):
 * waiting with the connection suspended, then, non-streaming, the whole JSON
 * once every request is done; streaming, once the first output (or an early
 * failure) arrives, a text/event-stream response whose content reader emits
 * the new text of each choice as SSE chunks, suspending when nothing is
 * ready; the scheduler's on_event resumes it (handles.c). Output is taken
 * with dol_request_read into cmpl->outs / cmpl->st and rendered from there.
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
    if (c->cmpl->out_len + n > c->cmpl->out_cap) {
        size_t cap = c->cmpl->out_cap ? c->cmpl->out_cap : 1024;
        while (cap < c->cmpl->out_len + n) cap *= 2;
        char *nb = realloc(c->cmpl->out, cap);
        if (!nb) return -1;
        c->cmpl->out = nb;
        c->cmpl->out_cap = cap;
    }
    memcpy(c->cmpl->out + c->cmpl->out_len, s, n);
    c->cmpl->out_len += n;
    return 0;
}

/* Frame j (taken over; NULL = [DONE]) as one SSE event into c->cmpl->out. */
static int emit(dol_http_req *c, cJSON *j)
{
    size_t n = 0;
    char *ev = dol_api_sse_event(j, &n);
    if (!ev) return -1;
    int rc = out_append(c, ev, n);
    free(ev);
    return rc;
}

/* Take what every request produced since the last read into c->cmpl->outs and
 * c->cmpl->st (dol_request_read). 0, or -1 on OOM. */
static int sync_output(dol_http_req *c)
{
    for (int p = 0; p < c->cmpl->n_submitted; p++)
        if (dol_request_read(c->cmpl->reqs[p], &c->cmpl->outs[p * c->cmpl->n], &c->cmpl->st[p]) != 0) return -1;
    return 0;
}

static void error_from_request(const dol_http_req *c, dol_api_error *e,
                               const dol_request_state *st)
{
    dol_api_error_from_reason(e, &st->error, c->cmpl->chat ? "messages" : "prompt");
}

static bool request_failed(const dol_http_req *c, int p)
{
    if (c->cmpl->st[p].error.reason != DOL_REASON_NONE) return true;
    for (int i = 0; i < c->cmpl->n; i++)
        if (c->cmpl->outs[p * c->cmpl->n + i].finish == DOL_FINISH_ERROR) return true;
    return false;
}

static const char *finish_str(dol_finish_reason f)
{
    const char *s = dol_finish_reason_str(f);
    return s ? s : "stop";
}

static dol_api_meta meta_of(const dol_http_req *c)
{
    dol_api_meta m = {c->cmpl->cmpl_id, c->cmpl->model_name, c->cmpl->created, NULL, 0};
    return m;
}

/* Echo with logprobs needs the prompt's logprobs, which the scheduler hands
 * over once the prompt is in (or the request ended). */
static bool prompt_lps_ready(const dol_http_req *c, int p)
{
    return !c->cmpl->echo || c->cmpl->logprobs < 0 || c->cmpl->st[p].prompt_lps || c->cmpl->st[p].done ||
           request_failed(c, p);
}

/* ---- logprobs ----------------------------------------------------------- */

/* Whether ids hold a token with text (any but a control token). */
static bool has_text_token(const dol_tokenizer *tok, const int32_t *ids, int n)
{
    for (int j = 0; j < n; j++)
        if (!dol_tokenizer_is_control(tok, ids[j])) return true;
    return false;
}

/* Logprobs of a choice's tokens [from, to) of request p: the legacy
 * completions object (with text offsets, shifted by base) or the chat one. */
static cJSON *choice_logprobs(const dol_http_req *c, int p, const dol_output *ch,
                              int from, int to, size_t base)
{
    if (c->cmpl->chat) return dol_api_chat_logprobs_json(c->cmpl->tok, ch->lps ? ch->lps + from : NULL,
                                                   ch->lps && to > from ? to - from : 0);
    if (!ch->lps || to <= from) return dol_api_logprobs_json(c->cmpl->tok, NULL, NULL, 0);
    int *off = malloc((size_t)(to - from) * sizeof *off);
    if (!off) return NULL;
    for (int j = from; j < to; j++)
        off[j - from] = (int)base + (j > 0 && ch->lps_text_len ? ch->lps_text_len[j - 1] : 0);
    int n_prompt;
    const int32_t *prompt = dol_request_prompt(c->cmpl->reqs[p], &n_prompt);
    bool at_start = !has_text_token(c->cmpl->tok, prompt, n_prompt) &&
                    !has_text_token(c->cmpl->tok, ch->ids, from);
    int end = (int)base + (to > 0 && ch->lps_text_len ? ch->lps_text_len[to - 1] : 0);
    cJSON *lp = dol_api_logprobs_json_at(c->cmpl->tok, ch->lps + from, off, to - from, at_start,
                                         ch->text ? ch->text : "", ch->text_len, (int)base, end);
    free(off);
    return lp;
}

/* Logprobs of an echoed prompt (entry 0 carries none), its tokens spelling
 * the echoed text. */
static cJSON *prompt_logprobs(const dol_http_req *c, int p, size_t echo_len)
{
    int n_prompt;
    const int32_t *prompt = dol_request_prompt(c->cmpl->reqs[p], &n_prompt);
    return dol_api_echo_logprobs_json(c->cmpl->tok, c->cmpl->st[p].prompt_lps, prompt, n_prompt,
                                      c->cmpl->echo_text[p], echo_len);
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
    int total = c->cmpl->n_reqs * c->cmpl->n;
    dol_api_choice *ch = calloc((size_t)total, sizeof *ch);
    char **texts = calloc((size_t)total, sizeof *texts);
    dol_api_usage usage = {0, 0, 0};
    dol_api_error e = {0};
    bool failed = false, oom = !ch || !texts;
    for (int p = 0; p < c->cmpl->n_reqs && !failed && !oom; p++) {
        int n_prompt;
        const int32_t *prompt = dol_request_prompt(c->cmpl->reqs[p], &n_prompt);
        const char *echo = c->cmpl->echo ? c->cmpl->echo_text[p] : "";
        size_t elen = strlen(echo);
        if (request_failed(c, p)) {
            error_from_request(c, &e, &c->cmpl->st[p]);
            failed = true;
        }
        usage.prompt_tokens += n_prompt;
        usage.cached_tokens += c->cmpl->st[p].n_cached_prompt;
        for (int i = 0; i < c->cmpl->n && !failed && !oom; i++) {
            const dol_output *rc = &c->cmpl->outs[p * c->cmpl->n + i];
            int k = p * c->cmpl->n + i;
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
            if (c->cmpl->return_token_ids) {
                ch[k].token_ids = rc->ids;
                ch[k].n_token_ids = rc->n_ids;
                if (!c->cmpl->chat) {
                    ch[k].prompt_ids = prompt;
                    ch[k].n_prompt_ids = n_prompt;
                }
            }
            if (c->cmpl->logprobs >= 0) {
                cJSON *lp = choice_logprobs(c, p, rc, 0, rc->n_ids, elen);
                if (lp && c->cmpl->echo) {
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
        if (c->cmpl->chat && c->cmpl->return_token_ids) m.prompt_ids = dol_request_prompt(c->cmpl->reqs[0], &m.n_prompt_ids);
        cJSON *j = c->cmpl->chat ? dol_api_chat_json(&m, ch, total, &usage)
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
    cJSON *j = c->cmpl->chat ? dol_api_chat_chunk_json(m, ch, 1, NULL)
                       : dol_api_completion_json(m, ch, 1, NULL);
    return j ? emit(c, j) : -1;
}

static int emit_error_event(dol_http_req *c, const dol_api_error *e)
{
    char *s = dol_api_error_json(e);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    free(s);
    if (!j || emit(c, j) || emit(c, NULL)) return -1;
    c->cmpl->stream_over = true;
    return 0;
}

/* The chunks before any generated text, one per choice: chat's role chunk
 * ({"role":"assistant","content":""}); for completions the echoed prompt
 * (with its logprobs) and, with return_token_ids, the prompt's ids. */
static int emit_preamble(dol_http_req *c)
{
    for (int p = 0; p < c->cmpl->n_reqs; p++) {
        int rc = 0, n_prompt;
        const int32_t *prompt = dol_request_prompt(c->cmpl->reqs[p], &n_prompt);
        for (int i = 0; i < c->cmpl->n && rc == 0; i++) {
            dol_api_meta m = meta_of(c);
            dol_api_choice ch = {.index = p * c->cmpl->n + i};
            if (c->cmpl->chat) {
                ch.role = true;
                ch.text = "";
                if (c->cmpl->return_token_ids && i == 0) {
                    m.prompt_ids = prompt;
                    m.n_prompt_ids = n_prompt;
                }
            } else {
                if (!c->cmpl->echo && !c->cmpl->return_token_ids) break;
                ch.text = c->cmpl->echo ? c->cmpl->echo_text[p] : "";
                ch.text_len = strlen(ch.text);
                if (c->cmpl->logprobs >= 0)
                    ch.logprobs = c->cmpl->echo ? prompt_logprobs(c, p, ch.text_len)
                                          : dol_api_logprobs_json(c->cmpl->tok, NULL, NULL, 0);
                if (c->cmpl->return_token_ids) {
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
    c->cmpl->preamble_sent = true;
    return 0;
}

/* New output of one choice (text, and the ids / logprobs of new tokens),
 * then its finish chunk once it has ended. */
static int emit_progress(dol_http_req *c, int p, int i)
{
    int k = p * c->cmpl->n + i;
    const dol_output *ch = &c->cmpl->outs[k];
    dol_api_meta m = meta_of(c);
    size_t base = c->cmpl->echo ? strlen(c->cmpl->echo_text[p]) : 0;
    bool per_token = (c->cmpl->logprobs >= 0 && ch->lps) || c->cmpl->return_token_ids;
    bool ended = ch->finish != DOL_FINISH_NONE || c->cmpl->st[p].done;
    /* tokens go out with the text they produced: one whose text is still
     * held back (it may yet be cut by a stop string) waits for it */
    int to = ch->n_ids;
    if (!ended && c->cmpl->logprobs >= 0 && ch->lps_text_len)
        while (to > c->cmpl->sent_lps[k] && (size_t)ch->lps_text_len[to - 1] > ch->text_len) to--;
    bool new_ids = per_token && to > c->cmpl->sent_lps[k];
    if (ch->text_len > c->cmpl->sent_text[k] || new_ids) {
        dol_api_choice out = {.index = k};
        out.text = ch->text + c->cmpl->sent_text[k];
        out.text_len = ch->text_len - c->cmpl->sent_text[k];
        if (c->cmpl->logprobs >= 0) out.logprobs = choice_logprobs(c, p, ch, c->cmpl->sent_lps[k], to, base);
        if (c->cmpl->return_token_ids) {
            out.token_ids = ch->ids + c->cmpl->sent_lps[k];
            out.n_token_ids = to - c->cmpl->sent_lps[k];
        }
        if (emit_choice(c, &out, &m)) return -1;
        c->cmpl->sent_text[k] = ch->text_len;
        c->cmpl->sent_lps[k] = to;
    }
    if (!c->cmpl->sent_finish[k] && ended) {
        dol_api_choice out = {.index = k, .finish = finish_str(ch->finish)};
        if (!c->cmpl->chat) {
            out.text = "";
            if (c->cmpl->logprobs >= 0) out.logprobs = dol_api_logprobs_json(c->cmpl->tok, NULL, NULL, 0);
        }
        if (emit_choice(c, &out, &m)) return -1;
        c->cmpl->sent_finish[k] = true;
    }
    return 0;
}

/* Move whatever is new in the requests into SSE events in c->cmpl->out. */
static int produce(dol_http_req *c)
{
    /* A failure (before or after the first token) ends the stream with an
     * error event. Echo with logprobs waits for the prompt's logprobs. */
    if (sync_output(c)) return -1;
    bool ready = true;
    for (int p = 0; p < c->cmpl->n_reqs; p++) {
        if (request_failed(c, p)) {
            dol_api_error e;
            error_from_request(c, &e, &c->cmpl->st[p]);
            return emit_error_event(c, &e);
        }
        if (!prompt_lps_ready(c, p)) ready = false;
    }
    if (!c->cmpl->preamble_sent) {
        if (!ready) return 0;
        if (emit_preamble(c)) return -1;
    }
    bool all_over = true;
    int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    for (int p = 0; p < c->cmpl->n_reqs; p++) {
        int rc = 0, n_prompt;
        dol_request_prompt(c->cmpl->reqs[p], &n_prompt);
        prompt_tokens += n_prompt;
        cached_tokens += c->cmpl->st[p].n_cached_prompt;
        for (int i = 0; i < c->cmpl->n && rc == 0; i++) {
            completion_tokens += c->cmpl->outs[p * c->cmpl->n + i].n_ids;
            rc = emit_progress(c, p, i);
            if (!c->cmpl->sent_finish[p * c->cmpl->n + i]) all_over = false;
        }
        if (!c->cmpl->st[p].done) all_over = false;
        if (rc) return -1;
    }
    if (!all_over) return 0;
    if (c->cmpl->include_usage) {
        dol_api_meta m = meta_of(c);
        dol_api_usage u = {prompt_tokens, completion_tokens, cached_tokens};
        cJSON *j = c->cmpl->chat ? dol_api_chat_chunk_json(&m, NULL, 0, &u)
                           : dol_api_completion_json(&m, NULL, 0, &u);
        if (!j || emit(c, j)) return -1;
    }
    if (emit(c, NULL)) return -1;
    c->cmpl->stream_over = true;
    return 0;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    dol_http_req *c = cls;
    for (;;) {
        if (c->cmpl->out_off < c->cmpl->out_len) {
            size_t n = c->cmpl->out_len - c->cmpl->out_off;
            if (n > max) n = max;
            memcpy(buf, c->cmpl->out + c->cmpl->out_off, n);
            c->cmpl->out_off += n;
            return (ssize_t)n;
        }
        c->cmpl->out_len = c->cmpl->out_off = 0;
        if (c->cmpl->stream_over) return MHD_CONTENT_READER_END_OF_STREAM;
        dol_http_clear_pending(c);
        if (produce(c)) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (c->cmpl->out_len > 0 || c->cmpl->stream_over) continue;
        switch (dol_http_suspend(c)) {
        case DOL_WAIT_SUSPENDED: return 0;
        case DOL_WAIT_PENDING: continue;
        default: return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static enum MHD_Result start_stream(dol_http_req *c)
{
    int total = c->cmpl->n_reqs * c->cmpl->n;
    c->cmpl->sent_text = calloc((size_t)total, sizeof *c->cmpl->sent_text);
    c->cmpl->sent_lps = calloc((size_t)total, sizeof *c->cmpl->sent_lps);
    c->cmpl->sent_finish = calloc((size_t)total, sizeof *c->cmpl->sent_finish);
    if (!c->cmpl->sent_text || !c->cmpl->sent_lps || !c->cmpl->sent_finish) return dol_http_send_json(c, 500, NULL);
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
    bool all_done = true, any_output = false, failed = false, echo_ready = c->cmpl->echo;
    for (int p = 0; p < c->cmpl->n_reqs; p++) {
        if (!c->cmpl->st[p].done) all_done = false;
        if (request_failed(c, p)) failed = true;
        if (!prompt_lps_ready(c, p)) echo_ready = false;
        for (int i = 0; i < c->cmpl->n; i++) {
            const dol_output *o = &c->cmpl->outs[p * c->cmpl->n + i];
            if (o->n_ids > 0 || o->text_len > 0 || o->finish != DOL_FINISH_NONE)
                any_output = true;
        }
    }
    *failed_early = failed && !any_output;
    if (!c->cmpl->stream) return all_done || failed;
    return all_done || failed || any_output || echo_ready;
}

static enum MHD_Result wait_or_answer(dol_http_req *c)
{
    for (;;) {
        dol_http_clear_pending(c);
        if (sync_output(c)) return dol_http_send_json(c, 500, NULL);
        bool failed_early = false;
        if (ready_to_answer(c, &failed_early)) {
            if (!c->cmpl->stream || failed_early) return respond_whole(c);
            return start_stream(c);
        }
        switch (dol_http_suspend(c)) {
        case DOL_WAIT_SUSPENDED: return MHD_YES;
        case DOL_WAIT_PENDING: continue;
        default: return MHD_NO;   /* server stopping: close */
        }
    }
}

enum MHD_Result dol_http_cmpl_resume(dol_http_req *c)
{
    return wait_or_answer(c);
}

int dol_http_cmpl_sync(dol_http_req *c)
{
    return sync_output(c);
}
