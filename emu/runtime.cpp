/* emu/runtime.cpp — the CUDA runtime API of the emulation (DOLPHIN_CUDA=EMU),
 * under the declarations of the real cuda_runtime_api.h: virtual devices
 * (DOLPHIN_CUDA_EMU_DEVICES, default 1, each DOLPHIN_CUDA_EMU_MEM_MIB big,
 * default 8192), device memory as separate host allocations (so ASan sees
 * every overrun), copies and memsets checked against the allocations, and
 * asynchronous streams: work is queued and runs only at a synchronisation
 * point (stream, event or device sync, a synchronous copy), so a missing
 * synchronisation reads stale data. Events, stream capture and graphs
 * (a replay re-runs the captured work). Launches are checked against the
 * per-block limits of the architecture emulated (DOLPHIN_CUDA_EMU_ARCH,
 * default sm_75): the kernel's __launch_bounds__, and its dynamic shared
 * memory against the limit cudaFuncSetAttribute sets (48 KiB minus the
 * static shared memory by default) and the architecture's opt-in maximum. */
#include "../emu/cuda_emu.h"
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

/* Opaque CUDA handle types, defined here. */
struct CUgraph_st {
    int device;
    std::vector<std::function<void()>> nodes;
};
struct CUgraphExec_st {
    int device;
    std::vector<std::function<void()>> nodes;
};

namespace dol_emu {
struct work {
    std::function<void()> fn;
    std::vector<std::pair<cudaStream_t, uint64_t>> deps; /* run those first */
    const char *what;
};
}

struct CUstream_st {
    int device;
    unsigned flags;
    bool legacy;
    std::deque<dol_emu::work> q;
    uint64_t enq = 0, done = 0;
    CUgraph_st *capture = NULL;   /* graph under capture */
    bool capture_invalid = false;
    bool capture_global = false;  /* not relaxed: sync calls invalidate it */
};
struct CUevent_st {
    int device;
    unsigned flags;
    cudaStream_t stream = NULL;   /* where last recorded */
    uint64_t seq = 0;             /* that stream's item that completes it */
    double ms = 0;                /* host time when it ran */
};

