/* tests/cuda/test_cuda_quant_golden.c — the golden tests of the quantized
 * weights (nf4, int8: tests/unit/test_quant_golden.c) on the CUDA backend,
 * with the bounds of FP16 activations. The same source, built with
 * QG_BACKEND_CUDA. */
#define QG_BACKEND_CUDA 1
#include "../unit/test_quant_golden.c"
