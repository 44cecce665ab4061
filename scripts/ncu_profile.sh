#!/usr/bin/env bash
# Profiles one launch of a kernel with Nsight Compute and says where its warps wait. For
# the GPU machine: ncu reads hardware counters where the runtime allows it (on the
# device's Firecracker machines, with --clock-control none: the clocks stay as they are).
#   scripts/ncu_profile.sh OUT KERNEL_REGEX [SKIP] -- COMMAND [ARGS...]
# profiles the launch after the first SKIP (default 3, past the warm-up) of the kernels
# whose name matches KERNEL_REGEX while COMMAND runs, and writes
#   OUT.ncu-rep       the report (every section, with the source)
#   OUT_details.txt   ncu's details page (speed of light, occupancy, warp states, ...)
#   OUT_sass.csv      per SASS instruction: executions, warp-state samples by reason
#   OUT_stalls.txt    scripts/ncu_stalls.py's summary of OUT_sass.csv
#   OUT_raw.csv       every metric (the raw page): scripts/ncu_summary.py OUT_raw.csv
#                     [OTHER_raw.csv ...] puts the ones that say what holds a kernel in
#                     one table, a column per report
# e.g. scripts/ncu_profile.sh /tmp/bwd flash_bwd_sm90 -- build/flashgpt bench attention \
#        --batch 4 --heads 16 --seq 4096 --head-dim 128 --full --warmup 3 --iters 1
set -euo pipefail
if [[ $# -lt 4 ]]; then sed -n '2,16p' "$0" >&2; exit 2; fi
out=$1 kernel=$2; shift 2
skip=3
if [[ $1 != -- ]]; then skip=$1; shift; fi
[[ $1 == -- ]] || { echo "ncu_profile.sh: expected -- before the command" >&2; exit 2; }
shift
here=$(dirname "$0")
ncu --clock-control none -k "regex:$kernel" --launch-skip "$skip" --launch-count 1 --set full \
  --import-source yes -f -o "$out" "$@"
ncu -i "$out.ncu-rep" --page details > "${out}_details.txt"
ncu -i "$out.ncu-rep" --page source --csv --print-source sass > "${out}_sass.csv"
python3 "$here/ncu_stalls.py" "${out}_sass.csv" > "${out}_stalls.txt"
ncu -i "$out.ncu-rep" --page raw --csv > "${out}_raw.csv"
echo "ncu_profile.sh: ${out}_details.txt, ${out}_sass.csv, ${out}_stalls.txt, ${out}_raw.csv"
