#!/usr/bin/env bash
# run.sh — the GPU verification kit's whole check, run on the GPU machine from
# the kit folder that `scripts/gpu-kit build` made (docs/cuda.md, "The GPU
# verification kit"). Needs only an NVIDIA driver and what the kit carries;
# never builds, never reads ../shared. Never stops early: every step has a
# timeout, its status is recorded, and the next one runs. Steps:
#   1. environment (library closure, glibc), nvidia-smi, device properties
#      and device-to-device copy bandwidth (bin/dol-cuda-membw);
#   2. every CUDA test binary under tests/;
#   3. compute-sanitizer memcheck, racecheck, synccheck on the kernel tests;
#   4. the golden outputs over HTTP (tests/http/test_golden.py) against
#      `dolphind --backend cuda`;
#   5. a random model of a real shape (13b -> 7b -> 1b, whichever the budget
#      allows): finite logits, CUDA greedy ids equal to the CPU backend's
#      (bin/dol-check-backends), last-position logits against Hugging Face
#      transformers (py/hf_compare.py; n/a without torch + transformers);
#   6. dolphind --backend cuda on that model: time to ready, a completion and
#      a chat completion, 8 and 32 concurrent streams (py/serve_check.py);
#   7. the engine benchmark for f16, nf4 and int8 (when the binary has it).
# Writes $OUT/summary.md (every row; n/a only where a GPU or a GPU-side tool
# is missing) and at most 7 logs to $OUT. Exits 1 at the end when anything
# failed, else 0.
# Environment: OUT (default ./gpu-kit-out), GPU_KIT_WORK (scratch for models,
# default /tmp/dolphin-gpu-kit), GPU_KIT_BUDGET_S (default 480: the whole
# run), GPU_KIT_SHAPE (auto|13b|7b|1b|110m|tiny, default auto),
# GPU_KIT_PROFILE (gpu, default, or rehearse: the small shapes and counts of
# `scripts/gpu-kit rehearse`, test binaries two at a time), GPU_KIT_PYTHON
# (default python3).
set -u
KIT="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$PWD/gpu-kit-out}"
WORK="${GPU_KIT_WORK:-/tmp/dolphin-gpu-kit}"
BUDGET="${GPU_KIT_BUDGET_S:-480}"
PROFILE="${GPU_KIT_PROFILE:-gpu}"
PY="${GPU_KIT_PYTHON:-python3}"
mkdir -p "$OUT" "$WORK" || exit 1
L="$WORK/logs"
rm -rf "$L" && mkdir -p "$L"
T0=$(date +%s)
NPROC=$(nproc 2>/dev/null || echo 4)
MODE=$(sed -n 's/^mode=//p' "$KIT/KIT_INFO" 2>/dev/null)
MODE=${MODE:-cuda}

# the profile: sizes of every step
if [ "$PROFILE" = rehearse ]; then
  SHAPE_DEFAULT=tiny; PROMPT=16; DECODE=1; BATCHES=1,8,32; REPEAT=1; CONC=8,32
  MAX_TOKENS=4; REQS=1; CHECK_STEPS=4; CHECK_PROMPT=8; MEMBW_MIB=64; TEST_JOBS=2
  T_TEST=600; T_SAN=120; T_GOLD=900; T_MODEL=120; T_CHECK=300; T_HF=300; T_SERVE=600; T_BENCH=300
else
  SHAPE_DEFAULT=auto; PROMPT=512; DECODE=128; BATCHES=1,8,32; REPEAT=2; CONC=8,32
  MAX_TOKENS=64; REQS=2; CHECK_STEPS=8; CHECK_PROMPT=16; MEMBW_MIB=4096; TEST_JOBS=1
  T_TEST=120; T_SAN=60; T_GOLD=90; T_MODEL=240; T_CHECK=120; T_HF=150; T_SERVE=120; T_BENCH=75
