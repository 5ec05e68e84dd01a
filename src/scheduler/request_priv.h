/* src/scheduler/request_priv.h — the request as the scheduler sees it (the
 * public header keeps it opaque): its parameters, its output guarded by its
 * mutex, and the per-choice output state (detokenizer, held-back text) with
 * what is done with every sampled token. */
#ifndef DOLPHIN_SCHEDULER_REQUEST_PRIV_H
#define DOLPHIN_SCHEDULER_REQUEST_PRIV_H

#include "dolphin/scheduler.h"

/* One choice's output so far; the scheduler only ever appends. */
typedef struct {
    char *text;              /* emit-safe text so far, NUL-terminated */
    size_t text_len, text_cap;
    int32_t *ids;
    int n_ids, ids_cap;
    dol_token_logprob *lps;  /* n_ids entries when logprobs >= 0 */
    int *lps_text_len;       /* text_len after each token's text was committed */
    dol_finish_reason finish;
    void *priv;              /* detokenizer and held-back text (request.c) */
} dol_choice;

struct dol_request {
    /* input: set at create, read-only afterwards */
    int32_t *prompt_ids;
    int n_prompt;
    int max_tokens;
    int n;
    dol_sampling_params sampling;
    uint64_t seed;
    char *stop[DOL_MAX_STOP];
    int n_stop;
    int logprobs;
    bool echo_logprobs;
    bool ignore_eos;
    dol_grammar *grammar;    /* a reference, or NULL */
    bool no_speculation;
    int priority;
    double timeout_ms;
    char id[64];
    void (*on_event)(dol_request *r, void *user);
    void *user;

    /* output: guarded by mu */
    pthread_mutex_t mu;
    dol_choice *choices;     /* n entries */
    dol_token_logprob *prompt_lps; /* echo_logprobs, once the prompt is in */
    bool done;
    dol_reason_info error;   /* reason NONE until it fails */
    int n_cached_prompt;
    double t_arrival_ms, t_start_ms, t_first_token_ms, t_done_ms;
    int64_t spec_proposed, spec_accepted;

    /* the scheduler's */
    atomic_int refs;
    atomic_bool cancelled;
    uint64_t seqno;          /* arrival order */
    void *priv;              /* req_priv (scheduler.c) */
};

/* The following are called with the request's mutex held. */

/* Attach a detokenizer for this choice (context: the prompt). 0 / -1 OOM. */
int dol_choice_out_init(dol_choice *c, const dol_tokenizer *tok,
                        const int32_t *prompt, int n_prompt);
void dol_choice_out_free(dol_choice *c);

/* Record a sampled token: append the id (and its logprobs), detokenize it,
 * and commit the text that can no longer be part of a stop string. An
 * is_stop_token (EOS) is recorded but produces no text. *stopped is set when
 * a stop string matched: the text is cut just before it. -1 on OOM. */
int dol_choice_push_token(dol_request *r, dol_choice *c, int32_t id, bool is_stop_token,
                          const dol_token_logprob *lp, bool *stopped);

/* Generation of this choice ended: flush the detokenizer (incomplete UTF-8
 * becomes U+FFFD) and commit everything that precedes any stop string. */
int dol_choice_finish_text(dol_request *r, dol_choice *c);

#endif
