/* emu/internal.h — what the parts of the CUDA emulation share: the global
 * lock, the table of device and pinned allocations, stream queues, error
 * reporting. Private to emu/. */
#ifndef DOLPHIN_EMU_INTERNAL_H
#define DOLPHIN_EMU_INTERNAL_H

#include <cuda_runtime_api.h>

#include <stddef.h>
#include <stdint.h>

#include <functional>
#include <memory>
#include <mutex>

namespace dol_emu {

/* Every API call and all execution hold this lock: kernels run one thread at
 * a time, whichever OS thread triggered them. */
std::recursive_mutex &big_lock();

enum mem_kind { MEM_DEVICE, MEM_PINNED };
struct alloc_info {
    uintptr_t base;
    size_t size;
    int device;
    mem_kind kind;
};
/* The allocation holding p (NULL when p is ordinary host memory). */
const alloc_info *find_alloc(const void *p);
/* Whether [p, p + bytes) lies inside one device allocation; on failure
 * prints what is wrong (named `what`) and returns false. */
bool check_device_range(const void *p, size_t bytes, const char *what);

/* Print one line "dolphin cuda-emu: ..." to stderr. */
void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print and abort: a fault a GPU would turn into undefined behaviour. */
[[noreturn]] void fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Record e as the calling thread's last error (cudaGetLastError); returns e. */
cudaError_t set_error(cudaError_t e);

/* Queue fn on stream s (or record it into the graph s is capturing). */
cudaError_t enqueue(cudaStream_t s, const char *what, std::function<void()> fn);
/* The device of stream s; false for an invalid handle. */
bool stream_device(cudaStream_t s, int *dev);
int current_device(void);
int compute_capability(void);

/* Run a whole grid now (emu/exec.cpp). */
struct launch_rec {
    const char *name;
    dim3 grid, block;
    size_t smem;
    std::shared_ptr<std::function<void()>> body;
};
void run_grid(const launch_rec &l);
/* Bytes of static shared memory of all kernels together. */
size_t static_smem_bytes(void);

} // namespace dol_emu

#endif