namespace dol_emu {

namespace {

struct device {
    bool init = false;
    CUstream_st legacy;
    size_t used = 0;
    std::set<cudaStream_t> streams; /* created streams */
};

struct state {
    int n_dev = 0;
    size_t mem_total = 0;
    int cc = 90;
    std::vector<device> devs;
    std::map<uintptr_t, alloc_info> allocs;
    std::set<cudaEvent_t> events;
    std::set<cudaGraph_t> graphs;
    std::set<cudaGraphExec_t> execs;
};

state *S = NULL;
thread_local int t_dev = 0;
thread_local cudaError_t t_err = cudaSuccess;
thread_local int t_capturing = 0; /* streams this thread captures in global/thread-local mode */
thread_local cudaStream_t t_capture_stream = NULL;

const size_t CONTEXT_BYTES = (size_t)300 << 20; /* what a context takes on a real device */

double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

state &st(void)
{
    if (!S) {
        S = new state;
        const char *n = getenv("DOLPHIN_CUDA_EMU_DEVICES");
        S->n_dev = n && *n ? atoi(n) : 1;
        if (S->n_dev < 0 || S->n_dev > 64) fault("DOLPHIN_CUDA_EMU_DEVICES=%s: expected 0..64", n);
        const char *m = getenv("DOLPHIN_CUDA_EMU_MEM_MIB");
        S->mem_total = (size_t)(m && *m ? atoll(m) : 8192) << 20;
        const char *cc = getenv("DOLPHIN_CUDA_EMU_CC");
        if (cc && *cc) S->cc = atoi(cc);
        S->devs.resize((size_t)S->n_dev);
        for (int i = 0; i < S->n_dev; i++) {
            S->devs[(size_t)i].legacy.device = i;
            S->devs[(size_t)i].legacy.flags = 0;
            S->devs[(size_t)i].legacy.legacy = true;
        }
    }
    return *S;
}

device *dev_init(void)
{
    state &s = st();
    if (t_dev < 0 || t_dev >= s.n_dev) return NULL;
    device &d = s.devs[(size_t)t_dev];
    if (!d.init) {
        d.init = true;
        d.used = CONTEXT_BYTES;
    }
    return &d;
}

cudaStream_t resolve_stream(cudaStream_t s)
{
    if (s == 0 || s == cudaStreamLegacy || s == cudaStreamPerThread) {
        device *d = dev_init();
        return d ? &d->legacy : NULL;
    }
    state &S_ = st();
    for (auto &d : S_.devs)
        if (s == &d.legacy || d.streams.count(s)) return s;
    return NULL;
}

void flush(cudaStream_t s, uint64_t upto);

void run_item(cudaStream_t s)
{
    work w = std::move(s->q.front());
    s->q.pop_front();
    for (auto &d : w.deps) flush(d.first, d.second);
    if (w.fn) w.fn();
    s->done++;
}

void flush(cudaStream_t s, uint64_t upto)
{
    while (s->done < upto && !s->q.empty()) run_item(s);
}

void flush_device(int dev)
{
    device &d = st().devs[(size_t)dev];
    flush(&d.legacy, d.legacy.enq);
    for (cudaStream_t s : d.streams) flush(s, s->enq);
}

/* A synchronous call while this thread captures (non-relaxed mode): the
 * capture is invalidated, as on a GPU. */
bool capture_forbids(const char *what)
{
    if (!t_capturing) return false;
    report("%s during stream capture: the capture is invalidated", what);
    if (t_capture_stream) t_capture_stream->capture_invalid = true;
    return true;
}

bool is_device_ptr(const void *p)
{
    const alloc_info *a = find_alloc(p);
    return a && a->kind == MEM_DEVICE;
}

/* the direction of a copy, checked against where the pointers live */
cudaError_t check_copy(void *dst, const void *src, size_t bytes, size_t rows, size_t dpitch,
                       size_t spitch, cudaMemcpyKind kind, const char *fn)
{
    const bool dd = is_device_ptr(dst), sd = is_device_ptr(src);
    bool want_dd, want_sd;
    switch (kind) {
    case cudaMemcpyHostToDevice: want_dd = true; want_sd = false; break;
    case cudaMemcpyDeviceToHost: want_dd = false; want_sd = true; break;
    case cudaMemcpyDeviceToDevice: want_dd = true; want_sd = true; break;
    case cudaMemcpyHostToHost: want_dd = false; want_sd = false; break;
    case cudaMemcpyDefault: want_dd = dd; want_sd = sd; break;
    default:
        report("%s: invalid cudaMemcpyKind %d", fn, (int)kind);
        return cudaErrorInvalidMemcpyDirection;
    }
    if (dd != want_dd || sd != want_sd) {
        report("%s: kind %d, but the destination %p is %s memory and the source %p is %s memory", fn,
               (int)kind, dst, dd ? "device" : "host", src, sd ? "device" : "host");
        return cudaErrorInvalidValue;
    }
    if (!bytes || !rows) return cudaSuccess;
    char what[96];
    snprintf(what, sizeof what, "%s destination", fn);
    if (dd && !check_device_range(dst, (rows - 1) * dpitch + bytes, what)) return cudaErrorInvalidValue;
    snprintf(what, sizeof what, "%s source", fn);
    if (sd && !check_device_range(src, (rows - 1) * spitch + bytes, what)) return cudaErrorInvalidValue;
    return cudaSuccess;
}

cudaError_t copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t height, cudaMemcpyKind kind, cudaStream_t stream, bool sync, const char *fn)
{
    if (height > 1 && (dpitch < width || spitch < width)) {
        report("%s: pitch (%zu, %zu) smaller than the row width %zu", fn, dpitch, spitch, width);
        return set_error(cudaErrorInvalidPitchValue);
    }
    if (sync && capture_forbids(fn)) return set_error(cudaErrorStreamCaptureUnsupported);
    cudaStream_t s = resolve_stream(sync ? 0 : stream);
    if (!s) return set_error(stream ? cudaErrorInvalidResourceHandle : cudaErrorInvalidDevice);
    cudaError_t rc = check_copy(dst, src, width, height, dpitch, spitch, kind, fn);
    if (rc != cudaSuccess) return set_error(rc);
    if (!width || !height) return cudaSuccess;
    const bool src_pageable = !find_alloc(src), dst_pageable = !find_alloc(dst);
    std::function<void()> fn_copy;
    if (src_pageable && !sync && !s->capture) {
        /* from pageable memory the source is staged before the call returns */
        auto snap = std::make_shared<std::vector<char>>((height - 1) * spitch + width);
        memcpy(snap->data(), src, snap->size());
        fn_copy = [=]() {
            for (size_t r = 0; r < height; r++) memcpy((char *)dst + r * dpitch, snap->data() + r * spitch, width);
        };
    } else {
        fn_copy = [=]() {
            for (size_t r = 0; r < height; r++)
                memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
        };
    }
    rc = enqueue(s, fn, fn_copy);
    if (rc != cudaSuccess) return set_error(rc);
    /* a synchronous copy, and an asynchronous one into pageable memory,
     * return once the copy is done */
    if ((sync || (dst_pageable && kind != cudaMemcpyHostToHost)) && !s->capture) flush(s, s->enq);
    return cudaSuccess;
}

cudaError_t memset_impl(void *p, int value, size_t bytes, cudaStream_t stream, const char *fn)
{
    cudaStream_t s = resolve_stream(stream);
    if (!s) return set_error(cudaErrorInvalidResourceHandle);
    if (bytes && !check_device_range(p, bytes, fn)) return set_error(cudaErrorInvalidValue);
    return set_error(enqueue(s, fn, [=]() { memset(p, value, bytes); }));
}

} // namespace

