/* emu/cublas.cpp — cuBLAS for the CUDA emulation: handles, streams,
 * workspaces, and GEMM (cublasGemmEx, cublasSgemm) as a reference product
 * that first validates every argument — operations, m/n/k, lda/ldb/ldc
 * against cuBLAS's column-major rules, the type and compute-type
 * combination, that A, B and C are device memory holding the whole extent
 * the call addresses, that alpha and beta are host values — and then
 * computes C = alpha op(A) op(B) + beta C exactly as cuBLAS defines it
 * (column-major; C is not read when beta is 0), queued on the handle's
 * stream like any other work. Sums in double, rounded once. cuBLASLt's
 * cublasLtMatmul goes through the same checks, its layouts checked against
 * the operation (column-major, no batches). */
#include <cublasLt.h>
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

/* The hot loops below read extents that gemm() has already checked against
 * the device allocations, so they skip the sanitizers' per-access checks. */
#define EMU_HOT __attribute__((no_sanitize("address", "undefined")))

/* n elements of base starting at element `first`, `stride` apart, as
 * floats into out; F16 through a table built once */
EMU_HOT void load_row(float *out, const void *base, cudaDataType t, int n, size_t first, size_t stride)
{
    static const std::vector<float> f16 = [] {
        std::vector<float> v(65536);
        for (uint32_t b = 0; b < 65536; b++) {
            const unsigned short h = (unsigned short)b;
            v[b] = load(&h, CUDA_R_16F, 0);
        }
        return v;
    }();
    if (t == CUDA_R_32F) {
        const float *p = (const float *)base + first;
        for (int e = 0; e < n; e++) out[e] = p[(size_t)e * stride];
    } else if (t == CUDA_R_16F) {
        const unsigned short *p = (const unsigned short *)base + first;
        for (int e = 0; e < n; e++) out[e] = f16[p[(size_t)e * stride]];
    } else {
        for (int e = 0; e < n; e++) out[e] = load(base, t, first + (size_t)e * stride);
    }
}

