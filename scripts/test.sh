#!/usr/bin/env bash
# Builds and runs the whole test suite (CPU tests; CUDA tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh "$@"
bash scripts/fetch_vocab.sh
cd build && ctest --output-on-failure -j"$(nproc)"