std::recursive_mutex &big_lock()
{
    static std::recursive_mutex m;
    return m;
}

void report(const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "dolphin cuda-emu: %s\n", msg);
}

void fault(const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "dolphin cuda-emu: FAULT: %s\n", msg);
    fflush(stderr);
    abort();
}

cudaError_t set_error(cudaError_t e)
{
    if (e != cudaSuccess) t_err = e;
    return e;
}

const alloc_info *find_alloc(const void *p)
{
    state &s = st();
    const uintptr_t u = (uintptr_t)p;
    auto it = s.allocs.upper_bound(u);
    if (it == s.allocs.begin()) return NULL;
    --it;
    const alloc_info &a = it->second;
    if (u >= a.base && (u < a.base + a.size || (a.size == 0 && u == a.base))) return &a;
    return NULL;
}

bool check_device_range(const void *p, size_t bytes, const char *what)
{
    const alloc_info *a = find_alloc(p);
    if (!a || a->kind != MEM_DEVICE) {
        report("%s: %p is not device memory", what, p);
        return false;
    }
    const size_t off = (uintptr_t)p - a->base;
    if (bytes > a->size - off) {
        report("%s: %zu bytes at offset %zu overrun the device allocation of %zu bytes at %p", what,
               bytes, off, a->size, (void *)a->base);
        return false;
    }
    return true;
}

bool stream_device(cudaStream_t s, int *dev)
{
    cudaStream_t r = resolve_stream(s);
    if (!r) return false;
    *dev = r->device;
    return true;
}

int current_device(void) { return t_dev; }
int compute_capability(void) { return st().cc; }

cudaError_t enqueue(cudaStream_t s0, const char *what, std::function<void()> fn)
{
    cudaStream_t s = resolve_stream(s0);
    if (!s) return cudaErrorInvalidResourceHandle;
    if (s->capture) {
        s->capture->nodes.push_back(std::move(fn));
        return cudaSuccess;
    }
    device &d = st().devs[(size_t)s->device];
    if (s->legacy)
        for (cudaStream_t c : d.streams)
            if (c->capture && !(c->flags & cudaStreamNonBlocking)) {
                /* the legacy stream would wait for a capturing stream */
                c->capture_invalid = true;
                report("%s on the legacy default stream while a blocking stream captures: the capture is "
                       "invalidated", what);
                return cudaErrorStreamCaptureImplicit;
            }
    work w;
    w.fn = std::move(fn);
    w.what = what;
    if (s->legacy) {
        for (cudaStream_t c : d.streams)
            if (!(c->flags & cudaStreamNonBlocking)) w.deps.push_back({ c, c->enq });
    } else if (!(s->flags & cudaStreamNonBlocking)) {
        w.deps.push_back({ &d.legacy, d.legacy.enq });
    }
    s->q.push_back(std::move(w));
    s->enq++;
    return cudaSuccess;
}

} // namespace dol_emu

using namespace dol_emu;
#define LOCK std::lock_guard<std::recursive_mutex> lock_(big_lock())

/* ---- launch limits -------------------------------------------------------------- */

namespace {

/* Per-block limits of one architecture (CUDA C++ Programming Guide,
 * "Technical Specifications per Compute Capability"); the same numbers as
 * scripts/cuda-resources. */
struct arch_limits {
    int sm;
    size_t smem_optin; /* most shared memory per block with the opt-in, static included */
};
const arch_limits ARCHS[] = {
    { 75, 64u << 10 }, { 80, 163u << 10 }, { 86, 99u << 10 },
    { 87, 163u << 10 }, { 89, 99u << 10 }, { 90, 227u << 10 },
};
const size_t SMEM_DEFAULT = 48u << 10; /* per block without the opt-in */

/* DOLPHIN_CUDA_EMU_ARCH (sm_75, 75, ...; default sm_75, the smallest limits
 * of the architectures built), read at every launch so a test can switch it. */
const arch_limits &emu_arch(void)
{
    const char *e = getenv("DOLPHIN_CUDA_EMU_ARCH");
    if (!e || !*e) return ARCHS[0];
    const char *num = strncmp(e, "sm_", 3) == 0 ? e + 3 : e;
    const int sm = atoi(num);
    for (const arch_limits &a : ARCHS)
        if (a.sm == sm) return a;
    fault("DOLPHIN_CUDA_EMU_ARCH=%s: expected one of sm_75, sm_80, sm_86, sm_87, sm_89, sm_90", e);
}

std::map<std::string, int> &bounds_map(void)
{
    static std::map<std::string, int> m; /* filled during static initialisation */
    return m;
}

/* cudaFuncAttributeMaxDynamicSharedMemorySize per kernel, as set */
std::map<const void *, size_t> &dyn_smem_attr(void)
{
    static std::map<const void *, size_t> m;
    return m;
}

/* The kernel's dynamic shared memory limit now: as set, or the default. */
size_t dyn_smem_limit(const void *fn)
{
    auto it = dyn_smem_attr().find(fn);
    if (it != dyn_smem_attr().end()) return it->second;
    const size_t stat = static_smem_bytes();
    return stat < SMEM_DEFAULT ? SMEM_DEFAULT - stat : 0;
}

/* "dol_attn_prefill_kernel<1>" -> "dol_attn_prefill_kernel" */
std::string base_name(const char *name)
{
    std::string s(name);
    const size_t lt = s.find('<');
    return lt == std::string::npos ? s : s.substr(0, lt);
}

} // namespace

