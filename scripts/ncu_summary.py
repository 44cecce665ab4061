#!/usr/bin/env python3
"""One table of the figures that say what holds a kernel, one column per Nsight Compute
report: the raw pages (`ncu -i REPORT --page raw --csv`, which scripts/ncu_profile.sh
writes as OUT_raw.csv), e.g. ours beside cuDNN's at the same shape:

  python3 scripts/ncu_summary.py ours=/tmp/bwd_raw.csv cudnn=/tmp/cudnn_bwd_raw.csv

Rows: duration, instructions, issue-slot use, the busy share of the tensor, XU
(special functions, conversions), ALU, FMA and LSU pipes, L2 hit rate, DRAM throughput,
and the warp stall reasons per issued instruction (those at 0.05 or more anywhere)."""
import argparse
import csv
import sys

ROWS = [
    ("duration (ms)", "gpu__time_duration.sum", 1e-6),
    ("instructions (10^9)", "smsp__inst_executed.sum", 1e-9),
    ("issue slots busy %", "smsp__issue_active.avg.pct_of_peak_sustained_active", 1),
    ("tensor pipe %", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active", 1),
    ("XU pipe %", "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active", 1),
    ("ALU pipe %", "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active", 1),
    ("FMA pipe %", "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", 1),
    ("LSU pipe %", "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active", 1),
    ("L2 hit %", "lts__t_sector_hit_rate.pct", 1),
    ("DRAM throughput %", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", 1),
]
STALL = "smsp__average_warps_issue_stalled_"
STALL_END = "_per_issue_active.ratio"


def read_raw(path):
    """The metric -> (unit, value) of a raw page with one kernel (the first one if more)."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        sys.exit(f"ncu_summary.py: cannot read {path}: {e.strerror}")
    if len(rows) < 3:
        sys.exit(f"ncu_summary.py: {path} holds no kernel (want the CSV of `ncu --page raw --csv`)")
    metrics = {h: (u, v) for h, u, v in zip(rows[0], rows[1], rows[2])}
    if not any(name in metrics for _, name, _ in ROWS):
        sys.exit(f"ncu_summary.py: {path} has none of the metrics of this table (want `ncu --page raw --csv`)")
    return metrics


def number(metrics, name):
    unit, value = metrics.get(name, ("", ""))
    try:
        x = float(value.replace(",", ""))
    except ValueError:
        return None
    if name == "gpu__time_duration.sum":  # in the unit ncu chose
        x *= {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit, 1)
    return x


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", metavar="[LABEL=]RAW_CSV")
    a = ap.parse_args()
    labels, tables = [], []
    for r in a.reports:
        label, _, path = r.rpartition("=")
        labels.append(label or path)
        tables.append(read_raw(path))
    width = max(12, *(len(l) for l in labels)) + 2
    print(f"{'':28}" + "".join(f"{l:>{width}}" for l in labels))

    def line(title, values):
        print(f"{title:28}" + "".join(f"{'-' if v is None else f'{v:.2f}':>{width}}" for v in values))

    for title, name, scale in ROWS:
        line(title, [None if (x := number(t, name)) is None else x * scale for t in tables])
    stalls = sorted({h[len(STALL):-len(STALL_END)] for t in tables for h in t if h.startswith(STALL) and h.endswith(STALL_END)})
    values = {s: [number(t, STALL + s + STALL_END) for t in tables] for s in stalls}
    for s in sorted(stalls, key=lambda s: -max(v or 0 for v in values[s])):
        if max(v or 0 for v in values[s]) >= 0.05:
            line(f"stall {s}", values[s])


if __name__ == "__main__":
    main()
