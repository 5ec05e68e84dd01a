/* include/dolphin/scheduler.h — requests and the dynamic batcher (docs/architecture.md).
 *
 * The HTTP layer builds a dol_request (prompt token ids + parameters),
 * submits it, and is told through `on_event` whenever the request has new
 * output or has ended; it then takes what is new with dol_request_read. One
 * scheduler thread owns the engine: it admits queued requests into the
 * running batch (continuous or static mode), runs one forward step at a
 * time, samples, detokenizes, applies stop strings, and retires finished,
 * timed-out, cancelled and disconnected sequences, returning their KV blocks.
 *
 * Ownership: requests are reference-counted. dol_request_create gives the caller
 * one reference; dol_scheduler_submit takes its own; each side drops its
 * reference with dol_request_release. */
#ifndef DOLPHIN_SCHEDULER_H
#define DOLPHIN_SCHEDULER_H

#include <pthread.h>
#include <stdatomic.h>

#include "dolphin/common.h"
#include "dolphin/engine.h"
#include "dolphin/grammar.h"
#include "dolphin/sampler.h"
#include "dolphin/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DOL_MAX_STOP 4
#define DOL_MAX_LOGPROBS 5

typedef enum {
    DOL_FINISH_NONE = 0,   /* still running */
    DOL_FINISH_STOP,       /* EOS or a stop string */
    DOL_FINISH_LENGTH,     /* max_tokens or the context length reached */
    DOL_FINISH_ERROR,      /* see dol_request_state.error */
} dol_finish_reason;

/* Why the scheduler refused a request, or ended one that did not finish.
 * The scheduler's own vocabulary: the API layer maps each reason to what a
 * client sees (status, error type, code, message: src/api/errors.c). */
typedef enum {
    DOL_REASON_NONE = 0,         /* accepted / not failed */
    DOL_REASON_QUEUE_FULL,       /* max_queue requests already wait */
    DOL_REASON_DRAINING,         /* the scheduler admits nothing more, or stopped */
    DOL_REASON_CONTEXT_OVERFLOW, /* prompt + max_tokens is past the context */
    DOL_REASON_KV_OVERFLOW,      /* prompt + max_tokens x n can never fit the
                                    whole KV pool */
    DOL_REASON_BAD_TOKEN,        /* a prompt token id outside the vocabulary */
    DOL_REASON_TOO_MANY_CHOICES, /* n is more than max_batch_size */
    DOL_REASON_INVALID,          /* n < 1, an empty prompt, max_tokens < 0 */
    DOL_REASON_CANCELLED,        /* dol_request_cancel: the client went away */
    DOL_REASON_TIMED_OUT,        /* timeout_ms passed, queued or running */
    DOL_REASON_NO_MEMORY,        /* out of memory while queueing or generating */
    DOL_REASON_BACKEND_FAILURE,  /* the engine's forward pass failed */
    DOL_REASON_GRAMMAR_BROKEN,   /* a sampled token the grammar rejects (a bug) */
} dol_reason;

/* A reason with the figures that explain it (zero where they do not apply). */
typedef struct {
    dol_reason reason;
    int n_prompt;            /* the request's prompt tokens */
    int max_tokens;          /* asked for per choice; -1: "as many as fit" */
    int n;                   /* choices */
    int limit;               /* the bound it ran into: CONTEXT_OVERFLOW the
                                context length, KV_OVERFLOW the pool's tokens,
                                BAD_TOKEN the vocabulary size,
                                TOO_MANY_CHOICES max_batch_size, QUEUE_FULL
                                max_queue */
    int token, position;     /* BAD_TOKEN: the id and where it is */
    double timeout_ms;       /* TIMED_OUT: the request's timeout */
} dol_reason_info;

/* A stable lowercase name for logs and tests ("queue_full", ...). */
const char *dol_reason_name(dol_reason r);

/* "stop", "length", "error", or NULL for DOL_FINISH_NONE. */
const char *dol_finish_reason_str(dol_finish_reason f);

/* Log-probabilities of one token (logprobs >= 0 requested), from the raw
 * model logits (before penalties and temperature). */
typedef struct {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_ids[DOL_MAX_LOGPROBS];
    float top_logprobs[DOL_MAX_LOGPROBS];
} dol_token_logprob;

