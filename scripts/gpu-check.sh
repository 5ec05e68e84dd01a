#!/usr/bin/env bash
# scripts/gpu-check.sh — on a GPU machine that can build Dolphin (the
# dependencies of scripts/setup.sh and the CUDA toolkit): the GPU kit built
# for the GPU present ($CUDA_ARCHS, default native) and run there, i.e.
#   scripts/gpu-kit build --archs native && bash gpu-kit/run.sh
# A machine that cannot build takes the kit folder made elsewhere instead
# (docs/cuda.md, "The GPU verification kit"). Summary and logs go to $OUT
# (default ./gpu-kit-out); the exit status is run.sh's (1 when anything failed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/gpu-kit build --archs "${CUDA_ARCHS:-native}"
exec bash gpu-kit/run.sh
