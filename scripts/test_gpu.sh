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
#   FLASHGPT_NO_BUILD=1: skip the configure and build, run the binaries already in the build
#   directory (FLASHGPT_BUILD_DIR, default build), e.g. ones built elsewhere and copied in:
#   the tests then run that directory's flashgpt (FLASHGPT_TEST_BINARY) rather than the
#   path compiled into them, and read configs/ and tests/golden/ from the source path they
#   were built in, so build them in a checkout at the same path as this one.
#   FLASHGPT_TEST_SHARDS=N (default 1): N test processes share the GPU, since most of the
#   suite's time is its CPU references: each process runs one test and the next free slot
#   takes the next test of the list, so a few long tests cannot pile up in one process;
#   the tests that measure the device's free memory (CudaMemory.*) or need tens of GiB of
#   it (CudaInt64.*) then run alone, after the others. (CudaInt64's layernorm and
#   attention tests failed beside three other shards in two runs on an H200, data near a
#   4 GiB multiple of a tensor differing, and passed alone, and beside a 60 GiB matmul
#   process: BENCHMARKS.md, fourteenth and fifteenth sessions.)
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
if [[ "${FLASHGPT_NO_BUILD:-0}" == 1 ]]; then
  [[ -x "$build/flashgpt" && -x "$build/flashgpt_tests" ]] ||
    { echo "test_gpu.sh: FLASHGPT_NO_BUILD=1 but $build/flashgpt or $build/flashgpt_tests is missing" >&2; exit 3; }
  FLASHGPT_TEST_BINARY=$(realpath "$build/flashgpt")
  export FLASHGPT_TEST_BINARY
else
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFLASHGPT_CUDA=ON \
    -DFLASHGPT_CUDA_ARCHS="90a;80" -DBUILD_TESTING=ON "$@" >/dev/null
  cmake --build "$build" -j"$(nproc)" --target flashgpt flashgpt_tests
fi
"$build/flashgpt" info || true
# One process: one CUDA context for the whole suite (or one per shard). Skips count as
# failures here.
shards=${FLASHGPT_TEST_SHARDS:-1}
[[ "$shards" =~ ^[1-9][0-9]*$ ]] || { echo "test_gpu.sh: FLASHGPT_TEST_SHARDS must be a positive integer, got '$shards'" >&2; exit 3; }
limit=${FLASHGPT_TEST_TIMEOUT:-900}
out=$(mktemp -d)
run_tests() {  # FILTER LOG: one test process, its output into LOG; a failing or crashing
  # process says so there (status 1: a test failed; more: it crashed or was killed)
  timeout "$limit" "$build/flashgpt_tests" --gtest_filter="$1" --gtest_color=no > "$2" 2>&1 && return 0
  local r=$?
  echo "test_gpu.sh: $1 exited with status $r" >> "$2"
  return "$r"
}
set +e
if [[ $shards == 1 ]]; then
  timeout "$limit" "$build/flashgpt_tests" --gtest_filter="$filter" --gtest_color=no 2>&1 | tee "$out/all.log"
  rc=${PIPESTATUS[0]}
else
  # Every selected test, one per line (gtest's list: suite lines end in '.', test lines are
  # indented); the memory-measuring and memory-hungry ones (the suites of $serial, as an
  # extended regex) wait until the others are done.
  serial='CudaMemory.*:CudaInt64.*'
  suites=${serial//.\*/}
  "$build/flashgpt_tests" --gtest_filter="$filter" --gtest_list_tests |
    awk '/^[^ ]/ { suite = $1 } /^  / { print suite $1 }' > "$out/tests.txt"
  grep -vE "^(${suites//:/|})\." "$out/tests.txt" > "$out/queue.txt" || true
  alone=$(grep -E "^(${suites//:/|})\." "$out/tests.txt" | paste -sd: - || true)
  # A work queue: $shards processes at a time, one test each, its output in its own log
  # (numbered in list order); the whole queue is killed after $limit s.
  export build limit out
  export -f run_tests
  nl -ba -w1 -s' ' "$out/queue.txt" |
    timeout "$limit" xargs -r -P "$shards" -L1 bash -c 'run_tests "$2" "$out/test$(printf %04d "$1").log" || exit 1' _
  rc=$?
  [[ $rc == 123 ]] && rc=1  # xargs: some test process failed
  cat "$out"/test*.log 2>/dev/null
  if [[ -n "$alone" ]]; then
    run_tests "$alone" "$out/serial.log"; r=$?
    cat "$out/serial.log"
    [[ $r == 0 ]] || rc=$r
  fi
  echo "test_gpu.sh: $(wc -l < "$out/queue.txt") tests, $shards at a time, then ${alone:-no test} alone"
fi
if [[ $rc == 124 ]]; then echo "test_gpu.sh: the suite ran past $limit s and was killed" >&2; fi
count() { cat "$out"/*.log | grep -c "$1"; }  # lines of the logs that match
echo "test_gpu.sh: $(count '^\[       OK \]') passed, $(count '^\[  SKIPPED \] .* ([0-9]* ms)$') skipped," \
  "$(( $(count '^\[  FAILED  \] .* ([0-9]* ms)$') + $(count 'exited with status \([02-9]\|[0-9][0-9][0-9]*\)$') )) failed"
set -e
if grep -qh '^\[  SKIPPED \]' "$out"/*.log && grep -qh 'no CUDA GPU visible' "$out"/*.log; then
  echo "test_gpu.sh: CUDA tests skipped although a GPU was expected" >&2
  rc=4
fi
rm -rf "$out"
exit "$rc"
