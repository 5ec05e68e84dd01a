/* tests/cuda/cuda_test_util.h — what the CUDA tests share: CK (a failed CUDA
 * call fails the cmocka test with its message), a seeded random stream
 * (splitmix64; a test file may define CUDA_TEST_SEED before including this)
 * and device buffers (allocate, upload, download after a device sync).
 * Include after <cmocka.h>. */
#ifndef DOLPHIN_CUDA_TEST_UTIL_H
#define DOLPHIN_CUDA_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifndef CUDA_TEST_SEED
#define CUDA_TEST_SEED 0x2545F4914F6CDD1Dull
#endif

#define CK(call)                                                                            \
    do {                                                                                    \
        cudaError_t rc_ = (call);                                                           \
        if (rc_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(rc_));         \
    } while (0)

static uint64_t g_rng = CUDA_TEST_SEED;
static inline uint64_t next_u64(void)
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* uniform in [-a, a] */
static inline float urand(float a)
{
    return (float)((double)(next_u64() >> 11) / 9007199254740992.0 * 2.0 - 1.0) * a;
}
/* uniform in [0, n) */
static inline int irand(int n) { return (int)(next_u64() % (uint64_t)n); }

/* A device buffer of `bytes` (at least 16); fails the test when it cannot. */
static inline void *dmalloc(size_t bytes)
{
    void *p = NULL;
    CK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}
/* A device copy of h[0..bytes). */
static inline void *dup_to_dev(const void *h, size_t bytes)
{
    void *d = dmalloc(bytes);
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
/* h[0..bytes) = d[0..bytes), after all work on the device is done. */
static inline void to_host(void *h, const void *d, size_t bytes)
{
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

#endif