fi
SHAPE="${GPU_KIT_SHAPE:-$SHAPE_DEFAULT}"
# auto: the largest shape whose checkpoint is made (in the background, from
# the start; 7b, 13.5 GB, is estimated at about 2 minutes from one thread)
# and measured within the budget
if [ "$SHAPE" = auto ]; then
  if [ "$BUDGET" -ge 900 ]; then SHAPE=13b; elif [ "$BUDGET" -ge 420 ]; then SHAPE=7b; else SHAPE=1b; fi
fi

elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(elapsed) )); }
# the timeout of a step: its own limit, or what the budget leaves minus a
# reserve for the steps after it, whichever is smaller (at least 10 s)
limit() {
  local want=$1 reserve=${2:-0} l
  l=$(( $(left) - reserve ))
  [ "$l" -lt "$want" ] && want=$l
  [ "$want" -lt 10 ] && want=10
  echo "$want"
}

STEPS="$WORK/steps.tsv"; ROWS="$WORK/rows.tsv"
: > "$STEPS"; : > "$ROWS"
# step NAME STATUS SECONDS NOTE (anything but pass and n/a is a failure)
step_done() {
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >> "$STEPS"
  echo "== $1: $2 (${3} s) ${4:-}"
}
# row SECTION MEASURE VALUE
row() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$ROWS"; }

# run NAME LOG TIMEOUT cmd...: runs it, appends to LOG, records the step
# (pass, FAIL rc N, TIMEOUT after N s, or FAIL skipped for exit 77)
run() {
  local name=$1 log=$2 t=$3 s rc st
  shift 3
  s=$(date +%s)
  echo "### $name: $* (timeout ${t} s)" >> "$log"
  timeout -k 10 "$t" "$@" >> "$log" 2>&1
  rc=$?
  case $rc in
    0) st=pass ;;
    124|137) st="TIMEOUT after ${t} s" ;;
    77) st="FAIL (skipped: exit 77)" ;;
    *) st="FAIL (exit $rc)" ;;
  esac
  echo "### $name: exit $rc" >> "$log"
  step_done "$name" "$st" $(( $(date +%s) - s ))
  LAST_STATUS=$st
  return $rc
}

echo "gpu-kit: profile $PROFILE, mode $MODE, budget ${BUDGET} s, shape $SHAPE, work $WORK, out $OUT"

# the random checkpoint is made in the background while steps 1-4 run (kept
# under $GPU_KIT_WORK: a second run on the same machine reuses it)
start_model() {
  GEN_T0=$(date +%s)
  local m="$WORK/models/$SHAPE"
  if [ -f "$m/.complete" ]; then echo "reusing $m" > "$WORK/make-model.log"; GEN_PID=$(sh -c 'echo $$'); return; fi
  rm -rf "$m"; mkdir -p "$WORK/models"
  ( "$KIT/bin/dol-make-random-model" "$SHAPE" "$m" --seed 1 \
      --tokenizer "$KIT/shared/models/tiny-llama2/tokenizer.model" && touch "$m/.complete" &&
    echo "made in $(( $(date +%s) - GEN_T0 )) s" ) > "$WORK/make-model.log" 2>&1 &
  GEN_PID=$!
}
# the generator runs in a subshell: stop its child first, then the subshell
stop_model() {
  kill -0 "$GEN_PID" 2>/dev/null || return 0
  pkill -P "$GEN_PID" 2>/dev/null; kill "$GEN_PID" 2>/dev/null; wait "$GEN_PID" 2>/dev/null
  return 0
}
trap stop_model EXIT
start_model

