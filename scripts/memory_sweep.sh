#!/usr/bin/env bash
# The long-context memory measurements of issue 10 on one GPU (GPT-2 124M, bf16), logs,
# CSV and SVG in OUTDIR. Needs build/flashgpt (CUDA, arch 90a on an H200) and, with
# --tests, build/flashgpt_tests; PyTorch for the side-by-side; no network.
#   scripts/memory_sweep.sh OUTDIR [--tests] [--1m] [--no-sweep]
# Parts, each under its own time limit so that one slow part does not hide the rest:
#   plan        the plan of every point (no GPU)                                   ~0 s
#   --tests     the GPU tests of issue 10 (2^31 boundary, plan vs measured, ...)   ~1 min
#   flash       every recompute policy, T = 1K..64K at 64K tokens per step         ~1 min
#   naive       naive attention (none, block) until it runs out of memory          ~0.5 min
#   long        T = 128K (every policy) and 256K (none, gelu, block), B = 1        ~1.5 min
#   torch       PyTorch eager, SDPA flash and math, the same points                ~1 min
#   merge       table, CSV and plot of everything (memory.txt, memory.csv, memory.svg)
#   --1m        GPT-2 124M at T = 1,048,576 (rope + block) on the corpus: one more
#               training step of runs/gpt2-124m-1m per call (it starts or resumes)  ~5.5 min
# The sweep (plan .. merge) takes about 4-5 minutes on an H200, --1m another 5-6
# (estimates from FLOP counts; the log has timestamps): run them as two calls,
#   scripts/memory_sweep.sh OUT            and    scripts/memory_sweep.sh OUT --1m --no-sweep
# Re-render the table and plot later anywhere (no GPU):
#   flashgpt memory -c configs/gpt2-124m.yaml $SEQS --tokens-per-step 65536 \
#     --attention flash,naive --recompute none,gelu,ln,attn,block \
#     --measured OUTDIR/flash.json --measured OUTDIR/naive.json --measured OUTDIR/long.json \
#     --measured OUTDIR/torch.json --plot memory.svg
set -uo pipefail
out=$(realpath -m "${1:?usage: scripts/memory_sweep.sh OUTDIR [--tests] [--1m] [--no-sweep]}"); shift
tests=0 onem=0 sweep=1
for a in "$@"; do
  case $a in --tests) tests=1 ;; --1m) onem=1 ;; --no-sweep) sweep=0 ;; *) echo "unknown option $a" >&2; exit 2 ;; esac
done
mkdir -p "$out"
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=$(nproc) PYTHONUNBUFFERED=1
fg=${FLASHGPT:-build/flashgpt}
cfg=configs/gpt2-124m.yaml
all=1K,2K,4K,8K,16K,32K,64K,128K,256K,512K,1M
policies=none,gelu,ln,attn,block
part() { echo "== $1 ($SECONDS s)"; }
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee "$out/gpu.txt"

part "plan"
"$fg" memory -c $cfg --seq $all --tokens-per-step 65536 --attention flash,naive --recompute $policies >"$out/plan.txt"
echo "rc=$?"; head -3 "$out/plan.txt"

if [ $tests = 1 ]; then
  part "GPU tests of issue 10"
  timeout 240 build/flashgpt_tests --gtest_color=no \
    --gtest_filter='CudaInt64.*:CudaMemory.*:CudaModel.RecomputePolicies*:CudaModel.Fp32Rotary*:CudaOps.Rope*:CudaOps.EmbeddingWithout*' \
    >"$out/tests.log" 2>&1
  echo "rc=$?"; grep -E "^\[  FAILED  \]|^\[  PASSED  \]|^\[  SKIPPED \]|plan .* measured" "$out/tests.log" | sort -u | head -24
fi

if [ $sweep = 1 ]; then
part "flash, every policy, T=1K..64K, 64K tokens per step"
timeout 240 "$fg" memory -c $cfg --seq 1K,2K,4K,8K,16K,32K,64K --tokens-per-step 65536 --recompute $policies \
  --measure --warmup 1 --steps 2 --json >"$out/flash.json" 2>"$out/flash.log"
