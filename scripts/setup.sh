#!/usr/bin/env bash
# scripts/setup.sh — installs every build and test dependency of Dolphin on a
# Debian 12 machine: Debian packages (apt-get, non-interactive) and, for the
# tests, a Python virtual environment .venv built from Debian's python3 with
# --system-site-packages, holding the pinned PyPI packages of
# tests/requirements.txt (the official `openai` client, schemathesis).
# Idempotent: a second run installs nothing and leaves .venv as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

PKGS=(
  build-essential cmake pkg-config
  libmicrohttpd-dev libcjson-dev libyaml-dev libsentencepiece-dev
  libprotobuf-dev protobuf-compiler
  libcmocka-dev
  nettle-dev libxxhash-dev
  python3 python3-venv python3-pytest python3-requests python3-yaml python3-scipy
  curl nginx-light prometheus
  clang libclang-rt-14-dev
  clang-19
  gnuplot-nox
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The test venv: rebuilt only when tests/requirements.txt changed since the
# last install (its hash is kept inside .venv).
VENV=.venv
REQ=tests/requirements.txt
want=$(sha256sum "$REQ" | cut -d' ' -f1)
have=$(cat "$VENV/.requirements.sha256" 2>/dev/null || true)
if [ "$want" != "$have" ] || [ ! -x "$VENV/bin/python" ]; then
  rm -rf "$VENV"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-input -r "$REQ"
  echo "$want" > "$VENV/.requirements.sha256"
fi
echo "setup: dependencies installed"
