#!/usr/bin/env bash
# scripts/serve.sh — a newcomer's one command: install dependencies, build,
# and start dolphind with configs/dolphin.yaml (default model:
# $DOLPHIN_SHARED/models/stories260K, DOLPHIN_SHARED defaulting to ../shared).
# Any argument is passed to dolphind, e.g. --model /path/to/Llama-2-7b-chat-hf
# or --port 9000.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
shared="${DOLPHIN_SHARED:-../shared}"
args=(--config configs/dolphin.yaml)
if [[ " $* " != *" --model "* && " $* " != *" --model="* ]]; then
  if [ -f "$shared/models/stories260K/config.json" ]; then
    args+=(--model "$shared/models/stories260K")
  else
    echo "serve.sh: no default model at $shared/models/stories260K;" \
         "pass --model DIR (a Hugging Face Llama directory, e.g. from huggingface-cli download)" >&2
    exit 2
  fi
fi
exec ./build/dolphind "${args[@]}" "$@"
