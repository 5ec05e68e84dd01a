/* src/scheduler/request_priv.h — scheduler-internal operations on requests:
 * the per-choice output state (detokenizer, held-back text) and what is done
 * with every sampled token. Called with the request's mutex held. */
#ifndef DOLPHIN_SCHEDULER_REQUEST_PRIV_H
#define DOLPHIN_SCHEDULER_REQUEST_PRIV_H

#include "dolphin/scheduler.h"

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
