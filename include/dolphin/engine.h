/* include/dolphin/engine.h — the inference engine: one batched forward pass
 * over the Llama decoder with a paged KV cache. The CPU backend
 * (src/engine/cpu_engine.c) is the reference implementation of this
 * interface; a CUDA backend implements the same calls.
 *
 * Terms: a *sequence* is one stream of tokens with its own KV cache (one per
 * completion choice). Its KV cache is a *block table*: a list of fixed-size
 * blocks (block_size tokens each) taken from one pool; blocks are
 * reference-counted so sequences forked from the same prompt share the
 * prompt's full blocks.
 *
 * Threading: an engine is used by one thread at a time (the scheduler
 * thread). The forward pass spreads its matrix products over the engine's
 * own thread pool, created once in dol_engine_create.
 */
#ifndef DOLPHIN_ENGINE_H
#define DOLPHIN_ENGINE_H

#include "dolphin/common.h"
#include "dolphin/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How linear-layer weights (q, k, v, o, gate, up, down, lm_head) are held
 * in memory. The embedding and the norms always keep their precision. */
typedef enum {
    DOL_WEIGHTS_AUTO = 0, /* keep the checkpoint's F32/F16/BF16 (CPU; the CUDA
                             backend holds FP16) */
    DOL_WEIGHTS_F32,      /* convert every linear layer to F32 at load */
    DOL_WEIGHTS_F16,      /* convert every linear layer to F16 at load */
    DOL_WEIGHTS_NF4,      /* quantize every linear layer to 4-bit NormalFloat at
                             load (QLoRA's NF4: blocks of 64 weights along the
                             input dimension, one F16 absmax scale per block,
                             0.53125 bytes per weight; src/engine/nf4.h), on
                             the engine's thread pool; lm_head only when
                             quantize_lm_head. Products dequantize in registers
                             and accumulate in F32. */
    DOL_WEIGHTS_INT8,     /* quantize every linear layer to 8 bits at load
                             (llama.cpp's Q8_0 scheme: blocks of 32 weights
                             along the input dimension, one F16 scale
                             absmax/127 per block, 1.0625 bytes per weight;
                             src/engine/q8.h); lm_head only when
                             quantize_lm_head. Products dequantize in
                             registers and accumulate in F32. */
} dol_weight_format;

/* The arithmetic of the CPU's products over quantized weights
 * (activations, docs/configuration.md; the design and the accuracy:
 * docs/performance.md, "8-bit activations"). */
typedef enum {
    DOL_ACT_AUTO = 0,         /* INT8 where an int8 kernel set runs (measured
                                 ahead of F32 on every figure,
                                 docs/performance.md, "8-bit activations"),
                                 else F32, without a warning */
    DOL_ACT_F32,              /* the exact products: F32 activations times the
                                 dequantized weights */
    DOL_ACT_INT8,             /* each row of x quantized to int8 in blocks of 32
                                 (scale absmax / 127) and integer dot products
                                 (src/engine/cpu_i8.h); F32 on a CPU without an
                                 int8 kernel set (one warning line) */
} dol_activations;

/* Which backend runs the forward pass. */
typedef enum {
    DOL_BACKEND_AUTO = 0,     /* CUDA when built in and a device is usable, else CPU */
    DOL_BACKEND_CPU,
    DOL_BACKEND_CUDA,
} dol_backend_kind;

/* Most CUDA devices one engine spreads a model over. */
#define DOL_MAX_DEVICES 8

/* Element type of the KV cache (kv_cache_dtype, docs/configuration.md,
 * "The KV pool"). */
typedef enum {
    DOL_KV_AUTO = 0,          /* F32 with F32 weights on the CPU, F16 otherwise */
    DOL_KV_F32,
    DOL_KV_F16,
    DOL_KV_Q8_0,              /* int8 values in blocks of 32 along a head's
                                 dimension (the whole head below 32), one F16
                                 scale absmax / 127 a block: include/dolphin/kv_q8.h */
} dol_kv_dtype;

