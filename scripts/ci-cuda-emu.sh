#!/usr/bin/env bash
# scripts/ci-cuda-emu.sh — the CUDA backend tested on the CPU, under the
# emulation of emu/ (DOLPHIN_CUDA=EMU, no GPU, no nvcc: the CUDA headers
# only), built with ASan + UBSan into build-emu:
#   1. ctest -L cuda (kernels, the Q8_0 KV cache, NF4 and int8 products, the quantized goldens,
#      the engine on the fixtures,
#      the emulation's own checks);
#   2. the kernel tests again with every block's threads in reverse order;
#   3. the HTTP golden, streaming, batch-invariance, speculative-decoding and GGUF tests against
#      `dolphind --backend cuda` from that build, and the layer-placement
#      tests (two virtual devices, the CPU, exit statuses);
#   4. the mutation check (scripts/cuda-emu-mutants.py): known defects
#      injected into copies of the kernels and of cuda_engine.c, each of
#      which the suite must catch; prints the table.
# Fixtures from $DOLPHIN_SHARED (default ../shared). Exits non-zero when
# anything fails. CUDA_EMU_SKIP_MUTANTS=1 leaves out step 4.
set -euo pipefail
cd "$(dirname "$0")/.."
export DOLPHIN_SHARED="${DOLPHIN_SHARED:-$(cd .. && pwd)/shared}"
B="${DOLPHIN_EMU_BUILD:-build-emu}"
export JOBS="${JOBS:-$(nproc)}"
t_start=$SECONDS
stamp() { echo "   ($(( SECONDS - t_start )) s so far)"; }

echo "== build (CUDA emulation, ASan + UBSan, $B)"
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Debug -DDOLPHIN_SANITIZE=ON -DDOLPHIN_CUDA=EMU >/dev/null
cmake --build "$B" -j"$JOBS" --target dolphind test_cuda_kernels test_cuda_kvq8 test_cuda_nf4 test_cuda_q8 test_cuda_quant_golden \
  test_cuda_engine test_cuda_kvq8_engine test_cuda_emu test_cuda_placement test_cuda_gguf test_cuda_blocks
stamp

echo "== CUDA tests under the emulation (ctest -L cuda, threads in forward order)"
ASAN_OPTIONS=detect_leaks=1 DOLPHIN_CUDA_EMU_ORDER=forward \
  ctest --test-dir "$B" --output-on-failure --no-tests=error -j"$JOBS" -L cuda
stamp

# The kernel tests again with the threads in reverse order (a missing barrier
# shows there). The whole-model tests (placement, the GGUF and quantized
# goldens, the Q8_0 cache on the fixtures) add no kernel: forward is enough.
echo "== CUDA kernel tests under the emulation (threads in reverse order)"
ASAN_OPTIONS=detect_leaks=1 DOLPHIN_CUDA_EMU_ORDER=reverse \
  ctest --test-dir "$B" --output-on-failure --no-tests=error -j"$JOBS" -L cuda \
  -E 'test_cuda_(placement|gguf|quant_golden|kvq8_engine)$'
stamp

echo "== HTTP tests against dolphind --backend cuda (emulated, ASan + UBSan)"
# the tests start DOLPHIN_BIN with their own arguments: this one adds the backend
cat > "$B/dolphind-cuda" <<WRAP
#!/bin/sh
exec "$PWD/$B/dolphind" --backend cuda "\$@"
WRAP
chmod +x "$B/dolphind-cuda"
DOLPHIN_BIN="$PWD/$B/dolphind-cuda" ASAN_OPTIONS=detect_leaks=1 "$PWD/.venv/bin/python" -m pytest \
  tests/http/test_golden.py tests/http/test_api_streaming.py \
  "tests/http/test_memory.py::test_checkpoint_pages_released" \
  "tests/http/test_scheduler.py::test_batch_invariance" tests/http/test_kv_cache.py -q -p no:cacheprovider
# speculative decoding: the same answers with and without it (the settings
# and the sampling statistics do not depend on the backend)
DOLPHIN_BIN="$PWD/$B/dolphind-cuda" ASAN_OPTIONS=detect_leaks=1 "$PWD/.venv/bin/python" -m pytest \
  tests/http/test_speculative.py -k "whole_answers or streamed or chat or proposals" -q -p no:cacheprovider
# GGUF files: the reference's ids up to the first margin below 5e-2 (FP16)
DOLPHIN_GGUF_MARGIN=5e-2 DOLPHIN_BIN="$PWD/$B/dolphind-cuda" ASAN_OPTIONS=detect_leaks=1 \
  "$PWD/.venv/bin/python" -m pytest tests/http/test_gguf.py -q -p no:cacheprovider
stamp

echo "== layer placement over HTTP (two virtual devices and the CPU)"
DOLPHIN_TEST_PLACEMENT=1 DOLPHIN_BIN="$PWD/$B/dolphind-cuda" ASAN_OPTIONS=detect_leaks=1 "$PWD/.venv/bin/python" \
  -m pytest tests/http/test_placement.py -q -p no:cacheprovider
stamp

if [ "${CUDA_EMU_SKIP_MUTANTS:-0}" != 1 ]; then
  echo "== mutation check (defects injected into copies of the CUDA code)"
  "$PWD/.venv/bin/python" scripts/cuda-emu-mutants.py --work "$B-mutants"
  stamp
fi
echo "== CUDA emulation: all passed"
