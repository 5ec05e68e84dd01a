/* src/engine/kv_blocks.h — bookkeeping of the paged KV cache, shared by all
 * backends: a pool of fixed-size blocks with reference counts and a free
 * list, one block table per sequence (PagedAttention, Kwon et al. 2023), and
 * the prefix cache: full blocks whose K/V are known, found again by their
 * tokens and kept after their sequences end until the pool needs them (the
 * automatic prefix caching of vLLM). The backend owns the memory the block
 * ids index into. */
#ifndef DOLPHIN_ENGINE_KV_BLOCKS_H
#define DOLPHIN_ENGINE_KV_BLOCKS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    bool live;
    int n_tokens;      /* positions with K/V written or reserved */
    int n_blocks;      /* entries used in table */
    int cap;           /* entries allocated in table */
    int32_t *table;    /* block ids, position p lives in table[p / block_size] */
    /* prefix cache: the first n_chained blocks of this sequence's tokens
     * are known to the cache; chain_id / chain_gen name the cached block
     * that holds the last of them (-1 before the first) */
    int n_chained;
    int32_t chain_id;
    uint32_t chain_gen;
} dol_kv_seq;

typedef struct {
    int block_size;    /* tokens per block */
    int n_blocks;      /* pool size */
    int n_free;        /* blocks on the free list (holding nothing) */
    int32_t *free_list;/* stack of free block ids */
    int32_t *refs;     /* per block: sequences referencing it */
    int max_seqs;
    dol_kv_seq *seqs;

    /* Prefix cache (all NULL / 0 when disabled). A cached block holds the
     * K/V of block_size tokens at a fixed place in a prompt: `tokens` are
     * its token ids and (parent, parent_gen) the cached block before it
     * (-1 for the first block of a sequence). A block's gen changes each
     * time it leaves the cache, so a child whose parent was evicted and
     * reused no longer matches: a hit is exact, the hash only speeds the
     * search. Cached blocks no sequence holds (refs 0) sit on an LRU list
     * and count as available; they are taken, oldest first, only when the
     * free list is empty. */
    bool prefix_caching;
    bool *cached;
    uint32_t *gen;
    int32_t *parent;
    uint32_t *parent_gen;
    uint64_t *hash;
    int32_t *tokens;      /* n_blocks x block_size */
    int32_t *bucket;      /* n_buckets heads of the hash chains */
    int32_t *bucket_next; /* per block */
    uint32_t n_buckets;   /* power of two */
    int32_t *lru_prev, *lru_next; /* the evictable cached blocks, oldest at lru_head */
    int32_t lru_head, lru_tail;
    int n_evictable;
} dol_kv_blocks;

/* prefix_caching: keep full blocks for later prompts that start the same way. */
int dol_kv_blocks_init(dol_kv_blocks *kv, int n_blocks, int block_size, int max_seqs,
                       bool prefix_caching);
void dol_kv_blocks_destroy(dol_kv_blocks *kv);
/* Blocks a sequence can still take: free ones plus evictable cached ones. */
int dol_kv_blocks_available(const dol_kv_blocks *kv);
/* New sequence id or -1. */
int dol_kv_seq_new(dol_kv_blocks *kv);
void dol_kv_seq_free(dol_kv_blocks *kv, int seq);
/* Ensure blocks for positions [0, n_tokens): 0, or -1 with nothing changed. */
int dol_kv_seq_reserve(dol_kv_blocks *kv, int seq, int n_tokens);
/* New sequence sharing src's full blocks below n_tokens. When n_tokens ends
 * inside a block, a fresh block is taken for it and its id is returned in
 * *copy_src / *copy_dst (the backend copies the first n_tokens % block_size
 * rows); otherwise both are -1. Returns the id or -1. */
int dol_kv_seq_fork(dol_kv_blocks *kv, int src, int n_tokens,
                    int32_t *copy_src, int32_t *copy_dst);
bool dol_kv_seq_live(const dol_kv_blocks *kv, int seq);
/* Prefix cache lookup for a new, empty sequence about to hold tokens
 * [0, n): shares the cached blocks that hold its longest cached prefix of
 * whole blocks, leaving at least one token to compute (its logits are
 * wanted). Returns the tokens found (a multiple of block_size; 0 when
 * disabled or on a miss); the sequence then has K/V for them. */
int dol_kv_seq_match_prefix(dol_kv_blocks *kv, int seq, const int32_t *tokens, int n);
/* Offer the full blocks among positions [0, n) of `seq`, whose K/V have
 * been computed from tokens[0..n), to the prefix cache. Blocks already
 * offered are skipped, so calling it after every step is cheap. */
void dol_kv_seq_commit(dol_kv_blocks *kv, int seq, const int32_t *tokens, int n);

#endif