/* A request: prompt ids and parameters in, generated output out. Opaque:
 * the caller describes it with dol_request_params, reads its output with
 * dol_request_read, and ends it early with dol_request_cancel. */
typedef struct dol_request dol_request;

#define DOL_SPEC_MAX_DRAFT 16
#define DOL_SPEC_MAX_NGRAM 8

typedef struct {
    const int32_t *prompt_ids; /* copied (BOS included when the API added it) */
    int n_prompt;            /* >= 1 */
    int max_tokens;          /* tokens to generate per choice (>= 0) */
    int n;                   /* choices (>= 1) */
    dol_sampling_params sampling;
    uint64_t seed;           /* choice i uses seed + i */
    const char *stop[DOL_MAX_STOP]; /* stop strings (non-empty), copied */
    int n_stop;
    int logprobs;            /* -1 = off, else 0..5 alternatives per token */
    bool echo_logprobs;      /* also compute the prompt's logprobs */
    bool ignore_eos;
    /* Structured output (response_format): every token is sampled from
     * those the grammar allows, EOS only once the value is complete (even
     * with ignore_eos). NULL = free text. The request takes a reference. */
    dol_grammar *grammar;
    /* Speculative decoding (when the scheduler's spec_mode is on): true
     * opts this request out. The output is the same either way. */
    bool no_speculation;
    int priority;            /* higher is admitted first; FIFO within one */
    double timeout_ms;       /* queue wait + generation; 0 = none */
    const char *id;          /* request id (X-Request-Id) for logs; may be NULL */
    /* Called by the scheduler thread, with no lock held, after new output
     * was appended or the request ended. Must not block. */
    void (*on_event)(dol_request *r, void *user);
    void *user;
} dol_request_params;

/* A request with one reference, its own copies of the prompt and stop
 * strings, and no output yet. NULL on OOM or when n < 1 or n_prompt < 1. */
dol_request *dol_request_create(const dol_request_params *p);
void dol_request_retain(dol_request *r);
/* Drop a reference; the last one frees the request and everything it owns. */
void dol_request_release(dol_request *r);
/* Ask the scheduler to end the request (client gone): its sequences are
 * freed at the next step. Thread-safe, lock-free. */
void dol_request_cancel(dol_request *r);
/* The prompt as given at create (read-only, lives as long as r). */
const int32_t *dol_request_prompt(const dol_request *r, int *n_prompt);

/* What one choice has produced, accumulated on the reader's side by
 * dol_request_read: everything up to the last read. */
typedef struct {
    char *text;              /* emit-safe text: whole UTF-8 characters, never
                                any part of a stop string; NUL-terminated */
    size_t text_len;
    int32_t *ids;            /* every generated id, in order */
    int n_ids;
    dol_token_logprob *lps;  /* n_ids entries when logprobs >= 0, else NULL */
    int *lps_text_len;       /* with lps: text_len after each token's text */
    dol_finish_reason finish;
    size_t text_cap;         /* dol_request_read's bookkeeping */
    int ids_cap;
} dol_output;

/* The request as a whole, as of the last read. */
typedef struct {
    bool done;               /* every choice finished (or the request failed) */
    dol_reason_info error;   /* why it failed; reason NONE = it did not */
    int n_cached_prompt;     /* prompt tokens whose K/V came from the prefix
                                cache (usage.prompt_tokens_details) */
    dol_token_logprob *prompt_lps; /* echo_logprobs: n_prompt entries once the
                                      prompt is in (entry 0 has n_top = -1, no
                                      logprob), else NULL; reader-owned */
    /* timings, the scheduler's clock (dol_now_ms); 0 = not yet */
    double t_arrival_ms, t_start_ms, t_first_token_ms, t_done_ms;
    /* speculative decoding, all choices: draft tokens proposed, and those
     * the model agreed with (each accepted token is one forward step saved) */
    int64_t spec_proposed, spec_accepted;
} dol_request_state;

/* Bring out[0..n) (one per choice, zeroed before the first read) and *st up
 * to date: append to each output what its choice produced since the last
 * read, copy the request's state. Any thread; takes the request's lock for
 * the copy only. 0, or -1 on OOM (then out and st stay consistent, with
 * less). */
