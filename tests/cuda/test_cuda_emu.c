/* tests/cuda/test_cuda_emu.c — the CUDA emulation itself (DOLPHIN_CUDA=EMU,
 * emu/): that work on a stream waits for a synchronisation point (stale data
 * otherwise), capture and graph replay, capture invalidation, virtual
 * devices and their memory, copy checks, cuBLAS GEMM against a plain
 * column-major loop for every transpose pair, with its argument checks, and
 * the launch limits of the emulated architecture (DOLPHIN_CUDA_EMU_ARCH):
 * __launch_bounds__, dynamic shared memory against the default and
 * cudaFuncSetAttribute, the architecture's maximum.
 * Skipped (77) in a real CUDA build: it tests emulator behaviour. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "dolphin/common.h"
#include "kernels/kernels.h"

#ifdef DOLPHIN_CUDA_EMU

#define CK(call) assert_int_equal((call), cudaSuccess)

/* Without a synchronisation the host sees the old contents; after one, the new. */
static void test_async_is_deferred(void **state)
{
    (void)state;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *h = NULL, *d = NULL, back[4];
    CK(cudaMallocHost((void **)&h, sizeof(float) * 4));
    CK(cudaMalloc((void **)&d, sizeof(float) * 4));
    CK(cudaMemset(d, 0, sizeof(float) * 4));
    for (int i = 0; i < 4; i++) h[i] = (float)(i + 1);
    CK(cudaMemcpyAsync(d, h, sizeof(float) * 4, cudaMemcpyHostToDevice, s));
    /* a synchronous copy orders with the legacy stream only, not with s */
    CK(cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost));
    assert_true(back[0] == 0.0f && back[3] == 0.0f);
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost));
    assert_true(back[0] == 1.0f && back[3] == 4.0f);
    /* pinned sources are read when the copy runs, not when it is queued */
    h[0] = 7.0f;
    CK(cudaMemcpyAsync(d, h, sizeof(float), cudaMemcpyHostToDevice, s));
    h[0] = 9.0f;
    cudaEvent_t ev;
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CK(cudaEventRecord(ev, s));
    assert_int_equal(cudaEventQuery(ev), cudaErrorNotReady);
    CK(cudaEventSynchronize(ev));
    CK(cudaMemcpy(back, d, sizeof(float), cudaMemcpyDeviceToHost));
    assert_true(back[0] == 9.0f);
    CK(cudaEventDestroy(ev));
    CK(cudaFree(d));
    CK(cudaFreeHost(h));
    CK(cudaStreamDestroy(s));
}

/* A captured copy + memset replays on every launch of the graph. */
static void test_capture_and_replay(void **state)
{
    (void)state;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *h = NULL, *d = NULL, back[8];
    CK(cudaMallocHost((void **)&h, sizeof(int) * 8));
    CK(cudaMalloc((void **)&d, sizeof(int) * 8));
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CK(cudaMemsetAsync(d, 0, sizeof(int) * 8, s));
    CK(cudaMemcpyAsync(d, h, sizeof(int) * 4, cudaMemcpyHostToDevice, s));
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int round = 1; round <= 2; round++) {
        for (int i = 0; i < 8; i++) h[i] = round * 10 + i;
        CK(cudaGraphLaunch(ge, s));
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost));
        for (int i = 0; i < 8; i++) assert_int_equal(back[i], i < 4 ? round * 10 + i : 0);
    }
    /* a synchronisation inside a capture invalidates it */
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    cudaGraph_t bad = NULL;
    assert_int_equal(cudaStreamEndCapture(s, &bad), cudaErrorStreamCaptureInvalidated);
    assert_null(bad);
    (void)cudaGetLastError();
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaFree(d));
    CK(cudaFreeHost(h));
    CK(cudaStreamDestroy(s));
}