extern "C" int dol_emu_register_bounds(const char *name, int max_threads)
{
    std::lock_guard<std::recursive_mutex> lock_(big_lock());
    auto &m = bounds_map();
    auto it = m.find(name);
    if (it == m.end() || max_threads < it->second) m[name] = max_threads;
    return max_threads;
}

extern "C" cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    LOCK;
    if (!func) return set_error(cudaErrorInvalidDeviceFunction);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess; /* carve-out: a hint */
    const arch_limits &a = emu_arch();
    const size_t stat = static_smem_bytes();
    if (value < 0 || stat + (size_t)value > a.smem_optin) {
        report("cudaFuncSetAttribute(MaxDynamicSharedMemorySize, %d): with %zu bytes of static shared "
               "memory above the %zu bytes per block of sm_%d", value, stat, a.smem_optin, a.sm);
        return set_error(cudaErrorInvalidValue);
    }
    dyn_smem_attr()[func] = (size_t)value;
    return cudaSuccess;
}

/* The checks of a launch that need no stream: block and grid shape, the
 * kernel's __launch_bounds__, dynamic shared memory against the kernel's
 * limit and the architecture's. cudaSuccess, or the error a GPU would
 * return (also recorded for cudaGetLastError) after one line saying why. */
extern "C" cudaError_t dol_emu_launch_check(const char *name, const void *fn, dim3 grid, dim3 block,
                                            size_t smem)
{
    LOCK;
    const arch_limits &arch = emu_arch();
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (!block.x || !block.y || !block.z || block.x > 1024 || block.y > 1024 || block.z > 64 || threads > 1024) {
        report("launch of %s: block (%u,%u,%u) is not a valid shape (at most 1024 threads, x, y <= 1024, "
               "z <= 64)", name, block.x, block.y, block.z);
        return set_error(cudaErrorInvalidConfiguration);
    }
    if (!grid.x || !grid.y || !grid.z || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
        report("launch of %s: grid (%u,%u,%u) is not a valid shape (x < 2^31, y, z <= 65535)", name,
               grid.x, grid.y, grid.z);
        return set_error(cudaErrorInvalidConfiguration);
    }
    auto b = bounds_map().find(base_name(name));
    if (b != bounds_map().end() && threads > (unsigned long long)b->second) {
        report("launch of %s: %llu threads per block exceed its __launch_bounds__(%d) (sm_%d)", name,
               threads, b->second, arch.sm);
        return set_error(cudaErrorLaunchOutOfResources);
    }
    const size_t stat = static_smem_bytes();
    const size_t limit = dyn_smem_limit(fn);
    if (smem > limit) {
        const bool set = dyn_smem_attr().count(fn) != 0;
        report("launch of %s: %zu bytes of dynamic shared memory exceed the kernel's limit of %zu (%s; "
               "sm_%d allows %zu per block with cudaFuncSetAttribute(MaxDynamicSharedMemorySize))",
               name, smem, limit, set ? "as set by cudaFuncSetAttribute" : "48 KiB minus the static, no opt-in",
               arch.sm, arch.smem_optin);
        return set_error(cudaErrorInvalidValue);
    }
    if (stat + smem > arch.smem_optin) {
        report("launch of %s: %zu bytes of dynamic + %zu static shared memory exceed the %zu bytes per block "
               "of sm_%d", name, smem, stat, arch.smem_optin, arch.sm);
        return set_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

/* ---- launches ------------------------------------------------------------------ */

extern "C" cudaError_t dol_emu_launch(const char *name, const void *fn, dim3 grid, dim3 block,
                                      size_t smem, cudaStream_t stream, int n_ptrs,
                                      const void *const *ptrs, std::function<void()> *body)
{
    LOCK;
    const cudaError_t ck = dol_emu_launch_check(name, fn, grid, block, smem);
    if (ck != cudaSuccess) return ck;
    int sdev = 0;
    if (!stream_device(stream, &sdev)) {
        report("launch of %s: invalid stream %p", name, (void *)stream);
        return set_error(cudaErrorInvalidResourceHandle);
    }
    if (sdev != t_dev) {
        report("launch of %s: stream of device %d while device %d is current", name, sdev, t_dev);
        return set_error(cudaErrorInvalidResourceHandle);
    }
    for (int i = 0; i < n_ptrs; i++) {
        if (!ptrs[i]) continue;
        const alloc_info *a = find_alloc(ptrs[i]);
        if (!a) {
            report("launch of %s: pointer argument %p is host memory, not device memory", name, ptrs[i]);
            return set_error(cudaErrorInvalidValue);
        }
        if (a->kind == MEM_DEVICE && a->device != sdev) {
            report("launch of %s: pointer argument %p is memory of device %d, the launch is on device %d",
                   name, ptrs[i], a->device, sdev);
            return set_error(cudaErrorInvalidValue);
        }
    }
    launch_rec l{ name, grid, block, smem, std::make_shared<std::function<void()>>(std::move(*body)) };
    return set_error(enqueue(stream, name, [l]() { run_grid(l); }));
}

/* ---- errors and devices ---------------------------------------------------------- */

extern "C" const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
#define E(x) case x: return #x;
    E(cudaSuccess) E(cudaErrorInvalidValue) E(cudaErrorMemoryAllocation) E(cudaErrorInitializationError)
    E(cudaErrorInvalidConfiguration) E(cudaErrorInvalidPitchValue) E(cudaErrorInvalidMemcpyDirection)
    E(cudaErrorInvalidDevice) E(cudaErrorNoDevice) E(cudaErrorInvalidResourceHandle) E(cudaErrorNotReady)
    E(cudaErrorStreamCaptureUnsupported) E(cudaErrorStreamCaptureInvalidated) E(cudaErrorStreamCaptureImplicit)
    E(cudaErrorStreamCaptureUnmatched) E(cudaErrorIllegalState) E(cudaErrorNoKernelImageForDevice)
    E(cudaErrorLaunchOutOfResources) E(cudaErrorInvalidDeviceFunction) E(cudaErrorNotSupported)
#undef E
    default: return "cudaErrorUnknown";
    }
}