int dol_request_read(dol_request *r, dol_output *out, dol_request_state *st);
/* Free what dol_request_read allocated in n outputs and a state. */
void dol_output_free(dol_output *out, int n);
void dol_request_state_free(dol_request_state *st);

typedef enum { DOL_BATCH_CONTINUOUS = 0, DOL_BATCH_STATIC = 1 } dol_batch_mode;

/* The batch window of an idle engine opens at the first waiting request's
 * arrival and closes after batch_window_ms, or at once when max_batch_size
 * sequences wait. In continuous mode it also closes once no request has
 * arrived for batch_window_ms / DOL_WINDOW_QUIET_DIV (docs/configuration.md,
 * "The batch window"). */
#define DOL_WINDOW_QUIET_DIV 10.0

/* Speculative decoding's proposer (docs/speculative.md). */
typedef enum { DOL_SPEC_OFF = 0, DOL_SPEC_NGRAM = 1, DOL_SPEC_DRAFT = 2 } dol_spec_mode;

/* Every field is required (the defaults are the configuration's: src/config,
 * docs/configuration.md); dol_scheduler_create refuses a value out of range. */
typedef struct {
    int max_batch_size;          /* sequences in one step, >= 1 */
    int batch_window_ms;         /* >= 0, see DOL_WINDOW_QUIET_DIV */
    dol_batch_mode mode;
    int max_queue;               /* waiting requests before QUEUE_FULL, >= 1 */
    double memory_high_watermark;/* fraction of the KV pool, (0, 1] */
    int prefill_chunk;           /* max prompt tokens of one sequence per step, >= 1 */
    /* Speculative decoding (docs/speculative.md). NGRAM: a decoding
     * sequence proposes up to spec_max_draft (1..DOL_SPEC_MAX_DRAFT) tokens
     * by looking its last spec_ngram (1..DOL_SPEC_MAX_NGRAM, then shorter)
     * tokens up in its own prompt and output; one forward pass verifies
     * them. A sequence whose proposals are accepted less than
     * spec_min_acceptance ([0, 1]) of the time pauses proposing, longer
     * after each failing round. Only while at most half of max_batch_size
     * sequences (or one) decode. DRAFT: the proposals are the greedy tokens of a
     * second model, spec_draft, run over the sequence's tokens with its own
     * KV cache (spec_ngram unused). OFF (0, the zero value): none. */
    dol_spec_mode spec_mode;
    int spec_max_draft;
    int spec_ngram;
    double spec_min_acceptance;
    /* DRAFT: the draft model's engine: the same vocabulary as the engine's
     * (the caller checks), max_seqs at least the engine's, max_batch_tokens
     * >= max_batch_size, prefix caching off. Used by the scheduler thread
     * alone; owned by the caller, outlives the scheduler. NULL otherwise. */
    dol_engine *spec_draft;
    /* Token ids that end a choice besides the tokenizer's EOS (and BOS),
     * honoured unless ignore_eos: config.json's eos_token_id list; n_end_ids
     * 0..DOL_MAX_EOS_IDS, copied at create. */
    const int *end_ids;
    int n_end_ids;
    /* For tests. clock_ms: the clock of arrivals, the batch window and
     * timeouts, in ms (NULL = dol_now_ms). manual: no thread of its own;
     * the caller drives the loop with dol_scheduler_tick. */
    double (*clock_ms)(void *ctx);
    void *clock_ctx;
    bool manual;
} dol_scheduler_params;

typedef struct dol_scheduler dol_scheduler;

/* Create the scheduler and start its thread. The engine and tokenizer must
 * outlive it. -1 with err on failure (out of memory, a parameter out of
 * range). */
int dol_scheduler_create(dol_engine *engine, const dol_tokenizer *tok,
                         const dol_scheduler_params *p, dol_scheduler **out,
                         char *err, size_t errlen);
/* Stop the thread (ends every queued or running request with reason
 * DRAINING) and free. */
void dol_scheduler_free(dol_scheduler *s);

/* Queue a request (takes a reference). Returns DOL_REASON_NONE, or why it
 * was refused (QUEUE_FULL, DRAINING, the reasons of dol_scheduler_fit,
 * BAD_TOKEN, TOO_MANY_CHOICES, INVALID, NO_MEMORY) with the figures in *why
 * (may be NULL); then nothing is queued. Thread-safe. */
