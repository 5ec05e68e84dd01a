/* src/scheduler/scheduler.c — the dynamic batcher (docs/architecture.md). One thread owns
 * the engine and loops: retire cancelled / timed-out / disconnected work,
 * admit queued requests (batch window, priorities, KV-cache admission,
 * continuous or static mode), build one batch of prefill chunks and decode
 * tokens, run the forward pass, sample, and hand the text to the requests. */
#include "dolphin/scheduler.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dolphin/log.h"
#include "scheduler/request_priv.h"

/* One running sequence: a choice of a request. Sequences live in slots that
 * keep their index until the request retires (`used` false = a free slot). */
typedef struct {
    bool used;
    dol_request *r;
    int choice;
    int seq;              /* engine sequence id */
    int32_t *tokens;      /* prompt + generated */
    int n_tokens, cap;
    int n_past;           /* tokens whose K/V are in the cache */
    float *logits;        /* [vocab] logits after the last token */
    dol_rng rng;
    bool finished;
    dol_matcher *m;       /* structured output: the choice's grammar state */
    bool waiting_fork;    /* n > 1: created from choice 0 once its prompt is in */
    dol_token_logprob *plps; /* choice 0 of an echo_logprobs request: the
                                prompt's logprobs so far (n_prompt entries),
                                handed to the request once the prompt is in */
    /* speculative decoding (docs/speculative.md); logits then has
     * 1 + spec_max_draft rows */
    bool spec;            /* this sequence may propose */
    int32_t draft[DOL_SPEC_MAX_DRAFT];
    int n_draft;          /* drafts in this step's item; 0 = a plain step */
    int spec_pause;       /* steps left without proposing */
    int spec_fails;       /* failing rounds in a row: each doubles the pause */
    int round_prop, round_acc; /* this round's drafts proposed and accepted */
    int dseq;             /* draft model: its sequence in the draft's engine, or -1 */
    int d_past;           /* draft model: tokens whose K/V its cache holds */
} seq_t;

/* Scheduler-private part of a request. */
typedef struct {
    int n_live;           /* choices not yet finished */
    bool admitted;
    int slot[];           /* n entries once admitted: each choice's slot */
} req_priv;

struct dol_scheduler {
    dol_engine *e;
    const dol_tokenizer *tok;
    dol_scheduler_params p;
    int vocab, ctx, eos, bos;
    int end_ids[DOL_MAX_EOS_IDS], n_end_ids;   /* more ids that end a choice */

    pthread_t thread;
    pthread_mutex_t mu;   /* guards queue, stop, draining, stats */
    pthread_cond_t cv;
    bool stop;
    bool draining;

    dol_request **queue;  /* waiting, unsorted; picked by priority then seqno */
    int n_queue, cap_queue;
    uint64_t next_seqno;

    /* owned by the scheduler thread */
    seq_t *seqs;          /* slots of the running sequences, [0, n_slots) */
    int n_slots, cap_slots;
    int n_used;           /* slots in use */
    /* per-step buffers, max_batch_size entries (one item per live sequence) */
    dol_batch_item *items;
    int *item_slot;       /* the slot of each item */
    float **item_rows;    /* an echo-with-logprobs prefill chunk's logits rows */
    dol_request **step_reqs;  /* each item's request, retained for the step */
    dol_request **touched;    /* requests with new output this step */
    dol_sampler *sampler;
    float *lp_scratch;
    dol_grammar_vocab *gv;    /* the vocabulary trie, built on the first grammar */
    uint64_t *mask;           /* one sequence's allowed tokens */
    /* the draft model's step (spec_mode DRAFT), max_batch_size entries */
    dol_batch_item *d_items;
    int *d_who;               /* the step's item of each proposing sequence */
    float *d_logits;          /* a row of vocab logits per proposing sequence */

    uint64_t n_steps, n_prompt_tokens, n_generated; /* copied into st */
    uint64_t n_prefix_query_tokens, n_prefix_hit_tokens;
    uint64_t n_spec_proposed, n_spec_accepted;
    double mem_sampled_ms;  /* last sample_memory */
    double gpu_sampled_ms;  /* last GPU utilisation sample */
    dol_scheduler_stats st;
};

/* ---- small helpers ------------------------------------------------------- */

static double now_ms(const dol_scheduler *s)
{
    return s->p.clock_ms ? s->p.clock_ms(s->p.clock_ctx) : dol_now_ms();
}

const char *dol_reason_name(dol_reason r)
{
    switch (r) {
    case DOL_REASON_NONE: return "none";
    case DOL_REASON_QUEUE_FULL: return "queue_full";
    case DOL_REASON_DRAINING: return "draining";
    case DOL_REASON_CONTEXT_OVERFLOW: return "context_overflow";
    case DOL_REASON_KV_OVERFLOW: return "kv_overflow";
    case DOL_REASON_BAD_TOKEN: return "bad_token";
    case DOL_REASON_TOO_MANY_CHOICES: return "too_many_choices";
    case DOL_REASON_INVALID: return "invalid";
    case DOL_REASON_CANCELLED: return "cancelled";
    case DOL_REASON_TIMED_OUT: return "timed_out";
    case DOL_REASON_NO_MEMORY: return "no_memory";
    case DOL_REASON_BACKEND_FAILURE: return "backend_failure";
    case DOL_REASON_GRAMMAR_BROKEN: return "grammar_broken";
    }
    return "unknown";
}

/* The reason with the request's own figures. */
static dol_reason_info reason_of(const dol_request *r, dol_reason why)
{
    dol_reason_info in = {.reason = why, .n_prompt = r->n_prompt, .max_tokens = r->max_tokens,
                          .n = r->n};
    if (why == DOL_REASON_TIMED_OUT) in.timeout_ms = r->timeout_ms;
    return in;
}

static dol_reason refuse(dol_reason_info *why, dol_reason_info in)
{
    if (why) *why = in;
    return in.reason;
}

static void notify(dol_request *r)
{
    if (r->on_event) r->on_event(r, r->user);
}

static bool request_gone(dol_request *r) { return atomic_load(&r->cancelled); }

/* Whether id is one of the configured ids that end a choice (end_ids). */
static bool is_end_id(const dol_scheduler *s, int32_t id)
{
    for (int i = 0; i < s->n_end_ids; i++)
        if (id == s->end_ids[i]) return true;
    return false;
}

/* Blocks n choices of a prompt need at admission: every choice reserves
 * room for its prompt plus max_new up front (no preemption needed later);
 * choices 2..n share the prompt's full blocks. */
static int64_t blocks_for(const dol_scheduler *s, int n_prompt, int max_new, int n)
{
    int64_t total = (int64_t)n_prompt + max_new;
    if (total > s->ctx) total = s->ctx;
    int64_t one = dol_engine_blocks_for(s->e, (int)total);
    int64_t shared = n_prompt / dol_engine_kv_block_size(s->e);
    return one + (int64_t)(n - 1) * (one - shared);
}

static int blocks_needed(const dol_scheduler *s, const dol_request *r)
{
    return (int)blocks_for(s, r->n_prompt, r->max_tokens, r->n);
}

/* Blocks promised to admitted requests but not taken from the pool yet:
 * choices 1..n-1 reserve theirs only when they are forked, after choice 0's
 * prefill, and nothing else may take those blocks in the meantime. */
static int blocks_owed(const dol_scheduler *s)
{
    int owed = 0;
    for (int i = 0; i < s->n_slots; i++) {
        const seq_t *q = &s->seqs[i];
        if (!q->used || !q->waiting_fork) continue;
        const dol_request *r = q->r;
        int total = r->n_prompt + r->max_tokens;
        if (total > s->ctx) total = s->ctx;
        owed += dol_engine_blocks_for(s->e, total) - r->n_prompt / dol_engine_kv_block_size(s->e);
    }
    return owed;
}

