#!/usr/bin/env bash
# The SASS of a CUDA file's sm_90a kernels on a machine without a GPU, and a few counts a
# kernel at a time. CUDA 13 here has no cuobjdump; CUDA 11.8's (Debian's non-free
# nvidia-cuda-toolkit, unpacked into $FLASHGPT_CUDA118, default ~/.cache/flashgpt/cuda118)
# reads only the older cubin header, so the cubin's header is rewritten to it (sm_90, ABI
# version 7) for the disassembler; the code is untouched. Instructions newer than 11.8
# (VIADD) come out as blank lines, so counts miss them. To get the tool once:
#   echo 'deb http://deb.debian.org/debian bookworm non-free' > /etc/apt/sources.list.d/nonfree.list
#   apt-get update && (cd /tmp && apt-get download nvidia-cuda-toolkit) &&
#   dpkg -x /tmp/nvidia-cuda-toolkit_*.deb ~/.cache/flashgpt/cuda118
#   scripts/sass.sh [--rev REV] FILE.cu OUT.sass   the disassembly (FILE.cu from the repository
#       root, as at REV, else as in the work tree)
#   scripts/sass.sh --counts A.sass [B.sass]       per kernel: instructions, R2UR, wgmma (HGMMA),
#       MUFU.EX2, and the R2URs between two wgmmas of one run (an operand's descriptor moved
#       from a vector register before each issue: what slowed the two-consumer forward
#       kernels with claimed tiles, BENCHMARKS.md "Forty-first session"); with B, A's then B's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [[ "${1:-}" == "--counts" ]]; then
  shift
  exec python3 - "$here" "$@" <<'PY'
import collections, re, sys
sys.path.insert(0, sys.argv.pop(1))
from kernel_names import short_name
def kernels(path):
    out = {}
    for part in re.split(r"\n\s*\.*\s*Function : ", open(path).read())[1:]:
        name = part.split("\n", 1)[0]
        key = short_name(name)
        ops = [re.sub(r"^@!?U?P\w+\s+", "", s).split()[0] for s in re.findall(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", part)]
        c = collections.Counter(ops)
        in_runs, run = 0, None  # R2URs between two wgmmas with no wait or branch between
        for op in ops:
            if op.startswith("HGMMA"):
                in_runs += run or 0
                run = 0
            elif op.startswith("WARPGROUP.DEPBAR") or op in ("BRA", "BAR.SYNC", "BAR.ARV", "EXIT"):
                run = None
            elif op == "R2UR" and run is not None:
                run += 1
        out[key] = (len(ops), c["R2UR"], sum(v for k, v in c.items() if k.startswith("HGMMA")), c["MUFU.EX2"], in_runs)
    return out
files = [kernels(f) for f in sys.argv[1:]]
print(f"{'kernel<integers,bools>':52s} instrs R2UR HGMMA EX2 R2UR-in-runs")
for k in files[0]:
    print(f"{k:52s}", "  |  ".join(" ".join(str(x) for x in f[k]) if k in f else "-" for f in files))
PY
fi
rev=
if [[ "${1:-}" == "--rev" ]]; then rev=$2; shift 2; fi
[[ $# -eq 2 ]] || { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2; }
out=$(realpath -m "$2")
cd "$here/.."
tool=${FLASHGPT_CUDA118:-$HOME/.cache/flashgpt/cuda118}/usr/bin/cuobjdump
[[ -x $tool ]] || { echo "sass.sh: no CUDA 11.8 cuobjdump at $tool (see the top of this script)" >&2; exit 2; }
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
src=.
if [[ -n $rev ]]; then mkdir "$tmp/src" && git archive "$rev" | tar x -C "$tmp/src" && src=$tmp/src; fi
(cd "$src" && "$nvcc" -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -I. -gencode=arch=compute_90a,code=sm_90a \
  -cubin -o "$tmp/a.cubin" "$1")
python3 - "$tmp/a.cubin" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
b[7], b[8] = 0x33, 7                       # ELFOSABI_CUDA, ABI version 7
struct.pack_into("<I", b, 0x30, 0x5a055a)  # e_flags: sm_90, virtual sm_90, 64-bit addresses
open(sys.argv[1], "wb").write(b)
PY
"$tool" -sass "$tmp/a.cubin" > "$out"
