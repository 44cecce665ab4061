#!/usr/bin/env bash
# Session 7, call 3: owner-mode dQ: tests, mutants, step, sweep, torch.compile.
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
stamp build
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFLASHGPT_CUDA=ON -DFLASHGPT_CUDA_ARCHS="90a;80" -DBUILD_TESTING=ON >$OUT/cmake.log 2>&1
cmake --build build -j16 --target flashgpt flashgpt_tests >$OUT/build.log 2>&1 || { stamp build failed; tail -30 $OUT/build.log; exit 1; }
bash scripts/ptxas_report.sh kernels/cuda/attention/flash_bwd_sm90.cu > $OUT/ptxas_bwd.txt 2>&1; cat $OUT/ptxas_bwd.txt
stamp tests
FLASHGPT_TEST_ATTENTION_PATHS=sm90,auto timeout 240 build/flashgpt_tests --gtest_filter='*FlashAttention*:CudaMemory.*' --gtest_color=no >$OUT/tests.txt 2>&1
echo "tests rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|Failure" $OUT/tests.txt | head -20
stamp breakdowns
build/flashgpt bench train --breakdown --warmup 3 --steps 10 >$OUT/bd_auto.txt 2>&1
FLASHGPT_ATTENTION_BWD_DQ=atomic build/flashgpt bench train --breakdown --warmup 3 --steps 10 >$OUT/bd_atomic.txt 2>&1
for f in $OUT/bd_*.txt; do echo "== $f"; grep -E "attention_backward|step time|total" $f | head -6; done
stamp attention sweep
timeout 200 python3 scripts/bench_attention.py --flashgpt build/flashgpt --paths sm90ws/atomic,sm90ws/owner --iters 10 --warmup 3 >$OUT/attention.txt 2>&1
tail -23 $OUT/attention.txt | grep -E "B   H|  64 "
stamp bench_train
timeout 200 python3 scripts/bench_train.py --flashgpt build/flashgpt --B 64 --steps 20 --warmup 5 >$OUT/bench_train.txt 2>&1
tail -8 $OUT/bench_train.txt
stamp mutants
FLASHGPT_MUTATION_BUILD_DIR=build timeout 200 scripts/mutation_test.sh --cuda flash_bwd_sm90_owner_drops_partial flash_bwd_sm90_claim_skips_item >$OUT/mutants.txt 2>&1
echo "mutants rc=$?"; grep -iE "killed|survived|mutant" $OUT/mutants.txt | tail -4
stamp done
