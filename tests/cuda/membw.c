/* tests/cuda/membw.c — dol-cuda-membw: the first CUDA device's properties
 * (one `device_...` line) and its device-to-device copy bandwidth, the
 * memory roofline that the GPU kit (scripts/gpu-kit) compares batch-1
 * decode with. Copies a buffer of SIZE_MIB (default 2048)
 * with cudaMemcpyAsync a number of times after a warm-up and prints the best
 * rate as bytes moved (read + write, 2 x size) per second:
 *   d2d_copy_GBps=<rate> buffer_MiB=<size>
 * Exit 77 when no device is present. */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

/* "device N (compute capability X.Y)" of the current device */
static const char *where(char *buf, size_t n)
{
    int dev = -1, major = 0, minor = 0;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess)
        snprintf(buf, n, "device %d (compute capability %d.%d)", dev, major, minor);
    else
        snprintf(buf, n, "device %d (compute capability unknown)", dev);
    return buf;
}

#define CHECK(call)                                                                         \
    do {                                                                                    \
        cudaError_t rc_ = (call);                                                           \
        if (rc_ != cudaSuccess) {                                                           \
            char w_[80];                                                                    \
            fprintf(stderr, "dol-cuda-membw: %s: %s (%s) on %s\n", #call,                   \
                    cudaGetErrorString(rc_), cudaGetErrorName(rc_), where(w_, sizeof w_));  \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 2048;
    if (mib == 0) mib = 2048;
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess || n == 0) {
        printf("dol-cuda-membw: no CUDA device (cudaGetDeviceCount: %s, %s); skipping\n",
               cudaGetErrorString(rc), cudaGetErrorName(rc));
        return 77;
    }
    int major = 0, minor = 0, sms = 0, smem = 0, rt = 0, drv = 0;
    size_t free_b = 0, total_b = 0;
    CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlock, 0));
    CHECK(cudaRuntimeGetVersion(&rt));
    CHECK(cudaDriverGetVersion(&drv));
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    printf("device_count=%d device_cc=%d.%d device_sms=%d device_smem_per_block_KiB=%d "
           "device_mem_total_MiB=%zu device_mem_free_MiB=%zu runtime=%d driver=%d\n", n, major,
           minor, sms, smem / 1024, total_b >> 20, free_b >> 20, rt, drv);
    size_t bytes = mib << 20;
    void *a = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    CHECK(cudaMemset(a, 1, bytes));
    CHECK(cudaMemset(b, 0, bytes));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    float best_ms = 1e30f;
    for (int rep = 0; rep < 12; rep++) {
        CHECK(cudaEventRecord(e0, 0));
        CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
        CHECK(cudaEventRecord(e1, 0));
        CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep >= 2 && ms < best_ms) best_ms = ms; /* two warm-up copies */
    }
    double gbps = 2.0 * (double)bytes / (best_ms / 1e3) / 1e9;
    printf("d2d_copy_GBps=%.1f buffer_MiB=%zu\n", gbps, mib);
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    return 0;
}