dol_reason dol_scheduler_submit(dol_scheduler *s, dol_request *r, dol_reason_info *why);

/* Whether a request fits, the one place that decides it: how many new
 * tokens each of n choices of an n_prompt-token prompt can have. Every
 * choice reserves its blocks for prompt + max_tokens at admission; choices
 * 2..n share the prompt's whole blocks.
 *   max_new >= 0: max_new when prompt + max_new fits the context and the
 *                 n choices fit the whole KV pool, else CONTEXT_OVERFLOW or
 *                 KV_OVERFLOW;
 *   max_new < 0:  as many as fit both (the rest of the context, capped by
 *                 the pool), CONTEXT_OVERFLOW when that is less than one.
 * *fit gets the count (0 on a refusal); *why the reason and figures (may be
 * NULL). The answer depends on the engine's fixed sizes only, not on what
 * is in use now. Thread-safe (reads nothing that changes). */
dol_reason dol_scheduler_fit(const dol_scheduler *s, int n_prompt, int n, int max_new,
                             int *fit, dol_reason_info *why);

/* Stop admitting new requests (submit answers DRAINING); queued and running
 * ones go on. Thread-safe. */
void dol_scheduler_drain(dol_scheduler *s);

typedef struct {
    int queued;              /* requests waiting */
    int running_seqs;        /* sequences in the running batch */
    int running_requests;
    int kv_blocks_total, kv_blocks_used, kv_block_size;
    int context_len;         /* tokens of one full context */
    const char *kv_dtype;    /* "f32", "f16", "q8_0", or "k=<k>,v=<v>" when
                                the halves differ (static) */
    const char *kv_dtype_k, *kv_dtype_v; /* each half's: "f32", "f16", "q8_0" (static) */
    int kv_blocks_cached;    /* unused blocks kept by the prefix cache (they
                                count as free: taken when needed) */
    uint64_t steps;          /* forward steps so far */
    uint64_t tokens_prompt, tokens_generated;  /* totals (prompt: cached ones too) */
    uint64_t prefix_cache_query_tokens; /* prompt tokens looked up in the
                                           prefix cache, and those found */
    uint64_t prefix_cache_hit_tokens;
    /* speculative decoding totals: draft tokens proposed, and accepted */
    uint64_t spec_proposed, spec_accepted;
    dol_spec_mode spec_mode;  /* static */
    double last_step_ms;     /* dol_now_ms() at the last loop iteration */
    bool idle;               /* nothing queued or running */
    bool draining;
    /* Heartbeat: dol_now_ms() when the loop last made progress (a forward
     * step finished, or it had nothing to do). Work pending (!idle) and no
     * progress for long means a stuck step (the readiness probe says so). */
    double last_progress_ms;
    /* Device memory from dol_engine_memory_info (CUDA: the whole device;
     * CPU: the KV pool stands in), sampled after each admission round and on
     * idle ticks: the figure the readiness probe and /metrics report. */
    size_t mem_used_bytes, mem_total_bytes;
    /* the same per device holding part of the model (dol_engine_devices),
     * in pipeline order; mem_* above is the one nearest to full */
    int n_devices;
    dol_device_memory devices[DOL_MAX_DEVICES + 1];
    size_t weight_bytes;     /* resident weights (dol_engine_weight_bytes) */
    double gpu_utilization;  /* dol_engine_gpu_utilization at the last memory
                                sample: 0..1, or -1 when unknown */
    const char *backend;     /* "cpu" | "cuda" (a static string) */
} dol_scheduler_stats;

void dol_scheduler_get_stats(dol_scheduler *s, dol_scheduler_stats *st);

/* Manual mode only (params.manual; a no-op otherwise): one iteration of the
 * scheduler's loop on the calling thread, never waiting: reap cancelled and
 * timed-out requests; then, unless idle or inside the batch window, admit
 * from the queue and run one step (prefill chunks and decode tokens),
 * notifying requests of their output. Not thread-safe against itself. */
void dol_scheduler_tick(dol_scheduler *s);

#ifdef __cplusplus
}
#endif
#endif
