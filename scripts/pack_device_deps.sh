#!/usr/bin/env bash
# Copies the header-only dependencies that the GPU image lacks into .devdeps/
# (git-ignored; name it in the device tool's `carry`).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .devdeps && mkdir -p .devdeps/include
cp -r /usr/include/toml++ .devdeps/include/
du -sh .devdeps