/* ---- submit / drain / stats (any thread) --------------------------------- */

dol_reason dol_scheduler_fit(const dol_scheduler *s, int n_prompt, int n, int max_new,
                             int *fit, dol_reason_info *why)
{
    *fit = 0;
    dol_reason_info in = {.n_prompt = n_prompt, .max_tokens = max_new, .n = n};
    int bs = dol_engine_kv_block_size(s->e);
    int64_t pool = (int64_t)dol_engine_kv_blocks_total(s->e);
    if (n < 1 || n_prompt < 0) {
        in.reason = DOL_REASON_INVALID;
        return refuse(why, in);
    }
    if (max_new >= 0) {
        if ((int64_t)n_prompt + max_new > s->ctx) {
            in.reason = DOL_REASON_CONTEXT_OVERFLOW;
            in.limit = s->ctx;
        } else if (blocks_for(s, n_prompt, max_new, n) > pool) {
            in.reason = DOL_REASON_KV_OVERFLOW;
            in.limit = (int)(pool * bs);
        } else {
            *fit = max_new;
        }
        return refuse(why, in);
    }
    /* as many as fit: the context's room, capped by what the pool holds when
     * each choice gets the same share (the prompt's whole blocks shared) */
    int64_t ctx_room = (int64_t)s->ctx - n_prompt;
    int64_t shared = n_prompt / bs;
    int64_t kv_room = (pool + (int64_t)(n - 1) * shared) / n * bs - n_prompt;
    if (ctx_room < 1) {
        in.reason = DOL_REASON_CONTEXT_OVERFLOW;
        in.limit = s->ctx;
    } else if (kv_room < 1) {
        in.reason = DOL_REASON_KV_OVERFLOW;
        in.limit = (int)(pool * bs);
    } else {
        *fit = (int)(kv_room < ctx_room ? kv_room : ctx_room);
    }
    return refuse(why, in);
}

dol_reason dol_scheduler_submit(dol_scheduler *s, dol_request *r, dol_reason_info *why)
{
    if (r->n < 1 || !r->choices || r->n_prompt < 1 || r->max_tokens < 0)
        return refuse(why, reason_of(r, DOL_REASON_INVALID));
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt_ids[i] < 0 || r->prompt_ids[i] >= s->vocab) {
            dol_reason_info in = reason_of(r, DOL_REASON_BAD_TOKEN);
            in.token = r->prompt_ids[i];
            in.position = i;
            in.limit = s->vocab;
            return refuse(why, in);
        }
    if (r->n > s->p.max_batch_size) {
        dol_reason_info in = reason_of(r, DOL_REASON_TOO_MANY_CHOICES);
        in.limit = s->p.max_batch_size;
        return refuse(why, in);
    }
    int fit;
    dol_reason_info in;
    if (dol_scheduler_fit(s, r->n_prompt, r->n, r->max_tokens, &fit, &in) != DOL_REASON_NONE)
        return refuse(why, in);
    pthread_mutex_lock(&s->mu);
    if (s->draining || s->stop) {
        pthread_mutex_unlock(&s->mu);
        return refuse(why, reason_of(r, DOL_REASON_DRAINING));
    }
    if (s->n_queue >= s->p.max_queue) {
        pthread_mutex_unlock(&s->mu);
        in = reason_of(r, DOL_REASON_QUEUE_FULL);
        in.limit = s->p.max_queue;
        return refuse(why, in);
    }
    if (s->n_queue == s->cap_queue) {
        int cap = s->cap_queue ? s->cap_queue * 2 : 64;
        dol_request **q = realloc(s->queue, sizeof *q * (size_t)cap);
        if (!q) {
            pthread_mutex_unlock(&s->mu);
            return refuse(why, reason_of(r, DOL_REASON_NO_MEMORY));
        }
        s->queue = q;
        s->cap_queue = cap;
    }
    r->priv = calloc(1, sizeof(req_priv) + sizeof(int) * (size_t)r->n);
    if (!r->priv) {
        pthread_mutex_unlock(&s->mu);
        return refuse(why, reason_of(r, DOL_REASON_NO_MEMORY));
    }
    dol_request_retain(r);
    r->seqno = s->next_seqno++;
    if (r->t_arrival_ms == 0 || s->p.clock_ms) r->t_arrival_ms = now_ms(s);
    s->queue[s->n_queue++] = r;
    s->st.queued = s->n_queue;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return DOL_REASON_NONE;
}

