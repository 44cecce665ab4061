#!/usr/bin/env bash
# The GPU-machine part of issue 11 (inference and interop), logs in OUTDIR:
#   FlashDecoding / KV-cache / GPU generation tests → decode benchmark vs PyTorch SDPA →
#   Hugging Face parity (export, import, generation) → a sample from the GPT-2 124M run
#   (runs/gpt2-124m, if scripts/gpu_session.sh trained it in this session).
# Uses build/ when it holds a CUDA build (gpu_session.sh makes one), else builds it.
#   scripts/gpu_inference.sh OUTDIR
set -uo pipefail
out=$(realpath -m "${1:-gpu_logs_inference}"); mkdir -p "$out"
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=$(nproc) PYTHONUNBUFFERED=1
part() { echo "== $1 ($((SECONDS)) s)"; }
if [ -f .devcarry/cache.tar.xz ] && [ ! -d cache/gpt2 ]; then mkdir -p cache && tar xJf .devcarry/cache.tar.xz -C cache; fi

part build
if ! grep -q "^CMAKE_CUDA_COMPILER:FILEPATH=/" build/CMakeCache.txt 2>/dev/null; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFLASHGPT_CUDA_ARCHS=90a -DBUILD_TESTING=ON >"$out/cmake.log" 2>&1
fi
cmake --build build -j"$(nproc)" >"$out/build.log" 2>&1 || { grep -m20 -E "error" "$out/build.log"; exit 1; }

part "GPU tests: FlashDecoding, KV cache, generation"
timeout 240 build/flashgpt_tests --gtest_filter='Cuda/FlashDecode*:CudaKVCache*:CudaGenerate*' --gtest_color=no >"$out/tests.log" 2>&1
echo "rc=$?"; grep -E "^\[  FAILED  \]|^\[  PASSED  \]|^\[  SKIPPED \] [0-9]|tests? from .* ran" "$out/tests.log" | sort -u | head -30

part "decode benchmark vs SDPA (the default choice, then each kernel)"
timeout 400 python3 scripts/bench_decode.py --flashgpt build/flashgpt --iters 10 --warmup 3 \
  --kernels registers,bulk128,bulk256 >"$out/bench_decode.log" 2>&1
echo "rc=$?"; tail -80 "$out/bench_decode.log"

part "Hugging Face parity"
trained=""; [ -f runs/gpt2-124m/latest ] && trained="--trained runs/gpt2-124m"
timeout 240 python3 scripts/parity_hf.py --flashgpt build/flashgpt $trained >"$out/parity_hf.log" 2>&1
echo "rc=$?"; grep -E "^(PASS|FAIL)|^greedy|^parity_hf|tokens/s" "$out/parity_hf.log"

if [ -f runs/gpt2-124m/latest ]; then
  part "sample from the GPT-2 124M run"
  timeout 60 build/flashgpt sample runs/gpt2-124m --prompt "The President said that" --max-new-tokens 120 \
    --top-k 50 --seed 1 >"$out/sample124m.log" 2>&1
  echo "rc=$?"; cat "$out/sample124m.log"
fi
part done
tar czf "$out/../logs_inference.tgz" -C "$out" . 2>/dev/null
