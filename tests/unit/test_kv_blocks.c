/* tests/unit/test_kv_blocks.c — the paged KV cache's bookkeeping without a
 * model: block tables, reference counts, forks, and the prefix cache
 * (lookups that leave the last token to compute, exact keys through the
 * parent block and its generation, cached blocks counted as free, and
 * eviction oldest first when the free list is empty). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "engine/kv_blocks.h"

#define BS 4

static void seq_tokens(int32_t *t, int n, int32_t base)
{
    for (int i = 0; i < n; i++) t[i] = base + i;
}

/* Tokens a new sequence about to hold t[0..n) would find in the cache; the
 * sequence is released again (its hits go back to the evictable list). */
static int lookup(dol_kv_blocks *kv, const int32_t *t, int n)
{
    int q = dol_kv_seq_new(kv);
    assert_true(q >= 0);
    int got = dol_kv_seq_match_prefix(kv, q, t, n);
    dol_kv_seq_free(kv, q);
    return got;
}

static void test_disabled(void **state)
{
    (void)state;
    dol_kv_blocks kv;
    assert_int_equal(dol_kv_blocks_init(&kv, 8, BS, 4, false), 0);
    int32_t t[16];
    seq_tokens(t, 16, 100);
    int a = dol_kv_seq_new(&kv);
    assert_int_equal(dol_kv_seq_reserve(&kv, a, 13), 0);
    dol_kv_seq_commit(&kv, a, t, 13);
    dol_kv_seq_free(&kv, a);
    assert_int_equal(dol_kv_blocks_available(&kv), 8);
    assert_int_equal(kv.n_free, 8);
    int b = dol_kv_seq_new(&kv);
    assert_int_equal(dol_kv_seq_match_prefix(&kv, b, t, 13), 0);
    assert_int_equal(kv.seqs[b].n_blocks, 0);
    dol_kv_blocks_destroy(&kv);
}

static void test_hit_shares_blocks_and_leaves_a_token(void **state)
{
    (void)state;
    dol_kv_blocks kv;
    assert_int_equal(dol_kv_blocks_init(&kv, 8, BS, 4, true), 0);
    int32_t t[16];
    seq_tokens(t, 16, 100);
    int a = dol_kv_seq_new(&kv);
    assert_int_equal(dol_kv_seq_match_prefix(&kv, a, t, 10), 0); /* empty cache */
    assert_int_equal(dol_kv_seq_reserve(&kv, a, 10), 0);            /* 3 blocks */
    dol_kv_seq_commit(&kv, a, t, 9);          /* positions 0..8: blocks 0, 1 whole */
    dol_kv_seq_commit(&kv, a, t, 9);          /* again: nothing new */
    assert_int_equal(kv.seqs[a].n_chained, 2);

    int b = dol_kv_seq_new(&kv);
    assert_int_equal(dol_kv_seq_match_prefix(&kv, b, t, 10), 8);
    assert_int_equal(kv.seqs[b].n_blocks, 2);
    assert_int_equal(kv.seqs[b].n_tokens, 8);
    assert_int_equal(kv.seqs[b].table[0], kv.seqs[a].table[0]);
    assert_int_equal(kv.seqs[b].table[1], kv.seqs[a].table[1]);
    assert_int_equal(kv.refs[kv.seqs[a].table[0]], 2);
    assert_int_equal(dol_kv_seq_reserve(&kv, b, 12), 0);            /* one block more */
    assert_int_equal(dol_kv_blocks_available(&kv), 8 - 3 - 1);

    /* 9 tokens: two whole blocks would leave one; 8 tokens: only one may go */
    assert_int_equal(lookup(&kv, t, 9), 8);
    assert_int_equal(lookup(&kv, t, 8), 4);
    /* a different first token: nothing */
    int32_t u[16];
    memcpy(u, t, sizeof u);
    u[0] = 7;
    assert_int_equal(lookup(&kv, u, 12), 0);
    /* a different token inside block 1: block 0 only */
    memcpy(u, t, sizeof u);
    u[6] = 7;
    assert_int_equal(lookup(&kv, u, 12), 4);

    /* when every sequence has gone, the cached blocks count as free */
    dol_kv_seq_free(&kv, a);
    dol_kv_seq_free(&kv, b);
    assert_int_equal(dol_kv_blocks_available(&kv), 8);
    assert_int_equal(kv.n_evictable, 2);
    assert_int_equal(kv.n_free, 6);
    /* and a hit takes them back off the evictable list */
    int c = dol_kv_seq_new(&kv);
    assert_int_equal(dol_kv_seq_match_prefix(&kv, c, t, 16), 8);
    assert_int_equal(kv.n_evictable, 0);
    assert_int_equal(dol_kv_blocks_available(&kv), 6);
    dol_kv_seq_free(&kv, c);
    dol_kv_blocks_destroy(&kv);
}