typedef struct {
    dol_backend_kind backend;
    double gpu_memory_utilization; /* CUDA: share of device memory Dolphin may
                                   use for weights + KV cache + workspaces
                                   (default 0.90) */
    int n_threads;            /* threads of the matmul pool (>= 1) */
    int kv_block_size;        /* tokens per KV block (>= 1) */
    int64_t kv_cache_tokens;  /* pool capacity in tokens, rounded up to whole
                                 blocks; 0 = derive from kv_cache_bytes */
    int64_t kv_cache_bytes;   /* used when kv_cache_tokens == 0; 0 = the
                                 backend's default (CPU: kv_memory_fraction
                                 of the memory available once the weights
                                 are held, at most max_seqs full contexts,
                                 at least one) */
    double kv_memory_fraction;/* CPU default pool: share of MemAvailable
                                 (0 = 0.9) */
    dol_kv_dtype kv_dtype;    /* both halves of the cache (AUTO resolved by
                                 dol_engine_create); CUDA holds F16 or Q8_0
                                 (F32 asked gives F16) */
    dol_kv_dtype kv_dtype_k;  /* the K half alone; AUTO = as kv_dtype */
    dol_kv_dtype kv_dtype_v;  /* the V half alone; AUTO = as kv_dtype. A
                                 backend's create sees both resolved (never
                                 AUTO); Q8_0 needs head_dim < 32 or a multiple
                                 of 32 (else dol_engine_create returns -2,
                                 naming the setting) */
    int max_seqs;             /* max live sequences (block tables), >= 1 */
    int max_batch_tokens;     /* max tokens in one forward call (workspace), >= 1 */
    int context_len;          /* max positions per sequence; 0 = model's
                                 max_position_embeddings */
    dol_weight_format weights;
    bool prefix_caching;      /* keep the K/V of whole prompt blocks after
                                 their sequences end and share them with
                                 later prompts that start with the same
                                 tokens (dol_engine_seq_match_prefix);
                                 {0} means off */
    bool quantize_lm_head;    /* weights NF4 / INT8: quantize lm_head too
                                 (false, the default, keeps it as AUTO would:
                                 the checkpoint's F32/F16/BF16, as
                                 bitsandbytes' load_in_4bit does). Other
                                 formats ignore it. */
    /* Layer placement (CUDA; docs/architecture.md "Layer placement"): the
     * transformer blocks in contiguous ranges, device by device, then the
     * CPU. {0}: device 0, every block that fits there, the rest on the CPU. */
    int n_devices;            /* entries of devices; 0 = device 0 alone */
    int devices[DOL_MAX_DEVICES];     /* CUDA device ids, in pipeline order */
    int n_layer_split;        /* entries of layer_split (= n_devices); 0 = automatic */
    int layer_split[DOL_MAX_DEVICES]; /* blocks per device, each >= 1 */
    bool gpu_layers_set;      /* gpu_layers is given */
    int gpu_layers;           /* the first N blocks on the GPU(s), the rest on the CPU */
    bool no_host_spill;       /* refuse to start rather than put blocks on the
                                 CPU that were not asked there ({0}: spill) */
    bool fast_prefill;        /* CPU: products of 16 or more rows of x (prefill)
                                 may run on AMX where the CPU has it
                                 (src/engine/cpu_amx.h): AMX-INT8 for weights
                                 on 8-bit activations, else BF16x3 (each
                                 product within ~2^-16 of the exact one,
                                 relative to sum |x w|); outputs are no longer
                                 batch-invariant bit for bit.
                                 {0}: off (batch_invariant: true) */
    dol_activations activations; /* CPU, quantized weights (NF4, INT8, GGUF's
                                 block types): the products' arithmetic
                                 ({0}: AUTO). F32/F16/BF16 weights and the
                                 CUDA backend ignore it. */
    const char *weights_cache_dir; /* CPU: folder of the prepared-weights cache
                                 (docs/configuration.md); NULL or "" = off.
                                 Read during dol_engine_create only. The CUDA
                                 backend ignores it. */
} dol_engine_params;

typedef struct dol_engine dol_engine;

/* Build an engine over a loaded model (the model must outlive the engine).
 * Allocates the KV pool and workspaces up front. -1 with one line in err
 * (e.g. the KV pool does not fit in memory); -2 when a setting is at fault
 * and no run could succeed with it (an impossible layer_split or
 * gpu_layers, an unknown device, a spill refused by no_host_spill): the
 * line names the device and the bytes. */
int dol_engine_create(const dol_model *model, const dol_engine_params *p,
                      dol_engine **out, char *err, size_t errlen);
void dol_engine_free(dol_engine *e);

/* "cpu" or "cuda": the backend actually in use. */
const char *dol_engine_backend_name(const dol_engine *e);
/* The CPU SIMD kernel set this process uses: "portable", "avx2" or
 * "avx512", chosen from cpuid at the first call (or any CPU kernel use);
 * the environment variable DOLPHIN_CPU_KERNELS overrides the choice. */
const char *dol_engine_cpu_kernels(void);
/* The arithmetic of the engine's products over quantized weights:
 * "int8" (8-bit activations, the CPU backend with quantized weights and an
 * int8 kernel set), "f32" (the exact CPU products), "f16" (CUDA's FP16
 * activations) or "f16+int8" (CUDA with blocks placed on the host that run
 * 8-bit activations). A static string; the engine's own thread or any
 * other. */
