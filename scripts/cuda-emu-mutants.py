#!/usr/bin/env python3
"""scripts/cuda-emu-mutants.py — the mutation check of the CUDA emulation:
copies the sources, injects one known defect at a time into the copy of
kernels/*.cu, kernels/cuda_common.cuh or src/engine/cuda_engine.c, rebuilds
the CUDA tests of the copy (DOLPHIN_CUDA=EMU, ASan + UBSan) and runs them
until one fails. Every defect must be caught; prints the table and exits
non-zero otherwise.

Usage: cuda-emu-mutants.py [--work DIR] [--only NAME,...] [--keep]
Environment: DOLPHIN_SHARED (fixtures), JOBS (build parallelism, default 2).
"""
import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# name, file, text to find (exactly once), replacement, test order, thread order
MUTANTS = [
    ("out-of-bounds write", "kernels/silu_mul.cu",
     "out[idx] = __float2half_rn(g / (1.0f + expf(-g)) * u);",
     "out[idx + 1] = __float2half_rn(g / (1.0f + expf(-g)) * u);",
     ["test_cuda_kernels"], "forward"),
    ("removed barrier", "kernels/attention_prefill.cu",
     "        __syncthreads();\n        /* keys kv0",
     "        /* keys kv0",
     ["test_cuda_kernels"], "forward"),
    ("removed barrier (found in reverse order)", "kernels/nf4.cu",
     "        for (int i = 0; i < 16; i++) lut[i] = levels.v[i];\n    }\n    __syncthreads();",
     "        for (int i = 0; i < 16; i++) lut[i] = levels.v[i];\n    }",
     ["test_cuda_nf4"], "reverse"),
    ("shuffle reached by a partial warp", "kernels/cuda_common.cuh",
     "    if (warp == 0) {\n        double s = lane < n_warps ? partial[lane] : 0.0;",
     "    if (warp == 0 && lane < n_warps) {\n        double s = partial[lane];",
     ["test_cuda_kernels"], "forward"),
    ("wrong block-table index", "kernels/cuda_common.cuh",
     "return dol_kv_row(kv, table[p / kv.block_size], w, p % kv.block_size);",
     "return dol_kv_row(kv, table[(p + 1) / kv.block_size], w, p % kv.block_size);",
     ["test_cuda_kernels"], "forward"),
    ("wrong GQA head map", "kernels/attention_decode.cu",
     "const int kvh = h / group;",
     "const int kvh = h % group;",
     ["test_cuda_kernels"], "forward"),
    ("RoPE rotation on the wrong half", "kernels/rope.cu",
     "v[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));\n        v[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));",
     "v[i] = __fadd_rn(__fmul_rn(a, c), __fmul_rn(b, s));\n        v[i + half] = __fsub_rn(__fmul_rn(b, c), __fmul_rn(a, s));",
     ["test_cuda_kernels"], "forward"),
    ("causal mask one key too far", "kernels/attention_prefill.cu",
     "min(BK, qpos - kv0 + 1)",
     "min(BK, qpos - kv0 + 2)",
     ["test_cuda_kernels"], "forward"),
    ("Q8_0 KV: decode reads the next block's scale", "kernels/attention_decode.cu",
     "const float d = __half2float(sc[2 * pi / kv.g.qb]);",
     "const float d = __half2float(sc[2 * pi / kv.g.qb + 1]);",
     ["test_cuda_kvq8"], "forward"),
    ("Q8_0 KV: the write puts a row's scales one slot late", "kernels/kv_cache.cu",
     "reinterpret_cast<uint16_t *>(base + (size_t)kv.g.scale_off[w]) + (size_t)r * (size_t)nb;",
     "reinterpret_cast<uint16_t *>(base + (size_t)kv.g.scale_off[w]) + (size_t)r * (size_t)nb + 1;",
     ["test_cuda_kvq8"], "forward"),
    ("Q8_0 KV: prefill quants truncated toward zero to even", "kernels/attention_prefill.cu",
     "return make_float2((float)r[2 * c] * d, (float)r[2 * c + 1] * d);",
     "return make_float2((float)(r[2 * c] / 2 * 2) * d, (float)r[2 * c + 1] * d);",
     ["test_cuda_kvq8"], "forward"),
    ("NF4 nibbles swapped", "kernels/nf4.cu",
     "const float wl = lut[byte & 15u], wh = lut[byte >> 4];",
     "const float wl = lut[byte >> 4], wh = lut[byte & 15u];",
     ["test_cuda_nf4"], "forward"),
    ("block-type GEMV skips a row's last group", "kernels/ggml_blocks.cu",
     "for (int g = lane; g < groups; g += 32) {",
     "for (int g = lane; g < groups - 1; g += 32) {",
     ["test_cuda_blocks"], "forward"),
    ("block-type dequantization off by one block", "kernels/ggml_blocks.cu",
     "const uint8_t *b = w + (size_t)(row0 + r) * row_bytes + (size_t)(k / block) * block_bytes;",
     "const uint8_t *b = w + (size_t)(row0 + r) * row_bytes + (size_t)((k + 1) / block) * block_bytes;",
     ["test_cuda_blocks"], "forward"),
    ("fused block-type parts written at the wrong columns", "src/engine/cuda_engine.c",
     "if (dol_cuda_blk_matmul(e->blas, out + p->row0, w->N,",
     "if (dol_cuda_blk_matmul(e->blas, out, w->N,",
     ["test_cuda_gguf"], "forward"),
    ("launch of 2048 threads per block", "kernels/launch.h",
     "return dol_cuda_cfg_plain(d >= 2048 ? 512 : 256);",
     "return dol_cuda_cfg_plain(d >= 2048 ? 2048 : 256);",
     ["test_cuda_kernels"], "forward"),
    ("swapped transpose in a GEMM", "src/engine/cuda_engine.c",
     "cublasGemmEx(e->blas, CUBLAS_OP_T, CUBLAS_OP_N, w->N",
     "cublasGemmEx(e->blas, CUBLAS_OP_N, CUBLAS_OP_T, w->N",
     ["test_cuda_engine"], "forward"),
    ("missing stream sync before logits are read", "src/engine/cuda_engine.c",
     "cudaMemcpyDeviceToHost, e->stream));\n        CUDA_CHECK(cudaStreamSynchronize(e->stream));\n",
     "cudaMemcpyDeviceToHost, e->stream));\n",
     ["test_cuda_engine"], "forward"),
]

