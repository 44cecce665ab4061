#!/usr/bin/env bash
# Multi-GPU checks and measurements in one call, logs in OUTDIR (for a machine with
# 2+ GPUs; with one GPU it runs the NCCL path with one rank and skips the rest):
#   build → GPU test suite on every GPU at once (one process per GPU) → the MPI/NCCL
#   tests → NCCL bus bandwidth → GPT-2 124M step on 1 GPU and on all GPUs (ZeRO-0,
#   ZeRO-1, per-bucket overlap) → optionally (--corpus) a short run on the corpus on
#   1 GPU and on all GPUs.
#   scripts/gpu_multi.sh OUTDIR [--no-build] [--corpus STEPS]
# Data for --corpus: cache/corpus, or .devcarry/cache.tar.xz holding it (no network there).
set -uo pipefail
out=$(realpath -m "${1:-gpu_multi_logs}"); shift || true
build=1; corpus_steps=0
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=0 ;;
    --corpus) corpus_steps=$2; shift ;;
  esac
  shift
done
mkdir -p "$out"
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
part() { echo "== $1 ($((SECONDS)) s)"; }
mpi="mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMP_NUM_THREADS"
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi -L; nvidia-smi topo -m > "$out/topo.log" 2>&1; nvidia-smi nvlink -s >> "$out/topo.log" 2>&1
head -5 "$out/topo.log"

if [ $build = 1 ]; then
  part build
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFLASHGPT_CUDA_ARCHS=90a -DBUILD_TESTING=ON >"$out/cmake.log" 2>&1
  cmake --build build -j"$(nproc)" >"$out/build.log" 2>&1 || { grep -m20 -E "error" "$out/build.log"; exit 1; }
fi
build/flashgpt info | tee "$out/info.log"

part "GPU test suite, one process per GPU ($gpus at once)"
pids=()
for ((g = 0; g < gpus; g++)); do
  CUDA_VISIBLE_DEVICES=$g timeout 300 build/flashgpt_tests --gtest_filter='*Cuda*:-DistributedCuda.*' \
    --gtest_color=no >"$out/tests_gpu$g.log" 2>&1 & pids+=($!)
done
for ((g = 0; g < gpus; g++)); do
  wait ${pids[$g]}; echo "GPU $g: rc=$?"; grep -E "^\[  FAILED  \]|^\[  PASSED  \]|^\[  SKIPPED \] [0-9]" "$out/tests_gpu$g.log" | sort -u | head -8
done

part "MPI/NCCL tests (CPU ranks and GPUs)"
timeout 400 build/flashgpt_tests --gtest_filter='Distributed*' --gtest_color=no >"$out/tests_distributed.log" 2>&1
echo "rc=$?"; grep -E "^\[  FAILED  \]|^\[       OK \]|^\[  SKIPPED \]|Failure" "$out/tests_distributed.log" | head -30

part "NCCL bus bandwidth"
[ "$gpus" -ge 2 ] && timeout 120 $mpi -np "$gpus" build/flashgpt bench comm --mib 1 16 64 256 1024 2>&1 | tee "$out/bench_comm.log"

bench() {  # name ranks extra...
  local name=$1 n=$2; shift 2
  echo "-- $name"
  if [ "$n" = 0 ]; then
    timeout 150 build/flashgpt bench train -c configs/gpt2-124m.yaml --set train.total_batch=0 "$@" >"$out/$name.log" 2>&1
  else
    timeout 150 $mpi -np "$n" build/flashgpt bench train -c configs/gpt2-124m.yaml --set train.total_batch=0 "$@" >"$out/$name.log" 2>&1
  fi
  echo "rc=$?"; grep -vE "^ " "$out/$name.log" | grep -E "ranks:|step time|throughput|memory|exposed|hidden|FAILED|error|fatal" | head -8
}
part "GPT-2 124M step, B=64 T=1024 per GPU"
bench step_1gpu 0 --steps 20 --warmup 5
bench step_nccl1_zero1 1 --steps 20 --warmup 5 --set train.zero=1
if [ "$gpus" -ge 2 ]; then
  bench step_${gpus}gpu_zero0 "$gpus" --steps 20 --warmup 5 --set train.zero=0 --comm-profile
  bench step_${gpus}gpu_zero1 "$gpus" --steps 20 --warmup 5 --set train.zero=1 --comm-profile
  sed -n '/gradient collectives/,$p' "$out/step_${gpus}gpu_zero1.log" | head -40
fi

if [ "$corpus_steps" -gt 0 ]; then
  part "GPT-2 124M on the corpus: 1 GPU, then $gpus GPUs ($corpus_steps steps of 2^19 tokens)"
  if [ ! -d cache/corpus ] && [ -f .devcarry/cache.tar.xz ]; then mkdir -p cache && tar xJf .devcarry/cache.tar.xz -C cache; fi
  [ -d cache/shards/corpus ] || build/flashgpt prepare --input cache/corpus --out cache/shards/corpus --no-progress >"$out/prepare.log" 2>&1
  common=(-c configs/gpt2-124m.yaml --set train.steps=$corpus_steps --set train.warmup_steps=20 --set train.lr=1.5e-3
          --set train.eval_every=25 --set train.eval_steps=8 --set train.log_every=5 --set train.checkpoint_every=0)
  timeout 240 build/flashgpt train --overwrite "${common[@]}" --set run.out_dir=runs/corpus_1gpu >"$out/corpus_1gpu.log" 2>&1
  echo "rc=$?"; grep -E "^step|^done" "$out/corpus_1gpu.log" | tail -6
  if [ "$gpus" -ge 2 ]; then
    timeout 200 $mpi -np "$gpus" build/flashgpt train --overwrite "${common[@]}" --set run.out_dir=runs/corpus_${gpus}gpu \
      >"$out/corpus_${gpus}gpu.log" 2>&1
    echo "rc=$?"; grep -E "^ranks|^step|^done" "$out/corpus_${gpus}gpu.log" | tail -6
  fi
  for f in runs/corpus_*/metrics.jsonl; do cp "$f" "$out/metrics_$(basename "$(dirname "$f")").jsonl"; done
fi
part done
