#!/usr/bin/env bash
# Session 7, call 1: build, attention + CE tests, backward schedules and CE kernel measured.
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
stamp build
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFLASHGPT_CUDA=ON -DFLASHGPT_CUDA_ARCHS="90a;80" -DBUILD_TESTING=ON >$OUT/cmake.log 2>&1
cmake --build build -j16 --target flashgpt flashgpt_tests >$OUT/build.log 2>&1 || { stamp build failed; tail -30 $OUT/build.log; exit 1; }
bash scripts/ptxas_report.sh kernels/cuda/attention/flash_bwd_sm90.cu > $OUT/ptxas_bwd.log 2>&1
stamp tests
FLASHGPT_TEST_ATTENTION_PATHS=sm90,auto timeout 240 build/flashgpt_tests --gtest_filter='*FlashAttention*:CudaOps.SoftmaxCrossEntropy*' --gtest_color=no >$OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" $OUT/tests.log | head -20
stamp breakdowns
build/flashgpt bench train --breakdown --warmup 3 --steps 10 >$OUT/bd_default.log 2>&1
FLASHGPT_ATTENTION_BWD_SCHEDULE=grid build/flashgpt bench train --breakdown --warmup 3 --steps 10 >$OUT/bd_grid.log 2>&1
FLASHGPT_CE_KERNEL=persistent build/flashgpt bench train --breakdown --warmup 3 --steps 10 >$OUT/bd_cepersistent.log 2>&1
for f in $OUT/bd_*.log; do echo "== $f"; grep -E "attention_backward|softmax_cross|ms/step|tokens/s|median|total" $f | head -8; done
stamp long
for s in persistent grid; do
  FLASHGPT_ATTENTION_BWD_SCHEDULE=$s build/flashgpt bench train --set model.max_seq_len=65536 --set train.seq_len=65536 \
    --set train.batch_size=1 --set train.total_batch=0 --set train.recompute=none --warmup 2 --steps 5 >$OUT/long_$s.log 2>&1
  echo "== long $s"; tail -4 $OUT/long_$s.log
done
stamp attention sweep
timeout 200 python3 scripts/bench_attention.py --flashgpt build/flashgpt --paths sm90ws,sm90ws/grid --iters 10 --warmup 3 >$OUT/attention.log 2>&1
tail -25 $OUT/attention.log
stamp done
