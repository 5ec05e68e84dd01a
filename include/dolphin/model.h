/* include/dolphin/model.h — a Llama checkpoint in memory, memory-mapped:
 * a Hugging Face directory (config.json, safetensors: one file or shards
 * with an index), or one GGUF file (include/dolphin/gguf.h; the llama.*
 * keys, its tensors and its tokenizer; src/model/gguf_llama.c).
 *
 * Reference: Hugging Face's LlamaForCausalLM layout. Tensor names are its own
 * (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ...).
 * All matrices are row-major as stored by PyTorch's nn.Linear: a weight of
 * shape [out_features, in_features], so y = W x means
 * y[o] = sum_i W[o][i] * x[i].
 */
#ifndef DOLPHIN_MODEL_H
#define DOLPHIN_MODEL_H

#include "dolphin/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of tensors: three plain ones, and the block-quantized
 * types of GGUF files (layouts and exact dequantization in
 * include/dolphin/ggml_blocks.h; only GGUF models hold them). */
typedef enum {
    DOL_DTYPE_F32 = 0,
    DOL_DTYPE_F16 = 1,
    DOL_DTYPE_BF16 = 2,
    DOL_DTYPE_Q8_0 = 3,
    DOL_DTYPE_Q4_0 = 4,
    DOL_DTYPE_Q4_1 = 5,
    DOL_DTYPE_Q5_0 = 6,
    DOL_DTYPE_Q5_1 = 7,
    DOL_DTYPE_Q2_K = 8,
    DOL_DTYPE_Q3_K = 9,
    DOL_DTYPE_Q4_K = 10,
    DOL_DTYPE_Q5_K = 11,
    DOL_DTYPE_Q6_K = 12,
} dol_dtype;

#define DOL_DTYPE_COUNT 13

/* Bytes per element of a plain dtype (4, 2, 2); 0 for a block type (use
 * dol_dtype_row_bytes). */
size_t dol_dtype_size(dol_dtype t);
/* "F32", "F16", "BF16", "Q8_0", ..., "Q6_K" (ggml's names). */
const char *dol_dtype_name(dol_dtype t);
/* Whether t is a block-quantized type (Q8_0 .. Q6_K). */
bool dol_dtype_is_block(dol_dtype t);
/* Weights per block: 1 for a plain type, 32 for Q8_0 .. Q5_1, 256 for the
 * K-quants. */
int dol_dtype_block(dol_dtype t);
/* Bytes per block (a plain type: its element size). */
size_t dol_dtype_block_bytes(dol_dtype t);
/* Bytes of a row of `cols` weights: cols / block * block bytes (cols must be
 * a multiple of the block, as the loaders check). */
size_t dol_dtype_row_bytes(dol_dtype t, int64_t cols);

/* n consecutive weights of dtype t at src (n a multiple of the block;
 * src at a block boundary) as f32 at dst, exactly: the plain types widened
 * (dol_f16_to_f32 ...), the block types dequantized as ggml_blocks.h
 * defines (the same bits as dol_blk_weight). Any thread. */
void dol_dequantize(dol_dtype t, const void *src, float *dst, int64_t n);

/* Scalar conversions between the storage types and F32 (src/model/dtype.c).
 * F16 -> F32 and BF16 -> F32 are exact (subnormals, inf and nan included).
 * F32 -> F16 and F32 -> BF16 round to nearest, ties to even; values too large
 * become inf, values at or below half the smallest F16 subnormal become a
 * signed zero, nan stays a (quiet) nan. */
float dol_f16_to_f32(uint16_t h);
uint16_t dol_f32_to_f16(float f);
float dol_bf16_to_f32(uint16_t h);
uint16_t dol_f32_to_bf16(float f);

/* A 1-D or 2-D view of weights. `data` points into a read-only mapping of the
 * checkpoint (or into a buffer owned by the dol_model when the stored data
 * had to be realigned or its rows reordered); it stays valid until
 * dol_model_free. Row-major: row r starts at
 * data + r * dol_dtype_row_bytes(dtype, cols); in a plain dtype element
 * (r, c) is at data + (r * cols + c) * dol_dtype_size(dtype), aligned to
 * that size; a block type's row is cols / block blocks (ggml_blocks.h), at
 * any address. For 1-D tensors rows == 1 (always a plain dtype). */
typedef struct {
    dol_dtype dtype;
    int64_t rows;
    int64_t cols;
    const void *data;
} dol_tensor;

/* Most end-of-sequence ids config.json's eos_token_id may list. */
#define DOL_MAX_EOS_IDS 8

