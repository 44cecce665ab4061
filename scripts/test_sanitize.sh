#!/usr/bin/env bash
# Builds flashgpt and its tests with AddressSanitizer + UndefinedBehaviorSanitizer (C++
# only, no CUDA) into build-asan/ and runs the whole ctest suite there. Slow (a full
# rebuild and a suite several times slower), so not part of CI: run it after changing
# code that reads files or indexes memory.
#   scripts/test_sanitize.sh [ctest args...]      e.g. -R Fuzz
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -DFLASHGPT_SANITIZE=ON -DFLASHGPT_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-asan -j"$(nproc)"
bash scripts/fetch_vocab.sh

# The first report of either sanitizer fails its test, with a stack trace. Leak
# detection stays on for flashgpt; the suppressions name only OpenMPI's libraries, whose
# allocations live until exit (the mpirun tests): full stacks so that they are seen,
# and OpenMPI's components kept loaded so that their names are known.
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export LSAN_OPTIONS=suppressions=$PWD/scripts/lsan_suppressions.txt:print_suppressions=0:fast_unwind_on_malloc=0
export OMPI_MCA_mca_base_component_disable_dlclose=1
cd build-asan && ctest --output-on-failure -j"$(nproc)" "$@"
