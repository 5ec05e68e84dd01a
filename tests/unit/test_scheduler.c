/* tests/unit/test_scheduler.c — the dynamic batcher (src/scheduler) on a
 * fake backend, exactly and without timing slack: the scheduler runs in
 * manual mode (no thread; each dol_scheduler_tick is one loop iteration)
 * on an injected clock that only the test and the fake's forward pass move.
 * The fake's logits are a hash of each row's token and position with one
 * clear winner, so greedy output is deterministic and never EOS.
 *
 * Covered: the batch window, max_batch_size, admission order by priority,
 * static vs continuous batching, forks for n > 1, cancellation freeing
 * blocks, watermark admission, never-fits, a full queue, and timeouts of
 * queued and running requests, all through the public API (dol_request_read).
 * Needs the stories260K tokenizer (skips
 * without the fixtures). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dolphin/engine.h"
#include "dolphin/model.h"
#include "dolphin/scheduler.h"
#include "dolphin/tokenizer.h"
#include "engine/backend.h"
#include "test_fixtures.h"

#define VOCAB 512
#define CTX 256
#define EOS 2

/* ---- the fake backend and clock ------------------------------------------ */

static double g_now;            /* ms, the scheduler's clock */
static double g_step_ms = 1.0;  /* each forward call advances the clock this much */
static int g_forwards;          /* forward calls so far */
static int g_max_items;         /* most items in one call */

static double fake_clock(void *ctx) { (void)ctx; return g_now; }

/* The token the fake model favours after `tok` at position `pos`: never
 * BOS or EOS. */
static int32_t fake_next(int32_t tok, int pos)
{
    return 3 + (int32_t)(((uint32_t)tok * 31u + (uint32_t)pos * 7u + 5u) % (VOCAB - 3));
}

static int fake_create(const dol_model *m, const dol_engine_params *p, int ctx, int bs,
                       int *n_blocks, void **impl, char *err, size_t errlen)
{
    (void)m; (void)p; (void)ctx; (void)err; (void)errlen;
    if (*n_blocks == 0) *n_blocks = 4096 / bs;
    *impl = &g_forwards;
    return 0;
}

static void fake_destroy(void *impl) { (void)impl; }

static int fake_forward(void *impl, const dol_forward_args *a, char *err, size_t errlen)
{
    (void)impl; (void)err; (void)errlen;
    g_forwards++;
    if (a->n_items > g_max_items) g_max_items = a->n_items;
    for (int i = 0; i < a->n_items; i++) {
        const dol_batch_item *it = &a->items[i];
        for (int r = 0; r < it->n_logits; r++) {
            int k = it->n_tokens - it->n_logits + r;
            int pos = it->start_pos + k;
            float *row = it->logits + (size_t)r * VOCAB;
            uint32_t h = (uint32_t)it->tokens[k] * 2654435761u ^ (uint32_t)pos * 40503u;
            for (int v = 0; v < VOCAB; v++) {
                h = h * 1103515245u + 12345u;
                row[v] = (float)(h >> 16 & 0xff) / 256.0f;   /* in [0, 1) */
            }
            row[fake_next(it->tokens[k], pos)] = 8.0f;
        }
    }
    g_now += g_step_ms;
    return 0;
}

static void fake_copy_block(void *impl, int32_t src, int32_t dst, int rows)
{
    (void)impl; (void)src; (void)dst; (void)rows;
}
static size_t fake_zero(void *impl) { (void)impl; return 0; }
static size_t fake_kv_bytes(void *impl) { (void)impl; return 4; }
static int fake_memory(void *impl, size_t *used, size_t *total)
{
    (void)impl; (void)used; (void)total;
    return -1;   /* the engine reports the KV pool instead */
}

static const dol_backend_ops FAKE = {
    .name = "fake", .kv_no_f32 = false, .create = fake_create, .destroy = fake_destroy,
    .forward = fake_forward, .copy_block = fake_copy_block, .weight_bytes = fake_zero,
    .kv_bytes_per_token = fake_kv_bytes, .memory_info = fake_memory,
};

/* ---- fixture -------------------------------------------------------------- */

static dol_tokenizer *g_tok;

