#!/usr/bin/env bash
# Builds flashgpt on a GPU machine (Release, CUDA archs 90a;80, tests on) and runs the
# GPU test suite: every CUDA op against the CPU op, the whole model on the GPU against
# the CPU model, and the FlashAttention tests (gtest suites matching *Cuda*).
# Exit status: 0 when every test passed, non-zero otherwise (or if no GPU is visible:
# the CUDA tests would only skip, which is not a pass here).
#   scripts/test_gpu.sh [--all] [extra cmake args...]   --all: the CPU tests too
#   FLASHGPT_TEST_FILTER='CudaOps.*' scripts/test_gpu.sh     a gtest filter of your own
#   FLASHGPT_TEST_TIMEOUT=900 (seconds, the default): the suite is killed after it, so that
#   a kernel that deadlocks fails the run (exit 124) instead of holding the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
filter=${FLASHGPT_TEST_FILTER:-'*Cuda*'}
if [[ "${1:-}" == "--all" ]]; then filter='*'; shift; fi
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "test_gpu.sh: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
  exit 3
fi
nvidia-smi -L
build=${FLASHGPT_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFLASHGPT_CUDA=ON \
  -DFLASHGPT_CUDA_ARCHS="90a;80" -DBUILD_TESTING=ON "$@" >/dev/null
cmake --build "$build" -j"$(nproc)" --target flashgpt flashgpt_tests
"$build/flashgpt" info || true
# One process: one CUDA context for the whole suite. Skips count as failures here.
out=$(mktemp)
set +e
timeout "${FLASHGPT_TEST_TIMEOUT:-900}" "$build/flashgpt_tests" --gtest_filter="$filter" --gtest_color=no 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
if [[ $rc == 124 ]]; then echo "test_gpu.sh: the suite ran past ${FLASHGPT_TEST_TIMEOUT:-900} s and was killed" >&2; fi
set -e
if grep -q '^\[  SKIPPED \]' "$out" && grep -q 'no CUDA GPU visible' "$out"; then
  echo "test_gpu.sh: CUDA tests skipped although a GPU was expected" >&2
  rc=4
fi
rm -f "$out"
exit "$rc"
