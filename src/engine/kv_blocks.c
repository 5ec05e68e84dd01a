/* src/engine/kv_blocks.c — block allocator and block tables of the paged KV
 * cache (see kv_blocks.h). Blocks are reference-counted so that sequences
 * forked from one prompt (n > 1) share its full blocks; a block goes back to
 * the free list when its last sequence lets go. */
#include "engine/kv_blocks.h"

#include <stdlib.h>
#include <string.h>

int dol_kv_blocks_init(dol_kv_blocks *kv, int n_blocks, int block_size, int max_seqs)
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
    memset(kv, 0, sizeof *kv);
}

int dol_kv_seq_new(dol_kv_blocks *kv)
{
    for (int i = 0; i < kv->max_seqs; i++) {
        dol_kv_seq *s = &kv->seqs[i];
        if (!s->live) {
            s->live = true;
            s->n_tokens = 0;
            s->n_blocks = 0;
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
    if (--kv->refs[b] == 0) kv->free_list[kv->n_free++] = b;
}

void dol_kv_seq_free(dol_kv_blocks *kv, int seq)
{
    if (!dol_kv_seq_live(kv, seq)) return;
    dol_kv_seq *s = &kv->seqs[seq];
    for (int i = 0; i < s->n_blocks; i++) unref(kv, s->table[i]);
    s->n_blocks = 0;
    s->n_tokens = 0;
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
        if (need - s->n_blocks > kv->n_free) return -1;
        if (grow_table(s, need) != 0) return -1;
        while (s->n_blocks < need) {
            int32_t b = kv->free_list[--kv->n_free];
            kv->refs[b] = 1;
            s->table[s->n_blocks++] = b;
        }
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
    if (partial && kv->n_free < 1) return -1;
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
        int32_t b = kv->free_list[--kv->n_free];
        kv->refs[b] = 1;
        d->table[d->n_blocks++] = b;
        *copy_src = s->table[full];
        *copy_dst = b;
    }
    d->n_tokens = n_tokens;
    return id;
}