echo "rc=$?"; cat "$out/flash.log"

part "naive attention until it runs out of memory"
timeout 150 "$fg" memory -c $cfg --seq 1K,2K,4K,8K,16K,32K,64K --tokens-per-step 65536 --attention naive \
  --recompute none,block --measure --warmup 1 --steps 1 --json >"$out/naive.json" 2>"$out/naive.log"
echo "rc=$?"; cat "$out/naive.log"

part "flash, T=128K (every policy) and 256K, B=1, one step each"
timeout 200 "$fg" memory -c $cfg --seq 128K --tokens-per-step 65536 --recompute $policies \
  --measure --warmup 0 --steps 1 --json >"$out/long128.json" 2>"$out/long.log"
echo "rc=$?"
timeout 150 "$fg" memory -c $cfg --seq 256K --tokens-per-step 65536 --recompute none,gelu,block \
  --measure --warmup 0 --steps 1 --json >"$out/long256.json" 2>>"$out/long.log"
echo "rc=$?"; cat "$out/long.log"

part "PyTorch eager, SDPA flash and math, same points"
timeout 200 python3 scripts/memory_torch.py --seq 1K,2K,4K,8K,16K,32K,64K,128K,256K --tokens-per-step 65536 \
  --backends flash,math --json "$out/torch.json" >"$out/torch.log" 2>&1
echo "rc=$?"; cat "$out/torch.log" | grep -v Warning

part "table, CSV and plot of everything"
measured=()
for f in flash naive long128 long256 torch; do
  # A part killed by its time limit leaves an empty or partial file: merge only whole JSON.
  if python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$out/$f.json" 2>/dev/null; then
    measured+=(--measured "$out/$f.json")
  else
    echo "($f.json missing or incomplete: not merged)"
  fi
done
"$fg" memory -c $cfg --seq $all --tokens-per-step 65536 --attention flash,naive --recompute $policies \
  "${measured[@]}" --csv "$out/memory.csv" --plot "$out/memory.svg" >"$out/memory.txt"
echo "rc=$?"; cat "$out/memory.txt"
fi

if [ $onem = 1 ]; then
  part "GPT-2 124M at T=1,048,576: plan"
  "$fg" memory -c configs/gpt2-124m-1m.yaml | tee "$out/1m_plan.txt"
  if ! ls cache/shards/corpus/train_*.bin >/dev/null 2>&1; then
    if [ -f .devcarry/cache.tar.xz ]; then mkdir -p cache && tar xJf .devcarry/cache.tar.xz -C cache; fi
    timeout 120 "$fg" prepare --input cache/corpus --out cache/shards/corpus --no-progress >"$out/1m_prepare.log" 2>&1
    echo "prepare rc=$?"
  fi
  # One more step of the run each time (~5 min on an H200): the first call starts it, each
  # later one resumes it from its last checkpoint, so a few steps fit under any per-call
  # limit. Every step after the first is scored on a new 1M-token window of the corpus
  # by a model that has taken the steps before it: the logged losses show it learning.
  run=runs/gpt2-124m-1m
  done_steps=0
  if [ -f $run/latest ]; then done_steps=$(sed -n 's/.*ckpt_0*\([0-9][0-9]*\).*/\1/p' $run/latest); fi
  next=$((done_steps + 1))
  part "GPT-2 124M at T=1,048,576: training step $next (block recompute, rotary positions)"
  resume=(); [ $done_steps -gt 0 ] && resume=(--resume $run)
  timeout 420 "$fg" train -c configs/gpt2-124m-1m.yaml --set train.steps=$next "${resume[@]}" >"$out/1m_step$next.log" 2>&1
  echo "rc=$?"; grep -E "^device|^train data|^resumed|^step|^done|error" "$out/1m_step$next.log"
  grep -h '"step"' $run/metrics.jsonl 2>/dev/null | tail -n 5
fi
part done
