#!/usr/bin/env bash
# scripts/same_cubin.sh --kernels on a two-kernel file in a scratch repository: a change
# after an inline asm block (whose closing "}" starts a line, as the mbarrier helpers'
# do) is found in the kernel it is in and in no other; an unchanged tree is all "same";
# a kernel whose PTX differs only in a register's number (here an inline asm block's own
# register) is "renamed". The script once cut each kernel at the first such "}" and
# compared only its start. Needs nvcc (no GPU).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
mkdir -p "$tmp/scripts" && cp "$root/scripts/same_cubin.sh" "$tmp/scripts/"
kernel() {  # the file, with kernel b's late constant $1 and kernel c's asm register ${2:-100}
  cat <<CU
__device__ __forceinline__ void fence(unsigned x) {
  asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, %0, 0;\n}\n" ::"r"(x));
}
__global__ void a(float* y, unsigned n) { fence(n); y[threadIdx.x] = y[threadIdx.x] * 3.0f + 1.0f; }
__global__ void b(float* y, unsigned n) { fence(n); y[threadIdx.x] = y[threadIdx.x] * $1 + 2.0f; }
__global__ void c(unsigned* y) {
  unsigned v;
  asm volatile("{\n.reg .u32 %%r${2:-100};\nmov.u32 %%r${2:-100}, %1;\nadd.u32 %0, %%r${2:-100}, 1;\n}\n" : "=r"(v) : "r"(y[0]));
  y[1] = v;
}
CU
}
cd "$tmp" && git init -q && git config user.email t@t && git config user.name t
kernel 5.0f > k.cu && git add -A && git commit -qm base || fail "scratch repository"
out=$(bash scripts/same_cubin.sh --kernels k.cu 2>&1); rc=$?
[[ $rc == 0 && $(grep -c '^same' <<< "$out") == 3 ]] || fail "unchanged tree: rc $rc, $out"
kernel 7.0f > k.cu
out=$(bash scripts/same_cubin.sh --kernels k.cu 2>&1); rc=$?
[[ $rc == 1 ]] || fail "b changed after its asm block: rc $rc, $out"
grep -Eq '^DIFFERENT .* _Z1bPfj$' <<< "$out" || fail "b not reported DIFFERENT: $out"
grep -Eq '^same .* _Z1aPfj$' <<< "$out" || fail "a not reported same: $out"
grep -Eq '^same .* _Z1cPj$' <<< "$out" || fail "c not reported same: $out"
kernel 5.0f 200 > k.cu
out=$(bash scripts/same_cubin.sh --kernels k.cu 2>&1); rc=$?
[[ $rc == 1 ]] || fail "c's register renamed: rc $rc, $out"
grep -Eq '^renamed .* _Z1cPj$' <<< "$out" || fail "c not reported renamed: $out"
grep -Eq '^same .* _Z1bPfj$' <<< "$out" || fail "b not reported same: $out"
kernel 5.0f 100 > k.cu && sed -i 's/add.u32 %0/sub.u32 %0/' k.cu
out=$(bash scripts/same_cubin.sh --kernels k.cu 2>&1); rc=$?
grep -Eq '^DIFFERENT .* _Z1cPj$' <<< "$out" || fail "c's changed instruction not DIFFERENT: $out"
echo "ok"
