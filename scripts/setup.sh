#!/usr/bin/env bash
# Installs what Colossus needs on a fresh Debian machine: system packages and
# the pinned torch wheel (plus the Python test oracles) in .venv/. Idempotent:
# each part is skipped when its stamp says it is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.11.0
APT_PACKAGES=(build-essential cmake ninja-build ccache git pkg-config python3-venv
  libopenmpi-dev openmpi-bin nlohmann-json3-dev libcli11-dev libfmt-dev
  libtomlplusplus-dev libcpp-httplib-dev libsentencepiece-dev libutf8proc-dev libonig-dev libgtest-dev curl)
# Test oracles only: the product never imports Python.
PY_ORACLES=(numpy transformers tokenizers safetensors sentencepiece protobuf openai trl peft bitsandbytes tensorboard)

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
stamp=".venv/.colossus-stamp"
want="torch==${TORCH_VERSION} ${PY_ORACLES[*]}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: creating .venv with torch==${TORCH_VERSION} (LibTorch comes from this wheel)"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q "torch==${TORCH_VERSION}" "${PY_ORACLES[@]}"
  echo "$want" > "$stamp"
fi