# ---- 1. environment and device ---------------------------------------------
LOG1="$L/1-device.log"
export LD_LIBRARY_PATH="$KIT/lib"
export DOLPHIN_SHARED="$KIT/shared"
# cuBLAS is not carried (libcublasLt alone is ~500 MiB): take the machine's,
# from the CUDA toolkit or the nvidia-cublas Python wheel
CUBLAS_DIR=""
if [ "$MODE" = cuda ] && [ ! -e "$KIT/lib/libcublas.so.13" ]; then
  cands=("${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64)
  while IFS= read -r d; do cands+=("$d"); done < <("$PY" - <<'EOF' 2>/dev/null
import glob, site, sys
for s in site.getsitepackages() + [site.getusersitepackages()]:
    for d in sorted(glob.glob(s + "/nvidia/*/lib")) + sorted(glob.glob(s + "/nvidia/cu*/lib")):
        print(d)
EOF
)
  for d in "${cands[@]}"; do
    if [ -e "$d/libcublas.so.13" ] && [ -e "$d/libcublasLt.so.13" ]; then CUBLAS_DIR=$d; break; fi
  done
  [ -n "$CUBLAS_DIR" ] && export LD_LIBRARY_PATH="$KIT/lib:$CUBLAS_DIR"
fi
{
  echo "kit: $(cat "$KIT/KIT_INFO" 2>/dev/null | tr '\n' ' ')"
  uname -a; ldd --version 2>&1 | head -1
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} >> "$LOG1"
s=$(date +%s); missing=""
for b in "$KIT"/bin/* "$KIT"/tests/*; do
  [ "$(head -c 4 "$b" 2>/dev/null | tail -c 3)" = ELF ] || continue
  ldd "$b" > "$WORK/ldd.txt" 2>&1
  echo "ldd $(basename "$b"):" >> "$LOG1"; cat "$WORK/ldd.txt" >> "$LOG1"
  m=$(awk '/not found/ { print $1 }' "$WORK/ldd.txt" | sort -u | tr '\n' ' ')
  [ -n "$m" ] && missing="$missing$(basename "$b"): $m; "
done
need_glibc=$(sed -n 's/^glibc_needed=//p' "$KIT/KIT_INFO" 2>/dev/null)
have_glibc=$(ldd --version 2>&1 | head -1 | grep -o '[0-9]\+\.[0-9]\+$')
if [ -z "$missing" ]; then
  step_done "libraries" pass $(( $(date +%s) - s )) "every library resolved (cuBLAS from ${CUBLAS_DIR:-the kit or not needed})"
else
  step_done "libraries" "FAIL" $(( $(date +%s) - s )) "unresolved: $missing"
fi
row environment "glibc (kit needs / machine has)" "${need_glibc:-?} / ${have_glibc:-?}"
row environment "libraries" "$([ -z "$missing" ] && echo "all resolved; cuBLAS from ${CUBLAS_DIR:-kit/none}" || echo "FAIL: unresolved $missing")"

if command -v nvidia-smi >/dev/null 2>&1; then
  run "nvidia-smi" "$LOG1" 30 nvidia-smi
  nvidia-smi -q >> "$LOG1" 2>&1
  row device "GPU, driver, memory" "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
  row device "clocks (SM, memory), power limit" "$(nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.limit --format=csv,noheader 2>/dev/null | head -1)"
else
  step_done "nvidia-smi" "n/a" 0 "no nvidia-smi (no NVIDIA driver)"
  row device "GPU, driver, memory" "n/a (no nvidia-smi)"
  row device "clocks (SM, memory), power limit" "n/a (no nvidia-smi)"
fi
run "device properties, copy bandwidth" "$LOG1" 60 "$KIT/bin/dol-cuda-membw" "$MEMBW_MIB"
BW=$(sed -n 's/.*d2d_copy_GBps=\([0-9.]*\).*/\1/p' "$LOG1" | tail -1)
PROPS=$(grep -o 'device_cc=.*' "$LOG1" | tail -1)
[ "$MODE" = emu ] && PROPS="$PROPS (emulated device)"
row device "device properties" "${PROPS:-FAIL (see 1-device.log)}"
if [ -n "$BW" ]; then
  row device "device-to-device copy bandwidth (read + write)" "$BW GB/s$([ "$MODE" = emu ] && echo ' (emulated: host memcpy)')"
else
  row device "device-to-device copy bandwidth (read + write)" "FAIL (see 1-device.log)"
fi

# ---- 2. the CUDA test binaries ----------------------------------------------
LOG2="$L/2-tests.log"
pids=(); names=()
running() { local n=0 p; for p in "$@"; do kill -0 "$p" 2>/dev/null && n=$((n + 1)); done; echo $n; }
for t in "$KIT"/tests/test_*; do
  [ -x "$t" ] || continue
  n=$(basename "$t")
  ( run "test $n" "$WORK/$n.log" "$(limit "$T_TEST" 300)" "$t"; row tests "$n" "$LAST_STATUS" ) &
  pids+=($!); names+=("$n")
  while [ "$(running "${pids[@]}")" -ge "$TEST_JOBS" ]; do sleep 0.5; done
done
[ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
for n in "${names[@]}"; do cat "$WORK/$n.log" >> "$LOG2"; done

# ---- 3. compute-sanitizer on the kernel tests --------------------------------
LOG3="$L/3-sanitizer.log"
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in memcheck racecheck synccheck; do
  for t in test_cuda_kernels test_cuda_kvq8 test_cuda_nf4; do
    [ "$tool" != memcheck ] && [ "$t" = test_cuda_nf4 ] && continue
    if [ -z "$SAN" ] || [ "$MODE" = emu ]; then
      step_done "$tool $t" "n/a" 0 "no compute-sanitizer (a GPU-side tool)"
      row sanitizer "$tool: $t" "n/a (no compute-sanitizer / no GPU)"
    else
      run "$tool $t" "$LOG3" "$(limit "$T_SAN" 240)" "$SAN" --tool "$tool" --error-exitcode 1 "$KIT/tests/$t"
      row sanitizer "$tool: $t" "$LAST_STATUS; $(grep -o 'ERROR SUMMARY: [0-9]* error[s]*' "$LOG3" | tail -1)"
    fi
  done
done

# ---- 4. the golden outputs over HTTP -----------------------------------------
LOG4="$L/4-goldens.log"
cat > "$WORK/dolphind-cuda" <<WRAP
#!/bin/sh
exec "$KIT/bin/dolphind" --backend cuda "\$@"
WRAP
chmod +x "$WORK/dolphind-cuda"
if "$PY" -c 'import pytest, requests' 2>/dev/null; then
  DOLPHIN_BIN="$WORK/dolphind-cuda" run "goldens over HTTP" "$LOG4" "$(limit "$T_GOLD" 240)" \
    "$PY" -m pytest "$KIT/py/tests/http/test_golden.py" -q -p no:cacheprovider
  row goldens "test_golden.py against dolphind --backend cuda" "$LAST_STATUS; $(grep -E '[0-9]+ (passed|failed)' "$LOG4" | tail -1)"
else
  step_done "goldens over HTTP" "FAIL" 0 "$PY has no pytest + requests"
  row goldens "test_golden.py against dolphind --backend cuda" "FAIL: $PY has no pytest + requests"
fi

# ---- 5. a random model of a real shape -----------------------------------------
LOG5="$L/5-model.log"
MODEL="$WORK/models/$SHAPE"
wait_model() {  # wait for the background generator; 0 when the model is complete
  local t=$1 s
  s=$(date +%s)
  while kill -0 "$GEN_PID" 2>/dev/null && [ $(( $(date +%s) - s )) -lt "$t" ]; do sleep 1; done
  stop_model
  cat "$WORK/make-model.log" >> "$LOG5" 2>/dev/null
  [ -f "$MODEL/.complete" ]
}
s5=$(date +%s)
if wait_model "$(limit "$T_MODEL" 200)"; then
  step_done "make $SHAPE model" pass $(( $(date +%s) - s5 )) "waited; made in the background from the start: $(tail -1 "$WORK/make-model.log")"
elif [ "$SHAPE" != 1b ] && [ "$SHAPE" != tiny ]; then
  step_done "make $SHAPE model" "TIMEOUT" $(( $(date +%s) - GEN_T0 )) "not ready in time: falling back to 1b"
  SHAPE=1b; MODEL="$WORK/models/1b"
  start_model; wait_model 90 && step_done "make 1b model" pass $(( $(date +%s) - s5 )) ||
    step_done "make 1b model" FAIL $(( $(date +%s) - s5 ))
else
  step_done "make $SHAPE model" FAIL $(( $(date +%s) - GEN_T0 )) "see 5-model.log"
fi
row model "shape" "$SHAPE ($( [ -f "$MODEL/config.json" ] && "$PY" -c 'import json,sys; c=json.load(open(sys.argv[1])); print("%d layers, hidden %d, ffn %d, heads %d/%d, vocab %d" % (c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"]), c["vocab_size"]))' "$MODEL/config.json" 2>/dev/null))"
run "CUDA vs CPU backend" "$LOG5" "$(limit "$T_CHECK" 150)" "$KIT/bin/dol-check-backends" "$MODEL" \
  --threads "$NPROC" --prompt "$CHECK_PROMPT" --steps "$CHECK_STEPS" --logits-out "$WORK/logits.json"
