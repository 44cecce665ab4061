#!/usr/bin/env bash
# Builds the FlashAttention kernels, their tests and `flashgpt bench attention` alone,
# without the rest of flashgpt: for working on these kernels while other parts of the
# tree are mid-change. The normal build is CMake (README); this is only a shortcut.
#   kernels/cuda/attention/build_standalone.sh OUT_DIR [ARCH=90a]
# Produces OUT_DIR/flash_attention_tests and OUT_DIR/flashgpt (only `bench` inside).
set -euo pipefail
out=${1:?usage: build_standalone.sh OUT_DIR [ARCH]}
arch=${2:-90a}
mkdir -p "$out"
cuda=${CUDA_HOME:-/usr/local/cuda}
nvcc_flags=(-std=c++17 -O3 --expt-relaxed-constexpr -lineinfo -I. -gencode "arch=compute_${arch},code=sm_${arch}")
objs=()
pids=()
# Waits for the background jobs started since the last call; exits non-zero if any failed.
wait_all() {
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  pids=()
  if [ $failed -ne 0 ]; then echo "build_standalone.sh: a compile or link step failed (see above)" >&2; exit 1; fi
}
for f in kernels/cuda/attention/*.cu; do
  o="$out/$(basename "$f" .cu).o"
  "$cuda/bin/nvcc" "${nvcc_flags[@]}" -Xptxas -v -c "$f" -o "$o" 2> "$out/$(basename "$f" .cu).ptxas.txt" &
  pids+=($!)
  objs+=("$o")
done
wait_all
cxx=(g++ -std=c++17 -O3 -fopenmp -I. -I"$cuda/include" -DFLASHGPT_WITH_CUDA)
libs=(-L"$cuda/lib64" -lcudart)
"${cxx[@]}" tests/cuda/test_flash_attention.cpp src/tensor.cpp "${objs[@]}" -lgtest -lgtest_main -lpthread "${libs[@]}" \
  -o "$out/flash_attention_tests" &
pids+=($!)
cat > "$out/bench_main.cpp" <<'CPP'
#include "src/commands.h"
#include "src/errors.h"
#include "train/bench_decode.h"
#include "train/bench_train.h"
#include <cstdio>
// `bench train`, `comm` and `decode` need the rest of the tree: not part of this build.
static void not_here(CLI::App& bench, const char* name) {
  bench.add_subcommand(name, "(not in the standalone attention build)")->callback([name] {
    flashgpt::fail_input("bench ", name, ": use the full CMake build");
  });
}
void flashgpt::add_bench_train_command(CLI::App& bench) { not_here(bench, "train"); }
void flashgpt::add_bench_comm_command(CLI::App& bench) { not_here(bench, "comm"); }
void flashgpt::add_bench_decode_command(CLI::App& bench) { not_here(bench, "decode"); }
int main(int argc, char** argv) {
  CLI::App app{"flashgpt (bench only)"};
  app.require_subcommand(1);
  flashgpt::add_bench_commands(app);
  try { app.parse(argc, argv); }
  catch (const CLI::ParseError& e) { return app.exit(e) == 0 ? 0 : 2; }
  catch (const flashgpt::InputError& e) { std::fprintf(stderr, "error: %s\n", e.what()); return 2; }
  catch (const std::exception& e) { std::fprintf(stderr, "fatal: %s\n", e.what()); return 1; }
}
CPP
"${cxx[@]}" "$out/bench_main.cpp" train/bench.cpp src/tensor.cpp "${objs[@]}" "${libs[@]}" -o "$out/flashgpt" &
pids+=($!)
wait_all