const char *dol_engine_activations(const dol_engine *e);
/* Device memory of the backend in bytes (CUDA: cudaMemGetInfo; CPU: the KV
 * pool, so readiness logic is testable without a GPU). 0 / -1. */
int dol_engine_memory_info(const dol_engine *e, size_t *used, size_t *total);
/* Memory of one device the engine uses. */
typedef struct {
    char name[16];            /* "cuda:0", "cuda:1", "cpu" */
    int first_block, n_blocks;  /* the transformer blocks held there */
    bool embed, head;         /* holds the embedding; the final norm + lm_head */
    size_t used, total;       /* CUDA: the whole device (cudaMemGetInfo); CPU: the
                                 KV pool in use and in all */
    size_t weight_bytes;      /* weights held there */
    size_t kv_bytes;          /* its KV cache (every block of the pool, its layers) */
    size_t step_read_bytes;   /* bytes read per decode step of one sequence,
                                 KV aside: the weights of its blocks and head */
} dol_device_memory;

/* The devices of the engine, in pipeline order: one entry per device that
 * holds part of the model. Fills at most max entries; returns the count. */
int dol_engine_devices(const dol_engine *e, dol_device_memory *out, int max);

/* The share of time (0..1) over NVML's last sample period during which a
 * kernel ran on the GPU of the CUDA backend; -1 when unknown (no NVML, the
 * CPU backend, or a build without CUDA). Thread-safe. */
double dol_engine_gpu_utilization(const dol_engine *e);
/* True when the CUDA backend was compiled in. */
bool dol_engine_cuda_built(void);

/* Context length in tokens (positions 0..n-1). */
int dol_engine_context_len(const dol_engine *e);
/* The KV cache's element type in use: "f32", "f16" or "q8_0" when both
 * halves agree, else "k=<k>,v=<v>" (a static string). */
const char *dol_engine_kv_dtype_name(const dol_engine *e);
/* The element type of the K half (which = 0) or the V half (1) in use. */
dol_kv_dtype dol_engine_kv_dtype(const dol_engine *e, int which);
/* The name of a resolved element type: "f32", "f16", "q8_0" ("auto" for
 * DOL_KV_AUTO); a static string. */
const char *dol_kv_dtype_str(dol_kv_dtype t);
/* Bytes one position of one KV head takes in one half of a cache of type t
 * (F32 4 * head_dim, F16 2 * head_dim, Q8_0 head_dim + 2 per block of
 * dol_kv_q8_block(head_dim) values); 0 for AUTO or a head dimension Q8_0
 * cannot hold. */
size_t dol_kv_head_row_bytes(dol_kv_dtype t, int head_dim);
int dol_engine_vocab_size(const dol_engine *e);
/* The most tokens one dol_engine_forward call takes (all items together):
 * the params' max_batch_tokens. */
int dol_engine_max_batch_tokens(const dol_engine *e);

/* ---- sequences and the paged KV cache ---------------------------------- */

/* New empty sequence; returns its id (>= 0), or -1 when max_seqs are live. */
int dol_engine_seq_new(dol_engine *e);
/* Release a sequence and return its blocks (those no other sequence shares)
 * to the free list. Safe on an id that is not live (no-op). */
void dol_engine_seq_free(dol_engine *e, int seq);
/* New sequence holding the first n_tokens of `src`'s KV cache (full blocks
 * shared by reference, a partial last block copied). Returns the id, or -1
 * when no sequence slot or block is free. */
int dol_engine_seq_fork(dol_engine *e, int src, int n_tokens);
/* Make sure the sequence has blocks for positions [0, n_tokens). Returns 0,
 * or -1 (nothing allocated) when the free list has too few blocks. */
int dol_engine_seq_reserve(dol_engine *e, int seq, int n_tokens);
/* Prefix cache (params.prefix_caching; both are no-ops when it is off).
 * A block of the pool is cached once a sequence has computed the K/V of all
 * its kv_block_size positions and offered it with dol_engine_seq_commit; it
 * is then keyed by its tokens and by the cached block before it, so a hit
 * is exact: the K/V of a position depend only on the tokens up to it, and
 * a cached block stands only for the same tokens after the same cached
 * blocks. (On the CPU backend the cached K/V are the bits the sequence
 * would compute itself, in any batch; on CUDA they may differ from them by
 * the rounding described at dol_engine_forward.) Cached blocks that no
 * sequence holds stay in the pool until a sequence needs a block and the
 * free list is empty; then the least recently released goes first
 * (the automatic prefix caching of vLLM, Kwon et al. 2023).
 *
 * match_prefix: for a new sequence (nothing reserved yet) about to hold
 * tokens[0..n_tokens): takes the cached blocks of its longest cached
 * prefix of whole blocks, never all n_tokens (the last token's logits must
 * be computed). Returns the number of tokens (a multiple of the block size,
 * 0 on a miss) whose K/V the sequence now holds; compute from there.
 * commit: offers the whole blocks among positions [0, n_tokens) of seq,
 * whose K/V have been computed from tokens[0..n_tokens), to the cache;
 * blocks offered before are skipped (cheap to call after every step). */
