#!/usr/bin/env python3
"""Where a kernel's warps wait, from Nsight Compute's per-instruction source page.

Reads the CSV that `ncu --import REPORT --page source --csv --print-source sass` prints
for one kernel (a report taken with `--set full --import-source yes`, or at least the
WarpStateStats and SourceCounters sections; scripts/ncu_profile.sh does both steps) and
prints, from the warp-state samples (each sample: one warp, what it was doing):

  - the share of each stall reason over the whole kernel;
  - samples and executions by opcode (HGMMA, MUFU, REDG, LDGSTS, BAR, ...);
  - the instructions with the most samples, each with its three largest reasons (a
    stall is charged to the instruction that waits, so look just above it for what it
    waits on: an atomic or cp.async still holding its registers shows up as long_sb on
    the next write of those registers);
  - "regions": runs of consecutive instructions executed equally often (straight-line
    code), with their share of the samples, so that a loop body reads as a handful of
    phases (loads, matmul issue, softmax, stores, barriers).

  python3 scripts/ncu_stalls.py KERNEL_sass.csv [--top 30] [--region-min 0.5]
"""
import argparse
import collections
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
# Opcodes that mark the phases of a loop body in the region listing.
MARKS = ("HGMMA", "WARPGROUP", "BAR", "DEPBAR", "SYNCS", "REDG", "RED", "ATOM", "LDGSTS", "UBLKCP", "UTMALDG",
         "UTMAREDG", "UTMASTG", "MUFU", "LDS", "STS", "LDG", "STG", "LD", "ST", "FENCE", "EXIT")


def opcode(source):
    """The opcode of a SASS line without its predicate and modifiers: '@!P0 BRA 0x..' -> 'BRA'."""
    text = re.sub(r"^@!?U?P\w+\s+", "", source.strip())
    return text.split()[0].split(".")[0] if text else ""


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # Row 0 names the kernel; the header is the first row that has the sample column.
    for i, row in enumerate(rows):
        if SAMPLES in row:
            header, data = row, rows[i + 1:]
            break
    else:
        sys.exit(f"{path}: no '{SAMPLES}' column: profile with --set full (or WarpStateStats and "
                 "SourceCounters) and --import-source yes, and print --page source --csv --print-source sass")
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    instrs = []
    for row in data:
        if len(row) < len(header):
            continue
        number = lambda name: int(float(row[col[name]] or 0))
        instrs.append({
            "address": row[col["Address"]], "source": row[col["Source"]].strip(),
            "samples": number(SAMPLES), "executed": number(EXECUTED) if EXECUTED in col else 0,
            "reasons": {r[len("stall_"):]: number(r) for r in reasons},
        })
    kernel = rows[0][1] if rows and len(rows[0]) > 1 else "?"
    return kernel, instrs


def pct(x, total):
    return 100.0 * x / total if total else 0.0


def report(kernel, instrs, top, region_min, out):
    total = sum(i["samples"] for i in instrs)
    print(f"kernel: {kernel}", file=out)
    print(f"{len(instrs)} instructions, {total} warp-state samples", file=out)
    print("\nstall reasons (share of all samples):", file=out)
    by_reason = collections.Counter()
    for i in instrs:
        by_reason.update(i["reasons"])
    for name, n in by_reason.most_common():
        if n:
            print(f"  {name:20s} {n:9d} {pct(n, total):5.1f}%", file=out)
    print("\nby opcode (samples, share, instructions executed):", file=out)
    by_op, executed = collections.Counter(), collections.Counter()
    for i in instrs:
        by_op[opcode(i["source"])] += i["samples"]
        executed[opcode(i["source"])] += i["executed"]
    for name, n in by_op.most_common(20):
        print(f"  {name:12s} {n:9d} {pct(n, total):5.1f}%  {executed[name]:14d}", file=out)
    print(f"\ntop {top} instructions (address, samples, share, source, largest reasons):", file=out)
    for i in sorted(instrs, key=lambda i: -i["samples"])[:top]:
        why = ", ".join(f"{k}={v}" for k, v in sorted(i["reasons"].items(), key=lambda kv: -kv[1])[:3] if v)
        print(f"  {i['address'][-6:]:>6} {i['samples']:8d} {pct(i['samples'], total):5.1f}%  {i['source'][:58]:58s} {why}",
              file=out)
    print(f"\nregions of at least {region_min}% (first address, marking opcode, executions, samples, share):", file=out)
    runs = []
    for i in instrs:
        op = opcode(i["source"])
        mark = next((m for m in MARKS if op == m), None)
        key = (mark, i["executed"])
        if runs and runs[-1]["key"] == key:
            runs[-1]["samples"] += i["samples"]
        else:
            runs.append({"key": key, "address": i["address"], "samples": i["samples"]})
    for r in runs:
        if pct(r["samples"], total) >= region_min:
            mark, n = r["key"]
            print(f"  {r['address'][-6:]:>6} {mark or '-':10s} {n:12d} {r['samples']:9d} {pct(r['samples'], total):5.1f}%",
                  file=out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output of one kernel")
    ap.add_argument("--top", type=int, default=30, help="instructions to list (default 30)")
    ap.add_argument("--region-min", type=float, default=0.5, help="smallest region share to list, in %% (default 0.5)")
    args = ap.parse_args()
    kernel, instrs = read(args.csv)
    report(kernel, instrs, args.top, args.region_min, sys.stdout)


if __name__ == "__main__":
    main()
