/* src/engine/backend.h — what a compute backend provides to the generic
 * engine (src/engine/engine.c). The engine owns the KV-cache bookkeeping
 * (block allocator, block tables: kv_blocks.h) and validates every forward
 * call; a backend owns the weights as it holds them, the KV-cache memory the
 * block ids index into, and the forward pass itself. */
#ifndef DOLPHIN_ENGINE_BACKEND_H
#define DOLPHIN_ENGINE_BACKEND_H

#include "dolphin/engine.h"
#include "engine/kv_blocks.h"

/* The part of the model one backend instance holds (layer placement,
 * docs/architecture.md "Layer placement"): transformer blocks [l0, l1) and
 * their KV cache, the embedding when `embed` (then l0 == 0), the final norm
 * and lm_head when `head`. The whole model is {0, n_layers, true, true}. */
typedef struct {
    int l0, l1;
    bool embed, head;
    int device;                 /* CUDA device id (the CPU ignores it) */
} dol_layer_range;

/* One forward call, already validated and flattened by the engine: T token
 * rows in item order; tok_id/tok_seq/tok_pos[T] describe each row. */
typedef struct {
    const dol_batch_item *items;
    int n_items;
    int T;
    const int32_t *tok_id, *tok_seq, *tok_pos;
    const dol_kv_blocks *kv;    /* block tables of every sequence */
    /* A partial range only (all NULL / 0 for the whole model). The residual
     * stream [T][hidden_size] FP32 crosses a range boundary once per step:
     * h_in is what the previous range left (host memory, pinned when a CUDA
     * range shares it), or, when peer_in is set, the previous CUDA range's
     * device buffer on device peer_dev (a peer copy). A range without the
     * head writes h_out (host), or keeps the stream on its device for the
     * next range's peer copy when h_out is NULL. head_only: skip the blocks,
     * run the final norm and lm_head on h_in / peer_in (the head sits on the
     * last GPU while the CPU runs the last blocks). */
    const float *h_in;
    float *h_out;
    const void *peer_in;
    int peer_dev;
    bool head_only;
} dol_forward_args;

typedef struct {
    const char *name;
    /* The backend holds no F32 KV cache: a half resolved to F32 (asked,
     * or AUTO with F32 weights) is held as F16. create sees the resolved
     * params.kv_dtype_k / kv_dtype_v (F32, F16 or Q8_0, never AUTO). */
    bool kv_no_f32;
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
    /* dol_engine_activations; NULL: "f16" for a backend named cuda, else "f32". */
    const char *(*activations)(void *impl);

    /* Layer placement (src/engine/placement.c); NULL where a backend (the
     * scheduler tests' fake) only runs whole models. */
    /* create for a part of the model (create is the whole-model case) */
    int (*create_range)(const dol_model *m, const dol_engine_params *p, int ctx, int block_size,
                        const dol_layer_range *r, int *n_blocks, void **impl, char *err,
                        size_t errlen);
    /* Bytes create_range would allocate on the device for r, KV cache
     * aside: weights as held plus workspaces. SIZE_MAX, with the reason in
     * err, when create_range would refuse the model or the settings. */
    size_t (*range_bytes)(const dol_model *m, const dol_engine_params *p, int ctx, int block_size,
                          const dol_layer_range *r, char *err, size_t errlen);
    /* Device memory Dolphin may use on `device`: gpu_memory_utilization of
     * its total, less what is in use and the runtime's reserve. NULL: no
     * limit (host memory). 0 / -1 with err. */
    int (*device_budget)(int device, double utilization, size_t *avail, size_t *total, char *err,
                         size_t errlen);
    /* The device buffer holding the residual stream after a forward call
     * with h_out NULL (for the next range's peer copy); NULL on the CPU. */
    const void *(*hidden_dev)(void *impl);
} dol_backend_ops;

/* dol_engine_create with a given backend (the scheduler's unit tests pass a
 * fake one); the same parameters, errors and ownership. */
int dol_engine_create_with(const dol_backend_ops *ops, const dol_model *model,
                           const dol_engine_params *p, dol_engine **out, char *err,
                           size_t errlen);

extern const dol_backend_ops dol_cpu_backend;
#ifdef DOLPHIN_HAVE_CUDA
extern const dol_backend_ops dol_cuda_backend;
/* CUDA devices visible (0 when none or on error). */
int dol_cuda_device_count(void);
/* True when device a can read device b's memory directly (peer access,
 * enabled by this call); false means copies go through pinned host memory. */
bool dol_cuda_peer_enable(int a, int b);
/* Pinned host memory (cudaMallocHost) and its release. */
void *dol_cuda_host_alloc(size_t bytes);
void dol_cuda_host_free(void *p);
/* True when a CUDA device is present and usable; logs why not otherwise. */
bool dol_cuda_device_usable(void);
/* The same check, silent: why holds the reason (the CUDA error string, the
 * device and its compute capability), or the device used. */
bool dol_cuda_device_check(char *why, size_t n);
#endif

#endif