int dol_engine_seq_match_prefix(dol_engine *e, int seq, const int32_t *tokens, int n_tokens);
void dol_engine_seq_commit(dol_engine *e, int seq, const int32_t *tokens, int n_tokens);
/* True when the engine was created with prefix_caching. */
bool dol_engine_kv_prefix_caching(const dol_engine *e);
/* Blocks needed to hold n_tokens; the pool's size; the blocks a sequence
 * can still take (free ones, plus cached ones that no sequence holds, which
 * are evicted when taken); and how many of those are cached. */
int dol_engine_blocks_for(const dol_engine *e, int n_tokens);
int dol_engine_kv_blocks_total(const dol_engine *e);
int dol_engine_kv_blocks_free(const dol_engine *e);
int dol_engine_kv_blocks_cached(const dol_engine *e);
int dol_engine_kv_block_size(const dol_engine *e);
/* Bytes of KV cache per token (all layers, K and V). */
size_t dol_engine_kv_bytes_per_token(const dol_engine *e);
/* Resident bytes of weights as the engine holds them. */
size_t dol_engine_weight_bytes(const dol_engine *e);

/* The linear layers (q, k, v, o, gate, up, down of every layer, and lm_head)
 * as the engine holds them, and what load-time quantization cost. */
typedef struct {
    int n_quantized;            /* matrices quantized at load (0 unless NF4 / INT8) */
    double quant_seconds;       /* wall time spent quantizing them */
    size_t quant_bytes_before;  /* those matrices as stored in the checkpoint */
    size_t quant_bytes_after;   /* the same matrices quantized (codes + scales) */
    size_t linear_bytes;        /* every linear layer, resident, as held */
    size_t linear_f16_bytes;    /* every linear layer at 2 bytes per weight:
                                   linear_bytes / linear_f16_bytes is the
                                   memory ratio against F16 */
} dol_quant_stats;

/* Fill *out for this engine (all zero for a backend that does not report). */
void dol_engine_quant_stats(const dol_engine *e, dol_quant_stats *out);

/* ---- the forward pass --------------------------------------------------- */

/* One sequence's share of a forward call: n_tokens tokens at positions
 * start_pos .. start_pos+n_tokens-1 (a prefill chunk, or one decode token).
 * The sequence's KV cache must already hold positions 0..start_pos-1 and have
 * blocks reserved up to start_pos+n_tokens (dol_engine_seq_reserve).
 * n_logits: 0 = none, 1 = logits of the last token only, n_tokens = logits of
 * every token (echo with logprobs). logits: caller-owned
 * [n_logits][vocab_size] floats, row-major. */
typedef struct {
    int seq;
    int n_tokens;
    const int32_t *tokens;
    int start_pos;
    int n_logits;
    float *logits;
} dol_batch_item;

/* Run the decoder over all items at once: every weight matrix is read once
 * per call for the whole batch (matrix-matrix products over the concatenated
 * tokens, no padding). Writes K/V of the new tokens into each sequence's
 * blocks and the requested logits. -1 with err on invalid input (unknown
 * sequence, position past the context, too many tokens).
 *
 * Batch invariance. On the CPU backend an item's results do not depend on
 * the other items, on how its prompt was split into calls, or on how the
 * rows were split between threads: the same bits, within one CPU kernel set
 * (tested). On the CUDA backend they are not bit-identical: cuBLAS may
 * choose another algorithm, hence another summation order, when the number
 * of rows changes (and with NF4 or int8 weights a call of more than 16 rows
 * takes another product), so an item's logits can differ from its logits
 * alone by rounding (about 1e-6 relative; about 1e-3 with NF4 or int8 across
 * the 16-row switch). Greedy tokens then agree except at near-ties: the CUDA tests ask
 * for the same greedy ids up to the first step whose top two logits are
 * less than 1e-3 apart (docs/cuda.md). */
int dol_engine_forward(dol_engine *e, dol_batch_item *items, int n_items,
                       char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