void dol_scheduler_drain(dol_scheduler *s)
{
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    s->st.draining = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void dol_scheduler_get_stats(dol_scheduler *s, dol_scheduler_stats *st)
{
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    pthread_mutex_unlock(&s->mu);
}

/* ---- ending sequences and requests (scheduler thread) -------------------- */

static void update_stats(dol_scheduler *s);

/* Free slot i: its engine sequence and buffers. */
static void slot_free(dol_scheduler *s, int i)
{
    seq_t *q = &s->seqs[i];
    dol_engine_seq_free(s->e, q->seq);
    if (q->dseq >= 0) dol_engine_seq_free(s->p.spec_draft, q->dseq);
    free(q->tokens);
    free(q->logits);
    free(q->plps);
    dol_matcher_free(q->m);
    memset(q, 0, sizeof *q);
    s->n_used--;
}

/* End request r: free its sequences, mark done, drop the scheduler's ref. */
static void retire_request(dol_scheduler *s, dol_request *r)
{
    req_priv *rp = r->priv;
    if (rp->admitted)
        for (int c = 0; c < r->n; c++) slot_free(s, rp->slot[c]);
    pthread_mutex_lock(&r->mu);
    for (int c = 0; c < r->n; c++) {
        if (r->choices[c].finish == DOL_FINISH_NONE)
            r->choices[c].finish = r->error.reason != DOL_REASON_NONE ? DOL_FINISH_ERROR
                                                                    : DOL_FINISH_STOP;
        dol_choice_out_free(&r->choices[c]);
    }
    r->done = true;
    r->t_done_ms = now_ms(s);
    pthread_mutex_unlock(&r->mu);
    free(r->priv);
    r->priv = NULL;
    update_stats(s);   /* whoever the answer reaches next sees it gone */
    notify(r);
    dol_request_release(r);
}

static void fail_request(dol_scheduler *s, dol_request *r, dol_reason why)
{
    pthread_mutex_lock(&r->mu);
    r->error = reason_of(r, why);
    pthread_mutex_unlock(&r->mu);
    retire_request(s, r);
}

/* Finish one choice; when it was the last, the request is complete. Returns
 * true when the request was retired (its seq_t entries are gone). */
static bool finish_choice(dol_scheduler *s, seq_t *q, dol_finish_reason why)
{
    dol_request *r = q->r;
    q->finished = true;
    pthread_mutex_lock(&r->mu);
    dol_choice *c = &r->choices[q->choice];
    dol_choice_finish_text(r, c);
    c->finish = why;
    pthread_mutex_unlock(&r->mu);
    req_priv *rp = r->priv;
    if (--rp->n_live == 0) {
        retire_request(s, r);
        return true;
    }
    /* Give the sequence's blocks back now; the seq_t stays until the
     * request retires (it is skipped while finished). */
    dol_engine_seq_free(s->e, q->seq);
    q->seq = -1;
    if (q->dseq >= 0) dol_engine_seq_free(s->p.spec_draft, q->dseq);
    q->dseq = -1;
    return false;
}

/* ---- admission ----------------------------------------------------------- */

/* A new sequence for choice `choice` of r in a free slot; the slot's
 * index, or -1 on OOM. */
static int slot_new(dol_scheduler *s, dol_request *r, int choice)
{
    int i = 0;
    while (i < s->n_slots && s->seqs[i].used) i++;
    if (i == s->cap_slots) {
        int cap = s->cap_slots ? s->cap_slots * 2 : 16;
        seq_t *n = realloc(s->seqs, sizeof *n * (size_t)cap);
        if (!n) return -1;
        s->seqs = n;
        s->cap_slots = cap;
    }
    seq_t *q = &s->seqs[i];
    memset(q, 0, sizeof *q);
    q->r = r;
    q->choice = choice;
    q->seq = -1;
    q->dseq = -1;
    q->cap = r->n_prompt + r->max_tokens + 1;
    q->tokens = malloc(sizeof(int32_t) * (size_t)q->cap);
    /* on a cache line: the CPU engine's threads each write a run of 16
     * floats of these logits (dol_cpu_matmul_scatter), and a run that
     * straddled a line would share it with the other thread's */
    q->spec = s->p.spec_mode != DOL_SPEC_OFF && !r->no_speculation;
    const size_t rows = q->spec ? 1 + (size_t)s->p.spec_max_draft : 1;
    if (posix_memalign((void **)&q->logits, 64, sizeof(float) * rows * (size_t)s->vocab) != 0) q->logits = NULL;
    if (r->grammar) q->m = dol_matcher_new(r->grammar);
    if (!q->tokens || !q->logits || (r->grammar && !q->m)) {
        free(q->tokens); free(q->logits); dol_matcher_free(q->m); return -1;
    }
    if (choice == 0 && r->echo_logprobs) {
        /* entry 0 has no logprob: nothing comes before the first token */
        q->plps = calloc((size_t)r->n_prompt, sizeof *q->plps);
        if (!q->plps) { free(q->tokens); free(q->logits); dol_matcher_free(q->m); return -1; }
        q->plps[0].id = r->prompt_ids[0];
        q->plps[0].n_top = -1;
    }
    memcpy(q->tokens, r->prompt_ids, sizeof(int32_t) * (size_t)r->n_prompt);
    q->n_tokens = r->n_prompt;
    dol_rng_seed(&q->rng, r->seed + (uint64_t)choice);
    q->used = true;
    if (i == s->n_slots) s->n_slots++;
    s->n_used++;
    return i;
}

static int live_seqs(const dol_scheduler *s)
{
    int n = 0;
    for (int i = 0; i < s->n_slots; i++)
        if (s->seqs[i].used && !s->seqs[i].finished) n++;
    return n;
}

/* Index in the queue of the request to admit next: highest priority, then
 * earliest arrival. -1 when empty. Caller holds s->mu. */
static int pick_next(const dol_scheduler *s)
{
    int best = -1;
    for (int i = 0; i < s->n_queue; i++) {
        const dol_request *r = s->queue[i];
        if (best < 0 || r->priority > s->queue[best]->priority ||
            (r->priority == s->queue[best]->priority && r->seqno < s->queue[best]->seqno))
            best = i;
    }
    return best;
}

/* Admit one request: reserve choice 0's blocks and create its sequence (the
 * other choices are forked from it after its prefill). 0 ok, -1 no room. */
static int admit(dol_scheduler *s, dol_request *r)
{
    int total = r->n_prompt + r->max_tokens;
    if (total > s->ctx) total = s->ctx;
    int seq = dol_engine_seq_new(s->e);
    if (seq < 0) return -1;
    if (r->grammar && !s->gv) {   /* the vocabulary trie, once */
        s->gv = dol_grammar_vocab_new(s->tok, s->vocab);
        s->mask = s->gv ? malloc(sizeof(uint64_t) * (size_t)dol_grammar_mask_words(s->gv)) : NULL;
        if (!s->mask) {
            dol_grammar_vocab_free(s->gv);
            s->gv = NULL;
            dol_engine_seq_free(s->e, seq);
            return -1;
        }
    }
    /* Prefix cache: the prompt's leading whole blocks may already be in the
     * pool (an echo with logprobs needs every prompt token's logits, so it
     * computes them all). */
    int cached = r->echo_logprobs ? 0 : dol_engine_seq_match_prefix(s->e, seq, r->prompt_ids, r->n_prompt);
    if (dol_engine_seq_reserve(s->e, seq, total) != 0) {
        dol_engine_seq_free(s->e, seq);
        return -1;
    }
    req_priv *rp = r->priv;
    for (int c = 0; c < r->n; c++) {
        rp->slot[c] = slot_new(s, r, c);
        if (rp->slot[c] < 0) {   /* out of memory: undo */
            for (int k = 0; k < c; k++) slot_free(s, rp->slot[k]);
            dol_engine_seq_free(s->e, seq);
            return -1;
        }
        seq_t *q = &s->seqs[rp->slot[c]];
        if (c == 0) {
            q->seq = seq;
            q->n_past = cached;
        } else {
            q->waiting_fork = true;
        }
    }
    s->n_prompt_tokens += (uint64_t)cached; /* prompt tokens taken in, computed or not */
    s->n_prefix_hit_tokens += (uint64_t)cached;
    if (dol_engine_kv_prefix_caching(s->e) && !r->echo_logprobs)
        s->n_prefix_query_tokens += (uint64_t)r->n_prompt;
    rp->n_live = r->n;
    rp->admitted = true;
    pthread_mutex_lock(&r->mu);
    for (int c = 0; c < r->n; c++)
        dol_choice_out_init(&r->choices[c], s->tok, r->prompt_ids, r->n_prompt);
    r->n_cached_prompt = cached;
    r->t_start_ms = now_ms(s);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* Fraction of the KV pool in use or promised (blocks_owed). */
static double kv_use(const dol_scheduler *s, int owed)
{
    int total = dol_engine_kv_blocks_total(s->e);
    return total ? 1.0 - (double)(dol_engine_kv_blocks_free(s->e) - owed) / total : 0.0;
}

/* Move queued requests into the running batch. Caller holds s->mu. */
static void admit_from_queue(dol_scheduler *s)
{
    int running = live_seqs(s);
    if (s->p.mode == DOL_BATCH_STATIC && s->n_used > 0) return; /* batch runs to the end */
    while (s->n_queue > 0) {
        int i = pick_next(s);
        dol_request *r = s->queue[i];
        if (running + r->n > s->p.max_batch_size) break;
        /* Memory-aware admission: above the watermark, one sequence at a time. */
        int owed = blocks_owed(s);
        if (kv_use(s, owed) >= s->p.memory_high_watermark && running > 0) break;
        if (blocks_needed(s, r) > dol_engine_kv_blocks_free(s->e) - owed) break; /* wait for room */
        if (admit(s, r) != 0) break;
        s->queue[i] = s->queue[--s->n_queue];
        running += r->n;
    }
    s->st.queued = s->n_queue;
}

/* ---- the step ------------------------------------------------------------ */

static void record_logprob(const dol_scheduler *s, const dol_request *r,
                           const float *logits, int32_t id, dol_token_logprob *lp)
{
    lp->id = id;
    lp->logprob = dol_logprob_of(logits, s->vocab, id);
    lp->n_top = r->logprobs > 0 ? r->logprobs : 0;
    if (lp->n_top) dol_top_logprobs(logits, s->vocab, lp->n_top, lp->top_ids, lp->top_logprobs);
}

/* Structured output: every token the grammar does not allow next gets
 * -inf, after penalties and logit bias, before any sampling step (greedy,
 * temperature, top-k/top-p/min-p then only see allowed tokens). The mask
 * depends on q's grammar state alone. False when nothing is allowed: a
 * complete value with nothing after it and EOS out of the vocabulary, or
 * (never expected: the matcher keeps a completion within its depth bound)
 * an incomplete one, which must not be reported as "stop". */
static bool apply_grammar(dol_scheduler *s, seq_t *q)
{
    dol_matcher_mask(q->m, s->gv, s->mask);
    bool any = false;
    for (int w = 0; w < dol_grammar_mask_words(s->gv); w++) {
        uint64_t bits = s->mask[w];
        any |= bits != 0;
        if (bits == ~0ull) continue;
        for (int b = 0; b < 64 && w * 64 + b < s->vocab; b++)
            if (!(bits >> b & 1)) q->logits[w * 64 + b] = -INFINITY;
    }
    return any;
}

/* Sample the next token of q from q->logits and hand it to the request.
 * Returns true when the request was retired. */
static bool sample_and_emit(dol_scheduler *s, seq_t *q, bool *touched)
{
    dol_request *r = q->r;
    dol_token_logprob lp;
    if (r->logprobs >= 0) /* logprobs come from the raw model logits */
        memcpy(s->lp_scratch, q->logits, sizeof(float) * (size_t)s->vocab);
    dol_sampler_apply_penalties(s->sampler, &r->sampling, q->logits, q->tokens, q->n_tokens,
                                r->n_prompt);
    if (q->m && !apply_grammar(s, q))
        return finish_choice(s, q, dol_matcher_complete(q->m) ? DOL_FINISH_STOP : DOL_FINISH_LENGTH);
    int32_t id = dol_sampler_pick(s->sampler, &r->sampling, q->logits, &q->rng);
    if (r->logprobs >= 0) record_logprob(s, r, s->lp_scratch, id, &lp);
    q->tokens[q->n_tokens++] = id;
    bool is_end = (!r->ignore_eos || q->m) && (id == s->eos || id == s->bos || is_end_id(s, id));
    if (q->m && !is_end && !dol_matcher_accept(q->m, s->gv, id)) {
        /* cannot happen (the mask allowed it); fail safe */
        fail_request(s, r, DOL_REASON_GRAMMAR_BROKEN);
        return true;
    }
    bool stopped = false;
    pthread_mutex_lock(&r->mu);
    if (r->t_first_token_ms == 0) r->t_first_token_ms = now_ms(s);
    int rc = dol_choice_push_token(r, &r->choices[q->choice], id, is_end,
                                   r->logprobs >= 0 ? &lp : NULL, &stopped);
    pthread_mutex_unlock(&r->mu);
    *touched = true;
    s->n_generated++;
    if (rc != 0) {
        fail_request(s, r, DOL_REASON_NO_MEMORY);
        return true;
    }
    int n_gen = q->n_tokens - r->n_prompt;
    if (is_end || stopped) return finish_choice(s, q, DOL_FINISH_STOP);
    if (n_gen >= r->max_tokens || q->n_tokens >= s->ctx) return finish_choice(s, q, DOL_FINISH_LENGTH);
    return false;
}

/* Verify q's drafts: row j of q's logits follows draft j-1 (row 0 the
 * sampled token). Each row is sampled exactly as a plain step would
 * (penalties, grammar, the sequence's own random stream) and the token
 * emitted; while it equals draft j, draft j's K/V computed in this step
 * stand and row j+1 is next. The first disagreement's token is emitted in
 * the draft's place, and the rejected positions are overwritten by the
 * next step. For a proposer that drafts one token for certain, keeping a
 * sample that equals the draft is speculative sampling's test
 * (accept with probability p(draft); otherwise the residual, p without
 * the draft): the output, and its random stream, are those of decoding
 * without speculation. Returns true when the request was retired. */
static void spec_adapt(dol_scheduler *s, seq_t *q, int proposed, int accepted);

static bool verify_and_emit(dol_scheduler *s, seq_t *q, bool *touched)
{
    dol_request *r = q->r;
    const int d = q->n_draft, base = q->n_tokens;
    q->n_draft = 0;
    int accepted = 0;
    bool retired = false;
    /* every draft counts as proposed, also those after a rejection or past
     * the end of the choice; the request's counts are in before the emit
     * that may complete it (its log line reads them) */
    s->n_spec_proposed += (uint64_t)d;
    pthread_mutex_lock(&r->mu);
    r->spec_proposed += d;
    pthread_mutex_unlock(&r->mu);
    for (int j = 0;; j++) {
        if (j > 0) memcpy(q->logits, q->logits + (size_t)j * (size_t)s->vocab, sizeof(float) * (size_t)s->vocab);
        retired = sample_and_emit(s, q, touched);
        if (retired || q->finished || j == d || q->tokens[q->n_tokens - 1] != q->draft[j]) break;
        accepted++;
        q->n_past++;
        s->n_spec_accepted++;
        pthread_mutex_lock(&r->mu);
        r->spec_accepted++;
        pthread_mutex_unlock(&r->mu);
    }
    if (retired) return true;
    /* the draft model's cache keeps the accepted drafts only */
    if (q->dseq >= 0 && q->d_past > base + accepted) q->d_past = base + accepted;
    if (!q->finished) {
        spec_adapt(s, q, d, accepted);
        dol_engine_seq_commit(s->e, q->seq, q->tokens, q->n_past);
    }
    return false;
}

/* After choice 0's prompt is in the cache: fork choices 1..n-1 from it. */
static void fork_choices(dol_scheduler *s, seq_t *first)
{
    dol_request *r = first->r;
    req_priv *rp = r->priv;
    int total = r->n_prompt + r->max_tokens;
    if (total > s->ctx) total = s->ctx;
    for (int c = 1; c < r->n; c++) {
        seq_t *q = &s->seqs[rp->slot[c]];
        if (!q->waiting_fork) continue;
        int seq = dol_engine_seq_fork(s->e, first->seq, r->n_prompt);
        if (seq >= 0 && dol_engine_seq_reserve(s->e, seq, total) != 0) {
            dol_engine_seq_free(s->e, seq);
            seq = -1;
        }
        if (seq < 0) { /* cannot happen (admission keeps the blocks owed to
                          * forks free); fail safe: end this choice with an
                          * error so that the request still completes */
            q->waiting_fork = false;
            q->finished = true;
            pthread_mutex_lock(&r->mu);
            r->choices[q->choice].finish = DOL_FINISH_ERROR;
            pthread_mutex_unlock(&r->mu);
            rp->n_live--;   /* choice 0 is live: never 0 here */
            dol_log(DOL_LOG_ERROR, "fork_failed", "request_id=%s choice=%d", r->id, q->choice);
            continue;
        }
        q->seq = seq;
        q->waiting_fork = false;
        q->n_past = first->n_past;
        memcpy(q->logits, first->logits, sizeof(float) * (size_t)s->vocab);
    }
}

/* Echo with logprobs: row j of a prefill chunk's logits (one row per token)
 * predicts the token after position start_pos + j. Rows that predict a
 * prompt token give that token's logprob (with top alternatives, from the
 * raw logits); the row of the last prompt token gives the logits the first
 * token is sampled from. Once the whole prompt is in, the logprobs are
 * handed to the request (r->prompt_lps; the HTTP layer waits for them). */
static void record_prompt_logprobs(dol_scheduler *s, seq_t *q, const dol_batch_item *it,
                                   const float *rows)
{
    dol_request *r = q->r;
    for (int j = 0; j < it->n_tokens; j++) {
        int next = it->start_pos + j + 1;
        const float *row = rows + (size_t)j * (size_t)s->vocab;
        if (next < r->n_prompt)
            record_logprob(s, r, row, r->prompt_ids[next], &q->plps[next]);
        else
            memcpy(q->logits, row, sizeof(float) * (size_t)s->vocab);
    }
    if (it->start_pos + it->n_tokens == r->n_prompt) {
        pthread_mutex_lock(&r->mu);
        r->prompt_lps = q->plps;
        pthread_mutex_unlock(&r->mu);
        q->plps = NULL;
    }
}

/* ---- speculative decoding (docs/speculative.md) -------------------------- */

/* N-gram lookup: the latest earlier place where q's last n tokens occur
 * (n = spec_ngram, then shorter), in its prompt or output, and up to max_d
 * of the tokens that followed there, into q->draft. Returns how many. When
 * they run into the end of the tokens (a loop shorter than max_d), the
 * drafts go on as the loop would: each repeats the token one period back. */
static int propose_ngram(const dol_scheduler *s, seq_t *q, int max_d)
{
    const int32_t *t = q->tokens;
    const int N = q->n_tokens;
    for (int n = s->p.spec_ngram; n >= 1; n--) {
        if (N < n + 1) continue;
        const int32_t *suffix = t + N - n;
        for (int p = N - n - 1; p >= 0; p--) {
            if (t[p + n - 1] != suffix[n - 1] || memcmp(t + p, suffix, sizeof(int32_t) * (size_t)n) != 0)
                continue;
            const int avail = N - p - n;   /* the period of the loop, when it is one */
            for (int d = 0; d < max_d; d++) q->draft[d] = d < avail ? t[p + n + d] : q->draft[d - avail];
            return max_d;
        }
    }
    return 0;
}

/* The drafts of decoding sequence q for this step (at most budget): none
 * while it pauses; never so many that the accepted ones and the token
 * after them pass max_tokens or the context, so they stay inside the
 * blocks reserved at admission. Placed after q's tokens for the item. */
static int speculate(dol_scheduler *s, seq_t *q, int budget)
{
    if (q->spec_pause > 0) {
        q->spec_pause--;
        return 0;
    }
    const dol_request *r = q->r;
    int max_d = s->p.spec_max_draft;
    const int left = r->max_tokens - (q->n_tokens - r->n_prompt) - 1, room = s->ctx - q->n_tokens - 1;
    if (left < max_d) max_d = left;
    if (room < max_d) max_d = room;
    if (budget < max_d) max_d = budget;
    if (max_d <= 0) return 0;
    if (s->p.spec_mode == DOL_SPEC_DRAFT) return max_d;  /* propose_draft fills them in */
    const int d = propose_ngram(s, q, max_d);
    memcpy(q->tokens + q->n_tokens, q->draft, sizeof(int32_t) * (size_t)d);
    return d;
}

/* A round of 8 proposed drafts below spec_min_acceptance pauses q's
 * proposals for 32 steps, four times longer with each failing round in a
 * row (at most 1024); a round at or above it ends the pausing. Short
 * rounds and long pauses keep what failing proposals cost (with a draft
 * model, also its catching up after a pause) within a few per cent. */
static void spec_adapt(dol_scheduler *s, seq_t *q, int proposed, int accepted)
{
    enum { ROUND = 8, FIRST_PAUSE = 32, MAX_PAUSE = 1024 };
    q->round_prop += proposed;
    q->round_acc += accepted;
    if (q->round_prop < ROUND) return;
    if (q->round_acc < s->p.spec_min_acceptance * q->round_prop) {
        int pause = FIRST_PAUSE << 2 * (q->spec_fails < 3 ? q->spec_fails : 3);
        q->spec_pause = pause < MAX_PAUSE ? pause : MAX_PAUSE;
        q->spec_fails++;
    } else {
        q->spec_fails = 0;
    }
    q->round_prop = q->round_acc = 0;
}

/* A proposing item that gets no drafts after all: a plain decode. */
static void drop_drafts(dol_scheduler *s, int k)
{
    seq_t *q = &s->seqs[s->item_slot[k]];
    s->items[k].n_tokens -= q->n_draft;
    s->items[k].n_logits = 1;
    q->n_draft = 0;
}

/* One forward call of the draft model over its m items, each row's argmax
 * the next draft of its sequence. -1 (logged) when the call fails. */
static int draft_forward(dol_scheduler *s, int m)
{
    char err[DOL_ERR_LEN];
    if (dol_engine_forward(s->p.spec_draft, s->d_items, m, err, sizeof err) == 0) return 0;
    dol_log(DOL_LOG_ERROR, "draft_forward_failed", "error=%s", DOL_LOG_Q(err));
    return -1;
}

/* Draft model: for every item that proposes (q->n_draft, its cap, set by
 * speculate), bring the draft's cache of the sequence up to its tokens
 * (in calls of at most the draft engine's batch), then run greedy steps,
 * batched over the sequences, until each has its drafts, placed after its
 * tokens. The drafts are one token for certain each (q = 1 on the draft),
 * so verify_and_emit's test is speculative sampling's. A sequence the
 * draft's pool cannot hold, or a failed call, proposes nothing. */
static void propose_draft(dol_scheduler *s, int n_items)
{
    dol_engine *de = s->p.spec_draft;
    const int limit = dol_engine_max_batch_tokens(de);
    int n = 0;
    for (int k = 0; k < n_items; k++) {
        seq_t *q = &s->seqs[s->item_slot[k]];
        if (q->n_draft == 0) continue;
        if (q->dseq < 0) {
            q->dseq = dol_engine_seq_new(de);
            q->d_past = 0;
        }
        if (q->dseq < 0 || dol_engine_seq_reserve(de, q->dseq, q->n_tokens + q->n_draft - 1) != 0) {
            drop_drafts(s, k);
            continue;
        }
        s->d_who[n++] = k;
    }
    /* catch up: the tokens the draft has not seen, the last one's logits
     * giving draft 0 */
    for (bool more = true; more;) {
        more = false;
        int used = 0, m = 0;
        for (int j = 0; j < n; j++) {
            seq_t *q = &s->seqs[s->item_slot[s->d_who[j]]];
            const int need = q->n_tokens - q->d_past;
            int take = need < limit - used ? need : limit - used;
            if (need <= 0) continue;
            if (take < need) more = true;
            if (take <= 0) continue;
            s->d_items[m++] = (dol_batch_item){ .seq = q->dseq, .n_tokens = take, .tokens = q->tokens + q->d_past,
                                                .start_pos = q->d_past, .n_logits = take == need,
                                                .logits = s->d_logits + (size_t)j * (size_t)s->vocab };
            used += take;
        }
        if (m > 0 && draft_forward(s, m) != 0) goto fail;
        for (int j = 0, i = 0; j < n && i < m; j++) {
            seq_t *q = &s->seqs[s->item_slot[s->d_who[j]]];
            if (s->d_items[i].seq != q->dseq) continue;
            q->d_past += s->d_items[i].n_tokens;
            if (s->d_items[i++].n_logits) q->draft[0] = dol_sampler_argmax(s->d_logits + (size_t)j * (size_t)s->vocab, s->vocab);
        }
    }
    /* draft i follows draft i - 1, one token per sequence a call */
    for (int i = 1;; i++) {
        int m = 0;
        for (int j = 0; j < n; j++) {
            seq_t *q = &s->seqs[s->item_slot[s->d_who[j]]];
            if (q->n_draft <= i) continue;
            s->d_items[m++] = (dol_batch_item){ .seq = q->dseq, .n_tokens = 1, .tokens = &q->draft[i - 1],
                                                .start_pos = q->d_past, .n_logits = 1,
                                                .logits = s->d_logits + (size_t)j * (size_t)s->vocab };
        }
        if (m == 0) break;
        if (draft_forward(s, m) != 0) goto fail;
        for (int j = 0; j < n; j++) {
            seq_t *q = &s->seqs[s->item_slot[s->d_who[j]]];
            if (q->n_draft <= i) continue;
            q->d_past++;
            q->draft[i] = dol_sampler_argmax(s->d_logits + (size_t)j * (size_t)s->vocab, s->vocab);
        }
    }
    for (int j = 0; j < n; j++) {
        seq_t *q = &s->seqs[s->item_slot[s->d_who[j]]];
        memcpy(q->tokens + q->n_tokens, q->draft, sizeof(int32_t) * (size_t)q->n_draft);
    }
    return;
fail:
    /* what the draft's cache holds is unknown: it starts again */
    for (int j = 0; j < n; j++) {
        seq_t *q = &s->seqs[s->item_slot[s->d_who[j]]];
        q->d_past = 0;
        drop_drafts(s, s->d_who[j]);
    }
}

/* Prompt tokens of an echo-with-logprobs sequence per step: each needs a
 * row of vocab logits (128 x 32000 floats = 16 MiB). */
#define ECHO_LOGPROBS_CHUNK 128

/* Build the step's batch into s->items: a prefill chunk for each sequence
 * still reading its prompt, one token for the others. The token budget is
 * every decode token plus up to prefill_chunk prompt tokens (the engine's
 * workspace is sized for that); decodes go first so that a long prompt
 * never stalls the running sequences. Returns the number of items. */
static int build_batch(dol_scheduler *s)
{
    int n_items = 0, budget = s->p.prefill_chunk;
    /* Static mode behaves as if prompts were padded to the longest one: no
     * member starts decoding before every member's prompt is in. (The
     * padding itself is never computed: the engine needs none.) */
    bool hold_decodes = false;
    int n_decoding = 0;
    for (int i = 0; i < s->n_slots; i++) {
        const seq_t *q = &s->seqs[i];
        if (!q->used || q->finished || q->waiting_fork) continue;
        if (q->n_past < q->r->n_prompt) hold_decodes |= s->p.mode == DOL_BATCH_STATIC;
        else n_decoding++;
    }
    /* speculation only while the batch is at most half full (or one
     * sequence decodes): beyond, the drafts' rows would take compute the
     * other sequences need */
    const bool spec_ok = s->p.spec_mode != DOL_SPEC_OFF && (n_decoding <= 1 || 2 * n_decoding <= s->p.max_batch_size);
    for (int pass = hold_decodes ? 1 : 0; pass < 2; pass++) {
        for (int i = 0; i < s->n_slots && n_items < s->p.max_batch_size; i++) {
            seq_t *q = &s->seqs[i];
            if (!q->used || q->finished || q->waiting_fork) continue;
            int n = q->n_tokens - q->n_past;
            bool decode = q->n_past >= q->r->n_prompt;
            if (n <= 0 || decode != (pass == 0)) continue;
            float *rows = NULL;
            q->n_draft = 0;
            if (decode && q->spec && spec_ok) {
                q->n_draft = speculate(s, q, budget);
                n += q->n_draft;
                budget -= q->n_draft; /* the drafts come out of the prompts' share */
            }
            if (!decode) {
                if (n > budget) n = budget;
                if (q->plps && n > ECHO_LOGPROBS_CHUNK) n = ECHO_LOGPROBS_CHUNK;
                if (n <= 0) continue;
                if (q->plps) {
                    rows = malloc(sizeof(float) * (size_t)n * (size_t)s->vocab);
                    if (!rows) continue;   /* out of memory: next step */
                }
                budget -= n;
            }
            dol_batch_item *it = &s->items[n_items];
            it->seq = q->seq;
            it->n_tokens = n;
            it->tokens = q->tokens + q->n_past;
            it->start_pos = q->n_past;
            it->n_logits = q->n_past + n >= q->n_tokens ? 1 + q->n_draft : 0;
            it->logits = rows ? rows : q->logits;
            if (rows) it->n_logits = n;
            s->item_rows[n_items] = rows;
            s->item_slot[n_items++] = i;
        }
    }
    return n_items;
}

/* The forward pass over the batch. On failure every request of the batch
 * fails (reason BACKEND_FAILURE). 0 or -1. */
static int forward(dol_scheduler *s, int n_items)
{
    char err[DOL_ERR_LEN];
    if (dol_engine_forward(s->e, s->items, n_items, err, sizeof err) == 0) {
        s->n_steps++;
        return 0;
    }
    dol_log(DOL_LOG_ERROR, "forward_failed", "error=%s", DOL_LOG_Q(err));
    for (int k = 0; k < n_items; k++) {
        free(s->item_rows[k]);
        seq_t *q = &s->seqs[s->item_slot[k]];
        if (q->used) fail_request(s, q->r, DOL_REASON_BACKEND_FAILURE);
    }
    return -1;
}

/* Take the step's results in: positions computed, whole blocks offered to
 * the prefix cache, prompt logprobs recorded. Each item's request is
 * retained until deliver(), so that it outlives retirement. */
static void commit(dol_scheduler *s, int n_items)
{
    for (int k = 0; k < n_items; k++) {
        seq_t *q = &s->seqs[s->item_slot[k]];
        if (s->item_rows[k]) {
            record_prompt_logprobs(s, q, &s->items[k], s->item_rows[k]);
            free(s->item_rows[k]);
        }
        /* drafts: only the sampled token is in for now (verify_and_emit) */
        q->n_past += s->items[k].n_tokens - q->n_draft;
        dol_engine_seq_commit(s->e, q->seq, q->tokens, q->n_past); /* prefix cache */
        if (q->n_past <= q->r->n_prompt) s->n_prompt_tokens += s->items[k].n_tokens;
        dol_request_retain(q->r);
        s->step_reqs[k] = q->r;
    }
}

/* Sample the next token of every sequence whose tokens are all in (a
 * decode, or the last chunk of a prompt; n > 1 forks its choices there and
 * they sample from the same logits). Returns the number of requests with
 * new output, in s->touched. */
static int sample(dol_scheduler *s, int n_items)
{
    int n_touched = 0;
    for (int k = 0; k < n_items; k++) {
        seq_t *q = &s->seqs[s->item_slot[k]];
        dol_request *r = s->step_reqs[k];
        /* a slot freed by a retirement earlier in this loop */
        if (!q->used || q->r != r || q->finished || q->n_past != q->n_tokens) continue;
        bool forks = q->choice == 0 && q->n_past == r->n_prompt && r->n > 1;
        if (forks) fork_choices(s, q);
        int n_choices = forks ? r->n : 1;
        req_priv *rp = r->priv;
        bool t = false, retired = false;
        for (int c = 0; c < n_choices && !retired; c++) {
            seq_t *sq = forks ? &s->seqs[rp->slot[c]] : q;
            if (sq->finished) continue;
            if (sq->n_past == r->n_prompt && r->max_tokens == 0) {
                retired = finish_choice(s, sq, DOL_FINISH_LENGTH);
                t = true;
            } else if (sq->n_draft > 0) {
                retired = verify_and_emit(s, sq, &t);
            } else {
                retired = sample_and_emit(s, sq, &t);
            }
        }
        if (!t) continue;
        bool seen = false;
        for (int j = 0; j < n_touched; j++) seen |= s->touched[j] == r;
        if (!seen) s->touched[n_touched++] = r;
    }
    return n_touched;
}

/* Tell the requests with new output (retired ones were told already), then
 * drop the step's references. */
static void deliver(dol_scheduler *s, int n_items, int n_touched)
{
    for (int j = 0; j < n_touched; j++)
        if (!s->touched[j]->done) notify(s->touched[j]);
    for (int k = 0; k < n_items; k++) dol_request_release(s->step_reqs[k]);
}

/* One step, read top to bottom like the forward pass it drives. */
static void run_step(dol_scheduler *s)
{
    int n_items = build_batch(s);
    if (s->p.spec_mode == DOL_SPEC_DRAFT) propose_draft(s, n_items);
    if (n_items == 0 || forward(s, n_items) != 0) return;
    commit(s, n_items);
    int n_touched = sample(s, n_items);
    deliver(s, n_items, n_touched);
}

static void update_stats(dol_scheduler *s);
static void sample_memory(dol_scheduler *s, bool force);

/* Cancelled, disconnected and timed-out requests, queued or running. */
static void reap(dol_scheduler *s)
{
    double now = now_ms(s);
    bool reaped = false;
    /* queued */
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_queue;) {
        dol_request *r = s->queue[i];
        bool gone = request_gone(r);
        bool late = r->timeout_ms > 0 && now - r->t_arrival_ms > r->timeout_ms;
        if (!gone && !late) { i++; continue; }
        reaped = true;
        s->queue[i] = s->queue[--s->n_queue];
        pthread_mutex_unlock(&s->mu);
        fail_request(s, r, gone ? DOL_REASON_CANCELLED : DOL_REASON_TIMED_OUT);
        pthread_mutex_lock(&s->mu);
    }
    s->st.queued = s->n_queue;
    pthread_mutex_unlock(&s->mu);
    /* running */
    for (int i = 0; i < s->n_slots; i++) {
        if (!s->seqs[i].used) continue;
        dol_request *r = s->seqs[i].r;
        bool gone = request_gone(r);
        bool late = r->timeout_ms > 0 && now - r->t_arrival_ms > r->timeout_ms;
        if (!gone && !late) continue;
        reaped = true;
        fail_request(s, r, gone ? DOL_REASON_CANCELLED : DOL_REASON_TIMED_OUT);
    }
    /* Publish the freed blocks and memory now: the loop may go idle (and
     * sleep) next. */
    if (reaped) {
        update_stats(s);
        sample_memory(s, true);
    }
}

/* Device memory for the readiness probe and /metrics. Sampled right after
 * admission, i.e. at the peak of each iteration, so that the moment between
 * a retirement and the next admission does not read as a drop in use, and
 * when the scheduler falls idle; at most every 20 ms (cudaMemGetInfo is not
 * free) unless forced: when admission took blocks or the last request
 * ended, the figure has changed and is taken at once. */
static void sample_memory(dol_scheduler *s, bool force)
{
    static const double EVERY_MS = 20.0;
    double now = now_ms(s);
    if (!force && now - s->mem_sampled_ms < EVERY_MS) return;
    s->mem_sampled_ms = now;
    size_t used = 0, total = 0;
    if (dol_engine_memory_info(s->e, &used, &total) != 0) used = total = 0;
    dol_device_memory devs[DOL_MAX_DEVICES + 1];
    int n_devs = dol_engine_devices(s->e, devs, DOL_MAX_DEVICES + 1);
    /* NVML's own sample period is 1/6 s to 1 s: asking more often says nothing new */
    bool gpu = now - s->gpu_sampled_ms >= 1000.0;
    double util = gpu ? dol_engine_gpu_utilization(s->e) : 0;
    if (gpu) s->gpu_sampled_ms = now;
    pthread_mutex_lock(&s->mu);
    s->st.mem_used_bytes = used;
    s->st.mem_total_bytes = total;
    s->st.n_devices = n_devs;
    memcpy(s->st.devices, devs, sizeof(devs[0]) * (size_t)n_devs);
    if (gpu) s->st.gpu_utilization = util;
    pthread_mutex_unlock(&s->mu);
}

static void update_stats(dol_scheduler *s)
{
    int running_req = 0;   /* each running request holds its choice 0's slot */
    for (int i = 0; i < s->n_slots; i++)
        if (s->seqs[i].used && s->seqs[i].choice == 0) running_req++;
    pthread_mutex_lock(&s->mu);
    s->st.running_seqs = live_seqs(s);
    s->st.running_requests = running_req;
    s->st.kv_blocks_total = dol_engine_kv_blocks_total(s->e);
    s->st.kv_blocks_used = s->st.kv_blocks_total - dol_engine_kv_blocks_free(s->e);
    s->st.kv_blocks_cached = dol_engine_kv_blocks_cached(s->e);
    s->st.kv_block_size = dol_engine_kv_block_size(s->e);
    s->st.last_step_ms = now_ms(s);
    s->st.idle = s->n_used == 0 && s->n_queue == 0;
    if (s->st.idle || s->n_steps != s->st.steps) s->st.last_progress_ms = s->st.last_step_ms;
    s->st.queued = s->n_queue;
    s->st.steps = s->n_steps;
    s->st.tokens_prompt = s->n_prompt_tokens;
    s->st.prefix_cache_query_tokens = s->n_prefix_query_tokens;
    s->st.prefix_cache_hit_tokens = s->n_prefix_hit_tokens;
    s->st.tokens_generated = s->n_generated;
    s->st.spec_proposed = s->n_spec_proposed;
    s->st.spec_accepted = s->n_spec_accepted;
    pthread_mutex_unlock(&s->mu);
}

static void timed_wait_ms(dol_scheduler *s, double ms)
{
    struct timespec until = dol_deadline_ms(ms);
    pthread_cond_timedwait(&s->cv, &s->mu, &until);
}

/* One iteration of the loop: reap, then wait (idle, or the batch window)
 * or admit and run one step. With `wait` false (manual mode) it returns
 * instead of waiting. False once the scheduler is stopping. */
static bool loop_once(dol_scheduler *s, bool wait)
{
    reap(s);
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    if (s->n_used == 0) {
        if (s->n_queue == 0) {
            /* idle: sleep until work arrives (wake up now and then for the
             * heartbeat) */
            if (wait) timed_wait_ms(s, 200);
            pthread_mutex_unlock(&s->mu);
            sample_memory(s, false);
            update_stats(s);
            return true;
        }
        /* Batch window: the first waiting request waits up to
         * batch_window_ms for company, unless a full batch is waiting. In
         * continuous mode it also closes once no request has arrived for
         * a tenth of it: later arrivals join the running batch at the next
         * step anyway, so a lone request need not pay the whole window. */
        double oldest = 1e300, newest = -1e300;
        int waiting_seqs = 0;
        for (int i = 0; i < s->n_queue; i++) {
            double t = s->queue[i]->t_arrival_ms;
            if (t < oldest) oldest = t;
            if (t > newest) newest = t;
            waiting_seqs += s->queue[i]->n;
        }
        double now = now_ms(s);
        double left = oldest + s->p.batch_window_ms - now;
        if (s->p.mode == DOL_BATCH_CONTINUOUS) {
            double quiet_left = newest + s->p.batch_window_ms / DOL_WINDOW_QUIET_DIV - now;
            if (quiet_left < left) left = quiet_left;
        }
        if (left > 0 && waiting_seqs < s->p.max_batch_size && !s->draining) {
            if (wait) timed_wait_ms(s, left < 200 ? left : 200);
            pthread_mutex_unlock(&s->mu);
            return true;
        }
    }
    int kv_free = dol_engine_kv_blocks_free(s->e);
    admit_from_queue(s);
    pthread_mutex_unlock(&s->mu);
    sample_memory(s, dol_engine_kv_blocks_free(s->e) != kv_free);
    update_stats(s);
    run_step(s);
    update_stats(s);
    if (s->st.idle) sample_memory(s, true);   /* the last request ended */
    return true;
}

/* Stopping: end every queued and running request (reason DRAINING). */
static void end_all(dol_scheduler *s)
{
    pthread_mutex_lock(&s->mu);
    while (s->n_queue > 0) {
        dol_request *r = s->queue[--s->n_queue];
        pthread_mutex_unlock(&s->mu);
        fail_request(s, r, DOL_REASON_DRAINING);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->n_slots; i++)
        if (s->seqs[i].used)
            fail_request(s, s->seqs[i].r, DOL_REASON_DRAINING);
}

static void *scheduler_main(void *arg)
{
    dol_scheduler *s = arg;
    while (loop_once(s, true)) {}
    end_all(s);
    return NULL;
}

void dol_scheduler_tick(dol_scheduler *s)
{
    if (s->p.manual) loop_once(s, false);
}

/* ---- create / free ------------------------------------------------------- */

static void free_buffers(dol_scheduler *s)
{
    free(s->queue);
    free(s->seqs);
    free(s->items);
    free(s->item_slot);
    free(s->item_rows);
    free(s->step_reqs);
    free(s->touched);
    dol_sampler_free(s->sampler);
    free(s->lp_scratch);
    dol_grammar_vocab_free(s->gv);
    free(s->mask);
    free(s->d_items);
    free(s->d_who);
    free(s->d_logits);
}

int dol_scheduler_create(dol_engine *engine, const dol_tokenizer *tok,
                         const dol_scheduler_params *p, dol_scheduler **out,
                         char *err, size_t errlen)
{
    dol_scheduler *s = calloc(1, sizeof *s);
    if (!s) { dol_set_err(err, errlen, "scheduler: out of memory"); return -1; }
    s->e = engine;
    s->tok = tok;
    s->p = *p;
    if (p->spec_mode != DOL_SPEC_OFF &&
        ((p->spec_mode != DOL_SPEC_NGRAM && p->spec_mode != DOL_SPEC_DRAFT) ||
         (p->spec_mode == DOL_SPEC_DRAFT) != (p->spec_draft != NULL) || p->spec_max_draft < 1 || p->spec_max_draft > DOL_SPEC_MAX_DRAFT ||
         p->spec_ngram < 1 || p->spec_ngram > DOL_SPEC_MAX_NGRAM ||
         !(p->spec_min_acceptance >= 0 && p->spec_min_acceptance <= 1))) {
        dol_set_err(err, errlen, "scheduler: a speculative decoding parameter is out of range (mode %d, "
                    "draft engine %s, max_draft %d of 1..%d, ngram %d of 1..%d, min_acceptance %g of 0..1)",
                    (int)p->spec_mode, p->spec_draft ? "given" : "none",
                    p->spec_max_draft, DOL_SPEC_MAX_DRAFT, p->spec_ngram, DOL_SPEC_MAX_NGRAM,
                    p->spec_min_acceptance);
        free(s);
        return -1;
    }
    if (p->max_batch_size < 1 || p->max_queue < 1 || p->prefill_chunk < 1 ||
        p->batch_window_ms < 0 || !(p->memory_high_watermark > 0 && p->memory_high_watermark <= 1)) {
        dol_set_err(err, errlen, "scheduler: a parameter is out of range (max_batch_size %d, "
                    "max_queue %d, prefill_chunk %d, batch_window_ms %d, "
                    "memory_high_watermark %g)", p->max_batch_size, p->max_queue,
                    p->prefill_chunk, p->batch_window_ms, p->memory_high_watermark);
        free(s);
        return -1;
    }
    s->vocab = dol_engine_vocab_size(engine);
    s->ctx = dol_engine_context_len(engine);
    s->eos = dol_tokenizer_eos_id(tok);
    s->n_end_ids = p->n_end_ids < 0 ? 0 : p->n_end_ids > DOL_MAX_EOS_IDS ? DOL_MAX_EOS_IDS : p->n_end_ids;
    for (int i = 0; i < s->n_end_ids; i++) s->end_ids[i] = p->end_ids[i];
    s->bos = dol_tokenizer_bos_id(tok);
    size_t b = (size_t)s->p.max_batch_size;
    s->items = calloc(b, sizeof *s->items);
    s->item_slot = calloc(b, sizeof *s->item_slot);
    s->item_rows = calloc(b, sizeof *s->item_rows);
    s->step_reqs = calloc(b, sizeof *s->step_reqs);
    s->touched = calloc(b, sizeof *s->touched);
    s->sampler = dol_sampler_new(s->vocab);
    s->lp_scratch = malloc(sizeof(float) * (size_t)s->vocab);
    if (p->spec_mode == DOL_SPEC_DRAFT) {
        if (dol_engine_vocab_size(p->spec_draft) != s->vocab) {
            dol_set_err(err, errlen, "scheduler: the draft model's vocabulary (%d) is not the model's (%d)",
                        dol_engine_vocab_size(p->spec_draft), s->vocab);
            goto fail;
        }
        s->d_items = calloc(b, sizeof *s->d_items);
        s->d_who = calloc(b, sizeof *s->d_who);
        s->d_logits = malloc(sizeof(float) * b * (size_t)s->vocab);
        if (!s->d_items || !s->d_who || !s->d_logits) {
            dol_set_err(err, errlen, "scheduler: out of memory");
            goto fail;
        }
    }
    if (!s->items || !s->item_slot || !s->item_rows || !s->step_reqs || !s->touched ||
        !s->sampler || !s->lp_scratch) {
        dol_set_err(err, errlen, "scheduler: out of memory");
        goto fail;
    }
    pthread_mutex_init(&s->mu, NULL);
    dol_cond_init(&s->cv);
    s->st.last_step_ms = now_ms(s);
    s->st.last_progress_ms = s->st.last_step_ms;
    s->st.idle = true;
    s->st.weight_bytes = dol_engine_weight_bytes(engine);
    s->st.gpu_utilization = -1.0;
    s->gpu_sampled_ms = -1e300;
    s->st.backend = dol_engine_backend_name(engine);
    if (dol_engine_memory_info(engine, &s->st.mem_used_bytes, &s->st.mem_total_bytes) != 0)
        s->st.mem_used_bytes = s->st.mem_total_bytes = 0;
    s->st.n_devices = dol_engine_devices(engine, s->st.devices, DOL_MAX_DEVICES + 1);
    s->st.kv_blocks_total = dol_engine_kv_blocks_total(engine);
    s->st.kv_block_size = dol_engine_kv_block_size(engine);
    s->st.context_len = dol_engine_context_len(engine);
    s->st.kv_dtype = dol_engine_kv_dtype_name(engine);
    s->st.spec_mode = p->spec_mode;
    s->st.kv_dtype_k = dol_kv_dtype_str(dol_engine_kv_dtype(engine, 0));
    s->st.kv_dtype_v = dol_kv_dtype_str(dol_engine_kv_dtype(engine, 1));
    if (!s->p.manual && pthread_create(&s->thread, NULL, scheduler_main, s) != 0) {
        dol_set_err(err, errlen, "scheduler: cannot start its thread");
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        goto fail;
    }
    *out = s;
    return 0;
fail:
    free_buffers(s);
    free(s);
    return -1;
}

void dol_scheduler_free(dol_scheduler *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->p.manual) end_all(s);
    else pthread_join(s->thread, NULL);
    free_buffers(s);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
