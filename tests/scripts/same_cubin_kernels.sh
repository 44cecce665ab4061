#!/usr/bin/env bash
# scripts/same_cubin.sh --kernels on a two-kernel file in a scratch repository: a change
# after an inline asm block (whose closing "}" starts a line, as the mbarrier helpers'
# do) is found in the kernel it is in and in no other; an unchanged tree is all "same".
# The script once cut each kernel at the first such "}" and compared only its start.
# Needs nvcc (no GPU).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
mkdir -p "$tmp/scripts" && cp "$root/scripts/same_cubin.sh" "$tmp/scripts/"
kernel() {  # the file, with kernel b's late constant $1
  cat <<CU
__device__ __forceinline__ void fence(unsigned x) {
  asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, %0, 0;\n}\n" ::"r"(x));
}
__global__ void a(float* y, unsigned n) { fence(n); y[threadIdx.x] = y[threadIdx.x] * 3.0f + 1.0f; }
__global__ void b(float* y, unsigned n) { fence(n); y[threadIdx.x] = y[threadIdx.x] * $1 + 2.0f; }
CU
}
cd "$tmp" && git init -q && git config user.email t@t && git config user.name t
kernel 5.0f > k.cu && git add -A && git commit -qm base || fail "scratch repository"
out=$(bash scripts/same_cubin.sh --kernels k.cu 2>&1); rc=$?
[[ $rc == 0 && $(grep -c '^same' <<< "$out") == 2 ]] || fail "unchanged tree: rc $rc, $out"
kernel 7.0f > k.cu
out=$(bash scripts/same_cubin.sh --kernels k.cu 2>&1); rc=$?
[[ $rc == 1 ]] || fail "b changed after its asm block: rc $rc, $out"
grep -Eq '^DIFFERENT .* _Z1bPfj$' <<< "$out" || fail "b not reported DIFFERENT: $out"
grep -Eq '^same .* _Z1aPfj$' <<< "$out" || fail "a not reported same: $out"
echo "ok"