extern "C" const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidPitchValue: return "invalid pitch argument";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream";
    case cudaErrorIllegalState: return "the operation is not permitted in the current state";
    case cudaErrorNoKernelImageForDevice: return "no kernel image is available for execution on the device";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "unknown error";
    }
}

extern "C" cudaError_t cudaGetLastError(void)
{
    cudaError_t e = t_err;
    t_err = cudaSuccess;
    return e;
}

extern "C" cudaError_t cudaPeekAtLastError(void) { return t_err; }

extern "C" cudaError_t cudaGetDeviceCount(int *count)
{
    LOCK;
    *count = st().n_dev;
    return st().n_dev ? cudaSuccess : set_error(cudaErrorNoDevice);
}

extern "C" cudaError_t cudaSetDevice(int device)
{
    LOCK;
    if (device < 0 || device >= st().n_dev) return set_error(cudaErrorInvalidDevice);
    t_dev = device;
    dev_init();
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetDevice(int *device)
{
    *device = t_dev;
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    LOCK;
    if (device < 0 || device >= st().n_dev) return set_error(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = st().cc / 10; break;
    case cudaDevAttrComputeCapabilityMinor: *value = st().cc % 10; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxBlockDimX: case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = 2147483647; break;
    case cudaDevAttrMaxGridDimY: case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = 4; break;
    default:
        report("cudaDeviceGetAttribute: attribute %d is not emulated", (int)attr);
        return set_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int device)
{
    LOCK;
    if (device < 0 || device >= st().n_dev) return set_error(cudaErrorInvalidDevice);
    snprintf(bus, (size_t)len, "0000:%02x:00.0", 0xe0 + device);
    return cudaSuccess;
}

extern "C" cudaError_t cudaRuntimeGetVersion(int *v) { *v = CUDART_VERSION; return cudaSuccess; }
extern "C" cudaError_t cudaDriverGetVersion(int *v) { *v = CUDART_VERSION; return cudaSuccess; }

extern "C" cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func)
{
    LOCK;
    if (!func) return set_error(cudaErrorInvalidDeviceFunction);
    memset(attr, 0, sizeof *attr);
    attr->maxThreadsPerBlock = 1024;
    attr->sharedSizeBytes = static_smem_bytes();
    attr->maxDynamicSharedSizeBytes = (int)dyn_smem_limit(func);
    attr->ptxVersion = attr->binaryVersion = st().cc;
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceSynchronize(void)
{
    LOCK;
    if (capture_forbids("cudaDeviceSynchronize")) return set_error(cudaErrorStreamCaptureUnsupported);
    if (!dev_init()) return set_error(cudaErrorInvalidDevice);
    flush_device(t_dev);
    return cudaSuccess;
}

/* ---- memory ---------------------------------------------------------------------- */

static cudaError_t alloc_impl(void **p, size_t size, mem_kind kind, const char *fn)
{
    state &s = st();
    device *d = dev_init();
    if (!d) return set_error(cudaErrorInvalidDevice);
    if (kind == MEM_DEVICE && capture_forbids(fn)) return set_error(cudaErrorStreamCaptureUnsupported);
    if (kind == MEM_DEVICE && size > s.mem_total - d->used) {
        report("%s: %zu bytes requested, %zu of the device's %zu free", fn, size, s.mem_total - d->used, s.mem_total);
        *p = NULL;
        return set_error(cudaErrorMemoryAllocation);
    }
    void *m = NULL;
    if (posix_memalign(&m, 256, size ? size : 1) != 0) return set_error(cudaErrorMemoryAllocation);
    /* fresh device memory holds garbage on a GPU: 0xFF bytes (NaN) here */
    if (kind == MEM_DEVICE) memset(m, 0xff, size);
    s.allocs[(uintptr_t)m] = alloc_info{ (uintptr_t)m, size, t_dev, kind };
    if (kind == MEM_DEVICE) d->used += size;
    *p = m;
    return cudaSuccess;
}

static cudaError_t free_impl(void *p, mem_kind kind, const char *fn)
{
    if (!p) { dev_init(); return cudaSuccess; }
    state &s = st();
    auto it = s.allocs.find((uintptr_t)p);
    if (it == s.allocs.end() || it->second.kind != kind) {
        report("%s(%p): not the start of a live %s allocation", fn, p, kind == MEM_DEVICE ? "device" : "pinned");
        return set_error(cudaErrorInvalidValue);
    }
    /* freeing synchronises the device first, as on a GPU */
    flush_device(it->second.device);
    if (kind == MEM_DEVICE) s.devs[(size_t)it->second.device].used -= it->second.size;
    s.allocs.erase(it);
    free(p);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMalloc(void **p, size_t size) { LOCK; return alloc_impl(p, size, MEM_DEVICE, "cudaMalloc"); }
extern "C" cudaError_t cudaFree(void *p) { LOCK; return free_impl(p, MEM_DEVICE, "cudaFree"); }
extern "C" cudaError_t cudaMallocHost(void **p, size_t size) { LOCK; return alloc_impl(p, size, MEM_PINNED, "cudaMallocHost"); }
extern "C" cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags)
{
    LOCK;
    (void)flags;
    return alloc_impl(p, size, MEM_PINNED, "cudaHostAlloc");
}
extern "C" cudaError_t cudaFreeHost(void *p) { LOCK; return free_impl(p, MEM_PINNED, "cudaFreeHost"); }

extern "C" cudaError_t cudaMemGetInfo(size_t *fr, size_t *total)
{
    LOCK;
    device *d = dev_init();
    if (!d) return set_error(cudaErrorInvalidDevice);
    *total = st().mem_total;
    *fr = st().mem_total - d->used;
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    LOCK;
    return copy2d(dst, count, src, count, count, 1, kind, 0, true, "cudaMemcpy");
}
extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                                       cudaStream_t stream)
{
    LOCK;
    return copy2d(dst, count, src, count, count, 1, kind, stream, false, "cudaMemcpyAsync");
}
extern "C" cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                    size_t height, enum cudaMemcpyKind kind)
{
    LOCK;
    return copy2d(dst, dpitch, src, spitch, width, height, kind, 0, true, "cudaMemcpy2D");
}
extern "C" cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                         size_t width, size_t height, enum cudaMemcpyKind kind,
                                         cudaStream_t stream)
{
    LOCK;
    return copy2d(dst, dpitch, src, spitch, width, height, kind, stream, false, "cudaMemcpy2DAsync");
}
/* Peer access: every pair of distinct virtual devices may map each other's
 * memory unless DOLPHIN_CUDA_EMU_PEER=0 (then copies between devices must go
 * through the host). A peer copy is queued on a stream of the destination
 * device and, as on a GPU, does not wait for the source device's streams:
 * a copy of data not yet written there reads stale bytes. */
