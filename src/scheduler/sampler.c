/* src/scheduler/sampler.c — next-token selection (see sampler.h): penalties,
 * logit bias, greedy argmax, temperature + top-k + top-p + min-p sampling,
 * log-probabilities, and the per-request RNG. */
#include "dolphin/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void dol_sampling_params_default(dol_sampling_params *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
}

/* ---- RNG: splitmix64 seeding, xoshiro256** generation --------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void dol_rng_seed(dol_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t dol_rng_next(dol_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float dol_rng_float(dol_rng *r) { return (float)(dol_rng_next(r) >> 40) / 16777216.0f; }

/* ---- sampler ------------------------------------------------------------- */

typedef struct { float p; int32_t id; } cand;

struct dol_sampler {
    int vocab;
    cand *c;
    int32_t *count;   /* occurrences of each id among generated tokens */
    uint8_t *seen;    /* id occurs in prompt or generated */
};

dol_sampler *dol_sampler_new(int vocab)
{
    dol_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->vocab = vocab;
    s->c = malloc(sizeof(cand) * (size_t)vocab);
    s->count = calloc((size_t)vocab, sizeof(int32_t));
    s->seen = calloc((size_t)vocab, 1);
    if (!s->c || !s->count || !s->seen) { dol_sampler_free(s); return NULL; }
    return s;
}

void dol_sampler_free(dol_sampler *s)
{
    if (!s) return;
    free(s->c);
    free(s->count);
    free(s->seen);
    free(s);
}

void dol_sampler_apply_penalties(dol_sampler *s, const dol_sampling_params *p,
                                 float *logits, const int32_t *hist,
                                 int n_hist, int n_prompt)
{
    bool rep = p->repetition_penalty != 1.0f && p->repetition_penalty > 0.0f;
    bool pf = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (rep || pf) {
        for (int i = 0; i < n_hist; i++) {
            int32_t id = hist[i];
            if (id < 0 || id >= s->vocab) continue;
            s->seen[id] = 1;
            if (i >= n_prompt) s->count[id]++;
        }
        for (int i = 0; i < n_hist; i++) {
            int32_t id = hist[i];
            if (id < 0 || id >= s->vocab || !s->seen[id]) continue;
            s->seen[id] = 0; /* visit each id once */
            float *l = &logits[id];
            /* CTRL: divide positive logits, multiply negative ones */
            if (rep) *l = *l > 0.0f ? *l / p->repetition_penalty : *l * p->repetition_penalty;
            if (s->count[id] > 0) {
                *l -= p->frequency_penalty * (float)s->count[id];
                *l -= p->presence_penalty;
            }
            s->count[id] = 0;
        }
    }
    for (int i = 0; i < p->n_logit_bias; i++) {
        int32_t id = p->logit_bias_ids[i];
        if (id >= 0 && id < s->vocab) logits[id] += p->logit_bias_vals[i];
    }
}

int32_t dol_sampler_argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int cand_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->p > y->p) return -1;
    if (x->p < y->p) return 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Put the k first of c[lo..hi) in cand_desc order into c[lo..lo+k), in any
 * order among themselves (quickselect, median-of-three pivots; past a depth
 * of 64 the rest is sorted whole, so the cost stays O(n log n)). */
static void select_top(cand *c, int lo, int hi, int k)
{
    int want = lo + k;
    for (int depth = 0; hi - lo > 16 && want > lo && want < hi; depth++) {
        if (depth > 64) break;
        int mid = lo + (hi - lo) / 2;
        /* median of c[lo], c[mid], c[hi-1] to c[hi-1] */
        if (cand_desc(&c[mid], &c[lo]) < 0) { cand t = c[mid]; c[mid] = c[lo]; c[lo] = t; }
        if (cand_desc(&c[hi - 1], &c[lo]) < 0) { cand t = c[hi - 1]; c[hi - 1] = c[lo]; c[lo] = t; }
        if (cand_desc(&c[mid], &c[hi - 1]) < 0) { cand t = c[mid]; c[mid] = c[hi - 1]; c[hi - 1] = t; }
        cand pv = c[hi - 1];
        int st = lo;
        for (int i = lo; i < hi - 1; i++)
            if (cand_desc(&c[i], &pv) < 0) { cand t = c[i]; c[i] = c[st]; c[st] = t; st++; }
        c[hi - 1] = c[st];
        c[st] = pv;
        if (st == want || st + 1 == want) return;
        if (st < want) lo = st + 1;
        else hi = st;
    }
    if (want > lo && want < hi) qsort(c + lo, (size_t)(hi - lo), sizeof(cand), cand_desc);
}