R=$(grep '^RESULT' "$LOG5" | tail -1)
kv() { echo " $R" | grep -o " $1=[^ ]*" | cut -d= -f2; }
if [ -n "$R" ]; then
  row model "logits finite (CUDA and CPU)" "$(kv finite) ($(kv nonfinite) non-finite)"
  row model "CUDA greedy ids = CPU's ($NPROC threads)" "$(kv equal_steps) steps equal, $(kv ids); smallest CPU margin $(kv min_cpu_margin)"
  row model "max abs logit difference, CUDA vs CPU" "$(kv max_abs_dlogit) (bound $(kv tol)): $(kv status)"
else
  row model "logits finite (CUDA and CPU)" "FAIL (no result: see 5-model.log)"
  row model "CUDA greedy ids = CPU's ($NPROC threads)" "FAIL (no result)"
  row model "max abs logit difference, CUDA vs CPU" "FAIL (no result)"
fi
if "$PY" -c 'import torch, transformers, safetensors' 2>/dev/null; then
  run "Hugging Face comparison" "$LOG5" "$(limit "$T_HF" 120)" "$PY" "$KIT/py/hf_compare.py" "$MODEL" "$WORK/logits.json"
  H=$(grep '^RESULT' "$LOG5" | tail -1)
  row model "last-position logits vs transformers LlamaForCausalLM" "$LAST_STATUS; ${H#RESULT }"
