#!/usr/bin/env bash
# Registers and spills of the attention kernels as built for an H200 (sm_90a), from ptxas -v
# (no GPU needed): one line per kernel instantiation, with its integer template arguments
# (head dim first, then tile sizes) and its bool ones (b0/b1: causal first, then, where a
# kernel has one, atomic dQ for the sm80 backward or ping-pong for sm90ws).
#   scripts/ptxas_report.sh [FILE.cu ...]     default: kernels/cuda/attention/flash_*.cu
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(kernels/cuda/attention/flash_*.cu)
obj=$(mktemp); trap 'rm -f "$obj"' EXIT
for f in "${files[@]}"; do
  echo "== $f"
  "$nvcc" -O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -std=c++17 -I. \
    -Xptxas -v -c "$f" -o "$obj" 2>&1 | python3 -c '
import re, sys
name = spill = None
for line in sys.stdin:
    m = re.search(r"Compiling entry function .(\S+).", line)
    if m:
        mangled = m.group(1)
        kernel = re.search(r"\d+(flash_\w+?_kernel)I", mangled)
        ints = re.findall(r"Li(\d+)E", mangled)   # head dim, then tile rows (if any)
        bools = re.findall(r"Lb([01])E", mangled)  # causal, then ping-pong (sm90ws)
        name = "%s<%s>" % (kernel.group(1) if kernel else mangled, ",".join(ints + ["b" + b for b in bools]))
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m:
        spill = "spills %s/%s bytes (stores/loads)" % m.groups()
    m = re.search(r"Used (\d+) registers", line)
    if m and name:
        print("  %-44s %4s registers, %s" % (name, m.group(1), spill))
        name = spill = None
'
done