static bool peer_allowed(void)
{
    const char *e = getenv("DOLPHIN_CUDA_EMU_PEER");
    return !(e && strcmp(e, "0") == 0);
}
extern "C" cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer)
{
    LOCK;
    const int n = st().n_dev;
    if (device < 0 || device >= n || peer < 0 || peer >= n) return set_error(cudaErrorInvalidDevice);
    *can = device != peer && peer_allowed();
    return cudaSuccess;
}
extern "C" cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags)
{
    LOCK;
    (void)flags;
    if (peer < 0 || peer >= st().n_dev || peer == t_dev || !peer_allowed())
        return set_error(cudaErrorInvalidDevice);
    return cudaSuccess;
}
extern "C" cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_dev, const void *src, int src_dev, size_t count,
                                           cudaStream_t stream)
{
    LOCK;
    const alloc_info *d = find_alloc(dst), *sa = find_alloc(src);
    if (!d || d->kind != MEM_DEVICE || d->device != dst_dev || !sa || sa->kind != MEM_DEVICE ||
        sa->device != src_dev) {
        report("cudaMemcpyPeerAsync: %p is not device %d memory or %p is not device %d memory", dst, dst_dev,
               src, src_dev);
        return set_error(cudaErrorInvalidValue);
    }
    cudaStream_t s = resolve_stream(stream);
    if (!s || s->device != dst_dev) {
        report("cudaMemcpyPeerAsync: the stream is not one of device %d", dst_dev);
        return set_error(cudaErrorInvalidResourceHandle);
    }
    if (!check_device_range(dst, count, "cudaMemcpyPeerAsync destination") ||
        !check_device_range(src, count, "cudaMemcpyPeerAsync source"))
        return set_error(cudaErrorInvalidValue);
    return set_error(enqueue(s, "cudaMemcpyPeerAsync", [=]() { memmove(dst, src, count); }));
}