TESTS = ["test_cuda_kernels", "test_cuda_kvq8", "test_cuda_nf4", "test_cuda_engine", "test_cuda_blocks", "test_cuda_gguf"]


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def copy_sources(dst):
    """The tracked and untracked-but-not-ignored files of the checkout."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in files:
        if not f or not (REPO / f).is_file():
            continue
        out = dst / f
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, out)


def why(log):
    """One line saying how the run failed: the emulator's fault, the
    sanitizer's finding and where, the cuBLAS or CUDA error, or the failed
    check's message."""
    lines = [ln.strip() for ln in log.splitlines()]
    for ln in lines:
        if "dolphin cuda-emu: FAULT:" in ln:
            return ln.split("FAULT:", 1)[1].strip()
    for i, ln in enumerate(lines):
        if "ERROR: AddressSanitizer:" in ln:
            kind = ln.split("AddressSanitizer:", 1)[1].split(" on ")[0].strip()
            access = next((x for x in lines[i + 1:i + 3] if x.startswith(("READ", "WRITE"))), "")
            access = " ".join(access.split()[:4])
            frame = next((x for x in lines[i + 1:i + 8] if x.startswith("#0")), "")
            where = frame.split(" in ", 1)[1] if " in " in frame else frame
            where = where.replace(str(REPO) + "/", "").split("build-emu-mutants/src/")[-1]
            return f"ASan {kind}: {access} in {where}"
        if "runtime error:" in ln:
            return "UBSan: " + ln.split("runtime error:", 1)[1].strip()
    for ln in lines:
        if ln.startswith("dolphin cuda-emu:"):
            return ln[len("dolphin cuda-emu:"):].strip()
    for i, ln in enumerate(lines):
        if ln.startswith("[  ERROR   ] ---") and "[   LINE   ]" not in ln:
            return ln[len("[  ERROR   ] ---"):].strip()
        if "[   LINE   ]" in ln and i > 0:
            return lines[i - 1][:200]
    for ln in lines:
        if "[  FAILED  ]" in ln or "error:" in ln:
            return ln
    return lines[-1] if lines else "(no output)"


