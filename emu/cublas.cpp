/* emu/cublas.cpp — cuBLAS for the CUDA emulation: handles, streams,
 * workspaces, and GEMM (cublasGemmEx, cublasSgemm) as a reference product
 * that first validates every argument — operations, m/n/k, lda/ldb/ldc
 * against cuBLAS's column-major rules, the type and compute-type
 * combination, that A, B and C are device memory holding the whole extent
 * the call addresses, that alpha and beta are host values — and then
 * computes C = alpha op(A) op(B) + beta C exactly as cuBLAS defines it
 * (column-major; C is not read when beta is 0), queued on the handle's
 * stream like any other work. Sums in double, rounded once. */
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include "internal.h"

#include <stdio.h>
#include <string.h>

#include <set>
#include <vector>

struct cublasContext {
    cudaStream_t stream = 0;
    void *ws = NULL;
    size_t ws_bytes = 0;
    int device = 0;
};

using namespace dol_emu;

namespace {

std::set<cublasHandle_t> g_handles;

float load(const void *base, cudaDataType t, size_t i)
{
    switch (t) {
    case CUDA_R_32F: return ((const float *)base)[i];
    case CUDA_R_16F: {
        __half_raw r;
        r.x = ((const unsigned short *)base)[i];
        return __half2float(__half(r));
    }
    default: { /* CUDA_R_16BF */
        const uint32_t b = (uint32_t)((const unsigned short *)base)[i] << 16;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    }
}

void store(void *base, cudaDataType t, size_t i, float v)
{
    if (t == CUDA_R_32F) {
        ((float *)base)[i] = v;
    } else if (t == CUDA_R_16F) {
        __half_raw r = __half_raw(__float2half_rn(v));
        ((unsigned short *)base)[i] = r.x;
    } else {
        uint32_t b;
        memcpy(&b, &v, 4);
        b += 0x7fffu + ((b >> 16) & 1u); /* round to nearest even (NaN not special-cased) */
        ((unsigned short *)base)[i] = (unsigned short)(b >> 16);
    }
}

size_t type_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

const char *op_name(cublasOperation_t o) { return o == CUBLAS_OP_N ? "N" : o == CUBLAS_OP_T ? "T" : "C"; }

/* The types cuBLAS accepts for real GEMM with these compute types. */
bool types_ok(cudaDataType a, cudaDataType b, cudaDataType c, cublasComputeType_t ct)
{
    if (a != b) return false;
    switch (ct) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
        return (a == CUDA_R_32F && c == CUDA_R_32F) || (a == CUDA_R_16F && (c == CUDA_R_16F || c == CUDA_R_32F)) ||
               (a == CUDA_R_16BF && (c == CUDA_R_16BF || c == CUDA_R_32F));
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_TF32:
        return a == CUDA_R_32F && c == CUDA_R_32F;
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC:
        return a == CUDA_R_16F && c == CUDA_R_16F;
    default:
        return false;
    }
}

/* The operand of `rows` x `cols` in storage (column-major, leading dimension
 * ld) spans ld*(cols-1)+rows elements. */
bool extent_ok(const char *fn, const char *name, const void *p, cudaDataType t, int rows, int cols, int ld)
{
    if (rows == 0 || cols == 0) return true;
    const size_t elems = (size_t)ld * (size_t)(cols - 1) + (size_t)rows;
    char what[128];
    snprintf(what, sizeof what, "%s: matrix %s (%d x %d stored, ld %d)", fn, name, rows, cols, ld);
    return check_device_range(p, elems * type_size(t), what);
}

cublasStatus_t gemm(const char *fn, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                    int n, int k, const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                    cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                    cublasComputeType_t comp)
{
    std::lock_guard<std::recursive_mutex> lk(big_lock());
    if (!g_handles.count(h)) {
        report("%s: invalid or destroyed handle %p", fn, (void *)h);
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    const bool ops_ok = (ta == CUBLAS_OP_N || ta == CUBLAS_OP_T || ta == CUBLAS_OP_C) &&
                        (tb == CUBLAS_OP_N || tb == CUBLAS_OP_T || tb == CUBLAS_OP_C);
    if (!ops_ok || m < 0 || n < 0 || k < 0) {
        report("%s: invalid operations (%d, %d) or sizes m=%d n=%d k=%d", fn, (int)ta, (int)tb, m, n, k);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    /* op(A) is m x k: A is stored m x k (N) or k x m (T); likewise B */
    const int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
    const int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
    if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1)) {
        report("%s(%s, %s, m=%d, n=%d, k=%d): lda=%d (needs >= %d), ldb=%d (needs >= %d), ldc=%d (needs >= %d)",
               fn, op_name(ta), op_name(tb), m, n, k, lda, a_rows > 1 ? a_rows : 1, ldb, b_rows > 1 ? b_rows : 1,
               ldc, m > 1 ? m : 1);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!types_ok(at, bt, ct, comp)) {
        report("%s: types A=%d B=%d C=%d with compute type %d are not a supported combination", fn, (int)at,
               (int)bt, (int)ct, (int)comp);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!alpha || !beta || find_alloc(alpha) || find_alloc(beta)) {
        report("%s: alpha and beta must be host values (CUBLAS_POINTER_MODE_HOST)", fn);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    int dev = 0;
    if (!stream_device(h->stream, &dev) || dev != current_device() || dev != h->device) {
        report("%s: the handle's stream is not on the current device %d", fn, current_device());
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if ((k > 0 && (!extent_ok(fn, "A", A, at, a_rows, a_cols, lda) || !extent_ok(fn, "B", B, bt, b_rows, b_cols, ldb))) ||
        !extent_ok(fn, "C", C, ct, m, n, ldc))
        return CUBLAS_STATUS_INVALID_VALUE;
    /* host alpha and beta are read when the call is made */
    float al, be;
    if (comp == CUBLAS_COMPUTE_16F || comp == CUBLAS_COMPUTE_16F_PEDANTIC) {
        al = load(alpha, CUDA_R_16F, 0);
        be = load(beta, CUDA_R_16F, 0);
    } else {
        memcpy(&al, alpha, 4);
        memcpy(&be, beta, 4);
    }
    auto run = [=]() {
        std::vector<float> arow((size_t)k), bcol((size_t)k);
        for (int j = 0; j < n; j++) {
            for (int p = 0; p < k; p++)
                bcol[(size_t)p] = load(B, bt, tb == CUBLAS_OP_N ? (size_t)p + (size_t)j * ldb : (size_t)j + (size_t)p * ldb);
            for (int i = 0; i < m; i++) {
                double s = 0.0;
                if (ta == CUBLAS_OP_N)
                    for (int p = 0; p < k; p++) s += (double)load(A, at, (size_t)i + (size_t)p * lda) * bcol[(size_t)p];
                else {
                    const size_t off = (size_t)i * lda;
                    for (int p = 0; p < k; p++) s += (double)load(A, at, off + (size_t)p) * bcol[(size_t)p];
                }
                const size_t ci = (size_t)i + (size_t)j * ldc;
                float v = al * (float)s;
                if (be != 0.0f) v += be * load(C, ct, ci);
                store(C, ct, ci, v);
            }
        }
        (void)arow;
    };
    cudaError_t rc = enqueue(h->stream, fn, run);
    if (rc != cudaSuccess) {
        report("%s: cannot queue the product: %s", fn, cudaGetErrorString(rc));
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace

extern "C" cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
    std::lock_guard<std::recursive_mutex> lk(big_lock());
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    cublasHandle_t c = new cublasContext;
    c->device = current_device();
    g_handles.insert(c);
    *h = c;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
    std::lock_guard<std::recursive_mutex> lk(big_lock());
    if (!g_handles.erase(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> lk(big_lock());
    if (!g_handles.count(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    int dev = 0;
    if (!stream_device(s, &dev)) {
        report("cublasSetStream: invalid stream %p", (void *)s);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetStream_v2(cublasHandle_t h, cudaStream_t *s)
{
    if (!g_handles.count(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    *s = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t bytes)
{
    std::lock_guard<std::recursive_mutex> lk(big_lock());
    if (!g_handles.count(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && !check_device_range(ws, bytes, "cublasSetWorkspace")) return CUBLAS_STATUS_INVALID_VALUE;
    if (((uintptr_t)ws & 255u) != 0) {
        report("cublasSetWorkspace: %p is not 256-byte aligned", ws);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    h->ws = ws;
    h->ws_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode)
{
    (void)mode;
    return g_handles.count(h) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

extern "C" const char *cublasGetStatusName(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

extern "C" const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "unknown error";
    }
}

extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                       int n, int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                       const void *B, cudaDataType bt, int ldb, const void *beta, void *C,
                                       cudaDataType ct, int ldc, cublasComputeType_t comp, cublasGemmAlgo_t algo)
{
    if (!(algo == CUBLAS_GEMM_DEFAULT || algo == CUBLAS_GEMM_DEFAULT_TENSOR_OP ||
          (algo >= CUBLAS_GEMM_ALGO0 && algo <= CUBLAS_GEMM_ALGO23) ||
          (algo >= CUBLAS_GEMM_ALGO0_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP))) {
        report("cublasGemmEx: invalid algorithm %d", (int)algo);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return gemm("cublasGemmEx", h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, comp);
}

extern "C" cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                         int n, int k, const float *alpha, const float *A, int lda, const float *B,
                                         int ldb, const float *beta, float *C, int ldc)
{
    return gemm("cublasSgemm", h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, beta, C,
                CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F);
}