typedef struct {
    dol_model m;
    dol_engine *e;
    dol_scheduler *s;
} rig;

typedef struct {
    int max_batch, window_ms, max_queue, kv_tokens;
    dol_batch_mode mode;
    double watermark;
    const int *end_ids;   /* more ids that end a choice (n_end_ids) */
    int n_end_ids;
} rig_opts;

static rig *rig_new(rig_opts o)
{
    if (!g_tok) skip();
    g_now = 1000.0;
    g_step_ms = 1.0;
    g_forwards = g_max_items = 0;
    rig *g = calloc(1, sizeof *g);
    assert_non_null(g);
    g->m.cfg = (dol_model_config){.hidden_size = 4, .intermediate_size = 4, .n_layers = 1,
                                  .n_heads = 1, .n_kv_heads = 1, .head_dim = 4,
                                  .vocab_size = VOCAB, .max_position_embeddings = CTX,
                                  .bos_token_id = 1, .eos_token_id = EOS};
    dol_engine_params ep = {.activations = DOL_ACT_F32, .backend = DOL_BACKEND_CPU, .n_threads = 1, .kv_block_size = 16,
                            .kv_cache_tokens = o.kv_tokens, .max_seqs = o.max_batch + 1,
                            .max_batch_tokens = 64 + o.max_batch, .prefix_caching = false};
    char err[DOL_ERR_LEN];
    assert_int_equal(dol_engine_create_with(&FAKE, &g->m, &ep, &g->e, err, sizeof err), 0);
    dol_scheduler_params sp = {.max_batch_size = o.max_batch, .batch_window_ms = o.window_ms,
                               .mode = o.mode, .max_queue = o.max_queue ? o.max_queue : 64,
                               .memory_high_watermark = o.watermark ? o.watermark : 0.80,
                               .prefill_chunk = 64, .end_ids = o.end_ids,
                               .n_end_ids = o.n_end_ids, .clock_ms = fake_clock, .manual = true};
    assert_int_equal(dol_scheduler_create(g->e, g_tok, &sp, &g->s, err, sizeof err), 0);
    return g;
}

static void rig_free(rig *g)
{
    dol_scheduler_free(g->s);
    dol_engine_free(g->e);
    free(g);
}

/* A request as its user sees it: the handle, and its output and state as
 * of the last look (dol_request_read). */
typedef struct {
    dol_request *r;
    dol_output out[4];
    dol_request_state st;
} treq;

/* A greedy request: BOS then n_prompt - 1 ids, max_tokens each of n choices
 * (n <= 4), EOS ignored unless honour_eos; timeout_ms 0 = none. */
static treq *req_e(int n_prompt, int max_tokens, int n, int priority, double timeout_ms,
                   bool honour_eos)
{
    treq *t = calloc(1, sizeof *t);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_prompt);
    assert_non_null(t);
    assert_non_null(ids);
    ids[0] = 1;
    for (int i = 1; i < n_prompt; i++) ids[i] = 10 + i;
    dol_request_params p = {.prompt_ids = ids, .n_prompt = n_prompt, .max_tokens = max_tokens,
                            .n = n, .priority = priority, .ignore_eos = !honour_eos, .logprobs = -1,
                            .timeout_ms = timeout_ms, .id = "test"};
    dol_sampling_params_default(&p.sampling);
    p.sampling.temperature = 0.0f;
    t->r = dol_request_create(&p);
    free(ids);
    assert_non_null(t->r);
    return t;
}

static treq *req_t(int n_prompt, int max_tokens, int n, int priority, double timeout_ms)
{
    return req_e(n_prompt, max_tokens, n, priority, timeout_ms, false);
}

static treq *req(int n_prompt, int max_tokens, int n, int priority)
{
    return req_t(n_prompt, max_tokens, n, priority, 0);
}

/* Look at the request: its output and state now. */
static treq *look(treq *t)
{
    assert_int_equal(dol_request_read(t->r, t->out, &t->st), 0);
    return t;
}

static void req_free(treq *t)
{
    dol_output_free(t->out, 4);
    dol_request_state_free(&t->st);
    dol_request_release(t->r);
    free(t);
}

static dol_reason submit(rig *g, treq *t)
{
    dol_reason_info why;
    return dol_scheduler_submit(g->s, t->r, &why);
}

