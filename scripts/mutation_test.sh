#!/usr/bin/env bash
# The mutation check: proves the tests catch real bugs. Each mutant is a small deliberate
# bug kept as a patch in tests/mutants/<cpu|cuda>/NAME.patch, whose first lines say what
# it does and which tests to run:
#     Mutant: <what the bug is>
#     Tests: <gtest filter>          (* for all)
# One at a time, the script applies a mutant (git apply), rebuilds incrementally, runs
# the tests and reverts the patch. The mutant is killed when at least one test fails.
#
#   scripts/mutation_test.sh                  CPU mutants, CPU-only build in build-mutants/
#   scripts/mutation_test.sh --cuda           CUDA mutants, on a GPU machine (build-mutants-cuda/,
#                                             archs $FLASHGPT_CUDA_ARCHS or 90a;80)
#   scripts/mutation_test.sh [--cuda] NAME..  only these mutants
#   scripts/mutation_test.sh [--cuda] --list  list the mutants
#   scripts/mutation_test.sh [--cuda] --check only check that every mutant still applies
#                                             (no build, no GPU: the CTest MutantsStillApply)
#   FLASHGPT_MUTATION_BUILD_DIR=build ...     reuse an existing build directory (e.g. the
#                                             one scripts/test_gpu.sh made)
# Exit status: 0 every mutant killed; 1 a mutant survived; 2 a mutant no longer applies
# (the code it targets moved: the patch must be remade) or does not build; 3 bad usage
# or no GPU for --cuda.
set -euo pipefail
cd "$(dirname "$0")/.."

kind=cpu
list=0
check=0
names=()
for arg in "$@"; do
  case "$arg" in
    --cuda) kind=cuda ;;
    --list) list=1 ;;
    --check) check=1 ;;
    -*) echo "mutation_test.sh: unknown option $arg" >&2; exit 3 ;;
    *) names+=("$arg") ;;
  esac
done

dir=tests/mutants/$kind
if [[ ${#names[@]} -eq 0 ]]; then
  for p in "$dir"/*.patch; do names+=("$(basename "$p" .patch)"); done
fi
field() { sed -n "s/^$2: *//p" "$1" | head -n 1; }
if [[ $list -eq 1 ]]; then
  for n in "${names[@]}"; do printf '%-45s %s\n' "$n" "$(field "$dir/$n.patch" Mutant)"; done
  exit 0
fi

# Every patch must still apply before anything is built: a mutant whose target code has
# moved is an error to fix (remake the patch), not a mutant that silently does nothing.
stale=()
for n in "${names[@]}"; do
  p="$dir/$n.patch"
  if [[ ! -f "$p" ]]; then echo "mutation_test.sh: no mutant $p" >&2; exit 3; fi
  git apply --check "$p" 2>/dev/null || stale+=("$n")
done
if [[ ${#stale[@]} -gt 0 ]]; then
  for n in "${stale[@]}"; do echo "MUTANT DOES NOT APPLY: $n ($dir/$n.patch): remake it against the current code" >&2; done
  exit 2
fi
if [[ $check -eq 1 ]]; then echo "mutation_test.sh: all ${#names[@]} $kind mutants apply"; exit 0; fi

if [[ $kind == cuda ]]; then
  if ! nvidia-smi -L >/dev/null 2>&1; then echo "mutation_test.sh --cuda: no NVIDIA GPU visible" >&2; exit 3; fi
  build=${FLASHGPT_MUTATION_BUILD_DIR:-build-mutants-cuda}
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFLASHGPT_CUDA=ON \
    -DFLASHGPT_CUDA_ARCHS="${FLASHGPT_CUDA_ARCHS:-90a;80}" -DBUILD_TESTING=ON >/dev/null
else
  build=${FLASHGPT_MUTATION_BUILD_DIR:-build-mutants}
  [[ -f "$build/CMakeCache.txt" ]] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFLASHGPT_CUDA=OFF >/dev/null
fi
# The tokenizer tests need GPT-2's vocabulary (the CUDA mutants' tests do not, and a GPU
# machine may have no network).
[[ $kind == cpu ]] && bash scripts/fetch_vocab.sh >/dev/null
jobs=$(nproc)
build_tests() { cmake --build "$build" -j"$jobs" --target flashgpt flashgpt_tests; }
echo "== building the unmutated code in $build"
build_tests >/dev/null

applied=""
revert() { if [[ -n "$applied" ]]; then git apply -R "$applied"; applied=""; fi; }
trap revert EXIT INT TERM

log=$(mktemp -d)
killed=0 survived=() broken=()
for n in "${names[@]}"; do
  p="$dir/$n.patch"
  filter=$(field "$p" Tests)
  git apply "$p"
  applied="$p"
  start=$(date +%s)
  if ! build_tests >"$log/$n.build" 2>&1; then
    revert
    broken+=("$n")
    echo "BROKEN   $n: does not build (log: $log/$n.build)"
    continue
  fi
  set +e
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} timeout 900 "$build/flashgpt_tests" --gtest_filter="${filter:-*}" \
    --gtest_brief=1 --gtest_color=no >"$log/$n.test" 2>&1
  rc=$?
  set -e
  revert
  secs=$(( $(date +%s) - start ))
  if [[ $kind == cuda ]] && grep -q 'no CUDA GPU visible\|no CUDA device' "$log/$n.test"; then
    echo "mutation_test.sh: CUDA tests skipped although a GPU is visible" >&2; exit 3
  fi
  if [[ $rc -ne 0 ]]; then
    killed=$((killed + 1))
    failed=$(grep -o '^\[  FAILED  \] [^ ,]*' "$log/$n.test" | sort -u | sed 's/^\[  FAILED  \] //' | head -n 3 | paste -sd ' ' -)
    [[ $rc -eq 124 ]] && failed="(timed out) $failed"
    echo "killed   $n (${secs}s) by ${failed:-exit status $rc}"
  else
    survived+=("$n")
    echo "SURVIVED $n (${secs}s): $(field "$p" Mutant)"
    # The attention tests check only the paths this names: a forward mutant of the sm90ws
    # kernels survives FLASHGPT_TEST_ATTENTION_PATHS=sm90 (fifty-second session).
    if [[ -n ${FLASHGPT_TEST_ATTENTION_PATHS:-} ]]; then
      echo "         (FLASHGPT_TEST_ATTENTION_PATHS=$FLASHGPT_TEST_ATTENTION_PATHS: only those attention paths were tested)"
    fi
  fi
done
trap - EXIT INT TERM

echo "== rebuilding the unmutated code"
build_tests >/dev/null
total=${#names[@]}
echo "== $kind mutants: $killed of $total killed, ${#survived[@]} survived, ${#broken[@]} did not build (logs: $log)"
if [[ ${#broken[@]} -gt 0 ]]; then exit 2; fi
if [[ ${#survived[@]} -gt 0 ]]; then exit 1; fi
