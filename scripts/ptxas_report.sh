#!/usr/bin/env bash
# Registers and spills of the Hopper attention kernels, from ptxas -v (no GPU needed): one
# line per kernel instantiation, with its template arguments: head dim, tile rows (where the
# tile type has them), then b0/b1 for causal and, for sm90ws, ping-pong.
#   scripts/ptxas_report.sh [FILE.cu ...]     default: the sm90 forward and backward
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(kernels/cuda/attention/flash_fwd_sm90*.cu kernels/cuda/attention/flash_bwd_sm90.cu)
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