static dol_scheduler_stats stats(rig *g)
{
    dol_scheduler_stats st;
    dol_scheduler_get_stats(g->s, &st);
    return st;
}

static bool done(treq *t) { return look(t)->st.done; }
static double started(treq *t) { return look(t)->st.t_start_ms; }

/* Tick until nothing is queued or running (at most `max` ticks); a tick
 * that ran no step (a batch window) lets 1 ms pass. */
static void run_idle(rig *g, int max)
{
    for (int i = 0; i < max; i++) {
        dol_scheduler_stats st = stats(g);
        if (st.queued == 0 && st.running_seqs == 0) return;
        int before = g_forwards;
        dol_scheduler_tick(g->s);
        if (g_forwards == before) g_now += 1.0;
    }
    fail_msg("not idle after %d ticks", max);
}

/* The greedy ids the fake model gives after the prompt of req(n_prompt, ..). */
static void expected_ids(int n_prompt, int n, int32_t *out)
{
    int32_t tok = n_prompt > 1 ? 10 + n_prompt - 1 : 1;
    int pos = n_prompt - 1;
    for (int i = 0; i < n; i++) {
        out[i] = fake_next(tok, pos);
        tok = out[i];
        pos++;
    }
}

/* ---- tests ---------------------------------------------------------------- */

static void test_window_and_output(void **state)
{
    (void)state;
    rig *g = rig_new((rig_opts){.max_batch = 4, .window_ms = 50, .mode = DOL_BATCH_STATIC});
    treq *r = req(5, 6, 1, 0);
    double t0 = g_now;
    assert_int_equal(submit(g, r), DOL_REASON_NONE);
    dol_scheduler_tick(g->s);             /* alone: waits for company */
    assert_true(started(r) == 0);
    g_now = t0 + 49.0;
    dol_scheduler_tick(g->s);
    assert_true(started(r) == 0);
    assert_int_equal(stats(g).queued, 1);
    g_now = t0 + 50.0;
    dol_scheduler_tick(g->s);             /* the window is over */
    assert_true(started(r) == t0 + 50.0);
    run_idle(g, 20);
    assert_true(done(r));
    int32_t want[6];
    expected_ids(5, 6, want);
    assert_int_equal(look(r)->out[0].n_ids, 6);
    assert_memory_equal(look(r)->out[0].ids, want, sizeof want);
    assert_int_equal(look(r)->out[0].finish, DOL_FINISH_LENGTH);
    assert_int_equal(look(r)->st.error.reason, DOL_REASON_NONE);
    assert_int_equal(stats(g).kv_blocks_used, 0);
    /* one prefill, then a decode step per token but the first (from prefill) */
    assert_int_equal(g_forwards, 6);
    req_free(r);
    rig_free(g);
}

/* n requests `gap` ms apart, a tick after each: none starts before `at` ms
 * after the first, all start then, and all complete. */
static void trickle_starts_at(rig *g, int n, double gap, double at)
{
    treq *t[16];
    const double t0 = g_now;
    assert_true(n <= 16);
    for (int i = 0; i < n; i++) {
        g_now = t0 + gap * i;
        t[i] = req(3 + i % 3, 2, 1, 0);
        assert_int_equal(submit(g, t[i]), DOL_REASON_NONE);
        dol_scheduler_tick(g->s);
        assert_true(started(t[0]) == 0);
    }
    g_now = t0 + at - 0.1;
    dol_scheduler_tick(g->s);
    assert_true(started(t[0]) == 0);
    g_now = t0 + at;
    dol_scheduler_tick(g->s);
    for (int i = 0; i < n; i++) assert_true(started(t[i]) == t0 + at);
    run_idle(g, 200);
    for (int i = 0; i < n; i++) {
        assert_true(done(t[i]));
        req_free(t[i]);
    }
}

/* Continuous mode: the window (50 ms) also closes after 5 ms without an
 * arrival; a trickle of arrivals keeps it open up to its length. */
/* An id of config.json's eos_token_id list ends a choice like EOS (the
 * id kept, no text), unless the request ignores EOS. */