else
  step_done "Hugging Face comparison" "n/a" 0 "torch + transformers absent"
  row model "last-position logits vs transformers LlamaForCausalLM" "n/a (torch + transformers absent: a GPU-machine tool)"
fi

# ---- 6. the server on that model ---------------------------------------------
LOG6="$L/6-server.log"
run "dolphind --backend cuda" "$LOG6" "$(limit "$T_SERVE" 90)" "$PY" "$KIT/py/serve_check.py" \
  --bin "$KIT/bin/dolphind" --model "$MODEL" --concurrency "$CONC" --max-tokens "$MAX_TOKENS" \
  --requests-per-client "$REQS" --json "$WORK/serve.json"
"$PY" - "$WORK/serve.json" "$CONC" >> "$ROWS" 2>>"$LOG6" <<'EOF' || row server "results" "FAIL (no results)"
import json, sys
r = json.load(open(sys.argv[1]))
def f(x, unit=""):
    return "FAIL" if x is None else ("%.1f%s" % (x, unit))
print("server\ttime to ready\t%s" % f(r.get("ready_s"), " s"))
print("server\tcompletion\t%s" % r.get("completion", "FAIL"))
print("server\tchat completion\t%s" % r.get("chat", "FAIL"))
for c in sys.argv[2].split(","):
    x = r.get("rows", {}).get(c)
    if not x:
        print("server\t%s streams\tFAIL (not measured)" % c)
        continue
    print("server\t%s streams: tokens/s, TTFT p50/p99, TPOT p50/p99\t%.1f tokens/s; TTFT %.0f/%.0f ms; TPOT %.1f/%.1f ms%s"
          % (c, x["tok_per_s"], x["ttft_p50"], x["ttft_p99"], x["tpot_p50"], x["tpot_p99"],
             " (%d of %d requests failed)" % (x["errors"], x["requests"]) if x["errors"] else ""))
