/* src/model/safetensors.h — private to src/model: one safetensors file,
 * memory-mapped read-only, with its JSON header parsed and validated
 * (offsets inside the data, sizes matching shapes, no overlaps). */
#ifndef DOLPHIN_MODEL_SAFETENSORS_H
#define DOLPHIN_MODEL_SAFETENSORS_H

#include "dolphin/model.h"

#define DOL_ST_MAX_DIMS 8

/* One entry of the header. */
typedef struct {
    char *name;
    char dtype[24];        /* as written in the header: "F16", "I8", ... */
    bool supported;        /* dtype is F32 / F16 / BF16; then `type` is set */
    dol_dtype type;
    int ndim;
    int64_t shape[DOL_ST_MAX_DIMS];
    uint64_t begin, end;   /* byte range inside the data section */
} dol_st_tensor;

typedef struct {
    char path[1536];
    const char *fname;     /* basename of path: the prefix of every message */
    void *map;             /* whole file, PROT_READ / MAP_PRIVATE */
    size_t map_len;
    const uint8_t *data;   /* data section: map + 8 + header length */
    uint64_t data_len;
    dol_st_tensor *tensors;/* sorted by name */
    size_t n_tensors;
} dol_st_file;

/* Map and validate `path`. On failure returns -1, leaves nothing allocated
 * and writes one line starting with the file's basename into err. */
int dol_st_open(dol_st_file *f, const char *path, char *err, size_t errlen);

/* The entry named `name`, or NULL. */
const dol_st_tensor *dol_st_find(const dol_st_file *f, const char *name);

/* Unmap and free; safe on a zeroed or already closed dol_st_file. */
void dol_st_close(dol_st_file *f);

/* "[a, b, c]" into buf (Python's way of writing a shape). */
void dol_st_shape_str(const int64_t *shape, int ndim, char *buf, size_t len);

#endif
