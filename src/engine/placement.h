/* src/engine/placement.h — layer placement (placement.c): the plan of which
 * device holds which transformer blocks, and the backend that chains the
 * ranges of a plan into one forward pass. CUDA builds only. */
#ifndef DOLPHIN_ENGINE_PLACEMENT_H
#define DOLPHIN_ENGINE_PLACEMENT_H

#include "engine/backend.h"

#ifdef DOLPHIN_HAVE_CUDA

/* the GPUs, then the CPU */
#define DOL_PLACEMENT_MAX_STAGES (DOL_MAX_DEVICES + 1)

typedef struct {
    dol_layer_range r;
    bool cuda;                 /* a CUDA device (r.device), else the CPU */
    char name[16];             /* "cuda:0", "cpu" */
    size_t avail, total;       /* CUDA: the budget and the device's total, bytes */
    size_t kv_block_bytes;     /* one KV block of its layers */
    size_t weight_bytes;       /* as held, once created */
    size_t step_read_bytes;    /* of those, what one decode step reads */
} dol_placement_stage;

typedef struct {
    int n;                     /* stages, in pipeline order */
    dol_placement_stage st[DOL_PLACEMENT_MAX_STAGES];
    int head_stage;            /* the stage holding the final norm + lm_head */
    int n_blocks;              /* KV blocks, the same on every stage */
    bool spilled;              /* automatic placement put blocks on the CPU */
    size_t avail[DOL_MAX_DEVICES], total[DOL_MAX_DEVICES]; /* per entry of devices */
} dol_placement;

/* The plan for model m under p's placement settings, context ctx, KV
 * blocks of bs tokens, `want` KV blocks (0 = all that fit). Reads each
 * device's free memory; allocates nothing. 0, or -1 / -2 (a setting at
 * fault) with one line in err naming the device and the bytes. */
int dol_placement_plan(const dol_model *m, const dol_engine_params *p, int ctx, int bs, int64_t want,
                       dol_placement *pl, char *err, size_t errlen);

/* The backend over a plan: create plans again (same inputs, same plan) and
 * creates one instance per stage. */
extern const dol_backend_ops dol_placed_backend;

/* dol_engine_devices for an engine on dol_placed_backend; kv_used_blocks:
 * the allocator's blocks in use (the CPU stage's memory figure). */
int dol_placement_devices(void *impl, int kv_used_blocks, dol_device_memory *out, int max);

#endif
#endif
