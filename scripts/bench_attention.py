#!/usr/bin/env python3
"""Compare flashgpt's FlashAttention kernels with PyTorch SDPA (flash = FA2, cuDNN).

Runs `flashgpt bench attention --suite --json` for our numbers, then times
torch.nn.functional.scaled_dot_product_attention with the FLASH_ATTENTION and
CUDNN_ATTENTION backends on the same shapes (bf16, (B, H, T, D) inputs), and prints
one table. FLOP convention (FlashAttention's): fwd 4*B*H*T^2*D, halved when causal;
bwd 2.5x fwd. Timing: CUDA events, warm-up, median of --iters; each call is enqueued
behind a kernel that keeps the GPU busy for --hold-us microseconds (torch.cuda._sleep;
our binary gets FLASHGPT_BENCH_HOLD_US, bench::hold_stream), so that the events time
the GPU's work and not the host's launch latency, which for PyTorch's Python and
autograd dispatch is not small beside a short kernel. --hold-us 0 times every call from
an idle GPU (how this script timed until the thirty-third session).

  python3 scripts/bench_attention.py --flashgpt build/flashgpt [--iters 10] [--paths sm80,sm90,auto]
  python3 scripts/bench_attention.py --flashgpt before=build-main/flashgpt --flashgpt after=build/flashgpt

--paths runs our suite once per entry and shows a forward and a backward column for
each. An entry is a FLASHGPT_ATTENTION_PATH value (sm80, sm90, sm90ws, auto), optionally
with the sm80 kernels' tile knobs: "sm80/bt1" adds FLASHGPT_ATTENTION_BWD_TILE=1, "/ft1"
FLASHGPT_ATTENTION_FWD_TILE=1 (also sm90ws's second forward tile: 176 keys at D = 128, a
block per query tile even with /persist; three consumers at D = 64; "/ft0" its first, which unset it chooses by shape; the other sm90
kernels ignore them); "/grid" runs the sm90
backward with one block per work item (FLASHGPT_ATTENTION_BWD_SCHEDULE=grid) instead of
the persistent default; "/atomic", "/tma", "/owner" and "/flat" force its dQ mode (FLASHGPT_ATTENTION_BWD_DQ);
"/allheads" gives its tma, flat and atomic modes one group of every (batch, head) pair, key tile
major (FLASHGPT_ATTENTION_BWD_HEAD_GROUP=all, the order before the L2-sized groups).
"/c1" runs the sm90ws forward with one consumer warpgroup and two blocks an SM
(FLASHGPT_ATTENTION_FWD_CONSUMERS=1) at every shape; auto takes it at D = 64 without a mask
below T = 1024.
"/persist" and "/fgrid" run the sm90ws forward's two-consumer tiles (and its three-consumer
tile) persistent or a block per query tile
(FLASHGPT_ATTENTION_FWD_SCHEDULE); auto takes persistent at D = 128 up to T = 2048 under a
causal mask and 4096 without one, and with a causal mask up to T = 8192 at D = 64 (up to T = 1024 its tile 0, not /c1's).
--flashgpt may be given more than once, as LABEL=BINARY: every binary runs every path,
so two builds (before and after a change) are compared in the same run.
The /FA2 and /cuDNN columns divide the best of our columns by FA2 and by cuDNN. Below the
table, one line per column and pass says on how many shapes it is at or above cuDNN
(issue 12's goal) and which shapes are under it.
"""
import os
import argparse
import json
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def fwd_flops(s):
    f = 4.0 * s["B"] * s["H"] * s["T"] ** 2 * s["D"]
    return f / 2 if s["causal"] else f


HOLD_CYCLES = 0  # main() sets it from --hold-us
CYCLES_PER_US = 2000  # about the H200's clock (1,980 MHz)