/* Hyper-parameters from config.json. */
typedef struct {
    int hidden_size;          /* model dimension d */
    int intermediate_size;    /* SwiGLU hidden dimension */
    int n_layers;             /* num_hidden_layers */
    int n_heads;              /* num_attention_heads */
    int n_kv_heads;           /* num_key_value_heads (absent = n_heads) */
    int head_dim;             /* hidden_size / n_heads */
    int vocab_size;
    int max_position_embeddings;  /* context length in tokens */
    float rms_norm_eps;
    float rope_theta;         /* absent = 10000 */
    float rope_scale;         /* linear RoPE scaling: positions are divided by it
                               * (1 = none; 0, in a config made by hand, counts
                               * as 1); only GGUF's llama.rope.scaling sets it */
    bool tie_word_embeddings; /* lm_head shares model.embed_tokens.weight */
    int bos_token_id;         /* absent = 1 */
    int eos_token_id;         /* absent = 2; a list's first */
    /* config.json's eos_token_id as listed (one id, or up to
     * DOL_MAX_EOS_IDS): each ends a choice like the tokenizer's EOS */
    int eos_token_ids[DOL_MAX_EOS_IDS];
    int n_eos_token_ids;
} dol_model_config;

/* Weights of one decoder layer. Shapes (d = hidden_size, h = head_dim,
 * kv = n_kv_heads * h, f = intermediate_size):
 *   attn_norm [1, d]   q [n_heads*h, d]   k [kv, d]   v [kv, d]
 *   o [d, n_heads*h]   ffn_norm [1, d]    gate [f, d] up [f, d]  down [d, f] */
/* Bytes of t's data: rows * dol_dtype_row_bytes(dtype, cols). */
size_t dol_tensor_bytes(const dol_tensor *t);

typedef struct {
    dol_tensor attn_norm, q, k, v, o;
    dol_tensor ffn_norm, gate, up, down;
} dol_layer_weights;

/* Where a model was loaded from. */
typedef enum {
    DOL_MODEL_SAFETENSORS = 0,   /* a Hugging Face directory */
    DOL_MODEL_GGUF = 1,          /* one .gguf file */
} dol_model_format;

/* "safetensors", "gguf". */
const char *dol_model_format_name(dol_model_format f);

typedef struct dol_model dol_model;
struct dol_model {
    dol_model_config cfg;
    char dir[1024];           /* model directory (or GGUF file) as given */
    char name[256];           /* basename of dir (of a GGUF file: without .gguf) */
    dol_model_format format;
    char type_mix[192];       /* the checkpoint's tensor types, most frequent first:
                               * "F16 30, F32 9" (GGUF: every tensor of the file;
                               * safetensors: the tensors bound) */
    dol_tensor embed;         /* [vocab, d] */
    dol_tensor final_norm;    /* [1, d] */
    dol_tensor lm_head;       /* [vocab, d]; == embed when tied */
    dol_layer_weights *layers;/* n_layers entries */
    size_t weight_bytes;      /* sum of all tensor sizes as stored */
    void *priv;               /* mappings and owned buffers (loader-private) */
};

/* Parse `dir`/config.json only. Unsupported values (architecture other than
 * LlamaForCausalLM, model_type other than llama, hidden_act != silu,
 * rope_scaling not null, attention_bias true, inconsistent sizes) are
 * refused: -1 and one line in `err` naming the file as `dir`/config.json and
 * the field. */
int dol_model_config_load(const char *dir, dol_model_config *cfg,
                          char *err, size_t errlen);

/* Load a model: `dir` names a Hugging Face directory, or a regular file,
 * which must then be a GGUF file (see dol_model_load_gguf below).
 *
 * A directory: config.json, then model.safetensors or the shards
 * named by model.safetensors.index.json, memory-mapped read-only (never read
 * into memory twice). Every tensor is checked: present, shape as the config
 * says, dtype F32/F16/BF16, byte range inside the file and not overlapping
 * another tensor, header JSON well-formed. lm_head.weight may be absent only
 * when tie_word_embeddings is true, and no tensor may belong to a layer past
 * num_hidden_layers. On failure returns -1, *out untouched, and `err` holds
 * one line naming the file by its path under `dir` and the tensor
 * (e.g. "models/x/model.safetensors: tensor model.norm.weight: shape [32] but
 * config says [64]"). The caller owns *out and releases it with
 * dol_model_free. */
int dol_model_load(const char *dir, dol_model **out, char *err, size_t errlen);

/* Whether dol_model_load reads `path` as a GGUF file: a name ending in
 * ".gguf" (any case; whatever it is, so that a directory, FIFO or missing
 * path of that name gets the GGUF loader's error naming the file), or any
 * other regular file. Otherwise it is a Hugging Face directory. */
bool dol_model_path_is_gguf(const char *path);

