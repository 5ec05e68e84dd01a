#!/usr/bin/env python3
"""scripts/cuda-check-mutants.py — the mutation check of the compile-time CUDA
checks (scripts/cuda-resources): copies kernels/, include/, tools/ and
CMakeLists.txt, injects one known defect at a time into the copy, runs
scripts/cuda-resources on it and requires it to fail with the violation
that names the defect:
  - a launch's block size past the kernel's __launch_bounds__;
  - dynamic shared memory past 48 KiB without cudaFuncSetAttribute;
  - a spill in a decode GEMV, forced by a large local array.
The unchanged copy must pass first. Prints the table; exits non-zero when a
defect is missed. Compiled results are shared with scripts/cuda-resources
through its content-addressed cache, so only the mutated sources compile.

Usage: cuda-check-mutants.py [--work DIR] [--arch 75,90] [--only NAME,...] [--keep]
Environment: CUDA_HOME, CC, JOBS (as scripts/cuda-resources).
"""
import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECK = REPO / "scripts/cuda-resources"

# The large local array of the spill mutant: 288 floats that stay live across
# the K loop (each updated every chunk, summed at the end) do not fit the 255
# registers a thread may have, so ptxas spills them.
SPILL_DECL = """    dol_quant_zero<T>(acc);
    float big[288];
#pragma unroll
    for (int i = 0; i < 288; i++) big[i] = (float)i;
"""
SPILL_USE = """        dol_quant_scale_add<T>(acc, s, sum);
#pragma unroll
        for (int i = 0; i < 288; i++) big[i] = fmaf(big[i], s[i % DOL_QUANT_ROWS], sum[0][0]);
    }
#pragma unroll
    for (int i = 0; i < 288; i++) acc[0][0] += big[i];
"""

# name, file, text to find (exactly once), replacement, text the failure must contain
MUTANTS = [
    ("block size past __launch_bounds__", "kernels/launch.h",
     "return dol_cuda_cfg_plain(DOL_CUDA_QUANT_GEMV_THREADS);",
     "return dol_cuda_cfg_plain(2 * DOL_CUDA_QUANT_GEMV_THREADS);",
     "threads per block exceed __launch_bounds__(128)"),
    ("dynamic shared memory past 48 KiB, no attribute", "kernels/launch.h",
     "dol_cuda_prefill_half_smem(head_dim, v_q8);",
     "dol_cuda_prefill_half_smem(head_dim, v_q8) + 28 * 1024;",
     "without cudaFuncSetAttribute"),
    ("spill in a GEMV (large local array)", "kernels/q8.cu",
     None, None,  # two edits inside dol_q8_gemv_kernel: see apply()
     "decode kernel spills or uses local memory"),
]


def apply(name, text, old, new):
    """The mutated text, or None when the pattern is not found exactly once."""
    if old is not None:
        return text.replace(old, new) if text.count(old) == 1 else None
    # the spill mutant: the first kernel of q8.cu is dol_q8_gemv_kernel
    start = text.find("dol_q8_gemv_kernel(")
    end = text.find("dol_q8_gemv_any_kernel(", start)
    body = text[start:end]
    decl = "    dol_quant_zero<T>(acc);\n"
    use = "        dol_quant_scale_add<T>(acc, s, sum);\n    }\n"
    if start < 0 or body.count(decl) != 1 or body.count(use) != 1:
        return None
    body = body.replace(decl, SPILL_DECL).replace(use, SPILL_USE)
    return text[:start] + body + text[end:]


def copy_sources(dst):
    for rel in ("kernels", "include", "tools"):
        shutil.copytree(REPO / rel, dst / rel)
    shutil.copy2(REPO / "CMakeLists.txt", dst / "CMakeLists.txt")


def run_check(src, build, cache, archs):
    cmd = [sys.executable, str(CHECK), "--src", str(src), "--build", str(build), "--cache", str(cache)]
    if archs:
        cmd += ["--arch", archs]
    return subprocess.run(cmd, capture_output=True, text=True)


def first_fail(out):
    for ln in out.splitlines():
        if ln.startswith("FAIL "):
            return ln[5:]
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def clip(s, n=170):
    return s if len(s) <= n else s[:n - 3] + "..."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=str(REPO / "build-cuda-mutants"))
    ap.add_argument("--arch", default="", help="architectures to check (default: the build's)")
    ap.add_argument("--only", default="")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    work = Path(a.work).resolve()
    src, build = work / "src", work / "build"
    cache = REPO / "build-cuda-resources" / "cache"
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    copy_sources(src)
    t0 = time.time()

    base = run_check(src, build, cache, a.arch)
    if base.returncode != 0:
        print(base.stdout + base.stderr)
        print("cuda-check-mutants: the unchanged copy fails the check; nothing to compare against")
        return 1
    print(f"cuda-check-mutants: the unchanged copy passes ({time.time() - t0:.0f} s)", flush=True)

    only = [s.strip() for s in a.only.split(",") if s.strip()]
    rows = []
    for name, rel, old, new, expect in MUTANTS:
        if only and not any(o in name for o in only):
            continue
        path = src / rel
        orig = path.read_text()
        mutated = apply(name, orig, old, new)
        if mutated is None:
            rows.append((name, rel, "NOT APPLIED", "pattern not found exactly once", 0.0))
            continue
        t1 = time.time()
        path.write_text(mutated)
        try:
            r = run_check(src, build, cache, a.arch)
        finally:
            path.write_text(orig)
        out = r.stdout + r.stderr
        caught = r.returncode != 0 and expect in out
        n_fail = sum(1 for ln in out.splitlines() if ln.startswith("FAIL "))
        how = f"{n_fail} violation(s), first: {first_fail(out)}" if r.returncode != 0 else "the check passed"
        rows.append((name, rel, "caught" if caught else "MISSED", how, time.time() - t1))
        print(f"  {name}: {'caught' if caught else 'MISSED'} ({time.time() - t1:.0f} s)", flush=True)

    w = max(len(r[0]) for r in rows) if rows else 10
    print()
    print(f"{'defect'.ljust(w)}  {'file'.ljust(16)}  {'result'.ljust(11)}  how")
    print(f"{'-' * w}  {'-' * 16}  {'-' * 11}  {'-' * 40}")
    for name, rel, res, how, secs in rows:
        print(f"{name.ljust(w)}  {rel.ljust(16)}  {res.ljust(11)}  {clip(how)} [{secs:.0f} s]")
    missed = [r for r in rows if r[2] != "caught"]
    print(f"\ncuda-check-mutants: {len(rows) - len(missed)} of {len(rows)} caught in {time.time() - t0:.0f} s")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if missed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