static void test_end_ids(void **state)
{
    (void)state;
    int32_t want[6];
    expected_ids(5, 6, want);
    const int end[2] = { 400, want[2] };
    rig *g = rig_new((rig_opts){.max_batch = 4, .window_ms = 0, .mode = DOL_BATCH_CONTINUOUS,
                                .end_ids = end, .n_end_ids = 2});
    treq *a = req_e(5, 6, 1, 0, 0, true), *b = req(5, 6, 1, 0);   /* b ignores EOS */
    assert_int_equal(submit(g, a), DOL_REASON_NONE);
    assert_int_equal(submit(g, b), DOL_REASON_NONE);
    run_idle(g, 100);
    look(a);
    look(b);
    assert_int_equal(a->out[0].n_ids, 3);
    assert_int_equal(a->out[0].ids[2], want[2]);
    assert_int_equal(a->out[0].finish, DOL_FINISH_STOP);
    assert_int_equal(b->out[0].n_ids, 6);
    assert_int_equal(b->out[0].finish, DOL_FINISH_LENGTH);
    req_free(a);
    req_free(b);
    rig_free(g);
}

static void test_window_closes_when_arrivals_stop(void **state)
{
    (void)state;
    rig *g = rig_new((rig_opts){.max_batch = 16, .window_ms = 50});
    trickle_starts_at(g, 1, 0.0, 5.0);    /* alone: 5 ms without company */
    /* three arrivals 4 ms apart: one batch, 5 ms after the last */
    trickle_starts_at(g, 3, 4.0, 13.0);
    /* arrivals every 4 ms: the window still ends 50 ms after the first */
    trickle_starts_at(g, 13, 4.0, 50.0);
    rig_free(g);
}

static void test_full_batch_skips_window_and_caps(void **state)
{
    (void)state;
    rig *g = rig_new((rig_opts){.max_batch = 4, .window_ms = 50});
    treq *r[6];
    for (int i = 0; i < 6; i++) {
        r[i] = req(3, 4, 1, 0);
        assert_int_equal(submit(g, r[i]), DOL_REASON_NONE);
    }
    double t0 = g_now;
    dol_scheduler_tick(g->s);   /* a full batch waits for no window */
    dol_scheduler_stats st = stats(g);
    assert_int_equal(st.running_seqs, 4);
    assert_int_equal(st.queued, 2);
    for (int i = 0; i < 6; i++) assert_true((started(r[i]) == t0) == (i < 4));
    assert_int_equal(g_max_items, 4);
    run_idle(g, 100);
    for (int i = 0; i < 6; i++) {
        assert_true(done(r[i]));
        assert_int_equal(look(r[i])->out[0].n_ids, 4);
        req_free(r[i]);
    }
    assert_true(g_max_items <= 4);
    rig_free(g);
}

static void test_priority_then_arrival(void **state)
{
    (void)state;
    rig *g = rig_new((rig_opts){.max_batch = 1, .window_ms = 0});
    int prio[5] = {0, 2, 1, 2, 0};
    treq *r[5];
    for (int i = 0; i < 5; i++) {
        r[i] = req(3, 2, 1, prio[i]);
        assert_int_equal(submit(g, r[i]), DOL_REASON_NONE);
        g_now += 1.0;
    }
    run_idle(g, 100);
    /* start order: priority 2 (arrival 1, 3), then 1 (2), then 0 (0, 4) */
    int order[5] = {1, 3, 2, 0, 4};
    for (int k = 1; k < 5; k++)
        assert_true(started(r[order[k - 1]]) < started(r[order[k]]));
    for (int i = 0; i < 5; i++) req_free(r[i]);
    rig_free(g);
}

/* A joins with a long generation and B with a short one; C arrives once B
 * is done. Continuous: C starts before A ends. Static: not until then. */
