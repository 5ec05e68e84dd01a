/* src/engine/backend.h — what a compute backend provides to the generic
 * engine (src/engine/engine.c). The engine owns the KV-cache bookkeeping
 * (block allocator, block tables: kv_blocks.h) and validates every forward
 * call; a backend owns the weights as it holds them, the KV-cache memory the
 * block ids index into, and the forward pass itself. */
#ifndef DOLPHIN_ENGINE_BACKEND_H
#define DOLPHIN_ENGINE_BACKEND_H

#include "dolphin/engine.h"
#include "engine/kv_blocks.h"

/* One forward call, already validated and flattened by the engine: T token
 * rows in item order; tok_id/tok_seq/tok_pos[T] describe each row. */
typedef struct {
    const dol_batch_item *items;
    int n_items;
    int T;
    const int32_t *tok_id, *tok_seq, *tok_pos;
    const dol_kv_blocks *kv;    /* block tables of every sequence */
} dol_forward_args;

typedef struct {
    const char *name;
    /* Bytes of one K or V element in this backend's KV cache (4 = F32,
     * 2 = F16; 0 = as the resolved kv_dtype says): kv_cache_bytes is
     * turned into tokens with it. */
    int kv_elem_bytes;
    /* Prepare weights and workspaces, and allocate the KV pool. *n_blocks:
     * in: blocks wanted (from kv_cache_tokens / kv_cache_bytes, or 0 = let
     * the backend size it from its memory budget); out: blocks allocated. */
    int (*create)(const dol_model *m, const dol_engine_params *p, int ctx,
                  int block_size, int *n_blocks, void **impl, char *err, size_t errlen);
    void (*destroy)(void *impl);
    int (*forward)(void *impl, const dol_forward_args *a, char *err, size_t errlen);
    /* Copy the first `rows` rows of every layer's K and V from block src to dst. */
    void (*copy_block)(void *impl, int32_t src, int32_t dst, int rows);
    size_t (*weight_bytes)(void *impl);
    /* Linear-layer sizes and load-time quantization figures; may be NULL
     * (dol_engine_quant_stats then reports zeros). */
    void (*quant_stats)(void *impl, dol_quant_stats *out);
    size_t (*kv_bytes_per_token)(void *impl);
    int (*memory_info)(void *impl, size_t *used, size_t *total);
} dol_backend_ops;

/* dol_engine_create with a given backend (the scheduler's unit tests pass a
 * fake one); the same parameters, errors and ownership. */
int dol_engine_create_with(const dol_backend_ops *ops, const dol_model *model,
                           const dol_engine_params *p, dol_engine **out, char *err,
                           size_t errlen);

extern const dol_backend_ops dol_cpu_backend;
#ifdef DOLPHIN_HAVE_CUDA
extern const dol_backend_ops dol_cuda_backend;
/* True when a CUDA device is present and usable; logs why not otherwise. */
bool dol_cuda_device_usable(void);
/* The same check, silent: why holds the reason (the CUDA error string, the
 * device and its compute capability), or the device used. */
bool dol_cuda_device_check(char *why, size_t n);
#endif

#endif