/* Copies are checked against the allocations; memory is accounted per device. */
static void test_devices_and_memory(void **state)
{
    (void)state;
    int n = 0;
    CK(cudaGetDeviceCount(&n));
    assert_int_equal(n, 2); /* main() asks for two */
    size_t fr0 = 0, tot = 0, fr1 = 0;
    CK(cudaSetDevice(1));
    CK(cudaMemGetInfo(&fr0, &tot));
    assert_int_equal(tot, (size_t)1024 << 20);
    void *d1 = NULL;
    CK(cudaMalloc(&d1, (size_t)100 << 20));
    CK(cudaMemGetInfo(&fr1, &tot));
    assert_int_equal(fr0 - fr1, (size_t)100 << 20);
    void *big = NULL;
    assert_int_equal(cudaMalloc(&big, (size_t)2048 << 20), cudaErrorMemoryAllocation);
    (void)cudaGetLastError();
    CK(cudaSetDevice(0));
    CK(cudaMemGetInfo(&fr1, &tot));
    assert_true(fr1 > fr0 - ((size_t)100 << 20)); /* device 0 does not see device 1's allocation */
    assert_int_equal(cudaSetDevice(2), cudaErrorInvalidDevice);
    char buf[16];
    /* wrong direction, overrun */
    assert_int_equal(cudaMemcpy(buf, d1, sizeof buf, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    void *d0 = NULL;
    CK(cudaMalloc(&d0, 8));
    assert_int_equal(cudaMemcpy(d0, buf, 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    (void)cudaGetLastError();
    CK(cudaFree(d0));
    CK(cudaSetDevice(1));
    CK(cudaFree(d1));
    CK(cudaSetDevice(0));
}

static float ref_at(const float *M, int ld, cublasOperation_t op, int r, int c)
{
    return op == CUBLAS_OP_N ? M[r + (size_t)c * ld] : M[c + (size_t)r * ld];
}

/* C = alpha op(A) op(B) + beta C, column-major, odd sizes, padded leading
 * dimensions, all four transpose pairs; then invalid arguments. */
static void test_cublas_gemm(void **state)
{
    (void)state;
    const int m = 5, n = 3, k = 7;
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    const cublasOperation_t ops[2] = { CUBLAS_OP_N, CUBLAS_OP_T };
    for (int ia = 0; ia < 2; ia++)
        for (int ib = 0; ib < 2; ib++) {
            const cublasOperation_t ta = ops[ia], tb = ops[ib];
            const int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
            const int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
            const int lda = ar + 2, ldb = br + 1, ldc = m + 3;
            float A[64], B[64], C[64], got[64];
            assert_true(lda * ac <= 64 && ldb * bc <= 64 && ldc * n <= 64);
            for (int i = 0; i < 64; i++) {
                A[i] = (float)((i * 7) % 11) - 5.0f;
                B[i] = (float)((i * 5) % 13) - 6.0f;
                C[i] = (float)(i % 3);
            }
            float *dA, *dB, *dC;
            CK(cudaMalloc((void **)&dA, sizeof(float) * lda * ac));
            CK(cudaMalloc((void **)&dB, sizeof(float) * ldb * bc));
            CK(cudaMalloc((void **)&dC, sizeof(float) * ldc * n));
            CK(cudaMemcpy(dA, A, sizeof(float) * lda * ac, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dB, B, sizeof(float) * ldb * bc, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dC, C, sizeof(float) * ldc * n, cudaMemcpyHostToDevice));
            const float alpha = 2.0f, beta = 0.5f;
            assert_int_equal(cublasGemmEx(h, ta, tb, m, n, k, &alpha, dA, CUDA_R_32F, lda, dB, CUDA_R_32F, ldb,
                                          &beta, dC, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                             CUBLAS_STATUS_SUCCESS);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(got, dC, sizeof(float) * ldc * n, cudaMemcpyDeviceToHost));
            for (int j = 0; j < n; j++)
                for (int i = 0; i < ldc; i++) {
                    float want = C[i + j * ldc]; /* rows past m untouched */
                    if (i < m) {
                        double s = 0;
                        for (int p = 0; p < k; p++) s += (double)ref_at(A, lda, ta, i, p) * ref_at(B, ldb, tb, p, j);
                        want = alpha * (float)s + beta * C[i + j * ldc];
                    }
                    assert_true(fabsf(got[i + j * ldc] - want) <= 1e-4f);
                }
            /* lda below the stored rows of A: the swapped-transpose mistake */
            if (ar > 1)
                assert_int_equal(cublasGemmEx(h, ta, tb, m, n, k, &alpha, dA, CUDA_R_32F, ar - 1, dB, CUDA_R_32F,
                                              ldb, &beta, dC, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT),
                                 CUBLAS_STATUS_INVALID_VALUE);
            /* an extent past the allocation of B */
            assert_int_equal(cublasGemmEx(h, ta, tb, m, n, k, &alpha, dA, CUDA_R_32F, lda, dB, CUDA_R_32F, ldb + 4,
                                          &beta, dC, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                             CUBLAS_STATUS_INVALID_VALUE);
            /* FP32 inputs with FP16 compute: not a cuBLAS combination */
            assert_int_equal(cublasGemmEx(h, ta, tb, m, n, k, &alpha, dA, CUDA_R_32F, lda, dB, CUDA_R_32F, ldb,
                                          &beta, dC, CUDA_R_32F, ldc, CUBLAS_COMPUTE_16F, CUBLAS_GEMM_DEFAULT),
                             CUBLAS_STATUS_NOT_SUPPORTED);
            CK(cudaFree(dA));
            CK(cudaFree(dB));
            CK(cudaFree(dC));
        }
    /* beta 0: C is not read (its NaN contents do not propagate) */
    float *dA, *dB, *dC, one = 1.0f, zero = 0.0f, out;
    CK(cudaMalloc((void **)&dA, 4));
    CK(cudaMalloc((void **)&dB, 4));
    CK(cudaMalloc((void **)&dC, 4)); /* fresh memory: 0xFF bytes, NaN */
    CK(cudaMemcpy(dA, &one, 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, &one, 4, cudaMemcpyHostToDevice));
    assert_int_equal(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, dA, 1, dB, 1, &zero, dC, 1),
                     CUBLAS_STATUS_SUCCESS);
    CK(cudaMemcpy(&out, dC, 4, cudaMemcpyDeviceToHost));
    assert_true(out == 1.0f);
    CK(cudaFree(dA));
    CK(cudaFree(dB));
    CK(cudaFree(dC));
    assert_int_equal(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

/* cublasLtMatmul (T, N), D = A^T B + C with C != D, equals cublasGemmEx
 * on a copy of C; a layout that does not fit the operation is refused. */
static void test_cublaslt_matmul(void **state)
{
    (void)state;
    const int m = 6, n = 2, k = 9;
    float A[k * m], B[k * n], C[m * n], got[m * n], want[m * n];
    for (int i = 0; i < k * m; i++) A[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < k * n; i++) B[i] = (float)(i % 5) - 2.0f;
    for (int i = 0; i < m * n; i++) C[i] = (float)i;
    float *dA, *dB, *dC, *dD;
    CK(cudaMalloc((void **)&dA, sizeof A));
    CK(cudaMalloc((void **)&dB, sizeof B));
    CK(cudaMalloc((void **)&dC, sizeof C));
    CK(cudaMalloc((void **)&dD, sizeof C));
    CK(cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dC, C, sizeof C, cudaMemcpyHostToDevice));
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc, bad;
    assert_int_equal(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    const int32_t opT = CUBLAS_OP_T;
    assert_int_equal(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT),
                     CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, k, m, k), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, m), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasLtMatrixLayoutCreate(&bad, CUDA_R_32F, m, k, m), CUBLAS_STATUS_SUCCESS);
    const float one = 1.0f;
    assert_int_equal(cublasLtMatmul(lt, desc, &one, dA, la, dB, lb, &one, dC, lc, dD, lc, NULL, NULL, 0, 0),
                     CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasLtMatmul(lt, desc, &one, dA, bad, dB, lb, &one, dC, lc, dD, lc, NULL, NULL, 0, 0),
                     CUBLAS_STATUS_INVALID_VALUE);
    CK(cudaMemcpy(got, dD, sizeof got, cudaMemcpyDeviceToHost));
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_32F, k, dB, CUDA_R_32F, k,
                                  &one, dC, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
    CK(cudaMemcpy(want, dC, sizeof want, cudaMemcpyDeviceToHost));
    assert_memory_equal(got, want, sizeof got);
    cublasDestroy(h);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(bad);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    CK(cudaFree(dA));
    CK(cudaFree(dB));
    CK(cudaFree(dC));
    CK(cudaFree(dD));
}

/* emu/cuda_emu.h (C++ only): the checks of a launch, without running it */
cudaError_t dol_emu_launch_check(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem);

#define EXPECT_ERR(call, want)                              \
    do {                                                    \
        assert_int_equal((call), (want));                   \
        assert_int_equal(cudaGetLastError(), (want));       \
        assert_int_equal(cudaGetLastError(), cudaSuccess);  \
    } while (0)

/* Each launch check fires, and only past its limit: the kernels'
 * __launch_bounds__ as registered from kernels/NAME.cu, dynamic shared memory
 * against 48 KiB minus the static without the opt-in, against the value
 * cudaFuncSetAttribute set, and against the maximum of the architecture. */
static void test_launch_limits(void **state)
{
    (void)state;
    /* stand-ins for kernel addresses: the attribute is kept per address */
    static const char fn_a = 0, fn_b = 0, fn_c = 0;
    const dim3 grid = { 1, 1, 1 };
    const dim3 b32 = { 32, 1, 1 }, b64 = { 64, 1, 1 }, b128 = { 128, 1, 1 }, b256 = { 256, 1, 1 };
    const dim3 b512 = { 512, 1, 1 }, b1024 = { 1024, 1, 1 };
    setenv("DOLPHIN_CUDA_EMU_ARCH", "sm_75", 1);
    /* empty calls of the launchers: they link the kernels' objects, whose
     * static initialisers register the bounds (and dol_set_err, which
     * kernels/q8.cu needs from dolphin_core, further down the link line) */
    char err[16];
    dol_set_err(err, sizeof err, "linked");
    const dol_cuda_q8 w8 = { NULL, NULL, 4, 64 };
    CK(dol_cuda_q8_gemv(NULL, NULL, 0, &w8, 0));
    const dol_cuda_kv kv = { 0 };
    CK(dol_cuda_attention_decode(NULL, 0, NULL, 0, NULL, 0, NULL, NULL, 1, 1, 64, 1.0f, kv, NULL, 1, 64, 0));
    CK(dol_cuda_attention_prefill(NULL, 0, NULL, 0, NULL, 0, 1, 1, 64, 1.0f, kv, 0));

    /* block size against __launch_bounds__ */
    CK(dol_emu_launch_check("dol_q8_gemv_kernel<3>", &fn_a, grid, b128, 0));
    EXPECT_ERR(dol_emu_launch_check("dol_q8_gemv_kernel<3>", &fn_a, grid, b256, 0),
               cudaErrorLaunchOutOfResources);
    CK(dol_emu_launch_check("dol_attn_decode_kernel<2>", &fn_a, grid, b32, 0));
    EXPECT_ERR(dol_emu_launch_check("dol_attn_decode_kernel<2>", &fn_a, grid, b64, 0),
               cudaErrorLaunchOutOfResources);
    CK(dol_emu_launch_check("dol_attn_prefill_kernel<1>", &fn_a, grid, b256, 0));
    EXPECT_ERR(dol_emu_launch_check("dol_attn_prefill_kernel<1>", &fn_a, grid, b512, 0),
               cudaErrorLaunchOutOfResources);
    /* no bounds: the 1024 of every architecture */
    CK(dol_emu_launch_check("dol_rope_kernel", &fn_a, grid, b1024, 0));

    /* dynamic shared memory without the opt-in: 48 KiB minus the static */
    struct cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, &fn_a));
    const size_t stat = fa.sharedSizeBytes;
    assert_true(stat < 16 * 1024);
    const size_t dflt = 48 * 1024 - stat;
    assert_int_equal((size_t)fa.maxDynamicSharedSizeBytes, dflt);
    CK(dol_emu_launch_check("dol_attn_prefill_kernel<1>", &fn_a, grid, b256, dflt));
    EXPECT_ERR(dol_emu_launch_check("dol_attn_prefill_kernel<1>", &fn_a, grid, b256, dflt + 1),
               cudaErrorInvalidValue);

    /* raised with cudaFuncSetAttribute: up to the value set */
    const size_t raised = 60 * 1024 - stat;
    CK(cudaFuncSetAttribute(&fn_b, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)raised));
    CK(dol_emu_launch_check("dol_attn_prefill_kernel<1>", &fn_b, grid, b256, raised));
    EXPECT_ERR(dol_emu_launch_check("dol_attn_prefill_kernel<1>", &fn_b, grid, b256, raised + 1),
               cudaErrorInvalidValue);
    /* the attribute belongs to one kernel: another keeps the default */
    EXPECT_ERR(dol_emu_launch_check("dol_attn_prefill_kernel<1>", &fn_a, grid, b256, raised),
               cudaErrorInvalidValue);

    /* never above the architecture's maximum: 64 KiB per block on sm_75, 227 KiB on sm_90 */
    EXPECT_ERR(cudaFuncSetAttribute(&fn_c, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)(64 * 1024 - stat + 1)),
               cudaErrorInvalidValue);
    CK(cudaFuncSetAttribute(&fn_c, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(64 * 1024 - stat)));
    setenv("DOLPHIN_CUDA_EMU_ARCH", "sm_90", 1);
    CK(cudaFuncSetAttribute(&fn_c, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
    CK(dol_emu_launch_check("dol_attn_prefill_kernel<1>", &fn_c, grid, b256, 100 * 1024));
    EXPECT_ERR(cudaFuncSetAttribute(&fn_c, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)(227 * 1024 - stat + 1)),
               cudaErrorInvalidValue);
    /* the same launch on sm_75: above its maximum whatever the attribute says */
    setenv("DOLPHIN_CUDA_EMU_ARCH", "sm_75", 1);
    EXPECT_ERR(dol_emu_launch_check("dol_attn_prefill_kernel<1>", &fn_c, grid, b256, 100 * 1024),
               cudaErrorInvalidValue);
    unsetenv("DOLPHIN_CUDA_EMU_ARCH");
}

int main(void)
{
    /* read once, at the emulation's first call */
    setenv("DOLPHIN_CUDA_EMU_DEVICES", "2", 1);
    setenv("DOLPHIN_CUDA_EMU_MEM_MIB", "1024", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_is_deferred),
        cmocka_unit_test(test_capture_and_replay),
        cmocka_unit_test(test_devices_and_memory),
        cmocka_unit_test(test_cublas_gemm),
        cmocka_unit_test(test_cublaslt_matmul),
        cmocka_unit_test(test_launch_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void)
{
    printf("test_cuda_emu: tests the CUDA emulation (DOLPHIN_CUDA=EMU); skipping\n");
    return 77;
}

#endif