static void run_join(dol_batch_mode mode, bool *c_before_a_done)
{
    rig *g = rig_new((rig_opts){.max_batch = 2, .window_ms = 0, .mode = mode});
    treq *a = req(3, 20, 1, 0), *b = req(3, 2, 1, 0), *c = req(3, 2, 1, 0);
    assert_int_equal(submit(g, a), DOL_REASON_NONE);
    assert_int_equal(submit(g, b), DOL_REASON_NONE);
    for (int i = 0; i < 40 && !done(b); i++) dol_scheduler_tick(g->s);
    assert_true(done(b) && !done(a));
    assert_int_equal(submit(g, c), DOL_REASON_NONE);
    dol_scheduler_tick(g->s);
    *c_before_a_done = started(c) > 0 && !done(a);
    run_idle(g, 100);
    assert_true(done(a) && done(c));
    if (mode == DOL_BATCH_STATIC) assert_true(started(c) >= look(a)->st.t_done_ms);
    req_free(a);
    req_free(b);
    req_free(c);
    rig_free(g);
}

static void test_continuous_vs_static(void **state)
{
    (void)state;
    bool joined;
    run_join(DOL_BATCH_CONTINUOUS, &joined);
    assert_true(joined);
    run_join(DOL_BATCH_STATIC, &joined);
    assert_false(joined);
}

static void test_fork_n_choices(void **state)
{
    (void)state;
    rig *g = rig_new((rig_opts){.max_batch = 4, .window_ms = 0});
    treq *r = req(20, 5, 3, 0);
    assert_int_equal(submit(g, r), DOL_REASON_NONE);
    dol_scheduler_tick(g->s);          /* prefill of choice 0 */
    dol_scheduler_tick(g->s);          /* forked: three sequences decode */
    assert_int_equal(stats(g).running_seqs, 3);
    /* the prompt's one full block is shared: 3 x 2 blocks would be 6 */
    assert_true(stats(g).kv_blocks_used < 6);
    run_idle(g, 20);
    int32_t want[5];
    expected_ids(20, 5, want);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(look(r)->out[i].n_ids, 5);
        assert_memory_equal(look(r)->out[i].ids, want, sizeof want);
    }
    assert_int_equal(stats(g).kv_blocks_used, 0);
    req_free(r);
    rig_free(g);
}

static void test_cancel_frees_blocks(void **state)
{
    (void)state;
    rig *g = rig_new((rig_opts){.max_batch = 4, .window_ms = 0});
    treq *run = req(40, 100, 2, 0), *wait = req(3, 5, 1, 0);
    assert_int_equal(submit(g, run), DOL_REASON_NONE);
    for (int i = 0; i < 3; i++) dol_scheduler_tick(g->s);
    assert_true(stats(g).kv_blocks_used > 0);
    int forwards = g_forwards;
    dol_request_cancel(run->r);
    dol_scheduler_tick(g->s);          /* reaped before any further step */
    assert_true(done(run));
    assert_int_equal(look(run)->st.error.reason, DOL_REASON_CANCELLED);
    assert_int_equal(stats(g).kv_blocks_used, 0);
    assert_int_equal(stats(g).running_seqs, 0);
    assert_int_equal(g_forwards, forwards);
    /* a queued request cancelled before it ran */
    assert_int_equal(submit(g, wait), DOL_REASON_NONE);
    dol_request_cancel(wait->r);
    dol_scheduler_tick(g->s);
    assert_true(done(wait) && look(wait)->st.error.reason == DOL_REASON_CANCELLED && started(wait) == 0);
    req_free(run);
    req_free(wait);
    rig_free(g);
}

static void test_watermark_admission(void **state)
{
    (void)state;
    /* 8 blocks of 16; each request needs prompt 8 + 24 new = 2 blocks */
    rig *g = rig_new((rig_opts){.max_batch = 4, .window_ms = 0, .kv_tokens = 128,
                                .watermark = 0.5});
    treq *r[4];
    for (int i = 0; i < 4; i++) {
        r[i] = req(8, 24, 1, 0);
        assert_int_equal(submit(g, r[i]), DOL_REASON_NONE);
    }
    dol_scheduler_tick(g->s);
    /* 2 admitted (25 %, then 50 %); at the watermark the rest wait */
    assert_int_equal(stats(g).running_seqs, 2);
    assert_int_equal(stats(g).queued, 2);
    run_idle(g, 200);
    for (int i = 0; i < 4; i++) {
        assert_true(done(r[i]));
        assert_int_equal(look(r[i])->out[0].n_ids, 24);
        req_free(r[i]);
    }
    rig_free(g);
}