def median_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        if HOLD_CYCLES:
            torch.cuda._sleep(HOLD_CYCLES)  # the GPU is still busy when fn's kernels are enqueued
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def bench_sdpa(s, backend, warmup, iters):
    """(fwd TFLOP/s, bwd TFLOP/s) of one SDPA backend, or (None, None) if it refuses."""
    shape = (s["B"], s["H"], s["T"], s["D"])
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    try:
        with sdpa_kernel([backend]):
            fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=s["causal"])
            out = fwd()
            fwd_ms = median_ms(fwd, warmup, iters)
            bwd = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            bwd_ms = median_ms(bwd, warmup, iters)
    except RuntimeError as e:
        print(f"  {backend.name} refused {shape}: {str(e).splitlines()[0]}", file=sys.stderr)
        return None, None
    f = fwd_flops(s)
    return f / (fwd_ms * 1e-3) / 1e12, 2.5 * f / (bwd_ms * 1e-3) / 1e12


def shape_key(s):
    """A shape's (B, H, T, D, causal): how runs and baselines are keyed."""
    return (s["B"], s["H"], s["T"], s["D"], s["causal"])


def parse_binaries(specs):
    """[(label, binary)] from --flashgpt values "BINARY" or "LABEL=BINARY"."""
    out = []
    for spec in specs:
        label, sep, binary = spec.partition("=")
        out.append((label, binary) if sep else ("", spec))
    labels = [label for label, _ in out]
    if len(out) > 1 and (any(not label for label in labels) or len(set(labels)) != len(labels)):
        sys.exit("bench_attention.py: with several --flashgpt, give each a distinct LABEL=BINARY")
    return out


def table(shapes, runs, columns, baselines):
    """The printed table: one row per shape; our columns, FA2, cuDNN and the ratios of
    our best to each. runs: column -> {shape key: result}; baselines: key -> (fa2, cudnn),
    each a (fwd, bwd) pair of TFLOP/s or None."""
    width = max([6] + [len(c) for c in columns])
    fmt = lambda x, w=6: f"{x:{w}.1f}" if x is not None else f"{'-':>{w}}"
    ratio = lambda a, b: f"{a / b:5.2f}" if a and b else f"{'-':>5}"
    ours_cols = " ".join(f"{c:>{width}}" for c in columns)
    lines = [f"{'B':>3} {'H':>3} {'T':>6} {'D':>4} {'mask':>6} | fwd {ours_cols} {'FA2':>6} {'cuDNN':>6} {'/FA2':>5} "
             f"{'/cuDNN':>6} | bwd {ours_cols} {'FA2':>6} {'cuDNN':>6} {'/FA2':>5} {'/cuDNN':>6}"]
    for s in shapes:
        key = shape_key(s)
        fa2, cud = baselines[key]
        cells = []
        for i, what in enumerate(("fwd_tflops", "bwd_tflops")):
            ours = [runs[c][key][what] if key in runs[c] else None for c in columns]
            best = max((x for x in ours if x is not None), default=None)
            cells.append("     " + " ".join(fmt(x, width) for x in ours)
                         + f" {fmt(fa2[i])} {fmt(cud[i])} {ratio(best, fa2[i])} {ratio(best, cud[i]):>6}")
        lines.append(f"{s['B']:>3} {s['H']:>3} {s['T']:>6} {s['D']:>4} {'causal' if s['causal'] else 'full':>6} |"
                     + " |".join(cells))
    return "\n".join(lines)


