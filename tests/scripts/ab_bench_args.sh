#!/usr/bin/env bash
# scripts/ab_bench.sh's argument checks and its plan (--dry-run), without a GPU: a patch
# variant (git's or diff -u's) of library .cu/.cpp files is recompiled file by file and any
# other (a header) built as a patched tree, labels are unique, --shape and --rounds are
# checked, and a dry run builds this tree, a tarball tree and a patch variant in that order
# and times the --shape shapes each round, binaries alternating.
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
printf -- '--- a/kernels/cuda/attention/tma_sm90.cuh\n+++ b/kernels/cuda/attention/tma_sm90.cuh\n' > "$tmp/header.patch"
printf -- '--- b/kernels/cuda/attention/flash_bwd_sm90.cu\n+++ a/kernels/cuda/attention/flash_bwd_sm90.cu\n' > "$tmp/ok.patch"
# diff -u writes a tab and a timestamp after each name
printf -- '--- a/kernels/cuda/attention/flash_fwd_sm90.cu\t2026-12-02 03:57:13.38 +0000\n+++ b/kernels/cuda/attention/flash_fwd_sm90.cu\t2026-12-02 03:57:13.38 +0000\n' > "$tmp/diffu.patch"
printf -- '--- a/kernels/cuda/attention/tma_sm90.cuh\t2026-12-02\n+++ b/kernels/cuda/attention/tma_sm90.cuh\t2026-12-02\n' > "$tmp/diffu_header.patch"
: > "$tmp/old.tgz"

out=$(bash scripts/ab_bench.sh "$tmp/o" h="$tmp/header.patch" --dry-run 2>&1); rc=$?
[[ $rc == 0 ]] || fail "a header patch: rc $rc, $out"
grep -q "tar xf - -C /tmp/ab/h/src && patch -s -d /tmp/ab/h/src -p1 < '$tmp/header.patch' && cmake -S /tmp/ab/h/src" <<< "$out" ||
  fail "a header patch is not built as a patched tree: $out"
grep -q "build_patch h" <<< "$out" && fail "a header patch is recompiled file by file: $out"
out=$(bash scripts/ab_bench.sh "$tmp/o" u="$tmp/diffu.patch" --dry-run 2>&1); rc=$?
[[ $rc == 0 ]] || fail "a diff -u patch of a .cu file: rc $rc, $out"
out=$(bash scripts/ab_bench.sh "$tmp/o" h="$tmp/diffu_header.patch" --dry-run 2>&1); rc=$?
[[ $rc == 0 && $out == *"patch -s -d /tmp/ab/h/src"* ]] || fail "a diff -u header patch: rc $rc, $out"
for bad in 64,12,1024 64,12,1024,96 0,12,1024,64 64,12,1024,64,causal 64x12x1024x64; do
  out=$(bash scripts/ab_bench.sh "$tmp/o" x="$tmp/ok.patch" --shape=$bad --dry-run 2>&1); rc=$?
  [[ $rc == 2 && $out == *"--shape wants B,H,T,D"* ]] || fail "--shape=$bad: rc $rc, $out"
done
for bad in 0 10 two; do
  out=$(bash scripts/ab_bench.sh "$tmp/o" x="$tmp/ok.patch" --rounds=$bad --dry-run 2>&1); rc=$?
  [[ $rc == 2 && $out == *"--rounds wants 1 to 9"* ]] || fail "--rounds=$bad: rc $rc, $out"
done
out=$(bash scripts/ab_bench.sh "$tmp/o" x="$tmp/ok.patch" x="$tmp/old.tgz" --dry-run 2>&1); rc=$?
[[ $rc == 2 && $out == *"bad or repeated label 'x'"* ]] || fail "a repeated label: rc $rc, $out"
out=$(bash scripts/ab_bench.sh "$tmp/o" x="$tmp/notes.txt" --dry-run 2>&1); rc=$?
[[ $rc == 2 && $out == *"neither a .tgz tree nor a .patch"* ]] || fail "an unknown variant: rc $rc, $out"
out=$(bash scripts/ab_bench.sh "$tmp/o" --paths auto x="$tmp/ok.patch" 2>&1); rc=$?
[[ $rc == 2 && $out == *"write --paths=VALUE"* ]] || fail "--paths without =: rc $rc, $out"

out=$(bash scripts/ab_bench.sh "$tmp/o" old="$tmp/old.tgz" exp="$tmp/ok.patch" --label=cur --no-long --dry-run 2>&1); rc=$?
[[ $rc == 0 ]] || fail "dry run: rc $rc, $out"
grep -q "cmake -S . -B build .*build_cur.log" <<< "$out" || fail "dry run does not build this tree as 'cur': $out"
grep -q "tar xzf '$tmp/old.tgz' -C /tmp/ab/old/src" <<< "$out" || fail "dry run does not unpack the tarball tree: $out"
grep -q "build_patch exp '$tmp/ok.patch'" <<< "$out" || fail "dry run does not build the patch variant: $out"
grep -q "bench train" <<< "$(grep pairs.log <<< "$out")" && fail "--no-long still runs the long-context step"
out=$(bash scripts/ab_bench.sh "$tmp/o" old="$tmp/old.tgz" --shape=64,12,1024,64 --shape=16,16,1024,128,full --rounds=3 --no-step --no-sweep --no-long --dry-run 2>&1); rc=$?
[[ $rc == 0 ]] || fail "dry run with shapes: rc $rc, $out"
timed=$(grep -o '^+ echo "[a-z]* r[0-9] $(FLASHGPT_BENCH_HOLD_US=1000 [^ ]* bench attention [^|]*' <<< "$out" | sed 's/ 2>&1 *$//')
expect=""
for r in 1 2 3; do
  for a in "--batch 64 --heads 12 --seq 1024 --head-dim 64" "--batch 16 --heads 16 --seq 1024 --head-dim 128 --full"; do
    expect+="+ echo \"new r$r \$(FLASHGPT_BENCH_HOLD_US=1000 build/flashgpt bench attention $a --warmup 3 --iters 20"$'\n'
    expect+="+ echo \"old r$r \$(FLASHGPT_BENCH_HOLD_US=1000 /tmp/ab/old/flashgpt bench attention $a --warmup 3 --iters 20"$'\n'
  done
done
[[ "$timed"$'\n' == "$expect" ]] || fail "the shapes are not timed round by round, binaries alternating: $timed"
grep -q "bench train\|bench_attention.py" <<< "$out" && fail "--no-step/--no-sweep/--no-long still run: $out"
out=$(bash scripts/ab_bench.sh "$tmp/o" old="$tmp/old.tgz" exp="$tmp/ok.patch" --label=cur --no-long --dry-run 2>&1)
grep -q -- "--flashgpt cur=build/flashgpt --flashgpt old=/tmp/ab/old/flashgpt --flashgpt exp=/tmp/ab/exp/flashgpt" <<< "$out" ||
  fail "the sweep does not get one column per binary: $out"
echo "ab_bench.sh: argument checks and dry run as expected"
