/* tools/bench_grammar.c — the cost of one structured-output mask step
 * (src/constrain): over a vocabulary's trie, walk STEPS tokens of random
 * JSON (a seeded random allowed token each step, a new value when one is
 * complete) and time each dol_matcher_mask call. Prints p50/p99 in µs with
 * the mask cache as the server runs it (warm: it fills as it goes), and
 * cold (the cache emptied before every step: the full trie walk).
 *   dol-bench-grammar TOKENIZER_MODEL [SCHEMA_FILE] [--steps N] [--seed N]
 * Without SCHEMA_FILE the grammar is json_object. Used by scripts/bench-grammar. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dolphin/grammar.h"
#include "dolphin/sampler.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

/* STEPS mask steps; cold: a fresh vocabulary (empty cache) for each. */
static int run(const dol_tokenizer *tok, dol_grammar *g, int steps, uint64_t seed, bool cold,
               double *us)
{
    int vocab = dol_tokenizer_vocab_size(tok), eos = dol_tokenizer_eos_id(tok);
    dol_grammar_vocab *v = dol_grammar_vocab_new(tok, vocab);
    if (!v) return -1;
    uint64_t *mask = malloc(sizeof *mask * (size_t)dol_grammar_mask_words(v));
    int32_t *ids = malloc(sizeof *ids * (size_t)vocab);
    dol_matcher *m = dol_matcher_new(g);
    if (!mask || !ids || !m) return -1;
    dol_rng rng;
    dol_rng_seed(&rng, seed);
    for (int s = 0; s < steps; s++) {
        if (cold) {
            dol_grammar_vocab_free(v);
            v = dol_grammar_vocab_new(tok, vocab);
            if (!v) return -1;
        }
        double t0 = dol_now_ms();
        dol_matcher_mask(m, v, mask);
        us[s] = (dol_now_ms() - t0) * 1000.0;
        int n = 0;
        for (int id = 0; id < vocab; id++)
            if (id != eos && (mask[id >> 6] >> (id & 63) & 1)) ids[n++] = id;
        bool done = (mask[eos >> 6] >> (eos & 63) & 1) && (n == 0 || dol_rng_float(&rng) < 0.3f);
        if (done || n == 0 || s % 200 == 199) {   /* a new value */
            dol_matcher_free(m);
            m = dol_matcher_new(g);
            if (!m) return -1;
            continue;
        }
        if (!dol_matcher_accept(m, v, ids[dol_rng_next(&rng) % (uint64_t)n])) return -1;
    }
    dol_matcher_free(m);
    free(ids);
    free(mask);
    dol_grammar_vocab_free(v);
    return 0;
}

int main(int argc, char **argv)
{
    const char *tok_path = NULL, *schema_path = NULL;
    int steps = 2000;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!tok_path) tok_path = argv[i];
        else schema_path = argv[i];
    }
    if (!tok_path || steps < 1) {
        fprintf(stderr, "usage: dol-bench-grammar TOKENIZER_MODEL [SCHEMA_FILE] [--steps N] "
                        "[--seed N]\n");
        return 2;
    }
    char err[DOL_ERR_LEN];
    dol_tokenizer *tok;
    if (dol_tokenizer_load(tok_path, &tok, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    dol_grammar *g = NULL;
    if (schema_path) {
        FILE *f = fopen(schema_path, "rb");
        static char buf[1 << 20];
        size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
        if (f) fclose(f);
        bool oom;
        if (dol_grammar_from_schema(buf, n, 0, &g, err, sizeof err, &oom) != 0) {
            fprintf(stderr, "%s: %s\n", schema_path, err);
            return 1;
        }
    } else {
        g = dol_grammar_json_object();
    }
    double *us = malloc(sizeof *us * (size_t)steps);
    int cold_steps = steps < 200 ? steps : 200;
    if (!g || !us) return 1;
    printf("grammar %s: %d states, vocabulary %d\n", schema_path ? schema_path : "json_object",
           dol_grammar_n_states(g), dol_tokenizer_vocab_size(tok));
    if (run(tok, g, steps, seed, false, us) != 0) { fprintf(stderr, "run failed\n"); return 1; }
    printf("  mask per step, cache as served: p50 %.1f us, p99 %.1f us (%d steps)\n",
           pct(us, steps, 0.5), pct(us, steps, 0.99), steps);
    if (run(tok, g, cold_steps, seed, true, us) != 0) { fprintf(stderr, "run failed\n"); return 1; }
    printf("  mask per step, empty cache:   p50 %.1f us, p99 %.1f us (%d steps)\n",
           pct(us, cold_steps, 0.5), pct(us, cold_steps, 0.99), cold_steps);
    free(us);
    dol_grammar_release(g);
    dol_tokenizer_free(tok);
    return 0;
}