static void test_never_fits_and_queue_full(void **state)
{
    (void)state;
    rig *g = rig_new((rig_opts){.max_batch = 1, .window_ms = 50, .kv_tokens = 128,
                                .max_queue = 2});
    treq *big = req(10, 200, 1, 0);     /* 210 tokens: over the pool */
    assert_int_equal(submit(g, big), DOL_REASON_KV_OVERFLOW);
    treq *ctx = req(100, 157, 1, 0);    /* 257 > the context of 256 */
    assert_int_equal(submit(g, ctx), DOL_REASON_CONTEXT_OVERFLOW);
    treq *q[3];
    for (int i = 0; i < 3; i++) q[i] = req(3, 2, 1, 0);
    assert_int_equal(submit(g, q[0]), DOL_REASON_NONE);
    assert_int_equal(submit(g, q[1]), DOL_REASON_NONE);
    assert_int_equal(submit(g, q[2]), DOL_REASON_QUEUE_FULL);
    g_now += 50.0;
    run_idle(g, 50);
    assert_true(done(q[0]) && done(q[1]) && !done(q[2]));
    req_free(big);
    req_free(ctx);
    for (int i = 0; i < 3; i++) req_free(q[i]);
    rig_free(g);
}

/* dol_scheduler_fit: the one answer to "does it fit", for a pool of 128
 * tokens (8 blocks of 16) and a context of 256. */
static void test_fit(void **state)
{
    (void)state;
    rig *g = rig_new((rig_opts){.max_batch = 4, .window_ms = 0, .kv_tokens = 128});
    int fit = -1;
    dol_reason_info why;
    /* max_tokens given: the count itself, or the bound it passes */
    assert_int_equal(dol_scheduler_fit(g->s, 10, 1, 100, &fit, &why), DOL_REASON_NONE);
    assert_int_equal(fit, 100);
    assert_int_equal(dol_scheduler_fit(g->s, 10, 1, 119, &fit, &why), DOL_REASON_KV_OVERFLOW);
    assert_int_equal(fit, 0);
    assert_int_equal(why.limit, 128);
    assert_int_equal(why.n_prompt, 10);
    assert_int_equal(why.max_tokens, 119);
    assert_int_equal(dol_scheduler_fit(g->s, 10, 1, 118, &fit, &why), DOL_REASON_NONE);
    assert_int_equal(dol_scheduler_fit(g->s, 200, 1, 57, &fit, &why), DOL_REASON_CONTEXT_OVERFLOW);
    assert_int_equal(why.limit, 256);
    /* n choices share the prompt's whole blocks: 32 + 2 x (48 - 32) = 64 */
    assert_int_equal(dol_scheduler_fit(g->s, 32, 3, 16, &fit, &why), DOL_REASON_NONE);
    /* as many as fit: the pool's share per choice, or the context's room */
    assert_int_equal(dol_scheduler_fit(g->s, 10, 1, -1, &fit, &why), DOL_REASON_NONE);
    assert_int_equal(fit, 118);
    assert_int_equal(dol_scheduler_fit(g->s, 32, 2, -1, &fit, &why), DOL_REASON_NONE);
    assert_int_equal(fit, 48);   /* (8 + 2) / 2 = 5 blocks each: 80 - 32 */
    assert_int_equal(dol_scheduler_fit(g->s, 128, 1, -1, &fit, &why), DOL_REASON_KV_OVERFLOW);
    /* what fit allows, submit admits; one more token is refused alike */
    treq *a = req(10, 118, 1, 0), *b = req(10, 119, 1, 0);
    assert_int_equal(submit(g, a), DOL_REASON_NONE);
    assert_int_equal(submit(g, b), DOL_REASON_KV_OVERFLOW);
    run_idle(g, 400);
    assert_true(done(a));
    assert_int_equal(look(a)->out[0].n_ids, 118);
    req_free(a);
    req_free(b);
    rig_free(g);

    /* a context-bound fit: pool larger than the context */
    g = rig_new((rig_opts){.max_batch = 4, .window_ms = 0, .kv_tokens = 1024});
    assert_int_equal(dol_scheduler_fit(g->s, 100, 1, -1, &fit, &why), DOL_REASON_NONE);
    assert_int_equal(fit, 156);
    assert_int_equal(dol_scheduler_fit(g->s, 256, 1, -1, &fit, &why),
                     DOL_REASON_CONTEXT_OVERFLOW);
    assert_int_equal(dol_scheduler_fit(g->s, 256, 1, 0, &fit, &why), DOL_REASON_NONE);
    assert_int_equal(dol_scheduler_fit(g->s, 257, 1, 0, &fit, &why), DOL_REASON_CONTEXT_OVERFLOW);
    rig_free(g);
}