/* Extend the sorted prefix c[0..*sorted) of c[0..m) to at least `want`
 * entries (in chunks that grow fourfold, so a long walk stays O(n log n)):
 * the entries are those a full sort would put there, in the same order. */
static void sort_prefix(cand *c, int m, int *sorted, int want)
{
    if (want > m) want = m;
    if (want <= *sorted) return;
    int grow = *sorted < 16 ? 16 : *sorted * 3;
    if (want < *sorted + grow) want = *sorted + grow < m ? *sorted + grow : m;
    select_top(c, *sorted, m, want - *sorted);
    qsort(c + *sorted, (size_t)(want - *sorted), sizeof(cand), cand_desc);
    *sorted = want;
}

int32_t dol_sampler_pick(dol_sampler *s, const dol_sampling_params *p,
                         const float *logits, dol_rng *rng)
{
    int n = s->vocab;
    if (p->temperature <= 0.0f) return dol_sampler_argmax(logits, n);

    /* softmax(logits / T) */
    float maxl = logits[dol_sampler_argmax(logits, n)];
    double sum = 0.0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        float v = expf((logits[i] - maxl) / p->temperature);
        /* a token without mass (masked to -inf, or underflowed) can never be
         * drawn: leaving it out changes nothing but the cost */
        if (v <= 0.0f) continue;
        s->c[m].p = v;
        s->c[m].id = i;
        m++;
        sum += v;
    }
    /* The filters walk the candidates in descending probability (ties:
     * lower id first), but only as far as they reach: sorted is the length
     * of the prefix already in that order (sort_prefix). */
    cand *c = s->c;
    int sorted = 0;
    /* top-k: keep the k most likely */
    if (p->top_k > 0 && p->top_k < m) {
        sort_prefix(c, m, &sorted, p->top_k);
        m = p->top_k;
        sum = 0.0;
        for (int i = 0; i < m; i++) sum += c[i].p;
    }
    /* min-p (Nguyen et al. 2024): drop tokens below min_p * p(top) */
    if (p->min_p > 0.0f) {
        sort_prefix(c, m, &sorted, 1);
        float cut = p->min_p * c[0].p;
        int k = 0;
        for (int i = 0; i < m; i++) k += c[i].p >= cut;
        if (k < m) {
            sort_prefix(c, m, &sorted, k);
            m = k;
            sum = 0.0;
            for (int i = 0; i < m; i++) sum += c[i].p;
        }
    }
    /* top-p (Holtzman et al. 2020): smallest prefix with mass >= top_p */
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        double acc = 0.0, target = p->top_p * sum;
        int k = 0;
        while (k < m) {
            sort_prefix(c, m, &sorted, k + 1);
            acc += c[k].p;
            k++;
            if (acc >= target) break;
        }
        m = k;
        sum = acc;
    }
    /* the draw: any fixed order of the kept candidates gives each its
     * probability, so they are walked as they lie (the sorted prefix first) */
    double r = (double)dol_rng_float(rng) * sum, acc = 0.0;
    for (int i = 0; i < m; i++) {
        acc += c[i].p;
        if (r < acc) return c[i].id;
    }
    return c[m - 1].id;
}

/* ---- log-probabilities --------------------------------------------------- */

static double log_sum_exp(const float *logits, int vocab)
{
    float maxl = logits[dol_sampler_argmax(logits, vocab)];
    double sum = 0.0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - maxl);
    return maxl + log(sum);
}

float dol_logprob_of(const float *logits, int vocab, int32_t id)
{
    return (float)((double)logits[id] - log_sum_exp(logits, vocab));
}

void dol_top_logprobs(const float *logits, int vocab, int k, int32_t *ids, float *lps)
{
    if (k > 8) k = 8;
    if (k <= 0) return;
    double lse = log_sum_exp(logits, vocab);
    int n = 0;
    for (int i = 0; i < vocab; i++) {
        float v = logits[i];
        if (n == k && v <= logits[ids[n - 1]]) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && logits[ids[j - 1]] < v) { ids[j] = ids[j - 1]; j--; }
        ids[j] = i;
    }
    for (int i = 0; i < n; i++) lps[i] = (float)((double)logits[ids[i]] - lse);
}
