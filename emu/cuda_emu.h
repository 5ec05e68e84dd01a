/* emu/cuda_emu.h — the device side of Dolphin's CUDA emulation (DOLPHIN_CUDA=EMU).
 * Force-included before every kernel source (kernels/NAME.cu), which are compiled as host C++
 * against the real CUDA headers: it maps the CUDA C++ keywords (__global__,
 * __shared__, ...) to host C++, provides the built-ins (threadIdx, blockIdx,
 * blockDim, gridDim) and the intrinsics the kernels use, and the launch that
 * emu/rewrite_launches.cmake substitutes for `k<<<grid, block, smem, s>>>(...)`.
 * The executor behind it lives in emu/exec.cpp. */
#ifndef DOLPHIN_CUDA_EMU_H
#define DOLPHIN_CUDA_EMU_H

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <vector_functions.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

/* the CUDA headers define these for nvcc's host pass: replaced here */
#undef __global__
#undef __device__
#undef __forceinline__
#undef __shared__
/* internal linkage: the static shared variables inside must not be COMDAT
 * (a named section cannot mix COMDAT and ordinary variables) */
#define __global__ static
#define __device__
#define __forceinline__ static inline __attribute__((always_inline))
#define __launch_bounds__(...)
/* Static shared memory: one instance per variable (blocks run one at a time),
 * gathered in one section that the executor poisons at every block start. */
#define __shared__ static __attribute__((section("dol_emu_shared"), aligned(16)))

/* ---- built-ins ------------------------------------------------------------ */

struct dol_emu_builtins {
    uint3 threadIdx;
    uint3 blockIdx;
    dim3 blockDim;
    dim3 gridDim;
};
/* The thread that runs now (kernels run one block at a time, one thread at a
 * time, under the emulator's lock). */
extern "C" dol_emu_builtins *dol_emu_cur;

#define threadIdx (dol_emu_cur->threadIdx)
#define blockIdx (dol_emu_cur->blockIdx)
#define blockDim (dol_emu_cur->blockDim)
#define gridDim (dol_emu_cur->gridDim)
#define warpSize 32

/* ---- synchronisation (emu/exec.cpp) ------------------------------------------ */

enum dol_emu_warp_kind { DOL_EMU_SYNCWARP, DOL_EMU_SHFL, DOL_EMU_SHFL_XOR, DOL_EMU_SHFL_UP, DOL_EMU_SHFL_DOWN };

extern "C" void dol_emu_syncthreads(void);
/* A warp-level operation: waits until every lane named in mask has reached
 * the same operation (same kind, mask and width, same count of warp
 * operations so far), then returns the value of the source lane. */
extern "C" uint64_t dol_emu_warp_op(int kind, unsigned mask, uint64_t value, int arg, int width);
/* The launch's dynamic shared memory (its exact size, poisoned at each block). */
extern "C" void *dol_emu_dyn_smem(void);

static inline void __syncthreads(void) { dol_emu_syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)dol_emu_warp_op(DOL_EMU_SYNCWARP, mask, 0, 0, 32); }

template <typename T> static inline T dol_emu_shfl(int kind, unsigned mask, T v, int arg, int width)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of an unsupported type");
    uint64_t raw = 0;
    memcpy(&raw, &v, sizeof v);
    raw = dol_emu_warp_op(kind, mask, raw, arg, width);
    T out;
    memcpy(&out, &raw, sizeof out);
    return out;
}
template <typename T> static inline T __shfl_sync(unsigned m, T v, int src, int w = 32) { return dol_emu_shfl(DOL_EMU_SHFL, m, v, src, w); }
template <typename T> static inline T __shfl_xor_sync(unsigned m, T v, int x, int w = 32) { return dol_emu_shfl(DOL_EMU_SHFL_XOR, m, v, x, w); }
template <typename T> static inline T __shfl_up_sync(unsigned m, T v, unsigned d, int w = 32) { return dol_emu_shfl(DOL_EMU_SHFL_UP, m, v, (int)d, w); }
template <typename T> static inline T __shfl_down_sync(unsigned m, T v, unsigned d, int w = 32) { return dol_emu_shfl(DOL_EMU_SHFL_DOWN, m, v, (int)d, w); }

/* ---- arithmetic and memory intrinsics ------------------------------------------ */

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }

/* Round-to-nearest single operations, never contracted (-ffp-contract=off). */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }

template <typename T> static inline T __ldg(const T *p) { return *p; }

/* PTX prmt (default mode): byte i of the result is byte s[4i+3:4i] & 7 of
 * the eight bytes {y, x}. */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
    const uint64_t v = ((uint64_t)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
}

/* ---- launches ------------------------------------------------------------------ */

/* Validates the launch (shape, shared memory, stream, pointer arguments) and
 * enqueues `body` (one call per thread) on the stream; the result is what
 * cudaGetLastError then returns. */
extern "C" cudaError_t dol_emu_launch(const char *name, const void *fn, dim3 grid, dim3 block,
                                      size_t smem, cudaStream_t stream, int n_ptrs,
                                      const void *const *ptrs, std::function<void()> *body);
/* The checks of dol_emu_launch that need no stream (shape, __launch_bounds__,
 * dynamic shared memory against the kernel's limit and the emulated
 * architecture's, DOLPHIN_CUDA_EMU_ARCH); tests call it directly. */
extern "C" cudaError_t dol_emu_launch_check(const char *name, const void *fn, dim3 grid, dim3 block,
                                            size_t smem);

namespace dol_emu {

template <typename T> static inline void collect_ptr(const void **out, int *n, const T &v)
{
    if constexpr (std::is_pointer<T>::value) out[(*n)++] = (const void *)v;
}

template <typename... P> struct launch {
    void (*fn)(P...);
    const char *name;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;

    template <typename... A> void operator()(A &&...a) const
    {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
        auto args = std::make_shared<std::tuple<typename std::decay<P>::type...>>(std::forward<A>(a)...);
        const void *ptrs[sizeof...(P) + 1];
        int n = 0;
        std::apply([&](const auto &...v) { (collect_ptr(ptrs, &n, v), ...); }, *args);
        auto f = fn;
        std::function<void()> body = [f, args]() { std::apply(f, *args); };
        dol_emu_launch(name, (const void *)fn, grid, block, smem, stream, n, ptrs, &body);
    }
};

template <typename... P>
static inline launch<P...> make_launch(void (*fn)(P...), const char *name, dim3 grid, dim3 block,
                                       size_t smem = 0, cudaStream_t stream = 0)
{
    return launch<P...>{ fn, name, grid, block, smem, stream };
}

} // namespace dol_emu

#define DOL_EMU_LAUNCH(k, ...) ::dol_emu::make_launch(k, #k, __VA_ARGS__)

/* The C++ overloads of cuda_runtime.h that nvcc would have brought in. */
template <class T> static inline cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *a, T *entry)
{
    return ::cudaFuncGetAttributes(a, (const void *)entry);
}
template <class T> static inline cudaError_t cudaFuncSetAttribute(T *entry, enum cudaFuncAttribute attr, int value)
{
    return ::cudaFuncSetAttribute((const void *)entry, attr, value);
}

/* __launch_bounds__(max_threads[, ...]) of the kernel `name` (its template
 * arguments, if any, left out): emu/rewrite_launches.cmake appends one call
 * per kernel that declares bounds to the rewritten source, run at static
 * initialisation; every launch of that kernel is then checked against it. */
extern "C" int dol_emu_register_bounds(const char *name, int max_threads);
#define DOL_EMU_BOUNDS_FIRST(first, ...) (first)

#endif