/* Asynchronous with respect to the host for device memory, as documented. */
extern "C" cudaError_t cudaMemset(void *p, int value, size_t count) { LOCK; return memset_impl(p, value, count, 0, "cudaMemset"); }
extern "C" cudaError_t cudaMemsetAsync(void *p, int value, size_t count, cudaStream_t stream)
{
    LOCK;
    return memset_impl(p, value, count, stream, "cudaMemsetAsync");
}

/* ---- streams ----------------------------------------------------------------------- */

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ps, unsigned int flags)
{
    LOCK;
    device *d = dev_init();
    if (!d) return set_error(cudaErrorInvalidDevice);
    cudaStream_t s = new CUstream_st;
    s->device = t_dev;
    s->flags = flags;
    s->legacy = false;
    d->streams.insert(s);
    *ps = s;
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamCreate(cudaStream_t *ps) { return cudaStreamCreateWithFlags(ps, 0); }

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    LOCK;
    cudaStream_t r = resolve_stream(s);
    if (!r || r->legacy) return set_error(cudaErrorInvalidResourceHandle);
    if (r->capture) return set_error(cudaErrorIllegalState);
    flush(r, r->enq); /* pending work still completes */
    st().devs[(size_t)r->device].streams.erase(r);
    delete r;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    LOCK;
    cudaStream_t r = resolve_stream(s);
    if (!r) return set_error(cudaErrorInvalidResourceHandle);
    if (r->capture || capture_forbids("cudaStreamSynchronize")) {
        if (r->capture) r->capture_invalid = true;
        return set_error(cudaErrorStreamCaptureUnsupported);
    }
    flush(r, r->enq);
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamQuery(cudaStream_t s)
{
    LOCK;
    cudaStream_t r = resolve_stream(s);
    if (!r) return set_error(cudaErrorInvalidResourceHandle);
    return r->done == r->enq ? cudaSuccess : cudaErrorNotReady;
}

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int flags)
{
    LOCK;
    (void)flags;
    cudaStream_t r = resolve_stream(s);
    if (!r || !st().events.count(ev)) return set_error(cudaErrorInvalidResourceHandle);
    if (!ev->stream) return cudaSuccess;
    if (r->capture) return set_error(cudaErrorStreamCaptureUnsupported);
    /* an empty item whose dependency is the event's point in its stream */
    cudaError_t rc = enqueue(r, "cudaStreamWaitEvent", nullptr);
    if (rc == cudaSuccess) r->q.back().deps.push_back({ ev->stream, ev->seq });
    return set_error(rc);
}

