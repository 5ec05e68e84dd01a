/* src/engine/kv_blocks.c — block allocator, block tables and prefix cache
 * of the paged KV cache (see kv_blocks.h). Blocks are reference-counted so
 * that sequences forked from one prompt (n > 1), and prompts that start
 * with the same whole blocks, share them; a block goes back to the free
 * list when its last sequence lets go, or, when it is in the prefix cache,
 * to the LRU list of evictable blocks. */
#include "engine/kv_blocks.h"

#include <stdlib.h>
#include <string.h>

int dol_kv_blocks_init(dol_kv_blocks *kv, int n_blocks, int block_size, int max_seqs,
                       bool prefix_caching)
{
    memset(kv, 0, sizeof *kv);
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->max_seqs = max_seqs;
    kv->free_list = malloc(sizeof(int32_t) * (size_t)n_blocks);
    kv->refs = calloc((size_t)n_blocks, sizeof(int32_t));
    kv->seqs = calloc((size_t)max_seqs, sizeof(dol_kv_seq));
    if (!kv->free_list || !kv->refs || !kv->seqs) {
        dol_kv_blocks_destroy(kv);
        return -1;
    }
    kv->lru_head = kv->lru_tail = -1;
    if (prefix_caching && n_blocks > 0) {
        size_t nb = (size_t)n_blocks;
        kv->n_buckets = 16;
        while (kv->n_buckets < nb && kv->n_buckets < (1u << 30)) kv->n_buckets *= 2;
        kv->cached = calloc(nb, sizeof(bool));
        kv->gen = calloc(nb, sizeof(uint32_t));
        kv->parent = malloc(nb * sizeof(int32_t));
        kv->parent_gen = calloc(nb, sizeof(uint32_t));
        kv->hash = calloc(nb, sizeof(uint64_t));
        kv->tokens = malloc(nb * (size_t)block_size * sizeof(int32_t));
        kv->bucket = malloc(kv->n_buckets * sizeof(int32_t));
        kv->bucket_next = malloc(nb * sizeof(int32_t));
        kv->lru_prev = malloc(nb * sizeof(int32_t));
        kv->lru_next = malloc(nb * sizeof(int32_t));
        if (!kv->cached || !kv->gen || !kv->parent || !kv->parent_gen || !kv->hash ||
            !kv->tokens || !kv->bucket || !kv->bucket_next || !kv->lru_prev || !kv->lru_next) {
            dol_kv_blocks_destroy(kv);
            return -1;
        }
        for (uint32_t i = 0; i < kv->n_buckets; i++) kv->bucket[i] = -1;
        kv->prefix_caching = true;
    }
    /* Stack with block 0 on top, so allocation order is 0, 1, 2, ... */
    for (int i = 0; i < n_blocks; i++) kv->free_list[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    return 0;
}

void dol_kv_blocks_destroy(dol_kv_blocks *kv)
{
    if (kv->seqs)
        for (int i = 0; i < kv->max_seqs; i++) free(kv->seqs[i].table);
    free(kv->free_list);
    free(kv->refs);
    free(kv->seqs);
    free(kv->cached);
    free(kv->gen);
    free(kv->parent);
    free(kv->parent_gen);
    free(kv->hash);
    free(kv->tokens);
    free(kv->bucket);
    free(kv->bucket_next);
    free(kv->lru_prev);
    free(kv->lru_next);
    memset(kv, 0, sizeof *kv);
}

int dol_kv_blocks_available(const dol_kv_blocks *kv) { return kv->n_free + kv->n_evictable; }

/* ---- the prefix cache's lists -------------------------------------------- */

static void lru_push(dol_kv_blocks *kv, int32_t b)
{
    kv->lru_prev[b] = kv->lru_tail;
    kv->lru_next[b] = -1;
    if (kv->lru_tail >= 0) kv->lru_next[kv->lru_tail] = b;
    else kv->lru_head = b;
    kv->lru_tail = b;
    kv->n_evictable++;
}

static void lru_remove(dol_kv_blocks *kv, int32_t b)
{
    int32_t p = kv->lru_prev[b], n = kv->lru_next[b];
    if (p >= 0) kv->lru_next[p] = n;
    else kv->lru_head = n;
    if (n >= 0) kv->lru_prev[n] = p;
    else kv->lru_tail = p;
    kv->n_evictable--;
}

/* Bucket of a block key: FNV-1a over (parent, parent_gen, tokens), then the
 * 64-bit finalizer of MurmurHash3 (public domain) to spread the bits. Only
 * for the search: a hit compares the key itself. */
static uint64_t block_hash(int32_t parent, uint32_t parent_gen, const int32_t *t, int n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    h = (h ^ (uint32_t)parent) * 0x100000001b3ULL;
    h = (h ^ parent_gen) * 0x100000001b3ULL;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)t[i]) * 0x100000001b3ULL;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* The cached block with this key, or -1. */
