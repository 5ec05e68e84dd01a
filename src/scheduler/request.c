/* src/scheduler/request.c — the life of a dol_request (reference counting,
 * choices, release) and the output side of generation that the scheduler
 * runs for every new token: incremental detokenization, stop strings cut
 * exactly (held back while a tail could still begin one), and the
 * emit-safe text the HTTP layer streams. */
#include "scheduler/request_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *dol_finish_reason_str(dol_finish_reason f)
{
    switch (f) {
    case DOL_FINISH_STOP: return "stop";
    case DOL_FINISH_LENGTH: return "length";
    case DOL_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

dol_request *dol_request_create(const dol_request_params *p)
{
    if (p->n < 1 || p->n_prompt < 1 || p->n_stop < 0 || p->n_stop > DOL_MAX_STOP) return NULL;
    dol_request *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    atomic_init(&r->refs, 1);
    atomic_init(&r->cancelled, false);
    pthread_mutex_init(&r->mu, NULL);
    r->n_prompt = p->n_prompt;
    r->max_tokens = p->max_tokens;
    r->n = p->n;
    r->sampling = p->sampling;
    r->seed = p->seed;
    r->logprobs = p->logprobs;
    r->echo_logprobs = p->echo_logprobs;
    r->ignore_eos = p->ignore_eos;
    r->grammar = p->grammar;
    r->no_speculation = p->no_speculation;
    if (r->grammar) dol_grammar_retain(r->grammar);
    r->priority = p->priority;
    r->timeout_ms = p->timeout_ms;
    snprintf(r->id, sizeof r->id, "%s", p->id ? p->id : "");
    r->on_event = p->on_event;
    r->user = p->user;
    r->t_arrival_ms = dol_now_ms();
    bool ok = true;
    r->prompt_ids = malloc(sizeof(int32_t) * (size_t)p->n_prompt);
    if (r->prompt_ids) memcpy(r->prompt_ids, p->prompt_ids, sizeof(int32_t) * (size_t)p->n_prompt);
    else ok = false;
    for (int i = 0; ok && i < p->n_stop; i++) {
        r->stop[i] = strdup(p->stop[i]);
        if (r->stop[i]) r->n_stop = i + 1;
        else ok = false;
    }
    r->choices = ok ? calloc((size_t)r->n, sizeof(dol_choice)) : NULL;
    for (int i = 0; r->choices && i < r->n; i++) {
        dol_choice *c = &r->choices[i];
        c->text = malloc(64);
        if (!c->text) { ok = false; break; }
        c->text[0] = '\0';
        c->text_cap = 64;
    }
    if (!ok || !r->choices) {
        dol_request_release(r);
        return NULL;
    }
    return r;
}

const int32_t *dol_request_prompt(const dol_request *r, int *n_prompt)
{
    *n_prompt = r->n_prompt;
    return r->prompt_ids;
}

/* *buf (elements of `size` bytes) resized to cap elements; 0 or -1 (kept). */
static int resize(void **buf, int cap, size_t size)
{
    void *b = realloc(*buf, size * (size_t)cap);
    if (!b) return -1;
    *buf = b;
    return 0;
}

/* Append choice c's output beyond what o holds. Under r->mu. */
static int read_choice(const dol_request *r, const dol_choice *c, dol_output *o)
{
    if (c->text_len > o->text_len || !o->text) {
        size_t need = c->text_len + 1;
        if (need > o->text_cap) {
            size_t cap = o->text_cap ? o->text_cap : 64;
            while (cap < need) cap *= 2;
            char *t = realloc(o->text, cap);
            if (!t) return -1;
            o->text = t;
            o->text_cap = cap;
        }
        memcpy(o->text + o->text_len, c->text + o->text_len, c->text_len - o->text_len);
        o->text_len = c->text_len;
        o->text[o->text_len] = '\0';
    }
    if (c->n_ids > o->n_ids) {
        if (c->n_ids > o->ids_cap) {
            int cap = o->ids_cap ? o->ids_cap : 32;
            while (cap < c->n_ids) cap *= 2;
            if (resize((void **)&o->ids, cap, sizeof *o->ids) ||
                (r->logprobs >= 0 && (resize((void **)&o->lps, cap, sizeof *o->lps) ||
                                      resize((void **)&o->lps_text_len, cap,
                                             sizeof *o->lps_text_len))))
                return -1;
            o->ids_cap = cap;
        }
        int k = c->n_ids - o->n_ids;
        memcpy(o->ids + o->n_ids, c->ids + o->n_ids, sizeof *o->ids * (size_t)k);
        if (r->logprobs >= 0 && c->lps) {
            memcpy(o->lps + o->n_ids, c->lps + o->n_ids, sizeof *o->lps * (size_t)k);
            memcpy(o->lps_text_len + o->n_ids, c->lps_text_len + o->n_ids,
                   sizeof *o->lps_text_len * (size_t)k);
        }
        o->n_ids = c->n_ids;
    }
    o->finish = c->finish;
    return 0;
}

int dol_request_read(dol_request *r, dol_output *out, dol_request_state *st)
{
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n && rc == 0; i++) rc = read_choice(r, &r->choices[i], &out[i]);
    if (r->prompt_lps && !st->prompt_lps) {
        st->prompt_lps = malloc(sizeof *st->prompt_lps * (size_t)r->n_prompt);
        if (st->prompt_lps)
            memcpy(st->prompt_lps, r->prompt_lps, sizeof *st->prompt_lps * (size_t)r->n_prompt);
        else
            rc = -1;
    }
    st->done = r->done && rc == 0;   /* done only once everything was taken */
    st->error = r->error;
    st->n_cached_prompt = r->n_cached_prompt;
    st->t_arrival_ms = r->t_arrival_ms;
    st->t_start_ms = r->t_start_ms;
    st->t_first_token_ms = r->t_first_token_ms;
    st->t_done_ms = r->t_done_ms;
    st->spec_proposed = r->spec_proposed;
    st->spec_accepted = r->spec_accepted;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void dol_output_free(dol_output *out, int n)
{
    for (int i = 0; out && i < n; i++) {
        free(out[i].text);
        free(out[i].ids);
        free(out[i].lps);
        free(out[i].lps_text_len);
        memset(&out[i], 0, sizeof out[i]);
    }
}

void dol_request_state_free(dol_request_state *st)
{
    free(st->prompt_lps);
    st->prompt_lps = NULL;
}

void dol_request_retain(dol_request *r) { atomic_fetch_add(&r->refs, 1); }

void dol_request_cancel(dol_request *r) { atomic_store(&r->cancelled, true); }

void dol_request_release(dol_request *r)
{
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
    if (r->choices) {
        for (int i = 0; i < r->n; i++) {
            dol_choice *c = &r->choices[i];
            dol_choice_out_free(c);
            free(c->text);
            free(c->ids);
            free(c->lps);
            free(c->lps_text_len);
        }
        free(r->choices);
    }
    free(r->prompt_lps);
    free(r->prompt_ids);
    dol_grammar_release(r->grammar);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* ---- output processing ---------------------------------------------------- */

typedef struct {
    dol_detok *detok;
    char *held;          /* text produced but not yet emit-safe */
    size_t held_len, held_cap;
} choice_out;

static int buf_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *len + n + 1) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) return -1;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

int dol_choice_out_init(dol_choice *c, const dol_tokenizer *tok,
                        const int32_t *prompt, int n_prompt)
{
    choice_out *o = calloc(1, sizeof *o);
    if (!o) return -1;
    o->detok = dol_detok_new(tok, prompt, (size_t)n_prompt);
    if (!o->detok) { free(o); return -1; }
    c->priv = o;
    return 0;
}

void dol_choice_out_free(dol_choice *c)
{
    choice_out *o = c->priv;
    if (!o) return;
    dol_detok_free(o->detok);
    free(o->held);
    free(o);
    c->priv = NULL;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of a stop
 * string: that much must be held back, it may still become a match. */
static size_t partial_stop_suffix(const char *s, size_t n, char *const *stop, int n_stop)
{
    size_t best = 0;
    for (int i = 0; i < n_stop; i++) {
        size_t sl = strlen(stop[i]);
        size_t maxk = sl - 1 < n ? sl - 1 : n;
        for (size_t k = maxk; k > best; k--)
            if (memcmp(s + n - k, stop[i], k) == 0) { best = k; break; }
    }
    return best;
}

/* Earliest match of any stop string in s[0..n), or -1. */
static long find_stop(const char *s, size_t n, char *const *stop, int n_stop)
{
    long best = -1;
    for (int i = 0; i < n_stop; i++) {
        const char *m = memmem(s, n, stop[i], strlen(stop[i]));
        if (m && (best < 0 || m - s < best)) best = m - s;
    }
    return best;
}

/* Move emit-safe text from held to c->text. final: nothing more will come. */
static int settle(dol_request *r, dol_choice *c, choice_out *o, bool final, bool *stopped)
{
    long m = find_stop(o->held, o->held_len, r->stop, r->n_stop);
    size_t commit;
    if (m >= 0) {
        commit = (size_t)m;
        *stopped = true;
    } else if (final) {
        commit = o->held_len;
    } else {
        commit = o->held_len - partial_stop_suffix(o->held, o->held_len, r->stop, r->n_stop);
    }
    if (commit > 0) {
        if (buf_append(&c->text, &c->text_len, &c->text_cap, o->held, commit) != 0) return -1;
        memmove(o->held, o->held + commit, o->held_len - commit);
        o->held_len -= commit;
    }
    if (*stopped || final) o->held_len = 0;
    return 0;
}

int dol_choice_push_token(dol_request *r, dol_choice *c, int32_t id, bool is_stop_token,
                          const dol_token_logprob *lp, bool *stopped)
{
    choice_out *o = c->priv;
    *stopped = false;
    if (c->n_ids == c->ids_cap) {
        int cap = c->ids_cap ? c->ids_cap * 2 : 32;
        int32_t *ids = realloc(c->ids, sizeof(int32_t) * (size_t)cap);
        if (!ids) return -1;
        c->ids = ids;
        if (r->logprobs >= 0) {
            dol_token_logprob *l = realloc(c->lps, sizeof *l * (size_t)cap);
            if (!l) return -1;
            c->lps = l;
            int *tl = realloc(c->lps_text_len, sizeof(int) * (size_t)cap);
            if (!tl) return -1;
            c->lps_text_len = tl;
        }
        c->ids_cap = cap;
    }
    c->ids[c->n_ids] = id;
    if (r->logprobs >= 0 && lp) c->lps[c->n_ids] = *lp;
    c->n_ids++;
    if (is_stop_token) {
        if (r->logprobs >= 0) c->lps_text_len[c->n_ids - 1] = (int)c->text_len;
        return 0;
    }
    size_t before = o->held_len;
    (void)before;
    if (dol_detok_push(o->detok, id, &o->held, &o->held_len, &o->held_cap) < 0) return -1;
    int rc = settle(r, c, o, false, stopped);
    if (r->logprobs >= 0) c->lps_text_len[c->n_ids - 1] = (int)(c->text_len + o->held_len);
    return rc;
}

int dol_choice_finish_text(dol_request *r, dol_choice *c)
{
    choice_out *o = c->priv;
    if (!o) return 0;
    bool stopped = false;
    if (dol_detok_finish(o->detok, &o->held, &o->held_len, &o->held_cap) < 0) return -1;
    return settle(r, c, o, true, &stopped);
}
