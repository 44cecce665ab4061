#!/usr/bin/env bash
# Configures and builds flashgpt into build/ (CUDA backend when nvcc is found).
#   scripts/build.sh [extra cmake args...]     e.g. -DFLASHGPT_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
