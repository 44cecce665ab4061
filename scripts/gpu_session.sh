#!/usr/bin/env bash
# Everything the GPU machine is needed for, in one call, logs in OUTDIR:
#   build → GPU test suite (all attention paths) → attention sweep vs PyTorch SDPA
#   (FA2, cuDNN) → training step vs torch.compile → PyTorch parity → tokenizer vs
#   tiktoken → GPT-2 124M trained briefly on the corpus, then evaluated.
# Each part has its own time limit, so one failure does not hide the rest.
#   scripts/gpu_session.sh OUTDIR
# Data: cache/corpus and cache/gpt2 (from scripts/fetch_vocab.sh and
# scripts/corpus/build.py), or .devcarry/cache.tar.xz holding them (the GPU machine
# has no network).
set -uo pipefail
out=$(realpath -m "${1:-gpu_logs}"); mkdir -p "$out"
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=$(nproc) PYTHONUNBUFFERED=1
part() { echo "== $1 ($((SECONDS)) s)"; }
if [ -f .devcarry/cache.tar.xz ]; then mkdir -p cache && tar xJf .devcarry/cache.tar.xz -C cache; fi

part build
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFLASHGPT_CUDA_ARCHS=90a -DBUILD_TESTING=ON >"$out/cmake.log" 2>&1
cmake --build build -j"$(nproc)" >"$out/build.log" 2>&1 || { grep -m20 -E "error" "$out/build.log"; exit 1; }
build/flashgpt info | tee "$out/info.log"

part "GPU tests (attention path auto)"
timeout 420 build/flashgpt_tests --gtest_filter='*Cuda*' --gtest_color=no >"$out/tests.log" 2>&1
echo "rc=$?"; grep -E "^\[  FAILED  \]|^\[  PASSED  \]|^\[  SKIPPED \] [0-9]|tests? from .* ran" "$out/tests.log" | sort -u | head -20
for path in sm80 sm90; do
  part "FlashAttention tests, FLASHGPT_ATTENTION_PATH=$path"
  FLASHGPT_ATTENTION_PATH=$path timeout 90 build/flashgpt_tests --gtest_filter='*FlashAttention*' --gtest_color=no >"$out/tests_$path.log" 2>&1
  echo "rc=$?"; grep -E "^\[  FAILED  \]|^\[  PASSED  \]" "$out/tests_$path.log" | sort -u | head -10
done

part "attention sweep vs SDPA (auto, and each path: sm80, sm90, the warp-specialised forward sm90ws)"
timeout 300 python3 scripts/bench_attention.py --flashgpt build/flashgpt --paths auto,sm80,sm90,sm90ws --iters 10 --warmup 3 >"$out/attention.log" 2>&1
echo "rc=$?"; tail -30 "$out/attention.log"

part "device copy bandwidth (the ceiling for memory-bound kernels)"
python3 - <<'PY' 2>&1 | tee "$out/copy.log"
import torch
x = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)   # 2 GiB, far above L2
y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
ts = []
for _ in range(20):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); y.copy_(x); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
ms = sorted(ts)[len(ts) // 2]
print(f"device-to-device copy: {2 * x.numel() * 2 / (ms * 1e-3) / 1e12:.2f} TB/s (bytes read + written, median of 20)")
PY

part "training step vs torch.compile"
timeout 180 python3 scripts/bench_train.py --flashgpt build/flashgpt --B 64 --steps 20 --warmup 5 >"$out/train_step.log" 2>&1
echo "rc=$?"; grep -A4 "training step, B=" "$out/train_step.log"; grep -E "step time|throughput" "$out/train_step.log"

part "parity with PyTorch"
timeout 60 python3 scripts/parity_torch.py --tests build/flashgpt_tests >"$out/parity.log" 2>&1
echo "rc=$?"; tail -4 "$out/parity.log"

part "tokenizer vs tiktoken"
{
  build/flashgpt prepare --input cache/corpus/sotu.txt --out /tmp/sotu_all --val-fraction 0 --threads 1 --no-progress
  python3 scripts/corpus/bench_tiktoken.py cache/corpus/sotu.txt --compare /tmp/sotu_all/train_000000.bin
  build/flashgpt prepare --input cache/corpus/sotu.txt --out /tmp/sotu_16 --val-fraction 0 --threads 16 --no-progress
  python3 scripts/corpus/bench_tiktoken.py cache/corpus/sotu.txt --threads 16
} >"$out/tokenizer.log" 2>&1
echo "rc=$?"; cat "$out/tokenizer.log" | tail -12

part "GPT-2 124M on the corpus"
timeout 120 build/flashgpt prepare --input cache/corpus --out cache/shards/corpus --no-progress >"$out/train124m.log" 2>&1
timeout 150 build/flashgpt train -c configs/gpt2-124m.yaml --overwrite --set train.steps=150 --set train.total_batch=0 \
  --set train.warmup_steps=30 --set train.lr=1.5e-3 --set train.eval_every=50 --set train.eval_steps=10 \
  --set train.log_every=10 >>"$out/train124m.log" 2>&1
echo "rc=$?"; grep -E "^step|^done|^device|val loss" "$out/train124m.log" | tail -24
timeout 60 build/flashgpt eval runs/gpt2-124m --steps 20 >>"$out/train124m.log" 2>&1; tail -1 "$out/train124m.log"
part done
tar czf "$out/../logs.tgz" -C "$out" . 2>/dev/null