def goal_summary(shapes, runs, columns, baselines):
    """Issue 12's goal, one line per column and pass: on how many shapes the column is at or
    above cuDNN's TFLOP/s, its lowest and highest ratio, and the shapes under it."""
    lines = []
    for c in columns:
        for i, what in enumerate(("forward", "backward")):
            ratios = []
            for s in shapes:
                key = shape_key(s)
                cud = baselines[key][1][i]
                ours = runs[c].get(key, {}).get(("fwd_tflops", "bwd_tflops")[i])
                if ours and cud:
                    ratios.append((ours / cud, f"{s['B']}x{s['H']}x{s['T']} D{s['D']} {'causal' if s['causal'] else 'full'}"))
            if not ratios:
                continue
            under = [f"{name} {r:.3f}" for r, name in ratios if r < 1]
            lines.append(f"{c} {what} against cuDNN: at or above on {len(ratios) - len(under)} of {len(ratios)}, "
                         f"{min(r for r, _ in ratios):.3f}-{max(r for r, _ in ratios):.3f}x"
                         + (f"; under: {', '.join(under)}" if under else ""))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flashgpt", action="append", help="the flashgpt binary, or LABEL=BINARY (repeatable; default build/flashgpt)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--hold-us", type=int, default=1000,
                    help="keep the GPU busy this long before each timed call (0: time from an idle GPU)")
    ap.add_argument("--paths", default="auto", help="comma-separated FLASHGPT_ATTENTION_PATH values, each optionally /bt1, /ft0, /ft1 (tile knobs), /grid, /atomic, /tma, /owner, /flat, /allheads, /c1, /persist or /fgrid")
    args = ap.parse_args()
    global HOLD_CYCLES
    HOLD_CYCLES = args.hold_us * CYCLES_PER_US
    paths = args.paths.split(",")
    binaries = parse_binaries(args.flashgpt or ["build/flashgpt"])

    runs = {}  # column -> {(B,H,T,D,causal): result}
    knobs = {"bt1": ("FLASHGPT_ATTENTION_BWD_TILE", "1"), "ft1": ("FLASHGPT_ATTENTION_FWD_TILE", "1"),
             "ft0": ("FLASHGPT_ATTENTION_FWD_TILE", "0"),
             "grid": ("FLASHGPT_ATTENTION_BWD_SCHEDULE", "grid"),
             "atomic": ("FLASHGPT_ATTENTION_BWD_DQ", "atomic"), "tma": ("FLASHGPT_ATTENTION_BWD_DQ", "tma"),
             "owner": ("FLASHGPT_ATTENTION_BWD_DQ", "owner"), "flat": ("FLASHGPT_ATTENTION_BWD_DQ", "flat"),
             "allheads": ("FLASHGPT_ATTENTION_BWD_HEAD_GROUP", "all"),
             "c1": ("FLASHGPT_ATTENTION_FWD_CONSUMERS", "1"),
             "persist": ("FLASHGPT_ATTENTION_FWD_SCHEDULE", "persistent"),
             "fgrid": ("FLASHGPT_ATTENTION_FWD_SCHEDULE", "grid")}
    for label, binary in binaries:
        for entry in paths:
            path, *extra = entry.split("/")
            env = dict(os.environ, FLASHGPT_ATTENTION_PATH=path, FLASHGPT_BENCH_HOLD_US=str(args.hold_us))
            env.update(dict(knobs[x] for x in extra))
            cmd = [binary, "bench", "attention", "--suite", "--json", "--iters", str(args.iters),
                   "--warmup", str(args.warmup)]
            print("$", *[f"FLASHGPT_ATTENTION_PATH={path}"] + [f"{knobs[x][0]}={knobs[x][1]}" for x in extra] + cmd,
                  flush=True)
            res = subprocess.run(cmd, capture_output=True, text=True, env=env)
            column = f"{label}:{entry}" if label else entry
            if res.returncode != 0:
                print(f"  {column} failed ({res.returncode}): {res.stderr.strip()[-500:]}", file=sys.stderr)
            runs[column] = {shape_key(r): r
                            for r in (json.loads(line) for line in res.stdout.splitlines() if line.startswith("{"))}
    shapes = [{"B": k[0], "H": k[1], "T": k[2], "D": k[3], "causal": k[4]}
              for k in next((r for r in runs.values() if r), {})]

    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}; TFLOP/s, bf16; "
          f"fwd 4*B*H*T^2*D (/2 causal), bwd 2.5x fwd; median of {args.iters}, each call after a {args.hold_us} us hold")
    baselines = {}
    for s in shapes:
        key = shape_key(s)
        baselines[key] = (bench_sdpa(s, SDPBackend.FLASH_ATTENTION, args.warmup, args.iters),
                          bench_sdpa(s, SDPBackend.CUDNN_ATTENTION, args.warmup, args.iters))
        torch.cuda.empty_cache()
    print(table(shapes, runs, list(runs), baselines), flush=True)
    print(goal_summary(shapes, runs, list(runs), baselines), flush=True)


if __name__ == "__main__":
    main()