static void test_eviction_last_block_first(void **state)
{
    (void)state;
    dol_kv_blocks kv;
    assert_int_equal(dol_kv_blocks_init(&kv, 4, BS, 4, true), 0);
    int32_t t[16];
    seq_tokens(t, 16, 100);
    int a = dol_kv_seq_new(&kv);
    assert_int_equal(dol_kv_seq_reserve(&kv, a, 12), 0);
    dol_kv_seq_commit(&kv, a, t, 12);                 /* blocks 0, 1, 2 cached */
    dol_kv_seq_free(&kv, a);
    assert_int_equal(kv.n_evictable, 3);
    assert_int_equal(kv.n_free, 1);
    /* two blocks: the free one, then the oldest evictable: a's block 2 */
    int b = dol_kv_seq_new(&kv);
    int32_t other[16];
    seq_tokens(other, 16, 500);
    assert_int_equal(dol_kv_seq_reserve(&kv, b, 8), 0);
    assert_int_equal(kv.n_evictable, 2);
    assert_int_equal(dol_kv_blocks_available(&kv), 2);
    assert_int_equal(lookup(&kv, t, 16), 8); /* blocks 0, 1 left */
    /* the pool is full: more than what is free or evictable fails, changing nothing */
    assert_int_equal(dol_kv_seq_reserve(&kv, b, 20), -1);
    assert_int_equal(kv.seqs[b].n_blocks, 2);
    assert_int_equal(dol_kv_seq_reserve(&kv, b, 16), 0);     /* evicts both */
    assert_int_equal(dol_kv_blocks_available(&kv), 0);
    assert_int_equal(lookup(&kv, t, 16), 0);
    dol_kv_seq_free(&kv, b);
    assert_int_equal(dol_kv_blocks_available(&kv), 4);
    dol_kv_blocks_destroy(&kv);
}

/* A cached block whose parent was evicted, and whose parent's id now holds
 * other tokens, must not match after that id: the parent's generation. */
static void test_evicted_parent_cuts_the_chain(void **state)
{
    (void)state;
    dol_kv_blocks kv;
    assert_int_equal(dol_kv_blocks_init(&kv, 6, BS, 6, true), 0);
    int32_t t[12], w[12];
    seq_tokens(t, 12, 100);
    /* x caches block T0 alone */
    int x = dol_kv_seq_new(&kv);
    assert_int_equal(dol_kv_seq_reserve(&kv, x, 5), 0);
    dol_kv_seq_commit(&kv, x, t, 4);
    int32_t x0 = kv.seqs[x].table[0];
    dol_kv_seq_free(&kv, x);                       /* x0 evictable, its 2nd block free */
    /* s computes T0 T1 itself (no lookup): its block 0 is a duplicate of x0,
     * its block 1 is cached under x0 */
    int s = dol_kv_seq_new(&kv);
    assert_int_equal(dol_kv_seq_reserve(&kv, s, 9), 0);
    dol_kv_seq_commit(&kv, s, t, 8);
    assert_int_equal(kv.seqs[s].n_chained, 2);
    assert_false(kv.cached[kv.seqs[s].table[0]]);
    int32_t s1 = kv.seqs[s].table[1];
    assert_true(kv.cached[s1]);
    assert_int_equal(kv.parent[s1], x0);
    dol_kv_seq_free(&kv, s);                       /* evictable: x0 (oldest), s1 */
    assert_int_equal(kv.n_evictable, 2);
    /* take every free block, then one more: x0 is evicted */
    int f = dol_kv_seq_new(&kv);
    assert_int_equal(dol_kv_seq_reserve(&kv, f, kv.n_free * BS), 0);
    int z = dol_kv_seq_new(&kv);
    assert_int_equal(dol_kv_seq_reserve(&kv, z, 2), 0);
    assert_int_equal(kv.seqs[z].table[0], x0);
    assert_true(kv.cached[s1]);
    /* z writes other tokens into x0's block and caches it */
    memcpy(w, t, sizeof w);
    w[0] = w[1] = w[2] = w[3] = 9;
    dol_kv_seq_commit(&kv, z, w, 4);
    assert_true(kv.cached[x0]);
    dol_kv_seq_free(&kv, z);
    /* W0 T1: block 0 is z's, and s1 (cached after the old x0) must not follow */
    assert_int_equal(lookup(&kv, w, 9), 4);
    /* T0 T1 finds nothing: T0's block is gone */
    assert_int_equal(lookup(&kv, t, 9), 0);
    dol_kv_seq_free(&kv, f);
    assert_int_equal(dol_kv_blocks_available(&kv), 6);
    dol_kv_blocks_destroy(&kv);
}

/* Forks share full blocks; a fork that commits the shared blocks again
 * finds them cached and registers nothing twice. */
static void test_fork_with_cache(void **state)
{
    (void)state;
    dol_kv_blocks kv;
    assert_int_equal(dol_kv_blocks_init(&kv, 8, BS, 4, true), 0);
    int32_t t[16];
    seq_tokens(t, 16, 100);
    int a = dol_kv_seq_new(&kv);
    assert_int_equal(dol_kv_seq_reserve(&kv, a, 10), 0);
    dol_kv_seq_commit(&kv, a, t, 10);
    int32_t cs, cd;
    int b = dol_kv_seq_fork(&kv, a, 10, &cs, &cd);
    assert_true(b >= 0);
    assert_int_equal(cs, kv.seqs[a].table[2]);
    assert_int_equal(kv.seqs[b].table[0], kv.seqs[a].table[0]);
    int32_t tb[16];
    memcpy(tb, t, sizeof tb);
    tb[10] = 1;
    tb[11] = 2;
    assert_int_equal(dol_kv_seq_reserve(&kv, b, 12), 0);
    dol_kv_seq_commit(&kv, b, tb, 12);           /* blocks 0, 1 known; block 2 new */
    assert_true(kv.cached[kv.seqs[b].table[2]]);
    assert_int_equal(kv.parent[kv.seqs[b].table[2]], kv.seqs[a].table[1]);
    dol_kv_seq_free(&kv, a);
    dol_kv_seq_free(&kv, b);
    assert_int_equal(dol_kv_blocks_available(&kv), 8);
    assert_int_equal(lookup(&kv, tb, 13), 12);
    dol_kv_blocks_destroy(&kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_disabled),
        cmocka_unit_test(test_hit_shares_blocks_and_leaves_a_token),
        cmocka_unit_test(test_eviction_last_block_first),
        cmocka_unit_test(test_evicted_parent_cuts_the_chain),
        cmocka_unit_test(test_fork_with_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
