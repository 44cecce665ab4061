#!/usr/bin/env bash
# scripts/ab_bench.sh's argument checks and its plan (--dry-run), without a GPU: a patch
# variant (git's or diff -u's) may touch only library .cu/.cpp files, labels are unique, and a dry run builds
# this tree, a tarball tree and a patch variant in that order.
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
[[ $rc == 2 && $out == *"may change only .cu/.cpp files"* ]] || fail "a header patch: rc $rc, $out"
out=$(bash scripts/ab_bench.sh "$tmp/o" u="$tmp/diffu.patch" --dry-run 2>&1); rc=$?
[[ $rc == 0 ]] || fail "a diff -u patch of a .cu file: rc $rc, $out"
out=$(bash scripts/ab_bench.sh "$tmp/o" h="$tmp/diffu_header.patch" --dry-run 2>&1); rc=$?
[[ $rc == 2 && $out == *"may change only .cu/.cpp files"* ]] || fail "a diff -u header patch: rc $rc, $out"
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
grep -q -- "--flashgpt cur=build/flashgpt --flashgpt old=/tmp/ab/old/flashgpt --flashgpt exp=/tmp/ab/exp/flashgpt" <<< "$out" ||
  fail "the sweep does not get one column per binary: $out"
echo "ab_bench.sh: argument checks and dry run as expected"