extern "C" cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    LOCK;
    cudaStream_t r = resolve_stream(s);
    if (!r) return set_error(cudaErrorInvalidResourceHandle);
    if (r->legacy) {
        report("cudaStreamBeginCapture: the legacy default stream cannot be captured");
        return set_error(cudaErrorStreamCaptureUnsupported);
    }
    if (r->capture) return set_error(cudaErrorIllegalState);
    r->capture = new CUgraph_st;
    r->capture->device = r->device;
    r->capture_invalid = false;
    r->capture_global = mode != cudaStreamCaptureModeRelaxed;
    if (r->capture_global) {
        t_capturing++;
        t_capture_stream = r;
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    LOCK;
    cudaStream_t r = resolve_stream(s);
    if (!r) return set_error(cudaErrorInvalidResourceHandle);
    if (!r->capture) return set_error(cudaErrorStreamCaptureUnmatched);
    CUgraph_st *graph = r->capture;
    r->capture = NULL;
    if (r->capture_global) {
        t_capturing--;
        if (t_capture_stream == r) t_capture_stream = NULL;
    }
    if (r->capture_invalid) {
        delete graph;
        *g = NULL;
        return set_error(cudaErrorStreamCaptureInvalidated);
    }
    st().graphs.insert(graph);
    *g = graph;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status)
{
    LOCK;
    cudaStream_t r = resolve_stream(s);
    if (!r) return set_error(cudaErrorInvalidResourceHandle);
    *status = !r->capture ? cudaStreamCaptureStatusNone
              : r->capture_invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

/* ---- events ------------------------------------------------------------------------- */

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags)
{
    LOCK;
    if (!dev_init()) return set_error(cudaErrorInvalidDevice);
    cudaEvent_t e = new CUevent_st;
    e->device = t_dev;
    e->flags = flags;
    st().events.insert(e);
    *ev = e;
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventCreate(cudaEvent_t *ev) { return cudaEventCreateWithFlags(ev, 0); }

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
    LOCK;
    if (!st().events.erase(ev)) return set_error(cudaErrorInvalidResourceHandle);
    /* the stream items that would complete it may still be queued: keep the
     * object alive (a tiny leak per destroyed event is harmless here) */
    if (ev->stream && ev->stream->done >= ev->seq) delete ev;
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s)
{
    LOCK;
    cudaStream_t r = resolve_stream(s);
    if (!r || !st().events.count(ev)) return set_error(cudaErrorInvalidResourceHandle);
    if (r->capture) {
        report("cudaEventRecord during capture is not emulated");
        return set_error(cudaErrorStreamCaptureUnsupported);
    }
    cudaError_t rc = enqueue(r, "cudaEventRecord", [ev]() { ev->ms = now_ms(); });
    if (rc != cudaSuccess) return set_error(rc);
    ev->stream = r;
    ev->seq = r->enq;
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
    LOCK;
    if (!st().events.count(ev)) return set_error(cudaErrorInvalidResourceHandle);
    if (capture_forbids("cudaEventSynchronize")) return set_error(cudaErrorStreamCaptureUnsupported);
    if (ev->stream) flush(ev->stream, ev->seq);
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventQuery(cudaEvent_t ev)
{
    LOCK;
    if (!st().events.count(ev)) return set_error(cudaErrorInvalidResourceHandle);
    return !ev->stream || ev->stream->done >= ev->seq ? cudaSuccess : cudaErrorNotReady;
}

extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    LOCK;
    if (!st().events.count(a) || !st().events.count(b)) return set_error(cudaErrorInvalidResourceHandle);
    if ((a->flags | b->flags) & cudaEventDisableTiming) return set_error(cudaErrorInvalidResourceHandle);
    if (!a->stream || !b->stream || a->stream->done < a->seq || b->stream->done < b->seq)
        return set_error(cudaErrorNotReady);
    *ms = (float)(b->ms - a->ms);
    return cudaSuccess;
}

/* ---- graphs -------------------------------------------------------------------------- */

extern "C" cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pe, cudaGraph_t g, unsigned long long flags)
{
    LOCK;
    (void)flags;
    if (!st().graphs.count(g)) return set_error(cudaErrorInvalidResourceHandle);
    cudaGraphExec_t e = new CUgraphExec_st;
    e->device = g->device;
    e->nodes = g->nodes;
    st().execs.insert(e);
    *pe = e;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s)
{
    LOCK;
    if (!st().execs.count(e)) return set_error(cudaErrorInvalidResourceHandle);
    int dev = 0;
    if (!stream_device(s, &dev) || dev != e->device) return set_error(cudaErrorInvalidResourceHandle);
    auto nodes = std::make_shared<std::vector<std::function<void()>>>(e->nodes);
    return set_error(enqueue(s, "cudaGraphLaunch", [nodes]() {
        for (auto &n : *nodes) n();
    }));
}

extern "C" cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    LOCK;
    if (!st().graphs.erase(g)) return set_error(cudaErrorInvalidResourceHandle);
    delete g;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e)
{
    LOCK;
    if (!st().execs.erase(e)) return set_error(cudaErrorInvalidResourceHandle);
    delete e; /* a queued launch holds its own copy of the nodes */
    return cudaSuccess;
}