/* A GGUF file as a model (what dol_model_load does for a file): the reader
 * of include/dolphin/gguf.h validates the file, then
 *   - general.architecture must be "llama";
 *   - hyperparameters from llama.context_length, .embedding_length,
 *     .block_count, .feed_forward_length, .attention.head_count,
 *     .attention.head_count_kv (absent = head_count),
 *     .attention.layer_norm_rms_epsilon, .rope.freq_base (absent = 10000),
 *     .rope.dimension_count (absent or the head dimension); rope scaling
 *     from .rope.scaling.type / .rope.scaling.factor (or the older
 *     .rope.scale_linear): none or linear, any other kind refused;
 *     .expert_count above 0 (mixture of experts) refused; vocab_size is
 *     the number of tokenizer.ggml.tokens (llama.vocab_size, when present,
 *     must agree);
 *   - the tokenizer keys are checked here (tokenizer.ggml.model "llama",
 *     tokens, scores, token_type of one length, the special ids inside it,
 *     add_bos_token true, add_eos_token false, no precompiled_charsmap) so that a file that cannot be served is refused
 *     before anything else; dol_model_tokenizer builds it;
 *   - tensors by llama.cpp's names (token_embd, blk.N.attn_q, ...,
 *     output_norm, output: absent = tied to token_embd), each shape as the
 *     hyperparameters say (GGUF order: ne[0], the row length, first), of
 *     type F32, F16, BF16 or one of the block types of ggml_blocks.h
 *     (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K; 1-D tensors plain
 *     only; any other type is refused by name); no tensor the model does
 *     not use. attn_q / attn_k come un-permuted into Hugging Face's row order
 *     (llama.cpp's converter interleaves the two halves of each head for
 *     its RoPE): those two are copies owned by the model, the source pages
 *     dropped; every other tensor is used in place in the mapping (copied
 *     only when its data is not aligned to its element size).
 * 0, or -1 with one line in err starting with the path; *out untouched. */
int dol_model_load_gguf(const char *path, dol_model **out, char *err, size_t errlen);

/* The tokenizer a GGUF model carries (tokenizer.ggml.*), built by
 * sentencepiece from a model proto made of the file's arrays
 * (dol_tokenizer_from_spec). Any thread, while m lives; the tokenizer is
 * independent of m once built (caller frees it with dol_tokenizer_free).
 * -1 with one line in err naming the file, also for a safetensors model. */
typedef struct dol_tokenizer dol_tokenizer;
int dol_model_tokenizer(const dol_model *m, dol_tokenizer **out, char *err, size_t errlen);

void dol_model_free(dol_model *m);

/* Page hints for a tensor of m (any thread; `t` must be one of m's tensors
 * or a view inside one). Both change no value: t->data stays valid.
 *   dol_model_prefetch: ask the kernel to start reading t's pages of the
 *     checkpoint now (MADV_WILLNEED), so the read of the next tensor overlaps
 *     the work on this one.
 *   dol_model_release: drop t's pages from this process (MADV_DONTNEED on
 *     the read-only mapping, widened to whole pages): once a backend holds
 *     its own copy of a tensor, the checkpoint's copy no longer counts in
 *     the process's memory. A later read of t->data faults the pages back in
 *     from the file (page cache). Returns the bytes released (0 for a tensor
 *     held in an aligned copy, not in a mapping). */
void dol_model_prefetch(const dol_model *m, const dol_tensor *t);
size_t dol_model_release(const dol_model *m, const dol_tensor *t);

/* Once every engine that will be made from m exists (the backends convert
 * the seven linear layers of each block to their own format at creation and
 * never read them again): free the copies m holds of those layers (a GGUF
 * model's un-permuted attn_q / attn_k, tensors copied for alignment) and
 * set their `data` to NULL. Returns the bytes freed. Everything else (the
 * embedding, read in place; norms; lm_head; and block-quantized layers,
 * which the CPU backend reads where they are, copies included) is left as
 * it is. The caller
 * must hold m alone (no other thread reads it meanwhile). */
size_t dol_model_drop_copies(dol_model *m);

/* A SHA-256 (FIPS 180-4, GNU Nettle's) that changes whenever the
 * checkpoint m was loaded from is changed on disk, for keying caches of
 * what is derived from its weights (docs/configuration.md, "The
 * prepared-weights cache"). It covers the bytes of config.json (and of
 * model.safetensors.index.json when present) and, for every safetensors
 * file in load order, its name, size, modification time in nanoseconds and
 * JSON header (a GGUF file: its name, size, modification time and every
 * byte before its data section); not the weight bytes themselves (reading them is what a
 * cache avoids), so a file rewritten in place with the same size, header
 * and mtime goes unnoticed. Reads only those small parts (any thread).
 * 0, or -1 with one line in err naming the file that could not be read. */
int dol_model_source_digest(const dol_model *m, uint8_t out[32], char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
