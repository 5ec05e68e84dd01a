/* include/dolphin/gguf.h — a GGUF file (the format of llama.cpp and ggml)
 * opened read-only: its header, its key/value metadata and its tensor table,
 * every count, length and offset checked against the file before anything
 * points into it. The reader knows the format only; what a Llama model needs
 * from it (the llama.* keys, the tensor names and shapes, the tokenizer) is
 * src/model/gguf_llama.c, reached through dol_model_load.
 *
 * Format facts used here (GGUF versions 2 and 3, little-endian): the magic
 * "GGUF", a u32 version, a u64 tensor count and a u64 key/value count; then
 * each key (a string: u64 length + bytes, no NUL) with a u32 value type and
 * its value; then each tensor's name, u32 dimension count, u64 dimensions
 * (ne[0], the contiguous one, first), u32 ggml type and u64 offset into the
 * data section; the data section starts at the next multiple of
 * general.alignment (default 32) and every tensor offset is a multiple of it.
 *
 * Threads: a dol_gguf is immutable once opened; any thread may read it
 * concurrently. Errors: one line, starting with the file's path as given,
 * naming the key or tensor at fault; control characters in names become '?'.
 */
#ifndef DOLPHIN_GGUF_H
#define DOLPHIN_GGUF_H

#include "dolphin/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Metadata value types, as numbered in the file. */
typedef enum {
    DOL_GGUF_UINT8 = 0,
    DOL_GGUF_INT8 = 1,
    DOL_GGUF_UINT16 = 2,
    DOL_GGUF_INT16 = 3,
    DOL_GGUF_UINT32 = 4,
    DOL_GGUF_INT32 = 5,
    DOL_GGUF_FLOAT32 = 6,
    DOL_GGUF_BOOL = 7,
    DOL_GGUF_STRING = 8,
    DOL_GGUF_ARRAY = 9,
    DOL_GGUF_UINT64 = 10,
    DOL_GGUF_INT64 = 11,
    DOL_GGUF_FLOAT64 = 12,
} dol_gguf_vtype;

/* A string inside the file: `len` bytes at `s`, not NUL-terminated, valid
 * while the dol_gguf is open. */
typedef struct {
    const char *s;
    uint64_t len;
} dol_gguf_str;

/* One key/value pair. For a scalar, the member of `v` its type selects
 * (every integer type widened: unsigned ones into v.u, signed into v.i;
 * FLOAT32 and FLOAT64 into v.f). For an array: arr_type, arr_n elements;
 * the elements of a numeric or BOOL array start at arr_data (inside the
 * file, possibly unaligned: read them with dol_gguf_arr_*); a STRING array
 * also has arr_str[arr_n] (owned by the dol_gguf); an array of arrays is
 * checked and skipped (arr_data set, no accessor). */
typedef struct {
    dol_gguf_str key;
    dol_gguf_vtype type;
    union {
        uint64_t u;
        int64_t i;
        double f;
        bool b;
        dol_gguf_str s;
    } v;
    dol_gguf_vtype arr_type;
    uint64_t arr_n;
    const uint8_t *arr_data;
    const dol_gguf_str *arr_str;
} dol_gguf_kv;

#define DOL_GGUF_MAX_DIMS 4

/* One tensor of the table. ne[0] is the contiguous dimension (a matrix of
 * PyTorch shape [rows, cols] is stored as ne = {cols, rows}); dimensions
 * past n_dims are 1. `type` is the ggml type id; `nbytes` its size from the
 * type's block layout; `data` points inside the file (aligned as the file's
 * general.alignment says, relative to the start of the file). */
typedef struct {
    char *name;             /* NUL-terminated copy, owned by the dol_gguf */
    uint32_t n_dims;
    uint64_t ne[DOL_GGUF_MAX_DIMS];
    uint32_t type;
    uint64_t offset;        /* from the start of the data section */
    uint64_t nbytes;
    const void *data;
} dol_gguf_tensor;