static int32_t cache_find(const dol_kv_blocks *kv, uint64_t h, int32_t parent, uint32_t parent_gen,
                          const int32_t *t)
{
    for (int32_t b = kv->bucket[h & (kv->n_buckets - 1)]; b >= 0; b = kv->bucket_next[b])
        if (kv->hash[b] == h && kv->parent[b] == parent && kv->parent_gen[b] == parent_gen &&
            memcmp(kv->tokens + (size_t)b * (size_t)kv->block_size, t,
                   sizeof(int32_t) * (size_t)kv->block_size) == 0)
            return b;
    return -1;
}

static void cache_insert(dol_kv_blocks *kv, int32_t b, uint64_t h, int32_t parent,
                         uint32_t parent_gen, const int32_t *t)
{
    kv->cached[b] = true;
    kv->hash[b] = h;
    kv->parent[b] = parent;
    kv->parent_gen[b] = parent_gen;
    memcpy(kv->tokens + (size_t)b * (size_t)kv->block_size, t,
           sizeof(int32_t) * (size_t)kv->block_size);
    int32_t *head = &kv->bucket[h & (kv->n_buckets - 1)];
    kv->bucket_next[b] = *head;
    *head = b;
}

/* Take b out of the cache (it is about to hold other K/V): its gen moves
 * on, so blocks cached after it no longer match. */
static void cache_remove(dol_kv_blocks *kv, int32_t b)
{
    int32_t *p = &kv->bucket[kv->hash[b] & (kv->n_buckets - 1)];
    while (*p != b) p = &kv->bucket_next[*p];
    *p = kv->bucket_next[b];
    kv->cached[b] = false;
    kv->gen[b]++;
}

/* A block to write into: a free one, else the least recently used
 * evictable cached one (evicted). -1 when there is none. */
static int32_t take_block(dol_kv_blocks *kv)
{
    int32_t b;
    if (kv->n_free > 0) {
        b = kv->free_list[--kv->n_free];
    } else if (kv->n_evictable > 0) {
        b = kv->lru_head;
        lru_remove(kv, b);
        cache_remove(kv, b);
    } else {
        return -1;
    }
    kv->refs[b] = 1;
    return b;
}

int dol_kv_seq_new(dol_kv_blocks *kv)
{
    for (int i = 0; i < kv->max_seqs; i++) {
        dol_kv_seq *s = &kv->seqs[i];
        if (!s->live) {
            s->live = true;
            s->n_tokens = 0;
            s->n_blocks = 0;
            s->n_chained = 0;
            s->chain_id = -1;
            s->chain_gen = 0;
            return i;
        }
    }
    return -1;
}

bool dol_kv_seq_live(const dol_kv_blocks *kv, int seq)
{
    return seq >= 0 && seq < kv->max_seqs && kv->seqs[seq].live;
}

static void unref(dol_kv_blocks *kv, int32_t b)
{
    if (--kv->refs[b] != 0) return;
    if (kv->prefix_caching && kv->cached[b]) lru_push(kv, b);
    else kv->free_list[kv->n_free++] = b;
}

void dol_kv_seq_free(dol_kv_blocks *kv, int seq)
{
    if (!dol_kv_seq_live(kv, seq)) return;
    dol_kv_seq *s = &kv->seqs[seq];
    /* last block first: cached blocks are evicted in this order, and a
     * prompt's later blocks are worth nothing without its first ones */
    for (int i = s->n_blocks - 1; i >= 0; i--) unref(kv, s->table[i]);
    s->n_blocks = 0;
    s->n_tokens = 0;
    s->n_chained = 0;
    s->chain_id = -1;
    s->live = false;
}

static int grow_table(dol_kv_seq *s, int need)
{
    if (need <= s->cap) return 0;
    int cap = s->cap ? s->cap : 8;
    while (cap < need) cap *= 2;
    int32_t *t = realloc(s->table, sizeof(int32_t) * (size_t)cap);
    if (!t) return -1;
    s->table = t;
    s->cap = cap;
    return 0;
}

