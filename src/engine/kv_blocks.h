/* src/engine/kv_blocks.h — bookkeeping of the paged KV cache, shared by all
 * backends: a pool of fixed-size blocks with reference counts and a free
 * list, and one block table per sequence (PagedAttention, Kwon et al. 2023).
 * The backend owns the memory the block ids index into. */
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
} dol_kv_seq;

typedef struct {
    int block_size;    /* tokens per block */
    int n_blocks;      /* pool size */
    int n_free;
    int32_t *free_list;/* stack of free block ids */
    int32_t *refs;     /* per block: sequences referencing it */
    int max_seqs;
    dol_kv_seq *seqs;
} dol_kv_blocks;

int dol_kv_blocks_init(dol_kv_blocks *kv, int n_blocks, int block_size, int max_seqs);
void dol_kv_blocks_destroy(dol_kv_blocks *kv);
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

#endif
