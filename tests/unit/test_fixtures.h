/* tests/unit/test_fixtures.h — where the unit tests find the shared test
 * models ($DOLPHIN_SHARED, else ../shared beside the checkout), and the
 * skip of a cmocka test when they are absent (a clone on its own), on top of
 * tests/fixtures.h; and greedy decoding and teacher-forced logits through an
 * engine, as the golden comparisons of the unit and CUDA tests run them.
 * Include after <cmocka.h>. */
#ifndef DOLPHIN_TEST_FIXTURES_H
#define DOLPHIN_TEST_FIXTURES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fixtures.h"
#include "dolphin/engine.h"

/* The fixtures' root directory. */
static inline const char *test_shared_dir(void) { return fixture_shared_dir(); }

/* dir (n bytes) = the fixture model `name`; skips the calling test when
 * its config.json is not there. */
static inline void test_fixture_model(char *dir, size_t n, const char *name)
{
    snprintf(dir, n, "%s/models/%s", test_shared_dir(), name);
    char probe[1300];
    snprintf(probe, sizeof probe, "%s/config.json", dir);
    FILE *f = fopen(probe, "r");
    if (!f) {
        print_message("  note: %s not found (set DOLPHIN_SHARED); skipped\n", dir);
        skip();
    }
    fclose(f);
}

/* Greedy ids after the prompt (the prompt in one call; stops at BOS/EOS like
 * the references) into out, at most max_new; returns how many. The logits
 * after the prompt go to first; each step's margin between its best two
 * logits to margins[step] when margins is not NULL. */
static inline int test_greedy(dol_engine *e, const int32_t *prompt, int np, int max_new,
                              int32_t *out, double *margins, float *first)
{
    const int V = dol_engine_vocab_size(e);
    float *logits = malloc(sizeof(float) * (size_t)V);
    char err[DOL_ERR_LEN];
    int seq = dol_engine_seq_new(e);
    assert_true(seq >= 0);
    assert_int_equal(dol_engine_seq_reserve(e, seq, np + max_new), 0);
    dol_batch_item it = { seq, np, prompt, 0, 1, logits };
    if (dol_engine_forward(e, &it, 1, err, sizeof err) != 0) fail_msg("%s", err);
    memcpy(first, logits, sizeof(float) * (size_t)V);
    int n = 0;
    for (int step = 0; step < max_new; step++) {
        int32_t id = fixture_argmax(logits, V);
        if (margins) margins[step] = fixture_margin(logits, V);
        if (id == 1 || id == 2) break;
        out[n++] = id;
        if (step + 1 == max_new) break;
        dol_batch_item d = { seq, 1, &out[n - 1], np + n - 1, 1, logits };
        if (dol_engine_forward(e, &d, 1, err, sizeof err) != 0) fail_msg("%s", err);
    }
    dol_engine_seq_free(e, seq);
    free(logits);
    return n;
}

/* The logits of every position of ids[0..n) ([n][vocab] into logits), in one
 * call on a fresh sequence. */
static inline void test_forward_all(dol_engine *e, const int32_t *ids, int n, float *logits)
{
    char err[DOL_ERR_LEN];
    int seq = dol_engine_seq_new(e);
    assert_true(seq >= 0);
    assert_int_equal(dol_engine_seq_reserve(e, seq, n), 0);
    dol_batch_item it = { seq, n, ids, 0, n, logits };
    if (dol_engine_forward(e, &it, 1, err, sizeof err) != 0) fail_msg("%s", err);
    dol_engine_seq_free(e, seq);
}

#endif
