/* src/engine/nf4_levels.c — the table of the 16 NF4 levels (nf4.h), alone in
 * its file: the CUDA kernels read it too, and the GPU kit's shared kernel
 * library compiles this file in (CMakeLists.txt, DOLPHIN_CUDA_SHARED_LIB). */
#include "engine/nf4.h"

const float dol_nf4_levels[16] = {
    NF4_L0, NF4_L1, NF4_L2,  NF4_L3,  NF4_L4,  NF4_L5,  NF4_L6,  NF4_L7,
    NF4_L8, NF4_L9, NF4_L10, NF4_L11, NF4_L12, NF4_L13, NF4_L14, NF4_L15,
};