EOF

# ---- 7. the engine benchmark per weight format --------------------------------
LOG7="$L/7-bench.log"
FORMATS="f16 nf4"
if "$KIT/bin/dol-bench-engine" 2>&1 | grep -q int8; then FORMATS="$FORMATS int8"; INT8=yes; else INT8=no; fi
for fmt in $FORMATS; do
  flog="$WORK/bench-$fmt.log"; : > "$flog"
  run "bench $fmt" "$flog" "$(limit "$T_BENCH" 10)" "$KIT/bin/dol-bench-engine" "$MODEL" --backend cuda \
    --weights "$fmt" --prompts "$PROMPT" --decode "$DECODE" --batches "$BATCHES" --repeat "$REPEAT" --threads "$NPROC"
  cat "$flog" >> "$LOG7"
  st=$LAST_STATUS
  val() { awk -v k="$1" 'index($0, k) == 1 { print $NF; exit }' "$flog"; }
  pre=$(val "prefill tokens/s @$PROMPT")
  mib=$(sed -n 's/.*resident weights \([0-9.]*\) MiB.*/\1/p' "$flog" | head -1)
  stepmb=$(val "weight bytes per decode step (MB)")
  row "bench $fmt" "prefill tokens/s @$PROMPT" "${pre:-$st}"
  for b in ${BATCHES//,/ }; do
    d=$(val "decode tokens/s batch $b ")
    extra=""
    if [ "$b" = 1 ] && [ -n "$d" ] && [ -n "$BW" ] && [ -n "$stepmb" ]; then
      extra=$(awk -v d="$d" -v bw="$BW" -v mb="$stepmb" 'BEGIN { r = bw * 1e9 / (mb * 1e6); printf " (%.0f %% of the copy-bandwidth roofline, %.1f tokens/s)", 100 * d / r, r }')
    fi
    row "bench $fmt" "decode tokens/s batch $b" "${d:-$st}$extra"
  done
  if [ -n "$mib" ]; then
    row "bench $fmt" "memory: resident weights; bytes per decode step" "$mib MiB; $stepmb MB"
  else
    row "bench $fmt" "memory: resident weights; bytes per decode step" "$st"
  fi
done
if [ "$INT8" = no ]; then
  step_done "bench int8" "n/a" 0 "this dol-bench-engine has no --weights int8"
  row "bench int8" "all rows" "n/a (this build has no weights int8)"
fi

# ---- summary ---------------------------------------------------------------------
FAILED=0
awk -F'\t' '$2 != "pass" && $2 != "n/a" { bad = 1 } END { exit !bad }' "$STEPS" && FAILED=1
{
  echo "# Dolphin GPU kit: $([ $FAILED = 0 ] && echo 'all passed' || echo 'FAILURES')"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), profile $PROFILE, mode $MODE, $(elapsed) s of a ${BUDGET} s budget; kit: $(tr '\n' ' ' < "$KIT/KIT_INFO" 2>/dev/null)"
  echo
  echo "| step | status | s | note |"
  echo "|---|---|---:|---|"
  awk -F'\t' '{ printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4 }' "$STEPS"
  echo
  echo "| section | measure | value |"
  echo "|---|---|---|"
  awk -F'\t' '{ printf "| %s | %s | %s |\n", $1, $2, $3 }' "$ROWS"
} > "$OUT/summary.md"
# the logs: at most 7 beside summary.md
for f in "$LOG1" "$LOG2" "$LOG3" "$LOG4" "$LOG5" "$LOG6" "$LOG7"; do
  [ -f "$f" ] && cp "$f" "$OUT/"
done
cat "$OUT/summary.md"
echo "gpu-kit: $(elapsed) s; summary and logs in $OUT"
exit $FAILED
