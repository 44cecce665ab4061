#!/usr/bin/env bash
# scripts/test_gpu.sh's work queue (FLASHGPT_TEST_SHARDS), without a GPU: a made-up
# nvidia-smi and test binary whose tests pass, fail, crash, skip for lack of a GPU or are
# slow. Every test runs once, in its own process; the memory suites run after the others;
# a failure or a crash gives a non-zero status and is counted; a skip for lack of a GPU is
# a failure; the time limit kills the queue with status 124.
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
mkdir -p "$tmp/bin" "$tmp/build"
printf '#!/bin/sh\necho "GPU 0: made up"\n' > "$tmp/bin/nvidia-smi"
: > "$tmp/build/flashgpt"
# The test binary: --gtest_list_tests prints $TESTS (gtest's format); a run of one test
# appends its name to ran.txt (with whether the memory suite had started) and acts as
# the test's name says; a filter with a '*' in it runs them all.
cat > "$tmp/build/flashgpt_tests" <<'STUB'
#!/usr/bin/env bash
for a in "$@"; do case $a in --gtest_filter=*) f=${a#*=};; --gtest_list_tests) list=1;; esac; done
if [[ -n ${list:-} ]]; then printf 'Running main() from gtest_main.cc\n'; printf '%b' "$TESTS"; exit 0; fi
if [[ $f == *'*'* ]]; then  # a pattern (one process for the whole suite): every test
  f=$(printf '%b' "$TESTS" | awk '/^[^ ]/ { s = $1 } /^  / { print s $1 }' | paste -sd: -)
fi
for t in ${f//:/ }; do
  echo "$t" >> "$LOGDIR/ran.txt"
  case $t in
    *.fail*) echo "[  FAILED  ] $t (3 ms)"; echo "[  FAILED  ] $t"; exit 1;;
    *.crash*) kill -SEGV $$;;
    *.nogpu*) echo "no CUDA GPU visible"; echo "[  SKIPPED ] $t (0 ms)"; echo "[  SKIPPED ] $t";;
    *.slow*) sleep 30; echo "[       OK ] $t (30000 ms)";;
    *) echo "[       OK ] $t (1 ms)";;
  esac
done
STUB
chmod +x "$tmp/bin/nvidia-smi" "$tmp/build/flashgpt" "$tmp/build/flashgpt_tests"
run() {  # SHARDS TESTS [VAR=VALUE...]: test_gpu.sh's output in $out, its status in $rc
  local shards=$1 tests=$2; shift 2
  rm -f "$tmp/ran.txt"
  out=$(env PATH="$tmp/bin:$PATH" LOGDIR="$tmp" TESTS="$tests" FLASHGPT_NO_BUILD=1 \
        FLASHGPT_BUILD_DIR="$tmp/build" FLASHGPT_TEST_SHARDS="$shards" "$@" scripts/test_gpu.sh 2>&1)
  rc=$?
}
good='CudaOps.\n  a\n  b\n  c\nCudaMemory.\n  m\nCudaAttn/Case.\n  d/0  # GetParam() = 1\n  d/1  # GetParam() = 2\n'
run 3 "$good"
[[ $rc == 0 ]] || fail "all passing: rc $rc, $out"
[[ $out == *"test_gpu.sh: 6 passed, 0 skipped, 0 failed"* ]] || fail "all passing: the count: $out"
[[ $(sort "$tmp/ran.txt" | paste -sd' ') == "CudaAttn/Case.d/0 CudaAttn/Case.d/1 CudaMemory.m CudaOps.a CudaOps.b CudaOps.c" ]] ||
  fail "each test once: $(paste -sd' ' "$tmp/ran.txt")"
[[ $(tail -1 "$tmp/ran.txt") == CudaMemory.m ]] || fail "the memory suite last: $(paste -sd' ' "$tmp/ran.txt")"
run 2 'CudaOps.\n  a\n  fail1\n  crash1\n  b\n'
[[ $rc == 1 ]] || fail "a failure and a crash: rc $rc, $out"
[[ $out == *"test_gpu.sh: 2 passed, 0 skipped, 2 failed"* ]] || fail "a failure and a crash: the count: $out"
[[ $out == *"CudaOps.crash1 exited with status 139"* ]] || fail "the crash is named: $out"
run 2 'CudaOps.\n  a\n  nogpu1\n'
[[ $rc == 4 && $out == *"skipped although a GPU was expected"* ]] || fail "a skip for lack of a GPU: rc $rc, $out"
run 2 'CudaOps.\n  slow1\n  a\n' FLASHGPT_TEST_TIMEOUT=2
[[ $rc == 124 && $out == *"ran past 2 s and was killed"* ]] || fail "the time limit: rc $rc, $out"
run 1 "$good"
[[ $rc == 0 && $out == *"test_gpu.sh: 6 passed, 0 skipped, 0 failed"* ]] || fail "one process: rc $rc, $out"
echo "test_gpu.sh's queue: ok"
