#!/usr/bin/env bash
# scripts/ci-cuda-static.sh — the CUDA checks that need neither a GPU nor the
# emulation, run by scripts/test.sh (docs/cuda.md, "Compile-time checks"):
#   1. scripts/cuda-resources: every kernel's registers, shared memory,
#      stack, spills and local memory on every built architecture (nvcc +
#      ptxas -v), and every launch configuration of kernels/launch.h over the
#      model shapes checked against them and the per-block limits; prints the
#      table;
#   2. scripts/cuda-clang-check: clang-19 compiles the kernels to PTX for
#      sm_75 and sm_90 with -Werror;
#   3. scripts/cuda-check-mutants.py: a block past its bounds, dynamic shared
#      memory past 48 KiB without the attribute and a forced spill in a GEMV,
#      each of which step 1 must catch (on sm_75 and sm_90, the smallest and
#      the largest limits, to keep it short; --arch '' for all).
# The emulation's own launch checks run with the CUDA suite
# (scripts/ci-cuda-emu.sh: test_cuda_emu). Exits non-zero when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export JOBS="${JOBS:-$(nproc)}"
t_start=$SECONDS
stamp() { echo "   ($(( SECONDS - t_start )) s so far)"; }

echo "== CUDA resources per kernel and architecture, launches checked (scripts/cuda-resources)"
python3 scripts/cuda-resources --jobs "$JOBS"
stamp
echo "== CUDA kernels through a second front end (scripts/cuda-clang-check: clang-19, sm_75 and sm_90, -Werror)"
bash scripts/cuda-clang-check
stamp
echo "== mutation check of the resource check (scripts/cuda-check-mutants.py)"
python3 scripts/cuda-check-mutants.py --arch 75,90
stamp
echo "== CUDA compile-time checks: all passed"
