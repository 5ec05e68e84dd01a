/* include/dolphin/sampler.h — turning logits into the next token: penalties,
 * logit bias, temperature, top-k, top-p (nucleus), min-p, and greedy argmax;
 * log-probabilities for the API's logprobs; a small seeded RNG per request.
 */
#ifndef DOLPHIN_SAMPLER_H
#define DOLPHIN_SAMPLER_H

#include "dolphin/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DOL_MAX_LOGIT_BIAS 300

typedef struct {
    float temperature;        /* 0 = greedy (argmax, lowest id wins ties) */
    int top_k;                /* 0 or < 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float presence_penalty;   /* OpenAI: -= p if the token occurred */
    float frequency_penalty;  /* OpenAI: -= f * count */
    float repetition_penalty; /* CTRL (Keskar et al. 2019): 1 = off */
    int n_logit_bias;
    int32_t logit_bias_ids[DOL_MAX_LOGIT_BIAS];
    float logit_bias_vals[DOL_MAX_LOGIT_BIAS];
} dol_sampling_params;

/* Defaults: temperature 1, top_k off, top_p 1, min_p 0, penalties off. */
void dol_sampling_params_default(dol_sampling_params *p);

/* xoshiro256** (Blackman & Vigna), seeded through splitmix64. */
typedef struct { uint64_t s[4]; } dol_rng;
void dol_rng_seed(dol_rng *r, uint64_t seed);
uint64_t dol_rng_next(dol_rng *r);
/* Uniform in [0, 1) with 24 bits of precision. */
float dol_rng_float(dol_rng *r);

typedef struct dol_sampler dol_sampler;
/* Scratch space for a vocabulary of `vocab` tokens; NULL on OOM. */
dol_sampler *dol_sampler_new(int vocab);
void dol_sampler_free(dol_sampler *s);

/* Apply, in place on logits[vocab]: repetition, presence and frequency
 * penalties over the `n_hist` ids in `hist` (prompt + generated for the
 * repetition penalty, generated only for presence/frequency — pass the split
 * point as n_prompt), then logit bias. */
void dol_sampler_apply_penalties(dol_sampler *s, const dol_sampling_params *p,
                                 float *logits, const int32_t *hist,
                                 int n_hist, int n_prompt);

/* The index of the largest of x[0..n) (n >= 1), the lowest on a tie: the
 * greedy token. Any thread. */
int32_t dol_sampler_argmax(const float *x, int n);

/* Pick a token from (penalised) logits[vocab]: argmax when temperature == 0,
 * else softmax(logits / T) filtered by top-k, top-p, min-p and drawn with
 * `rng`. Does not modify logits. Deterministic for a given rng state. */
int32_t dol_sampler_pick(dol_sampler *s, const dol_sampling_params *p,
                         const float *logits, dol_rng *rng);

/* log_softmax(logits)[id], computed in double. */
float dol_logprob_of(const float *logits, int vocab, int32_t id);
/* The k (<= 8) most likely ids of log_softmax(logits), best first, with their
 * log-probabilities. */
void dol_top_logprobs(const float *logits, int vocab, int k,
                      int32_t *ids, float *lps);

#ifdef __cplusplus
}
#endif
#endif
