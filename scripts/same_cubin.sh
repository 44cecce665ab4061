#!/usr/bin/env bash
# Whether an edit leaves the compiled CUDA code unchanged (a comment, a rename, a moved
# helper): compiles each FILE.cu as it is at REV (default HEAD) and as it is in the work
# tree (its tracked files), for sm_90a and sm_80, without line information (moved lines
# would change it), and compares the cubins byte for byte once nvcc's anonymous-namespace
# ids, which change from one compile to the next, are masked. A cubin is device code only,
# so the work tree's files are also compiled whole (host and device, -c), which catches
# what only the host pass sees (a device helper outside the file's arch guard passed the
# cubin check once). No GPU needed.
#   scripts/same_cubin.sh [--rev REV] FILE.cu [FILE.cu ...]
# Exit status 0 when every cubin is identical, 1 when one differs.
#   scripts/same_cubin.sh --kernels [--rev REV] FILE.cu [...]
# compares kernel by kernel instead, as sm_90a PTX (the input of ptxas, which compiles it
# to the same SASS every time), with branch labels, inline-asm label counters and nvcc's
# anonymous-namespace ids masked: one line per kernel, "same", "DIFFERENT", "only at REV"
# or "only here" (an added or removed template instantiation leaves the other kernels'
# cubin bytes moved, which the whole-file check cannot tell apart from a change; a kernel
# whose name changed, say by a new template parameter, shows as one of each), or
# "renamed" where the two differ only in the numbering of PTX's virtual registers (each
# side renumbered in order of first use: the same instructions on the same values, which
# ptxas may still allocate otherwise). Exit status 0 when no kernel here differs from its
# namesake at REV (renamed counts as differing) and none is only here.
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
rev=HEAD
kernels=0
if [[ "${1:-}" == "--kernels" ]]; then kernels=1; shift; fi
if [[ "${1:-}" == "--rev" ]]; then rev=$2; shift 2; fi
[[ $# -ge 1 ]] || { sed -n '2,8p' "$0"; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# Both sides compile at the same path ($tmp/src): nvcc's anonymous-namespace id hashes it.
tree() { rm -rf "$tmp/src" && mkdir -p "$tmp/src"; }
status=0
for f in "$@"; do
  git cat-file -e "$rev:$f" 2>/dev/null && [[ -f $f ]] ||
    { echo "same_cubin.sh: $f is not a file both here and at $rev" >&2; exit 2; }
done
if [[ $kernels == 1 ]]; then
  for side in rev work; do
    tree
    if [[ $side == rev ]]; then git archive "$rev" | tar x -C "$tmp/src"
    else git ls-files -z | tar c --null -T - | tar x -C "$tmp/src"; fi
    for f in "$@"; do
      (cd "$tmp/src" && "$nvcc" -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -I. -gencode=arch=compute_90a,code=sm_90a \
        -ptx -o "$tmp/$side.$(echo "$f" | tr / _).ptx" "$f" 2>/dev/null) || { echo "FAILED    $f ($side)"; exit 1; }
    done
  done
  for f in "$@"; do
    name=$(echo "$f" | tr / _)
    python3 - "$tmp/rev.$name.ptx" "$tmp/work.$name.ptx" "$f" "$rev" <<'PY' || status=1
import re, sys
def kernels(path):
    # A kernel ends at the last "}" at the start of a line before the next .entry (or the
    # file's end): inline asm blocks end in such a "}" too, so the first one once cut most
    # kernels short (the fortieth session found it).
    text, out = open(path).read(), {}
    entries = list(re.finditer(r"^(?:\.visible\s+)?\.entry (\S+)\(", text, re.M))
    for i, m in enumerate(entries):
        mangled, stop = m.group(1), entries[i + 1].start() if i + 1 < len(entries) else len(text)
        end = text.rindex("\n}", m.start(), stop) + 2
        body = text[m.start():end].replace(mangled, "KERNEL")
        body = re.sub(r"_GLOBAL__N__[0-9a-f]{8}_\d+_\w+?_cu_[0-9a-f]{8}[_\d]*", "ANON", body)
        body = re.sub(r"\$L__BB\d+_", "$L__BB_", body)           # labels numbered by function
        body = re.sub(r"\b([A-Z][A-Z_]*)_\d+\b", r"\1_N", body)  # inline-asm labels (%=)
        key = re.sub(r"_GLOBAL__N__[0-9a-f]{8}_\d+_\w+?_cu_[0-9a-f]{8}[_\d]*", "ANON", mangled)
        out[key] = body
    return out
def renumbered(body):
    # Virtual registers (%r12, %rd3, %f7, %p2, ...) renamed in order of first use; the
    # .reg declarations, which count them, dropped.
    names = {}
    body = re.sub(r"^\s*\.reg [^\n]*\n", "", body, flags=re.M)
    return re.sub(r"%(rd|rs|rh|fd|r|f|h|p)(\d+)\b", lambda m: names.setdefault(m.group(0), f"%{m.group(1)}#{len(names)}"), body)
def compare(a, b):
    return "same" if a == b else "renamed" if renumbered(a) == renumbered(b) else "DIFFERENT"
old, new = kernels(sys.argv[1]), kernels(sys.argv[2])
bad = False
for k in sorted(set(old) | set(new)):
    state = compare(old[k], new[k]) if k in old and k in new else \
            f"only at {sys.argv[4]}" if k in old else "only here"
    bad |= state in ("DIFFERENT", "renamed", "only here")
    print(f"{state:<13} {sys.argv[3]}  {k}")
sys.exit(1 if bad else 0)
PY
  done
  exit $status
fi
for arch in 90a 80; do
  for side in rev work; do
    tree
    if [[ $side == rev ]]; then git archive "$rev" | tar x -C "$tmp/src"
    else git ls-files -z | tar c --null -T - | tar x -C "$tmp/src"; fi
    for f in "$@"; do
      out="$tmp/$side.$arch.$(echo "$f" | tr / _).cubin"
      (cd "$tmp/src" && "$nvcc" -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -I. \
        -gencode=arch=compute_$arch,code=sm_$arch -cubin -o "$out" "$f") || { echo "FAILED    sm_$arch  $f ($side)"; exit 1; }
    done
  done
  for f in "$@"; do
    name=$(echo "$f" | tr / _)
    if python3 - "$tmp/rev.$arch.$name.cubin" "$tmp/work.$arch.$name.cubin" <<'PY'
import re, sys
# _GLOBAL__N__<hash>_<n>_<file>_cu_<hash>[_<n>], then the next name's length: the digits
# after the second hash are masked with it (both sides alike when the names are).
mask = lambda b: re.sub(rb"_GLOBAL__N__[0-9a-f]{8}_\d+_\w+?_cu_[0-9a-f]{8}[_\d]*", lambda m: b"X" * len(m.group()), b)
a, b = (mask(open(p, "rb").read()) for p in sys.argv[1:])
sys.exit(0 if a == b else 1)
PY
    then echo "same      sm_$arch  $f"
    else echo "DIFFERENT sm_$arch  $f"; status=1
    fi
  done
done
# $tmp/src holds the work tree still (the loop above ends with it).
for f in "$@"; do
  (cd "$tmp/src" && "$nvcc" -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -I. -gencode=arch=compute_90a,code=sm_90a \
    -gencode=arch=compute_80,code=sm_80 -c -o "$tmp/whole.o" "$f") || { echo "FAILED    host and device  $f"; exit 1; }
  echo "builds    host and device  $f"
done
exit $status
