/* src/model/model_internal.h — private to src/model: the loader-private part
 * of a dol_model (m->priv) that model.c (safetensors, page hints, digest)
 * and gguf_llama.c (GGUF) share, and the helpers both use. */
#ifndef DOLPHIN_MODEL_INTERNAL_H
#define DOLPHIN_MODEL_INTERNAL_H

#include "dolphin/gguf.h"
#include "dolphin/model.h"
#include "safetensors.h"

typedef struct {
    dol_st_file *files;   /* one per safetensors file, each opened once */
    int n_files;
    void **owned;         /* copies held by the model: realigned or un-permuted tensors */
    int n_owned, cap_owned;
    dol_gguf *gguf;       /* a GGUF model's file, else NULL */
} model_priv;

/* A 64-byte aligned buffer of n bytes that the model owns (freed with it);
 * NULL when out of memory. */
void *dol_model_own(model_priv *p, size_t n);

/* Fill m (allocated, priv set, dir and name set) from the GGUF file at
 * path; 0 or -1 with err. Whatever it holds is freed by dol_model_free. */
int dol_model_gguf_fill(dol_model *m, const char *path, char *err, size_t errlen);

/* "F16 30, F32 9" from counts per type name (most frequent first, then by
 * name), into buf. */
void dol_model_type_mix(const char *const *names, const int *counts, int n, char *buf, size_t len);

#endif