typedef struct dol_gguf dol_gguf;

/* A ggml type: its name ("F16", "Q4_K"), the elements of one block and the
 * bytes of one block. NULL for an id that is unknown, or was removed from
 * ggml (4, 5: Q4_2, Q4_3; 31..33, 36..38: the repacked Q4_0/IQ4_NL layouts,
 * which files never held). */
typedef struct {
    const char *name;
    uint32_t block;
    uint32_t block_bytes;
} dol_ggml_type_info;
const dol_ggml_type_info *dol_ggml_type(uint32_t id);

/* Open and validate `path`: mapped read-only (PROT_READ, MAP_PRIVATE),
 * never read twice. Checked: magic, version 2 or 3 (a big-endian file is
 * named as such), counts that cannot fit in the file, every string and
 * array inside the file, value types, duplicate keys, general.alignment (an
 * unsigned integer, a power of two up to 2^30), tensor names (1..255 bytes,
 * no duplicates), 1..4 dimensions whose product fits in int64 with ne[0] a
 * multiple of the type's block, known ggml types, offsets aligned and data
 * inside the file, no two tensors overlapping. 0 and *out (caller frees
 * with dol_gguf_close), or -1 with one line in err and nothing held. */
int dol_gguf_open(const char *path, dol_gguf **out, char *err, size_t errlen);

/* The same over `len` bytes at `buf` (not copied: buf must outlive the
 * dol_gguf); `name` stands for the path in messages. For tests and the
 * fuzz target. */
int dol_gguf_open_mem(const void *buf, size_t len, const char *name, dol_gguf **out,
                      char *err, size_t errlen);

/* Unmap and free (NULL is fine). */
void dol_gguf_close(dol_gguf *g);

/* The path (or name) it was opened with; its version (2 or 3); its
 * alignment in bytes; the file size; the offset of the data section from
 * the start of the file (the header, metadata and tensor table lie before). */
const char *dol_gguf_path(const dol_gguf *g);
uint32_t dol_gguf_version(const dol_gguf *g);
uint64_t dol_gguf_alignment(const dol_gguf *g);
uint64_t dol_gguf_file_size(const dol_gguf *g);
uint64_t dol_gguf_data_offset(const dol_gguf *g);
/* The first byte of the file (the mapping, or buf). */
const void *dol_gguf_base(const dol_gguf *g);
/* Whether the bytes live in a mapping made by dol_gguf_open (page hints
 * apply) rather than a caller's buffer. */
bool dol_gguf_mapped(const dol_gguf *g);

/* Key/value pairs in file order: how many, the i-th, or the one named `key`
 * (NULL when absent). */
size_t dol_gguf_n_kv(const dol_gguf *g);
const dol_gguf_kv *dol_gguf_kv_at(const dol_gguf *g, size_t i);
const dol_gguf_kv *dol_gguf_find_kv(const dol_gguf *g, const char *key);

/* Element i (< arr_n) of a numeric or BOOL array, converted: integers of any
 * width into *out (false when the array is not of an integer or BOOL type,
 * or the value does not fit in int64); FLOAT32 / FLOAT64 arrays as float
 * (false otherwise). */
bool dol_gguf_arr_int(const dol_gguf_kv *kv, uint64_t i, int64_t *out);
bool dol_gguf_arr_f32(const dol_gguf_kv *kv, uint64_t i, float *out);

/* Tensors in file order: how many, the i-th, or the one named `name`. */
size_t dol_gguf_n_tensors(const dol_gguf *g);
const dol_gguf_tensor *dol_gguf_tensor_at(const dol_gguf *g, size_t i);
const dol_gguf_tensor *dol_gguf_find_tensor(const dol_gguf *g, const char *name);

/* The name of a value type ("u32", "string", ...), for messages. */
const char *dol_gguf_vtype_name(uint32_t t);

/* "[a, b]" (the dimensions in file order, ne[0] first) into buf. */
void dol_gguf_shape_str(const dol_gguf_tensor *t, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
