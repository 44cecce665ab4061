#!/usr/bin/env bash
# Before/after measurements of a kernel or step change on the GPU machine, in one call:
# builds this tree and each earlier tree given as LABEL=TARBALL, then times every binary
# interleaved (each shape twice, binaries alternating) on the shapes the open issues are
# judged by, and runs the attention sweep with one column per binary. The device gets no
# .git, so make the tarballs here first: `git archive REV | gzip > base.tgz`.
#   scripts/ab_bench.sh OUTDIR base=base.tgz [exp=exp.tgz ...] [--paths P1,P2] [--no-sweep]
#                       [--no-step] [--dry-run]
# This tree is labelled `new` and built in build/ (Release, arch 90a, with the tests, so
# that scripts/test_gpu.sh can follow in the same call); the others in /tmp/ab/LABEL.
# Measured, in OUTDIR:
#   pairs.log   `bench attention` at GPT-2 124M's shape (B 64, H 12, T 1024, D 64 causal)
#               and at one T = 65,536 sequence (H 12, D 64 causal), then the long-context
#               training step (T = 65,536, B = 1, no recompute)
#   step.log    the GPT-2 124M training step (`bench train`, B = 64, 20 steps after 5)
#   sweep.log   scripts/bench_attention.py over every binary (--paths, default auto), with
#               PyTorch's FA2 and cuDNN in the same run
# --dry-run prints the commands instead of running them.
set -uo pipefail
[[ $# -ge 1 ]] || { sed -n '2,18p' "$0"; exit 2; }
out=$(realpath -m "$1"); shift
trees=() paths=auto sweep=1 step=1 dry=0
for a in "$@"; do
  case $a in
    --paths=*) paths=${a#--paths=} ;;
    --paths) echo "ab_bench.sh: write --paths=LIST" >&2; exit 2 ;;
    --no-sweep) sweep=0 ;;
    --no-step) step=0 ;;
    --dry-run) dry=1 ;;
    *=*) trees+=("${a%%=*}=$(realpath -m "${a#*=}")") ;;
    *) echo "ab_bench.sh: unknown argument '$a' (want LABEL=TARBALL or an option)" >&2; exit 2 ;;
  esac
done
[[ ${#trees[@]} -ge 1 ]] || { echo "ab_bench.sh: give at least one LABEL=TARBALL to compare with" >&2; exit 2; }
cd "$(dirname "$0")/.."
run() { if [[ $dry == 1 ]]; then echo "+ $*"; else eval "$@"; fi; }
mkdir -p "$out"

labels=(new) bins=(build/flashgpt)
for t in "${trees[@]}"; do
  label=${t%%=*} tgz=${t#*=}
  [[ $label =~ ^[A-Za-z0-9_-]+$ && $label != new ]] || { echo "ab_bench.sh: bad label '$label'" >&2; exit 2; }
  [[ -f $tgz || $dry == 1 ]] || { echo "ab_bench.sh: no tarball '$tgz'" >&2; exit 2; }
  labels+=("$label") bins+=("/tmp/ab/$label/build/flashgpt")
done

# Builds: all at once, the cores shared out.
jobs=$(( $(nproc) / ${#labels[@]} )); (( jobs >= 1 )) || jobs=1
cfg="-DCMAKE_BUILD_TYPE=Release -DFLASHGPT_CUDA=ON -DFLASHGPT_CUDA_ARCHS=90a"
run "cmake -S . -B build $cfg -DBUILD_TESTING=ON > '$out/build_new.log' 2>&1 && cmake --build build -j$jobs --target flashgpt flashgpt_tests >> '$out/build_new.log' 2>&1 &"
for ((i = 1; i < ${#labels[@]}; ++i)); do
  label=${labels[$i]} tgz=${trees[$((i - 1))]#*=}
  run "rm -rf /tmp/ab/$label && mkdir -p /tmp/ab/$label && tar xzf '$tgz' -C /tmp/ab/$label && cmake -S /tmp/ab/$label -B /tmp/ab/$label/build $cfg -DBUILD_TESTING=OFF > '$out/build_$label.log' 2>&1 && cmake --build /tmp/ab/$label/build -j$jobs --target flashgpt >> '$out/build_$label.log' 2>&1 &"
done
run wait
for ((i = 0; i < ${#labels[@]}; ++i)); do
  [[ $dry == 1 || -x ${bins[$i]} ]] || { echo "ab_bench.sh: ${labels[$i]} did not build (see $out/build_${labels[$i]}.log)" >&2; exit 1; }
done

long="--set model.max_seq_len=65536 --set train.seq_len=65536 --set train.batch_size=1 --set train.total_batch=0 --set train.recompute=none"
for rep in 1 2; do
  for ((i = 0; i < ${#labels[@]}; ++i)); do
    b=${bins[$i]}
    run "echo '== ${labels[$i]} (round $rep)' >> '$out/pairs.log'"
    run "$b bench attention --batch 64 --heads 12 --seq 1024 --head-dim 64 --warmup 3 --iters 20 2>&1 | grep B= >> '$out/pairs.log'"
    run "$b bench attention --batch 1 --heads 12 --seq 65536 --head-dim 64 --warmup 2 --iters 5 2>&1 | grep B= >> '$out/pairs.log'"
    run "$b bench train $long --warmup 2 --steps 5 2>&1 | grep -E 'step time|throughput' >> '$out/pairs.log'"
  done
done
if [[ $step == 1 ]]; then
  for rep in 1 2; do
    for ((i = 0; i < ${#labels[@]}; ++i)); do
      run "echo '== ${labels[$i]} (round $rep)' >> '$out/step.log'"
      run "${bins[$i]} bench train -c configs/gpt2-124m.yaml --set train.total_batch=0 --warmup 5 --steps 20 2>&1 | grep -E 'step time|throughput' >> '$out/step.log'"
    done
  done
fi
if [[ $sweep == 1 ]]; then
  args=""
  for ((i = 0; i < ${#labels[@]}; ++i)); do args+=" --flashgpt ${labels[$i]}=${bins[$i]}"; done
  run "python3 scripts/bench_attention.py$args --paths $paths --iters 10 --warmup 3 > '$out/sweep.log' 2>&1"
fi
[[ $dry == 1 ]] || { cat "$out/pairs.log"; [[ $step == 1 ]] && cat "$out/step.log"; [[ $sweep == 1 ]] && tail -24 "$out/sweep.log"; }
exit 0