/* sum over p of a[p] * b[p], in double, in order */
EMU_HOT double dot(const float *a, const float *b, int k)
{
    double s = 0.0;
    for (int p = 0; p < k; p++) s += (double)a[p] * b[p];
    return s;
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

/* D = alpha op(A) op(B) + beta C on `stream` (cuBLAS: D is C). */
cublasStatus_t gemm(const char *fn, cudaStream_t stream, cublasOperation_t ta, cublasOperation_t tb, int m,
                    int n, int k, const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                    cudaDataType bt, int ldb, const void *beta, const void *C, cudaDataType ct, int ldc,
                    void *D, int ldd, cublasComputeType_t comp)
{
    std::lock_guard<std::recursive_mutex> lk(big_lock());
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
    if (!stream_device(stream, &dev) || dev != current_device()) {
        report("%s: the handle's stream is not on the current device %d", fn, current_device());
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if ((k > 0 && (!extent_ok(fn, "A", A, at, a_rows, a_cols, lda) || !extent_ok(fn, "B", B, bt, b_rows, b_cols, ldb))) ||
        !extent_ok(fn, "C", C, ct, m, n, ldc) || !extent_ok(fn, "D", D, ct, m, n, ldd))
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
        /* op(A) as m rows of k floats, converted once per call; each column
         * of op(B) likewise; the same single double sum per element */
        std::vector<float> arows((size_t)m * (size_t)k), bcol((size_t)k);
        for (int i = 0; i < m; i++)
            load_row(arows.data() + (size_t)i * k, A, at, k,
                     ta == CUBLAS_OP_N ? (size_t)i : (size_t)i * lda, ta == CUBLAS_OP_N ? (size_t)lda : 1);
        for (int j = 0; j < n; j++) {
            load_row(bcol.data(), B, bt, k, tb == CUBLAS_OP_N ? (size_t)j * ldb : (size_t)j,
                     tb == CUBLAS_OP_N ? 1 : (size_t)ldb);
            for (int i = 0; i < m; i++) {
                const double s = dot(arows.data() + (size_t)i * k, bcol.data(), k);
                float v = al * (float)s;
                if (be != 0.0f) v += be * load(C, ct, (size_t)i + (size_t)j * ldc);
                store(D, ct, (size_t)i + (size_t)j * ldd, v);
            }
        }
    };
    cudaError_t rc = enqueue(stream, fn, run);
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
    std::lock_guard<std::recursive_mutex> lk(big_lock());
    if (!g_handles.count(h)) {
        report("cublasGemmEx: invalid or destroyed handle %p", (void *)h);
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    return gemm("cublasGemmEx", h->stream, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, C,
                ldc, comp);
}

extern "C" cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                         int n, int k, const float *alpha, const float *A, int lda, const float *B,
                                         int ldb, const float *beta, float *C, int ldc)
{
    std::lock_guard<std::recursive_mutex> lk(big_lock());
    if (!g_handles.count(h)) {
        report("cublasSgemm: invalid or destroyed handle %p", (void *)h);
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    return gemm("cublasSgemm", h->stream, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, beta, C,
                CUDA_R_32F, ldc, C, ldc, CUBLAS_COMPUTE_32F);
}

/* ---- cuBLASLt ---------------------------------------------------------------- */

namespace {

const uint64_t LT_DESC = 0x444f4c4c54444553ull, LT_LAYOUT = 0x444f4c4c544c4159ull;
std::set<cublasLtHandle_t> g_lt;

/* data[]: magic, compute type, scale type, transa, transb */
bool desc_ok(cublasLtMatmulDesc_t d) { return d && d->data[0] == LT_DESC; }
/* data[]: magic, type, rows, cols, ld, order, batch count */
bool layout_ok(cublasLtMatrixLayout_t l) { return l && l->data[0] == LT_LAYOUT; }

} // namespace

extern "C" cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    std::lock_guard<std::recursive_mutex> lk(big_lock());
    cublasLtHandle_t c = (cublasLtHandle_t) new cublasContext;
    g_lt.insert(c);
    *h = c;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    std::lock_guard<std::recursive_mutex> lk(big_lock());
    if (!g_lt.erase(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete (cublasContext *)h;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t comp,
                                                   cudaDataType_t scale)
{
    cublasLtMatmulDesc_t x = new cublasLtMatmulDescOpaque_t();
    x->data[0] = LT_DESC;
    x->data[1] = (uint64_t)comp;
    x->data[2] = (uint64_t)scale;
    x->data[3] = CUBLAS_OP_N;
    x->data[4] = CUBLAS_OP_N;
    *d = x;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    if (!desc_ok(d)) return CUBLAS_STATUS_INVALID_VALUE;
    d->data[0] = 0;
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                         const void *buf, size_t size)
{
    if (!desc_ok(d) || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_DESC_TRANSA || attr == CUBLASLT_MATMUL_DESC_TRANSB) {
        int32_t op;
        if (size != sizeof op) {
            report("cublasLtMatmulDescSetAttribute: %zu bytes for a transpose attribute (needs %zu)", size, sizeof op);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        memcpy(&op, buf, sizeof op);
        d->data[attr == CUBLASLT_MATMUL_DESC_TRANSA ? 3 : 4] = (uint64_t)op;
        return CUBLAS_STATUS_SUCCESS;
    }
    report("cublasLtMatmulDescSetAttribute: attribute %d is not emulated", (int)attr);
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

extern "C" cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows,
                                                     uint64_t cols, int64_t ld)
{
    cublasLtMatrixLayout_t x = new cublasLtMatrixLayoutOpaque_t();
    x->data[0] = LT_LAYOUT;
    x->data[1] = (uint64_t)type;
    x->data[2] = rows;
    x->data[3] = cols;
    x->data[4] = (uint64_t)ld;
    x->data[5] = CUBLASLT_ORDER_COL;
    x->data[6] = 1;
    *l = x;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    if (!layout_ok(l)) return CUBLAS_STATUS_INVALID_VALUE;
    l->data[0] = 0;
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                           const void *buf, size_t size)
{
    if (!layout_ok(l) || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATRIX_LAYOUT_ORDER && size == sizeof(int32_t)) {
        int32_t v;
        memcpy(&v, buf, sizeof v);
        l->data[5] = (uint64_t)v;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && size == sizeof(int32_t)) {
        int32_t v;
        memcpy(&v, buf, sizeof v);
        l->data[6] = (uint64_t)v;
        return CUBLAS_STATUS_SUCCESS;
    }
    report("cublasLtMatrixLayoutSetAttribute: attribute %d (%zu bytes) is not emulated", (int)attr, size);
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

extern "C" cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                                         cublasLtMatrixLayout_t Al, const void *B, cublasLtMatrixLayout_t Bl,
                                         const void *beta, const void *C, cublasLtMatrixLayout_t Cl, void *D,
                                         cublasLtMatrixLayout_t Dl, const cublasLtMatmulAlgo_t *algo, void *ws,
                                         size_t ws_bytes, cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> lk(big_lock());
    (void)algo;
    if (!g_lt.count(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!desc_ok(d) || !layout_ok(Al) || !layout_ok(Bl) || !layout_ok(Cl) || !layout_ok(Dl)) {
        report("cublasLtMatmul: a descriptor or layout that was never created or already destroyed");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const cublasLtMatrixLayout_t ls[4] = { Al, Bl, Cl, Dl };
    for (int i = 0; i < 4; i++)
        if (ls[i]->data[5] != CUBLASLT_ORDER_COL || ls[i]->data[6] != 1) {
            report("cublasLtMatmul: layout %c: only column-major, unbatched layouts are emulated", "ABCD"[i]);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
    const cublasOperation_t ta = (cublasOperation_t)d->data[3], tb = (cublasOperation_t)d->data[4];
    const int m = (int)Dl->data[2], n = (int)Dl->data[3];
    const int k = (int)(ta == CUBLAS_OP_N ? Al->data[3] : Al->data[2]);
    const uint64_t want_a[2] = { (uint64_t)(ta == CUBLAS_OP_N ? m : k), (uint64_t)(ta == CUBLAS_OP_N ? k : m) };
    const uint64_t want_b[2] = { (uint64_t)(tb == CUBLAS_OP_N ? k : n), (uint64_t)(tb == CUBLAS_OP_N ? n : k) };
    if (Al->data[2] != want_a[0] || Al->data[3] != want_a[1] || Bl->data[2] != want_b[0] ||
        Bl->data[3] != want_b[1] || Cl->data[2] != (uint64_t)m || Cl->data[3] != (uint64_t)n ||
        Cl->data[4] != Dl->data[4] || Cl->data[1] != Dl->data[1]) {
        report("cublasLtMatmul(%s, %s): layouts A %llux%llu, B %llux%llu, C %llux%llu (ld %llu), D %llux%llu (ld %llu) "
               "do not form a product",
               op_name(ta), op_name(tb), (unsigned long long)Al->data[2], (unsigned long long)Al->data[3],
               (unsigned long long)Bl->data[2], (unsigned long long)Bl->data[3], (unsigned long long)Cl->data[2],
               (unsigned long long)Cl->data[3], (unsigned long long)Cl->data[4], (unsigned long long)Dl->data[2],
               (unsigned long long)Dl->data[3], (unsigned long long)Dl->data[4]);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (ws_bytes && !check_device_range(ws, ws_bytes, "cublasLtMatmul workspace")) return CUBLAS_STATUS_INVALID_VALUE;
    return gemm("cublasLtMatmul", stream, ta, tb, m, n, k, alpha, A, (cudaDataType)Al->data[1], (int)Al->data[4], B,
                (cudaDataType)Bl->data[1], (int)Bl->data[4], beta, C, (cudaDataType)Cl->data[1], (int)Cl->data[4], D,
                (int)Dl->data[4], (cublasComputeType_t)d->data[1]);
}