int dol_kv_seq_reserve(dol_kv_blocks *kv, int seq, int n_tokens)
{
    if (!dol_kv_seq_live(kv, seq) || n_tokens < 0) return -1;
    dol_kv_seq *s = &kv->seqs[seq];
    int need = (n_tokens + kv->block_size - 1) / kv->block_size;
    if (need > s->n_blocks) {
        if (need - s->n_blocks > dol_kv_blocks_available(kv)) return -1;
        if (grow_table(s, need) != 0) return -1;
        while (s->n_blocks < need) s->table[s->n_blocks++] = take_block(kv);
    }
    if (n_tokens > s->n_tokens) s->n_tokens = n_tokens;
    return 0;
}

int dol_kv_seq_fork(dol_kv_blocks *kv, int src, int n_tokens,
                    int32_t *copy_src, int32_t *copy_dst)
{
    *copy_src = *copy_dst = -1;
    if (!dol_kv_seq_live(kv, src) || n_tokens > kv->seqs[src].n_tokens) return -1;
    int full = n_tokens / kv->block_size;
    int partial = n_tokens % kv->block_size != 0;
    if (partial && dol_kv_blocks_available(kv) < 1) return -1;
    int id = dol_kv_seq_new(kv);
    if (id < 0) return -1;
    dol_kv_seq *d = &kv->seqs[id];
    dol_kv_seq *s = &kv->seqs[src];
    if (grow_table(d, full + partial) != 0) {
        d->live = false;
        return -1;
    }
    for (int i = 0; i < full; i++) {
        d->table[i] = s->table[i];
        kv->refs[s->table[i]]++;
    }
    d->n_blocks = full;
    if (partial) {
        int32_t b = take_block(kv);
        d->table[d->n_blocks++] = b;
        *copy_src = s->table[full];
        *copy_dst = b;
    }
    d->n_tokens = n_tokens;
    return id;
}

/* ---- prefix cache -------------------------------------------------------- */

/* The cached block holding tokens t[0..block_size) right after s's chain
 * (-1 if none); *h gets the key's hash, for cache_insert. */
static int32_t chain_find(const dol_kv_blocks *kv, const dol_kv_seq *s, const int32_t *t,
                          uint64_t *h)
{
    *h = block_hash(s->chain_id, s->chain_gen, t, kv->block_size);
    return cache_find(kv, *h, s->chain_id, s->chain_gen, t);
}

int dol_kv_seq_match_prefix(dol_kv_blocks *kv, int seq, const int32_t *tokens, int n)
{
    if (!kv->prefix_caching || !dol_kv_seq_live(kv, seq) || n < 2) return 0;
    dol_kv_seq *s = &kv->seqs[seq];
    if (s->n_blocks != 0 || s->n_tokens != 0) return 0;
    const int bs = kv->block_size;
    const int most = (n - 1) / bs; /* whole blocks, one token left to compute */
    int j = 0;
    for (; j < most; j++) {
        const int32_t *t = tokens + (size_t)j * (size_t)bs;
        uint64_t h;
        int32_t b = chain_find(kv, s, t, &h);
        if (b < 0 || grow_table(s, j + 1) != 0) break;
        if (kv->refs[b] == 0) lru_remove(kv, b);
        kv->refs[b]++;
        s->table[s->n_blocks++] = b;
        s->chain_id = b;
        s->chain_gen = kv->gen[b];
    }
    s->n_chained = j;
    s->n_tokens = j * bs;
    return j * bs;
}

void dol_kv_seq_commit(dol_kv_blocks *kv, int seq, const int32_t *tokens, int n)
{
    if (!kv->prefix_caching || !dol_kv_seq_live(kv, seq)) return;
    dol_kv_seq *s = &kv->seqs[seq];
    const int bs = kv->block_size;
    int full = n / bs;
    if (full > s->n_blocks) full = s->n_blocks;
    for (int j = s->n_chained; j < full; j++) {
        const int32_t *t = tokens + (size_t)j * (size_t)bs;
        uint64_t h;
        int32_t b = chain_find(kv, s, t, &h);
        if (b < 0) {
            /* not known yet: this sequence's own block becomes the cached
             * one (unless it already is, under an older key: a block
             * shared by a fork, whose chain was cut by an eviction) */
            b = s->table[j];
            if (!kv->cached[b]) cache_insert(kv, b, h, s->chain_id, s->chain_gen, t);
        }
        s->chain_id = b;
        s->chain_gen = kv->gen[b];
        s->n_chained = j + 1;
    }
}
