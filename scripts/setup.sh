#!/usr/bin/env bash
# scripts/setup.sh — installs every build and test dependency of Dolphin on a
# Debian 12 machine (apt-get, non-interactive, idempotent), plus the Node
# packages the client tests use. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

PKGS=(
  build-essential cmake pkg-config
  libmicrohttpd-dev libcjson-dev libyaml-dev libsentencepiece-dev
  libcmocka-dev
  python3 python3-pytest python3-requests python3-yaml
  curl nginx-light prometheus nodejs npm
  clang libclang-rt-14-dev
  gnuplot-nox
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node/npm may come from outside Debian on some images: accept them if present.
if command -v node >/dev/null && command -v npm >/dev/null; then
  tmp=(); for p in "${missing[@]}"; do [[ "$p" == nodejs || "$p" == npm ]] || tmp+=("$p"); done
  missing=("${tmp[@]+"${tmp[@]}"}")
fi
if [ "${#missing[@]}" -gt 0 ]; then
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Node's official `openai` package for the client tests (tests/node).
if [ -f tests/node/package.json ] && [ ! -d tests/node/node_modules/openai ]; then
  (cd tests/node && if [ -f package-lock.json ]; then npm ci --no-audit --no-fund --loglevel=error; else npm install --no-audit --no-fund --loglevel=error; fi)
fi
echo "setup: dependencies installed"