def clip(s, n=160):
    return s if len(s) <= n else s[:n - 3] + "..."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=str(REPO / "build-emu-mutants"))
    ap.add_argument("--only", default="")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    jobs = os.environ.get("JOBS", "2")
    shared = os.environ.get("DOLPHIN_SHARED", str(REPO.parent / "shared"))
    work = Path(a.work)
    src, build = work / "src", work / "build"
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    copy_sources(src)
    t0 = time.time()
    sh(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Debug", "-DDOLPHIN_SANITIZE=ON",
        "-DDOLPHIN_CUDA=EMU"], stdout=subprocess.DEVNULL)
    sh(["cmake", "--build", str(build), "-j", jobs, "--target", *TESTS], stdout=subprocess.DEVNULL)
    print(f"mutants: copy built in {time.time() - t0:.0f} s", flush=True)

    only = [s.strip() for s in a.only.split(",") if s.strip()]
    rows = []
    for name, rel, old, new, order, thread_order in MUTANTS:
        if only and not any(o in name for o in only):
            continue
        path = src / rel
        orig = path.read_text()
        if orig.count(old) != 1:
            rows.append((name, rel, "-", "NOT APPLIED", f"pattern found {orig.count(old)} times", 0.0))
            continue
        t1 = time.time()
        path.write_text(orig.replace(old, new))
        caught, by, reason = False, "-", ""
        try:
            b = subprocess.run(["cmake", "--build", str(build), "-j", jobs, "--target", *TESTS],
                               capture_output=True, text=True)
            if b.returncode != 0:
                caught, by, reason = True, "build", why(b.stdout + b.stderr)
            else:
                # CMOCKA_TEST_ABORT: the first failed check ends the run
                env = dict(os.environ, DOLPHIN_SHARED=shared, ASAN_OPTIONS="detect_leaks=0",
                           DOLPHIN_CUDA_EMU_ORDER=thread_order, CMOCKA_TEST_ABORT="1")
                for t in order + [x for x in TESTS if x not in order]:
                    try:
                        r = subprocess.run([str(build / t)], env=env, capture_output=True, text=True,
                                           timeout=900, errors="replace")
                        rc, log = r.returncode, r.stdout + r.stderr
                    except subprocess.TimeoutExpired:
                        rc, log = -1, "timed out after 900 s"
                    if rc != 0:
                        caught, by, reason = True, t, why(log)
                        break
        finally:
            path.write_text(orig)
        rows.append((name, rel, thread_order, "caught" if caught else "MISSED",
                     clip(f"{by}: {reason}") if caught else "every test passed", time.time() - t1))
        print(f"  {name}: {'caught' if caught else 'MISSED'} ({time.time() - t1:.0f} s)", flush=True)

    w = max(len(r[0]) for r in rows) if rows else 10
    print()
    print(f"{'defect'.ljust(w)}  {'file'.ljust(28)}  {'order'.ljust(7)}  {'result'.ljust(11)}  how")
    print(f"{'-' * w}  {'-' * 28}  {'-' * 7}  {'-' * 11}  {'-' * 40}")
    for name, rel, order, res, how, secs in rows:
        print(f"{name.ljust(w)}  {rel.ljust(28)}  {order.ljust(7)}  {res.ljust(11)}  {how} [{secs:.0f} s]")
    missed = [r for r in rows if r[3] != "caught"]
    print(f"\nmutants: {len(rows) - len(missed)} of {len(rows)} caught in {time.time() - t0:.0f} s")
    if not a.keep:
        shutil.rmtree(src, ignore_errors=True)
    return 1 if missed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
