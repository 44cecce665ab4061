#!/usr/bin/env bash
# Registers and spills of CUDA kernels as built for an H200 (sm_90a), from ptxas -v (no GPU
# needed), and whether ptxas serialised their wgmma instructions (its "Potential Performance
# Loss" warnings, C7514 or C7520 among them, which cost the overlap of the tensor cores
# with the rest): one line per kernel instantiation,
# with its template arguments: the element type where it is the first, the integers
# (attention: head dim first, then tile sizes), the bools in template order (attention:
# causal first; the sm80 backward's second is atomic dQ).
#   scripts/ptxas_report.sh [--strict] [FILE.cu ...]   default: kernels/cuda/attention/flash_*.cu
#   --strict: exit 1 when any kernel of the files spills or has its wgmma serialised (the
#   CTest PtxasCleanSm90Attention runs it on the Hopper attention kernels).
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
strict=0
if [[ "${1:-}" == "--strict" ]]; then strict=1; shift; fi
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(kernels/cuda/attention/flash_*.cu)
obj=$(mktemp); report=$(mktemp); trap 'rm -f "$obj" "$report"' EXIT
for f in "${files[@]}"; do
  echo "== $f"
  "$nvcc" -O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -std=c++17 -I. \
    -Xptxas -v -c "$f" -o "$obj" 2>&1 | python3 -c '
import re, sys
sys.path.insert(0, "scripts")
from kernel_names import short_name
name = spill = None
lines = sys.stdin.readlines()
serialised = set(re.findall(r"Potential Performance Loss: wgmma[^\n]*in the function .(\w+).", "".join(lines)))
for line in lines:
    m = re.search(r"Compiling entry function .(\S+).", line)
    if m:
        mangled = m.group(1)
        wgmma = ", wgmma SERIALISED" if mangled.strip(chr(39)) in serialised else ""
        types = ["bf16" if "__nv_bfloat16" in mangled else "f32"] if re.search(r"_kernelI(NS\d*_\d+TraitsI)?(13__nv_bfloat16|f)(E|L)", mangled) else []
        name = short_name(mangled, types)
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m:
        spill = "spills %s/%s bytes (stores/loads)" % m.groups()
    m = re.search(r"Used (\d+) registers", line)
    if m and name:
        print("  %-44s %4s registers, %s%s" % (name, m.group(1), spill, wgmma))
        name = spill = None
' | tee -a "$report"
done
if [[ $strict == 1 ]] && grep -Ev 'spills 0/0 bytes \(stores/loads\)$' "$report" | grep -q .; then
  echo "ptxas_report.sh: kernels above spill registers or have their wgmma serialised" >&2
  exit 1
fi
