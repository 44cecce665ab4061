#!/usr/bin/env bash
# Before/after measurements of a kernel or step change on the GPU machine, in one call:
# builds this tree and each variant, then times every binary interleaved (each shape twice,
# binaries alternating) on the shapes the open issues are judged by, and runs the
# attention sweep with one column per binary. A variant is LABEL=FILE:
#   FILE.tgz    a whole earlier tree (the device gets no .git, so make it here first:
#               `git archive REV | gzip > base.tgz`), configured and built in /tmp/ab/LABEL;
#   FILE.patch  a diff against this tree (`git diff HEAD~2 -- FILE.cu > base.patch`, or
#               -R the other way). One of .cu/.cpp files of the library only: those files
#               are patched in a copy, compiled with this build's own commands, put in a
#               copy of its libflashgpt_core.a and linked, so a one-kernel variant costs one
#               compile, not a build. Any other (a header, a .cuh shared by kernels): a copy
#               of this tree, patched, built like a .tgz tree.
#   scripts/ab_bench.sh OUTDIR LABEL=FILE [LABEL=FILE ...] [--label=NAME] [--paths=P1,P2]
#                       [--shape=B,H,T,D[,full] ...] [--rounds=2] [--no-sweep] [--no-step]
#                       [--no-long] [--archs=90a] [--dry-run]
# This tree is labelled `new` (--label) and built in build/ (Release, --archs, default 90a,
# with the tests, so that scripts/test_gpu.sh can follow in the same call).
# Measured, in OUTDIR:
#   pairs.log   `bench attention` at GPT-2 124M's shape (B 64, H 12, T 1024, D 64 causal)
#               and at one T = 65,536 sequence (H 12, D 64 causal), or at the --shape
#               shapes (B batch, H heads, T tokens, D head dim; `full`: no causal mask),
#               each with FLASHGPT_BENCH_HOLD_US=1000 (as the sweep), binaries alternating
#               shape by shape, --rounds times; then (unless --no-long) the long-context
#               training step (T = 65,536, B = 1, no recompute)
#   step.log    the GPT-2 124M training step (`bench train`, B = 64, 20 steps after 5)
#   sweep.log   scripts/bench_attention.py over every binary (--paths, default auto), with
#               PyTorch's FA2 and cuDNN in the same run
# --dry-run prints the commands instead of running them.
set -uo pipefail
[[ $# -ge 1 ]] || { sed -n '2,25p' "$0"; exit 2; }
out=$(realpath -m "$1"); shift
trees=() shapes=() paths=auto sweep=1 step=1 longstep=1 dry=0 self=new archs=90a rounds=2
for a in "$@"; do
  case $a in
    --paths=*) paths=${a#--paths=} ;;
    --shape=*)
      [[ ${a#--shape=} =~ ^[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*,(64|128)(,full)?$ ]] ||
        { echo "ab_bench.sh: --shape wants B,H,T,D or B,H,T,D,full (D 64 or 128), got '${a#--shape=}'" >&2; exit 2; }
      shapes+=("${a#--shape=}") ;;
    --rounds=*)
      rounds=${a#--rounds=}
      [[ $rounds =~ ^[1-9]$ ]] || { echo "ab_bench.sh: --rounds wants 1 to 9, got '$rounds'" >&2; exit 2; } ;;
    --label=*) self=${a#--label=} ;;
    --archs=*) archs=${a#--archs=} ;;
    --paths|--label|--archs|--shape|--rounds) echo "ab_bench.sh: write $a=VALUE" >&2; exit 2 ;;
    --no-sweep) sweep=0 ;;
    --no-step) step=0 ;;
    --no-long) longstep=0 ;;
    --dry-run) dry=1 ;;
    *=*) trees+=("${a%%=*}=$(realpath -m "${a#*=}")") ;;
    *) echo "ab_bench.sh: unknown argument '$a' (want LABEL=FILE or an option)" >&2; exit 2 ;;
  esac
done
[[ ${#trees[@]} -ge 1 ]] || { echo "ab_bench.sh: give at least one LABEL=FILE to compare with" >&2; exit 2; }
[[ $self =~ ^[A-Za-z0-9_-]+$ ]] || { echo "ab_bench.sh: bad label '$self'" >&2; exit 2; }
cd "$(dirname "$0")/.."
root=$PWD
run() { if [[ $dry == 1 ]]; then echo "+ $*"; else eval "$@"; fi; }
mkdir -p "$out"

labels=("$self") bins=(build/flashgpt) kinds=(self) files=(.)  # index i: one binary
for t in "${trees[@]}"; do
  label=${t%%=*} file=${t#*=}
  [[ $label =~ ^[A-Za-z0-9_-]+$ && $label != "$self" && " ${labels[*]} " != *" $label "* ]] ||
    { echo "ab_bench.sh: bad or repeated label '$label'" >&2; exit 2; }
  [[ -f $file || $dry == 1 ]] || { echo "ab_bench.sh: no file '$file'" >&2; exit 2; }
  case $file in
    *.tgz|*.tar.gz) kinds+=(tree) ;;
    *.patch|*.diff)
      # Library sources are recompiled one by one; anything else (a header needs every file
      # that includes it rebuilt, main.cpp is not in the library) takes a patched tree.
      if [[ -f $file ]] && grep -E '^\+\+\+ ' "$file" | grep -vqE '^\+\+\+ [^/ ]+/(kernels|src|layers|optim|data|train)/[^[:space:]]*\.(cu|cpp)([[:space:]].*)?$'; then
        kinds+=(patched-tree)
      else
        kinds+=(patch)
      fi ;;
    *) echo "ab_bench.sh: '$file' is neither a .tgz tree nor a .patch" >&2; exit 2 ;;
  esac
  labels+=("$label") bins+=("/tmp/ab/$label/flashgpt") files+=("$file")
done

# A patch variant's copy of this tree leaves out its builds and OUTDIR (written to
# meanwhile: tar fails on a file that changes as it reads it).
skip="--exclude=./build --exclude=./.git --exclude=./cache"
[[ $out == "$root"/* ]] && skip+=" --exclude='./${out#"$root"/}'"
# Builds: this tree, the .tgz trees and the patched trees at once, the cores shared out;
# then the library patches.
ntrees=0; for k in "${kinds[@]}"; do [[ $k == patch ]] || ntrees=$((ntrees + 1)); done
jobs=$(( $(nproc) / ntrees )); (( jobs >= 1 )) || jobs=1
cfg="-DCMAKE_BUILD_TYPE=Release -DFLASHGPT_CUDA=ON -DFLASHGPT_CUDA_ARCHS='$archs'"
run "cmake -S . -B build $cfg -DBUILD_TESTING=ON > '$out/build_$self.log' 2>&1 && cmake --build build -j$jobs --target flashgpt flashgpt_tests >> '$out/build_$self.log' 2>&1 &"
for ((i = 1; i < ${#labels[@]}; ++i)); do
  label=${labels[$i]} file=${files[$i]}
  case ${kinds[$i]} in
    tree) unpack="tar xzf '$file' -C /tmp/ab/$label/src" ;;
    patched-tree) unpack="tar cf - $skip . | tar xf - -C /tmp/ab/$label/src && patch -s -d /tmp/ab/$label/src -p1 < '$file'" ;;
    *) continue ;;
  esac
  run "rm -rf /tmp/ab/$label && mkdir -p /tmp/ab/$label/src && $unpack && cmake -S /tmp/ab/$label/src -B /tmp/ab/$label/build $cfg -DBUILD_TESTING=OFF > '$out/build_$label.log' 2>&1 && cmake --build /tmp/ab/$label/build -j$jobs --target flashgpt >> '$out/build_$label.log' 2>&1 && cp /tmp/ab/$label/build/flashgpt /tmp/ab/$label/flashgpt &"
done
run wait
# A patch variant: the patched files compiled by this build's commands (compile_commands.json)
# into a copy of its library, linked by its link command.
build_patch() {
  local label=$1 patchfile=$2 dir=/tmp/ab/$1
  rm -rf "$dir" && mkdir -p "$dir/obj" && cp "$root/build/libflashgpt_core.a" "$dir/lib.a" || return 1
  (cd "$root" && eval "tar cf - $skip .") | (mkdir -p "$dir/src" && cd "$dir/src" && tar xf -) || return 1
  patch -s -d "$dir/src" -p1 < "$patchfile" || return 1
  python3 - "$root" "$dir" "$patchfile" <<'PY' || return 1
import json, os, re, subprocess, sys
root, dir, patchfile = sys.argv[1:]
files = re.findall(r"^\+\+\+ [^/ ]+/(\S+)", open(patchfile).read(), re.M)
cmds = {e["file"]: e for e in json.load(open(os.path.join(root, "build/compile_commands.json")))}
members = subprocess.run(["ar", "t", os.path.join(root, "build/libflashgpt_core.a")], capture_output=True, text=True, check=True).stdout.split()
procs = []
for f in files:
    e = cmds[os.path.join(root, f)]
    name = os.path.basename(f) + ".o"
    if members.count(name) != 1:
        sys.exit(f"ab_bench.sh: {name} is not exactly one member of the library")
    obj = os.path.join(dir, "obj", name)
    cmd = e["command"].replace(os.path.join(root, f), os.path.join(dir, "src", f))
    cmd = re.sub(r" -o \S+", " -o " + obj, cmd)
    procs.append((obj, subprocess.Popen(cmd, shell=True, cwd=e["directory"])))
for obj, p in procs:
    if p.wait() != 0:
        sys.exit(f"ab_bench.sh: compiling {obj} failed")
    subprocess.run(["ar", "r", os.path.join(dir, "lib.a"), obj], check=True)
PY
  local link
  link=$(sed -e "s| libflashgpt_core.a | $dir/lib.a |" -e "s| -o flashgpt | -o $dir/flashgpt |" "$root/build/CMakeFiles/flashgpt.dir/link.txt")
  [[ $link == *"$dir/lib.a"* && $link == *"-o $dir/flashgpt"* ]] || { echo "ab_bench.sh: unexpected link command: $link" >&2; return 1; }
  (cd "$root/build" && eval "$link")
}
for ((i = 1; i < ${#labels[@]}; ++i)); do
  [[ ${kinds[$i]} == patch ]] || continue
  run "build_patch ${labels[$i]} '${files[$i]}' > '$out/build_${labels[$i]}.log' 2>&1 &"
done
run wait
for ((i = 0; i < ${#labels[@]}; ++i)); do
  [[ $dry == 1 || -x ${bins[$i]} ]] || { echo "ab_bench.sh: ${labels[$i]} did not build (see $out/build_${labels[$i]}.log)" >&2; exit 1; }
done

long="--set model.max_seq_len=65536 --set train.seq_len=65536 --set train.batch_size=1 --set train.total_batch=0 --set train.recompute=none"
# The attention shapes: --shape's, else GPT-2's and one 64K-token sequence.
attn=()
for sh in "${shapes[@]}"; do
  IFS=, read -r sb shh st sd sfull <<< "$sh"
  attn+=("--batch $sb --heads $shh --seq $st --head-dim $sd${sfull:+ --full} --warmup 3 --iters 20")
done
[[ ${#attn[@]} -gt 0 ]] || attn=("--batch 64 --heads 12 --seq 1024 --head-dim 64 --warmup 3 --iters 20"
                                 "--batch 1 --heads 12 --seq 65536 --head-dim 64 --warmup 2 --iters 5")
for ((rep = 1; rep <= rounds; ++rep)); do
  for a in "${attn[@]}"; do
    for ((i = 0; i < ${#labels[@]}; ++i)); do
      run "echo \"${labels[$i]} r$rep \$(FLASHGPT_BENCH_HOLD_US=1000 ${bins[$i]} bench attention $a 2>&1 | grep B=)\" >> '$out/pairs.log'"
    done
  done
  [[ $longstep == 0 ]] && continue
  for ((i = 0; i < ${#labels[@]}; ++i)); do
    run "echo '== ${labels[$i]} long step (round $rep)' >> '$out/pairs.log'"
    run "${bins[$i]} bench train $long --warmup 2 --steps 5 2>&1 | grep -E 'step time|throughput' >> '$out/pairs.log'"
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
