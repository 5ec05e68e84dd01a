#!/usr/bin/env bash
# scripts/fuzz.sh — builds the libFuzzer targets (clang, ASan + UBSan) in
# build-fuzz and runs each for DOLPHIN_FUZZ_SECONDS (default 60) on a copy
# of its seed corpus (tests/fuzz/corpus/<target>) in a temporary directory:
# nothing new is written into the repository. Fails on any crash, leak,
# timeout or sanitizer report; prints one summary line per target, and
# keeps the failing input and log under $DOLPHIN_FUZZ_KEEP (default
# /tmp/dolphin-fuzz-failures) to reproduce with `build-fuzz/<target> FILE`.
#
# fuzz_gguf's seeds are written at run time by tests/fuzz/gguf_seeds.py
# (the shared GGUF files' headers and truncations, and a small file of our
# own), never copied into the repository.
#
#   scripts/fuzz.sh [target...]        (default: all five)
set -euo pipefail
cd "$(dirname "$0")/.."
export DOLPHIN_SHARED="${DOLPHIN_SHARED:-$(cd .. && pwd)/shared}"
SECONDS_EACH="${DOLPHIN_FUZZ_SECONDS:-60}"
KEEP="${DOLPHIN_FUZZ_KEEP:-/tmp/dolphin-fuzz-failures}"
TARGETS=("$@")
[ "${#TARGETS[@]}" -gt 0 ] || TARGETS=(fuzz_request fuzz_safetensors fuzz_config fuzz_detok fuzz_gguf)

echo "== fuzz: build (clang, build-fuzz)"
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=Debug -DDOLPHIN_FUZZ=ON -DDOLPHIN_TESTS=OFF -DDOLPHIN_CUDA=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target "${TARGETS[@]}" >/dev/null

work="$(mktemp -d /tmp/dolphin-fuzz.XXXXXX)"
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"

failed=0
summary=()
for t in "${TARGETS[@]}"; do
  corpus="$work/$t/corpus"
  mkdir -p "$corpus" "$work/$t/artifacts"
  cp tests/fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  if [ "$t" = fuzz_gguf ]; then python3 tests/fuzz/gguf_seeds.py "$corpus" 16384; fi
  seeds=$(find "$corpus" -type f | wc -l)
  log="$work/$t/log"
  echo "== fuzz: $t for ${SECONDS_EACH}s ($seeds seeds)"
  set +e
  build-fuzz/"$t" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=30 \
    -max_len=16384 -print_final_stats=1 -artifact_prefix="$work/$t/artifacts/" \
    "$corpus" >"$log" 2>&1
  rc=$?
  set -e
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2 || true)
  files=$(find "$corpus" -type f | wc -l)
  if [ "$rc" -eq 0 ] && grep -q '^fuzz_detok: no tokenizer' "$log"; then
    line="$t: SKIPPED ($(grep -m1 'no tokenizer' "$log"))"
  elif [ "$rc" -ne 0 ] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|invariant failed' "$log"; then
    failed=1
    mkdir -p "$KEEP/$t"
    cp "$log" "$KEEP/$t/log"
    cp "$work/$t/artifacts/"* "$KEEP/$t/" 2>/dev/null || true
    line="$t: FAILED (exit $rc) after ${runs:-?} runs; input and log in $KEEP/$t"
    echo "---- $t log (tail)"
    tail -n 60 "$log"
  else
    line="$t: ok, ${runs:-?} runs in ${SECONDS_EACH}s, coverage ${cov:-?}, corpus $seeds -> $files"
  fi
  summary+=("$line")
done

echo "== fuzz summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