/* Parameters are required: the defaults are the configuration's. */
static void test_params_required(void **state)
{
    (void)state;
    rig *g = rig_new((rig_opts){.max_batch = 1, .window_ms = 0});
    dol_scheduler_params sp = {.max_batch_size = 1, .max_queue = 1, .prefill_chunk = 1,
                               .memory_high_watermark = 0.8, .manual = true};
    dol_scheduler *s = NULL;
    char err[DOL_ERR_LEN];
    sp.max_queue = 0;
    assert_int_equal(dol_scheduler_create(g->e, g_tok, &sp, &s, err, sizeof err), -1);
    assert_non_null(strstr(err, "max_queue 0"));
    sp.max_queue = 1;
    sp.memory_high_watermark = 0;
    assert_int_equal(dol_scheduler_create(g->e, g_tok, &sp, &s, err, sizeof err), -1);
    sp.memory_high_watermark = 0.8;
    assert_int_equal(dol_scheduler_create(g->e, g_tok, &sp, &s, err, sizeof err), 0);
    dol_scheduler_free(s);
    rig_free(g);
}

static void test_timeouts(void **state)
{
    (void)state;
    rig *g = rig_new((rig_opts){.max_batch = 1, .window_ms = 0});
    treq *run = req_t(3, 100, 1, 0, 30.0), *queued = req_t(3, 2, 1, 0, 10.0);
    assert_int_equal(submit(g, run), DOL_REASON_NONE);
    assert_int_equal(submit(g, queued), DOL_REASON_NONE);
    double t0 = g_now;
    dol_scheduler_tick(g->s);            /* run starts; queued waits (batch of 1) */
    assert_true(started(run) > 0 && started(queued) == 0);
    g_now = t0 + 10.5;
    dol_scheduler_tick(g->s);            /* queued is late: 504 before it ran */
    assert_true(done(queued));
    assert_int_equal(look(queued)->st.error.reason, DOL_REASON_TIMED_OUT);
    assert_true(look(queued)->st.error.timeout_ms == 10.0);
    assert_false(done(run));
    g_now = t0 + 30.5;
    dol_scheduler_tick(g->s);            /* run is late too, mid-generation */
    assert_true(done(run));
    assert_int_equal(look(run)->st.error.reason, DOL_REASON_TIMED_OUT);
    assert_true(look(run)->out[0].n_ids > 0 && look(run)->out[0].n_ids < 100);
    assert_int_equal(stats(g).kv_blocks_used, 0);
    req_free(run);
    req_free(queued);
    rig_free(g);
}

int main(void)
{
    char path[1300], err[DOL_ERR_LEN];
    snprintf(path, sizeof path, "%s/models/stories260K/tokenizer.model", test_shared_dir());
    if (dol_tokenizer_load(path, &g_tok, err, sizeof err) != 0) {
        fprintf(stderr, "note: %s (set DOLPHIN_SHARED); the scheduler tests skip\n", err);
        g_tok = NULL;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_and_output),
        cmocka_unit_test(test_end_ids),
        cmocka_unit_test(test_window_closes_when_arrivals_stop),
        cmocka_unit_test(test_full_batch_skips_window_and_caps),
        cmocka_unit_test(test_priority_then_arrival),
        cmocka_unit_test(test_continuous_vs_static),
        cmocka_unit_test(test_fork_n_choices),
        cmocka_unit_test(test_cancel_frees_blocks),
        cmocka_unit_test(test_watermark_admission),
        cmocka_unit_test(test_never_fits_and_queue_full),
        cmocka_unit_test(test_fit),
        cmocka_unit_test(test_params_required),
        cmocka_unit_test(test_timeouts),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    dol_tokenizer_free(g_tok);
    return rc;
}
