#!/usr/bin/env bash
# scripts/test.sh — the whole test suite on a fresh machine: install
# dependencies, build (Release, plus an ASan/UBSan build), run the unit tests
# (ctest), the HTTP tests against a live dolphind (pytest from the .venv that
# setup.sh builds: the official `openai` client suite and the schemathesis
# run against docs/openapi.yaml are part of them), the fuzz targets (scripts/fuzz.sh,
# DOLPHIN_FUZZ_SECONDS each, default 45 here), the fault tests of three
# Release replicas behind a real nginx (tests/cluster: rolling restart,
# kill -9, SIGSTOP, overload; each prints its counts), the soak test
# (tests/soak: 20,000 requests against the Release build, a short run
# against the sanitizer build, then three models with loads and unloads
# under the load),
# the CUDA compile-time checks (scripts/ci-cuda-static.sh: per-architecture
# kernel resources and launch limits, clang-19 as a second front end, their
# mutation check), and the CUDA backend under the CUDA emulation (scripts/ci-cuda-emu.sh:
# kernels, engine and HTTP tests on the CPU, both thread orders, the mutation
# check), and the GPU verification kit rehearsed under that emulation
# (scripts/gpu-kit rehearse). Fixtures come from $DOLPHIN_SHARED (default ../shared).
# Exits non-zero when anything fails.
#
# --quick: the development loop, a few minutes: the Release build (CUDA
# off), its unit tests, and the HTTP tests of the API, errors, streaming,
# the scheduler and the official openai client against it. CI and the
# README's test command run the whole suite (no argument).
set -euo pipefail
cd "$(dirname "$0")/.."
export DOLPHIN_SHARED="${DOLPHIN_SHARED:-$(cd .. && pwd)/shared}"

quick=0
case "${1:-}" in
  "") ;;
  --quick) quick=1 ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac

bash scripts/setup.sh

if [ "$quick" = 1 ]; then
  echo "== quick: build (Release, CUDA off: build-quick)"
  cmake -S . -B build-quick -DCMAKE_BUILD_TYPE=Release -DDOLPHIN_CUDA=OFF >/dev/null
  cmake --build build-quick -j"$(nproc)"
  echo "== quick: unit tests (ctest)"
  ctest --test-dir build-quick --output-on-failure -LE cuda
  echo "== quick: HTTP tests (a subset, against build-quick/dolphind)"
  DOLPHIN_BIN="$PWD/build-quick/dolphind" .venv/bin/python -m pytest -q -p no:cacheprovider \
    tests/http/test_api_completions.py tests/http/test_api_chat.py \
    tests/http/test_api_streaming.py tests/http/test_errors.py tests/http/test_limits.py \
    tests/http/test_scheduler.py tests/http/test_openai_client.py tests/http/test_golden.py \
    tests/http/test_gguf.py
  echo "== quick tests passed (the whole suite: scripts/test.sh)"
  exit 0
fi

# each stage's banner, with the minutes the suite has run so far (CI allows 90)
t0=$SECONDS
stage() { echo "== [$(( (SECONDS - t0) / 60 )) min] $*"; }

stage "CUDA compile-time checks (scripts/ci-cuda-static.sh: resources and launch limits per architecture, clang-19, mutants)"
bash scripts/ci-cuda-static.sh

stage "build (Release)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"

stage "build (ASan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDOLPHIN_SANITIZE=ON -DDOLPHIN_CUDA=OFF >/dev/null
cmake --build build-asan -j"$(nproc)"

stage "unit tests (ctest, ASan + UBSan; over the GGUF files, one of each kernel: DOLPHIN_TEST_LIGHT)"
ASAN_OPTIONS=detect_leaks=1 DOLPHIN_TEST_LIGHT=1 ctest --test-dir build-asan --output-on-failure -LE cuda -j"$(nproc)"

stage "unit tests (ctest, Release)"
ctest --test-dir build --output-on-failure -LE cuda

PY="$PWD/.venv/bin/python"
stage "HTTP tests, openai client, schemathesis (pytest against build-asan/dolphind)"
DOLPHIN_BIN="$PWD/build-asan/dolphind" "$PY" -m pytest tests/http -q -p no:cacheprovider

stage "fault tests: 3 x build/dolphind behind nginx (tests/cluster)"
DOLPHIN_BIN="$PWD/build/dolphind" "$PY" -m pytest tests/cluster -q -s -p no:cacheprovider
stage "structured output in bulk (tests/http/test_structured_bulk.py against build/dolphind)"
DOLPHIN_STRUCTURED_BULK=1 DOLPHIN_BIN="$PWD/build/dolphind" "$PY" -m pytest \
  tests/http/test_structured_bulk.py -q -p no:cacheprovider

stage "fuzzing (libFuzzer + ASan/UBSan, scripts/fuzz.sh)"
DOLPHIN_FUZZ_SECONDS="${DOLPHIN_FUZZ_SECONDS:-45}" bash scripts/fuzz.sh

stage "soak test (tests/soak/soak.py: build/dolphind, then build-asan/dolphind)"
"$PY" tests/soak/soak.py --bin "$PWD/build/dolphind" --requests 20000 --warmup 1000 \
  --max-rss-growth 3 --time-limit 600
"$PY" tests/soak/soak.py --bin "$PWD/build-asan/dolphind" --no-rss-check
stage "soak test over three models, two loaded at most (tests/soak/soak.py --models)"
"$PY" tests/soak/soak.py --bin "$PWD/build/dolphind" --models --requests 300 --warmup 60 --concurrency 8 \
  --min-rss-growth-mib 4
stage "CUDA backend on the CPU (DOLPHIN_CUDA=EMU, ASan + UBSan: scripts/ci-cuda-emu.sh)"
bash scripts/ci-cuda-emu.sh
stage "GPU kit rehearsal (scripts/gpu-kit rehearse: the kit's run.sh against a Release build of the CUDA emulation, one injected failure)"
bash scripts/gpu-kit rehearse
stage "all tests passed"
